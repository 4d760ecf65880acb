"""L1: off-policy correction of the sampler/trainer mismatch: truncated IS weights and rejection masks.

The sampler's stored ``sample_logp`` and the trainer's own log-probs of the same tokens differ
(another kernel, dtype or a stale policy). :func:`off_policy_correction` turns the per-token
log-ratio ``log(pi_train / pi_rollout) = logp - sample_logp`` into a per-token **weight** (no
gradient) and a **mask** (tokens kept); a loss multiplies each action token's term by
``weight`` and averages over ``mask`` (:func:`agentrl.train.grpo.clipped_surrogate`).

Modes and their sources (formulas read from the installed packages, tested equal to them within
1e-6 in ``tests/interop/test_correction.py``):

=================  ===================================================  ==========================================
mode               weight / mask                                        peer function
=================  ===================================================  ==========================================
``token_tis``      w = min(r_t, C), mask = action                       verl ``compute_rollout_correction_weights``
                                                                        (rollout_is='token', float threshold);
                                                                        OpenRLHF ``PolicyLoss`` level token, mode clip
``seq_tis``        w = min(prod_t r_t, C) on every token of the record  verl, rollout_is='sequence'
``token_mask``     w = 1, mask = action and low <= r_t <= high (MIS)    verl ``compute_rollout_rejection_mask``
                                                                        (rollout_rs='token_k1')
``icepop``         w = r_t, mask = action and low <= r_t <= high        verl rollout_is='token', 'low_high' threshold;
                                                                        OpenRLHF level token, mode mask, gating ratio
``geo_mask``       w = 1, mask = action and low <= geomean_t(r_t)       verl rollout_rs='seq_mean_k1'
                   <= high (whole record kept or dropped)
``seq_mask_tis``   w = r_t, mask = ``geo_mask``'s                       OpenRLHF level seq, mode mask, gating ratio
=================  ===================================================  ==========================================

``r_t = exp(clamp(logp - sample_logp, -20, 20))`` (verl's ``SAFETY_BOUND``); sequence products
are ``exp(clamp(sum log r, -20, 20))``. Thresholds keep the peers' names: ``rollout_is_threshold``
(C, verl's upper truncation, default 2.0) and ``is_correction_threshold`` ((low, high) on the
ratio pi_train / pi_rollout, OpenRLHF's band, default (0.5, 5.0)). Note verl's ``*_k1`` rejection
statistics are ``-log r`` (rollout over train): its ``'lower_upper'`` spec keeps
``1/upper <= r <= 1/lower``, so (low, high) here is verl's ``f'{1/high}_{1/low}'``.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

__all__ = ['CORRECTION_MODES', 'SAFETY_BOUND', 'Correction', 'off_policy_correction']

#: verl's bound on log-ratios before exponentiating (``rollout_corr_helper.SAFETY_BOUND``)
SAFETY_BOUND = 20.0
CORRECTION_MODES = ('token_tis', 'seq_tis', 'token_mask', 'icepop', 'geo_mask', 'seq_mask_tis')


@dataclass
class Correction:
    """Result of :func:`off_policy_correction`.

    Attributes:
        weights: ``[B, T-1]`` float32, no gradient; 0.0 outside the action mask.
        mask: ``[B, T-1]`` float32, the action mask with rejected tokens set to 0.
        metrics: floats ``corr_weight_mean`` / ``_max`` / ``_min`` (over kept action tokens; 1.0
            when none is kept), ``corr_masked_frac`` (action tokens rejected / action tokens),
            ``corr_masked_records`` (rows with a rejected action token: records, unless packed), ``corr_clipped_frac``
            (action tokens whose weight was truncated at C), ``corr_log_ratio_mean`` (mean
            ``logp - sample_logp`` over action tokens, nats).
    """
    weights: torch.Tensor
    mask: torch.Tensor
    metrics: dict = field(default_factory=dict)


def _segments(action_mask, segment_ids):
    """Per-column record number ``[B, T-1]`` (>= 0 where it matters) and the number of records."""
    if segment_ids is None:
        B, W = action_mask.shape
        return torch.arange(B, device=action_mask.device)[:, None].expand(B, W), B
    if segment_ids.shape != action_mask.shape:
        raise ValueError(f'off_policy_correction: segment_ids {tuple(segment_ids.shape)} must match action_mask '
                         f'{tuple(action_mask.shape)}')
    seg = segment_ids.long().clamp(min=0)
    return seg, int(seg.max()) + 1 if seg.numel() else 0


def _per_record(values, valid, seg, n, reduce):
    """Sum or mean of ``values`` over each record's valid columns, broadcast back to ``[B, T-1]``."""
    flat_seg = seg[valid]
    tot = torch.zeros(n, dtype=values.dtype, device=values.device).index_add_(0, flat_seg, values[valid])
    if reduce == 'mean':
        cnt = torch.zeros(n, dtype=values.dtype, device=values.device).index_add_(
            0, flat_seg, torch.ones_like(values[valid]))
        tot = tot / cnt.clamp(min=1)
    return tot[seg]


