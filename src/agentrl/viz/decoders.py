"""Decoders: token ids -> token texts for the pictures, and which tokenizer a record was made with.

:func:`decoder_for` picks a record's decoder: TinyAgent's word tokenizer, a Hugging Face tokenizer
named by the record or found by its fingerprint among :func:`agentrl.templates.loading.candidate_dirs`
(loaded offline, cached per process in ``_LOADED``), else the ids themselves (:func:`id_decoder`).
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Callable, Sequence

from ..record import Trajectory

__all__ = ['Decoder', 'decoder_for', 'word_decoder', 'hf_decoder', 'id_decoder']

#: A decoder maps ``[T]`` token ids to ``[T]`` token texts (one string per id).
Decoder = Callable[[Sequence[int]], list]


def id_decoder(ids: Sequence[int]) -> list:
    """Fallback decoder: each token shown as ``#<id>``."""
    return [f'#{int(i)}' for i in ids]


def _word_tokenizer():
    from ..gym import bugfix_tokenizer
    return bugfix_tokenizer()


def word_decoder(tok=None) -> Decoder:
    """Decoder of TinyAgent's word-level tokenizer (:func:`agentrl.gym.bugfix_tokenizer` by default).

    Ids outside the vocabulary show as ``#<id>``.
    """
    tok = tok or _word_tokenizer()
    itos = tok.itos

    def decode(ids):
        return [itos[int(i)] if 0 <= int(i) < len(itos) else f'#{int(i)}' for i in ids]
    decode.name = 'word tokenizer'
    return decode


def _hf_candidates(name: str) -> list:
    """A local folder, the family folder :func:`~agentrl.templates.loading.find_tokenizer_dir` finds
    for a model id (``Qwen/Qwen3-*`` -> ``qwen3/``; no download), then the name itself (HF cache)."""
    from ..templates.loading import find_tokenizer_dir, tokenizer_family
    out = []
    if name and os.path.isdir(name):
        out.append(name)
    fam = tokenizer_family(name)
    if fam is not None:
        try:
            out.append(str(find_tokenizer_dir(fam, hub=False)))
        except FileNotFoundError:
            pass
    out.append(name)
    return list(dict.fromkeys(out))


_LOADED: dict = {}     # name or folder -> loaded HF tokenizer (None: not loadable offline)


def _load_hf(name: str):
    if name in _LOADED:
        return _LOADED[name]
    tok = None
    try:
        from transformers import AutoTokenizer

        from ..templates.loading import verified_tokenizer
    except ImportError:
        return None
    for cand in _hf_candidates(name):
        try:
            tok = verified_tokenizer(AutoTokenizer.from_pretrained(cand, local_files_only=True), cand,
                                     local_files_only=True)
            break
        except Exception:  # noqa: BLE001 - any failure means "not available offline"
            continue
    _LOADED[name] = tok
    return tok


def hf_decoder(name_or_tokenizer) -> Decoder | None:
    """Decoder of a Hugging Face tokenizer, loaded offline; None when it cannot be loaded.

    Args:
        name_or_tokenizer: a loaded tokenizer, a local folder, or a model id found in
            ``$AGENTRL_TOKENIZERS`` (``Qwen/Qwen3-*`` -> ``qwen3/`` ...) or the local HF cache.
            Nothing is downloaded.

    Returns:
        A decoder giving each id's own text (``tok.decode([id])``), or None.
    """
    tok = name_or_tokenizer if hasattr(name_or_tokenizer, 'decode') else _load_hf(str(name_or_tokenizer))
    if tok is None:
        return None
    size = len(tok)

    def decode(ids):
        return [tok.decode([int(i)]) if 0 <= int(i) < size else f'#{int(i)}' for i in ids]
    decode.name = f'hf: {_tokenizer_label(tok)}'
    return decode


def _tokenizer_label(tok) -> str:
    """A tokenizer's name for pictures: its folder's (or model id's) last part plus its fingerprint, never a path."""
    name = str(getattr(tok, 'name_or_path', '') or type(tok).__name__).rstrip('/\\')
    name = Path(name).name if os.path.isabs(name) or os.path.isdir(name) else name
    try:
        from ..templates.chat import tokenizer_fingerprint
        return f'{name}@{str(tokenizer_fingerprint(tok))[:12]}'
    except Exception:  # noqa: BLE001 - a tokenizer that cannot be digested keeps its name only
        return name


