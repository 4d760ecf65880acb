"""L2: the generic family: what the chat template tells, and no tool-call parsing.

Stops and the end of turn come from the template (:meth:`~agentrl.families.base.Family.turn_end`);
reasoning is split at ``<think>``/``</think>`` when the template's source writes them; tool calls
are never parsed (the reply is content), so a caller that needs calls refuses it
(:func:`agentrl.families.registry.family_for` with ``require_tools``).
"""
from __future__ import annotations

from .base import Family

__all__ = ['GenericFamily', 'GENERIC', 'generic_for']


class GenericFamily(Family):
    """No call format; reasoning marks only when given (see :func:`generic_for`)."""
    name = 'generic'

    def __init__(self, think: tuple | None = None):
        self.think_open, self.think_close = think if think is not None else (None, None)


#: The generic family of a template that writes no reasoning marks.
GENERIC = GenericFamily()
_THINKING = GenericFamily(('<think>', '</think>'))


def generic_for(source: str) -> GenericFamily:
    """The generic family for a template source: with ``<think>`` reasoning when the source writes ``</think>``."""
    return _THINKING if '</think>' in (source or '') else GENERIC
