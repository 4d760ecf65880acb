"""L2: a Hugging Face chat template with fixed options: render, encode, stop tokens, sentinels.

Everything in :mod:`agentrl.templates` goes through :class:`ChatTemplate`, so every audit,
label and bridge is computed by running the tokenizer's own template (no per-model string
tables). transformers and jinja2 are imported lazily, inside the functions that need them.
"""
from __future__ import annotations

import copy
import json
import re
from typing import Any, Iterable, Sequence

from .budget import TemplateTimeoutError, bounded_render
from .loading import (TOKENIZER_FAMILIES, find_tokenizer_dir, generation_eos_ids, load_tokenizer,  # noqa: F401
                      require_hf, tokenizer_family)
from .messages import (PROMPT_ROLES, TOOL_ROLES, check_messages, common_prefix, common_suffix,  # noqa: F401
                       diff_span, flatten_content, function_tools, owner_of_role)
from .vision import vision_settings

__all__ = ['ChatTemplate', 'as_template', 'function_tools', 'require_hf', 'load_tokenizer',
           'PROMPT_ROLES', 'TOOL_ROLES', 'CONTENT_TEXT_MODES', 'ControlTextError', 'find_tokenizer_dir',
           'tokenizer_family', 'TOKENIZER_FAMILIES', 'tokenizer_fingerprint', 'flatten_content']


#: Template options ChatTemplate takes by keyword; everything else goes to the template.
_OWN_OPTIONS = ('tools', 'chat_template', 'stop_tokens', 'generation_config', 'content_text', 'vision')
#: What happens to control-token text (``'<|im_end|>'``) inside content the policy did not sample
#: (system, user, tool and opening messages): ``'plain'`` encodes it as ordinary text (its byte-level
#: pieces, never the control id); ``'refuse'`` raises :class:`ControlTextError`.
CONTENT_TEXT_MODES = ('plain', 'refuse')


class ControlTextError(ValueError):
    """Content the policy did not sample holds the text of a control token (``'<|im_end|>'``).

    Raised only with ``content_text='refuse'``; the default ``'plain'`` encodes such text as
    ordinary bytes. Attributes: ``message`` (index), ``role``, ``token`` (the control text found).
    """

    def __init__(self, message: int, role: str, token: str, where: str = 'messages'):
        self.message, self.role, self.token = message, role, token
        super().__init__(f'{where}[{message}] ({role}) content holds the control-token text {token!r}: the '
                         'template would turn it into a control token (a forged turn boundary); remove it from '
                         "the content, or pass content_text='plain' to encode it as ordinary text")


