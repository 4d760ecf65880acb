"""L5: streaming a reply as its tokens are sampled, exactly equal to the non-streaming message.

:class:`ReplyStream` gets the turn's ids after each sampled token (the engine's ``on_token``) and
returns the OpenAI deltas that are already certain: the parts of ``reasoning_content``,
``content`` and ``tool_calls`` that every continuation of the text keeps as a prefix under
:func:`agentrl.gateway.parse.parse_reply` with ``think_open`` set. What may still change is held
back: what the model family holds back (:meth:`agentrl.families.Family.stable_parts`: a tail that
could begin a mark, an open call block, trailing newlines), a tail that could begin a stop string,
and an incomplete UTF-8 character. :meth:`ReplyStream.finish`
sends the rest from the final parsed message, so the concatenated deltas equal that message byte
for byte; a stream that was not a prefix of it (none is known) is reported in ``mismatch``.

Source: docs/gateway.md#streaming; the OpenAI chat-completions chunk format.
"""
from __future__ import annotations

from ..families.stream import held_suffix
from .parse import call_deltas, wire_calls

__all__ = ['ReplyStream']


class ReplyStream:
    """The deltas of one turn as its tokens arrive.

    Args:
        template: the call's :class:`~agentrl.templates.ChatTemplate` (decode, stop ids).
        family: the model family (:func:`agentrl.families.family_for`).
        think: the prompt opened a reasoning block (:meth:`~agentrl.families.Family.prompt_opens_reasoning`).
        tools: tool calls are parsed (``tool_choice != 'none'``). id_seed: the tool-call ids' seed
            (``'{session}/{call}'``, as the non-streaming reply). stops: the request's stop strings.

    Attributes:
        sent: ``[reasoning, content, n calls]`` streamed so far. mismatch: True when :meth:`finish`
            found the stream was not a prefix of the final message (never expected).
    """

    def __init__(self, template, family, think: bool, tools: bool, id_seed: str, stops=()):
        self.template, self.family, self.think, self.tools, self.id_seed = template, family, think, tools, id_seed
        self.stops = [s for s in stops or () if s]
        self.stop_ids = family.stop_ids(template)
        self.sent = ['', '', 0]
        self.reasoning_started = False
        self.frozen = False
        self.mismatch = False

    def _text(self, ids) -> str:
        ids = list(ids)
        if ids and ids[-1] in self.stop_ids:
            ids = ids[:-1]
        text = self.template.decode(ids)
        hits = [text.find(s) for s in self.stops if s in text]
        if hits:
            self.frozen = True
            return text[:min(hits)]
        text = text.rstrip('\ufffd')                  # an incomplete UTF-8 character
        return text[:len(text) - held_suffix(text, *self.stops)] if self.stops else text

    def feed(self, ids) -> list:
        """The new deltas after a token: ``ids`` is the turn so far (``[k]`` ints)."""
        if self.frozen:
            return []
        reasoning, content, calls = self.family.stable_parts(self._text(ids), self.think, self.tools)
        return self._emit(reasoning, content, wire_calls(calls, self.id_seed))

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
