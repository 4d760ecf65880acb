"""L2: a Hugging Face chat template with fixed options: render, encode, stop tokens, sentinels.

Everything in :mod:`agentrl.templates` goes through :class:`ChatTemplate`, so every audit,
label and bridge is computed by running the tokenizer's own template (no per-model string
tables). transformers and jinja2 are imported lazily, inside the functions that need them.
"""
from __future__ import annotations

import copy
import json
from typing import Any, Iterable, Sequence

__all__ = ['ChatTemplate', 'as_template', 'function_tools', 'require_hf', 'load_tokenizer',
           'PROMPT_ROLES', 'TOOL_ROLES']

#: Roles whose content the task supplies (owner ``prompt``).
PROMPT_ROLES = ('system', 'user', 'developer')
#: Roles whose content an environment returns (owner ``tool``).
TOOL_ROLES = ('tool', 'ipython', 'function', 'observation')
_ROLES = PROMPT_ROLES + TOOL_ROLES + ('assistant',)
#: Template options ChatTemplate takes by keyword; everything else goes to the template.
_OWN_OPTIONS = ('tools', 'chat_template', 'stop_tokens')


def require_hf(what: str = 'agentrl.templates'):
    """Import transformers (and check jinja2), or raise an ImportError that names the extra.

    Returns:
        The ``transformers`` module.

    Raises:
        ImportError: transformers or jinja2 is missing; fix with ``pip install agentrl[hf]``.

    Source: design notes (heavy dependencies are extras, imported lazily).
    """
    try:
        import jinja2  # noqa: F401
        import transformers
    except ImportError as e:  # pragma: no cover - exercised only without the extra
        raise ImportError(f'{what} needs transformers and jinja2 ({e}); install them with '
                          '`pip install agentrl[hf]`') from e
    return transformers


def load_tokenizer(name_or_path: str):
    """Load a Hugging Face tokenizer from a local folder or a hub id.

    Args:
        name_or_path: a folder with ``tokenizer.json`` / ``tokenizer_config.json``, or a hub id.
            With ``HF_HUB_OFFLINE=1`` nothing is downloaded.

    Returns:
        The ``AutoTokenizer`` instance (transformers' logging is left unchanged).

    Raises:
        ImportError: without the ``hf`` extra (``pip install agentrl[hf]``).
        ValueError: the folder or id does not hold a tokenizer; pass a folder that contains
            ``tokenizer.json`` or a hub id reachable from this machine.

    Source: Hugging Face ``AutoTokenizer.from_pretrained``.
    """
    transformers = require_hf('load_tokenizer')
    try:
        return transformers.AutoTokenizer.from_pretrained(name_or_path)
    except (OSError, ValueError) as e:
        raise ValueError(f'TOKENIZER {name_or_path!r} could not be loaded ({type(e).__name__}: {e}); '
                         'pass a folder with tokenizer.json and tokenizer_config.json, or a hub id '
                         '(set HF_HUB_OFFLINE=1 to forbid downloads)') from e


def function_tools(schemas: Iterable[dict] | None) -> list[dict] | None:
    """Convert MCP-style tool schemas to the function-calling format chat templates read.

    Args:
        schemas: dicts with ``name``, ``description``, ``inputSchema`` (MCP, as the gym's
            ``TOOL_SCHEMAS``), or already ``{'type': 'function', 'function': {...}}``.

    Returns:
        ``[{'type': 'function', 'function': {'name', 'description', 'parameters'}}]`` or None.

    Raises:
        ValueError: a schema has neither ``function`` nor ``name``; pass MCP or OpenAI tool dicts.

    Source: book chapter 5.2 (the conversion of ``arl.TOOL_SCHEMAS`` for Qwen3's template).
    """
    if schemas is None:
        return None
    out = []
    for i, s in enumerate(schemas):
        if not isinstance(s, dict):
            raise ValueError(f'tools[{i}] is a {type(s).__name__}; each tool must be a dict schema')
        if 'function' in s:
            out.append(s)
        elif 'name' in s:
            out.append({'type': 'function', 'function': {
                'name': s['name'], 'description': s.get('description', ''),
                'parameters': s.get('inputSchema', s.get('parameters', {'type': 'object', 'properties': {}}))}})
        else:
            raise ValueError(f'tools[{i}] has neither "function" nor "name": pass OpenAI-style '
                             "{'type': 'function', 'function': {...}} or MCP-style {'name', 'description', "
                             "'inputSchema'} schemas")
    return out


