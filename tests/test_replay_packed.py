"""Replay scores packed rows (records end to end, each attending only to itself) and gives the padded path's
numbers: every replayed log-ratio equal within 1e-5, on TinyAgent and on the transformers test model; the padded
path stays selectable (``packed=False``, ``agentrl check --no-packed``)."""
import pytest
import torch

import agentrl as arl
from agentrl import checks
from agentrl.record import Provenance, SamplingSpec

from _tokenizers import TINY


def _rec(n, seed, vocab, rid):
    """A record of n tokens (prompt token, then policy / tool runs) with placeholder-free log-probs."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, vocab, (n,), generator=g).tolist()
    owner = ['prompt'] + ['tool' if j % 3 == 2 else 'policy' for j in range(n - 1)]
    turn = [-1] + [j // 4 for j in range(n - 1)]
    logp = [0.0] + [-0.5] * (n - 1)
    return arl.Trajectory.from_tokens(ids, owner, turn, logp, 0.0, {},
                                      provenance=Provenance(policy='model', sampling=SamplingSpec(),
                                                            group_id='g', rollout_id=rid))


SKEWED = [120, 7, 60, 3, 90, 12, 2, 45, 30, 5]


def _both(records, scorer, batch_size=4):
    packed = checks.replay_records(records, scorer, batch_size=batch_size)
    padded = checks.replay_records(records, scorer, batch_size=batch_size, packed=False)
    assert [r.key for r in packed.records] == [r.key for r in padded.records]
    dev = max(float((a.log_ratio - b.log_ratio).abs().max()) for a, b in zip(packed.records, padded.records))
    for a, b in zip(packed.records, padded.records):
        assert torch.equal(a.rows, b.rows) and torch.equal(a.kinds, b.kinds)
    return packed, padded, dev


def test_tinyagent_packed_replay_equals_padded(tasks, tok):
    torch.manual_seed(0)
    model = arl.TinyAgent(tok.vocab_size, max_len=128).eval()
    sampled = arl.rollout_batch(model, [arl.BugFixEnv() for _ in range(5)], tasks[:5], tok,
                                generator=torch.Generator().manual_seed(3))
    records = sampled + [_rec(n, i, tok.vocab_size, f'r{i}') for i, n in enumerate(SKEWED)]
    scorer = checks.Scorer.of_model(model)
    assert scorer.packed is not None
    calls = []
    inner = scorer.packed
    scorer.packed = lambda *a: calls.append(a[0].shape) or inner(*a)
    packed, padded, dev = _both(records, scorer)
    assert dev <= 1e-5
    assert calls and all(shape[1] <= 128 for shape in calls)      # rows no wider than the longest record
    assert sum(s[0] for s in calls) < len(records)                 # fewer rows than records: they were packed
    assert all(r.ok for r in packed.records[:5])                   # the sampling model: step-0 ratio 1


def test_a_scorer_without_a_packed_path_replays_padded():
    torch.manual_seed(0)
    model = arl.TinyAgent(50, max_len=128).eval()
    records = [_rec(n, i, 50, f'r{i}') for i, n in enumerate(SKEWED)]
    plain = checks.Scorer(checks.Scorer.of_model(model).fn, 'plain')     # padded only
    assert plain.packed is None
    a = checks.replay_records(records, plain)
    b = checks.replay_records(records, checks.Scorer.of_model(model), packed=False)
    for x, y in zip(a.records, b.records):
        assert torch.equal(x.log_ratio, y.log_ratio)


def test_packed_replay_refuses_a_record_longer_than_the_model():
    model = arl.TinyAgent(50, max_len=16).eval()
    with pytest.raises(checks.ReplayUnsupportedError, match=r'has 20 tokens to score but the model takes at most 16'):
        checks.replay_records([_rec(20, 0, 50, 'r0')], checks.Scorer.of_model(model))


@pytest.mark.parametrize('impl', ['sdpa', 'eager'])
def test_hf_packed_replay_equals_padded(tmp_path_factory, impl):
    pytest.importorskip('transformers')
    from agentrl.engines import hf
    from agentrl.engines.scorer import hf_scorer
    path = hf.make_test_model(tmp_path_factory.mktemp('m'), TINY, layers=2, hidden=32, heads=2, kv_heads=1,
                              max_positions=512)
    model, _ = hf.load_model(path, attn_implementation=impl)
    records = [_rec(n, i, 500, f'r{i}') for i, n in enumerate(SKEWED)]
    scorer = hf_scorer(model)
    packed, padded, dev = _both(records, scorer)
    assert dev <= 1e-5
    assert model.config._attn_implementation == impl               # switched back after the packed call


def test_check_cli_no_packed_gives_the_same_report(tasks, tok, tmp_path):
    from agentrl import store
    from agentrl.jobs.check import CheckOptions, run_check
    torch.manual_seed(0)
    model = arl.TinyAgent(tok.vocab_size).eval()
    trajs = arl.rollout_batch(model, [arl.BugFixEnv() for _ in range(6)], tasks[:6], tok,
                              generator=torch.Generator().manual_seed(1))
    store.write_trajectories(tmp_path / 't.parquet', trajs)
    arl.save_checkpoint(model, str(tmp_path / 'model.pt'))
    reps = [run_check(CheckOptions(path=str(tmp_path / 't.parquet'), model=str(tmp_path / 'model.pt'),
                                   no_packed=flag)) for flag in (False, True)]
    assert [r.code for r in reps] == [0, 0]
    a, b = reps[0].replay, reps[1].replay
    assert a.overall.n == b.overall.n > 0
    assert abs(a.overall.max_abs_dev - b.overall.max_abs_dev) <= 1e-5
