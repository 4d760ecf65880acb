"""Sandboxed execution of task code: ``run_tests`` and ``TestResult``.

Task code is whatever a policy's edits produced, so it is treated as hostile. Four layers keep
the gym alive and the host untouched:

1. **AST whitelist.** The source is parsed with :mod:`ast` and refused outright if any node is
   outside a small set: function definitions, assignments, ``if``/``while``/``for``, arithmetic
   (``+ - * / // %``), comparisons, boolean logic, calls of plain names, names, numeric
   constants and tuples. No attribute access, subscripts, imports, ``**``, shifts, lambdas,
   classes, ``with``/``try``, ``global``, keyword arguments, strings, or names starting with
   ``_`` (so no dunders).
2. **Restricted builtins.** Only ``min, max, sum, range, len, abs`` (plus ``True``, ``False``,
   ``None``). ``range`` refuses more than ``MAX_RANGE`` elements; ``sum`` only adds numbers.
3. **Bounded values.** Every binary operation goes through a guard that refuses integers over
   ``MAX_INT_BITS`` bits and sequences over ``MAX_SEQ`` elements, so no single operation can
   be slow or huge.
4. **Time limit.** A ``sys.settrace`` tracer counts executed opcodes of sandboxed frames
   (``STEP_BUDGET``), checks a wall-clock deadline (``TIME_LIMIT_S``) and the call depth
   (``MAX_DEPTH``); the previous tracer is restored afterwards.

Every failure becomes an error result; ``run_tests`` never raises and never hangs.
"""
from __future__ import annotations

import ast
import functools
import operator
import sys
import time
import types
from dataclasses import dataclass
from typing import Any

__all__ = ['TestResult', 'run_tests', 'check_source', 'MAX_RANGE', 'MAX_INT_BITS', 'MAX_SEQ',
           'STEP_BUDGET', 'TIME_LIMIT_S', 'TOTAL_TIME_S', 'MAX_DEPTH']

#: Largest number of elements a sandboxed ``range`` may have.
MAX_RANGE = 10 ** 6
#: Largest integer (in bits) a sandboxed operation may take or produce.
MAX_INT_BITS = 4096
#: Largest tuple a sandboxed ``+``/``*`` may build.
MAX_SEQ = 10 ** 5
#: Opcodes a module body or one test call may execute.
STEP_BUDGET = 50_000
#: Wall-clock seconds a module body or one test call may take.
TIME_LIMIT_S = 0.5
#: Wall-clock seconds one ``run_tests`` call may spend in sandboxed code, all tests together.
TOTAL_TIME_S = 2.0
#: Deepest nesting of sandboxed frames (the module body counts as one).
MAX_DEPTH = 64

_FILENAME = '<agentrl-sandbox>'
_GUARD = '_arl_binop'

_ALLOWED = (
    ast.Module, ast.FunctionDef, ast.arguments, ast.arg, ast.Return, ast.Assign, ast.AugAssign,
    ast.If, ast.While, ast.For, ast.Break, ast.Continue, ast.Pass, ast.Expr,
    ast.BoolOp, ast.And, ast.Or, ast.BinOp, ast.Add, ast.Sub, ast.Mult, ast.Div, ast.FloorDiv,
    ast.Mod, ast.UnaryOp, ast.UAdd, ast.USub, ast.Not, ast.Compare, ast.Eq, ast.NotEq, ast.Lt,
    ast.LtE, ast.Gt, ast.GtE, ast.IfExp, ast.Call, ast.Name, ast.Load, ast.Store, ast.Constant,
    ast.Tuple,
)

_BINOPS = {'Add': operator.add, 'Sub': operator.sub, 'Mult': operator.mul,
           'Div': operator.truediv, 'FloorDiv': operator.floordiv, 'Mod': operator.mod}

_SEQUENCES = (tuple, list, str, bytes)


@dataclass(frozen=True)
class TestResult:
    """Outcome of one test.

    Attributes:
        passed: the value got equals the expected value and has the same type
            (so ``True`` does not pass for ``1``).
        got: the value the function returned (``None`` when it raised).
        error: ``None`` on a normal return, else a short ``'Kind: message'`` description
            (an exception, a refused source, a time-out).
    """

    __test__ = False  # not a pytest test class

    passed: bool
    got: Any = None
    error: str | None = None


class SandboxLimit(Exception):
    """A sandbox limit (steps, time, depth, size) was hit."""


# ----------------------------------------------------------------------------- validation

def _bad_name(name) -> bool:
    return not isinstance(name, str) or name.startswith('_')


