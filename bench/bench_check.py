"""Benchmark: model-free ``agentrl check`` by columns vs record by record, side by side in one run.

1. Roll out TinyAgent episodes (``agentrl rollout --policy model``), then grow them to N rows with pyarrow:
   each copy gets its own identity (``rollout_id``) and a recomputed row digest, so every row is
   a distinct, valid record (no rollouts for the copies).
2. ``agentrl check FILE`` in a fresh subprocess, per-record (``AGENTRL_CHECK_PER_RECORD=1``, the
   "before") and by columns (the "after"): wall time, start-up (the same command on a 1-row file),
   records/s = N / (wall - start-up), whether torch was imported, peak RSS (``ru_maxrss`` of the child).
3. Peak RSS of the columnar check on a 1M-row file written with row groups of 16k rows against the
   file's size in memory (its Arrow table), to show it is bounded by the row group, not the file.

Files live under a temporary folder and are deleted at the end.

4. ``--rss ROWS:GROUP ...``: peak RSS of the columnar check per file size and row group, before (``--before-src``:
   main's ``src``) and after, and the check's per-record state in bytes (tracemalloc; ``--state-rows``).

Usage: ``python bench/bench_check.py [--rows 100000] [--big-rows 1000000] [--skip-big] [--skip-speed]
[--rss 250000:16384 1000000:16384 --before-src ../main/src]``; writes the tables to stdout (copy them into
bench/RESULTS.md).
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

_GUARD = ("import sys\n"
          "import agentrl\n"
          "print('AGENTRL', agentrl.__file__, file=sys.stderr)\n"
          "from agentrl.cli.main import main\n"
          "code = main(sys.argv[1:])\n"
          "print('TORCH', 'torch' in sys.modules, file=sys.stderr)\n"
          "sys.exit(code)\n")


def rollout(out: Path) -> Path:
    """A TinyAgent run (`agentrl rollout --policy model --split train --repeats 1`); returns its shard file."""
    subprocess.run([sys.executable, '-m', 'agentrl', 'rollout', '--policy', 'model', '--split', 'train',
                    '--repeats', '1', '--out', str(out)], check=True, stdout=subprocess.DEVNULL)
    from agentrl import store
    return Path(store.data_files(out / 'trajectories')[0])


def grow(src: Path, n: int, dst: Path, row_group: int = 16384) -> None:
    """Write ``n`` rows to ``dst``: the rows of ``src`` repeated, each with a new ``rollout_id`` and digest."""
    from agentrl.store.schema import DIGESTED_COLUMNS, row_digest, content_digest
    base = pq.read_table(src)
    schema = base.schema
    writer = pq.ParquetWriter(dst, schema)
    chunk = 65536
    for lo in range(0, n, chunk):
        k = min(chunk, n - lo)
        t = base.take(pa.array(np.arange(lo, lo + k) % base.num_rows))
        rid = [f'{r}/copy{lo + i}' for i, r in enumerate(t.column('rollout_id').to_pylist())]
        t = t.set_column(schema.get_field_index('rollout_id'), schema.field('rollout_id'), pa.array(rid, pa.string()))
        cells = {c: t.column(c).to_pylist() for c in DIGESTED_COLUMNS}
        old = t.column('digest').to_pylist()
        dig = [row_digest(content_digest(old[i]), {c: cells[c][i] for c in DIGESTED_COLUMNS}) for i in range(k)]
        t = t.set_column(schema.get_field_index('digest'), schema.field('digest'), pa.array(dig, pa.string()))
        writer.write_table(t, row_group_size=row_group)
    writer.close()


def run_check(path: Path, per_record: bool, src: str | None = None) -> dict:
    """`agentrl check PATH` in a fresh interpreter: wall s, exit code, torch imported, peak RSS MiB.
    ``src``: the ``src`` folder of another checkout to import agentrl from (the "before" of a change)."""
    env = dict(os.environ)
    env.pop('AGENTRL_CHECK_PER_RECORD', None)
    if per_record:
        env['AGENTRL_CHECK_PER_RECORD'] = '1'
    if src is not None:
        env['PYTHONPATH'] = src
    t0 = time.perf_counter()
    p = subprocess.Popen([sys.executable, '-c', _GUARD, 'check', str(path)], env=env, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    out, err = p.communicate()
    wall = time.perf_counter() - t0
    src_used = next((line.split(' ', 1)[1] for line in err.splitlines() if line.startswith('AGENTRL ')), '?')
    return {'wall': wall, 'code': p.returncode, 'torch': 'TORCH True' in err, 'out': out, 'agentrl': src_used}


def measured(path: Path, per_record: bool, src: str | None = None) -> dict:
    """:func:`run_check` plus the child's peak RSS (``RUSAGE_CHILDREN`` delta is a max over children, so each
    measurement runs in its own helper process)."""
    code = (f'import json, resource, sys; sys.path[:0] = {sys.path[:1]!r}\n'
            f'from bench_check import run_check\n'
            f'r = run_check(__import__("pathlib").Path({str(path)!r}), {per_record!r}, {src!r})\n'
            f'u = resource.getrusage(resource.RUSAGE_CHILDREN)\n'
            f'r["rss_mib"] = u.ru_maxrss / 1024; r["cpu"] = u.ru_utime + u.ru_stime\n'
            f'print(json.dumps(r))')
    res = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True, check=True,
                         cwd=Path(__file__).parent)
    return json.loads(res.stdout.strip().splitlines()[-1])


#: Child script: bytes per record (tracemalloc) of the check's per-record state for N distinct records: the
#: compact Deduper fed record by record (``see``, both versions have it) and, where it exists, by record batch
#: (``first_repeat`` / ``add_new``, the columnar check), plus the report's lengths and trained tokens.
_STATE = """
import sys, tracemalloc
from types import SimpleNamespace
import numpy as np
from agentrl.checks import Deduper
from agentrl.jobs.check import CheckReport
n, out = int(sys.argv[1]), {}
digest = lambda i: f'{i * 2654435761 % 2**64:016x}{i:016x}'
rec = lambda i: SimpleNamespace(provenance=SimpleNamespace(group_id=f'{i % 97}/model/t{i % 13}',
                                                             rollout_id=f'{i % 97}/model/t{i % 13}/{i}', attempt=1))
