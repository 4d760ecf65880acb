"""Off-policy correction modes on literal ratios, packed rows, and in grpo_step; overlong filtering in grpo_step.

The peers' own functions (verl, OpenRLHF) are compared in tests/interop/test_correction.py.
"""
import math
from dataclasses import replace

import pytest
import torch

import agentrl as arl
from agentrl.batching import collate
from agentrl.train import (GRPOOptions, grpo_loss, grpo_step, grouped_advantages, group_index, mask_overlong,
                           off_policy_correction)
from agentrl.train.correction import CORRECTION_MODES
from agentrl.train.grpo import is_overlong, token_log_probs

AM = torch.tensor([[1., 1., 1., 0.], [1., 0., 1., 1.]])
LR = torch.tensor([[0.0, math.log(3), math.log(0.25), 5.0], [math.log(1.5), 9.0, math.log(1.5), math.log(0.5)]])
SLP = torch.full((2, 4), -2.0)
BAND = (0.95, 2.0)


def _corr(mode, **kw):
    return off_policy_correction(SLP + LR, SLP, AM, mode, **kw)


@pytest.mark.parametrize('mode, weights, mask', [
    ('token_tis', [[1, 2, 0.25, 0], [1.5, 0, 1.5, 0.5]], AM.tolist()),
    ('seq_tis', [[0.75, 0.75, 0.75, 0], [1.125, 0, 1.125, 1.125]], AM.tolist()),
    ('token_mask', AM.tolist(), [[1, 0, 0, 0], [1, 0, 1, 0]]),
    ('icepop', [[1, 0, 0, 0], [1.5, 0, 1.5, 0]], [[1, 0, 0, 0], [1, 0, 1, 0]]),
    ('geo_mask', AM.tolist(), [[0, 0, 0, 0], [1, 0, 1, 1]]),                 # geomeans 0.909 and 1.040
    ('seq_mask_tis', [[0, 0, 0, 0], [1.5, 0, 1.5, 0.5]], [[0, 0, 0, 0], [1, 0, 1, 1]]),
])
def test_each_mode_on_literal_ratios(mode, weights, mask):
    c = _corr(mode, rollout_is_threshold=2.0, is_correction_threshold=BAND)
    assert torch.allclose(c.weights, torch.tensor(weights, dtype=torch.float32), atol=1e-6)
    assert c.mask.tolist() == mask and not c.weights.requires_grad


def test_metrics_of_the_modes():
    m = _corr('token_tis').metrics
    assert m['corr_clipped_frac'] == pytest.approx(1 / 6) and m['corr_masked_frac'] == 0.0
    assert (m['corr_weight_max'], m['corr_weight_min']) == (pytest.approx(2.0), pytest.approx(0.25))
    assert m['corr_weight_mean'] == pytest.approx((1 + 2 + 0.25 + 1.5 + 1.5 + 0.5) / 6)
    assert m['corr_log_ratio_mean'] == pytest.approx((math.log(0.75) + math.log(1.125)) / 6)
    m = _corr('token_mask', is_correction_threshold=BAND).metrics
    assert (m['corr_masked_frac'], m['corr_masked_records']) == (0.5, 2)
    m = _corr('geo_mask', is_correction_threshold=BAND).metrics
    assert (m['corr_masked_frac'], m['corr_masked_records'], m['corr_weight_mean']) == (0.5, 1, 1.0)
    m = off_policy_correction(SLP, SLP, torch.zeros(2, 4), 'icepop').metrics
    assert (m['corr_masked_frac'], m['corr_weight_mean'], m['corr_masked_records']) == (0.0, 1.0, 0)


