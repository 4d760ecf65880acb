"""L5: streaming a reply as its tokens are sampled, exactly equal to the non-streaming message.

:class:`ReplyStream` gets the turn's ids after each sampled token (the engine's ``on_token``) and
returns the OpenAI deltas that are already certain: the parts of ``reasoning_content``,
``content`` and ``tool_calls`` that every continuation of the text keeps as a prefix under
:func:`agentrl.gateway.parse.parse_reply` with ``think_open`` set. What may still change is held
back: a tail that could begin ``</think>``, ``<tool_call>`` or a stop string, an open
``<tool_call>`` block (a call is sent whole once its JSON closes), trailing newlines (stripped when
reasoning closes or a turn holds calls), and an incomplete UTF-8 character. :meth:`ReplyStream.finish`
sends the rest from the final parsed message, so the concatenated deltas equal that message byte
for byte; a stream that was not a prefix of it (none is known) is reported in ``mismatch``.

Source: docs/gateway.md#streaming; the OpenAI chat-completions chunk format.
"""
from __future__ import annotations

from .parse import _THINK_CLOSE, _THINK_OPEN, _TOOL_CALL, _calls, call_deltas, split_reasoning

__all__ = ['ReplyStream', 'think_open', 'stable_parts']

_CALL_OPEN = '<tool_call>'


def think_open(template, prompt_ids) -> bool:
    """Whether the prompt ends inside an open think block (the template wrote ``<think>``)."""
    tail = template.decode(list(prompt_ids[-4:])).rstrip('\n')
    return tail.endswith(_THINK_OPEN)


def _held(text: str, *marks) -> int:
    """The length of the longest suffix of ``text`` that is a proper prefix of one of ``marks``."""
    best = 0
    for m in marks:
        for k in range(min(len(m) - 1, len(text)), best, -1):
            if text.endswith(m[:k]):
                best = k
                break
    return best


def stable_parts(text: str, think: bool, tools: bool, id_seed: str) -> tuple:
    """``(reasoning, content, calls)`` of ``text`` that no continuation changes (prefixes of the final parse).

    ``reasoning``: None while no reasoning is known; ``calls``: the complete, well-formed tool calls.
    """
    if not think:
        head = text.lstrip()
        if not head.startswith(_THINK_OPEN) and _THINK_OPEN.startswith(head):
            return None, '', []                       # '' or '<thi': reasoning or not is still open
    reasoning, body = split_reasoning(text, think)
    if reasoning is not None and _THINK_CLOSE not in (text if think else text.lstrip()[len(_THINK_OPEN):]):
        inner = text if think else text.lstrip()[len(_THINK_OPEN):]
        inner = inner[:len(inner) - _held(inner, _THINK_CLOSE)]
        return inner.lstrip('\n').rstrip('\n'), '', []
    if not tools:
        return reasoning, body.lstrip('\n'), []
    pos, safe_end = 0, len(body)
    for m in _TOOL_CALL.finditer(body):
        pos = m.end()
    k = body.find(_CALL_OPEN, pos)
    if k >= 0:
        safe_end = k                                  # an open block: its JSON is not closed yet
    else:
        safe_end = len(body) - _held(body, _CALL_OPEN)
    calls, kept = _calls(body[:safe_end], id_seed)
    return reasoning, kept.lstrip('\n').rstrip('\n'), calls


class ReplyStream:
    """The deltas of one turn as its tokens arrive.

    Args:
        template: the call's :class:`~agentrl.templates.ChatTemplate` (decode, stop ids).
        think: the prompt opened a think block (:func:`think_open`).
        tools: tool calls are parsed (``tool_choice != 'none'``). id_seed: the tool-call ids' seed
            (``'{session}/{call}'``, as the non-streaming reply). stops: the request's stop strings.

    Attributes:
        sent: ``[reasoning, content, n calls]`` streamed so far. mismatch: True when :meth:`finish`
            found the stream was not a prefix of the final message (never expected).
    """

    def __init__(self, template, think: bool, tools: bool, id_seed: str, stops=()):
        self.template, self.think, self.tools, self.id_seed = template, think, tools, id_seed
        self.stops = [s for s in stops or () if s]
        self.sent = ['', '', 0]
        self.reasoning_started = False
        self.frozen = False
        self.mismatch = False

    def _text(self, ids) -> str:
        ids = list(ids)
        if ids and ids[-1] in self.template.stop_ids:
            ids = ids[:-1]
        text = self.template.decode(ids)
        hits = [text.find(s) for s in self.stops if s in text]
        if hits:
            self.frozen = True
            return text[:min(hits)]
        text = text.rstrip('\ufffd')                  # an incomplete UTF-8 character
        return text[:len(text) - _held(text, *self.stops)] if self.stops else text

    def feed(self, ids) -> list:
        """The new deltas after a token: ``ids`` is the turn so far (``[k]`` ints)."""
        if self.frozen:
            return []
        reasoning, content, calls = stable_parts(self._text(ids), self.think, self.tools, self.id_seed)
        return self._emit(reasoning, content, calls)

    def _emit(self, reasoning, content, calls) -> list:
        out = []
        if reasoning is not None and len(reasoning) > len(self.sent[0]) and reasoning.startswith(self.sent[0]):
            out.append({'reasoning_content': reasoning[len(self.sent[0]):]})
            self.sent[0] = reasoning
        if len(content) > len(self.sent[1]) and content.startswith(self.sent[1]):
            out.append({'content': content[len(self.sent[1]):]})
            self.sent[1] = content
        for k in range(self.sent[2], len(calls)):
            out += call_deltas(k, calls[k])
        self.sent[2] = max(self.sent[2], len(calls))
        return out

    def finish(self, message: dict) -> list:
        """The deltas that complete the stream to ``message`` (the turn's final parsed reply)."""
        reasoning = message.get('reasoning_content') or ''
        content = message.get('content') or ''
        calls = message.get('tool_calls') or []
        if not (reasoning.startswith(self.sent[0]) and content.startswith(self.sent[1])
                and len(calls) >= self.sent[2]):
            self.mismatch = True
        return self._emit(reasoning if reasoning else None, content, calls)
