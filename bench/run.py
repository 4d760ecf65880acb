"""Run every benchmark of the project and print one table.

Usage::

    .venv/bin/python bench/run.py [--quick] [--only rollout,store] [--json out.json] [--markdown]
                                  [--threads 1] [--malloc default|keep]

Convention (for whoever adds a benchmark): a module ``bench/bench_<name>.py`` exposes

    def run(quick: bool) -> list[dict]

returning rows with the keys ``name`` (str), ``value`` (number, or None when skipped), ``unit``
(str) and ``notes`` (str), plus, for a row the issues set a target on, ``target`` (str such as
``'>= 30'``) and ``ok`` (bool: was it met). ``quick=True`` must keep the module to a few seconds
so that ``run.py --quick`` finishes in under a minute. A module that needs an optional extra
(transformers, pyarrow ...) and does not find it returns one row with ``value`` None and
``notes`` saying what was skipped. Modules are found with ``glob('bench/bench_*.py')`` and run in
name order, in this process; a module that fails to import, has no ``run`` or raises becomes an
``error`` row (with the exception) instead of stopping the others. Torch's thread count is reset
to ``--threads`` before each module.

``--malloc keep`` re-runs the process with glibc told to keep freed memory for reuse
(:data:`KEEP_MALLOC`: blocks up to 32 MiB come from the heap, which is trimmed only past 256 MiB
free), the glibc counterpart of the caching allocators (jemalloc, TCMalloc) that PyTorch's CPU
performance tuning guide recommends. With the default settings a process gives large freed
blocks back to the OS and pays a page fault per 4 KiB to get them back: about 8,000 faults
(some 14 ms) per 256-episode TinyAgent rollout on this machine.
"""
from __future__ import annotations

import argparse
import glob
import importlib.util
import json
import os
import platform
import sys
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
#: glibc settings of ``--malloc keep`` (environment variables read when the process starts).
KEEP_MALLOC = {'MALLOC_MMAP_THRESHOLD_': '33554432', 'MALLOC_TRIM_THRESHOLD_': '268435456'}
COLUMNS = ('bench', 'name', 'value', 'unit', 'target', 'status', 'notes')


def discover(only: list[str] | None = None) -> list[tuple[str, str]]:
    """``(short name, path)`` of every ``bench/bench_*.py``, sorted, optionally filtered by short name."""
    found = []
    for path in sorted(glob.glob(os.path.join(HERE, 'bench_*.py'))):
        short = os.path.basename(path)[len('bench_'):-len('.py')]
        if only is None or short in only:
            found.append((short, path))
    return found


def _error_row(short: str, what: str, exc: BaseException) -> dict:
    last = traceback.format_exception_only(type(exc), exc)[-1].strip()
    return {'bench': short, 'name': what, 'value': None, 'unit': '', 'notes': last[:300], 'status': 'error'}