class ChatTemplate:
    """A tokenizer's chat template with its options fixed: the one way agentrl renders chats.

    Args:
        tokenizer: a Hugging Face (fast) tokenizer with a chat template.
        tools: tool schemas passed as ``tools=`` to the template (MCP-style schemas are
            converted with :func:`function_tools`); None for no tools.
        chat_template: a template string overriding the tokenizer's own.
        stop_tokens: extra tokens the engine stops at, besides ``eos_token`` and the template's
            end-of-turn (for example Qwen3's second EOS ``<|endoftext|>``); each must be a single token.
        generation_config: the model's ``generation_config.json`` whose ``eos_token_id`` list is added
            to the stops, as vLLM adds it to every request (:func:`~agentrl.templates.loading.generation_eos_ids`:
            a folder, the file, or a dict); True (default) reads the tokenizer's own folder
            (``name_or_path``) when it holds one; None or False adds none. docs/design.md#stops.
        content_text: one of :data:`CONTENT_TEXT_MODES`: ``'plain'`` (default) encodes control-token
            text inside content the policy did not sample as ordinary text; ``'refuse'`` raises
            :class:`ControlTextError` for it.
        vision: the image processor settings (:func:`~agentrl.templates.vision.vision_settings`): True (default)
            reads the tokenizer's folder's ``preprocessor_config.json`` when it holds one (a vision-language
            model folder), a dict gives them, None or False makes a text-only template (image parts refused).
            With settings, ``image_url`` parts of user and tool messages are expanded
            (:func:`~agentrl.templates.vision.expand_images`).
        **template_kwargs: options the template reads, such as ``enable_thinking=False``.

    Attributes:
        tokenizer, tools, chat_template, template_kwargs, content_text,
        stop_texts (list[str]), stop_ids (frozenset[int]): every id the engine may stop a turn at
        (``eos_token``, ``stop_tokens``, the end-of-turn, and the generation config's eos ids);
        end_of_turn_id (int | None), end_of_turn_text (str | None): the control token the template
        itself writes right after an assistant message's content, found by rendering one (Qwen3
        ``<|im_end|>``, Llama 3 ``<|eot_id|>``, gpt-oss ``<|return|>``); None when the template writes none;
        end_texts (tuple[str]), end_ids (frozenset[int]): the end-of-turn and every other stop token the
        template writes itself after an assistant turn, found by rendering a tool call (gpt-oss
        ``<|call|>``); a turn that stopped at one is closed as the template closes it;
        eos_mismatch: True when ``eos_token`` is not that end-of-turn (the end-of-turn is added to
        the stop set, so it is never written twice);
        control_ids (frozenset[int]): ids of the tokenizer's added (control) tokens.

    A turn whose sampled stop is not the end-of-turn (e.g. Qwen3's ``<|endoftext|>``) is closed as
    docs/design.md#stops says.

    Raises:
        ImportError: without the ``hf`` extra (``pip install agentrl[hf]``).
        ValueError: no chat template (pass ``chat_template=``); a stop token that is not one
            token; ``content_text`` outside :data:`CONTENT_TEXT_MODES`; ``tools=`` given to a
            template that ignores them (the error names ``tools=``: put the tool descriptions in
            a system message and pass ``tools=None``).

    Source: Hugging Face ``apply_chat_template`` (rendering is delegated to it, so
    transformers' message normalisation applies: keys whose value is None are dropped).
    """

    def __init__(self, tokenizer, *, tools: Sequence[dict] | None = None, chat_template: str | None = None,
                 stop_tokens: Sequence[str] | None = None, generation_config: Any = True, content_text: str = 'plain',
                 vision: Any = True, **template_kwargs):
        require_hf('ChatTemplate')
        if not hasattr(tokenizer, 'apply_chat_template'):
            raise ValueError(f'tokenizer must be a Hugging Face tokenizer, got {type(tokenizer).__name__}; '
                             'load one with agentrl.templates.load_tokenizer(path)')
        if chat_template is None and not getattr(tokenizer, 'chat_template', None):
            raise ValueError('the tokenizer has no chat template: pass chat_template="..." (a Jinja string)')
        if not getattr(tokenizer, 'is_fast', True):
            raise ValueError(f'{type(tokenizer).__name__} is a slow tokenizer: agentrl needs character offsets; '
                             'load the fast tokenizer (tokenizer.json)')
        if content_text not in CONTENT_TEXT_MODES:
            raise ValueError(f'content_text={content_text!r}; use one of {CONTENT_TEXT_MODES}')
        self.tokenizer = tokenizer
        self.tools = function_tools(tools) if tools else None
        self.chat_template = chat_template
        self.template_kwargs = dict(template_kwargs)
        self.content_text = content_text
        self.vision = vision_settings(tokenizer if vision is True else vision)
        self._cache: dict = {}
        self.control_ids, self._control_re = _controls(tokenizer)
        self.end_of_turn_text = self._derive_end_of_turn()
        texts = []
        if tokenizer.eos_token:
            texts.append(tokenizer.eos_token)
        for t in stop_tokens or ():
            if t not in texts:
                texts.append(t)
        self.eos_mismatch = self.end_of_turn_text is not None and tokenizer.eos_token != self.end_of_turn_text
        if self.end_of_turn_text is not None and self.end_of_turn_text not in texts:
            texts.append(self.end_of_turn_text)
        ids = []
        for t in texts:
            enc = tokenizer(t, add_special_tokens=False)['input_ids']
            if len(enc) != 1:
                raise ValueError(f'stop_tokens: {t!r} encodes to {len(enc)} tokens {enc}; '
                                 'an end-of-turn token must be a single (special) token')
            ids.append(enc[0])
        gen = [i for i in generation_eos_ids(tokenizer if generation_config is True else generation_config or None)
               if i not in ids]
        if gen:
            n_vocab = len(tokenizer)
            for i in dict.fromkeys(gen):
                if not 0 <= i < n_vocab:
                    raise ValueError(f'generation_config: eos_token_id {i} is outside the vocabulary [0, {n_vocab}); '
                                     'pass the generation_config.json of this model')
                ids.append(i)
                texts.append(self.decode([i]))
        if not texts:
            raise ValueError('the tokenizer has no eos_token: pass stop_tokens=["<end-of-turn token>"]')
        self.stop_texts = sorted(texts, key=len, reverse=True)
        self.stop_ids = frozenset(ids)
        self._stop_text_of = dict(zip(ids, texts))
        self.end_of_turn_id = ids[texts.index(self.end_of_turn_text)] if self.end_of_turn_text is not None else None
        self.end_texts = ((self.end_of_turn_text,) if self.end_of_turn_text is not None else ()) + \
            self._derive_written_stops()
        self.end_ids = frozenset(ids[texts.index(t)] for t in self.end_texts)
        if self.tools is not None:
            self._check_tools_used()

    # ------------------------------------------------------------------ construction
    def with_options(self, **template_kwargs) -> 'ChatTemplate':
        """A copy with some template options replaced (e.g. ``enable_thinking=False``)."""
        new = copy.copy(self)
        new.template_kwargs = {**self.template_kwargs, **template_kwargs}
        new._cache = {}
        return new

    def describe(self) -> dict:
        """Options as a JSON-able dict (template kwargs, tool names, stop tokens, end-of-turn, content_text)."""
        return {'template_kwargs': self.template_kwargs, 'stop_tokens': list(self.stop_texts),
                'end_of_turn': self.end_of_turn_text, 'content_text': self.content_text,
                **({'vision': dict(self.vision)} if self.vision else {}),
                'tools': [t['function']['name'] for t in self.tools or ()],
                'chat_template': 'custom' if self.chat_template else 'tokenizer'}

    def chat_tokens(self) -> dict:
        """What a validator needs to check a record made with this template (``info['template']['chat_tokens']``).

        Returns:
            ``{'end_of_turn': [] or the end-of-turn id then the other :attr:`end_ids` sorted, 'stop': sorted
            stop ids, 'control': [[lo, hi), ...] id ranges of the added (control) tokens, 'content_text':
            'plain' | 'refuse'}``.
        """
        ranges, ctl = [], sorted(self.control_ids)
        for i in ctl:
            if ranges and ranges[-1][1] == i:
                ranges[-1][1] = i + 1
            else:
                ranges.append([i, i + 1])
        return {'end_of_turn': [] if self.end_of_turn_id is None else
                [self.end_of_turn_id] + sorted(self.end_ids - {self.end_of_turn_id}),
                'stop': sorted(self.stop_ids), 'control': ranges, 'content_text': self.content_text}

    def is_end_of_turn(self, token_id: int) -> bool:
        """True when ``token_id`` ends a turn the way the template writes it in history: one of :attr:`end_ids`
        (the end-of-turn, or a stop the template writes after a tool call, gpt-oss ``<|call|>``); with no
        end-of-turn derived, any stop id."""
        if self.end_of_turn_id is None:
            return int(token_id) in self.stop_ids
        return int(token_id) in self.end_ids

    def _derive_written_stops(self) -> tuple:
        """Stop texts besides the end-of-turn that the template writes itself after an assistant turn.

        Found by rendering a turn that calls a tool, then its result: a stop text that the opening's
        rendering lacks and that the turn's rendering holds with no end-of-turn after it before the
        result (gpt-oss writes ``<|call|>`` last in a call turn; Qwen3 writes ``</tool_call>`` before its
        ``<|im_end|>``, so that stop, if one, is not the turn's end).
        """
        others = [t for t in self.stop_texts if t != self.end_of_turn_text]
        if not others or self.end_of_turn_text is None:
            return ()
        probe = [{'role': 'user', 'content': 'Probe question.'}]
        call = {'role': 'assistant', 'content': '',
                'tool_calls': [{'type': 'function', 'function': {'name': 'probe', 'arguments': {}}}]}
        try:
            base = self.render(probe, True, tools=None)
            full = self.render(probe + [call, {'role': 'tool', 'content': 'Probe result.'}], False, tools=None)
        except ValueError:
            return ()
        tail = full[len(base) if full.startswith(base) else 0:]
        tail = tail[:tail.rfind('Probe result.')]
        return tuple(t for t in others if t in tail and t not in base
                     and self.end_of_turn_text not in tail[tail.rfind(t):])

    def _derive_end_of_turn(self) -> str | None:
        """The control-token text the template writes right after an assistant message's content."""
        if self._control_re is None:
            return None
        probe = [{'role': 'user', 'content': 'Probe question.'}]
        try:
            full = self.render(probe + [{'role': 'assistant', 'content': 'Probe answer.'}], False, tools=None)
        except TemplateTimeoutError:
            raise
        except ValueError:
            return None
        k = full.rfind('Probe answer.')
        if k < 0:
            return None
        rest = full[k + len('Probe answer.'):]
        hit = self._control_re.search(rest)
        if hit is None or rest[:hit.start()].strip():
            return None
        return hit.group(0)

    @property
    def source(self) -> str:
        """The Jinja source actually rendered."""
        if self.chat_template is not None:
            return self.chat_template
        src = self.tokenizer.chat_template
        if isinstance(src, dict):  # named templates: 'default' / 'tool_use'
            return src.get('tool_use' if self.tools and 'tool_use' in src else 'default', '')
        return src

    @property
    def name(self) -> str:
        """The template as error messages name it: ``"the chat template of 'Qwen/Qwen3-8B'"``."""
        owner = getattr(self.tokenizer, 'name_or_path', '') or type(self.tokenizer).__name__
        return f'the chat template {"passed as chat_template= for" if self.chat_template else "of"} {owner!r}'

    def _rendered_source(self, tools) -> str | None:
        """The Jinja string transformers renders for a call with ``tools`` (its named-template choice), or None."""
        try:
            return self.tokenizer.get_chat_template(self.chat_template, self.tools if tools == 'default' else tools)
        except Exception:  # noqa: BLE001 - no template: apply_chat_template itself reports it
            return None

    @property
    def has_generation_blocks(self) -> bool:
        """True when the template marks assistant text with ``{% generation %}`` blocks."""
        import re
        return bool(re.search(r'\{%-?\s*generation\s*-?%\}', self.source or ''))

    # ------------------------------------------------------------------ rendering
    def render(self, messages: Sequence[dict], add_generation_prompt: bool = False, *,
               tools: Any = 'default', **override) -> str:
        """Render messages to text with this template and options.

        Args:
            messages: the conversation (list of message dicts).
            add_generation_prompt: append the open assistant header (the generation prompt).
            tools: override this template's tools (None = no tools); default keeps them.
            **override: template options replacing this template's for this call.

        Returns:
            The rendered string (special tokens as text).

        Raises:
            ValueError: the template raised while rendering (the message names the jinja error;
                check the fields the template expects, e.g. tool-call arguments as a string); the
                render went past ``AGENTRL_TEMPLATE_MAX_CHARS`` characters or ``AGENTRL_TEMPLATE_SECONDS``
                (:func:`agentrl.templates.budget.bounded_render`, docs/design.md#bounds), naming the template.
        """
        if not messages:
            raise ValueError('messages is empty: a chat template needs at least one message')
        jinja2 = __import__('jinja2')
        kwargs = {**self.template_kwargs, **override}
        try:
            return bounded_render(lambda: self.tokenizer.apply_chat_template(
                list(messages), tools=self.tools if tools == 'default' else tools,
                chat_template=self.chat_template, tokenize=False,
                add_generation_prompt=add_generation_prompt, **kwargs), self._rendered_source(tools), self.name)
        except (jinja2.TemplateError, TypeError, KeyError, IndexError, OverflowError, RecursionError) as e:
            # OverflowError: the sandbox's range() bound; RecursionError: a macro that calls itself for ever
            raise ValueError(f'the chat template could not render these messages ({type(e).__name__}: {e}); '
                             'check the message fields this template expects (roles, content, tool_calls '
                             'arguments)') from e

    def generation_prompt(self, messages: Sequence[dict]) -> str:
        """The text ``add_generation_prompt=True`` appends after ``messages`` ('' if none).

        Qwen3: ``'<|im_start|>assistant\\n'`` (plus ``'<think>\\n\\n</think>\\n\\n'`` with
        ``enable_thinking=False``); DeepSeek-V3 after tool outputs: ``''``.

        Raises:
            ValueError: as :meth:`render`.
        """
        with_gp = self.render(messages, True)
        without = self.render(messages, False)
        return with_gp[len(without):] if with_gp.startswith(without) else with_gp[common_prefix(with_gp, without):]

    # ------------------------------------------------------------------ tokens
    def _backend(self):
        """The tokenizers backend when calling it equals ``tokenizer(text, add_special_tokens=False)``."""
        be = getattr(self.tokenizer, 'backend_tokenizer', None)
        if be is None or getattr(self.tokenizer, 'split_special_tokens', False) or \
                getattr(be, 'encode_special_tokens', False):
            return None
        return be

    def encode(self, text: str) -> list[int]:
        """Text -> ids with no BOS/EOS added (the rendered text already holds them).

        Same ids as ``tokenizer(text, add_special_tokens=False)`` (what ``apply_chat_template``
        uses); the Rust backend is called directly when that is equivalent.
        """
        be = self._backend()
        if be is not None:
            if len(text) > _CHUNK_CHARS:
                return self._encode_offsets(text)[0]
            return be.encode(text, add_special_tokens=False).ids
        return list(self.tokenizer(text, add_special_tokens=False)['input_ids'])

    def encode_offsets(self, text: str, plain: Sequence = ()) -> tuple[list[int], list[tuple[int, int]]]:
        """Text -> (ids, character offsets ``(start, end)`` of each token).

        Args:
            text: the text (a rendering or a piece of one).
            plain: content spans the policy did not sample (objects with ``start``, ``end``,
                ``message`` and ``owner``, e.g. :class:`~agentrl.templates.labels.Region`): control-token
                text starting inside one is encoded as ordinary text (``'plain'``) or refused.

        Raises:
            ControlTextError: control-token text inside a ``plain`` span with ``content_text='refuse'``.
            ValueError: the tokenizer's own vocabulary holds a control token's text, so it cannot be
                encoded as ordinary text (use ``content_text='refuse'`` and clean the content).
        """
        cuts = self._control_hits(text, plain)
        if not cuts:
            return self._encode_offsets(text)
        ids, offs, pos = [], [], 0
        for a, b in cuts:
            if a > pos:
                i, o = self._encode_offsets(text[pos:a])
                ids += i
                offs += [(x + pos, y + pos) for x, y in o]
            p = self._plain_ids(text[a:b])
            ids += p
            offs += [(a, b)] * len(p)
            pos = b
        if pos < len(text):
            i, o = self._encode_offsets(text[pos:])
            ids += i
            offs += [(x + pos, y + pos) for x, y in o]
        return ids, offs

    def encode_plain(self, text: str, plain_contents: Iterable[str] = ()) -> list[int]:
        """Like :meth:`encode`, with control text inside each occurrence of ``plain_contents`` as ordinary text.

        For re-rendered contexts where only the messages' contents are known (not their spans).

        Raises:
            ControlTextError, ValueError: as :meth:`encode_offsets`.
        """
        spans = []
        if self._control_re is not None:
            for c in plain_contents:
                if isinstance(c, str) and c and self._control_re.search(c):
                    k = text.find(c)
                    while k >= 0:
                        spans.append(_Span(k, k + len(c)))
                        k = text.find(c, k + 1)
        if not spans:
            return self.encode(text)
        return self.encode_offsets(text, spans)[0]

    def _control_hits(self, text: str, plain: Sequence) -> list:
        """``[(start, end)]`` of control-token text starting inside a ``plain`` span (raises in refuse mode)."""
        if not plain or self._control_re is None:
            return []
        out, image = [], self._image_controls()
        for r in plain:
            for m in self._control_re.finditer(text, r.start, r.end):
                if m.group(0) in image:
                    continue        # an expanded image: text content cannot hold its control text (vision.py)
                if self.content_text == 'refuse':
                    raise ControlTextError(getattr(r, 'message', -1), getattr(r, 'owner', 'content'), m.group(0))
                out.append((m.start(), m.end()))
        return sorted(set(out))

    def _image_controls(self) -> frozenset:
        """The control texts of an expanded image (empty for a text-only template)."""
        if not self.vision:
            return frozenset()
        from .vision import vision_facts
        return vision_facts(self).control_texts

    def _plain_ids(self, text: str) -> list[int]:
        """``text`` through the normalizer, pre-tokenizer and model only (added tokens not matched)."""
        be = self.tokenizer.backend_tokenizer
        t = be.normalizer.normalize_str(text) if be.normalizer is not None else text
        pieces = be.pre_tokenizer.pre_tokenize_str(t) if be.pre_tokenizer is not None else [(t, (0, len(t)))]
        ids = [tk.id for piece, _ in pieces for tk in be.model.tokenize(piece)]
        bad = sorted(set(ids) & self.control_ids)
        if bad:
            raise ValueError(f'{text!r} encodes to the control ids {bad} even as ordinary text (the vocabulary '
                             "holds it); pass content_text='refuse' and remove it from the content")
        return ids

    def _encode_offsets(self, text: str) -> tuple[list[int], list[tuple[int, int]]]:
        be = self._backend()
        if be is not None:
            cuts = self._chunk_cuts(text) if len(text) > _CHUNK_CHARS else []
            if not cuts:
                enc = be.encode(text, add_special_tokens=False)
                return enc.ids, enc.offsets
            bounds = [0] + cuts + [len(text)]
            ids, offs = [], []
            for a, enc in zip(bounds, be.encode_batch([text[a:b] for a, b in zip(bounds, bounds[1:])],
                                                       add_special_tokens=False)):
                ids += enc.ids
                offs += [(x + a, y + a) for x, y in enc.offsets]
            return ids, offs
        enc = self.tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
        return list(enc['input_ids']), [tuple(o) for o in enc['offset_mapping']]

    def _chunk_cuts(self, text: str) -> list[int]:
        """Positions, about every ``_CHUNK_CHARS``, where a control token starts (the tokenizer splits
        there anyway, so encoding the pieces apart gives the same ids); tokens that strip the space
        before them are never cut at."""
        if self._control_re is None:
            return []
        cuts, nxt = [], _CHUNK_CHARS
        for m in self._control_re.finditer(text, _CHUNK_CHARS):
            if m.start() >= nxt and m.group(0) in self._cut_ok:
                cuts.append(m.start())
                nxt = m.start() + _CHUNK_CHARS
        return cuts

    @property
    def _cut_ok(self) -> frozenset:
        if 'cut_ok' not in self._cache:
            dec = getattr(self.tokenizer, 'added_tokens_decoder', None) or {}
            self._cache['cut_ok'] = frozenset(getattr(t, 'content', str(t)) for t in dec.values()
                                              if not getattr(t, 'lstrip', False))
        return self._cache['cut_ok']

    def decode(self, ids: Iterable[int]) -> str:
        """Ids -> text, special tokens kept, no clean-up (the exact inverse where one exists)."""
        ids = ids.tolist() if hasattr(ids, 'tolist') else list(ids)
        backend = getattr(self.tokenizer, 'backend_tokenizer', None)
        if backend is not None:  # what transformers' decode calls, without its per-call overhead
            return backend.decode(ids, skip_special_tokens=False)
        return self.tokenizer.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)

    def tokens(self, ids: Iterable[int]) -> list[str]:
        """Ids -> token strings (``convert_ids_to_tokens``)."""
        ids = ids.tolist() if hasattr(ids, 'tolist') else list(ids)
        return self.tokenizer.convert_ids_to_tokens(ids)

    def stop_text(self, token_id: int) -> str | None:
        """The text of a stop token id, or None when ``token_id`` is not a stop token."""
        return self._stop_text_of.get(int(token_id))

    def leading_stop(self, text: str) -> str:
        """The stop-token text ``text`` starts with ('' if none)."""
        for s in self.stop_texts:
            if text.startswith(s):
                return s
        return ''

    def leading_control(self, text: str) -> str:
        """The control-token text ``text`` starts with ('' if none)."""
        hit = self._control_re.match(text) if self._control_re is not None else None
        return hit.group(0) if hit is not None else ''

    def sentinel(self, i: int, avoid: str = '') -> str:
        """A unique plain-ASCII marker for slot ``i`` that does not occur in ``avoid``."""
        nonce = 0
        while True:
            s = f'AgentrlSlot{i}Q{nonce}Z'
            if s not in avoid:
                return s
            nonce += 1

    # ------------------------------------------------------------------ fingerprints
    @property
    def fingerprint(self) -> str:
        """sha256 (16 hex) of template source, options, tool schemas, vocabulary, special ids.

        Source: book chapter 5.8 ("pin the tokenizer and template versions").
        """
        if 'fingerprint' not in self._cache:
            import hashlib
            fields = {'template': self.source, 'kwargs': self.template_kwargs,
                      'tools': self.tools, 'stop': sorted(self.stop_texts),
                      'tokenizer': tokenizer_fingerprint(self.tokenizer)}
            if self.content_text != 'plain':
                fields['content_text'] = self.content_text
            if self.vision:
                fields['vision'] = self.vision
            payload = json.dumps(fields,
                                 sort_keys=True, separators=(',', ':'), default=str)
            self._cache['fingerprint'] = hashlib.sha256(payload.encode()).hexdigest()[:16]
        return self._cache['fingerprint']

    # ------------------------------------------------------------------ capability checks
    def _check_tools_used(self) -> None:
        probe = [{'role': 'user', 'content': 'Probe question.'}]
        if self.render(probe, True) == self.render(probe, True, tools=None):
            names = [t['function']['name'] for t in self.tools]
            raise ValueError(f'tools=: this chat template ignores tool schemas (rendering with and without '
                             f'tools={names} gives the same text), so the model would never see them; put the '
                             'tool descriptions in a system message yourself and pass tools=None')