tracemalloc.start()
base = tracemalloc.get_traced_memory()[0]
d, rep = Deduper(compact=True), CheckReport(path='x')
for i in range(n):
    d.see(rec(i), where=('part-000000.parquet', i), digest=digest(i))
    rep.lengths.append(300 + i % 200)
    rep.trained.append(100 + i % 100)
now, peak = tracemalloc.get_traced_memory()
out['see'] = ((now - base) / n, (peak - base) / n)
del d, rep
if hasattr(Deduper, 'add_new'):
    from agentrl.checks.identity import digest64, key64
    tracemalloc.reset_peak()
    base = tracemalloc.get_traced_memory()[0]
    d = Deduper(compact=True)
    for lo in range(0, n, 256):
        rows = range(lo, min(lo + 256, n))
        keys = np.array([key64(('id', rec(i).provenance.group_id, rec(i).provenance.rollout_id, 1)) for i in rows],
                        dtype=np.uint64)
        assert d.first_repeat(keys) == len(keys)
        d.add_new(keys, np.array([digest64(digest(i)) for i in rows], dtype=np.uint64), 'part-000000.parquet',
                  np.arange(lo, lo + len(keys)))
    now, peak = tracemalloc.get_traced_memory()
    out['batch'] = ((now - base) / n, (peak - base) / n)
