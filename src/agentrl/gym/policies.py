"""Scripted text policies for the BugFix gym: oracle, blind, random, hacker.

A policy is a callable ``policy(observations) -> action_text``; ``observations`` is the list
of observations so far, starting with the issue, so the turn is ``len(observations)``.

Source: book chapter 4; docs/design.md#gym.
"""
from __future__ import annotations

import random

from .calls import ALL_CALLS
from .ops import EDIT_OPS
from .tasks import make_tasks

__all__ = ['scripted_policy', 'POLICY_KINDS']

#: The policy kinds ``scripted_policy`` builds.
POLICY_KINDS = ('oracle', 'blind', 'random', 'hacker')

_READ, _TEST, _SUBMIT = '<call> read </call>', '<call> test </call>', '<call> submit </call>'


def _edit(op: str) -> str:
    return f'<call> edit {op} </call>'


def _turn(observations) -> int:
    return max(len(observations), 1)


class _Oracle:
    """read, edit <the task's fix>, test, submit."""
    kind = 'oracle'

    def __init__(self, tasks):
        self.fixes = {t.fn_name: t.fix for t in tasks}

    def __call__(self, observations):
        turn = _turn(observations)
        if turn == 1:
            return _READ
        if turn == 2:
            words = str(observations[0]).split() if observations else []
            fn_name = words[2] if len(words) > 2 else None
            if fn_name not in self.fixes:
                raise ValueError(f'oracle policy: no known task for issue {observations[0]!r}; '
                                 'pass the task list with scripted_policy("oracle", tasks=...)')
            return _edit(self.fixes[fn_name])
        return _TEST if turn == 3 else _SUBMIT


class _Blind:
    """One random edit (drawn at turn 1), then submit."""
    kind = 'blind'

    def __init__(self, rng):
        self.rng = rng

    def __call__(self, observations):
        if _turn(observations) == 1:
            return _edit(self.rng.choice(sorted(EDIT_OPS)))
        return _SUBMIT


class _Random:
    """A uniformly random well-formed call every turn."""
    kind = 'random'

    def __init__(self, rng):
        self.rng = rng

    def __call__(self, observations):
        return self.rng.choice(ALL_CALLS)


class _Hacker:
    """read, edit hardcode, submit: passes the public tests without fixing the bug."""
    kind = 'hacker'

    def __call__(self, observations):
        turn = _turn(observations)
        if turn == 1:
            return _READ
        return _edit('hardcode') if turn == 2 else _SUBMIT


def scripted_policy(kind: str, seed: int = 0, tasks=None):
    """Build a scripted policy.

    * ``oracle``: read, edit with the task's fix op (task looked up by the function name, the
      third word of the issue), test, submit; reward 1.0 on every task.
    * ``blind``: ``edit <op>`` with ``op = rng.choice(sorted(EDIT_OPS))`` at turn 1, then
      submit; never reads or tests.
    * ``random``: ``rng.choice(ALL_CALLS)`` every turn.
    * ``hacker``: read, ``edit hardcode``, submit; passes the public tests only (reward 0.0
      with hidden tests, 1.0 with ``reward_tests='public'``).

    One ``random.Random(seed)`` belongs to the policy object and is shared across all the
    episodes it plays, so the draw order (one per blind episode, one per random turn) fixes
    the results. Source: book chapter 4; docs/design.md#gym.

    Args:
        kind: ``'oracle'``, ``'blind'``, ``'random'`` or ``'hacker'``.
        seed: seed of the policy's random generator (used by blind and random).
        tasks: tasks the oracle may meet (default ``make_tasks('all')``).

    Returns:
        ``policy(observations) -> str``, the next call text; ``policy.kind`` is ``kind`` (the
        rollout records it in provenance).

    Raises:
        ValueError: unknown ``kind``; when called, the oracle raises ValueError for an issue
            whose function it does not know.
    """
    if kind == 'oracle':
        return _Oracle(make_tasks('all') if tasks is None else tasks)
    if kind == 'blind':
        return _Blind(random.Random(seed))
    if kind == 'random':
        return _Random(random.Random(seed))
    if kind == 'hacker':
        return _Hacker()
    raise ValueError(f'scripted_policy: unknown kind {kind!r}; expected one of '
                     f"{', '.join(repr(k) for k in POLICY_KINDS)}")