def off_policy_correction(logp: torch.Tensor, sample_logp: torch.Tensor, action_mask: torch.Tensor, mode: str, *,
                          rollout_is_threshold: float = 2.0,
                          is_correction_threshold: tuple[float, float] = (0.5, 5.0),
                          segment_ids: torch.Tensor | None = None) -> Correction:
    """Importance weights and rejection mask of one off-policy correction mode (module table).

    Args:
        logp: ``[B, T-1]`` trainer log-probs of the sampled tokens (nats; detached here), taken
            before any update of the step (verl's ``old_log_prob``).
        sample_logp: ``[B, T-1]`` stored sampling log-probs (verl's ``rollout_log_prob``).
        action_mask: ``[B, T-1]`` float32 (verl's ``response_mask``).
        mode: one of :data:`CORRECTION_MODES`.
        rollout_is_threshold: C > 0, the truncation of ``token_tis`` / ``seq_tis`` (verl's name).
        is_correction_threshold: ``(low, high)`` with 0 < low <= high, the ratio band of
            ``token_mask`` / ``icepop`` / ``geo_mask`` / ``seq_mask_tis`` (OpenRLHF's name).
        segment_ids: ``[B, T-1]`` int64 record of each column for packed rows (e.g.
            ``PackedBatch.segment_of()[:, 1:]``); None: each row is one record.

    Returns:
        :class:`Correction` (weights, mask, metrics).

    Raises:
        ValueError: an unknown mode, shapes that disagree, a threshold out of range.

    Source: verl 0.9.1 ``verl/trainer/ppo/rollout_corr_helper.py`` (``compute_rollout_correction_weights``,
    ``compute_rollout_rejection_mask``); OpenRLHF 0.11.2 ``openrlhf/models/loss.py`` (``PolicyLoss.forward``);
    IcePop: Ling team 2025 (ratio band mask); TIS: Yao et al. 2025, "Your efficient RL framework
    secretly brings you off-policy RL training".
    """
    if mode not in CORRECTION_MODES:
        raise ValueError(f'off_policy_correction: unknown mode {mode!r}; use one of {list(CORRECTION_MODES)}')
    if logp.shape != sample_logp.shape or logp.shape != action_mask.shape or logp.dim() != 2:
        raise ValueError(f'off_policy_correction: logp {tuple(logp.shape)}, sample_logp {tuple(sample_logp.shape)} '
                         f'and action_mask {tuple(action_mask.shape)} must all be [B, T-1]')
    low, high = (float(v) for v in is_correction_threshold)
    if not rollout_is_threshold > 0 or not 0 < low <= high:
        raise ValueError(f'off_policy_correction: need rollout_is_threshold > 0 and 0 < low <= high in '
                         f'is_correction_threshold, got {rollout_is_threshold} and {is_correction_threshold}')
    valid = action_mask > 0
    am = valid.to(torch.float32)
    lr = torch.where(valid, logp.detach().float() - sample_logp.float(), 0.0)
    ratio = torch.exp(lr.clamp(-SAFETY_BOUND, SAFETY_BOUND)) * am
    keep, clipped = valid, torch.zeros_like(valid)
    if mode in ('token_tis', 'seq_tis'):
        seg, n = _segments(action_mask, segment_ids)
        raw = ratio if mode == 'token_tis' else torch.exp(
            _per_record(lr, valid, seg, n, 'sum').clamp(-SAFETY_BOUND, SAFETY_BOUND)) * am
        weights, clipped = raw.clamp(max=rollout_is_threshold), valid & (raw > rollout_is_threshold)
    elif mode in ('token_mask', 'icepop'):
        keep = valid & (ratio >= low) & (ratio <= high)
        weights = am if mode == 'token_mask' else ratio
    else:                                                    # geo_mask, seq_mask_tis: geometric mean per record
        seg, n = _segments(action_mask, segment_ids)
        geo = torch.exp(_per_record(lr, valid, seg, n, 'mean'))
        keep = valid & (geo >= low) & (geo <= high)
        weights = am if mode == 'geo_mask' else ratio
    mask = keep.to(torch.float32)
    weights = (weights * mask if mode in ('icepop', 'seq_mask_tis') else weights).detach()
    return Correction(weights, mask, _metrics(weights, mask, valid, keep, clipped, lr))


def _metrics(weights, mask, valid, keep, clipped, lr) -> dict:
    n = int(valid.sum())
    kept = weights[keep]
    rejected = valid & ~keep
    return {'corr_weight_mean': float(kept.mean()) if kept.numel() else 1.0,
            'corr_weight_max': float(kept.max()) if kept.numel() else 1.0,
            'corr_weight_min': float(kept.min()) if kept.numel() else 1.0,
            'corr_masked_frac': float(rejected.sum()) / n if n else 0.0,
            'corr_masked_records': int(rejected.any(dim=1).sum()),
            'corr_clipped_frac': float(clipped.sum()) / n if n else 0.0,
            'corr_log_ratio_mean': float(lr[valid].mean()) if n else 0.0}
