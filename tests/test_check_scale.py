"""The gate at scale: the model-free check by columns gives the per-record verdicts,
and model-free commands run without importing torch.

The per-record rules (:func:`agentrl.checks.find_problems`, :func:`agentrl.store.scan`) are the reference:
``AGENTRL_CHECK_PER_RECORD=1`` selects them; the columnar path is :mod:`agentrl.jobs.check_columnar`.
"""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given
from hypothesis import strategies as st

from agentrl import checks, store
from agentrl.checks.columnar import COVERED_RULES, covers
from agentrl.checks.identity import digest_arrays
from agentrl.cli.main import main
from agentrl.jobs.check import CheckOptions, run_check
from agentrl.jobs.check_columnar import PER_RECORD_ENV
from agentrl.store.schema import DIGESTED_COLUMNS, row_digest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope='module')
def run_dir(tmp_path_factory):
    """`agentrl rollout --policy model --split heldout --repeats 1 --out d`: 6 TinyAgent records."""
    d = tmp_path_factory.mktemp('scale') / 'd'
    assert main(['rollout', '--policy', 'model', '--split', 'heldout', '--repeats', '1', '--out', str(d)]) == 0
    return d


@pytest.fixture(scope='module')
def base(run_dir) -> pa.Table:
    return pq.read_table(store.data_files(run_dir / 'trajectories')[0])


def resign(t: pa.Table, i: int) -> pa.Table:
    """Row ``i`` with a fresh stored digest for its (edited) content, so the acceptance rules see the edit."""
    d = t.slice(i, 1).to_pylist()[0]
    arrays = {f: None if d.get(f) is None else np.array(d[f]) for f in ('ids', 'owner', 'turn', 'action_mask',
                                                                          'sample_logp')}
    reward = d['reward']
    if reward is None or any(a is not None and a.dtype == object for a in arrays.values()):
        return t                      # a null reward or token: nothing to sign
    digest = row_digest(digest_arrays(arrays, float(reward)), {c: d.get(c) for c in DIGESTED_COLUMNS})
    return set_cell(t, 'digest', i, digest)


def set_cell(t: pa.Table, name: str, i: int, value) -> pa.Table:
    col = t.column(name).to_pylist()
    col[i] = value
    j = t.schema.get_field_index(name)
    return t.set_column(j, t.schema.field(j), pa.array(col, type=t.schema.field(j).type))


def edit_list(t: pa.Table, name: str, i: int, fn) -> pa.Table:
    v = t.column(name)[i].as_py()
    return set_cell(t, name, i, fn(list(v)))


def _at(v: list, k: int) -> int:
    return k % max(len(v), 1)


