"""agentrl.train: the records train. SFT warm start, GRPO on collated batches, step-0 ratio 1."""
import json
import math
import os
import subprocess
import sys
from dataclasses import replace

import pytest
import torch
from hypothesis import given, settings, strategies as st

import agentrl as arl
from agentrl.batching import collate
from agentrl import checks
from agentrl.checks import require_trainable
from agentrl.record import SamplingSpec
from agentrl.train import (GRPOOptions, clipped_surrogate, group_advantages, group_index, grouped_advantages,
                           grpo_step, kl_penalty, masked_nll, max_ratio_deviation, oracle_demos, token_log_probs)
from agentrl.train.loop import call_stats, evaluate, grpo_options, run_sft, sample_groups

#: Warm-start settings the unit test uses: full batch of the 24 demonstrations, Adam.
SFT_STEPS, SFT_LR = 120, 3e-3


@pytest.fixture(scope='module', autouse=True)
def one_thread():
    """TinyAgent is fastest on one torch thread (several times faster on a busy 2-core machine)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope='module')
def train_tasks():
    return arl.make_tasks('train')


@pytest.fixture(scope='module')
def demos(train_tasks, tok):
    return oracle_demos(train_tasks, tok)


@pytest.fixture(scope='module')
def sft_model(demos, tok):
    """TinyAgent after the warm start (fixed seed)."""
    torch.manual_seed(0)
    model = arl.TinyAgent(tok.vocab_size)
    run_sft(model, demos, tok, SFT_STEPS, SFT_LR)
    return model.eval()


@pytest.fixture(scope='module')
def groups(sft_model, train_tasks, tok):
    """4 train tasks x G=4 episodes sampled by the warm-started model at temperature 1."""
    gen = torch.Generator().manual_seed(1)
    return sample_groups(sft_model, train_tasks[:4], 4, tok, gen)


# ---------------------------------------------------------------- advantages

def test_group_advantages_zero_variance_counted():
    rewards = torch.tensor([1., 1., 1., 1., 0., 1., 0., 1., 0., 0., 0., 0.])
    adv, zero = group_advantages(rewards, 4)
    assert zero.tolist() == [True, False, True]
    assert adv[:4].tolist() == [0.0] * 4 and adv[8:].tolist() == [0.0] * 4
    assert torch.allclose(adv[4:8], torch.tensor([-1., 1., -1., 1.]), atol=1e-5)   # (r - .5) / (.5 + eps)
    # exactly zero even for rewards whose mean is not representable exactly
    adv, zero = group_advantages(torch.full((3,), 0.1), 3)
    assert zero.tolist() == [True] and adv.tolist() == [0.0, 0.0, 0.0]
    with pytest.raises(ValueError, match='groups of 3'):
        group_advantages(torch.ones(4), 3)


def test_zero_variance_step_makes_no_update(sft_model, demos, tok):
    """All groups degenerate -> counted, advantage 0, and the weights do not move at all."""
    model = arl.TinyAgent(tok.vocab_size)
    model.load_state_dict(sft_model.state_dict())
    trajs = sample_groups(model, [arl.make_tasks('train')[0]], 2, tok, torch.Generator().manual_seed(0))
    trajs = [replace(t, reward=1.0) for t in trajs]
    before = [p.detach().clone() for p in model.parameters()]
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    m = grpo_step(model, opt, trajs, 2, tok.pad_id)
    assert (m['zero_var_groups'], m['zero_var_frac'], m['updates']) == (1, 1.0, 0)
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))


# ---------------------------------------------------------------- step-0 ratio

def test_step0_ratio_is_one(sft_model, groups, tok):
    batch = collate(groups, tok.pad_id)
    with torch.no_grad():
        logp, _ = token_log_probs(sft_model, batch.ids)
    assert batch.action_mask.sum() > 0
    dev = max_ratio_deviation(logp, batch.sample_logp, batch.action_mask)
    assert dev < 1e-5, f'max |ratio - 1| = {dev:.2e} before any update'
    model = arl.TinyAgent(tok.vocab_size)
    model.load_state_dict(sft_model.state_dict())
    m = grpo_step(model, torch.optim.Adam(model.parameters(), lr=1e-3), groups, 4, tok.pad_id,
                  GRPOOptions(updates=2, ratio_tol=1e-5))
    assert m['ratio_dev0'] < 1e-5
    assert 0 <= m['zero_var_frac'] <= 1 and m['truncation_rate'] == 0.0


def _shift(t, field, by):
    x = getattr(t, field)
    return replace(t, **{field: torch.roll(x, by)})


@pytest.mark.parametrize('field', ['sample_logp', 'action_mask'])
@pytest.mark.parametrize('by', [1, -1])
def test_shifted_record_fails_ratio_check(sft_model, groups, tok, field, by):
    bad = [_shift(t, field, by) for t in groups]
    batch = collate(bad, tok.pad_id)
    with torch.no_grad():
        logp, _ = token_log_probs(sft_model, batch.ids)
    assert max_ratio_deviation(logp, batch.sample_logp, batch.action_mask) > 1e-3
    model = arl.TinyAgent(tok.vocab_size)
    model.load_state_dict(sft_model.state_dict())
    with pytest.raises(ValueError, match='misaligned'):
        grpo_step(model, torch.optim.Adam(model.parameters()), bad, 4, tok.pad_id, GRPOOptions(ratio_tol=1e-5))


# ---------------------------------------------------------------- gradients only through policy tokens

def test_sft_loss_ignores_tool_and_template_targets(sft_model, demos, tok):
    batch = collate(demos[:6], tok.pad_id)
    logits = sft_model(batch.ids)[:, :-1].detach().requires_grad_(True)
    targets = batch.ids[:, 1:]
    loss = masked_nll(logits, targets, batch.action_mask)
    loss.backward()
    off = batch.action_mask == 0
    assert logits.grad[off].abs().max() == 0 and logits.grad[~off].abs().max() > 0
    gen = torch.Generator().manual_seed(0)
    noise = torch.randint(0, tok.vocab_size, targets.shape, generator=gen)
    perturbed = torch.where(off, noise, targets)
    assert (perturbed != targets).any()
    assert masked_nll(logits, perturbed, batch.action_mask).item() == loss.item()


def test_grpo_loss_ignores_non_policy_positions(sft_model, groups, tok):
    batch = collate(groups, tok.pad_id)
    logp, _ = token_log_probs(sft_model, batch.ids)
    logp = logp.detach().requires_grad_(True)
    adv = torch.linspace(-1, 1, len(groups))
    sample = batch.sample_logp - 0.1 * batch.action_mask         # ratios != 1 so the clip is exercised
    loss, _ = clipped_surrogate(logp, sample, adv, batch.action_mask)
    loss.backward()
    off = batch.action_mask == 0
    assert logp.grad[off].abs().max() == 0 and logp.grad[~off].abs().max() > 0
    garbage = torch.where(off, torch.full_like(sample, 50.0), sample)     # exp(50) would dominate if it leaked
    loss2, _ = clipped_surrogate(logp, garbage, adv, batch.action_mask)
    assert loss2.item() == loss.item()
    kl = kl_penalty(logp, torch.where(off, torch.full_like(sample, -30.0), logp.detach()), batch.action_mask)
    assert kl.item() == 0.0


# ---------------------------------------------------------------- the step's options

@pytest.mark.parametrize('field, value, message', [
    ('updates', 0, "GRPOOptions.updates = 0: must be an int >= 1; pass the number of optimiser updates per batch"),
    ('clip_eps', 0.0, 'GRPOOptions.clip_eps = 0.0: must be > 0; pass the PPO clip range, e.g. 0.2'),
    ('kl_coef', -0.1, 'GRPOOptions.kl_coef = -0.1: must be >= 0; pass 0 to train without a KL term'),
    ('temperature', 0.0, "GRPOOptions.temperature = 0.0: must be None or > 0; pass None to use the records' own "
                         'sampler'),
    ('correction', 'tis', "GRPOOptions.correction = 'tis': must be None or one of ['token_tis', 'seq_tis', "
                          "'token_mask', 'icepop', 'geo_mask', 'seq_mask_tis']; pick a mode or pass None"),
    ('is_correction_threshold', (5.0, 0.5), 'GRPOOptions.is_correction_threshold = (5.0, 0.5): must be a pair '
                                            '(low, high) with 0 <= low <= high; pass e.g. (0.5, 5.0)'),
    ('max_tokens', 0, 'GRPOOptions.max_tokens = 0: must be an int >= 1; pass the packed row length, e.g. 2048'),
    ('max_staleness', -1, 'GRPOOptions.max_staleness = -1: must be None or an int >= 0; pass None for no limit'),
], ids=['updates', 'clip_eps', 'kl_coef', 'temperature', 'correction', 'is_correction_threshold', 'max_tokens',
        'max_staleness'])
def test_grpo_options_refuse_a_bad_field_by_name(field, value, message):
    with pytest.raises(ValueError) as e:
        GRPOOptions(**{field: value})
    assert str(e.value) == message


def test_grpo_options_defaults_and_the_run_settings():
    o = GRPOOptions(is_correction_threshold=[1, 3])
    assert (o.updates, o.clip_eps, o.kl_coef, o.temperature, o.ratio_tol, o.correction, o.max_tokens,
            o.max_staleness, o.is_correction_threshold) == (1, 0.2, 0.0, None, None, None, 2048, None, (1.0, 3.0))
    with pytest.raises(AttributeError):
        o.updates = 2                                              # frozen: derive with dataclasses.replace
    cfg = arl.train.TrainConfig(correction='icepop', is_correction_threshold='0.25,4', max_staleness=3, packed=True)
    got = grpo_options(cfg)
    assert got == GRPOOptions(updates=cfg.updates, clip_eps=cfg.clip_eps, kl_coef=cfg.kl_coef, temperature=1.0,
                              max_grad_norm=cfg.max_grad_norm, ratio_tol=cfg.ratio_tol, correction='icepop',
                              rollout_is_threshold=cfg.rollout_is_threshold, is_correction_threshold=(0.25, 4.0),
                              packed=True, max_tokens=cfg.max_tokens, max_staleness=3)
    assert grpo_options(arl.train.TrainConfig()).correction is None and grpo_options(
        arl.train.TrainConfig()).max_staleness is None


def test_grpo_step_takes_options_not_keywords(sft_model, groups, tok):
    opt = torch.optim.Adam(sft_model.parameters())
    with pytest.raises(ValueError, match=r'^grpo_step: options must be an agentrl.train.GRPOOptions, got dict;'):
        grpo_step(sft_model, opt, groups, 4, tok.pad_id, {'updates': 2})
    with pytest.raises(TypeError, match="unexpected keyword argument 'updates'"):
        grpo_step(sft_model, opt, groups, 4, tok.pad_id, updates=2)


# ---------------------------------------------------------------- PPO clip on literal tensors

def test_clipped_surrogate_literal():
    mask = torch.tensor([[1., 1., 0.]])
    logp = torch.log(torch.tensor([[1.5, 0.5, 1.0]])).requires_grad_(True)
    sample = torch.zeros(1, 3)
    loss, stats = clipped_surrogate(logp, sample, torch.tensor([1.0]), mask, clip_eps=0.2)
    # A > 0: ratio 1.5 is clipped to 1.2 (no gradient); ratio 0.5 is not clipped: -(1.2 + 0.5) / 2
    assert math.isclose(loss.item(), -0.85, abs_tol=1e-6)
    assert stats['clip_frac'] == 0.5 and math.isclose(stats['ratio_max'], 1.5, rel_tol=1e-6)
    loss.backward()
    assert logp.grad[0, 0] == 0 and logp.grad[0, 1] != 0 and logp.grad[0, 2] == 0


# ---------------------------------------------------------------- placeholders refused

def test_placeholder_records_refused_in_ratio(demos, groups, tok):
    assert all(t.provenance.logp_placeholder for t in demos)
    with pytest.raises(checks.ScriptedRecordError, match='placeholder'):
        require_trainable(groups[:3] + demos[:1])
    model = arl.TinyAgent(tok.vocab_size)
    with pytest.raises(checks.ScriptedRecordError, match='placeholder'):
        grpo_step(model, torch.optim.Adam(model.parameters()), demos[:4], 2, tok.pad_id)
    with pytest.raises(checks.SamplerMismatchError, match='temperature'):
        require_trainable(groups, temperature=0.7)
    with pytest.raises(checks.MissingProvenanceError, match='provenance: is missing'):
        require_trainable([replace(groups[0], provenance=None)])
    assert require_trainable(groups) == SamplingSpec()            # sampled records pass


# ---------------------------------------------------------------- the warm start works

def test_sft_warm_start_well_formed_and_rewarded(sft_model, train_tasks, tok):
    """Cheap version of the issue's bar: 2 episodes per train task at temperature 1."""
    m = evaluate(sft_model, train_tasks, tok, repeats=2, seed=123)
    assert m['well_formed'] >= 0.95, m
    assert m['reward'] >= 0.8, m


