"""Policy versions (docs/design.md#training): per-turn versions round-trip through the store and the
exporters; staleness refusal; the step-0 ratio guard covers only records sampled by the current weights."""
import copy
import json
import re

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

import agentrl as arl
from agentrl import checks, interop, store
from agentrl.record import Provenance, SamplingSpec, Trajectory, turn_records
from agentrl.store.schema import _ROW_DIGEST_COLUMNS, row_digest
from agentrl.jobs.bugfix import BugFixOptions, bugfix_rollouts

EOT, PAD = 7, 0


def _rec(k: int, versions=None, version=None, group='g0') -> Trajectory:
    """Two policy turns (ids end in EOT) separated by a tool observation."""
    ids = [1, 2, 3, 10 + k, 11, EOT, 50, 51, 12, 13 + k, EOT]
    owner = ['template', 'prompt', 'prompt', 'policy', 'policy', 'policy', 'tool', 'tool', 'policy', 'policy',
             'policy']
    turn = [-1, -1, -1, 0, 0, 0, 0, 0, 1, 1, 1]
    logp = [0.0, 0.0, 0.0, -0.5, -0.25, -0.125, 0.0, 0.0, -1.5, -0.75, -0.375]
    prov = Provenance(policy='model', tokenizer='tok', template='tmpl', sampling=SamplingSpec(), model='m',
                      group_id=group, rollout_id=f'r{k}', seed=k, policy_version=version,
                      turn_policy_versions=versions)
    return Trajectory.from_tokens(ids, owner, turn, logp, float(k % 2), {'stop': 'submitted', 'n_turns': 2},
                                  provenance=prov)


def _recs():
    return [_rec(0, versions=[3, 4], version=4), _rec(1, version='ckpt-9f2a'), _rec(2), _rec(3, versions=[5, 5],
                                                                                             version=5)]


def test_provenance_versions_and_spans():
    a, b, c, d = _recs()
    assert a.provenance.spans_versions and not b.provenance.spans_versions and not d.provenance.spans_versions
    assert a.provenance.to_dict()['turn_policy_versions'] == [3, 4] and a.provenance.to_dict()['policy_version'] == 4
    assert 'policy_version' not in c.provenance.to_dict() and 'turn_policy_versions' not in c.provenance.to_dict()
    assert Provenance.from_dict(json.loads(a.provenance.to_json())) == a.provenance
    assert checks.record_versions(a) == (3, 4) and checks.record_versions(b) == ('ckpt-9f2a',)
    assert checks.record_versions(c) == ()
    # splitting per turn gives each turn its own version
    assert [t.provenance.policy_version for t in turn_records(a)] == [3, 4]
    assert [t.provenance.turn_policy_versions for t in turn_records(a)] == [None, None]
    with pytest.raises(ValueError, match=r'^Provenance: a policy version is an int step or a str fingerprint, '
                                         r'got 1\.5$'):
        Provenance(policy_version=1.5)
    with pytest.raises(ValueError, match=r'got True$'):
        Provenance(turn_policy_versions=[1, True])


def test_versions_round_trip_through_the_store_and_the_digest(tmp_path):
    recs = _recs()
    path = tmp_path / 'a.parquet'
    store.write_trajectories(path, recs)
    back = store.read_trajectories(path)
    assert [r.provenance.to_dict() for r in back] == [r.provenance.to_dict() for r in recs]
    assert [r.provenance.spans_versions for r in back] == [True, False, False, False]
    t = pq.read_table(path)
    assert t.column('policy_version').to_pylist() == ['4', '"ckpt-9f2a"', None, '5']
    assert t.column('turn_policy_versions').to_pylist() == ['[3, 4]', None, None, '[5, 5]']
    # a record without versions keeps the digest of the rule before the version columns existed
    stored = {c: t.column(c)[2].as_py() for c in _ROW_DIGEST_COLUMNS}
    assert t.column('digest')[2].as_py() == row_digest(checks.record_digest(recs[2]), stored)
    d = t.column('digest').to_pylist()
    for name, value in (('policy_version', '3'), ('turn_policy_versions', '[4, 4]')):
        col = t.column(name).to_pylist()
        col[0] = value
        i = t.schema.get_field_index(name)
        pq.write_table(t.set_column(i, t.schema.field(i), pa.array(col, pa.string())), path)
        msg = (f"'{path}' row 0: digest: the stored digest {d[0][:12]}... does not match the row's content "
               '(ids, owner, turn, action_mask, sample_logp, reward, provenance, task, info, turn_contexts): the '
               'row was edited after writing. Fix: re-run the rollout for this episode; never edit a stored '
               'record in place')
        with pytest.raises(checks.DigestMismatchError, match=f'^{re.escape(msg)}$'):
            store.read_trajectories(path)


