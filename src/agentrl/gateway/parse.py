"""L5: the assistant message a sampled turn means, and its streaming deltas.

The reply a harness sees is the parse of the ids the engine sampled, never a re-render: the
decoded text is split into ``reasoning_content`` (a leading ``<think>...</think>`` block),
``tool_calls`` (Qwen3 / Hermes ``<tool_call>{json}</tool_call>`` blocks) and ``content`` (the
leftover text, kept verbatim). Streaming deltas are cut from that one message, so their
concatenation equals it byte for byte.

Source: Qwen3's chat template (``<think>\\n...\\n</think>\\n\\n`` and ``<tool_call>\\n{"name": ...,
"arguments": ...}\\n</tool_call>``); the OpenAI chat-completions message and chunk formats.
"""
from __future__ import annotations

import hashlib
import json
import re

__all__ = ['parse_reply', 'split_reasoning', 'message_deltas', 'call_deltas', 'tool_call_id', 'finish_reason',
           'normalize_assistant']

_TOOL_CALL = re.compile(r'<tool_call>(.*?)</tool_call>', re.S)
_THINK_OPEN, _THINK_CLOSE = '<think>', '</think>'


def tool_call_id(seed: str, k: int) -> str:
    """The gateway's id of tool call ``k`` of a turn: ``'call_'`` + 24 hex of sha256(seed, k)."""
    return 'call_' + hashlib.sha256(f'{seed}/{k}'.encode()).hexdigest()[:24]


def _split_reasoning(text: str) -> tuple:
    """``(reasoning or None, rest)``: a leading think block (or text before a lone ``</think>``)."""
    head = text.lstrip()
    if head.startswith(_THINK_OPEN) and _THINK_CLOSE in head:
        inner, rest = head[len(_THINK_OPEN):].split(_THINK_CLOSE, 1)
        return inner.strip('\n'), rest.lstrip('\n')
    if _THINK_CLOSE in text and _THINK_OPEN not in text:
        inner, rest = text.split(_THINK_CLOSE, 1)
        return inner.strip('\n'), rest.lstrip('\n')
    return None, text


def _calls(body: str, id_seed: str) -> tuple:
    """``(tool_calls, leftover text)``: every well-formed ``<tool_call>`` block becomes a call."""
    calls, kept, pos = [], [], 0
    for m in _TOOL_CALL.finditer(body):
        try:
            obj = json.loads(m.group(1))
        except ValueError:
            continue
        args = obj.get('arguments', {}) if isinstance(obj, dict) else None
        if isinstance(args, str):
            try:
                args = json.loads(args)
            except ValueError:
                args = None
        if not (isinstance(obj, dict) and isinstance(obj.get('name'), str) and isinstance(args, dict)):
            continue                       # malformed: the block stays in the content, verbatim
        kept.append(body[pos:m.start()])
        pos = m.end()
        calls.append({'id': tool_call_id(id_seed, len(calls)), 'type': 'function',
                      'function': {'name': obj['name'], 'arguments': json.dumps(args, ensure_ascii=False)}})
    kept.append(body[pos:])
    return calls, ''.join(kept)


def split_reasoning(text: str, think_open: bool) -> tuple:
    """``(reasoning or None, body)`` in the streamable form (:func:`parse_reply` with ``think_open``).

    ``think_open``: the prompt ended inside an open think block (the template wrote ``<think>``), so
    the text is reasoning up to the first ``</think>``; else only a leading ``<think>`` block is
    reasoning and a lone ``</think>`` is content. A block never closed (the turn was cut in its
    reasoning) is all reasoning. Reasoning is stripped of newlines; the body of leading newlines.
    """
    if think_open:
        inner = text
    else:
        head = text.lstrip()
        if not head.startswith(_THINK_OPEN):
            return None, text
        inner = head[len(_THINK_OPEN):]
    if _THINK_CLOSE in inner:
        r, rest = inner.split(_THINK_CLOSE, 1)
        return r.strip('\n'), rest.lstrip('\n')
    return inner.strip('\n'), ''