def test_call_stats_counts_hardcode(train_tasks, tok):
    hacker = arl.scripted_rollout(arl.scripted_policy('hacker'), arl.BugFixEnv(), train_tasks[0], tok)
    oracle = arl.scripted_rollout(arl.scripted_policy('oracle'), arl.BugFixEnv(), train_tasks[0], tok)
    s = call_stats([hacker, oracle])
    assert s['calls'] == 7 and s['well_formed'] == 1.0
    assert s['hardcode_rate'] == 0.5 and math.isclose(s['hardcode_call_frac'], 1 / 7)


# ---------------------------------------------------------------- CLI smoke test

def test_cli_train_smoke(tmp_path):
    out = tmp_path / 'run'
    cmd = [sys.executable, '-m', 'agentrl', 'train', '--sft-steps', '3', '--grpo-steps', '2', '--group', '2',
           '--tasks-per-step', '2', '--eval-every', '1', '--eval-repeats', '1', '--hacker-demos', '2',
           '--out', str(out)]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert 'after SFT' in r.stdout and 'held-out' in r.stdout
    for name in ('sft.pt', 'model.pt', 'metrics.jsonl', 'reward.svg', 'summary.json'):
        assert (out / name).exists(), name
    rows = [json.loads(line) for line in (out / 'metrics.jsonl').read_text().splitlines()]
    assert [r['phase'] for r in rows] == ['start', 'sft', 'sft', 'sft', 'eval', 'grpo', 'eval', 'grpo', 'eval']
    assert rows[5]['ratio_dev0'] < 1e-5
    assert (out / 'reward.svg').read_text().startswith('<svg')
    from agentrl.model import load_checkpoint
    assert isinstance(load_checkpoint(str(out / 'model.pt')), arl.TinyAgent)