def test_a_file_without_the_version_columns_still_reads(tmp_path):
    recs = [_rec(2), _rec(4)]
    path = tmp_path / 'old.parquet'
    store.write_trajectories(path, recs)
    t = pq.read_table(path)
    old = t.drop_columns(['policy_version', 'turn_policy_versions'])
    pq.write_table(old.replace_schema_metadata(t.schema.metadata), path)
    back = store.read_trajectories(path)                  # digests verify: the columns were null
    assert [r.provenance.policy_version for r in back] == [None, None]


@pytest.mark.parametrize('trim', [False, True])
def test_versions_round_trip_through_every_exporter(trim):
    recs = _recs()
    pairs = [(interop.to_verl(recs, pad_id=PAD, trim=trim), interop.from_verl),
             (interop.to_trl(recs, pad_id=PAD, trim=trim), interop.from_trl),
             (interop.to_slime(recs, trim=trim), interop.from_slime),
             (interop.to_skyrl(recs, trim=trim), interop.from_skyrl)]
    if not trim:
        pairs += [(interop.to_openrlhf(recs), interop.from_openrlhf), (interop.to_prime_rl(recs), interop.from_prime_rl)]
    for data, back in pairs:
        got = back(data)
        assert [r.provenance.policy_version for r in got] == [4, 'ckpt-9f2a', None, 5]
        assert [r.provenance.turn_policy_versions for r in got] == [[3, 4], None, None, [5, 5]]
        assert [r.provenance.spans_versions for r in got] == [True, False, False, False]


def test_staleness_report_and_refusal():
    recs = [_rec(0, versions=[3, 4]), _rec(1, version=5), _rec(2), _rec(3, version=6)]
    rep = checks.staleness_report(recs, 6, max_staleness=2)
    assert rep.to_dict() == {'current_version': 6, 'max_staleness': 2, 'counts': {'0': 1, '1': 1, '3': 1, 'none': 1},
                             'spanning': [0], 'stale': [0]}
    assert checks.sampled_by(recs, 6) == [False, False, True, True]
    msg = ('provenance.policy_version[0]: record 0 (g0/r0#1) was sampled by version(s) [3, 4], 3 steps before '
           'current version 6 > max_staleness=2. Fix: drop or re-sample the stale records, or raise max_staleness')
    with pytest.raises(checks.StaleVersionError, match=f'^{re.escape(msg)}$'):
        checks.require_fresh(recs, 6, 2)
    checks.require_fresh(recs, 6, 3)
    msg = ("provenance.policy_version[1]: is 'ckpt-9f2a' (record 1); staleness orders integer training steps only, "
           'a str fingerprint has no order. Fix: stamp records with the integer training step (policy_version=step), '
           'or drop max_staleness')
    with pytest.raises(checks.StaleVersionError, match=f'^{re.escape(msg)}$'):
        checks.staleness_report([_rec(0, version=1), _rec(1, version='ckpt-9f2a')], 2)
    with pytest.raises(checks.StaleVersionError, match=r"is 'step-2' \(current_version\)"):
        checks.staleness_report(recs, 'step-2')


