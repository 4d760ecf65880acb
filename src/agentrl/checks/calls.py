"""L3: the tool-call statuses a chat record carries per turn: the span rule, the counts, the loss mask.

A record built through a model family (the gateway, the BugFix rollouts) stores in
``info['turn_calls']`` one list per policy turn ``k`` (index ``k`` is the ``turn`` value), each call
``{'status': one of CALL_STATUSES, 'name': str | None, 'tokens': [start, end]}`` with ``[start, end)``
an index range into the record's ``ids`` over that turn's sampled tokens
(:func:`agentrl.families.record_calls.record_calls`). Records written before the field existed carry
none: every function here treats them as holding no statuses.

- :func:`call_spans_valid`: the acceptance rule (a stored span outside the ids, over tokens the policy
  did not sample, or over another turn is refused, :class:`~agentrl.checks.errors.CallSpanError`).
- :func:`call_counts` / :func:`calls_line` / :func:`records_calls_line`: what ``agentrl check`` and
  ``agentrl report`` print.
- :func:`malformed_call_rows` / :func:`mask_malformed_calls`: ``agentrl export --mask-malformed-calls``.

Source: docs/design.md#families (a malformed block keeps its span so a trainer can mask it) and
docs/design.md#shift (row ``j`` of ``action_mask`` is about ``ids[j+1]``).
"""
from __future__ import annotations

from collections import Counter

from .._lazy import lazy_module

torch = lazy_module('torch')

from ..families.base import CALL_STATUSES, IN_REASONING, OK
from ..record import OWNER, OWNER_NAMES
from .errors import CallSpanError

__all__ = ['INFO_KEY', 'stored_calls', 'call_spans_valid', 'call_counts', 'calls_line', 'records_calls_line',
           'malformed_call_rows', 'mask_malformed_calls']

#: The ``info`` key holding the per-turn call statuses.
INFO_KEY = 'turn_calls'
_FIX = ('store what agentrl.families.record_calls gives for the record as written (spans index the ids of '
        'the turn the policy sampled), or drop info.turn_calls')


def stored_calls(record) -> list | None:
    """The record's ``info['turn_calls']`` as stored, or None when it has none (an older record)."""
    info = getattr(record, 'info', None)
    return info.get(INFO_KEY) if isinstance(info, dict) else None


def _span(c) -> tuple | None:
    """``(start, end)`` ints of one stored call's ``tokens``, or None when it is not two ints."""
    tokens = c.get('tokens') if isinstance(c, dict) else None
    if (not isinstance(tokens, (list, tuple)) or len(tokens) != 2
            or not all(isinstance(x, int) and not isinstance(x, bool) for x in tokens)):
        return None
    return tokens[0], tokens[1]


def _faults(calls, owner: list, turn: list) -> list:
    """``[(field, what)]``: every stored call entry that is malformed or whose span is not its turn's sampled ids."""
    if not isinstance(calls, list):
        return [(f'info.{INFO_KEY}', f'is {type(calls).__name__}, not a list with one list of calls per turn')]
    out, T, pol = [], len(owner), OWNER['policy']
    for k, per in enumerate(calls):
        if not isinstance(per, list):
            out.append((f'info.{INFO_KEY}[{k}]', f'is {type(per).__name__}, not the list of turn {k}\'s calls'))
            continue
        for i, c in enumerate(per):
            where = f'info.{INFO_KEY}[{k}][{i}]'
            if not isinstance(c, dict) or c.get('status') not in CALL_STATUSES:
                shown = c.get('status') if isinstance(c, dict) else c
                out.append((f'{where}.status', f'is {shown!r}, not one of {", ".join(CALL_STATUSES)}'))
                continue
            span = _span(c)
            if span is None:
                out.append((f'{where}.tokens', f'is {c.get("tokens")!r}, not [start, end] token positions'))
                continue
            a, b = span
            if not 0 <= a < b <= T:
                out.append((f'{where}.tokens', f'is [{a}, {b}], not a non-empty span of the record\'s ids [0, {T})'))
                continue
            bad = next((j for j in range(a, b) if owner[j] != pol), None)
            if bad is not None:
                o = owner[bad]
                who = OWNER_NAMES[o] if 0 <= o < len(OWNER_NAMES) else o
                out.append((f'{where}.tokens', f'is [{a}, {b}], but ids[{bad}] is owned by {who}, not sampled by '
                                               'the policy'))
                continue
            other = next((j for j in range(a, b) if turn[j] != k), None)
            if other is not None:
                out.append((f'{where}.tokens', f'is [{a}, {b}], but ids[{other}] belongs to turn {turn[other]}, '
                                               f'not turn {k}'))
    return out