def test_cli_train_rejects_bad_flags(tmp_path):
    from agentrl.cli.main import main
    assert main(['train', '--group', '0', '--out', str(tmp_path)]) == 2
    assert not os.listdir(tmp_path)


def test_cli_train_rejects_meaningless_groups(tmp_path, capsys):
    from agentrl.cli.main import main
    assert main(['train', '--group', '1', '--out', str(tmp_path)]) == 2
    assert capsys.readouterr().err.startswith('agentrl: error: --group must be >= 2 for GRPO')
    assert main(['train', '--tasks-per-step', '30', '--out', str(tmp_path)]) == 2
    assert '--tasks-per-step and --hacker-demos must be <= 24' in capsys.readouterr().err


# ---------------------------------------------------------------- groups from identity, dropout, truncated samplers

def _with_identity(t, group_id, reward=None, rollout_id=None):
    prov = replace(t.provenance, group_id=group_id, rollout_id=rollout_id or f'{group_id}/{id(t)}')
    return replace(t, provenance=prov, reward=t.reward if reward is None else reward)


def test_groups_come_from_group_id_not_row_order(sft_model, train_tasks, tok):
    """The exact case: group ids A, B, A, B with rewards 1, 1, 0, 0 are two groups with variance."""
    trajs = arl.rollout_batch(sft_model, [arl.BugFixEnv() for _ in range(4)], train_tasks[:4], tok,
                              generator=torch.Generator().manual_seed(5))
    trajs = [_with_identity(t, g, r) for t, g, r in zip(trajs, 'ABAB', [1.0, 1.0, 0.0, 0.0])]
    model = arl.TinyAgent(tok.vocab_size)
    model.load_state_dict(sft_model.state_dict())
    m = grpo_step(model, torch.optim.Adam(model.parameters(), lr=0.0), trajs, group_size=2, pad_id=tok.pad_id)
    assert (m['zero_var_groups'], m['updates']) == (0, 1) and m['ratio_dev0'] < 1e-5
    # laid out consecutively the old way, rows 0-1 (A, B) would have been one zero-variance group
    assert group_advantages(torch.tensor([1., 1., 0., 0.]), 2)[1].tolist() == [True, True]
    # a group of another size, and records without a group id, are refused by name
    with pytest.raises(checks.GroupSizeError, match=r"provenance.group_id: 'A' holds 3 records but group_size is 2"):
        grpo_step(model, torch.optim.Adam(model.parameters(), lr=0.0), trajs[:3] + [_with_identity(trajs[3], 'A')],
                  2, tok.pad_id)
    with pytest.raises(checks.MissingGroupError, match=r'provenance.group_id: of record 1 is empty'):
        grpo_step(model, torch.optim.Adam(model.parameters(), lr=0.0), [trajs[0], _with_identity(trajs[1], '')],
                  2, tok.pad_id)