def run_module(short: str, path: str, quick: bool, threads: int | None = None) -> list[dict]:
    """Import one benchmark module from ``path`` and return its rows (error rows on failure)."""
    if HERE not in sys.path:
        sys.path.insert(0, HERE)
    try:
        spec = importlib.util.spec_from_file_location(f'bench_{short}', path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    except BaseException as e:          # noqa: BLE001 - a broken module is a row, not a crash
        if isinstance(e, KeyboardInterrupt):
            raise
        return [_error_row(short, 'import', e)]
    if not callable(getattr(module, 'run', None)):
        return [{'bench': short, 'name': 'run', 'value': None, 'unit': '', 'status': 'error',
                 'notes': 'module has no run(quick) -> list[dict]; see bench/run.py for the convention'}]
    if threads is not None:
        try:
            import torch
            torch.set_num_threads(threads)
        except ImportError:
            pass
    t0 = time.perf_counter()
    try:
        rows = list(module.run(quick))
    except BaseException as e:          # noqa: BLE001
        if isinstance(e, KeyboardInterrupt):
            raise
        return [_error_row(short, 'run', e)]
    out = [dict(r, bench=short, status=r.get('status', _status(r))) for r in rows]
    out.append({'bench': short, 'name': 'bench_seconds', 'value': round(time.perf_counter() - t0, 1), 'unit': 's',
                'notes': 'wall time of this module', 'status': ''})
    return out


def _status(row: dict) -> str:
    """'met' / 'NOT MET' for a row with a target, '' otherwise."""
    return '' if row.get('ok') is None else ('met' if row['ok'] else 'NOT MET')


def _fmt(v) -> str:
    if v is None:
        return '-'
    if isinstance(v, float):
        return f'{v:.4g}' if abs(v) < 1e4 else f'{v:.0f}'
    return str(v)


def format_table(rows: list[dict], markdown: bool = False) -> str:
    """Rows as an aligned text table (or a Markdown table), columns bench, name, value, unit, target, status, notes."""
    rows = [r if 'status' in r else dict(r, status=_status(r)) for r in rows]
    cells = [[_fmt(r.get(c)) if c == 'value' else str(r.get(c, '') or '') for c in COLUMNS] for r in rows]
    if markdown:
        lines = ['| ' + ' | '.join(COLUMNS) + ' |', '|' + '---|' * len(COLUMNS)]
        lines += ['| ' + ' | '.join(c.replace('|', '/') for c in row) + ' |' for row in cells]
        return '\n'.join(lines)
    widths = [max(len(c), *(len(row[i]) for row in cells)) if cells else len(c) for i, c in enumerate(COLUMNS)]
    widths[-1] = 0
    line = lambda row: '  '.join(x.ljust(w) for x, w in zip(row, widths)).rstrip()
    return '\n'.join([line(COLUMNS), line(['-' * w for w in widths[:-1]] + ['-----'])] + [line(r) for r in cells])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description='Run every bench/bench_*.py and print one table.')
    ap.add_argument('--quick', action='store_true', help='short versions (the whole run under a minute)')
    ap.add_argument('--only', default=None, help='comma-separated short names (rollout,store ...)')
    ap.add_argument('--json', default=None, help='also write the rows to this JSON file')
    ap.add_argument('--markdown', action='store_true', help='print a Markdown table (for bench/RESULTS.md)')
    ap.add_argument('--threads', type=int, default=1, help='torch threads for every module (default 1)')
    ap.add_argument('--malloc', choices=['default', 'keep'], default='default',
                    help="glibc malloc as is (default) or told to keep freed memory (keep: re-runs the process)")
    args = ap.parse_args(argv)
    if args.malloc == 'keep' and any(os.environ.get(k) != v for k, v in KEEP_MALLOC.items()):
        os.execve(sys.executable, [sys.executable, os.path.abspath(__file__), *(sys.argv[1:] if argv is None else argv)],
                  dict(os.environ, **KEEP_MALLOC))
    malloc = 'keep' if all(os.environ.get(k) == v for k, v in KEEP_MALLOC.items()) else 'default'
    only = args.only.split(',') if args.only else None
    t0 = time.perf_counter()
    rows = []
    for short, path in discover(only):
        print(f'[bench/run.py] {short} ...', file=sys.stderr, flush=True)
        rows += run_module(short, path, args.quick, args.threads)
    total = time.perf_counter() - t0
    print(format_table(rows, markdown=args.markdown))
    print(f'\n{len(rows)} rows in {total:.1f} s; {"quick" if args.quick else "full"} run; {os.cpu_count()} cores; '
          f'python {platform.python_version()}; malloc {malloc}; {time.strftime("%Y-%m-%d %H:%M")}')
    if args.json:
        with open(args.json, 'w') as f:
            json.dump({'quick': args.quick, 'seconds': total, 'rows': rows}, f, indent=1, default=str)
    return 0


if __name__ == '__main__':
    sys.exit(main())
