"""The check's memory (docs/design.md#bounds): per-record state of a few tens of bytes (the compact
:class:`agentrl.checks.Deduper`, the report's ``array('i')`` lists), and a row group within
``AGENTRL_MAX_ROW_GROUP_BYTES`` that this process has no memory for is one line naming it.
"""
from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tracemalloc
from array import array
from types import SimpleNamespace

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given
from hypothesis import strategies as st

from agentrl import store
from agentrl.checks import Deduper
from agentrl.checks.identity import dedupe_key, digest64, key64
from agentrl.cli.main import main
from agentrl.jobs.check import CheckReport
from agentrl.jobs.check_columnar import PER_RECORD_ENV
from agentrl.store.read import _footer_bytes


def _rec(group: str, rollout: str, attempt: int = 1):
    return SimpleNamespace(provenance=SimpleNamespace(group_id=group, rollout_id=rollout, attempt=attempt))


def _digest(content: int) -> str:
    """A content digest as :func:`agentrl.checks.record_digest` gives one (32 hex digits of sha256)."""
    return hashlib.sha256(str(content).encode()).hexdigest()[:32]


# One stored row: (group, rollout, content); an empty group and rollout is an anonymous row (keyed by digest).
row = st.tuples(st.sampled_from(['', 'g', 'g2']), st.sampled_from(['', 'r', 'r2', 'g/3']), st.integers(0, 3))


@given(batches=st.lists(st.lists(row, max_size=6), max_size=5), split=st.integers(0, 6))
def test_the_compact_deduper_gives_the_dict_verdicts(batches, split):
    """Record batches fed to a compact Deduper as the columnar check feeds it (the rows before the first repeat
    at once, then the repeat and the rest one by one) give the dict Deduper's verdicts and first places."""
    ref, compact = Deduper(), Deduper(compact=True)
    for b, rows in enumerate(batches):
        recs = [(_rec(g, r), _digest(c), ('f.parquet', 10 * b + i)) for i, (g, r, c) in enumerate(rows)]
        want = [ref.see(rec, where=w, digest=d) for rec, d, w in recs]
        keys = np.array([key64(dedupe_key(rec, d)) for rec, d, _ in recs], dtype=np.uint64)
        n = min(compact.first_repeat(keys), split)
        first_new = next((i for i, v in enumerate(want) if v[0] != Deduper.NEW), len(want))
        assert compact.first_repeat(keys) == first_new
        compact.add_new(keys[:n], np.array([digest64(d) for _, d, _ in recs[:n]], dtype=np.uint64), 'f.parquet',
                        np.array([w[1] for _, _, w in recs[:n]]))
        got = [(Deduper.NEW, w) for _, _, w in recs[:n]] + [compact.see(rec, where=w, digest=d)
                                                               for rec, d, w in recs[n:]]
        assert got == want
    assert len(compact.seen) == len(ref.seen)


def test_the_compact_deduper_keeps_its_api():
    d = Deduper(compact=True)
    assert d.see(_rec('g', 'r'), where=('a.parquet', 3), digest=_digest(7)) == ('new', ('a.parquet', 3))
    assert d.see(_rec('g', 'r'), where=None, digest=_digest(7)) == ('resend', ('a.parquet', 3))
    assert d.see(_rec('g', 'r'), where=('b.parquet', 0), digest=_digest(8)) == ('conflict', ('a.parquet', 3))
    assert d.see(_rec('g', 'r', 2), where='anywhere', digest=_digest(7)) == ('new', 'anywhere')
    assert d.see(_rec('g', 'r', 2), digest=_digest(7)) == ('resend', 'anywhere')     # a where that does not pack
    assert d.see(_rec('', ''), digest=_digest(9)) == ('new', None)
    assert d.see(_rec('', ''), where=('c', 1), digest=_digest(9)) == ('resend', None)
    key = key64(('id', 'g', 'r', 1))
    assert d.repeats == 4 and len(d.seen) == 3 and d.seen[key] == _digest(7)[:16] and key in d.seen
    assert key64(('id', 'g', 'r', 1)) == 0x4b3efe3fd255ba4d              # blake2b: the same in every process
    assert key64(('id', 'g\x00', 'r', 1)) != key64(('id', 'g', '\x00r', 1))
    with pytest.raises(ValueError, match=r'compact Deduper keeps its own arrays; pass seen only without compact'):
        Deduper({}, compact=True)
    with pytest.raises(ValueError, match=r'Deduper.first_repeat needs Deduper\(compact=True\)'):
        Deduper().first_repeat(np.zeros(1, dtype=np.uint64))
    with pytest.raises(ValueError, match=r'Deduper.add_new: rows must lie in \[0, 2\*\*40\)'):
        d.add_new(np.ones(1, dtype=np.uint64), np.ones(1, dtype=np.uint64), 'a', np.array([-1]))


