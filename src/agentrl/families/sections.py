"""L2: tool calls written as blocks inside one calls section (DeepSeek V3/V3.1, Kimi K2).

Such a format opens a section (``<｜tool▁calls▁begin｜>``, ``<|tool_calls_section_begin|>``), writes
each call between its own marks, and closes the section. A :class:`SectionFamily` sets the four
marks and reads one call's inner text (:meth:`SectionFamily.read_call`); the section is what the
shared parsing (:class:`~agentrl.families.base.Family`) sees as the block (``call_open`` and
``call_close`` are the section's marks), so an open section is held back while streaming.

Spans tile the section: the first call's span starts at the section's open mark, each next one at
the end of the one before (the separator between calls is in it), and the last one ends after the
section's close mark. So when every call is ``ok`` the whole section leaves the content; a
malformed call stays in it verbatim with the marks its span holds. docs/design.md#families.
"""
from __future__ import annotations

import json

from .base import INVALID_JSON, MISSING_NAME, OK, UNCLOSED_BLOCK, UNKNOWN_TOOL, Family, ToolCall

__all__ = ['SectionFamily', 'json_object']


def json_object(text: str) -> dict | None:
    """``text`` parsed as a JSON object, or None (not JSON, or not an object)."""
    try:
        obj = json.loads(text)
    except ValueError:
        return None
    return obj if isinstance(obj, dict) else None


class SectionFamily(Family):
    """Calls between ``item_open`` and ``item_close`` inside a section ``call_open`` ... ``call_close``.

    A subclass sets ``call_open``/``call_close`` (the section's marks), ``item_open``/``item_close``
    (one call's marks) and implements :meth:`read_call`. Statuses, beyond those of the call itself:
    a section never closed is one ``unclosed_block`` from its open mark to the end; a closed section
    with no call in it is one ``missing_name`` block; a call whose close mark is missing in a
    closed section, or text other than whitespace between calls, is ``invalid_json``.
    """
    item_open = ''
    item_close = ''

    def read_call(self, inner: str) -> tuple:
        """``(status, name, arguments, id)`` of one call's text between its marks (``status`` in
        ``ok``, ``invalid_json``, ``missing_name``; the tool names are checked by the caller)."""
        raise NotImplementedError

    def find_calls(self, body: str, offset: int = 0, tool_names=None) -> list:
        out, pos = [], 0
        while True:
            start = body.find(self.call_open, pos)
            if start < 0:
                return out
            close = body.find(self.call_close, start + len(self.call_open))
            if close < 0:
                out.append(ToolCall(None, None, UNCLOSED_BLOCK, body[start:], (offset + start, offset + len(body))))
                return out
            pos = close + len(self.call_close)
            out += self._section(body, start, close, offset, tool_names)

    def _section(self, body: str, start: int, close: int, offset: int, tool_names) -> list:
        """The calls of the closed section ``body[start:close + len(call_close)]``."""
        end = close + len(self.call_close)
        blocks, p = [], start + len(self.call_open)
        while (a := body.find(self.item_open, p, close)) >= 0:
            b = body.find(self.item_close, a, close)
            closed = b >= 0
            inner_end, p = (b, b + len(self.item_close)) if closed else (close, close)
            blocks.append((a, inner_end, p, closed))
        if not blocks:
            return [ToolCall(None, None, MISSING_NAME, body[start:end], (offset + start, offset + end))]
        out, at = [], start
        for k, (a, inner_end, b, closed) in enumerate(blocks):
            last = k == len(blocks) - 1
            stop = end if last else b
            status, name, args, cid = self.read_call(body[a + len(self.item_open):inner_end])
            stray = body[at + (len(self.call_open) if k == 0 else 0):a] + (body[b:close] if last else '')
            if not closed or stray.strip():
                status, args = INVALID_JSON, None
            elif status == OK and tool_names is not None and name not in tool_names:
                status = UNKNOWN_TOOL
            out.append(ToolCall(name, args, status, body[at:stop], (offset + at, offset + stop), id=cid))
            at = stop
        return out

    def strict_calls(self, text: str) -> list | None:
        """As :meth:`Family.strict_calls`: ``ok`` calls after the reasoning, None when any mark is left over."""
        got = self.ok_calls_and_rest(text)
        if got is None:
            return None
        calls, rest = got
        if any(m in rest for m in (self.call_open, self.call_close, self.item_open, self.item_close)):
            return None
        return calls