def call_spans_valid(r) -> list:
    """Acceptance rule: every stored call status is known and its span covers only its turn's sampled ids.

    Args:
        r: the validator's :class:`~agentrl.checks.acceptance.Facts` (``record``, ``owner [T]``).

    Returns:
        ``[CallSpanError]`` naming the first faulty entry's field (``info.turn_calls[k][i].tokens``) with
        the count, or ``[]`` (also for a record without ``info['turn_calls']``).
    """
    calls = stored_calls(r.record)
    if calls is None:
        return []
    owner = r.owner.tolist()
    turn = r.record.turn
    turn = turn.tolist() if hasattr(turn, 'tolist') else list(turn) if turn is not None else [0] * len(owner)
    faults = _faults(calls, owner, turn)
    if not faults:
        return []
    field, what = faults[0]
    return [CallSpanError(what, field=field, fix=_FIX, count=len(faults))]


def call_counts(record) -> Counter:
    """``Counter`` of the statuses of the record's stored calls (empty for a record without them)."""
    calls = stored_calls(record)
    out: Counter = Counter()
    if isinstance(calls, list):
        for per in calls:
            if isinstance(per, list):
                out.update(c['status'] for c in per if isinstance(c, dict) and c.get('status') in CALL_STATUSES)
    return out


def calls_line(counts: Counter) -> str:
    """The counts in words, in :data:`~agentrl.families.base.CALL_STATUSES` order, ``ok`` always named.

    Example:
        >>> calls_line(Counter(ok=41, invalid_json=2, unclosed_block=1, in_reasoning=1))
        '41 ok, 2 invalid_json, 1 unclosed_block, 1 call inside the reasoning'
    """
    parts = [f'{counts.get(OK, 0)} ok']
    for s in CALL_STATUSES:
        n = counts.get(s, 0)
        if s == OK or not n:
            continue
        parts.append(f'{n} call{"s" if n != 1 else ""} inside the reasoning' if s == IN_REASONING else f'{n} {s}')
    return ', '.join(parts)


def records_calls_line(records) -> str:
    """:func:`calls_line` over ``records`` plus how many store statuses, or '' when none does (older records).

    Example:
        ``'41 ok, 2 invalid_json, 1 unclosed_block, 1 call inside the reasoning (in 8 records)'``
    """
    total: Counter = Counter()
    n = 0
    for r in records:
        if stored_calls(r) is not None:
            n += 1
            total.update(call_counts(r))
    return f'{calls_line(total)} (in {n} record{"s" if n != 1 else ""})' if n else ''


def malformed_call_rows(record) -> torch.Tensor:
    """``[T-1]`` bool: the ``action_mask`` rows of the tokens of every stored call whose status is not ``ok``.

    A call over ``ids[a:b]`` is rows ``a-1 .. b-2`` (docs/design.md#shift). All False for a record
    without stored calls.

    Raises:
        CallSpanError: a stored entry that :func:`call_spans_valid` refuses (names the field).
    """
    T = len(record.ids)
    rows = torch.zeros(max(T - 1, 0), dtype=torch.bool)
    calls = stored_calls(record)
    if calls is None:
        return rows
    owner = torch.as_tensor(record.owner).tolist()
    turn = record.turn.tolist() if hasattr(record.turn, 'tolist') else list(record.turn or [0] * T)
    faults = _faults(calls, owner, turn)
    if faults:
        raise CallSpanError(faults[0][1], field=faults[0][0], fix=_FIX, count=len(faults))
    for per in calls:
        for c in per:
            if c['status'] != OK:
                a, b = c['tokens']
                rows[a - 1:b - 1] = True
    return rows


def mask_malformed_calls(record):
    """A copy of ``record`` whose ``action_mask`` is 0 over every non-``ok`` call (``--mask-malformed-calls``).

    The record itself when it has none (its stored fields are never changed).

    Returns:
        ``(record, tokens masked)``: ``tokens masked`` counts the rows set to 0 that were 1.
    """
    from dataclasses import replace
    rows = malformed_call_rows(record)
    mask = torch.as_tensor(record.action_mask)
    hit = rows & (mask > 0)
    if not bool(hit.any()):
        return record, 0
    return replace(record, action_mask=mask.masked_fill(rows, 0)), int(hit.sum())
