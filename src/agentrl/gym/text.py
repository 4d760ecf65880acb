"""Text helpers of the BugFix gym: the compact source projection and the test report.

Everything here is plain text in, plain text out; every word these helpers emit is a
whitespace-separated token of TinyAgent's word-level tokenizer (book chapter 5.5).
"""
from __future__ import annotations

import io
import tokenize

__all__ = ['compact_source', 'format_results', 'format_value']

#: Token types that carry no words in the compact projection. Source: docs/design.md#gym.
_DROPPED = frozenset({tokenize.ENCODING, tokenize.INDENT, tokenize.DEDENT, tokenize.COMMENT,
                      tokenize.ENDMARKER, tokenize.NL})


def _fallback(source: str) -> str:
    """Whitespace-normalised non-blank lines: the best effort for text that does not tokenize."""
    lines = (' '.join(line.split()) for line in source.splitlines())
    return '\n'.join(line for line in lines if line)


def compact_source(source: str) -> str:
    """Project Python source onto words: one logical line per line, tokens joined by one space.

    Runs Python's ``tokenize`` over ``source``, drops indentation, comments, blank lines and
    the end marker, joins the token strings of each logical line with single spaces and the
    lines with ``\\n``. A literal such as ``-2`` becomes the two words ``- 2``.

    Example: ``compact_source(CLAMP_BUGGY)`` is
    ``'def clamp ( value , lower , upper ) :\\nreturn min ( lower , max ( value , upper ) )'``
    (22 words and one newline, 23 tokens for the word tokenizer).

    Source: book chapter 4.4; docs/design.md#gym.

    Args:
        source: Python source text (need not be valid Python).

    Returns:
        The compact projection. If ``source`` cannot be tokenized (unbalanced brackets, bad
        indentation, stray characters), a best-effort projection instead: each non-blank line
        with its whitespace collapsed. Never raises for a ``str``.

    Raises:
        TypeError: ``source`` is not a ``str``.
    """
    if not isinstance(source, str):
        raise TypeError(f'compact_source expects a str, got {type(source).__name__}')
    lines, current = [], []
    try:
        for tok in tokenize.generate_tokens(io.StringIO(source).readline):
            if tok.type == tokenize.NEWLINE:
                if current:
                    lines.append(' '.join(current))
                current = []
            elif tok.type not in _DROPPED and tok.string:
                current.append(tok.string)
    except Exception:  # TokenError, IndentationError, SyntaxError, ...: fall back, never raise
        return _fallback(source)
    if current:
        lines.append(' '.join(current))
    return '\n'.join(lines)


def format_value(value) -> str:
    """Render one test value as a single word.

    Booleans print as ``True``/``False``, integers in decimal, ``None`` as ``None``, floats
    as their ``repr``, strings as their ``repr`` without whitespace (cut to 40 characters).
    Any other value (a tuple, a range, a function) prints as its type name, which keeps the
    report short whatever the code returned. An integer too long for ``str`` prints as
    ``overflow``.

    Args:
        value: an argument, expected value or returned value.

    Returns:
        One whitespace-free word.
    """
    try:
        if isinstance(value, (bool, int, float)) or value is None:
            return str(value)
        if isinstance(value, str):
            return ''.join(repr(value).split())[:40]
        return type(value).__name__
    except Exception:  # noqa: BLE001 - int too long for str(), ...
        return 'overflow' if isinstance(value, int) else '?'


def format_results(results, tests) -> str:
    """Format test results as the ``test`` tool's observation.

    One line per test, words: ``pass`` or ``fail``, each argument, ``->``, the value got
    (``error`` if the call raised or was refused), ``want``, the expected value. Lines are
    joined by ``\\n``. Example line: ``fail 3 0 5 -> 0 want 3``.

    Source: book chapter 4; docs/design.md#gym.

    Args:
        results: ``TestResult`` objects from :func:`run_tests`, one per test.
        tests: the ``(args_tuple, expected)`` pairs the results belong to (same order).
            Extra entries of the longer sequence are ignored.

    Returns:
        The report text (empty string for no tests).
    """
    lines = []
    for result, (args, expected) in zip(results, tests):
        status = 'pass' if result.passed else 'fail'
        got = 'error' if result.error is not None else format_value(result.got)
        words = [status, *(format_value(a) for a in args), '->', got, 'want', format_value(expected)]
        lines.append(' '.join(words))
    return '\n'.join(lines)