_DIGESTS: dict = {}
_CONTROLS: dict = {}
#: Texts longer than this are encoded in pieces cut at control tokens (same ids, linear time).
_CHUNK_CHARS = 1 << 15


class _Span:
    __slots__ = ('start', 'end', 'message', 'owner')

    def __init__(self, start, end, message=-1, owner='content'):
        self.start, self.end, self.message, self.owner = start, end, message, owner


def _controls(tokenizer) -> tuple:
    """(frozenset of added-token ids, compiled regex matching their texts longest first, or None)."""
    hit = _CONTROLS.get(id(tokenizer))
    if hit is not None and hit[0] is tokenizer:
        return hit[1]
    dec = getattr(tokenizer, 'added_tokens_decoder', None) or {}
    texts = {int(i): getattr(t, 'content', str(t)) for i, t in dec.items()}
    texts = {i: t for i, t in texts.items() if t}
    pattern = re.compile('|'.join(re.escape(t) for t in sorted(set(texts.values()), key=len, reverse=True))) \
        if texts else None
    out = (frozenset(texts), pattern)
    _CONTROLS[id(tokenizer)] = (tokenizer, out)
    return out


def tokenizer_fingerprint(tokenizer) -> str:
    """sha256 (16 hex) of a tokenizer's class, vocabulary, added tokens and special ids.

    Stored as ``Provenance.tokenizer``. Cached per tokenizer object (hashing a 150k vocabulary takes
    ~0.2 s). A :class:`ChatTemplate` gives its tokenizer's fingerprint.

    Raises:
        AttributeError: not a Hugging Face tokenizer (no ``get_vocab``).

    Source: book chapter 5.8 (pin the tokenizer version).
    """
    if isinstance(tokenizer, ChatTemplate):
        tokenizer = tokenizer.tokenizer
    key = id(tokenizer)
    hit = _DIGESTS.get(key)
    if hit is not None and hit[0] is tokenizer:
        return hit[1]
    import hashlib
    h = hashlib.sha256()
    h.update(type(tokenizer).__name__.encode())
    vocab = tokenizer.get_vocab()
    h.update(json.dumps(sorted(vocab.items(), key=lambda kv: kv[1]), ensure_ascii=False,
                        separators=(',', ':')).encode())
    h.update(json.dumps({'special': {k: str(v) for k, v in tokenizer.special_tokens_map.items()},
                         'added': {int(i): t.content for i, t in tokenizer.added_tokens_decoder.items()}},
                        sort_keys=True).encode())
    digest = h.hexdigest()[:16]
    _DIGESTS[key] = (tokenizer, digest)
    return digest


#: The old name of :func:`tokenizer_fingerprint`, kept one release for callers not yet renamed.
tokenizer_digest = tokenizer_fingerprint


def as_template(tokenizer_or_template, tools=None, **options) -> ChatTemplate:
    """Return ``tokenizer_or_template`` as a :class:`ChatTemplate`.

    Args:
        tokenizer_or_template: a :class:`ChatTemplate` (returned as is) or a tokenizer.
        tools, **options: :class:`ChatTemplate` arguments, only with a tokenizer.

    Raises:
        ValueError: options given together with a ChatTemplate (they are fixed on it; use
            ``template.with_options(...)``), or as :class:`ChatTemplate`.

    Source: design notes (one object holds a template's options).
    """
    if isinstance(tokenizer_or_template, ChatTemplate):
        extra = dict(options, **({'tools': tools} if tools is not None else {}))
        if extra:
            raise ValueError(f'{sorted(extra)} given with a ChatTemplate, whose options are fixed: '
                             'use template.with_options(...) or pass the tokenizer instead')
        return tokenizer_or_template
    return ChatTemplate(tokenizer_or_template, tools=tools, **options)
