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
5. **A worker process with a hard deadline and rlimits.** The tracer only sees Python opcodes:
   one C-level operation (comparing two deeply shared tuples, ``a == b``) can run for hours
   between two opcodes. So task code runs in a separate worker process (one per parent
   process, started on first use and reused, so a call costs one pipe round trip), under
   ``RLIMIT_AS`` (``WORKER_MEMORY_BYTES``) and a per-call ``RLIMIT_CPU``; the parent waits at
   most ``HARD_DEADLINE_S`` for the answer and otherwise kills the worker (SIGKILL, which C
   code cannot ignore) and reports a time-out; the next call starts a fresh worker. The
   worker loads this file alone (``python -I``, standard library only: no torch). Answers come
   back with :mod:`marshal` (plain values only; nothing in them can run code in the parent).
   The parent checks sources against the whitelist itself (cached), so refused sources never
   cost a round trip.

Bounds (docs/design.md#bounds): a source over ``MAX_SOURCE_CHARS`` is refused before it is parsed
(parsing and compiling run in the parent), and a returned value whose repr would pass
``MAX_RESULT_CHARS`` (a tuple nesting shared tuples grows exponentially) comes back as an
:class:`Opaque` summary, so printing a result always ends.

Every failure becomes an error result; ``run_tests`` never raises and never hangs
(docs/design.md#gym).
"""
from __future__ import annotations

import ast
import functools
import marshal
import operator
import os
import pickle
import select
import struct
import subprocess
import sys
import threading
import time
import types
from dataclasses import dataclass
from typing import Any

__all__ = ['TestResult', 'run_tests', 'check_source', 'MAX_RANGE', 'MAX_INT_BITS', 'MAX_SEQ',
           'STEP_BUDGET', 'TIME_LIMIT_S', 'TOTAL_TIME_S', 'MAX_DEPTH', 'HARD_DEADLINE_S', 'WORKER_MEMORY_BYTES',
           'Opaque', 'MAX_SOURCE_CHARS', 'MAX_RESULT_CHARS']

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
#: Wall-clock seconds the parent waits for the worker's answer to one ``run_tests`` call before
#: killing it (the tracer's ``TOTAL_TIME_S`` plus a margin for the round trip).
HARD_DEADLINE_S = TOTAL_TIME_S + 0.5
#: Address-space limit of the worker process (``RLIMIT_AS``).
WORKER_MEMORY_BYTES = 1 << 30
#: CPU seconds one call may use in the worker (``RLIMIT_CPU``, set before each call).
WORKER_CPU_S = 3

#: Longest task source (characters) parsed and compiled; longer ones are refused unparsed.
MAX_SOURCE_CHARS = 100_000
#: Longest repr (characters) of a returned value; a longer one comes back as an :class:`Opaque` summary.
MAX_RESULT_CHARS = 10_000

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

    Source: docs/design.md#gym.

    Args:
        source: Python source text.

    Returns:
        ``None`` if the source parses and uses only allowed constructs, else a short reason
        (``'SyntaxError: ...'`` or ``'refused: Attribute is not allowed'``). Never raises.
    """
    return _parse_checked(source)[1]


def _too_long(source) -> str | None:
    """The refusal of a source over :data:`MAX_SOURCE_CHARS` (checked before parsing), else None."""
    if isinstance(source, str) and len(source) > MAX_SOURCE_CHARS:
        return f'refused: the source is {len(source)} characters, over MAX_SOURCE_CHARS ({MAX_SOURCE_CHARS})'
    return None


def _parse_checked(source: str):
    """``(tree, None)`` for a source that parses and passes the whitelist, else ``(None, reason)``."""
    if _too_long(source):
        return None, _too_long(source)
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
    """Validate, compile and execute ``source``; return (function, None) or (None, error).

    ``source`` may also be the code object :func:`_compile` made of a checked source (the
    worker receives it so, compiled once by the parent).
    """
    if isinstance(source, types.CodeType):
        source = (source, None)
    elif not isinstance(source, str):
        return None, f'TypeError: source must be a str, not {type(source).__name__}'
    if not isinstance(fn_name, str):
        return None, f'TypeError: fn_name must be a str, not {type(fn_name).__name__}'
    try:
        code, problem = source if isinstance(source, tuple) else _compile(source)
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


def _run_local(source, tests, fn_name) -> list[TestResult]:
    """Run ``fn_name`` from ``source`` on each test in this process (layers 1-4; the worker's body).

    What :func:`run_tests` runs inside the worker: the AST whitelist, restricted builtins and the
    opcode, wall-clock and depth limits, without the worker's rlimits and hard deadline.
    Arguments and results as :func:`run_tests` (plain values, no :class:`Opaque`). Never raises.

    Source: book chapter 4; docs/design.md#gym.
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


# ----------------------------------------------------------------------------- worker process

class Opaque:
    """A returned value the worker cannot send back as plain data (a function, a range ...): its repr.

    Attributes:
        text: ``repr`` of the value (at most 200 characters).
    """

    def __init__(self, text: str):
        self.text = text

    def __repr__(self) -> str:
        return self.text

    def __eq__(self, other) -> bool:
        return isinstance(other, Opaque) and other.text == self.text

    def __hash__(self) -> int:
        return hash(self.text)


_BOOT = ('import importlib.util as u, sys\n'
         's = u.spec_from_file_location("agentrl_sandbox_worker", sys.argv[1])\n'
         'm = sys.modules[s.name] = u.module_from_spec(s)\n'
         's.loader.exec_module(m)\n'
         'm._serve()\n')
_HEADER = struct.Struct('>I')


def _read_exact(fd: int, n: int, deadline: float | None) -> bytes | None:
    """``n`` bytes from ``fd``; None on end of file or when ``deadline`` (perf_counter) passes."""
    chunks, got = [], 0
    while got < n:
        if deadline is not None:
            left = deadline - time.perf_counter()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                return None
        chunk = os.read(fd, n - got)
        if not chunk:
            return None
        chunks.append(chunk)
        got += len(chunk)
    return b''.join(chunks)


def _write_frame(fd: int, payload: bytes) -> None:
    data = _HEADER.pack(len(payload)) + payload
    while data:
        data = data[os.write(fd, data):]


def _repr_over(value, budget: int) -> bool:
    """True when ``repr(value)`` would be longer than ``budget`` characters (walks at most ``budget`` items).

    Counts the tree, not the object graph: a tuple nesting one shared tuple 60 times has a repr of 2**60
    items, found over the budget after ``budget`` steps.
    """
    stack, left = [value], budget
    while stack:
        v = stack.pop()
        if type(v) is tuple:
            left -= 2 + 2 * len(v)
            if left >= 0:
                stack.extend(v)
        elif type(v) is int:
            left -= 1 + v.bit_length() * 30103 // 100000
        else:
            left -= 24 if type(v) in (float, bool) or v is None else 200
        if left < 0:
            return True
    return False


def _bounded(value):
    """``value``, or an :class:`Opaque` summary when its repr would pass :data:`MAX_RESULT_CHARS`."""
    if _repr_over(value, MAX_RESULT_CHARS):
        return Opaque(f'<{type(value).__name__} whose repr is over MAX_RESULT_CHARS ({MAX_RESULT_CHARS}) characters>')
    return value


def _plain(value):
    """``value`` if :mod:`marshal` can carry it, else an ``('opaque', repr)`` marker (also for a repr too long)."""
    value = _bounded(value)
    if isinstance(value, Opaque):
        return 1, value.text
    try:
        marshal.dumps(value)
        return 0, value
    except (ValueError, TypeError, RecursionError):
        try:
            text = repr(value)[:200]
        except Exception:  # noqa: BLE001
            text = f'<{type(value).__name__}>'
        return 1, text


def _serve() -> None:
    """The worker's loop: read a pickled ``(source, tests, fn_name)``, answer with marshal, repeat.

    Runs in the worker process (started by :class:`_Worker`); exits at end of input.
    """
    import resource
    try:
        resource.setrlimit(resource.RLIMIT_AS, (WORKER_MEMORY_BYTES, WORKER_MEMORY_BYTES))
    except (ValueError, OSError):
        pass
    rfd, wfd = sys.stdin.fileno(), sys.stdout.fileno()
    while True:
        head = _read_exact(rfd, _HEADER.size, None)
        if head is None:
            return
        body = _read_exact(rfd, _HEADER.unpack(head)[0], None)
        if body is None:
            return
        try:
            code, tests, fn_name = pickle.loads(body)
            source = marshal.loads(code)
        except Exception as exc:  # noqa: BLE001 - e.g. an argument whose class only the parent can import
            _write_frame(wfd, marshal.dumps(('unreadable', _describe(exc))))
            continue
        try:
            used = resource.getrusage(resource.RUSAGE_SELF)
            cpu = int(used.ru_utime + used.ru_stime) + 1 + WORKER_CPU_S
            resource.setrlimit(resource.RLIMIT_CPU, (cpu, resource.getrlimit(resource.RLIMIT_CPU)[1]))
        except (ValueError, OSError):
            pass
        try:
            results = [(r.passed, *_plain(r.got), r.error) for r in _run_local(source, tests, fn_name)]
        except MemoryError:
            results = [(False, 0, None, 'MemoryError')] * len(tests)
        _write_frame(wfd, marshal.dumps(results))


class _Worker:
    """One worker process and its pipes (see the module docstring, layer 5)."""

    def __init__(self):
        self.owner = os.getpid()
        self.proc = subprocess.Popen([sys.executable, '-I', '-S', '-c', _BOOT, os.path.abspath(__file__)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                     close_fds=True)

    def call(self, payload: bytes, seconds: float):
        """Send one request; the decoded answer, or None when the worker died or missed the deadline."""
        try:
            _write_frame(self.proc.stdin.fileno(), payload)
            deadline = time.perf_counter() + seconds
            fd = self.proc.stdout.fileno()
            head = _read_exact(fd, _HEADER.size, deadline)
            body = None if head is None else _read_exact(fd, _HEADER.unpack(head)[0], deadline + 1.0)
            return None if body is None else marshal.loads(body)
        except (OSError, ValueError, EOFError, TypeError):
            return None

    def kill(self) -> None:
        try:
            self.proc.kill()
            self.proc.wait(timeout=5)
        except Exception:  # noqa: BLE001
            pass
        for f in (self.proc.stdin, self.proc.stdout):
            try:
                f.close()
            except Exception:  # noqa: BLE001
                pass


_WORKER: _Worker | None = None
_WORKER_LOCK = threading.Lock()


def _in_worker(code: types.CodeType, tests: list, fn_name: str):
    """Results from the worker, or None when the worker missed the hard deadline (it is killed)."""
    global _WORKER
    payload = pickle.dumps((marshal.dumps(code), tests, fn_name))
    with _WORKER_LOCK:
        if _WORKER is None or _WORKER.owner != os.getpid() or _WORKER.proc.poll() is not None:
            if _WORKER is not None and _WORKER.owner == os.getpid():
                _WORKER.kill()
            _WORKER = _Worker()                   # a forked child never shares its parent's worker
        answer = _WORKER.call(payload, HARD_DEADLINE_S)
        if answer is None:
            _WORKER.kill()
            _WORKER = None
            return None
    if isinstance(answer, tuple):                 # ('unreadable', why): the caller runs the tests here
        raise TypeError(f'the sandbox worker cannot read the tests: {answer[1]}')
    return tuple(TestResult(passed, Opaque(got) if opaque else got, error) for passed, opaque, got, error in answer)


class _Memo:
    """Results of recent calls, keyed by source, tests and function (a bounded LRU, thread-safe).

    The sandbox is deterministic (a step budget, no I/O, clock or randomness), except for the
    wall-clock limits, whose results are never stored: many episodes grade the same few sources,
    and a repeat costs a dictionary look-up instead of a round trip to the worker.
    """

    def __init__(self, size: int = 4096):
        from collections import OrderedDict
        self.size, self.memo, self.lock = size, OrderedDict(), threading.Lock()

    def get(self, key):
        with self.lock:
            value = self.memo.get(key)
            if value is not None:
                self.memo.move_to_end(key)
            return value

    def put(self, key, value) -> None:
        with self.lock:
            self.memo[key] = value
            while len(self.memo) > self.size:
                self.memo.popitem(last=False)


_MEMO = _Memo()


def _memo_key(source: str, pairs: list, fn_name: str):
    """A key telling apart every input that may change the results (types included), or None."""
    try:
        return source, fn_name, repr([(tuple((type(a), a) for a in args), type(e), e) for args, e in pairs])
    except Exception:  # noqa: BLE001 - an argument whose repr fails: never memoised
        return None


def run_tests(source, tests, fn_name) -> list[TestResult]:
    """Run ``fn_name`` from ``source`` on each test, inside the sandbox.

    The source is parsed and checked against an AST whitelist (here, cached), then compiled and
    executed in the sandbox's worker process with restricted builtins (``min, max, sum, range,
    len, abs``); ``fn(*args)`` is called for each ``(args, expected)`` test under an opcode
    budget, a wall-clock limit and a depth limit (``TOTAL_TIME_S`` bounds the whole call), and
    the worker itself under CPU and memory rlimits and a hard deadline (``HARD_DEADLINE_S``)
    after which it is killed. A refused or failing source makes every test an error result.

    Source: book chapter 4; docs/design.md#gym.

    Args:
        source: Python source defining the function.
        tests: sequence of ``(args_tuple, expected)`` pairs.
        fn_name: name of the function to call.

    Returns:
        One :class:`TestResult` per test, in order. ``passed`` needs an equal value of the same
        type. A test entry that is not an ``(args, expected)`` pair gives an error result;
        a ``tests`` that is not iterable gives ``[]``. A value that is not plain data comes back
        as an :class:`Opaque` (its repr). When the hard deadline passes, every test gets the
        error ``'SandboxLimit: time limit exceeded (hard deadline, worker killed)'``. Never
        raises, never hangs.
    """
    try:
        tests = list(tests)
    except Exception:  # noqa: BLE001
        return []
    error = None
    if not isinstance(source, str):
        error = f'TypeError: source must be a str, not {type(source).__name__}'
    elif not isinstance(fn_name, str):
        error = f'TypeError: fn_name must be a str, not {type(fn_name).__name__}'
    elif _too_long(source):
        error = _too_long(source)                   # before parsing, and before the compile cache keeps it
    else:
        try:
            code, error = _compile(source)           # refused here, without a round trip
        except MemoryError as exc:
            error = _describe(exc)
    if error is not None:
        return [TestResult(False, None, error) for _ in tests]
    pairs, bad = [], {}
    for i, test in enumerate(tests):
        try:
            args, expected = test
            pairs.append((tuple(args), expected))
        except Exception as exc:  # noqa: BLE001
            bad[i] = TestResult(False, None, f'bad test: {_describe(exc)}')
    key = _memo_key(source, pairs, fn_name)
    results = _MEMO.get(key) if key is not None else None
    if results is None:
        try:
            results = _in_worker(code, pairs, fn_name)
        except Exception:  # noqa: BLE001 - unpicklable arguments, no subprocess: run here (layers 1-4)
            results = [TestResult(r.passed, _bounded(r.got), r.error) for r in _run_local(source, pairs, fn_name)]
        if results is None:
            results = [TestResult(False, None, 'SandboxLimit: time limit exceeded (hard deadline, worker killed)')
                       for _ in pairs]
        elif key is not None and not any(r.error and 'time limit' in r.error for r in results):
            _MEMO.put(key, results)               # deterministic: same source and tests, same results
    out, it = [], iter(results)               # a new list per call (the memo keeps its own tuple)
    for i in range(len(tests)):
        out.append(bad[i] if i in bad else next(it))
    return out
