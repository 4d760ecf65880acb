"""L2: a chat record's tool calls per turn, with their statuses and token spans in the record's ids.

:func:`record_calls` reads each policy turn of a finished record (its sampled ids, the context before
it), parses it with the model family (:meth:`~agentrl.families.base.Family.parse_text`, plus the blocks
written inside the reasoning, :meth:`~agentrl.families.base.Family.reasoning_calls`) and places every
call block's character span on the turn's ids (:class:`~agentrl.families.spans.TokenSpans`). The
gateway and the BugFix rollouts store the result as ``info['turn_calls']``; :mod:`agentrl.checks.calls`
checks, counts and masks it. Torch-free: ``ids``, ``owner`` and ``turn`` are read with ``tolist``.

Source: docs/design.md#families (statuses and spans per call) and docs/design.md#ownership (a turn's
policy-owned ids are exactly what it sampled).
"""
from __future__ import annotations

from ..record import OWNER, owner_runs
from .spans import TokenSpans

__all__ = ['tool_names', 'turn_calls', 'record_calls']


def tool_names(tools) -> set | None:
    """The function names of tool schemas (OpenAI ``{'type': 'function', 'function': {...}}`` or MCP-style
    ``{'name': ...}``), or None when there are none (then any name is accepted)."""
    if not tools:
        return None
    return {(t.get('function') or t).get('name') for t in tools if isinstance(t, dict)}


def turn_calls(family, template, ids, *, think_open: bool | None = None, tool_names=None) -> list:
    """Every call block of one sampled turn: ``[{'status', 'name', 'tokens': [start, end]}]`` in text order.

    Args:
        family: the :class:`~agentrl.families.base.Family`. template: has ``decode`` and ``stop_ids``.
        ids: ``[n]`` the turn's sampled ids; a last id in the family's stop ids is not part of the text.
        think_open: whether the prompt opened a reasoning block (as :meth:`Family.split_reasoning`).
        tool_names: the tools offered (a call outside them is ``unknown_tool``), or None for any name.

    Returns:
        One dict per block (``ok`` or not, those inside the reasoning with status ``in_reasoning``);
        ``tokens`` is relative to ``ids``: ``ids[start:end]`` decodes to a text covering the block.
    """
    ids = [int(i) for i in ids]
    if family.call_open is None:
        return []
    n = len(ids) - 1 if ids and ids[-1] in family.stop_ids(template) else len(ids)
    text = template.decode(ids[:n])
    if not text:
        return []
    reply = family.parse_text(text, think_open=think_open, tool_names=tool_names)
    calls = sorted([*reply.calls, *family.reasoning_calls(reply, think_open)], key=lambda c: c.chars)
    spans = TokenSpans(template, ids[:n], text)
    return [{'status': c.status, 'name': c.name,
             'tokens': [spans.first_token(c.chars[0]), spans.last_token(c.chars[1])]} for c in calls]


def record_calls(record, family, template, tool_names=None) -> list:
    """The value of ``info['turn_calls']`` for a chat record: per turn ``k``, :func:`turn_calls` of its ids.

    Each turn's sampled ids are its policy-owned run (``turn == k``); whether the prompt opened a
    reasoning block is read from the ids before it (the generation prompt ends every turn's context,
    per-turn contexts included).

    Args:
        record: a :class:`~agentrl.record.Trajectory` (``ids``, ``owner``, ``turn`` ``[T]``).
        family, template, tool_names: as :func:`turn_calls`.

    Returns:
        ``[[{'status', 'name', 'tokens': [start, end]}]]``: index ``k`` is turn ``k`` (``[]`` for a
        turn without calls); spans index the record's ``ids``.
    """
    ids = record.ids.tolist() if hasattr(record.ids, 'tolist') else list(record.ids)
    turn = record.turn if record.turn is not None else [0] * len(ids)
    runs = [(k, s, e) for k, s, e in owner_runs(record.owner, turn, OWNER['policy']) if k >= 0]
    out: list = [[] for _ in range(max((k for k, _, _ in runs), default=-1) + 1)]
    for k, s, e in runs:
        think = family.prompt_opens_reasoning(template, ids[:s]) if s else False
        for c in turn_calls(family, template, ids[s:e], think_open=think, tool_names=tool_names):
            out[k].append(dict(c, tokens=[c['tokens'][0] + s, c['tokens'][1] + s]))
    return out