@pytest.fixture(scope='module')
def sampled(tasks, tok):
    """A TinyAgent and 2 groups of 4 of its own records (version 0), rewards alternating for signal."""
    from agentrl.train.loop import sample_groups
    torch.manual_seed(0)
    model = arl.TinyAgent(tok.vocab_size)
    trajs = sample_groups(model, tasks[:2], 4, tok, torch.Generator().manual_seed(1), policy_version=0)
    for i, t in enumerate(trajs):
        t.reward = float(i % 2)
    return model, trajs


def test_rollouts_stamp_the_policy_version(sampled):
    _, trajs = sampled
    assert {t.provenance.policy_version for t in trajs} == {0}


def test_grpo_step_refuses_stale_records_by_name(sampled, tok):
    model, trajs = sampled
    m = copy.deepcopy(model)
    opt = torch.optim.Adam(m.parameters(), lr=1e-3)
    msg = ('provenance.policy_version[0]: record 0 (0/clamp/0#1) was sampled by version(s) [0], 3 steps before '
           'current version 3 > max_staleness=2 (and 7 more positions). Fix: drop or re-sample the stale records, '
           'or raise max_staleness')
    with pytest.raises(checks.StaleVersionError, match=f'^{re.escape(msg)}$'):
        arl.train.grpo_step(m, opt, trajs, 4, tok.pad_id, arl.train.GRPOOptions(max_staleness=2), current_version=3)
    with pytest.raises(ValueError, match=r'^grpo_step: max_staleness needs current_version'):
        arl.train.grpo_step(m, opt, trajs, 4, tok.pad_id, arl.train.GRPOOptions(max_staleness=2))
    assert all(torch.equal(a, b) for a, b in zip(m.state_dict().values(), model.state_dict().values()))


def test_grpo_step_refuses_mixed_versions_without_the_current_one(sampled, tok):
    model, trajs = sampled
    mixed = [copy.copy(t) for t in trajs]
    for t in mixed[::2]:
        t.provenance = Provenance.from_dict(dict(t.provenance.to_dict(), policy_version=1))
    m = copy.deepcopy(model)
    opt = torch.optim.Adam(m.parameters(), lr=1e-3)
    msg = ("provenance.policy_version: grpo_step: these records were sampled by 2 policy versions [0, 1] and no "
           'current_version was given, so all would count as sampled by the weights being trained. Fix: pass '
           'current_version= (the version of the weights being trained, e.g. 1) so older records count as '
           'off-policy, or train on the records of one version')
    with pytest.raises(checks.StaleVersionError) as e:
        arl.train.grpo_step(m, opt, mixed, 4, tok.pad_id)
    assert str(e.value) == msg
    assert all(torch.equal(a, b) for a, b in zip(m.state_dict().values(), model.state_dict().values()))
    out = arl.train.grpo_step(m, opt, mixed, 4, tok.pad_id, current_version=1)
    assert out['fresh_records'] == 4


def test_ratio_guard_covers_only_records_of_the_current_weights(sampled, tok):
    model, trajs = sampled
    moved = copy.deepcopy(model)
    with torch.no_grad():
        moved.head.bias.add_(torch.linspace(-0.5, 0.5, moved.head.bias.numel()))    # the weights of version 1
    opt = torch.optim.Adam(moved.parameters(), lr=1e-3)
    with pytest.raises(ValueError, match=r'^GRPO step: max \|ratio - 1\| = .* before any update'):
        arl.train.grpo_step(copy.deepcopy(moved), opt, trajs, 4, tok.pad_id, arl.train.GRPOOptions(ratio_tol=1e-4))
    m = arl.train.grpo_step(copy.deepcopy(moved), opt, trajs, 4, tok.pad_id,
                            arl.train.GRPOOptions(ratio_tol=1e-4, max_staleness=1), current_version=1)
    assert m['fresh_records'] == 0 and m['ratio_dev0'] == 0.0
    half = [t if i % 2 else copy.copy(t) for i, t in enumerate(trajs)]
    # records of the current weights are still guarded: stamp half of them version 1 (they are not its samples)
    for t in half[::2]:
        t.provenance = Provenance.from_dict(dict(t.provenance.to_dict(), policy_version=1))
    with pytest.raises(ValueError, match=r'^GRPO step: max \|ratio - 1\|'):
        arl.train.grpo_step(copy.deepcopy(moved), opt, half, 4, tok.pad_id, arl.train.GRPOOptions(ratio_tol=1e-4),
                            current_version=1)
    m = arl.train.grpo_step(copy.deepcopy(model), opt, half, 4, tok.pad_id, arl.train.GRPOOptions(ratio_tol=1e-4),
                            current_version=1)
    assert m['fresh_records'] == 4 and m['ratio_dev0'] <= 1e-5