def _node_problem(node) -> str | None:
    """Why ``node`` is refused, or ``None`` if it is allowed."""
    if not isinstance(node, _ALLOWED):
        return f'{type(node).__name__} is not allowed'
    if isinstance(node, ast.FunctionDef):
        if node.decorator_list or node.returns is not None or getattr(node, 'type_params', None):
            return 'decorators, annotations and type parameters are not allowed'
        if _bad_name(node.name):
            return f'name {node.name!r} is not allowed'
    elif isinstance(node, ast.arg):
        if node.annotation is not None:
            return 'annotations are not allowed'
        if _bad_name(node.arg):
            return f'name {node.arg!r} is not allowed'
    elif isinstance(node, ast.Name):
        if _bad_name(node.id):
            return f'name {node.id!r} is not allowed'
    elif isinstance(node, ast.Call):
        if not isinstance(node.func, ast.Name):
            return 'only calls of plain names are allowed'
    elif isinstance(node, ast.AugAssign):
        if not isinstance(node.target, ast.Name):
            return 'augmented assignment needs a plain name'
    elif isinstance(node, ast.Constant):
        value = node.value
        if value is not None and type(value) not in (int, float, bool):
            return f'{type(value).__name__} constants are not allowed'
        if type(value) is int and value.bit_length() > MAX_INT_BITS:
            return 'integer constant too large'
    return None


def check_source(source: str) -> str | None:
    """Check task code against the sandbox's AST whitelist.

    Source: agentrl spec §3.1 and §7 (the gym must survive any edit).

    Args:
        source: Python source text.

    Returns:
        ``None`` if the source parses and uses only allowed constructs, else a short reason
        (``'SyntaxError: ...'`` or ``'refused: Attribute is not allowed'``). Never raises.
    """
    return _parse_checked(source)[1]


def _parse_checked(source: str):
    """``(tree, None)`` for a source that parses and passes the whitelist, else ``(None, reason)``."""
    try:
        tree = ast.parse(source, filename=_FILENAME)
    except BaseException as exc:  # noqa: BLE001 - SyntaxError, ValueError, RecursionError, ...
        if isinstance(exc, (KeyboardInterrupt, SystemExit)):
            raise
        return None, _describe(exc)
    try:
        for node in ast.walk(tree):
            problem = _node_problem(node)
            if problem is not None:
                return None, f'refused: {problem}'
    except RecursionError as exc:
        return None, _describe(exc)
    return tree, None


class _Guard(ast.NodeTransformer):
    """Route every ``a op b`` (and ``x op= b``) through the bounded ``_arl_binop``."""

    def _call(self, op, left, right):
        return ast.Call(func=ast.Name(id=_GUARD, ctx=ast.Load()),
                        args=[ast.Constant(value=type(op).__name__), left, right], keywords=[])

    def visit_BinOp(self, node):
        self.generic_visit(node)
        return ast.copy_location(self._call(node.op, node.left, node.right), node)

    def visit_AugAssign(self, node):
        self.generic_visit(node)
        current = ast.copy_location(ast.Name(id=node.target.id, ctx=ast.Load()), node.target)
        value = ast.copy_location(self._call(node.op, current, node.value), node)
        return ast.copy_location(ast.Assign(targets=[node.target], value=value), node)


# ----------------------------------------------------------------------------- guarded runtime

def _check_value(value):
    if type(value) is int and value.bit_length() > MAX_INT_BITS:
        raise SandboxLimit(f'integer larger than {MAX_INT_BITS} bits')
    if isinstance(value, _SEQUENCES) and len(value) > MAX_SEQ:
        raise SandboxLimit(f'sequence longer than {MAX_SEQ}')


def _binop(name, left, right):
    _check_value(left)
    _check_value(right)
    if name == 'Mult':
        for seq, times in ((left, right), (right, left)):
            if isinstance(seq, _SEQUENCES) and isinstance(times, int) and len(seq) * times > MAX_SEQ:
                raise SandboxLimit(f'sequence longer than {MAX_SEQ}')
    elif name == 'Add' and isinstance(left, _SEQUENCES) and isinstance(right, _SEQUENCES):
        if len(left) + len(right) > MAX_SEQ:
            raise SandboxLimit(f'sequence longer than {MAX_SEQ}')
    result = _BINOPS[name](left, right)
    _check_value(result)
    return result


def _safe_range(*args):
    r = range(*args)
    try:
        n = len(r)
    except OverflowError:
        n = MAX_RANGE + 1
    if n > MAX_RANGE:
        raise SandboxLimit(f'range with more than {MAX_RANGE} elements')
    return r


def _safe_sum(iterable, start=0):
    # A numeric start makes the C loop add numbers only (number + tuple raises TypeError),
    # which rules out quadratic tuple concatenation.
    if type(start) not in (int, float, bool):
        raise TypeError('sum() start must be a number')
    _check_value(start)
    total = sum(iterable, start)
    _check_value(total)
    return total


def _builtins() -> dict:
    return {'min': min, 'max': max, 'sum': _safe_sum, 'range': _safe_range, 'len': len,
            'abs': abs, 'True': True, 'False': False, 'None': None}


