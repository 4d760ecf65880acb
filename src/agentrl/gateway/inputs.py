"""L5: what the gateway checks of any JSON it is sent, before a field is read: nesting, Unicode, flags, echoed calls.

Each check returns the problem as ``(param, message)`` (the field's path in the body, a one-line message
naming it and the fix) or None; :mod:`agentrl.gateway.protocol` turns a problem into a 400. The checks
walk without recursion, so a deep body costs a loop, never the interpreter's stack, and no message
they build holds the offending text itself (a lone surrogate cannot be written back as UTF-8).

Source: docs/design.md#bounds (the nesting bound); RFC 8259 section 8.2 (a string holding a lone
surrogate is not interoperable text); the OpenAI chat-completions API (``tool_calls`` of an assistant
message, boolean request fields).
"""
from __future__ import annotations

import json

__all__ = ['MAX_JSON_DEPTH', 'tree_problem', 'flag_problem', 'tool_calls_problem', 'shown']

#: Deepest nesting of lists and objects a request body may have (docs/design.md#bounds).
MAX_JSON_DEPTH = 64



def _path(chain) -> str:
    """``messages[2].content`` from the linked ``(parent, key)`` chain the walk keeps."""
    parts = []
    while chain is not None:
        chain, key = chain
        parts.append(f'[{key}]' if isinstance(key, int) else f'.{_safe(key)}')
    return ''.join(reversed(parts)).lstrip('.') or 'request body'


def _safe(text: str) -> str:
    """``text`` with any lone surrogate written as ``\\udXXX`` and cut to 40 characters (for messages)."""
    return text.encode('utf-8', 'backslashreplace').decode('utf-8')[:40]


def _unpaired(s: str) -> bool:
    if s.isascii():
        return False
    try:
        s.encode('utf-8')
    except UnicodeEncodeError:
        return True
    return False


def tree_problem(value) -> tuple | None:
    """The first place in a parsed JSON value nested past :data:`MAX_JSON_DEPTH` or holding a lone surrogate.

    Args:
        value: what ``json.loads`` returned (dicts, lists, str, numbers, None).

    Returns:
        ``(param, message)``: ``param`` is the path of the string, key or container (``messages[0].content``,
        ``'request body'`` for the top level); or None when the value is fine. One pass over every node.
    """
    stack = [(value, 1, None)]
    while stack:
        v, depth, chain = stack.pop()
        if isinstance(v, str):
            if _unpaired(v):
                where = _path(chain)
                return where, (f'{where} holds a lone UTF-16 surrogate (an unpaired \\ud800-\\udfff escape): it is '
                               'not text; send valid Unicode (a surrogate pair, or the character itself)')
            continue
        if not isinstance(v, (dict, list)):
            continue
        if depth > MAX_JSON_DEPTH:
            where = _path(chain)
            return where.split('.')[0].split('[')[0], (
                f'{where[:120]} nests lists and objects more than {MAX_JSON_DEPTH} levels deep; send a flatter '
                'body (docs/design.md#bounds)')
        if isinstance(v, list):
            stack.extend((x, depth + 1, (chain, i)) for i, x in enumerate(v))
            continue
        for k, x in v.items():
            if _unpaired(k):
                where = _path((chain, k))
                return where, (f'a key of {_path(chain)} ({where}) holds a lone UTF-16 surrogate: it is not text; '
                               'send valid Unicode')
            stack.append((x, depth + 1, (chain, k)))
    return None


def shown(value, limit: int = 60) -> str:
    """A parsed JSON value as a message shows it: its JSON text, cut to ``limit`` characters."""
    return json.dumps(value, ensure_ascii=True)[:limit]


def flag_problem(body: dict, name: str, where: str | None = None) -> tuple | None:
    """``(param, message)`` when ``body[name]`` is present, not null and not a JSON boolean, else None.

    ``where``: the field's path when ``body`` is nested (``stream_options.include_usage``)."""
    v = body.get(name)
    if v is None or isinstance(v, bool):
        return None
    where = where or name
    return where, f'{where} must be true or false, got {shown(v)}'


_CALL_SHAPE = '{"id": "...", "type": "function", "function": {"name": "...", "arguments": "{...}"}}'


def tool_calls_problem(messages: list, start: int = 0) -> tuple | None:
    """The first malformed ``tool_calls`` of checked messages: ``(param, message)`` or None.

    Each message's ``tool_calls`` (when present and not null) must be a list of calls, each an object
    with a ``function`` object (or the function's fields themselves) holding a non-empty string ``name``
    and ``arguments`` that is a string or an object; ``id`` a string, ``type`` ``"function"``.

    Args:
        messages: the messages (dicts, as ``check_messages`` returns them). start: the index of
            ``messages[0]`` in the request (the paths name request indices).
    """
    for i, m in enumerate(messages, start):
        calls = m.get('tool_calls')
        if calls is None:
            continue
        where = f'messages[{i}].tool_calls'
        if not isinstance(calls, list):
            return where, f'{where} must be a list of tool calls ({_CALL_SHAPE}), got {shown(calls)}'
        for j, c in enumerate(calls):
            w = f'{where}[{j}]'
            if not isinstance(c, dict):
                return w, f'{w} must be a tool call {_CALL_SHAPE}, got {shown(c)}'
            fn, fw = (c['function'], f'{w}.function') if 'function' in c else (c, w)
            if not isinstance(fn, dict):
                return fw, f'{fw} must be an object {{"name": "...", "arguments": "{{...}}"}}, got {shown(fn)}'
            if not isinstance(fn.get('name'), str) or not fn['name']:
                return f'{fw}.name', f'{fw}.name must be the called tool\'s name (a non-empty string), got ' \
                                     f'{shown(fn.get("name"))}'
            if fn.get('arguments') is not None and not isinstance(fn['arguments'], (str, dict)):
                return f'{fw}.arguments', f'{fw}.arguments must be a JSON string or an object, got ' \
                                          f'{shown(fn["arguments"])}'
            for key, ok in (('id', lambda v: isinstance(v, str)), ('type', lambda v: v == 'function')):
                if c.get(key) is not None and not ok(c[key]):
                    want = 'a string' if key == 'id' else '"function"'
                    return f'{w}.{key}', f'{w}.{key} must be {want}, got {shown(c[key])}'
    return None