@pytest.mark.parametrize('mode', CORRECTION_MODES)
def test_packed_segments_equal_padded_rows(mode):
    """The two records of AM laid end to end in one row (with a boundary column between) give the same numbers."""
    row = lambda x, pad: torch.cat([x[0, :3], torch.tensor([pad]), x[1]])[None]     # noqa: E731
    seg = torch.tensor([[0, 0, 0, -1, 1, 1, 1, 1]])
    packed = off_policy_correction(row(SLP + LR, 0.0), row(SLP, 0.0), row(AM, 0.0), mode,
                                   is_correction_threshold=BAND, segment_ids=seg)
    padded = _corr(mode, is_correction_threshold=BAND)
    assert torch.allclose(packed.weights, row(padded.weights, 0.0), atol=1e-6)
    assert torch.equal(packed.mask, row(padded.mask, 0.0))


def test_correction_refuses_bad_input():
    with pytest.raises(ValueError, match=r"unknown mode 'tis'; use one of \['token_tis', 'seq_tis'"):
        _corr('tis')
    with pytest.raises(ValueError, match=r'logp \(2, 4\), sample_logp \(2, 3\) and action_mask \(2, 4\) must all be'):
        off_policy_correction(SLP, SLP[:, :3], AM, 'icepop')
    with pytest.raises(ValueError, match=r'0 < low <= high in is_correction_threshold, got 2.0 and \(3.0, 1.0\)'):
        _corr('icepop', is_correction_threshold=(3.0, 1.0))
    with pytest.raises(ValueError, match=r'segment_ids \(1, 4\) must match action_mask \(2, 4\)'):
        _corr('seq_tis', segment_ids=torch.zeros(1, 4, dtype=torch.long))


# ---------------------------------------------------------------- in grpo_step

@pytest.fixture(scope='module')
def policy(tok):
    torch.manual_seed(0)
    return arl.TinyAgent(tok.vocab_size).eval()