def _fake(group, reward, n):
    prov = arl.Provenance(policy='model', sampling=SamplingSpec(), group_id=group, rollout_id=f'{group}/{n}')
    return arl.Trajectory.from_tokens([1, 2, 3], ['prompt', 'policy', 'policy'], [-1, 0, 0], [0.0, -0.5, -0.5],
                                      reward, {}, provenance=prov)


@settings(max_examples=60, deadline=None)
@given(data=st.data(), n_groups=st.integers(1, 4), G=st.sampled_from([2, 3, 4]))
def test_shuffling_records_leaves_every_advantage_unchanged(data, n_groups, G):
    rewards = data.draw(st.lists(st.sampled_from([0.0, 0.5, 1.0]), min_size=n_groups * G, max_size=n_groups * G))
    recs = [_fake(f'g{i // G}', r, i) for i, r in enumerate(rewards)]
    perm = data.draw(st.permutations(range(len(recs))))
    shuffled = [recs[i] for i in perm]
    adv = lambda rs: grouped_advantages(torch.tensor([r.reward for r in rs]), group_index(rs, G))[0]  # noqa: E731
    a, b = adv(recs), adv(shuffled)
    by_id = {r.provenance.rollout_id: float(x) for r, x in zip(recs, a)}
    assert {r.provenance.rollout_id: float(x) for r, x in zip(shuffled, b)} == by_id
    # and equal to the consecutive layout's advantages
    assert a.tolist() == group_advantages(torch.tensor(rewards), G)[0].tolist()


