"""``agentrl rollout --engine vllm`` against the session's vLLM server: a checked run, the same records twice."""
import json

import pytest
import torch

from agentrl import store
from agentrl.cli.main import main
from agentrl.jobs.rollout import model_fingerprint


def rollout(out, server, model_dir, *extra):
    return main(['rollout', '--engine', 'vllm', '--server', server.url, '--model', str(model_dir), '--split',
                 'heldout', '--repeats', '1', '--max-turns', '2', '--max-new-tokens', '16', '--chunk-size', '4',
                 '--seed', '5', '--out', str(out), *extra])


def records(out):
    return sorted((r.record for rows in store.scan(out / 'trajectories') for r in rows),
                  key=lambda t: t.provenance.rollout_id)


@pytest.fixture(scope='module')
def two_runs(server, model_dir, tmp_path_factory):
    a, b = tmp_path_factory.mktemp('vllm-run-a'), tmp_path_factory.mktemp('vllm-run-b')
    assert rollout(a / 'run', server, model_dir) == 0
    assert rollout(b / 'run', server, model_dir) == 0
    return a / 'run', b / 'run'


def test_a_vllm_run_passes_check_and_names_the_model_by_fingerprint(two_runs, model_dir, capsys):
    run, _ = two_runs
    assert sorted(p.name for p in (run / 'trajectories').iterdir()) == ['part-000000.parquet', 'part-000001.parquet']
    recs = records(run)
    mid = f'{model_dir.name}@{model_fingerprint(model_dir)}'
    assert len(recs) == 6 and {r.provenance.policy for r in recs} == {'vllm'}
    assert {r.provenance.model for r in recs} == {mid}
    assert {r.provenance.sampling.logp_mode for r in recs} == {'processed'}
    assert all(r.info['vllm']['logp_mode'] == 'processed' and r.info['tool_calls'] for r in recs)
    manifest = json.loads((run / 'run.json').read_text())
    assert manifest['plan']['engine'] == 'vllm' and manifest['plan']['model'] == mid
    assert 'server' not in manifest['plan']                      # servers are not the plan: seeds are per request
    summary = json.loads((run / 'summary.json').read_text())
    assert summary['hf']['logp_mode'] == 'processed' and summary['hf']['servers'] == 1
    assert summary['hf']['model'] == mid
    capsys.readouterr()
    assert main(['check', str(run)]) == 0
    assert main(['check', str(run), '--model', str(model_dir)]) == 0


def test_the_same_seed_twice_gives_the_same_records(two_runs):
    a, b = (records(r) for r in two_runs)
    assert [t.provenance.rollout_id for t in a] == [t.provenance.rollout_id for t in b]
    for x, y in zip(a, b):
        assert x.ids.tolist() == y.ids.tolist() and x.owner.tolist() == y.owner.tolist()
        torch.testing.assert_close(x.sample_logp, y.sample_logp, rtol=0, atol=0, equal_nan=True)
        assert x.reward == y.reward
        assert x.provenance.to_dict() == y.provenance.to_dict()


def test_check_measures_the_engine_vs_trainer_mismatch_in_float32_and_bfloat16(two_runs, model_dir):
    from agentrl.jobs.check import CheckOptions, run_check
    run, _ = two_runs
    f32 = run_check(CheckOptions(path=str(run), model=str(model_dir)))
    m = f32.mismatch
    assert f32.ok and m.n == f32.replay.overall.n > 0
    assert m.max_abs < 1e-4 and m.mean_abs <= m.max_abs and m.over[1e-1] == 0.0
    assert 0.0 <= m.kl_k3 < 1e-8 and abs(m.kl_k1) < 1e-4         # k3 >= 0 always; k1 is unbiased, any sign
    assert 'engine vs trainer: |Δ log-p| max' in f32.format() and '(Schulman 2020)' in f32.format()
    bf16 = run_check(CheckOptions(path=str(run), model=str(model_dir), dtype='bfloat16'))
    mb = bf16.mismatch
    assert mb.max_abs > 1e-4 and not bf16.ok             # reported, and refused under the default --tol 1e-4
    assert f'bfloat16 replay: max |Δ log-p| {mb.max_abs:.2e} > --tol 0.0001' in bf16.format()
    loose = run_check(CheckOptions(path=str(run), model=str(model_dir), dtype='bfloat16', tol=1.0))
    assert loose.mismatch.max_abs < 1.0 and loose.ok, loose.format()
