"""L2: the Kimi K2 family: calls with their own ids in a calls section, ``<think>`` reasoning.

A call is ``<|tool_call_begin|>functions.NAME:IDX<|tool_call_argument_begin|>{...}<|tool_call_end|>``
inside ``<|tool_calls_section_begin|>`` ... ``<|tool_calls_section_end|>``
(:mod:`~agentrl.families.sections`). ``functions.NAME:IDX`` is the call's id: the template renders it
back in the assistant turn and in the tool result (``## Return of functions.NAME:IDX``), so it is kept
as :attr:`~agentrl.families.ToolCall.id` and the gateway returns it as the call's ``id``
(:func:`agentrl.gateway.parse.wire_calls`). Reasoning is ``<think>...</think>``; ``<|im_end|>`` ends
every turn kind (the template tells).

Source: Kimi K2's chat template (moonshotai/Kimi-K2-Instruct, Kimi-K2-Thinking); vLLM's ``kimi_k2``
tool and reasoning parsers.
"""
from __future__ import annotations

import re

from .base import INVALID_JSON, MISSING_NAME, OK
from .sections import SectionFamily, json_object

__all__ = ['KimiK2Family', 'KIMI_K2']

ARGS = '<|tool_call_argument_begin|>'
_ID = re.compile(r'(?:functions\.)?([^:\s]+):\d+')


class KimiK2Family(SectionFamily):
    """Kimi K2: ``functions.NAME:IDX<|tool_call_argument_begin|>ARGS`` per call; the id is kept."""
    name = 'kimi-k2'
    markers = ('<|tool_calls_section_begin|>', ARGS)
    think_open, think_close = '<think>', '</think>'
    call_open, call_close = '<|tool_calls_section_begin|>', '<|tool_calls_section_end|>'
    item_open, item_close = '<|tool_call_begin|>', '<|tool_call_end|>'

    def read_call(self, inner: str) -> tuple:
        head, sep, raw = inner.partition(ARGS)
        m = _ID.fullmatch(head.strip())
        if m is None:
            return MISSING_NAME, None, None, None
        cid, name = m.group(0), m.group(1)
        args = json_object(raw) if sep else None
        return (OK, name, args, cid) if args is not None else (INVALID_JSON, name, None, cid)


#: The registry's Kimi K2 family object.
KIMI_K2 = KimiK2Family()
