"""L2: the gpt-oss family: OpenAI's harmony format (channels, recipients, ``<|call|>`` and ``<|return|>``).

A reply is what the model samples after the generation prompt ``<|start|>assistant``: one or more
harmony messages, the first one's header starting right away (its role is the prompt's), later
ones opening with ``<|start|>assistant``. A message is ``HEADER<|message|>BODY`` closed by ``<|end|>``
(more messages follow), ``<|call|>`` (a tool call: the turn stops) or ``<|return|>`` (the answer:
the turn stops). The header names the channel (``<|channel|>analysis``, ``commentary``, ``final``),
maybe a recipient (`` to=functions.NAME``, before or after the channel) and a content type
(`` json`` or `` <|constrain|>json``). What a gpt-oss model writes for a turn that reasons, then calls::

    <|channel|>analysis<|message|>Read it first.<|end|><|start|>assistant to=functions.read<|channel|>commentary json<|message|>{"path": "clamp.py"}<|call|>

and for an answer ``<|channel|>analysis<|message|>...<|end|><|start|>assistant<|channel|>final<|message|>Fixed.<|return|>``.

Parsed as vLLM's harmony parser reads it: ``analysis`` bodies are reasoning, ``final`` bodies and
``commentary`` bodies without a recipient are content (each joined with ``'\\n'``), a message to
``functions.NAME`` is a call whatever its channel (its body the JSON arguments). Text inside a body
is never parsed (call-like text inside ``analysis`` is reasoning). Where we differ: a message to a
recipient outside ``functions.`` is an ``unknown_tool`` call, a message with no channel is content,
and text between messages is content; vLLM drops them. A call that is not ``ok`` stays in the
content verbatim (docs/design.md#families).

Stops (:meth:`GptOssFamily.turn_end`): an answer stops at ``<|return|>``, a tool call at ``<|call|>``;
in history the template writes ``<|end|>`` where the answer sampled ``<|return|>`` (the recorder
keeps the sampled id and gives the next turn a context with ``<|end|>``, docs/design.md#stops), and
writes ``<|call|>`` itself after a call.

Source: OpenAI harmony response format; gpt-oss's chat template (TRL ships it as ``gptoss.jinja``);
vLLM's ``parser/harmony.py`` and the ``openai`` tool / ``openai_gptoss`` reasoning parsers.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass

from .base import (INVALID_JSON, MISSING_NAME, OK, TURN_KINDS, UNCLOSED_BLOCK, UNKNOWN_TOOL, Family, Reply, ToolCall,
                   TurnEnd)
from .stream import held_suffix

__all__ = ['GptOssFamily', 'GPT_OSS', 'Message', 'split_messages']

START, END, MESSAGE, CHANNEL, CONSTRAIN = '<|start|>', '<|end|>', '<|message|>', '<|channel|>', '<|constrain|>'
CALL, RETURN = '<|call|>', '<|return|>'
#: Every harmony mark a held-back tail could begin.
_MARKS = (START, END, MESSAGE, CHANNEL, CONSTRAIN, CALL, RETURN)
_CLOSE = re.compile(r'<\|end\|>|<\|call\|>|<\|return\|>')
_RECIPIENT = re.compile(r'(?:^|\s)to=([^\s<]*)')
_CHANNEL = re.compile(r'<\|channel\|>([^\s<]*)')


@dataclass(frozen=True)
class Message:
    """One harmony message of a reply.

    Attributes:
        role: the author (``'assistant'`` for the first message, whose role the prompt wrote).
        channel: ``'analysis'``, ``'commentary'``, ``'final'`` ..., or None when the header names none.
        recipient: the header's ``to=`` target (``'functions.read'``), or None.
        body: the text after ``<|message|>`` up to the close mark ('' when the header is not finished).
        start, end: the message's character span in the reply (from its ``<|start|>``, or from 0 for
            the first, to the end of its body, the close mark excluded).
        header_done: the text holds ``<|message|>``. closed: a close mark (or the next ``<|start|>``)
            follows the body in the text.
    """
    role: str
    channel: str | None
    recipient: str | None
    body: str
    start: int
    end: int
    header_done: bool
    closed: bool


def split_messages(text: str) -> tuple:
    """``(messages, stray)``: the harmony messages of a reply text and the text between them.

    Args:
        text: a reply as sampled after ``<|start|>assistant`` (its stop mark may be there or not).

    Returns:
        ``([Message], [(start, end)])``; ``stray`` are spans of non-blank text after a close mark and
        before the next ``<|start|>`` (a model that wrote outside any message).
    """
    out, stray, pos, first = [], [], 0, True
    while pos <= len(text):
        nxt = text.find(START, pos if first else pos + len(START))
        seg_end = len(text) if nxt < 0 else nxt
        head_at = pos if first else pos + len(START)
        k = text.find(MESSAGE, head_at, seg_end)
        if k < 0:
            header, body, body_at, done = text[head_at:seg_end], '', seg_end, False
        else:
            header, body_at, done = text[head_at:k], k + len(MESSAGE), True
            body = text[body_at:seg_end]
        role = 'assistant'
        if not first:
            role = re.split(r'\s|<\|', header, maxsplit=1)[0]
            header = header[len(role):]
        m = _CLOSE.search(body)
        closed = nxt >= 0
        end = seg_end
        if m is not None:
            closed, end, after = True, body_at + m.start(), body[m.end():]
            if after.strip():
                a = body_at + m.end()
                stray.append((a, seg_end))
            body = body[:m.start()]
        if first and not text[head_at:seg_end] and nxt < 0:
            break                                          # '' : no message yet
        rec = _RECIPIENT.search(header)
        ch = _CHANNEL.search(header)
        out.append(Message(role, ch.group(1) if ch else None, rec.group(1) if rec else None, body,
                           pos, end, done, closed))
        if nxt < 0:
            break
        pos, first = nxt, False
    return out, stray


def _call(msg: Message, text: str, tool_names, at_end: bool) -> ToolCall:
    """The :class:`ToolCall` of a message with a recipient (``at_end``: nothing closes it in the text)."""
    rec = msg.recipient
    name = rec[len('functions.'):] if rec.startswith('functions.') else rec
    span = (msg.start, msg.end)
    verbatim = text[msg.start:msg.end]
    if not name:
        return ToolCall(None, None, MISSING_NAME, verbatim, span)
    if not msg.header_done:
        return ToolCall(name, None, UNCLOSED_BLOCK, verbatim, span)
    try:
        args = json.loads(msg.body)
    except ValueError:
        return ToolCall(name, None, UNCLOSED_BLOCK if at_end else INVALID_JSON, verbatim, span)
    if not isinstance(args, dict):
        return ToolCall(name, None, INVALID_JSON, verbatim, span)
    if not rec.startswith('functions.') or (tool_names is not None and name not in tool_names):
        return ToolCall(name, args, UNKNOWN_TOOL, verbatim, span)
    return ToolCall(name, args, OK, verbatim, span)


class GptOssFamily(Family):
    """Harmony messages: ``analysis`` reasoning, ``final`` content, calls to ``functions.NAME`` ending at ``<|call|>``.

    Reasoning is a channel, not a leading block, so :attr:`think_open` is None (a prompt never opens
    reasoning) and :meth:`split_reasoning`, :meth:`parse_text`, :meth:`stable_parts` and
    :meth:`strict_calls` read messages (module docstring).
    """
    name = 'gpt-oss'
    markers = (CHANNEL, MESSAGE, CALL)
    call_open, call_close = ' to=functions.', CALL

    # ------------------------------------------------------------------ stops
    def _id(self, template, mark: str) -> int:
        ids = template.encode(mark)
        if len(ids) != 1:
            raise ValueError(f'{mark!r} encodes to {len(ids)} ids {ids} with this tokenizer; the gpt-oss family '
                             'needs the harmony control tokens as single (special) tokens')
        return ids[0]

    def turn_end(self, template, kind: str = 'answer') -> TurnEnd:
        """An answer stops at ``<|return|>`` (and the template's other stops but ``<|call|>``), written
        ``<|end|>`` in history; a tool call stops at ``<|call|>``, written ``<|call|>`` in history.

        Raises:
            ValueError: ``kind`` outside :data:`~agentrl.families.base.TURN_KINDS`; a harmony mark that is
                not one token.
        """
        if kind not in TURN_KINDS:
            raise ValueError(f'kind={kind!r}; use one of {TURN_KINDS}')
        call = self._id(template, CALL)
        if kind == 'tool_call':
            return TurnEnd(frozenset({call}), call)
        return TurnEnd(frozenset(template.stop_ids) - {call} | {self._id(template, RETURN)}, self._id(template, END))

    def stop_ids(self, template) -> frozenset:
        """The answer's and the tool call's stops (``frozenset[int]``)."""
        return self.turn_end(template, 'answer').stop_ids | self.turn_end(template, 'tool_call').stop_ids

    # ------------------------------------------------------------------ parsing
    def find_calls(self, body: str, offset: int = 0, tool_names=None) -> list:
        msgs, _ = split_messages(body)
        out = []
        for i, m in enumerate(msgs):
            if m.recipient is not None and m.role == 'assistant':
                c = _call(m, body, tool_names, not m.closed)
                out.append(ToolCall(c.name, c.arguments, c.status, c.text,
                                    (c.chars[0] + offset, c.chars[1] + offset)))
        return out

    def split_reasoning(self, text: str, think_open: bool | None = None) -> tuple:
        """``(reasoning or None, body)``: the ``analysis`` bodies joined with ``'\\n'`` (None when none is
        non-empty), and the text from the first message that is not plain analysis on (a suffix of ``text``).
        ``think_open`` is ignored (no prompt opens a harmony message)."""
        msgs, _ = split_messages(text)
        parts, at = [], len(text)
        for m in msgs:
            if m.channel == 'analysis' and m.recipient is None:
                if m.role == 'assistant' and m.body:
                    parts.append(m.body)
                continue
            at = m.start
            break
        return ('\n'.join(parts) or None), text[at:]

    def _parts(self, text: str, tools: bool, tool_names, settled: bool = False) -> tuple:
        """``(reasoning parts, content parts, calls)`` of the messages, in order.

        ``settled``: only what no continuation of ``text`` changes (closed messages, text between
        messages that a ``<|start|>`` follows).
        """
        msgs, stray = split_messages(text)
        if settled:
            msgs = [m for m in msgs if m.closed]
            stray = [(a, b) for a, b in stray if b < len(text)]
        reasoning, content, calls = [], [], []
        pieces = [(m.start, m) for m in msgs] + [(a, text[a:b]) for a, b in stray]
        for _, m in sorted(pieces, key=lambda p: p[0]):
            if isinstance(m, str):
                content.append(m)
            elif m.role != 'assistant':
                continue
            elif m.recipient is not None and tools:
                c = _call(m, text, tool_names, not m.closed)
                calls.append(c)
                if c.status != OK:
                    content.append(c.text)
            elif m.channel == 'analysis' and m.recipient is None:
                if m.body:
                    reasoning.append(m.body)
            elif m.recipient is not None:                    # tools off: a call stays content verbatim
                content.append(text[m.start:m.end])
            elif m.header_done and m.body:
                content.append(m.body)
        return reasoning, content, calls

    def parse_text(self, text: str, *, think_open: bool | None = None, tools: bool = True,
                   tool_names=None) -> Reply:
        """Parse a decoded reply (module docstring); a trailing ``<|call|>``/``<|return|>`` may be there or not.

        Returns:
            :class:`~agentrl.families.Reply`: reasoning the ``analysis`` bodies joined with ``'\\n'`` (None
            when there is none), content the ``final``/plain ``commentary`` bodies, stray text and the
            verbatim text of calls that are not ``ok``, joined with ``'\\n'``; calls with char spans (from
            the message's ``<|start|>``, or 0, to the end of its body). ``think_open`` is ignored.
        """
        reasoning, content, calls = self._parts(text, tools, tool_names)
        return Reply('\n'.join(content), '\n'.join(reasoning) or None, tuple(calls), text)

    def strict_calls(self, text: str) -> list | None:
        """The calls of a reply that must hold only well-formed calls: None when one is not ``ok``."""
        calls = self.find_calls(text)
        return None if any(c.status != OK for c in calls) else calls

    # ------------------------------------------------------------------ streaming
    def stable_parts(self, text: str, think_open: bool, tools: bool) -> tuple:
        """``(reasoning, content, ok calls)`` that no continuation of ``text`` changes.

        Closed messages are settled; of the open last one, an ``analysis`` or content body is given up
        to a tail that could begin a harmony mark, a call is held until it closes, a header until
        ``<|message|>``.
        """
        safe = text[:len(text) - held_suffix(text, *_MARKS)]
        msgs, _ = split_messages(safe)
        last = msgs[-1] if msgs else None
        reasoning, content, calls = self._parts(safe, tools, None, settled=True)
        if last is not None and not last.closed and last.header_done and last.role == 'assistant' \
                and last.recipient is None and last.body:
            (reasoning if last.channel == 'analysis' else content).append(last.body)
        return ('\n'.join(reasoning) or None), '\n'.join(content), [c for c in calls if c.status == OK]


#: The one gpt-oss family object the registry holds.
GPT_OSS = GptOssFamily()
