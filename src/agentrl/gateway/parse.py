"""L5: the OpenAI wire form of a parsed reply: the assistant message and its streaming deltas.

The reply a harness sees is the parse of the ids the engine sampled, never a re-render: the model
family (:mod:`agentrl.families`) splits the decoded text into reasoning, content and tool calls;
here its ``ok`` calls get ids and JSON-string arguments. Streaming deltas are cut from that one
message, so their concatenation equals it byte for byte.

Source: the OpenAI chat-completions message and chunk formats.
"""
from __future__ import annotations

import hashlib
import json

__all__ = ['parse_reply', 'reply_message', 'wire_calls', 'message_deltas', 'call_deltas', 'tool_call_id',
           'finish_reason', 'normalize_assistant']


def tool_call_id(seed: str, k: int) -> str:
    """The gateway's id of tool call ``k`` of a turn: ``'call_'`` + 24 hex of sha256(seed, k)."""
    return 'call_' + hashlib.sha256(f'{seed}/{k}'.encode()).hexdigest()[:24]


def wire_calls(calls, id_seed: str) -> list:
    """OpenAI ``tool_calls`` of parsed ``ok`` calls (:class:`~agentrl.families.ToolCall`).

    A call's id is its own when the format writes one (``ToolCall.id``: Kimi K2's ``functions.NAME:IDX``,
    which the template renders back in history, so the harness must echo exactly it), else
    :func:`tool_call_id` of ``id_seed`` and its index.
    """
    return [{'id': c.id or tool_call_id(id_seed, k), 'type': 'function',
             'function': {'name': c.name, 'arguments': json.dumps(c.arguments, ensure_ascii=False)}}
            for k, c in enumerate(calls)]


def reply_message(reply, id_seed: str = '') -> dict:
    """The assistant message of a parsed :class:`~agentrl.families.Reply`.

    Returns:
        ``{'role': 'assistant', 'content': str | None, 'reasoning_content'?: str, 'tool_calls'?:
        [{'id', 'type': 'function', 'function': {'name', 'arguments': JSON string}}]}``;
        ``content`` is None only when the turn holds tool calls and no other text.
    """
    calls = wire_calls(reply.ok_calls, id_seed)
    msg = {'role': 'assistant', 'content': reply.content if (reply.content or not calls) else None}
    if reply.reasoning is not None:
        msg['reasoning_content'] = reply.reasoning
    if calls:
        msg['tool_calls'] = calls
    return msg


def parse_reply(text: str, family, *, id_seed: str = '', tools: bool = True, think_open: bool | None = None) -> dict:
    """The assistant message of a decoded sampled turn (its stop token already removed).

    Args:
        text: the turn's decoded text without its end-of-turn text (and cut before a stop string).
        family: the model family (:func:`agentrl.families.family_for`).
        id_seed: makes the tool-call ids (:func:`tool_call_id`), e.g. the session and call index.
        tools: parse tool calls (False, for ``tool_choice='none'``: they stay content).
        think_open: as :meth:`agentrl.families.Family.split_reasoning` (the gateway passes whether
            the prompt opened a reasoning block: the form :class:`agentrl.gateway.stream.ReplyStream`
            streams exactly).

    Returns:
        :func:`reply_message` of the family's parse.

    Example:
        >>> parse_reply('<think>\\nhm\\n</think>\\n\\n<tool_call>\\n{"name": "read", "arguments": {}}\\n</tool_call>', QWEN3)
        ... # {'role': 'assistant', 'content': None, 'reasoning_content': 'hm', 'tool_calls': [...]}
    """
    return reply_message(family.parse_text(text, think_open=think_open, tools=tools), id_seed)


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
        except (ValueError, RecursionError):        # not JSON, or nested past the parser's stack: compared as text
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