def test_the_per_record_state_is_a_few_tens_of_bytes():
    """100k records through the columnar check's calls: the Deduper holds 24 bytes a record (at most 40 while
    merging), the report's lengths and trained tokens 4 bytes each."""
    n = 100_000
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        d = Deduper(compact=True)
        for lo in range(0, n, 256):
            rows = np.arange(lo, min(lo + 256, n))
            keys = np.array([key64(('id', 'g', f'r{i}', 1)) for i in rows.tolist()], dtype=np.uint64)
            assert d.first_repeat(keys) == len(keys)
            d.add_new(keys, rows.astype(np.uint64) * 7919, 'part-000000.parquet', rows)
        held, peak = (v - base for v in tracemalloc.get_traced_memory())
        rep = CheckReport(path='x')
        base = tracemalloc.get_traced_memory()[0]
        for i in range(n):
            rep.lengths.append(300 + i % 1000)
            rep.trained.append(i % 300)
        report = tracemalloc.get_traced_memory()[0] - base
    finally:
        tracemalloc.stop()
    assert 24 <= held / n <= 26 and peak / n <= 40, (held / n, peak / n)
    assert isinstance(rep.lengths, array) and 8 <= report / n <= 10, report / n
    assert d.see(_rec('g', 'r123'), digest=_digest(0))[1] == ('part-000000.parquet', 123)


# ----------------------------------------------------------------------------- a row group this process cannot hold

_CHILD = r'''
import resource, sys
from agentrl.cli.main import main

def vm_bytes():
    for line in open('/proc/self/status'):
        if line.startswith('VmSize:'):
            return int(line.split()[1]) * 1024

small, big, margin = sys.argv[1], sys.argv[2], int(sys.argv[3])
assert main(['check', small]) == 0        # warm: every import, thread and allocator arena of a check
soft, hard = resource.getrlimit(resource.RLIMIT_AS)
resource.setrlimit(resource.RLIMIT_AS, (vm_bytes() + margin, hard))
print('CONTROL', main(['check', small]), flush=True)          # the same check still fits under the limit
sys.exit(main(['check', big]))
'''
_HUGE = 256 << 20             # one info cell of 256 MiB: within the 1 GiB bound, 4x the 64 MiB left to the process


@pytest.fixture(scope='module')
def files(tmp_path_factory):
    """A clean 6-row run and the same rows in row groups of 3 with row 3's ``info`` 256 MiB of 'a' (lz4: 1 MiB)."""
    d = tmp_path_factory.mktemp('mem')
    assert main(['rollout', '--policy', 'oracle', '--split', 'heldout', '--repeats', '1', '--out', str(d / 'run')]) == 0
    small = store.data_files(d / 'run' / 'trajectories')[0]
    t = pq.read_table(small)
    info = t.column('info').to_pylist()
    huge = pa.StringArray.from_buffers(1, pa.py_buffer(np.array([0, _HUGE], dtype=np.int32)),
                                       pa.py_buffer(np.full(_HUGE, ord('a'), dtype=np.uint8)))
    column = pa.concat_arrays([pa.array(info[:3], pa.string()), huge, pa.array(info[4:], pa.string())])
    big = str(d / 'big.parquet')
    pq.write_table(t.set_column(t.schema.get_field_index('info'), t.schema.field('info'), column), big,
                   row_group_size=3, compression='lz4', use_dictionary=False, write_statistics=False)
    return small, big


@pytest.mark.parametrize('pool, per_record', [('', False), ('system', False), ('', True)],
                         ids=['columnar', 'columnar-system-pool', 'per-record'])
def test_a_row_group_without_memory_is_one_line_naming_it(files, pool, per_record):
    """`agentrl check BIG` with 64 MiB of address space left (RLIMIT_AS over the warm process's own size): row
    group 1 (its 256 MiB cell) cannot be decoded (system allocator) or made a Python string (Arrow's default
    pool, whose reserved arena holds the decoded batch): exit 2 and one line naming file, row group and fix."""
    small, big = files
    env = dict(os.environ, MALLOC_ARENA_MAX='1', ARROW_DEFAULT_MEMORY_POOL=pool)
    for name in [PER_RECORD_ENV, 'AGENTRL_MAX_ROW_GROUP_BYTES'] + (['ARROW_DEFAULT_MEMORY_POOL'] if not pool else []):
        env.pop(name, None)
    if per_record:
        env[PER_RECORD_ENV] = '1'
    env['AGENTRL_MAX_CELL_BYTES'] = str(1 << 30)      # the 256 MiB cell passes the per-cell bound: memory runs out
    res = subprocess.run([sys.executable, '-c', _CHILD, small, big, str(64 << 20)], capture_output=True, text=True,
                         env=env, timeout=300)
    rg = pq.ParquetFile(big).metadata.row_group(1)
    assert 'CONTROL 0' in res.stdout, res.stdout[-2000:] + res.stderr[-2000:]
    assert (res.returncode, res.stderr) == (2, (
        f"agentrl: error: out of memory: {big!r} row group 1 (3 rows, {_footer_bytes(rg, 1 << 30)[0]} bytes decoded "
        'by its footer) does not fit in the memory this process may use; raise its memory limit, or lower '
        'AGENTRL_MAX_ROW_GROUP_BYTES (now 1073741824) to refuse such files\n')), res.stderr[-3000:]
