"""L2: a reply parsed as it arrives: what no continuation can change, and the rest at its end.

The family decides what is settled (:meth:`agentrl.families.Family.stable_parts`); this module
turns that into deltas whose concatenation is the whole-reply parse.
"""
from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ['StreamParser', 'held_suffix']


def held_suffix(text: str, *marks: str) -> int:
    """The length of the longest suffix of ``text`` that is a proper prefix of one of ``marks``."""
    best = 0
    for m in marks:
        for k in range(min(len(m) - 1, len(text)), best, -1):
            if text.endswith(m[:k]):
                best = k
                break
    return best


@dataclass
class StreamParser:
    """Parse a reply as it arrives: :meth:`feed` text pieces, get what is certain; :meth:`finish` the rest.

    The pieces :meth:`feed` and :meth:`finish` return concatenate to the family's ``parse_text`` of the
    whole text (the same ``think_open`` and ``tools``), whatever the split.

    Attributes:
        family: the :class:`~agentrl.families.Family`. think_open, tools: as its ``stable_parts``.
        text: the reply so far.
        sent: ``[reasoning, content, n ok calls]`` given out so far.
    """
    family: object
    think_open: bool
    tools: bool = True
    text: str = ''
    sent: list = field(default_factory=lambda: ['', '', 0])

    def feed(self, piece: str) -> tuple:
        """``(reasoning delta, content delta, new ok calls)`` after ``piece``."""
        self.text += piece
        return self._emit(*self.family.stable_parts(self.text, self.think_open, self.tools))

    def finish(self) -> tuple:
        """The last ``(reasoning delta, content delta, new ok calls)`` and the whole parsed reply.

        Returns:
            ``((reasoning delta, content delta, new calls), Reply)`` (:class:`~agentrl.families.Reply`).
        """
        reply = self.family.parse_text(self.text, think_open=self.think_open, tools=self.tools)
        return self._emit(reply.reasoning, reply.content, list(reply.ok_calls)), reply

    def _emit(self, reasoning, content, calls) -> tuple:
        r = c = ''
        if reasoning is not None and reasoning.startswith(self.sent[0]):
            r, self.sent[0] = reasoning[len(self.sent[0]):], reasoning
        if content.startswith(self.sent[1]):
            c, self.sent[1] = content[len(self.sent[1]):], content
        new = list(calls[self.sent[2]:])
        self.sent[2] = max(self.sent[2], len(calls))
        return r, c, new
