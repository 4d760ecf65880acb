"""L2: the Qwen3 family: Hermes ``<tool_call>`` JSON blocks and ``<think>`` reasoning.

Also Qwen2.5 and any template that writes Hermes blocks (the tiny test tokenizer's does). The
template tells the rest: ``<|im_end|>`` ends every turn kind, ``eos_token`` and any extra stop
tokens stop it.

Source: Qwen3's chat template (``<think>\\n...\\n</think>\\n\\n`` and ``<tool_call>\\n{"name": ...,
"arguments": ...}\\n</tool_call>``); vLLM's ``hermes`` tool parser.
"""
from __future__ import annotations

import json
import re

from ..constraints import tool_call_constraint
from .base import INVALID_JSON, MISSING_NAME, OK, UNKNOWN_TOOL, Family

__all__ = ['Qwen3Family', 'QWEN3', 'json_call']

_BLOCK = re.compile(r'<tool_call>(.*?)</tool_call>', re.S)


def json_call(inner: str, tool_names, keys: tuple = ('arguments',)) -> tuple:
    """``(status, name, arguments)`` of a call written as a JSON object ``{"name": ..., KEY: {...}}``.

    Args:
        inner: the object's text. tool_names: the request's tool names, or None (any name).
        keys: where the arguments may be, the first present is read (absent: ``{}``); a JSON
            string there is decoded.

    Returns:
        A status of :data:`~agentrl.families.base.CALL_STATUSES`, the name (None without a string
        one) and the arguments (None unless they are an object).
    """
    try:
        obj = json.loads(inner)
    except ValueError:
        return INVALID_JSON, None, None
    if not isinstance(obj, dict):
        return INVALID_JSON, None, None
    name = obj.get('name')
    if not isinstance(name, str):
        return MISSING_NAME, None, None
    args = next((obj[k] for k in keys if k in obj), {})
    if isinstance(args, str):
        try:
            args = json.loads(args)
        except ValueError:
            return INVALID_JSON, name, None
    if not isinstance(args, dict):
        return INVALID_JSON, name, None
    if tool_names is not None and name not in tool_names:
        return UNKNOWN_TOOL, name, args
    return OK, name, args


class Qwen3Family(Family):
    """Hermes tool calls (a JSON-string ``arguments`` is decoded) and ``<think>`` reasoning."""
    name = 'qwen3'
    markers = ('<tool_call>',)
    think_open, think_close = '<think>', '</think>'
    call_open, call_close = '<tool_call>', '</tool_call>'

    def call_grammar(self, tools, choice: str, stop_ids=()):
        """Hermes blocks ``<tool_call>\\n{"name": N, "arguments": {...}}\\n</tool_call>`` of the allowed tools
        (:func:`agentrl.constraints.tool_call_constraint`, the structural tag vLLM builds for ``hermes``)."""
        return tool_call_constraint(tools, choice, stop_ids)

    def find_calls(self, body: str, offset: int = 0, tool_names=None) -> list:
        return self.block_calls(body, offset, _BLOCK, lambda inside: json_call(inside, tool_names))


#: The one Qwen3 family object the registry holds.
QWEN3 = Qwen3Family()
