"""``BugFixEnv``: text in, text out; a turn-limited episode of repairing one function.

Source: book chapter 4; docs/design.md#gym.
"""
from __future__ import annotations

import re

from ..record import StopReason
from .calls import MESSAGES, parse_call
from .ops import EDIT_OPS
from .sandbox import run_tests
from .text import compact_source, format_results

__all__ = ['BugFixEnv', 'REWARD_TESTS', 'cap_words']

#: Allowed ``reward_tests`` values.
REWARD_TESTS = ('hidden', 'public')

_WORD = re.compile(r'\n|[^\s]+')


def cap_words(text: str, n: int) -> str:
    """Keep the first ``n`` tokens of ``text`` (a newline counts as one token, like ``<nl>``).

    Source: book chapter 4.8 (observation caps).

    Args:
        text: an observation.
        n: the number of tokens to keep (>= 0).

    Returns:
        ``text`` unchanged if it has at most ``n`` tokens, else its first ``n`` tokens with
        single spaces between words and the newlines kept.
    """
    tokens = _WORD.findall(text)
    if len(tokens) <= n:
        return text
    out = []
    for token in tokens[:n]:
        if token == '\n' or not out or out[-1] == '\n':
            out.append(token)
        else:
            out.append(' ' + token)
    return ''.join(out)


class _Verdicts:
    """Bounded memo of public-test verdicts by (source, function, tests), shared by every env.

    The sandbox is deterministic (no I/O, clock or randomness; a step budget, not time, bounds
    the work) except for its wall-clock limit, so verdicts that hit it are never stored. Every
    episode's ``final_info`` grades its source; a batch of episodes mostly grades the same few.
    """

    def __init__(self, size: int = 4096):
        self.size, self.memo = size, {}

    def get(self, key):
        return self.memo.get(key)

    def put(self, key, verdict: bool) -> None:
        if len(self.memo) >= self.size:
            self.memo.pop(next(iter(self.memo)))        # oldest first (dicts keep insertion order)
        self.memo[key] = verdict


_VERDICTS = _Verdicts()