def parse_reply(text: str, *, id_seed: str = '', tools: bool = True, think_open: bool | None = None) -> dict:
    """The assistant message of a decoded sampled turn (its stop token already removed).

    Args:
        text: the turn's decoded text without its end-of-turn text (and cut before a stop string).
        id_seed: makes the tool-call ids (:func:`tool_call_id`), e.g. the session and call index.
        tools: parse ``<tool_call>`` blocks (False, for ``tool_choice='none'``: they stay content).
        think_open: None (default): a leading ``<think>...</think>`` block, or the text before a lone
            ``</think>``, is reasoning, and an unclosed block is content. True / False (what the
            gateway passes: whether the prompt opened a think block): :func:`split_reasoning`, and
            the content loses its leading newlines; the form whose every field grows as a prefix
            while tokens arrive, so :class:`agentrl.gateway.stream.ReplyStream` streams it exactly.

    Returns:
        ``{'role': 'assistant', 'content': str | None, 'reasoning_content'?: str, 'tool_calls'?:
        [{'id', 'type': 'function', 'function': {'name', 'arguments': JSON string}}]}``;
        ``content`` is None only when the turn holds tool calls and no other text.

    Example:
        >>> parse_reply('<think>\\nhm\\n</think>\\n\\n<tool_call>\\n{"name": "read", "arguments": {}}\\n</tool_call>')
        ... # {'role': 'assistant', 'content': None, 'reasoning_content': 'hm', 'tool_calls': [...]}
    """
    reasoning, body = _split_reasoning(text) if think_open is None else split_reasoning(text, think_open)
    calls, rest = _calls(body, id_seed) if tools else ([], body)
    if think_open is not None:
        rest = rest.lstrip('\n')
    if calls:
        rest = rest.strip('\n')
    msg = {'role': 'assistant', 'content': rest if (rest or not calls) else None}
    if reasoning is not None:
        msg['reasoning_content'] = reasoning
    if calls:
        msg['tool_calls'] = calls
    return msg


def finish_reason(message: dict, truncated: bool) -> str:
    """``'length'`` for a turn cut at its budget, ``'tool_calls'`` when it calls tools, else ``'stop'``."""
    if truncated:
        return 'length'
    return 'tool_calls' if message.get('tool_calls') else 'stop'


def _chunks(text: str, size: int = 16) -> list:
    return [text[i:i + size] for i in range(0, len(text), size)]


def message_deltas(message: dict) -> list:
    """Streaming deltas whose concatenation (content, reasoning_content, tool-call arguments) is ``message``.

    Returns:
        A list of ``delta`` dicts: the role first, then reasoning, content, then per tool call its
        id, type and name followed by its arguments in pieces (OpenAI chunk format, ``index`` set).
    """
    out = [{'role': 'assistant', 'content': ''}]
    for piece in _chunks(message.get('reasoning_content') or ''):
        out.append({'reasoning_content': piece})
    for piece in _chunks(message.get('content') or ''):
        out.append({'content': piece})
    for k, call in enumerate(message.get('tool_calls') or ()):
        out += call_deltas(k, call)
    return out


def call_deltas(k: int, call: dict) -> list:
    """The deltas of tool call ``k``: its id, type and name, then its arguments in pieces."""
    fn = call['function']
    out = [{'tool_calls': [{'index': k, 'id': call['id'], 'type': 'function',
                            'function': {'name': fn['name'], 'arguments': ''}}]}]
    for piece in _chunks(fn['arguments']):
        out.append({'tool_calls': [{'index': k, 'function': {'arguments': piece}}]})
    return out


def _args(a):
    if isinstance(a, str):
        try:
            return json.loads(a)
        except ValueError:
            return a
    return a


def normalize_assistant(m: dict) -> tuple:
    """An assistant message up to differences of form: ``(content, ((name, parsed arguments), ...))``.

    Ignored: tool-call ids and types, ``reasoning_content``, JSON formatting of arguments, None vs ''.
    """
    calls = []
    for c in m.get('tool_calls') or ():
        fn = c.get('function', c) if isinstance(c, dict) else {}
        calls.append((fn.get('name'), json.dumps(_args(fn.get('arguments', {})), sort_keys=True)))
    return (m.get('content') or '', tuple(calls))
