"""L2: chat messages before a template sees them: roles, content parts, tool schemas, and diffs.

Plain data in, plain data out (no tokenizer). :func:`common_prefix`, :func:`common_suffix` and
:func:`diff_span` work on any sliceable sequence: strings (rendered text) and lists of ids.
"""
from __future__ import annotations

from typing import Any, Iterable, Sequence

__all__ = ['PROMPT_ROLES', 'TOOL_ROLES', 'flatten_content', 'function_tools', 'check_messages', 'image_parts',
           'owner_of_role', 'common_prefix', 'common_suffix', 'diff_span']

#: Roles whose content the task supplies (owner ``prompt``).
PROMPT_ROLES = ('system', 'user', 'developer')
#: Roles whose content an environment returns (owner ``tool``).
TOOL_ROLES = ('tool', 'ipython', 'function', 'observation')
_ROLES = PROMPT_ROLES + TOOL_ROLES + ('assistant',)


def flatten_content(content: Any, where: str = 'content') -> Any:
    """List-of-parts content as the text a template renders; other content unchanged.

    ``[{'type': 'text', 'text': '4'}, {'type': 'text', 'text': '2'}]`` -> ``'42'`` (parts joined with
    nothing between them, as the OpenAI chat format concatenates them). Strings and None pass through.

    Raises:
        ValueError: a part that is not text (``input_audio``; ``image_url`` unless a vision template expanded
            it first, :func:`agentrl.templates.vision.expand_images`); the error names the part index and its
            type. Also a malformed part.

    Source: the OpenAI chat message format (content parts).
    """
    if not isinstance(content, list):
        return content
    out = []
    for j, part in enumerate(content):
        if isinstance(part, str):
            out.append(part)
            continue
        kind = part.get('type') if isinstance(part, dict) else type(part).__name__
        if kind == 'text' and isinstance(part.get('text'), str):
            out.append(part['text'])
        elif kind == 'text':
            raise ValueError(f'{where}[{j}] is a text part without a string "text"; give {{"type": "text", '
                             '"text": "..."}')
        else:
            raise ValueError(f'{where}[{j}] is a {kind!r} part: agentrl records text only here (image_url parts '
                             'need a vision-language model\'s template, whose folder holds preprocessor_config.json; '
                             'no audio); send text parts, or describe the non-text input in text')
    return ''.join(out)


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


def check_messages(messages: Any, field: str = 'messages', images: bool = False) -> list[dict]:
    """Validate a conversation and return a shallow copy of its messages.

    List-of-parts content is flattened to its text (:func:`flatten_content`), so every template
    sees the text (a template that only reads strings would otherwise render it empty). With
    ``images`` the content of a user or tool message that holds ``image_url`` parts stays a list of
    parts (:func:`image_parts`: text parts and ``{"type": "image_url", "image_url": {"url": URL}}``),
    for a vision template to expand (:func:`agentrl.templates.vision.expand_images`).

    Raises:
        ValueError: not a list of dicts, a message without a known ``role``, content that is not a
            string or a list of text parts (an image part names its index; with ``images``, one in a
            message other than a user or tool message, or without a string URL); the error names the
            index, the field and the accepted values.

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
        m = dict(m)
        if isinstance(c, list):
            kept = image_parts(c, role, f'{field}[{i}]["content"]') if images else None
            m['content'] = kept if kept is not None else flatten_content(c, f'{field}[{i}]["content"]')
        out.append(m)
    return out


def image_parts(content: list, role: str, where: str = 'content') -> list | None:
    """The parts of list content that holds ``image_url`` parts, each in one form; None when it holds none.

    Text parts become ``{"type": "text", "text": T}``, image parts ``{"type": "image_url", "image_url":
    {"url": URL}}`` (``detail`` and other keys dropped: the processor sizes every image alike), so an echoed
    message compares equal to the one first sent. The URL is not decoded here.

    Raises:
        ValueError: an image part in a message other than a user or tool message, an image part without a
            string ``url``, or another non-text part (names ``where[j]``).

    Source: the OpenAI chat format's content parts; docs/design.md#images.
    """
    if not any(isinstance(p, dict) and p.get('type') == 'image_url' for p in content):
        return None
    out = []
    for j, p in enumerate(content):
        kind = p.get('type') if isinstance(p, dict) else None
        if isinstance(p, str) or (kind == 'text' and isinstance(p.get('text'), str)):
            out.append({'type': 'text', 'text': p if isinstance(p, str) else p['text']})
            continue
        if kind != 'image_url':
            raise ValueError(f'{where}[{j}] is a {kind!r} part: agentrl records text and image_url parts here; send '
                             'text or data-URL images')
        if role != 'user' and role not in TOOL_ROLES:
            raise ValueError(f'{where}[{j}] is an image in a {role!r} message; images go in user messages or tool '
                             'results')
        spec = p.get('image_url')
        url = spec.get('url') if isinstance(spec, dict) else spec
        if not isinstance(url, str):
            raise ValueError(f'{where}[{j}]["image_url"]["url"] must be a string data URL '
                             '(data:image/png;base64,...), got ' + type(url).__name__)
        out.append({'type': 'image_url', 'image_url': {'url': url}})
    return out


def owner_of_role(role: str) -> str:
    """``'policy'`` for assistant, ``'tool'`` for tool roles, ``'prompt'`` for the rest."""
    if role == 'assistant':
        return 'policy'
    return 'tool' if role in TOOL_ROLES else 'prompt'


def common_prefix(a: Sequence, b: Sequence) -> int:
    """Length of the longest common prefix of two strings or two lists (binary search over slice compares).

    Example: ``common_prefix('abc', 'abd') == 2``; ``common_prefix([1, 2, 3], [1, 2]) == 2``.
    """
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


def common_suffix(a: Sequence, b: Sequence, limit: int) -> int:
    """Length of the longest common suffix of ``a`` and ``b`` (strings or lists), at most ``limit``."""
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


def _find(seq: Sequence, part: Sequence) -> int:
    """First index of ``part`` in ``seq`` (``str.find`` for strings), or -1."""
    if isinstance(seq, str):
        return seq.find(part)
    seq, part, k = list(seq), list(part), len(part)
    if not k:
        return 0
    return next((i for i in range(len(seq) - k + 1) if seq[i] == part[0] and seq[i:i + k] == part), -1)


def diff_span(text: Sequence, other: Sequence, sentinel: Sequence):
    """Where ``text`` differs from ``other`` (``text`` with one field swapped for ``sentinel``).

    Works on strings and on lists of ids (``sentinel`` of the same kind).

    Returns ``(start, end, part)``: the differing span of ``text`` and the differing part of
    ``other``, widened so that ``part`` holds the whole sentinel when ``other`` renders it (a
    common prefix or suffix can otherwise eat its first or last characters).
    """
    p = common_prefix(text, other)
    s = common_suffix(text, other, min(len(text), len(other)) - p)
    zs = _find(other, sentinel)
    if zs >= 0:
        p = min(p, zs)
        s = min(s, len(other) - zs - len(sentinel))
    return p, len(text) - s, other[p:len(other) - s]