def _hf_fingerprint(tok) -> str | None:
    """:func:`agentrl.templates.chat.tokenizer_fingerprint` of an HF tokenizer, or None when it cannot be taken."""
    try:
        from ..templates.chat import tokenizer_fingerprint
        return tokenizer_fingerprint(tok)
    except Exception:  # noqa: BLE001 - a tokenizer that cannot be digested matches no fingerprint
        return None


def _hf_by_digest(fp: str, model: str = '') -> Decoder | None:
    """The tokenizer whose digest is ``fp`` (already loaded ones first, then
    :func:`agentrl.templates.loading.candidate_dirs` of ``model``, the hub allowed), or None."""
    if not fp:
        return None
    try:
        from ..templates.loading import candidate_dirs
    except ImportError:
        return None
    folders = [str(d) for d in candidate_dirs(model, hub=True)]
    loaded = [k for k, v in _LOADED.items() if v is not None]
    for name in loaded + [f for f in folders if f not in _LOADED]:
        tok = _load_hf(name)
        if tok is not None and _hf_fingerprint(tok) == fp:
            return hf_decoder(tok)
    return None


def _word_fingerprint() -> str | None:
    try:
        return _word_tokenizer().fingerprint
    except Exception:  # noqa: BLE001 - gym not importable: no word tokenizer to compare with
        return None


def decoder_for(traj: Trajectory, tokenizer=None) -> Decoder:
    """Pick the decoder that gives a record's token text.

    Order: an explicit ``tokenizer`` (a :class:`~agentrl.tokenizer.Tokenizer`, an HF tokenizer,
    or a name/folder); TinyAgent's word tokenizer when the record's provenance fingerprint is
    that tokenizer's, or when the record has no tokenizer fingerprint and every id fits its
    vocabulary; the HF tokenizer named by ``provenance.model`` (or ``info['tokenizer']``) when it
    loads offline and its fingerprint is the record's (or the record has none); the tokenizer
    whose digest (:func:`agentrl.templates.chat.tokenizer_fingerprint`) equals the record's
    fingerprint, looked up as :func:`agentrl.templates.loading.candidate_dirs` does (the family
    told from ``provenance.model``, the hub allowed; ``$AGENTRL_TOKENIZERS``; each family in
    ``../shared/tokenizers``); else ids (``#<id>``, the decoder :data:`id_decoder`).

    Returns:
        A callable ``ids -> list[str]`` with a ``name`` attribute saying which was chosen.

    Raises:
        ValueError: an explicit ``tokenizer`` that cannot be loaded offline, or whose fingerprint
            differs from the record's ``provenance.tokenizer`` (its text would be wrong).
    """
    prov = traj.provenance
    fp = (prov.tokenizer if prov else '') or ''
    if tokenizer is not None:
        if hasattr(tokenizer, 'itos'):
            dec = word_decoder(tokenizer)
            got = getattr(tokenizer, 'fingerprint', None)   # a word tokenizer without one is not compared
        else:
            tok = tokenizer if hasattr(tokenizer, 'decode') else _load_hf(str(tokenizer))
            if tok is None:
                raise ValueError(f'tokenizer {tokenizer!r} could not be loaded offline; pass a local folder '
                                 'with tokenizer.json (or set $AGENTRL_TOKENIZERS)')
            dec, got = hf_decoder(tok), _hf_fingerprint(tok)
        if fp and got and got != fp:
            name = tokenizer if isinstance(tokenizer, str) else dec.name
            raise ValueError(f'tokenizer {name!r} has fingerprint {got} but the record was tokenized with {fp}, so '
                             'its token text would be wrong; pass the tokenizer the record was sampled with, or '
                             'none (it is then found from the provenance)')
        return dec
    word_fp = _word_fingerprint()
    if word_fp is not None and fp == word_fp:
        return word_decoder()
    for name in ((traj.info or {}).get('tokenizer'), prov.model if prov else None):
        if isinstance(name, str) and name and not name.startswith('TinyAgent'):
            tok = _load_hf(name)
            if tok is not None and (not fp or _hf_fingerprint(tok) == fp):
                return hf_decoder(tok)
    dec = _hf_by_digest(fp, prov.model if prov else '') if fp else None
    if dec is not None:
        return dec
    if word_fp is not None and not fp:
        size = len(_word_tokenizer().itos)
        if all(0 <= int(i) < size for i in traj.ids.tolist()):
            return word_decoder()
    return id_decoder


id_decoder.name = 'ids'