def test_dropout_is_off_when_scoring(train_tasks, tok):
    """TinyAgent with dropout p = 0.1 on one block, records sampled in eval mode: step-0 ratio is 1."""
    torch.manual_seed(0)
    model = arl.TinyAgent(tok.vocab_size)
    model.blocks[0].mlp.append(torch.nn.Dropout(0.1))
    model.eval()
    trajs = arl.rollout_batch(model, [arl.BugFixEnv() for _ in range(2)], train_tasks[:1] * 2, tok,
                              generator=torch.Generator().manual_seed(0), identities=[('g', 'g/0'), ('g', 'g/1')])
    trajs = [replace(t, reward=r) for t, r in zip(trajs, [1.0, 0.0])]
    batch = collate(trajs, tok.pad_id)
    model.train()                                 # what the old trainer scored in: dropout moves the ratio
    with torch.no_grad():
        logp, _ = token_log_probs(model, batch.ids)
    assert max_ratio_deviation(logp, batch.sample_logp, batch.action_mask) > 1e-2
    m = grpo_step(model, torch.optim.Adam(model.parameters(), lr=0.0), trajs, 2, tok.pad_id,
                  GRPOOptions(ratio_tol=1e-5))
    assert m['ratio_dev0'] <= 1e-5 and m['dropout_disabled'] == 1.0 and m['updates'] == 1
    assert model.training                          # the caller's mode is restored


def test_grpo_trains_on_truncated_sampler_records(sft_model, train_tasks, tok):
    """Records sampled at T = 0.7 with top-p 0.9: the ratio is against the processed distribution."""
    spec = SamplingSpec(temperature=0.7, top_p=0.9)
    jobs = [t for t in train_tasks[:2] for _ in range(2)]
    trajs = arl.rollout_batch(sft_model, [arl.BugFixEnv() for _ in jobs], jobs, tok,
                              options=arl.RolloutBatchOptions(spec=spec),
                              generator=torch.Generator().manual_seed(2),
                              identities=[(t.name, f'{t.name}/{i}') for i, t in enumerate(jobs)])
    trajs = [replace(t, reward=float(i % 2)) for i, t in enumerate(trajs)]
    model = arl.TinyAgent(tok.vocab_size)
    model.load_state_dict(sft_model.state_dict())
    m = grpo_step(model, torch.optim.Adam(model.parameters(), lr=0.0), trajs, 2, tok.pad_id,
                  GRPOOptions(ratio_tol=1e-5))
    assert m['ratio_dev0'] <= 1e-5 and m['updates'] == 1
    with pytest.raises(checks.SamplerMismatchError, match=r'provenance.sampling.temperature: of record 0 .* is 0.7 '
                                                          r'but the ratio is computed at temperature 1.0'):
        grpo_step(model, torch.optim.Adam(model.parameters(), lr=0.0), trajs, 2, tok.pad_id,
                  GRPOOptions(temperature=1.0))
    mixed = trajs[:3] + [replace(trajs[3], provenance=replace(trajs[3].provenance, sampling=SamplingSpec(0.7)))]
    with pytest.raises(checks.SamplerMismatchError, match='one step ratios against one sampler'):
        grpo_step(model, torch.optim.Adam(model.parameters(), lr=0.0), mixed, 2, tok.pad_id)