def check_messages(messages: Any, field: str = 'messages') -> list[dict]:
    """Validate a conversation and return a shallow copy of its messages.

    Raises:
        ValueError: not a list of dicts, a message without a known ``role`` or with non-string
            content; the error names the index, the field and the accepted values.

    Source: the OpenAI/Hugging Face chat message format (``role``, ``content``, ``tool_calls``).
    """
    if not isinstance(messages, (list, tuple)):
        raise ValueError(f'{field} must be a list of message dicts, got {type(messages).__name__}')
    out = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict):
            raise ValueError(f'{field}[{i}] must be a dict with "role" and "content", got {type(m).__name__}')
        role = m.get('role')
        if role not in _ROLES:
            raise ValueError(f'{field}[{i}]["role"] is {role!r}; use one of {list(_ROLES)}')
        c = m.get('content')
        if c is not None and not isinstance(c, (str, list)):
            raise ValueError(f'{field}[{i}]["content"] must be a string (or a list of content parts), '
                             f'got {type(c).__name__}')
        out.append(dict(m))
    return out


def owner_of_role(role: str) -> str:
    """``'policy'`` for assistant, ``'tool'`` for tool roles, ``'prompt'`` for the rest."""
    if role == 'assistant':
        return 'policy'
    return 'tool' if role in TOOL_ROLES else 'prompt'


def common_prefix(a: str, b: str) -> int:
    """Length of the longest common prefix of two strings (binary search over C comparisons)."""
    n = min(len(a), len(b))
    if a[:n] == b[:n]:
        return n
    lo, hi = 0, n
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid - 1
    return lo


def common_suffix(a: str, b: str, limit: int) -> int:
    """Length of the longest common suffix of ``a`` and ``b``, at most ``limit``."""
    n = min(len(a), len(b), limit)
    if n <= 0:
        return 0
    if a[len(a) - n:] == b[len(b) - n:]:
        return n
    lo, hi = 0, n
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if a[len(a) - mid:] == b[len(b) - mid:]:
            lo = mid
        else:
            hi = mid - 1
    return lo


def diff_span(text: str, other: str, sentinel: str):
    """Where ``text`` differs from ``other`` (``text`` with one field swapped for ``sentinel``).

    Returns ``(start, end, part)``: the differing span of ``text`` and the differing part of
    ``other``, widened so that ``part`` holds the whole sentinel when ``other`` renders it (a
    common prefix or suffix can otherwise eat its first or last characters).
    """
    p = common_prefix(text, other)
    s = common_suffix(text, other, min(len(text), len(other)) - p)
    zs = other.find(sentinel)
    if zs >= 0:
        p = min(p, zs)
        s = min(s, len(other) - zs - len(sentinel))
    return p, len(text) - s, other[p:len(other) - s]


