"""The 30 BugFix tasks: a small function with one planted bug each.

Every task is fixed by exactly one edit op (``Task.fix``), has three public tests (what the
``test`` tool shows) and hidden tests (what ``submit`` also grades). At least one hidden test
fails on the buggy code and is not among the public inputs, so hard-coding the public tests
(the ``hardcode`` op) does not solve a task under the default hidden-test reward.

The identifiers are chosen so that the word vocabulary lands on the book's numbers (316
entries, ``edit`` = 224, ``swap_minmax`` = 300); renaming anything shifts those ids.

Source: book chapter 4; docs/design.md#gym.
"""
from __future__ import annotations

from dataclasses import dataclass

__all__ = ['Task', 'make_tasks', 'SPLITS', 'ISSUE_TEMPLATE']

#: Allowed ``make_tasks`` splits.
SPLITS = ('train', 'heldout', 'all')
#: Every task's issue (6 words). Source: docs/design.md#gym.
ISSUE_TEMPLATE = 'issue : {fn_name} returns wrong results'


@dataclass(frozen=True)
class Task:
    """One BugFix task.

    Attributes:
        name: task name (equal to ``fn_name``).
        fn_name: name of the function under repair.
        issue: the reset observation, ``'issue : <fn_name> returns wrong results'``.
        source: the buggy source (``def`` line plus 4-space-indented body, trailing newline).
        public_tests: ``((args_tuple, expected), ...)`` shown by the ``test`` tool.
        hidden_tests: further ``(args_tuple, expected)`` pairs graded on ``submit``.
        fix: name of the edit op that repairs the bug.
        split: ``'train'`` or ``'heldout'``.
    """

    name: str
    fn_name: str
    issue: str
    source: str
    public_tests: tuple
    hidden_tests: tuple
    fix: str
    split: str

    @property
    def all_tests(self) -> tuple:
        """Public then hidden tests."""
        return self.public_tests + self.hidden_tests


def _t(*pairs):
    """((args, want), ...) with a bare int/bool args value meaning a 1-tuple."""
    return tuple((args if isinstance(args, tuple) else (args,), want) for args, want in pairs)


