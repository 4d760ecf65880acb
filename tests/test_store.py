"""L4 store: exact round trip, atomic files, shards that survive SIGKILL, resends stored once."""
import os
import re
import signal
import subprocess
import sys
import textwrap

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agentrl import checks, store
from agentrl.checks import IdentityConflictError, new_attempt
from agentrl.record import Provenance, SamplingSpec, Trajectory


def make(k: int, n_policy: int = 3, group: str = 'g0', attempt: int = 1, reward: float = 1.0, **prov):
    """A small valid record: bos, 2 prompt tokens, n_policy sampled tokens, one tool token."""
    ids = [1, 10 + k, 11 + k] + [20 + j for j in range(n_policy)] + [30]
    owner = ['template', 'prompt', 'prompt'] + ['policy'] * n_policy + ['tool']
    turn = [-1, -1, -1] + [0] * n_policy + [0]
    logp = [0.0, 0.0, 0.0] + [-0.1 * (j + 1) - k / 7 for j in range(n_policy)] + [0.0]
    p = Provenance(policy='model', tokenizer='tokfp', template='tplfp', sampling=SamplingSpec(0.7),
                   model='tiny', group_id=group, rollout_id=f'r{k}', attempt=attempt, seed=k, **prov)
    return Trajectory.from_tokens(ids, owner, turn, logp, reward, {'task': f'task{k}', 'stop': 'solved'},
                                  provenance=p)


def bits(t):
    return None if t is None else t.view(torch.int32).tolist() if t.dtype == torch.float32 else t.tolist()


def assert_same(a: Trajectory, b: Trajectory):
    assert a.ids.tolist() == b.ids.tolist() and b.ids.dtype == torch.int64
    assert bits(a.action_mask) == bits(b.action_mask) and b.action_mask.dtype == torch.float32
    assert bits(a.sample_logp) == bits(b.sample_logp) and b.sample_logp.dtype == torch.float32
    assert bits(a.owner) == bits(b.owner) and bits(a.turn) == bits(b.turn)
    assert repr(a.reward) == repr(b.reward)
    assert a.info == b.info
    assert a.provenance == b.provenance


# ------------------------------------------------------------------------------ round trip

f32 = st.floats(width=32, allow_nan=True, allow_infinity=True)


@st.composite
def any_record(draw):
    T = draw(st.integers(1, 40))
    ids = draw(st.lists(st.integers(-2**31, 2**31 - 1), min_size=T, max_size=T))
    owner = draw(st.lists(st.integers(0, 3), min_size=T, max_size=T))
    turn = draw(st.lists(st.integers(-1, 2**31 - 1), min_size=T, max_size=T))
    mask = draw(st.lists(st.sampled_from([0.0, 1.0]), min_size=T - 1, max_size=T - 1))
    logp = draw(st.lists(f32, min_size=T - 1, max_size=T - 1))
    reward = draw(st.floats(allow_nan=False))
    info = draw(st.dictionaries(st.text(max_size=5), st.one_of(st.integers(-10, 10), st.text(max_size=5),
                                                                 st.booleans(), st.none()), max_size=3))
    prov = draw(st.one_of(st.none(), st.builds(
        Provenance, policy=st.text(max_size=4), tokenizer=st.text(max_size=4),
        sampling=st.one_of(st.none(), st.builds(SamplingSpec, temperature=st.floats(0.01, 3),
                                                top_k=st.integers(0, 50), top_p=st.floats(0.05, 1.0),
                                                min_p=st.floats(0.0, 0.9),
                                                logp_mode=st.sampled_from(['raw', 'processed']))),
        logp_placeholder=st.booleans(), group_id=st.text(max_size=4), rollout_id=st.text(max_size=4),
        attempt=st.integers(1, 5), seed=st.one_of(st.none(), st.integers(0, 2**62)))))
    keep_owner = draw(st.booleans())
    return Trajectory(ids=torch.tensor(ids, dtype=torch.long), action_mask=torch.tensor(mask),
                      sample_logp=torch.tensor(logp, dtype=torch.float32), reward=reward, info=info,
                      owner=torch.tensor(owner) if keep_owner else None,
                      turn=torch.tensor(turn) if keep_owner else None, provenance=prov)