class ChatTemplate:
    """A tokenizer's chat template with its options fixed: the one way agentrl renders chats.

    Args:
        tokenizer: a Hugging Face (fast) tokenizer with a chat template.
        tools: tool schemas passed as ``tools=`` to the template (MCP-style schemas are
            converted with :func:`function_tools`); None for no tools.
        chat_template: a template string overriding the tokenizer's own.
        stop_tokens: extra end-of-turn tokens the engine stops at, besides ``eos_token``
            (for example Gemma's ``<end_of_turn>``); each must be a single token.
        **template_kwargs: options the template reads, such as ``enable_thinking=False``.

    Attributes:
        tokenizer, tools, chat_template, template_kwargs, stop_texts (list[str]),
        stop_ids (frozenset[int]).

    Raises:
        ImportError: without the ``hf`` extra (``pip install agentrl[hf]``).
        ValueError: no chat template (pass ``chat_template=``); a stop token that is not one
            token; ``tools=`` given to a template that ignores them (the error names
            ``tools=``: put the tool descriptions in a system message and pass ``tools=None``).

    Source: Hugging Face ``apply_chat_template`` (rendering is delegated to it, so
    transformers' message normalisation applies: keys whose value is None are dropped).
    """

    def __init__(self, tokenizer, *, tools: Sequence[dict] | None = None, chat_template: str | None = None,
                 stop_tokens: Sequence[str] | None = None, **template_kwargs):
        require_hf('ChatTemplate')
        if not hasattr(tokenizer, 'apply_chat_template'):
            raise ValueError(f'tokenizer must be a Hugging Face tokenizer, got {type(tokenizer).__name__}; '
                             'load one with agentrl.templates.load_tokenizer(path)')
        if chat_template is None and not getattr(tokenizer, 'chat_template', None):
            raise ValueError('the tokenizer has no chat template: pass chat_template="..." (a Jinja string)')
        if not getattr(tokenizer, 'is_fast', True):
            raise ValueError(f'{type(tokenizer).__name__} is a slow tokenizer: agentrl needs character offsets; '
                             'load the fast tokenizer (tokenizer.json)')
        self.tokenizer = tokenizer
        self.tools = function_tools(tools) if tools else None
        self.chat_template = chat_template
        self.template_kwargs = dict(template_kwargs)
        texts = []
        if tokenizer.eos_token:
            texts.append(tokenizer.eos_token)
        for t in stop_tokens or ():
            if t not in texts:
                texts.append(t)
        ids = []
        for t in texts:
            enc = tokenizer(t, add_special_tokens=False)['input_ids']
            if len(enc) != 1:
                raise ValueError(f'stop_tokens: {t!r} encodes to {len(enc)} tokens {enc}; '
                                 'an end-of-turn token must be a single (special) token')
            ids.append(enc[0])
        if not texts:
            raise ValueError('the tokenizer has no eos_token: pass stop_tokens=["<end-of-turn token>"]')
        self.stop_texts = sorted(texts, key=len, reverse=True)
        self.stop_ids = frozenset(ids)
        self._stop_text_of = dict(zip(ids, texts))
        self._cache: dict = {}
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
        """Options as a JSON-able dict (template kwargs, tool names, stop tokens)."""
        return {'template_kwargs': self.template_kwargs, 'stop_tokens': list(self.stop_texts),
                'tools': [t['function']['name'] for t in self.tools or ()],
                'chat_template': 'custom' if self.chat_template else 'tokenizer'}

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
                check the fields the template expects, e.g. tool-call arguments as a string).
        """
        if not messages:
            raise ValueError('messages is empty: a chat template needs at least one message')
        jinja2 = __import__('jinja2')
        kwargs = {**self.template_kwargs, **override}
        try:
            return self.tokenizer.apply_chat_template(
                list(messages), tools=self.tools if tools == 'default' else tools,
                chat_template=self.chat_template, tokenize=False,
                add_generation_prompt=add_generation_prompt, **kwargs)
        except (jinja2.TemplateError, TypeError, KeyError, IndexError) as e:
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
            return be.encode(text, add_special_tokens=False).ids
        return list(self.tokenizer(text, add_special_tokens=False)['input_ids'])

    def encode_offsets(self, text: str) -> tuple[list[int], list[tuple[int, int]]]:
        """Text -> (ids, character offsets ``(start, end)`` of each token)."""
        be = self._backend()
        if be is not None:
            enc = be.encode(text, add_special_tokens=False)
            return enc.ids, enc.offsets
        enc = self.tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
        return list(enc['input_ids']), [tuple(o) for o in enc['offset_mapping']]

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
            payload = json.dumps({'template': self.source, 'kwargs': self.template_kwargs,
                                  'tools': self.tools, 'stop': sorted(self.stop_texts),
                                  'tokenizer': tokenizer_digest(self.tokenizer)},
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


def tokenizer_digest(tokenizer) -> str:
    """sha256 (16 hex) of a tokenizer's class, vocabulary, added tokens and special ids.

    Cached per tokenizer object (hashing a 150k vocabulary takes ~0.2 s).

    Raises:
        AttributeError: not a Hugging Face tokenizer (no ``get_vocab``).

    Source: book chapter 5.8 (pin the tokenizer version).
    """
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