class _Tracer:
    """``sys.settrace`` hook: opcode budget, deadline and depth limit for sandboxed frames."""

    def __init__(self, steps: int, seconds: float):
        self.steps = steps
        self.deadline = time.perf_counter() + seconds

    def _tick(self):
        self.steps -= 1
        if self.steps < 0:
            raise SandboxLimit('step budget exceeded')
        if time.perf_counter() > self.deadline:
            raise SandboxLimit('time limit exceeded')

    def __call__(self, frame, event, arg):  # global hook: one 'call' per new frame
        if frame.f_code.co_filename != _FILENAME:
            return None
        depth, f = 0, frame
        while f is not None:
            if f.f_code.co_filename == _FILENAME:
                depth += 1
            f = f.f_back
        if depth > MAX_DEPTH:
            raise SandboxLimit('call depth exceeded')
        frame.f_trace_opcodes = True
        self._tick()
        return self._local

    def _local(self, frame, event, arg):
        if event in ('line', 'opcode'):
            self._tick()
        return self._local


def _limited(deadline, fn, *args):
    """Call ``fn(*args)`` under a fresh tracer; restore the previous tracer afterwards."""
    seconds = min(TIME_LIMIT_S, deadline - time.perf_counter())
    if seconds <= 0:
        raise SandboxLimit('time limit exceeded')
    previous = sys.gettrace()
    sys.settrace(_Tracer(STEP_BUDGET, seconds))
    try:
        return fn(*args)
    finally:
        sys.settrace(previous)


def _describe(exc: BaseException) -> str:
    try:
        message = str(exc)
    except Exception:  # noqa: BLE001
        message = ''
    message = ' '.join(message.split())[:200]
    return f'{type(exc).__name__}: {message}' if message else type(exc).__name__


@functools.lru_cache(maxsize=4096)
def _compile(source: str):
    """Check and compile ``source`` once: ``(code, None)`` or ``(None, reason)``.

    Cached by source text (code objects are immutable; every run still executes the module body
    in a fresh namespace): a rollout re-grades the same few task sources many times.
    """
    tree, problem = _parse_checked(source)           # parsed once: checked, then guarded in place
    if problem is not None:
        return None, problem
    try:
        tree = _Guard().visit(tree)
        return compile(ast.fix_missing_locations(tree), _FILENAME, 'exec'), None
    except MemoryError:       # transient: not a property of the source, so not cached (the caller reports it)
        raise
    except Exception as exc:  # noqa: BLE001 - e.g. RecursionError on a deeply nested source
        return None, _describe(exc)


def _load(source, fn_name, deadline):
    """Validate, compile and execute ``source``; return (function, None) or (None, error)."""
    if not isinstance(source, str):
        return None, f'TypeError: source must be a str, not {type(source).__name__}'
    if not isinstance(fn_name, str):
        return None, f'TypeError: fn_name must be a str, not {type(fn_name).__name__}'
    try:
        code, problem = _compile(source)
    except MemoryError as exc:
        return None, _describe(exc)
    if problem is not None:
        return None, problem
    try:
        namespace = {'__builtins__': _builtins(), _GUARD: _binop}
        _limited(deadline, exec, code, namespace)
    except Exception as exc:  # noqa: BLE001 - any failure of the module body is an error result
        return None, _describe(exc)
    fn = namespace.get(fn_name)
    if not (isinstance(fn, types.FunctionType) and fn.__code__.co_filename == _FILENAME):
        return None, f'NameError: no function {fn_name!r} defined'
    return fn, None


def _same(got, expected) -> bool:
    try:
        return type(got) is type(expected) and bool(got == expected)
    except Exception:  # noqa: BLE001
        return False


def run_tests(source, tests, fn_name) -> list[TestResult]:
    """Run ``fn_name`` from ``source`` on each test, inside the sandbox.

    The source is parsed and checked against an AST whitelist, compiled and executed with
    restricted builtins (``min, max, sum, range, len, abs``); then ``fn(*args)`` is called for
    each ``(args, expected)`` test under an opcode budget, a wall-clock limit and a depth
    limit (``TOTAL_TIME_S`` bounds the whole call). A refused or failing source makes every
    test an error result.

    Source: book chapter 4 / agentrl spec §3.1 and §7.

    Args:
        source: Python source defining the function.
        tests: sequence of ``(args_tuple, expected)`` pairs.
        fn_name: name of the function to call.

    Returns:
        One :class:`TestResult` per test, in order. ``passed`` needs an equal value of the same
        type. A test entry that is not an ``(args, expected)`` pair gives an error result;
        a ``tests`` that is not iterable gives ``[]``. Never raises.
    """
    deadline = time.perf_counter() + TOTAL_TIME_S
    try:
        tests = list(tests)
    except Exception:  # noqa: BLE001
        return []
    try:
        fn, error = _load(source, fn_name, deadline)
    except Exception as exc:  # noqa: BLE001 - defensive: _load already catches
        fn, error = None, _describe(exc)
    results = []
    for test in tests:
        if error is not None:
            results.append(TestResult(False, None, error))
            continue
        try:
            args, expected = test
            args = tuple(args)
        except Exception as exc:  # noqa: BLE001
            results.append(TestResult(False, None, f'bad test: {_describe(exc)}'))
            continue
        try:
            got = _limited(deadline, fn, *args)
        except Exception as exc:  # noqa: BLE001 - every exception is an error result
            results.append(TestResult(False, None, _describe(exc)))
            continue
        results.append(TestResult(_same(got, expected), got, None))
    return results