# Each mutation: (name, function(table, row, k) -> table). Most re-sign the row, so the rule behind the
# edit (not the digest) is what refuses it; 'digest' and 'unsigned' edits leave the stored digest stale.
MUTATIONS = {
    'flip_owner': lambda t, i, k: resign(edit_list(t, 'owner', i, lambda v: v[:_at(v, k)] + [(v[_at(v, k)] + 1 + k % 3) % 4]
                                                   + v[_at(v, k) + 1:]), i),
    'bad_owner_code': lambda t, i, k: resign(edit_list(t, 'owner', i, lambda v: v[:_at(v, k)] + [7] + v[_at(v, k) + 1:]), i),
    'mask_shift_left': lambda t, i, k: resign(edit_list(t, 'action_mask', i, lambda v: v[1:] + [0]), i),
    'mask_shift_right': lambda t, i, k: resign(edit_list(t, 'action_mask', i, lambda v: [0] + v[:-1]), i),
    'mask_value_2': lambda t, i, k: resign(edit_list(t, 'action_mask', i, lambda v: v[:_at(v, k)] + [2] + v[_at(v, k) + 1:]), i),
    'mask_flip': lambda t, i, k: resign(edit_list(t, 'action_mask', i, lambda v: v[:_at(v, k)] + [1 - v[_at(v, k)]]
                                                  + v[_at(v, k) + 1:]), i),
    'logp_nan': lambda t, i, k: resign(edit_list(t, 'sample_logp', i, lambda v: v[:_at(v, k)] + [float('nan')]
                                                 + v[_at(v, k) + 1:]), i),
    'logp_inf': lambda t, i, k: resign(edit_list(t, 'sample_logp', i, lambda v: v[:_at(v, k)] + [float('-inf')]
                                                 + v[_at(v, k) + 1:]), i),
    'logp_positive': lambda t, i, k: resign(edit_list(t, 'sample_logp', i, lambda v: v[:_at(v, k)] + [0.5]
                                                      + v[_at(v, k) + 1:]), i),
    'id_negative': lambda t, i, k: resign(edit_list(t, 'ids', i, lambda v: v[:_at(v, k)] + [-3] + v[_at(v, k) + 1:]), i),
    'id_past_vocab': lambda t, i, k: resign(edit_list(t, 'ids', i, lambda v: v[:_at(v, k)] + [10 ** 6] + v[_at(v, k) + 1:]), i),
    'id_pad_tail': lambda t, i, k: resign(edit_list(t, 'ids', i, lambda v: v[:-1] + [0]), i),
    'id_edit_unsigned': lambda t, i, k: edit_list(t, 'ids', i, lambda v: v[:_at(v, k)] + [v[_at(v, k)] ^ 1]
                                                  + v[_at(v, k) + 1:]),
    'digest': lambda t, i, k: set_cell(t, 'digest', i, t.column('digest')[i].as_py()[:-1] + 'x'),
    'digest_null': lambda t, i, k: set_cell(t, 'digest', i, None),
    'reward_nan': lambda t, i, k: resign(set_cell(t, 'reward', i, float('nan')), i),
    'reward_null': lambda t, i, k: set_cell(t, 'reward', i, None),
    'reward_changed': lambda t, i, k: resign(set_cell(t, 'reward', i, 1.0 + k), i),
    'attempt_null': lambda t, i, k: resign(set_cell(t, 'attempt', i, None), i),
    'sampling_null': lambda t, i, k: resign(set_cell(t, 'sampling', i, None), i),
    'sampling_bad': lambda t, i, k: resign(set_cell(t, 'sampling', i, '{"temperature": -1}'), i),
    'placeholder': lambda t, i, k: resign(set_cell(t, 'logp_placeholder', i, True), i),
    'tokenizer': lambda t, i, k: resign(set_cell(t, 'tokenizer', i, 'another-tokenizer'), i),
    'info_not_object': lambda t, i, k: resign(set_cell(t, 'info', i, '[1, 2]'), i),
    'info_bad_json': lambda t, i, k: resign(set_cell(t, 'info', i, '{"stop": '), i),
    'info_truncated': lambda t, i, k: resign(set_cell(t, 'info', i, '{"stop": "truncated"}'), i),
    'version_int': lambda t, i, k: resign(set_cell(t, 'policy_version', i, str(k)), i),
    'version_bad': lambda t, i, k: resign(set_cell(t, 'policy_version', i, '[1.5]'), i),
    'turn_versions': lambda t, i, k: resign(set_cell(t, 'turn_policy_versions', i, '[1, 2]'), i),
    'rollout_id': lambda t, i, k: resign(set_cell(t, 'rollout_id', i, f'other/{k}'), i),
    'duplicate': lambda t, i, k: pa.concat_tables([t, t.slice(i, 1)]),
    'conflict': lambda t, i, k: pa.concat_tables([t, resign(set_cell(t.slice(i, 1), 'reward', 0, 5.0), 0)]),
    'anonymous_twin': lambda t, i, k: pa.concat_tables(
        [t, resign(set_cell(set_cell(t.slice(i, 1), 'group_id', 0, ''), 'rollout_id', 0, ''), 0)] * 2),
    'short_mask': lambda t, i, k: resign(edit_list(t, 'action_mask', i, lambda v: v[:-1]), i),
    'null_item': lambda t, i, k: null_item(t, i),
}


def null_item(t: pa.Table, i: int) -> pa.Table:
    """Row ``i``'s last id null (the column's items made nullable, as pandas round trips leave them)."""
    col = t.column('ids').to_pylist()
    col[i] = col[i][:-1] + [None]
    j = t.schema.get_field_index('ids')
    return t.set_column(j, pa.field('ids', pa.list_(pa.int32())), pa.array(col, type=pa.list_(pa.int32())))

mutation = st.tuples(st.sampled_from(sorted(MUTATIONS)), st.integers(0, 5), st.integers(0, 200))


def both(path, **kw):
    """The per-record report and the columnar one of ``agentrl check path`` (formatted, exit code)."""
    out = []
    for per_record in (True, False):
        mp = pytest.MonkeyPatch()
        mp.setenv(PER_RECORD_ENV, '1') if per_record else mp.delenv(PER_RECORD_ENV, raising=False)
        try:
            rep = run_check(CheckOptions(path=str(path), examples=1000, **kw))
        finally:
            mp.undo()
        out.append((rep.format(), rep.code, rep.examples))
    return out


@given(edits=st.lists(mutation, min_size=1, max_size=4), shards=st.integers(1, 3), batch=st.sampled_from([2, 5, 256]))
def test_columnar_check_gives_the_per_record_verdicts(base, tmp_path_factory, edits, shards, batch):
    t = base
    for name, row, k in edits:
        t = MUTATIONS[name](t, row % t.num_rows, k)
    d = tmp_path_factory.mktemp('mut')
    bounds = np.linspace(0, t.num_rows, shards + 1).astype(int)
    for s in range(shards):
        pq.write_table(t.slice(bounds[s], bounds[s + 1] - bounds[s]), d / f'part-{s:06d}.parquet')
    (ref, ref_code, ref_ex), (col, col_code, col_ex) = both(d, batch_size=batch)
    assert col_code == ref_code
    assert col_ex == ref_ex            # every refusal, in order: the first error of each file included
    assert col == ref


