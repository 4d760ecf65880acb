"""L1: TinyAgent's word-level tokenizer (book chapter 5.5).

A token is a whitespace-separated word; a newline is the special word ``<nl>``. Every string
has exactly one segmentation, so this tokenizer cannot drift (chapter 5.4). It knows nothing of
the gym: the BugFix vocabulary is enumerated by :func:`agentrl.gym.vocab.build_tokenizer`.
"""
from __future__ import annotations

import hashlib
import json
from typing import NamedTuple

__all__ = ['SPECIALS', 'Tokenizer', 'BugFixVocab', 'BUGFIX_VOCAB']

#: Special tokens with fixed ids 0..7. Source: book chapter 5.5.
SPECIALS = ['<pad>', '<bos>', '<unk>', '<obs>', '</obs>', '<call>', '</call>', '<nl>']
_SPECIAL_SET = frozenset(SPECIALS)


class Tokenizer:
    """Word-level tokenizer: whitespace words (newline -> ``<nl>``) <-> int ids.

    Args:
        words: vocabulary words after the specials; duplicates and specials are dropped,
            order is kept (``build_tokenizer`` passes them sorted).

    Attributes:
        itos: list of words by id; ``stoi``: word -> id.
        pad_id 0, bos_id 1, unk_id 2, obs_id 3, obs_end_id 4, call_id 5, call_end_id 6, nl_id 7.
    """

    def __init__(self, words):
        self.itos = list(dict.fromkeys([*SPECIALS, *words]))
        self.stoi = {w: i for i, w in enumerate(self.itos)}
        (self.pad_id, self.bos_id, self.unk_id, self.obs_id, self.obs_end_id,
         self.call_id, self.call_end_id, self.nl_id) = range(len(SPECIALS))

    @property
    def vocab_size(self) -> int:
        """Number of entries (316 for the BugFix gym)."""
        return len(self.itos)

    def __len__(self) -> int:
        return len(self.itos)

    def encode(self, text: str, specials: bool = True) -> list[int]:
        """Text -> ids; unknown words map to ``<unk>`` (id 2).

        Args:
            text: whitespace-separated words; a newline becomes ``<nl>``.
            specials: when False (text from a tool or a user), a word spelled like a special
                token (``</obs>``, ``<call>``, ``<bos>`` ...) encodes as ``<unk>``, so tool output
                can never forge a control token; newlines still become ``<nl>``.

        Example: ``tok.encode('<call> edit swap_minmax </call>') == [5, 224, 300, 6]``.
        """
        if specials:
            return [self.stoi.get(w, self.unk_id) for w in text.replace('\n', ' <nl> ').split()]
        ids = []
        for k, line in enumerate(text.split('\n')):
            if k:
                ids.append(self.nl_id)
            ids += [self.unk_id if w in _SPECIAL_SET else self.stoi.get(w, self.unk_id) for w in line.split()]
        return ids

    def decode(self, ids) -> str:
        """Ids -> text (words joined by one space, ``<nl>`` back to a newline).

        Raises:
            ValueError: an id outside ``[0, vocab_size)``.
        """
        ids = ids.tolist() if hasattr(ids, 'tolist') else list(ids)
        if ids and (min(ids) < 0 or max(ids) >= len(self.itos)):
            bad = [i for i in ids if not 0 <= int(i) < len(self.itos)]
            raise ValueError(f'decode: ids {bad[:5]} are outside the vocabulary [0, {len(self.itos)}); '
                             'were they produced by another tokenizer?')
        return ' '.join([self.itos[int(i)] for i in ids]).replace(' <nl> ', '\n')

    @property
    def fingerprint(self) -> str:
        """sha256 (first 16 hex digits) of the class, vocabulary and special ids (a property, like
        :attr:`agentrl.templates.ChatTemplate.fingerprint`)."""
        payload = json.dumps({'class': 'agentrl.Tokenizer', 'itos': self.itos,
                              'specials': SPECIALS}, separators=(',', ':'))
        return hashlib.sha256(payload.encode()).hexdigest()[:16]

    def template_fingerprint(self) -> str:
        """Fingerprint of the word-level 'template': ``<bos>`` issue, ``<obs> ... </obs>`` wrappers."""
        rule = 'bos+prompt; policy call; <obs> tool </obs>; agentrl.rollouts.Episode'
        return hashlib.sha256(rule.encode()).hexdigest()[:16]


class BugFixVocab(NamedTuple):
    """What a check needs to know of TinyAgent's BugFix tokenizer, as data.

    Attributes:
        fingerprint: :attr:`Tokenizer.fingerprint` of the BugFix vocabulary (16 hex digits).
        pad_id: its pad id. eot_id: its end of turn (``</call>``, ``call_end_id``).
        vocab_size: its number of entries.
    """
    fingerprint: str
    pad_id: int
    eot_id: int
    vocab_size: int


#: The facts of :func:`agentrl.gym.bugfix_tokenizer` (every BugFix task, 316 entries), written down so that
#: checking a record needs neither the gym nor its sandbox; ``tests/test_gym.py`` checks they equal what the
#: gym computes (a change to the gym's texts changes them, and that test says so).
BUGFIX_VOCAB = BugFixVocab(fingerprint='36b0594ac618228c', pad_id=SPECIALS.index('<pad>'),
                           eot_id=SPECIALS.index('</call>'), vocab_size=316)