@settings(deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(recs=st.lists(any_record(), min_size=1, max_size=5))
def test_round_trip_bit_exact(tmp_path, recs):
    path = tmp_path / 'rt.parquet'
    store.write_trajectories(path, recs, fsync=False)
    back = store.read_trajectories(path)
    assert len(back) == len(recs)
    for a, b in zip(recs, back):
        assert_same(a, b)


def test_round_trip_fields_and_columns(tmp_path):
    recs = [make(k) for k in range(3)]
    recs[1].turn_contexts = [(3, torch.tensor([1, 2, 3]))]
    path = store.write_trajectories(tmp_path / 'a.parquet', recs)
    back = store.read_trajectories(path)
    for a, b in zip(recs, back):
        assert_same(a, b)
    assert back[1].turn_contexts[0][0] == 3 and back[1].turn_contexts[0][1].tolist() == [1, 2, 3]
    table = pq.read_table(path)  # pyarrow alone
    assert table.schema.metadata[b'agentrl.schema_version'] == b'1'
    assert table.column('task').to_pylist() == ['task0', 'task1', 'task2']
    assert table.column('policy').to_pylist() == ['model'] * 3
    assert table.column('rollout_id').to_pylist() == ['r0', 'r1', 'r2']
    assert table.schema.field('sample_logp').type == pa.list_(pa.field('item', pa.float32(), nullable=False))
    assert table.schema.field('ids').type.value_type == pa.int32()


def test_write_refuses_bad_records(tmp_path):
    bad = make(0)
    bad.action_mask = bad.action_mask * 0.5
    with pytest.raises(ValueError, match='action_mask has values other than 0 and 1'):
        store.write_trajectories(tmp_path / 'x.parquet', [bad])
    bad = make(0)
    bad.info['obj'] = object()
    with pytest.raises(ValueError, match='record 0 info is not JSON-serialisable'):
        store.write_trajectories(tmp_path / 'x.parquet', [bad])
    with pytest.raises(ValueError, match='is a folder'):
        store.write_trajectories(tmp_path, [make(0)])
    assert os.listdir(tmp_path) == []  # nothing half-written left behind


def test_read_refuses_foreign_or_newer_files(tmp_path):
    pq.write_table(pa.table({'ids': [[1, 2]]}), tmp_path / 'foreign.parquet')
    with pytest.raises(ValueError, match='not an agentrl trajectory file'):
        store.read_trajectories(tmp_path / 'foreign.parquet')
    t = store.to_table([make(0)])
    t = t.replace_schema_metadata({b'agentrl.schema_version': b'99'})
    pq.write_table(t, tmp_path / 'new.parquet')
    with pytest.raises(ValueError, match='newer than this agentrl reads'):
        store.read_trajectories(tmp_path / 'new.parquet')
    with pytest.raises(FileNotFoundError):
        store.read_trajectories(tmp_path / 'missing')


def test_read_refuses_damaged_metadata_and_non_utf8_names(tmp_path):
    """A footer byte flipped in a column name, or a file name that is not UTF-8: one line naming the file."""
    import re as _re
    import struct
    f = tmp_path / 'part-000000.parquet'
    store.write_trajectories(f, [make(0), make(1)])
    b = bytearray(f.read_bytes())
    footer = len(b) - 8 - struct.unpack('<i', b[-8:-4])[0]
    b[b.index(b'reward', footer)] = 0xff                  # a column path in the footer, read as UTF-8
    f.write_bytes(bytes(b))
    with pytest.raises(ValueError, match='^' + _re.escape(
            f"{str(f)!r} is damaged: its Parquet metadata is not UTF-8 (byte 0xff in a column name or key); re-run "
            "the rollout that wrote it, or remove the file") + '$'):
        store.read_trajectories(tmp_path)
    f.unlink()
    store.write_trajectories(f, [make(0)])
    os.rename(f, os.path.join(os.fsencode(tmp_path), b'part-\xff.parquet'))
    name = str(tmp_path / 'part-\udcff.parquet')
    with pytest.raises(ValueError, match='^' + _re.escape(
            f"{name!r}: the file name is not valid UTF-8; rename it (shards are named part-NNNNNN.parquet) or move "
            "it out of the folder") + '$'):
        store.read_trajectories(tmp_path)


def test_overwrite_is_whole_file(tmp_path):
    path = tmp_path / 'a.parquet'
    store.write_trajectories(path, [make(0)])
    store.write_trajectories(path, [make(1), make(2)])
    assert [t.provenance.rollout_id for t in store.read_trajectories(path)] == ['r1', 'r2']
    assert sorted(os.listdir(tmp_path)) == ['a.parquet']


# ------------------------------------------------------------------------------ shards

def test_shards_stream_and_dedupe(tmp_path):
    d = tmp_path / 'ds'
    w = store.ShardWriter(d, fsync=False)
    batch0 = [make(k) for k in range(5)]
    assert w.write(batch0).name == 'part-000000.parquet'
    assert w.write(batch0) is None                      # a resent batch is stored once
    assert w.write([make(k) for k in range(3, 8)]).name == 'part-000001.parquet'  # 3, 4 resent
    assert (w.n_written, w.n_resent) == (8, 7)
    retry = make(2, reward=0.0)
    retry.provenance = new_attempt(batch0[2])           # a retry is a new attempt: a new row
    assert w.write([retry]).name == 'part-000002.parquet'
    clash = make(2, reward=0.0)                          # same identity, new content: refused
    with pytest.raises(IdentityConflictError, match=r'g0/r2#1 is already taken.*new_attempt'):
        w.write([clash])
    back = store.read_trajectories(d)
    keys = [(t.provenance.rollout_id, t.provenance.attempt) for t in back]
    assert keys == [(f'r{k}', 1) for k in range(8)] + [('r2', 2)]
    # streaming crosses shard boundaries and keeps the order
    sizes = [len(b) for b in store.iter_batches(d, batch_size=4)]
    assert sizes == [4, 4, 1]
    streamed = [t for b in store.iter_batches(d, 4) for t in b]
    for a, b in zip(back, streamed):
        assert_same(a, b)
    # a writer opened later continues numbering and still knows what is stored
    w2 = store.ShardWriter(d, fsync=False)
    assert w2.write(batch0 + [retry]) is None
    assert w2.write([make(9)]).name == 'part-000003.parquet'
    with pytest.raises(ValueError, match='batch_size must be >= 1'):
        next(store.iter_batches(d, 0))


def test_anonymous_records_dedupe_by_content(tmp_path):
    a = make(0)
    a.provenance = None
    b = make(1)
    b.provenance = None
    w = store.ShardWriter(tmp_path, fsync=False)
    w.write([a, b, a])
    assert len(store.read_trajectories(tmp_path)) == 2


def _old_rule_file(path, recs):
    """A file as agentrl wrote it before digest version 2: the bare content digest in ``digest``."""
    t = store.to_table(recs)
    old = [checks.record_digest(r) for r in recs]
    t = t.set_column(t.schema.get_field_index('digest'), t.schema.field('digest'), pa.array(old, pa.string()))
    pq.write_table(t, path)
    return old


def test_digest_v2_covers_provenance_info_and_turn_contexts(tmp_path):
    recs = [make(0), make(1)]
    path = tmp_path / 'a.parquet'
    store.write_trajectories(path, recs)
    t = pq.read_table(path)
    d = t.column('digest').to_pylist()
    assert [x[:3] for x in d] == ['v2:', 'v2:'] and [len(x) for x in d] == [68, 68]
    assert [store.content_digest(x) for x in d] == [checks.record_digest(r) for r in recs]
    edits = {'policy': 'other', 'sampling': '{"temperature": 1.0}', 'group_id': 'g9', 'tokenizer': 'x',
             'model': 'big', 'attempt': 7, 'seed': 3, 'logp_placeholder': True, 'info': '{"task": "task1"}',
             'task': 'task9', 'template': 't', 'rollout_id': 'r9', 'agentrl_version': '0', 'turn_contexts': '[]'}
    for name, value in edits.items():
        col = t.column(name).to_pylist()
        col[1] = value
        i = t.schema.get_field_index(name)
        pq.write_table(t.set_column(i, t.schema.field(i), pa.array(col, t.schema.field(i).type)), path)
        msg = (f"'{path}' row 1: digest: the stored digest {d[1][:12]}... does not match the row's content "
               '(ids, owner, turn, action_mask, sample_logp, reward, provenance, task, info, turn_contexts): the '
               'row was edited after writing. Fix: re-run the rollout for this episode; never edit a stored '
               'record in place')
        with pytest.raises(checks.DigestMismatchError, match=f'^{re.escape(msg)}$'):
            store.read_trajectories(path)
        assert len(store.read_trajectories(path, verify=False)) == 2


def test_files_with_the_old_digest_rule_still_verify(tmp_path):
    recs = [make(0), make(1)]
    path = tmp_path / 'old.parquet'
    old = _old_rule_file(path, recs)
    for a, b in zip(recs, store.read_trajectories(path)):
        assert_same(a, b)
    (tmp_path / 'ds').mkdir()                               # an old shard's records are still known as stored
    _old_rule_file(tmp_path / 'ds' / 'part-000000.parquet', recs)
    w = store.ShardWriter(tmp_path / 'ds', fsync=False)
    assert w.write(recs) is None and w.n_resent == 2
    t = pq.read_table(path)
    col = t.column('reward').to_pylist()
    col[0] = 5.0
    pq.write_table(t.set_column(t.schema.get_field_index('reward'), t.schema.field('reward'),
                                pa.array(col, pa.float64())), path)
    msg = (f"'{path}' row 0: digest: the stored digest {old[0][:12]}... does not match the row's content (ids, "
           'owner, turn, action_mask, sample_logp, reward): the row was edited after writing. Fix: re-run the '
           'rollout for this episode; never edit a stored record in place')
    with pytest.raises(checks.DigestMismatchError, match=f'^{re.escape(msg)}$'):
        store.read_trajectories(path)


def test_datasets_and_pyarrow_load(tmp_path):
    datasets = pytest.importorskip('datasets')
    d = tmp_path / 'ds'
    w = store.ShardWriter(d, fsync=False)
    w.write([make(k) for k in range(3)])
    w.write([make(k) for k in range(3, 5)])
    (d / '.part-000002.parquet.tmp-1-deadbeef').write_bytes(b'PAR1 half a shard')  # invisible
    assert pq.read_table(d).num_rows == 5
    ds = datasets.load_dataset('parquet', data_files=store.data_files(d), split='train',
                               cache_dir=str(tmp_path / 'hf'))
    assert ds.num_rows == 5
    assert ds[0]['ids'] == make(0).ids.tolist()
    assert ds[4]['rollout_id'] == 'r4' and ds[4]['task'] == 'task4'
    assert torch.tensor(ds[1]['sample_logp'], dtype=torch.float32).tolist() == make(1).sample_logp.tolist()


CHILD = textwrap.dedent('''
    import os, sys, time
    import agentrl.store.write as st   # the writer's module: _write_temp is patched below
    sys.path.insert(0, sys.argv[2])
    from test_store import make
    mode = sys.argv[3]
    w = st.ShardWriter(sys.argv[1])
    if mode == 'hook':
        for k in range(3):
            w.write([make(4 * k + i) for i in range(4)])
        real = st._write_temp
        def half_then_hang(table, tmp, fsync):
            real(table, tmp, fsync)
            with open(tmp, 'r+b') as f:
                f.truncate(os.path.getsize(tmp) // 2)
            print('mid-shard', tmp, flush=True)
            time.sleep(60)
        st._write_temp = half_then_hang
        w.write([make(12 + i) for i in range(4)])
    else:
        k = 0
        while True:
            w.write([make(1000 * k + i, n_policy=50) for i in range(200)])
            print('shard', k, flush=True)
            k += 1
''')


def _spawn(tmp_path, mode):
    script = tmp_path / 'child.py'
    script.write_text(CHILD)
    return subprocess.Popen([sys.executable, str(script), str(tmp_path / 'ds'), os.path.dirname(__file__), mode],
                            stdout=subprocess.PIPE, text=True)


def test_sigkill_mid_shard_leaves_earlier_shards(tmp_path):
    proc = _spawn(tmp_path, 'hook')
    line = proc.stdout.readline()
    assert line.startswith('mid-shard'), line
    tmp = line.split()[1]
    assert os.path.exists(tmp)                      # the partial shard exists, hidden
    proc.send_signal(signal.SIGKILL)
    proc.wait(120)
    d = tmp_path / 'ds'
    assert [os.path.basename(f) for f in store.data_files(d)] == [f'part-{i:06d}.parquet' for i in range(3)]
    back = store.read_trajectories(d)
    assert [t.provenance.rollout_id for t in back] == [f'r{k}' for k in range(12)]
    assert pq.read_table(d).num_rows == 12         # pyarrow's own folder reader skips the temp file
    w = store.ShardWriter(d, fsync=False)           # restart: stale temp removed, numbering continues
    assert not os.path.exists(tmp)
    assert w.write([make(8 + i) for i in range(8)]).name == 'part-000003.parquet'  # 8..11 resent
    assert w.n_resent == 4 and len(store.read_trajectories(d)) == 16


def test_sigkill_at_random_moment(tmp_path):
    proc = _spawn(tmp_path, 'loop')
    for _ in range(2):
        assert proc.stdout.readline().startswith('shard')
    proc.send_signal(signal.SIGKILL)              # lands somewhere inside a later write
    proc.wait(120)
    files = store.data_files(tmp_path / 'ds')
    assert len(files) >= 2
    for f in files:                                 # every visible shard is complete
        assert pq.read_metadata(f).num_rows == 200
    assert len(store.read_trajectories(tmp_path / 'ds')) == 200 * len(files)


def test_ids_outside_the_column_range_name_the_record(tok, tasks):
    import agentrl as arl
    good = arl.scripted_rollout(arl.scripted_policy('oracle'), arl.BugFixEnv(), tasks[0], tok)
    bad = arl.scripted_rollout(arl.scripted_policy('oracle'), arl.BugFixEnv(), tasks[1], tok)
    bad.ids[3] = 2 ** 40
    with pytest.raises(ValueError, match=r'^store: record 1 field ids has values outside \[-2147483648, 2147483647\]'):
        store.to_table([good, bad])
    assert store.to_table([good]).num_rows == 1


def test_scan_rows_carry_the_digest_they_were_verified_with(tmp_path):
    """StoredRow.digest is checks.record_digest of its record (no second hash needed); None without verify."""
    recs = [make(k) for k in range(3)]
    store.write_trajectories(tmp_path / 'a.parquet', recs)
    rows = [r for batch in store.scan(tmp_path / 'a.parquet', 2) for r in batch]
    assert [r.digest for r in rows] == [checks.record_digest(t) for t in recs]
    assert all(len(r.digest) == 32 for r in rows)
    assert [r.digest for batch in store.scan(tmp_path / 'a.parquet', verify=False) for r in batch] == [None] * 3