def test_every_acceptance_rule_has_a_columnar_twin():
    names = {r.name for r in checks.RULES}
    assert names <= COVERED_RULES and covers(), f'rules without a columnar twin: {sorted(names - COVERED_RULES)}'


def test_a_clean_run_is_checked_by_columns_without_torch(run_dir):
    """The columnar path accepts every row of a clean run by itself: torch is never imported."""
    code = ('import sys\nfrom agentrl.cli.main import main\n'
            f'c = main(["check", {str(run_dir / "trajectories")!r}])\n'
            'assert "torch" not in sys.modules, "torch was imported"\nsys.exit(c)\n')
    res = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr[-2000:]
    assert res.stdout.rstrip().endswith('result: OK') and 'records          6  (refused 0, scripted 0)' in res.stdout


def test_the_per_record_path_stays_selectable(run_dir, monkeypatch):
    (ref, code, _), (col, code2, _) = both(run_dir / 'trajectories')
    assert ref == col and code == code2 == 0


def _shards(t: pa.Table, d: Path, n: int) -> Path:
    d.mkdir()
    bounds = np.linspace(0, t.num_rows, n + 1).astype(int)
    for s in range(n):
        pq.write_table(t.slice(bounds[s], bounds[s + 1] - bounds[s]), d / f'part-{s:06d}.parquet')
    return d


def test_check_on_ray_workers_gives_the_in_process_report(base, tmp_path, capsys):
    """`check --workers 2` on 4 shards: the same report as in process, for a clean folder, a folder with
    refusals inside shards, and one with a resend across shards (checked again in process)."""
    copies = []
    for c in range(4):                               # 24 records, distinct identities
        t = base
        for i in range(t.num_rows):
            t = resign(set_cell(t, 'rollout_id', i, f'{t.column("rollout_id")[i].as_py()}/c{c}'), i)
        copies.append(t)
    clean = pa.concat_tables(copies)
    dirty = MUTATIONS['logp_nan'](MUTATIONS['digest'](clean, 3, 0), 20, 7)
    resend = pa.concat_tables([clean, clean.slice(2, 1)])
    from agentrl.engines.ray import connect, require_ray
    ray = require_ray()
    started = connect(ray, None, 2, None)         # one local instance (127.0.0.1) for the three checks
    in_process = {}
    try:
        for name, t in (('clean', clean), ('dirty', dirty), ('resend', resend)):
            d = _shards(t, tmp_path / name, 4)
            outs = []
            for workers in ('0', '2'):
                code = main(['check', str(d), '--workers', workers])
                outs.append((code, capsys.readouterr().out))
            assert outs[0] == outs[1], name
            assert outs[0][0] == (0 if name == 'clean' else 1), outs[0][1]
            in_process[name] = outs[0]
    finally:
        if started:
            ray.shutdown()
    code = main(['check', str(tmp_path / 'clean'), '--workers', '2'])      # Ray started and stopped by the check
    assert (code, capsys.readouterr().out) == in_process['clean']


_GUARD = ('import sys\nfrom agentrl.cli.main import main\n'
          'try:\n    code = main(sys.argv[1:])\nexcept SystemExit as e:\n    code = e.code\n'
          'print("TORCH", "torch" in sys.modules)\nsys.exit(code)\n')


def _torch_after(*argv) -> tuple[int, bool, str]:
    res = subprocess.run([sys.executable, '-c', _GUARD, *map(str, argv)], capture_output=True, text=True, timeout=300)
    return res.returncode, 'TORCH True' in res.stdout, res.stdout + res.stderr


@pytest.mark.parametrize('command', ['check', 'export', 'import', 'show', 'report'])
def test_model_free_commands_start_without_torch(command, run_dir):
    """Parsing and validating a command's flags (its start) never imports torch (`--help`, a refused flag)."""
    code, torch_loaded, out = _torch_after(command, '--help')
    assert code == 0 and not torch_loaded, out
    code, torch_loaded, out = _torch_after(command, '--no-such-flag')
    assert code == 2 and not torch_loaded, out


def test_which_model_free_runs_import_torch(run_dir, tmp_path):
    """Whole runs: `check` without a model never imports torch. `export`, `show` and `report` do, when they
    decode the records into :class:`agentrl.Trajectory` (torch tensors), and every `export` target writes
    ``.pt`` tensors (verl_batch.pt, trl_batch.pt, slime 0.pt ...): the state this test pins."""
    traj = run_dir / 'trajectories'
    assert _torch_after('check', traj)[:2] == (0, False)
    assert _torch_after('export', run_dir, '--to', 'trl', '--out', tmp_path / 'trl')[:2] == (0, True)
    assert _torch_after('report', run_dir)[:2] == (0, True)
    assert _torch_after('show', traj)[:2] == (0, True)
