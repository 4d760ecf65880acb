"""The seven edit ops of the BugFix gym.

Each op is ``op(source, public_tests) -> new_source`` and rewrites only the body (the lines
after the ``def`` line). An op "does not apply" when it returns the source unchanged; the env
then answers ``no change``. Ops are plain text rewrites: they never raise, and on a source
they cannot handle (no ``def`` line, unbalanced brackets, not a string) they return it as is.

Source: book chapter 4; docs/design.md#gym.
"""
from __future__ import annotations

import functools
import re

__all__ = ['EDIT_OPS', 'fix_boundary', 'fix_range_end', 'flip_comparison', 'flip_sign',
           'hardcode', 'swap_minmax', 'swap_operands']

_DEF_LINE = re.compile(r'^(?P<indent>[ \t]*)def\s+\w+\s*\((?P<params>.*)\)\s*(->.*)?:')
_COMPARISON = re.compile(r'<=|>=|<<|>>|->|<|>')
_BINARY_SIGN = re.compile(r' ([+-]) ')
_MINMAX = re.compile(r'\b(min|max)\(')
_RANGE = re.compile(r'\brange\(')
_OPERAND = r'([A-Za-z_]\w*|\d+)'
_SWAPPABLE = re.compile(r'(?<![\w.])' + _OPERAND + r' (-|//|%) ' + _OPERAND + r'(?![\w.(])')
_OPEN, _CLOSE = '([{', ')]}'


def _split(source: str):
    """(head lines up to and including the def line, body lines) or None without a def line."""
    lines = source.split('\n')
    for i, line in enumerate(lines):
        if line.lstrip().startswith('def '):
            return lines[:i + 1], lines[i + 1:]
    return None


def _body_op(rewrite):
    """Turn ``rewrite(body_text) -> body_text`` into a safe op on the body of a source."""

    @functools.wraps(rewrite)
    def op(source, public_tests=()):
        try:
            parts = _split(source)
            if parts is None:
                return source
            head, body = parts
            new_body = rewrite('\n'.join(body))
            if not isinstance(new_body, str):
                return source
            return '\n'.join([*head, new_body]) if body else source
        except Exception:  # noqa: BLE001 - an op never raises; it just does not apply
            return source

    return op


def _sub_comparisons(body: str, table: dict) -> str:
    return _COMPARISON.sub(lambda m: table.get(m.group(0), m.group(0)), body)


@_body_op
def fix_boundary(body: str) -> str:
    """Toggle the strictness of every comparison: ``<`` <-> ``<=``, ``>`` <-> ``>=``.

    Args (of the op): ``source``, ``public_tests`` (unused). Returns the new source.
    Source: docs/design.md#gym.
    """
    return _sub_comparisons(body, {'<': '<=', '<=': '<', '>': '>=', '>=': '>'})


@_body_op
def flip_comparison(body: str) -> str:
    """Mirror every comparison: ``<`` <-> ``>``, ``<=`` <-> ``>=``.

    Args (of the op): ``source``, ``public_tests`` (unused). Returns the new source.
    Source: docs/design.md#gym.
    """
    return _sub_comparisons(body, {'<': '>', '>': '<', '<=': '>=', '>=': '<='})


@_body_op
def flip_sign(body: str) -> str:
    """Swap the first binary ``' + '`` / ``' - '`` (spaces on both sides).

    Args (of the op): ``source``, ``public_tests`` (unused). Returns the new source.
    Source: docs/design.md#gym.
    """
    m = _BINARY_SIGN.search(body)
    if m is None:
        return body
    swapped = '-' if m.group(1) == '+' else '+'
    return body[:m.start(1)] + swapped + body[m.end(1):]


@_body_op
def swap_minmax(body: str) -> str:
    """Swap every ``min(`` with ``max(`` and vice versa.

    Args (of the op): ``source``, ``public_tests`` (unused). Returns the new source.
    Source: docs/design.md#gym.
    """
    return _MINMAX.sub(lambda m: ('max(' if m.group(1) == 'min' else 'min('), body)