@pytest.fixture(scope='module')
def recs(policy, tasks, tok):
    """3 groups of 2 sampled records with rewards 1 / 0 in each group (every group has signal)."""
    trajs = arl.rollout_batch(policy, [arl.BugFixEnv() for _ in range(6)], [tasks[i // 2] for i in range(6)], tok,
                              generator=torch.Generator().manual_seed(4))
    return [replace(t, reward=float(i % 2 == 0),
                    provenance=replace(t.provenance, group_id=f'g{i // 2}', rollout_id=f'g{i // 2}/{i}'))
            for i, t in enumerate(trajs)]


def _clone(model, tok):
    m = arl.TinyAgent(tok.vocab_size)
    m.load_state_dict(model.state_dict())
    return m


def _step(policy, tok, recs, **kw):
    m = _clone(policy, tok)
    return grpo_step(m, torch.optim.Adam(m.parameters(), lr=0.0), recs, 2, tok.pad_id, GRPOOptions(**kw))


def test_exact_records_leave_every_mode_a_no_op(policy, tok, recs):
    base = _step(policy, tok, recs)
    for mode in CORRECTION_MODES:
        m = _step(policy, tok, recs, correction=mode)
        assert m['ratio_dev0'] == base['ratio_dev0'] and m['ratio_dev0'] < 1e-5
        assert m['corr_masked_frac'] == 0.0 and abs(m['corr_weight_max'] - 1) < 1e-4
        assert m['pg_loss'] == pytest.approx(base['pg_loss'], abs=1e-5) and m['updates'] == 1


def test_stale_sample_logp_is_truncated_or_masked(policy, tok, recs):
    """sample_logp lowered by 1 nat on every action token: r = e > 2 -> TIS weight 2, the band (0.5, 2) masks all."""
    stale = [replace(t, sample_logp=t.sample_logp - t.action_mask) for t in recs]
    m = _step(policy, tok, stale, correction='token_tis', rollout_is_threshold=2.0)
    assert m['corr_clipped_frac'] == 1.0 and m['corr_weight_max'] == 2.0 and m['ratio_dev0'] > 1.7
    assert abs(m['corr_log_ratio_mean'] - 1.0) < 1e-5
    m = _step(policy, tok, stale, correction='token_mask', is_correction_threshold=(0.5, 2.0))
    assert m['corr_masked_frac'] == 1.0 and m['corr_masked_records'] == 6 and m['pg_loss'] == 0.0
    with pytest.raises(ValueError, match=r'GRPO step: max \|ratio - 1\| = 1.72e\+00 > 1e-03 before any update'):
        _step(policy, tok, stale, correction='icepop', ratio_tol=1e-3)
    # the loss is the weighted surrogate against the trainer's own log-probs: literal with weight 2 everywhere
    batch = collate(stale, tok.pad_id)
    adv, _ = grouped_advantages(batch.rewards, group_index(stale, 2))
    with torch.no_grad():
        old, _ = token_log_probs(policy, batch.ids)
        corr = off_policy_correction(old, batch.sample_logp, batch.action_mask, 'token_tis')
        loss, _ = grpo_loss(policy, batch, adv, correction=corr, old_logp=old)
        plain, _ = grpo_loss(policy, batch, adv)
    mask_s = batch.action_mask * (adv != 0)[:, None]
    assert float(loss) == pytest.approx(float(-(2 * adv[:, None] * mask_s).sum() / mask_s.sum()), abs=1e-5)
    assert abs(float(plain) - float(loss)) > 0.1
    with pytest.raises(ValueError, match=r'grpo_loss: a correction needs old_logp'):
        grpo_loss(policy, batch, adv, correction=corr)


# ---------------------------------------------------------------- overlong filtering

def _cut(t, how):
    info = dict(t.info, stop='truncated') if how == 'stop' else dict(t.info, template={'unterminated_turns': [1]})
    return replace(t, info=info)


def test_is_overlong_reads_stop_and_unterminated_turns(recs):
    assert [is_overlong(t) for t in recs] == [False] * 6
    assert is_overlong(_cut(recs[0], 'stop')) and is_overlong(_cut(recs[0], 'template'))
    assert is_overlong(replace(recs[0], info=dict(recs[0].info, truncated_turns=[0])))
    assert not is_overlong(replace(recs[0], info=dict(recs[0].info, template={'unterminated_turns': []})))


def test_overlong_masking_keeps_groups_whole(policy, tok, recs):
    cut = [_cut(t, 'stop') if i == 0 else _cut(t, 'template') if i == 3 else t for i, t in enumerate(recs)]
    base, m = _step(policy, tok, cut), _step(policy, tok, cut, mask_truncated=True)
    assert m['masked_truncated'] == 2 and 'masked_truncated' not in base
    assert (m['zero_var_groups'], m['zero_var_frac']) == (base['zero_var_groups'], base['zero_var_frac']) == (0, 0.0)
    # stats.is_truncated (truncation_rate) reads stop and truncated_turns only; is_overlong adds the template's cuts
    assert m['reward'] == base['reward'] == 0.5 and m['truncation_rate'] == 1 / 6 and m['updates'] == 1
    # the group statistics are the unmasked run's: advantages from all six rewards, the loss on the four kept rows
    batch = collate(cut, tok.pad_id)
    adv, _ = grouped_advantages(batch.rewards, group_index(cut, 2))
    masked, rows = mask_overlong(batch, cut)
    assert rows.tolist() == [True, False, False, True, False, False]
    assert masked.action_mask[[0, 3]].sum() == 0 and torch.equal(masked.action_mask[[1, 2, 4, 5]],
                                                                 batch.action_mask[[1, 2, 4, 5]])
    assert torch.equal(masked.ids, batch.ids) and batch.action_mask[0].sum() > 0     # the input batch is untouched
    assert adv.tolist() == pytest.approx([1, -1, 1, -1, 1, -1], abs=1e-5)
    with torch.no_grad():
        want, _ = grpo_loss(policy, masked, adv)
        kept, _ = grpo_loss(policy, collate([cut[i] for i in (1, 2, 4, 5)], tok.pad_id), adv[[1, 2, 4, 5]])
    assert m['pg_loss'] == pytest.approx(float(want), abs=1e-6) and float(want) == pytest.approx(float(kept), abs=1e-5)
    # every record with signal truncated: nothing to learn, no update
    allcut = [_cut(t, 'stop') for t in recs]
    assert _step(policy, tok, allcut, mask_truncated=True)['updates'] == 0