class BugFixEnv:
    """The BugFix gym: read, edit, test and submit a buggy function within a turn budget.

    Each ``step`` takes the policy's call text and uses one turn, valid or not:

    * ``<call> read </call>`` -> the compact source;
    * ``<call> test </call>`` -> the public-test report (``format_results``);
    * ``<call> edit <op> </call>`` -> ``ok`` (source changed), ``no change`` (op does not
      apply) or ``error : unknown op`` (counted invalid);
    * ``<call> submit </call>`` -> ``submitted``; the episode ends with reward 1.0 if the
      current source passes the graded tests, else 0.0 (stop ``submitted``);
    * anything else -> ``error : malformed call`` (counted invalid).

    When a non-submit step reaches ``max_turns`` the episode ends with stop ``budget`` and
    reward 0 (the observation is the tool's normal answer). ``step`` never raises.

    Source: book chapter 4; docs/design.md#gym.

    Args:
        max_turns: turn budget per episode (positive int, default 6).
        reward_tests: ``'hidden'`` grades public plus hidden tests (default); ``'public'``
            grades only the public tests, the hackable variant.
        obs_cap: if set, cut each step observation to this many tokens (a newline counts as
            one); ``None`` (default) keeps observations whole. The issue is never cut.

    Attributes:
        done: whether the episode has ended (``True`` before the first ``reset``).
        task: the current :class:`Task` (``None`` before ``reset``).
        source: the current (possibly edited) source.
        turn: turns used so far; ``n_invalid``: malformed calls and unknown ops so far.

    Raises:
        ValueError: ``max_turns`` is not a positive int, ``reward_tests`` is not ``'hidden'``
            or ``'public'``, or ``obs_cap`` is not ``None`` or a positive int.
    """

    def __init__(self, max_turns: int = 6, reward_tests: str = 'hidden', obs_cap: int | None = None):
        if isinstance(max_turns, bool) or not isinstance(max_turns, int) or max_turns < 1:
            raise ValueError(f'BugFixEnv: max_turns must be a positive int, got {max_turns!r}')
        if reward_tests not in REWARD_TESTS:
            raise ValueError(f"BugFixEnv: reward_tests must be 'hidden' or 'public', got {reward_tests!r}")
        if obs_cap is not None and (isinstance(obs_cap, bool) or not isinstance(obs_cap, int) or obs_cap < 1):
            raise ValueError(f'BugFixEnv: obs_cap must be None or a positive int, got {obs_cap!r}')
        self.max_turns, self.reward_tests, self.obs_cap = max_turns, reward_tests, obs_cap
        self.task = None
        self.source = ''
        self.turn = 0
        self.n_invalid = 0
        self.done = True
        self._stop = None
        self._solved = False
        self._public = None          # (source, passes every public test), see _public_pass

    def reset(self, task) -> str:
        """Start an episode on ``task``.

        Args:
            task: a :class:`Task` (anything with ``issue``, ``source``, ``public_tests``,
                ``hidden_tests``, ``fn_name``).

        Returns:
            The issue text, e.g. ``'issue : clamp returns wrong results'``.
        """
        self.task = task
        self.source = task.source
        self.turn = 0
        self.n_invalid = 0
        self.done = False
        self._stop = None
        self._solved = False
        self._public = None
        return task.issue

    def _graded_tests(self):
        if self.reward_tests == 'public':
            return tuple(self.task.public_tests)
        return tuple(self.task.public_tests) + tuple(self.task.hidden_tests)

    def _passes(self, tests, results=None) -> bool:
        if results is None:
            results = run_tests(self.source, tests, self.task.fn_name)
        return len(results) == len(tests) and all(r.passed for r in results)

    def _public_pass(self) -> bool:
        """Whether the current source passes every public test (run once per source and task)."""
        if self._public is None or self._public[0] != self.source:
            tests = tuple(self.task.public_tests)
            key = (self.source, self.task.fn_name, repr(tests))
            verdict = _VERDICTS.get(key)
            if verdict is None:
                results = run_tests(self.source, tests, self.task.fn_name)
                verdict = self._passes(tests, results)
                if not any(r.error and 'time limit' in r.error for r in results):   # the only non-determinism
                    _VERDICTS.put(key, verdict)
            self._public = (self.source, verdict)
        return self._public[1]

    def _edit(self, op_name: str) -> str:
        op = EDIT_OPS.get(op_name)
        if op is None:
            self.n_invalid += 1
            return MESSAGES['unknown_op']
        try:
            new = op(self.source, self.task.public_tests)
        except Exception:  # noqa: BLE001 - ops never raise, but the env must not either
            new = self.source
        if not isinstance(new, str) or new == self.source:
            return MESSAGES['no_change']
        self.source = new
        return MESSAGES['ok']

    def _answer(self, text):
        """The observation for one call; may end the episode (submit)."""
        call = parse_call(text)
        if call is None:
            self.n_invalid += 1
            return MESSAGES['malformed'], 0.0
        tool, args = call
        if tool == 'read':
            return compact_source(self.source), 0.0
        if tool == 'test':
            tests = self.task.public_tests
            results = run_tests(self.source, tests, self.task.fn_name)
            self._public = (self.source, self._passes(tests, results))     # reused by final_info
            return format_results(results, tests), 0.0
        if tool == 'edit':
            return self._edit(args[0]), 0.0
        # submit
        self._solved = self._passes(self._graded_tests())
        self.done, self._stop = True, StopReason.SUBMITTED
        return MESSAGES['submitted'], 1.0 if self._solved else 0.0

    def step(self, text):
        """Apply one call.

        Args:
            text: the policy's action text. Any value is accepted; what is not a well-formed
                call (including non-strings) is answered ``error : malformed call``.

        Returns:
            ``(observation, reward, done, info)``. ``info`` is ``{}`` until the episode ends,
            then :meth:`final_info`. After the end (or before ``reset``) every step returns
            ``('error : no steps left', 0.0, True, final_info)`` and changes nothing.
            Never raises.
        """
        if self.done:
            return MESSAGES['done'], 0.0, True, self.final_info(self._solved)
        self.turn += 1
        try:
            obs, reward = self._answer(text)
        except Exception:  # noqa: BLE001 - defensive: every branch above already never raises
            self.n_invalid += 1
            obs, reward = MESSAGES['malformed'], 0.0
        if not self.done and self.turn >= self.max_turns:
            self.done, self._stop, self._solved, reward = True, StopReason.BUDGET, False, 0.0
        if self.obs_cap is not None:
            obs = cap_words(obs, self.obs_cap)
        return obs, reward, self.done, (self.final_info(self._solved) if self.done else {})

    def final_info(self, solved: bool) -> dict:
        """Episode summary.

        Source: book chapter 5 (the rollout calls ``final_info(False)`` and sets
        ``stop='truncated'`` when it cuts an episode) / docs/design.md#gym.

        Args:
            solved: whether the episode counts as solved (the caller's verdict).

        Returns:
            ``{'stop', 'n_turns', 'n_invalid', 'solved', 'public_pass', 'task'}``: stop is
            ``'submitted'``, ``'budget'`` or ``None`` (episode still running); ``public_pass``
            says whether the current source passes every public test; ``task`` is the task
            name (``None`` before ``reset``).
        """
        task = self.task
        public_pass = False
        if task is not None:
            try:
                public_pass = self._public_pass()
            except Exception:  # noqa: BLE001
                public_pass = False
        return {'stop': self._stop, 'n_turns': self.turn, 'n_invalid': self.n_invalid,
                'solved': bool(solved), 'public_pass': public_pass,
                'task': getattr(task, 'name', None) if task is not None else None}
