"""Recorded test durations (``tests/durations.json``) and the slow list (``tests/slow_tests.txt``) they keep true.

``durations.json`` maps a pytest node id (``tests/test_x.py::test_f[param]``) to the seconds its setup, call
and teardown took together in one run (a shared fixture's setup lands on the first test that uses it, as in
``pytest --durations``). A test *function* is slow when its slowest node is: the slow list marks functions,
all their parameters at once.

The band: a function over :data:`SLOW_S` must be listed, one under :data:`FAST_S` must not be, one in
between may be either (so a borderline test does not flap between runs).

Written by ``pytest --record-durations tests/durations.json`` (tests/conftest.py) or by
``python tests/record_durations.py LOG`` from the output of ``pytest --durations=0 -vv``.
"""
from __future__ import annotations

import ast
import functools
import json
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DURATIONS = ROOT / 'tests' / 'durations.json'
SLOW_LIST = ROOT / 'tests' / 'slow_tests.txt'
#: seconds: a function whose slowest node took longer must be in the slow list
SLOW_S = 3.0
#: seconds: a listed function whose slowest node took less must leave the slow list
FAST_S = 2.0
#: whole folders and files that are slow (each test starts Ray, a vLLM server, a subprocess job or an agent CLI);
#: not listed
SLOW_FILES = ('tests/test_ray.py', 'tests/live_vllm/', 'tests/test_families_e2e.py', 'tests/harness/')

_LINE = re.compile(r'^\s*(\d+(?:\.\d+)?)s\s+(setup|call|teardown)\s+(\S+)\s*$')


def function_id(nodeid: str) -> str:
    """``tests/x.py::test_f`` of a node id (parameters and any class dropped): the slow list's key."""
    parts = nodeid.split('::')
    return parts[0] + '::' + parts[-1].split('[', 1)[0]


def read_slow_list(path: Path = SLOW_LIST) -> list[str]:
    """The listed function ids, in file order (comments and blank lines left out)."""
    return [line.strip() for line in path.read_text().splitlines() if line.strip() and not line.startswith('#')]


def load(path: Path = DURATIONS) -> dict[str, float]:
    """The recorded seconds per node id ({} when the file does not exist)."""
    return json.loads(path.read_text()) if path.exists() else {}


def by_function(durations: dict[str, float]) -> dict[str, float]:
    """Seconds per function id: the slowest of its nodes."""
    out: dict[str, float] = {}
    for nodeid, seconds in durations.items():
        key = function_id(nodeid)
        out[key] = max(out.get(key, 0.0), seconds)
    return out


@functools.lru_cache(maxsize=None)
def functions_in(path: Path) -> frozenset[str]:
    """Names of the functions defined in a test file (empty when it does not exist)."""
    if not path.is_file():
        return frozenset()
    return frozenset(n.name for n in ast.walk(ast.parse(path.read_text()))
                     if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)))


def exists(function: str, root: Path = ROOT) -> bool:
    """Whether ``tests/x.py::test_f`` names a function defined in that file."""
    file, name = function.split('::')
    return name in functions_in(root / file)


def parse_durations_output(text: str) -> dict[str, float]:
    """Seconds per node id from ``pytest --durations=0 -vv`` output (setup, call and teardown summed; skipped tests
    left out).

    Raises:
        ValueError: the text holds no duration line (run pytest with ``--durations=0 -vv``).
    """
    out: dict[str, float] = {}
    skipped = set()
    for line in text.splitlines():
        m = _LINE.match(line)
        if m:
            out[m.group(3)] = out.get(m.group(3), 0.0) + float(m.group(1))
        elif ' SKIPPED' in line and '::' in line:           # -vv progress: a skipped test's seconds say nothing
            skipped.add(line.split(' SKIPPED')[0].strip())
    out = {k: v for k, v in out.items() if k not in skipped}
    if not out:
        raise ValueError('no duration lines (like "1.23s call tests/test_x.py::test_f"); run pytest with '
                         '--durations=0 -vv and pass its output')
    return out


def merge(old: dict[str, float], new: dict[str, float], root: Path = ROOT) -> dict[str, float]:
    """``old`` with every file that ``new`` ran replaced by ``new``'s nodes, less the nodes whose function is gone.

    A file is replaced whole (renamed parameters leave no stale node), so record whole files: a run narrowed with
    ``-k`` would drop the file's other tests and charge a shared fixture's setup to the first test it selects.

    Returns:
        seconds per node id, sorted, rounded to 0.01 s.
    """
    ran = {k.split('::')[0] for k in new}
    merged = {k: v for k, v in old.items() if k.split('::')[0] not in ran and exists(function_id(k), root)}
    merged.update(new)
    return {k: round(merged[k], 2) for k in sorted(merged)}


def write(durations: dict[str, float], path: Path = DURATIONS) -> None:
    """Write the file: one ``"node id": seconds`` per line, sorted."""
    path.write_text(json.dumps(durations, indent=0, sort_keys=True) + '\n')


def disagreements(durations: dict[str, float], listed: list[str]) -> tuple[list[str], list[str]]:
    """``(to_list, to_unlist)``: recorded functions over :data:`SLOW_S` not listed, listed ones under :data:`FAST_S`.

    Functions under :data:`SLOW_FILES` are slow by their file and left out.
    """
    funcs = {k: v for k, v in by_function(durations).items() if not k.startswith(SLOW_FILES)}
    listed_set = set(listed)
    to_list = sorted(f for f, s in funcs.items() if s > SLOW_S and f not in listed_set)
    to_unlist = sorted(f for f in listed if f in funcs and funcs[f] < FAST_S)
    return to_list, to_unlist


def update_slow_list(durations: dict[str, float], path: Path = SLOW_LIST) -> tuple[list[str], list[str]]:
    """Rewrite the slow list so it agrees with ``durations``: the removed lines dropped, the added ones appended.

    Returns:
        ``(added, removed)`` function ids.
    """
    added, removed = disagreements(durations, read_slow_list(path))
    kept = [line for line in path.read_text().splitlines() if line.strip() not in set(removed)]
    path.write_text('\n'.join(kept + added) + '\n')
    return added, removed