print(out)
"""


def state_bytes(n: int, src: str | None = None) -> dict:
    """``{'see' | 'batch': (bytes/record held, bytes/record at the peak)}`` of :data:`_STATE` for ``n`` records."""
    env = dict(os.environ, **({'PYTHONPATH': src} if src else {}))
    res = subprocess.run([sys.executable, '-c', _STATE, str(n)], capture_output=True, text=True, check=True, env=env)
    return eval(res.stdout.strip().splitlines()[-1])       # a dict of float tuples, printed by _STATE


def _in_process(path: Path, per_record: bool) -> float:
    """CPU seconds of one model-free ``run_check`` of ``path`` in this process."""
    from agentrl.jobs.check import CheckOptions, run_check
    env = os.environ.pop('AGENTRL_CHECK_PER_RECORD', None)
    try:
        if per_record:
            os.environ['AGENTRL_CHECK_PER_RECORD'] = '1'
        t = time.process_time()
        rep = run_check(CheckOptions(path=str(path)))
        assert rep.code == 0, rep.format()
        return time.process_time() - t
    finally:
        os.environ.pop('AGENTRL_CHECK_PER_RECORD', None)
        if env is not None:
            os.environ['AGENTRL_CHECK_PER_RECORD'] = env


def run(quick: bool) -> list[dict]:
    """Rows for bench/run.py: records/s (process CPU) of the model-free check, per record and by columns."""
    n = 2000 if quick else 20000
    tmp = Path(tempfile.mkdtemp(prefix='bench_check_'))
    try:
        data = tmp / 'data.parquet'
        grow(rollout(tmp / 'run'), n, data)
        _in_process(data, False)                   # warm: imports, the word-level tokenizer
        columns = max(n / _in_process(data, False) for _ in range(2))
        per_record = n / _in_process(data, True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    note = f'{n} TinyAgent records, process CPU time, in this process'
    return [{'name': 'check_per_record_rps', 'value': round(per_record), 'unit': 'records/s', 'notes': note},
            {'name': 'check_columnar_rps', 'value': round(columns), 'unit': 'records/s', 'notes': note,
             'target': '>= 20000', 'ok': columns >= 20000}]


def rss(src: Path, sizes: list, before: str | None, state_rows: int) -> None:
    """Peak RSS of the columnar check against the file's rows and row groups, before (``before``: the src folder
    of main's checkout) and after (this checkout), then the per-record state in bytes (:func:`state_bytes`)."""
    print('\n| rows | row groups x rows | file MiB | Arrow table MiB | peak RSS MiB before | peak RSS MiB after '
          '| CPU s before / after | result before / after |')
    print('|---|---|---|---|---|---|---|---|')
    for rows, group in sizes:
        big = src.parent / f'big-{rows}-{group}.parquet'
        grow(src, rows, big, row_group=group)
        table_mib = pq.read_table(big).nbytes / 2**20
        meta = pq.ParquetFile(big).metadata
        b = measured(big, False, before) if before else None
        a = measured(big, False)
        last = lambda r: r['out'].strip().splitlines()[-1] if r else '-'  # noqa: E731
        print(f'| {rows:,} | {meta.num_row_groups} x {group:,} | {big.stat().st_size / 2**20:.0f} | {table_mib:,.0f} '
              f'| '
              f'{b["rss_mib"] if b else float("nan"):,.0f} | {a["rss_mib"]:,.0f} | '
              f'{b["cpu"] if b else float("nan"):.1f} / {a["cpu"]:.1f} | {last(b)} / {last(a)} |  '
              f'(agentrl from {b["agentrl"] if b else "-"} / {a["agentrl"]})', flush=True)
        big.unlink()
    for name, where in (('before', before), ('after', None)):
        if name == 'before' and not before:
            continue
        got = state_bytes(state_rows, where)
        print(f'per-record state {name}, {state_rows:,} records (tracemalloc, bytes/record held, at the peak): '
              + ', '.join(f'{k} {v[0]:.1f}, {v[1]:.1f}' for k, v in got.items()), flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    ap.add_argument('--rows', type=int, default=100_000)
    ap.add_argument('--big-rows', type=int, default=1_000_000)
    ap.add_argument('--skip-big', action='store_true')
    ap.add_argument('--skip-speed', action='store_true', help='skip the per-record vs columnar table')
    ap.add_argument('--rss', metavar='ROWS:GROUP', nargs='+',
                    help='peak RSS of the columnar check per file of ROWS rows in row groups of GROUP rows, e.g. '
                         '250000:16384 1000000:16384 250000:65536')
    ap.add_argument('--before-src', metavar='DIR', help="with --rss: also run main's checkout (its src folder)")
    ap.add_argument('--state-rows', type=int, default=1_000_000, help='with --rss: records of the state measurement')
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix='bench_check_'))
    try:
        src = rollout(tmp / 'run')
        if args.rss:
            rss(src, [tuple(int(v) for v in s.split(':')) for s in args.rss], args.before_src, args.state_rows)
        if args.skip_speed:
            return
        one, data = tmp / 'one.parquet', tmp / 'data.parquet'
        grow(src, 1, one)
        grow(src, args.rows, data)
        print(f'rows {args.rows}, file {data.stat().st_size / 2**20:.1f} MiB, python {sys.version.split()[0]}', flush=True)
        print('| path | start-up wall s (CPU s) | check wall s (CPU s) | records/s by wall (by CPU) | torch imported '
              '| peak RSS MiB | result |')
        print('|---|---|---|---|---|---|---|')
        for name, per_record in (('per record (before)', True), ('by columns (after)', False)):
            starts = [measured(one, per_record) for _ in range(3)]
            start = min(starts, key=lambda r: r['wall'])
            r = measured(data, per_record)
            rate = args.rows / max(r['wall'] - start['wall'], 1e-9)
            rate_cpu = args.rows / max(r['cpu'] - start['cpu'], 1e-9)
            result = r['out'].strip().splitlines()[-1]
            print(f'| {name} | {start["wall"]:.2f} ({start["cpu"]:.2f}) | {r["wall"]:.2f} ({r["cpu"]:.2f}) | '
                  f'{rate:,.0f} ({rate_cpu:,.0f}) | {r["torch"]} | {r["rss_mib"]:.0f} | {result} |', flush=True)
        if not args.skip_big:
            big = tmp / 'big.parquet'
            grow(src, args.big_rows, big)
            table_mib = pq.read_table(big).nbytes / 2**20
            meta = pq.ParquetFile(big).metadata
            r = measured(big, False)
            print(f'\n{args.big_rows} rows ({meta.num_row_groups} row groups of {meta.row_group(0).num_rows}), file '
                  f'{big.stat().st_size / 2**20:.0f} MiB, Arrow table in memory {table_mib:.0f} MiB: columnar check '
                  f'peak RSS {r["rss_mib"]:.0f} MiB, wall {r["wall"]:.1f} s, CPU {r["cpu"]:.1f} s '
                  f'({args.big_rows / r["wall"]:,.0f} records/s end to end), {r["out"].strip().splitlines()[-1]}')
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == '__main__':
    main()