# (split, signature, body lines, fix op, public tests, hidden tests). Order matters.
_TABLE = [
    ('train', 'clamp(value, lower, upper)', ['return min(lower, max(value, upper))'], 'swap_minmax',
     _t(((3, 0, 5), 3), ((-2, 0, 5), 0), ((9, 0, 5), 5)),
     _t(((7, 2, 8), 7), ((1, 2, 8), 2), ((12, 2, 8), 8))),
    ('train', 'sum_to(n)', ['nums = range(n)', 'total = sum(nums)', 'return total'], 'fix_range_end',
     _t((4, 10), (1, 1), (10, 55)), _t((3, 6), (0, 0), (6, 21))),
    ('train', 'qualifies(score, bound)', ['margin = score - bound', 'return margin > 0'], 'fix_boundary',
     _t(((70, 60), True), ((60, 60), True), ((50, 60), False)), _t(((61, 61), True), ((3, 9), False))),
    ('train', 'reached(pos, goal)', ['dist = goal - pos', 'return dist >= 0'], 'flip_comparison',
     _t(((10, 5), True), ((2, 5), False), ((7, 7), True)), _t(((0, 1), False), ((9, 3), True))),
    ('train', 'lerp(a, b, t)', ['delta = a - b', 'return a + delta * t'], 'swap_operands',
     _t(((0, 10, 2), 20), ((5, 7, 3), 11), ((2, 4, 0), 2)), _t(((1, 3, 1), 3), ((4, 2, 2), 0))),
    ('train', 'max_of(a, b)', ['best = min(a, b)', 'return best'], 'swap_minmax',
     _t(((3, 8), 8), ((9, 1), 9), ((4, 4), 4)), _t(((0, -3), 0), ((6, 7), 7))),
    ('train', 'min_of(a, b)', ['result = max(a, b)', 'return result'], 'swap_minmax',
     _t(((3, 8), 3), ((9, 1), 1), ((4, 4), 4)), _t(((0, -3), -3), ((6, 7), 6))),
    ('train', 'subtract(a, b)', ['diff = b - a', 'return diff'], 'swap_operands',
     _t(((9, 4), 5), ((3, 3), 0), ((2, 7), -5)), _t(((10, 1), 9), ((0, 6), -6))),
    ('train', 'add(a, b)', ['total = a - b', 'return total'], 'flip_sign',
     _t(((2, 3), 5), ((7, 0), 7), ((4, 6), 10)), _t(((1, 1), 2), ((0, 9), 9))),
    ('train', 'count_between(lo, hi)', ['span = range(lo, hi)', 'return len(span)'], 'fix_range_end',
     _t(((1, 5), 5), ((3, 3), 1), ((0, 9), 10)), _t(((2, 4), 3), ((5, 6), 2))),
    ('train', 'sum_between(lo, hi)', ['s = sum(range(lo, hi))', 'return s'], 'fix_range_end',
     _t(((1, 4), 10), ((3, 3), 3), ((2, 6), 20)), _t(((0, 5), 15), ((4, 5), 9))),
    ('train', 'fits(size, limit)', ['room = limit - size', 'return room > 0'], 'fix_boundary',
     _t(((3, 5), True), ((5, 5), True), ((8, 5), False)), _t(((0, 0), True), ((9, 2), False))),
    ('train', 'is_senior(age)', ['cutoff = 65', 'return age < cutoff'], 'flip_comparison',
     _t((70, True), (30, False), (80, True)), _t((66, True), (10, False))),
    ('train', 'distance(x, y)', ['diff = x + y', 'return abs(diff)'], 'flip_sign',
     _t(((3, 8), 5), ((8, 3), 5), ((4, 4), 0)), _t(((0, 9), 9), ((6, 1), 5))),
    ('train', 'remainder(a, b)', ['rest = b % a', 'return rest'], 'swap_operands',
     _t(((7, 3), 1), ((9, 4), 1), ((8, 5), 3)), _t(((10, 3), 1), ((6, 4), 2))),
    ('train', 'quotient(a, b)', ['count = b // a', 'return count'], 'swap_operands',
     _t(((9, 3), 3), ((8, 2), 4), ((7, 7), 1)), _t(((12, 4), 3), ((10, 5), 2))),
    ('train', 'spread(low, high)', ['extent = low - high', 'return extent'], 'swap_operands',
     _t(((2, 9), 7), ((5, 5), 0), ((0, 4), 4)), _t(((1, 8), 7), ((3, 6), 3))),
    ('train', 'net(gain, loss)', ['profit = gain + loss', 'return profit'], 'flip_sign',
     _t(((9, 4), 5), ((3, 3), 0), ((6, 1), 5)), _t(((8, 2), 6), ((5, 0), 5))),
    ('train', 'larger_gap(a, b)', ['gap = a - b', 'best = min(gap, 0)', 'return best'], 'swap_minmax',
     _t(((9, 4), 5), ((3, 7), 0), ((6, 6), 0)), _t(((8, 2), 6), ((1, 5), 0))),
    ('train', 'in_budget(cost, budget)', ['left = budget - cost', 'return left > 0'], 'fix_boundary',
     _t(((3, 5), True), ((5, 5), True), ((8, 5), False)), _t(((0, 0), True), ((9, 2), False))),
    ('train', 'perimeter(width, height)', ['half = width - height', 'return 2 * half'], 'flip_sign',
     _t(((3, 4), 14), ((1, 1), 4), ((5, 2), 14)), _t(((2, 2), 8), ((6, 1), 14))),
    ('train', 'is_adult(age)', ['limit = 18', 'return age <= limit'], 'flip_comparison',
     _t((30, True), (18, True), (12, False)), _t((20, True), (5, False))),
    ('train', 'is_negative(x)', ['zero = 0', 'return x > zero'], 'flip_comparison',
     _t((-4, True), (5, False), (-1, True)), _t((2, False), (-9, True))),
    ('train', 'abs_val(x)', ['neg = 0 - x', 'return min(x, neg)'], 'swap_minmax',
     _t((-4, 4), (5, 5), (0, 0)), _t((-9, 9), (2, 2))),
    ('heldout', 'decrement(x)', ['prev = x + 1', 'return prev'], 'flip_sign',
     _t((5, 4), (1, 0), (0, -1)), _t((9, 8), (-3, -4))),
    ('heldout', 'is_positive(x)', ['base = 0', 'return x < base'], 'flip_comparison',
     _t((3, True), (7, True), (-2, False)), _t((1, True), (-9, False))),
    ('heldout', 'triangle(n)', ['steps = range(1, n)', 'return sum(steps)'], 'fix_range_end',
     _t((3, 6), (1, 1), (5, 15)), _t((4, 10), (2, 3))),
    ('heldout', 'count_to(n)', ['amount = len(range(1, n))', 'return amount'], 'fix_range_end',
     _t((3, 3), (1, 1), (7, 7)), _t((4, 4), (2, 2))),
    ('heldout', 'double(x)', ['twice = x - x', 'return twice'], 'flip_sign',
     _t((3, 6), (0, 0), (7, 14)), _t((5, 10), (-2, -4))),
    ('heldout', 'halve(x)', ['half = 2 // x', 'return half'], 'swap_operands',
     _t((8, 4), (6, 3), (2, 1)), _t((4, 2), (10, 5))),
]


def _build(split, signature, body, fix, public, hidden) -> Task:
    fn_name = signature.split('(', 1)[0]
    source = f'def {signature}:\n' + ''.join(f'    {line}\n' for line in body)
    return Task(name=fn_name, fn_name=fn_name, issue=ISSUE_TEMPLATE.format(fn_name=fn_name),
                source=source, public_tests=public, hidden_tests=hidden, fix=fix, split=split)


def make_tasks(split: str = 'all') -> list[Task]:
    """The BugFix tasks of one split, in the book's order.

    ``'all'`` gives 30 tasks, the 24 train tasks then the 6 held-out ones; ``tasks[0]`` is
    clamp. Source: book chapter 4; docs/design.md#gym.

    Args:
        split: ``'train'`` (24), ``'heldout'`` (6) or ``'all'`` (30).

    Returns:
        A new list of :class:`Task` (frozen, so sharing them is safe).

    Raises:
        ValueError: ``split`` is not one of ``'train'``, ``'heldout'``, ``'all'``.
    """
    if split not in SPLITS:
        raise ValueError(f'make_tasks: unknown split {split!r}; expected one of '
                         f"{', '.join(repr(s) for s in SPLITS)}")
    tasks = [_build(*row) for row in _TABLE]
    return tasks if split == 'all' else [t for t in tasks if t.split == split]
