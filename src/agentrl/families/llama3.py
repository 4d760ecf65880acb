"""L2: the Llama 3.1/3.2/3.3 family: a JSON tool call that is the whole reply, no reasoning.

A call is the reply itself: ``{"name": NAME, "parameters": {...}}`` (``"arguments"`` is read first
when present; a JSON-string value is decoded), optionally after ``<|python_tag|>``; more calls may
follow, each after whitespace and at most one ``;``. A reply that does not start (after whitespace
and the tag) with ``{`` is content, whatever JSON it holds later. Each call's span starts where the
text before it ends (the tag, or the separator from the previous call), so the content of a reply
of ``ok`` calls is ''. Statuses: ``unclosed_block`` (the reply ends inside the object),
``invalid_json``, ``missing_name``, ``unknown_tool``, as :func:`~agentrl.families.qwen3.json_call`
reads the object; a balanced object that is not a call (a JSON answer) stays content verbatim.

Stops: the template's (``<|eot_id|>``, its end of turn) and ``<|eom_id|>`` where the tokenizer has
it as one control token (Llama 3.1's tool turns in ``ipython`` mode end with it). Llama 3.0's
template renders no calls: its source never writes ``"parameters"``, so it is not picked (the
registry gives the generic family, and a caller that needs calls refuses it).

Source: TRL's ``llama3_1``/``llama3_2`` chat templates (Meta's); vLLM's ``llama3_json`` tool parser,
which also takes a JSON object after leading text (here that is content, as the template never
writes one) and drops the text after the calls (here it is content). docs/design.md#families.
"""
from __future__ import annotations

from .base import OK, UNCLOSED_BLOCK, Family, ToolCall
from .qwen3 import json_call

__all__ = ['Llama3Family', 'LLAMA3']

_TAG, _EOM = '<|python_tag|>', '<|eom_id|>'


def _object_end(text: str, start: int) -> int | None:
    """The end of the balanced JSON object that opens at ``text[start]``, or None (the text ends inside it)."""
    depth, quoted, escaped = 0, False, False
    for i in range(start, len(text)):
        c = text[i]
        if quoted:
            if escaped:
                escaped = False
            elif c == '\\':
                escaped = True
            elif c == '"':
                quoted = False
        elif c == '"':
            quoted = True
        elif c in '{[':
            depth += 1
        elif c in '}]':
            depth -= 1
            if depth == 0:
                return i + 1
    return None


def _skip_space(text: str, pos: int) -> int:
    while pos < len(text) and text[pos].isspace():
        pos += 1
    return pos


def _first_object(body: str) -> int | None:
    """Where the first call's ``{`` is (after whitespace and the tag), or None: the reply is content."""
    pos = _skip_space(body, 0)
    if body.startswith(_TAG, pos):
        pos = _skip_space(body, pos + len(_TAG))
    return pos if body.startswith('{', pos) else None


class Llama3Family(Family):
    """JSON calls that make up the reply (``parameters`` or ``arguments``), no reasoning, ``<|eom_id|>`` a stop."""
    name = 'llama3'
    markers = ('<|start_header_id|>', '"parameters"')

    @property
    def parses_tools(self) -> bool:
        return True

    def stop_ids(self, template) -> frozenset:
        """The template's stop ids and ``<|eom_id|>`` when the tokenizer has it as one control token."""
        ids = frozenset(template.stop_ids)
        eom = template.encode(_EOM)
        if len(eom) == 1 and eom[0] in getattr(template, 'control_ids', ()):
            ids |= {eom[0]}
        return ids

    def find_calls(self, body: str, offset: int = 0, tool_names=None) -> list:
        pos = _first_object(body)
        if pos is None:
            return []
        out, start = [], _skip_space(body, 0)
        while True:
            end = _object_end(body, pos)
            if end is None:
                out.append(ToolCall(None, None, UNCLOSED_BLOCK, body[start:], (offset + start, offset + len(body))))
                return out
            status, name, args = json_call(body[pos:end], tool_names, ('arguments', 'parameters'))
            out.append(ToolCall(name, args, status, body[start:end], (offset + start, offset + end)))
            nxt = _skip_space(body, end)
            if body.startswith(';', nxt):
                nxt = _skip_space(body, nxt + 1)
            if not body.startswith('{', nxt):
                return out
            start, pos = end, nxt

    def strict_calls(self, text: str) -> list | None:
        """The reply's calls when every one is ``ok`` and nothing but whitespace follows them, or None.

        A reply that starts with no call is ``[]`` (it calls nothing).
        """
        calls = self.find_calls(text)
        if any(c.status != OK for c in calls) or (calls and text[calls[-1].chars[1]:].strip()):
            return None
        return calls

    def stable_parts(self, text: str, think_open: bool, tools: bool) -> tuple:
        """As :meth:`Family.stable_parts`: undecided while the reply may still open a call; once it
        opens one, the closed calls and the text before the last one's end; otherwise all content."""
        if not tools:
            return None, text.lstrip('\n'), []
        head = text.lstrip()
        if not head or _TAG.startswith(head) or (head.startswith(_TAG) and not head[len(_TAG):].strip()):
            return None, '', []
        if _first_object(text) is None:
            return None, text.lstrip('\n'), []
        closed = [c for c in self.find_calls(text) if c.status != UNCLOSED_BLOCK]
        if not closed:
            return None, '', []
        reply = self.parse_text(text[:closed[-1].chars[1]], think_open=think_open)
        return None, reply.content.rstrip('\n'), list(reply.ok_calls)


#: The one Llama 3.x family object the registry holds.
LLAMA3 = Llama3Family()