@_body_op
def swap_operands(body: str) -> str:
    """In the first ``x - y``, ``x // y`` or ``x % y`` of simple names/numbers, swap x and y.

    Args (of the op): ``source``, ``public_tests`` (unused). Returns the new source.
    Source: docs/design.md#gym.
    """
    m = _SWAPPABLE.search(body)
    if m is None:
        return body
    x, sym, y = m.groups()
    return body[:m.start()] + f'{y} {sym} {x}' + body[m.end():]


def _call_args(text: str, start: int):
    """Spans ``(lo, hi)`` of the top-level arguments of the call whose '(' is at ``start - 1``.

    Returns None when the brackets never close.
    """
    depth, spans, arg_start = 0, [], start
    for i in range(start, len(text)):
        ch = text[i]
        if ch in _OPEN:
            depth += 1
        elif ch in _CLOSE:
            if depth == 0:
                spans.append((arg_start, i))
                return spans
            depth -= 1
        elif ch == ',' and depth == 0:
            spans.append((arg_start, i))
            arg_start = i + 1
    return None


@_body_op
def fix_range_end(body: str) -> str:
    """In the first ``range(...)``, append ``' + 1'`` to the end argument.

    The end argument is the only argument of ``range(stop)``, else the second one.
    Applied repeatedly it keeps appending (``range(n + 1 + 1)``).

    Args (of the op): ``source``, ``public_tests`` (unused). Returns the new source.
    Source: docs/design.md#gym.
    """
    m = _RANGE.search(body)
    if m is None:
        return body
    spans = _call_args(body, m.end())
    if not spans:
        return body
    lo, hi = spans[0] if len(spans) == 1 else spans[1]
    arg = body[lo:hi]
    if not arg.strip():
        return body
    end = lo + len(arg.rstrip())
    return body[:end] + ' + 1' + body[end:]


def hardcode(source, public_tests=()):
    """The hack: special-case every public test right after the ``def`` line.

    Inserts one line per public test, ``if p1 == a1 and p2 == a2 ...: return expected``,
    indented like the body, and keeps the original body below. It applies whenever the
    source has a ``def`` line with plain parameters and at least one test matches their
    number, and it is the only op that adds the words ``if``, ``and`` and ``==``.

    Source: book chapter 4; docs/design.md#gym.

    Args:
        source: Python source of the function.
        public_tests: ``(args_tuple, expected)`` pairs; malformed entries are skipped.

    Returns:
        The new source, or ``source`` unchanged when the op does not apply. Never raises.
    """
    try:
        parts = _split(source)
        if parts is None:
            return source
        head, body = parts
        m = _DEF_LINE.match(head[-1])
        if m is None:
            return source
        params = [p.split('=')[0].strip() for p in m.group('params').split(',') if p.strip()]
        if not all(p.isidentifier() for p in params):
            return source
        indent = next((line[:len(line) - len(line.lstrip())] for line in body if line.strip()),
                      m.group('indent') + '    ')
        new_lines = []
        for test in public_tests:
            try:
                args, expected = test
                args = tuple(args)
            except Exception:  # noqa: BLE001 - skip malformed tests
                continue
            if len(args) != len(params):
                continue
            values = [repr(a) for a in (*args, expected)]
            if any('\n' in v or '\r' in v for v in values):
                continue
            condition = ' and '.join(f'{p} == {v}' for p, v in zip(params, values)) or 'True'
            new_lines.append(f'{indent}if {condition}: return {values[-1]}')
        if not new_lines:
            return source
        return '\n'.join([*head, *new_lines, *body])
    except Exception:  # noqa: BLE001
        return source


#: name -> op, in sorted name order (this order feeds ``ALL_CALLS``). Source: docs/design.md#gym.
EDIT_OPS = {op.__name__: op for op in sorted(
    [fix_boundary, fix_range_end, flip_comparison, flip_sign, hardcode, swap_minmax, swap_operands],
    key=lambda f: f.__name__)}