def test_tinyagent_and_hf_rollouts_take_policy_version(tmp_path, tasks, tok):
    model = arl.TinyAgent(tok.vocab_size)
    t = arl.rollout(model, arl.BugFixEnv(), tasks[0], tok, generator=torch.Generator().manual_seed(0),
                    policy_version=7)
    assert t.provenance.policy_version == 7 and arl.rollout(model, arl.BugFixEnv(), tasks[0], tok).provenance \
        .policy_version is None
    pytest.importorskip('transformers')
    from _tokenizers import TINY
    from agentrl.engines import hf
    path = hf.make_test_model(tmp_path / 'm', TINY, layers=1, hidden=32, heads=2, kv_heads=1, max_positions=2048)
    hmodel, htok = hf.load_model(path)
    recs = bugfix_rollouts(hmodel, htok, tasks[:2], BugFixOptions(spec=SamplingSpec(), max_new_tokens=8, max_turns=1, seed=5, enable_thinking=False, policy_version='sha256:ab12'))
    assert [r.provenance.policy_version for r in recs] == ['sha256:ab12'] * 2
    store.write_trajectories(tmp_path / 'h.parquet', recs)
    back = store.read_trajectories(tmp_path / 'h.parquet')
    assert [r.provenance.policy_version for r in back] == ['sha256:ab12'] * 2


def test_check_reports_versions_and_refuses_records_older_than_max_staleness(tmp_path, capsys):
    from agentrl.cli.main import main
    recs = _recs()                     # versions: 3..4 (spans), 'ckpt-9f2a', none, 5
    path = tmp_path / 'v.parquet'
    store.write_trajectories(path, recs)
    common = ['check', str(path), '--vocab-size', '64', '--eot-id', str(EOT), '--pad-id', str(PAD)]
    assert main(common) == 0
    out = capsys.readouterr().out
    assert 'policy versions  3..4 1  ckpt-9f2a 1  (none) 1  5 1; 1 records span several versions' in out
    assert 'staleness' not in out
    assert main(common + ['--current-version', '5']) == 0
    assert 'staleness        0 steps 1  2 steps 1  not a step 1' in capsys.readouterr().out
    assert main(common + ['--current-version', '5', '--max-staleness', '1']) == 1
    out = capsys.readouterr().out
    assert 'StaleVersionError            1' in out
    assert 'was sampled 2 steps before --current-version 5 (> --max-staleness 1)' in out


def test_model_rollouts_are_stamped_with_the_checkpoint_fingerprint(tmp_path):
    from agentrl.cli.main import main
    out = tmp_path / 'run'
    assert main(['rollout', '--policy', 'model,oracle', '--split', 'heldout', '--repeats', '1', '--out', str(out)]) == 0
    recs = store.read_trajectories(out / 'trajectories')
    model = [r for r in recs if r.provenance.policy == 'model']
    assert model and {r.provenance.policy_version for r in model} == {model[0].provenance.model.rsplit('@', 1)[1]}
    assert {r.provenance.policy_version for r in recs if r.provenance.policy != 'model'} == {None}
