"""GRPO on collated batches: group-relative advantages, token-level ratios, PPO clipping (ch. 9).

A GRPO step samples a **group** of G episodes per task, scores each episode relative to its
group, and takes clipped policy-gradient steps on the action tokens. The importance ratio
``exp(logp - sample_logp)`` compares the trainer's recomputed log-probs with the ones stored at
sampling time: before the first update of a step the policy has not moved, so every ratio is 1
up to float rounding when the records are exact (book chapter 5.7, "max |recomputed -
sampled| = 9.5e-07"). A shifted ``sample_logp`` or ``action_mask`` breaks that at once, which
is why :func:`max_ratio_deviation` is the first check of every run.

Normalisation (stated once, used by :func:`clipped_surrogate`): the policy-gradient term is a
**token-level mean** over the action tokens of the rows that carry signal (non-zero advantage),
as in DAPO (Yu et al. 2025). Every action token weighs the same, so a long episode's tokens are
not down-weighted as with GRPO's original per-sequence mean (Shao et al. 2024), whose length
bias Dr. GRPO (Liu et al. 2025) points out; and rows of zero-variance groups are left out of
the denominator as well as the numerator (they carry no signal; keeping them would shrink the
step by the fraction of degenerate groups, DAPO's dynamic-sampling argument). The KL term is
a token-level mean over all action tokens.
"""
from __future__ import annotations

import torch

from ..record import Batch, Trajectory
from ..stats import episode_metrics

__all__ = ['group_advantages', 'check_ratio_records', 'token_log_probs', 'importance_ratio',
           'max_ratio_deviation', 'clipped_surrogate', 'kl_penalty', 'grpo_loss', 'episode_metrics',
           'grpo_step']


def group_advantages(rewards: torch.Tensor, group_size: int, eps: float = 1e-6):
    """Group-relative advantages: reward minus group mean, over group std plus eps.

    Args:
        rewards: ``[B]`` float episode rewards, groups laid out consecutively
            (rows ``g*G .. g*G+G-1`` are the G episodes of group g).
        group_size: G >= 1, episodes per group; B must be a multiple of G.
        eps: added to the std (avoids division by ~0 in near-degenerate groups).

    Returns:
        ``(advantages [B] float32, zero_variance [B // G] bool)``. The std is the population
        std of the group (``correction=0``). A group whose rewards are all equal has
        ``zero_variance`` True and advantage exactly 0.0 on every row: it contributes nothing.

    Raises:
        ValueError: ``rewards`` is not 1-D, ``group_size < 1`` or B is not a multiple of G.

    Source: GRPO outcome supervision, Shao et al. 2024 (DeepSeekMath), section 4.1.2.

    Example:
        >>> group_advantages(torch.tensor([1., 0., 1., 1.]), 2)[1].tolist()
        [False, True]
    """
    if rewards.dim() != 1:
        raise ValueError(f'group_advantages: rewards must be [B], got shape {tuple(rewards.shape)}')
    if group_size < 1 or len(rewards) % group_size:
        raise ValueError(f'group_advantages: {len(rewards)} rewards do not split into groups of {group_size}; '
                         'sample G episodes per task and lay each group out consecutively')
    r = rewards.float().view(-1, group_size)
    zero = (r == r[:, :1]).all(dim=1)
    adv = (r - r.mean(dim=1, keepdim=True)) / (r.std(dim=1, correction=0, keepdim=True) + eps)
    adv = torch.where(zero[:, None], torch.zeros_like(adv), adv)
    return adv.reshape(-1), zero


def check_ratio_records(trajs: list[Trajectory], temperature: float = 1.0) -> None:
    """Refuse records whose ``sample_logp`` cannot enter an importance ratio.

    Args:
        trajs: the records of one step.
        temperature: the temperature the trainer recomputes log-probs at.

    Raises:
        ValueError: naming the record and the fix, when a record has no provenance (the
            sampler is unknown), is a placeholder (``provenance.logp_placeholder``: scripted
            demonstrations carry ``sample_logp = 0.0``; train them with SFT instead), has no
            sampling spec, was sampled at another temperature, or with top-k / top-p / min-p
            truncation or ``logp_mode='raw'`` (the trainer does not reproduce those
            distributions).

    Source: book chapter 5.7 and agentrl spec section 6 (Ch 15: placeholders must not enter a
    ratio).
    """
    for i, t in enumerate(trajs):
        prov = t.provenance
        if prov is None:
            raise ValueError(f'record {i} has no provenance, so its sampler is unknown and its sample_logp cannot '
                             'enter an importance ratio; sample it with rollout/rollout_batch')
        if prov.logp_placeholder:
            raise ValueError(f'record {i} (policy {prov.policy!r}) has placeholder sample_logp '
                             '(provenance.logp_placeholder=True) and must not enter an importance ratio; '
                             'use scripted records for SFT only, and model rollouts for GRPO')
        spec = prov.sampling
        if spec is None:
            raise ValueError(f'record {i} has no sampling spec in its provenance; its sample_logp cannot enter an '
                             'importance ratio')
        if abs(spec.temperature - temperature) > 1e-9:
            raise ValueError(f'record {i} was sampled at temperature {spec.temperature} but the ratio is computed '
                             f'at {temperature}; pass temperature={spec.temperature}')
        if spec.top_k or spec.top_p < 1.0 or spec.min_p > 0.0 or spec.logp_mode != 'processed':
            raise ValueError(f'record {i} was sampled with truncation or raw log-probs ({spec}); the trainer '
                             'recomputes untruncated processed log-probs, so the ratio would be wrong')


def token_log_probs(model, ids: torch.Tensor, temperature: float = 1.0):
    """Log-prob of each predicted token and the entropy of its distribution, at a temperature.

    Args:
        model: ids ``[B, T]`` -> logits ``[B, T, V]``.
        ids: ``[B, T]`` int64.
        temperature: > 0; the distribution sampled from is ``softmax(logits / temperature)``
            (the one ``sample_next`` records).

    Returns:
        ``(logp [B, T-1] float32 nats, entropy [B, T-1] float32 nats)``; column j scores
        ``ids[:, j+1]``. ``logp`` carries gradients when called with grad enabled; ``entropy``
        (of the whole next-token distribution) never does.

    Raises:
        ValueError: ``temperature <= 0`` (greedy records have no density to ratio against).

    Source: book chapter 3.4 (``sequence_log_probs``), with the sampler's temperature.
    """
    if not temperature > 0:
        raise ValueError(f'token_log_probs: temperature must be > 0, got {temperature}')
    logits = model(ids)[:, :-1].float() / temperature
    logp_all = torch.log_softmax(logits, dim=-1)
    logp = logp_all.gather(-1, ids[:, 1:, None]).squeeze(-1)
    with torch.no_grad():                       # a metric, never part of the loss
        entropy = -(logp_all.exp() * logp_all).sum(-1)
    return logp, entropy


def importance_ratio(logp: torch.Tensor, sample_logp: torch.Tensor, action_mask: torch.Tensor) -> torch.Tensor:
    """Token-level importance ratio ``exp(logp - sample_logp)`` on action tokens.

    Args:
        logp: ``[B, T-1]`` recomputed log-probs (nats).
        sample_logp: ``[B, T-1]`` log-probs stored at sampling time (nats).
        action_mask: ``[B, T-1]`` float32.

    Returns:
        ``[B, T-1]`` float32; exactly 1.0 where ``action_mask == 0`` (the difference is masked
        before the exponential, so padding and tool positions can never overflow).

    Source: PPO, Schulman et al. 2017 (r_t = pi / pi_old), per token as in GRPO.
    """
    return torch.exp((logp - sample_logp) * action_mask)


def max_ratio_deviation(logp: torch.Tensor, sample_logp: torch.Tensor, action_mask: torch.Tensor) -> float:
    """``max |ratio - 1|`` over action tokens: ~1e-6 for exact records before any update.

    A ``sample_logp`` or ``action_mask`` shifted by one position drives it far above 1e-5.

    Args:
        logp, sample_logp, action_mask: ``[B, T-1]`` as in :func:`importance_ratio`.

    Returns:
        float (0.0 when the mask selects nothing).
    """
    with torch.no_grad():
        dev = (importance_ratio(logp, sample_logp, action_mask) - 1).abs() * action_mask
    return float(dev.max()) if dev.numel() else 0.0


def clipped_surrogate(logp, sample_logp, advantages, action_mask, clip_eps: float = 0.2):
    """PPO-clipped policy-gradient loss, token-level mean over rows with signal.

    Args:
        logp: ``[B, T-1]`` recomputed log-probs with gradient.
        sample_logp: ``[B, T-1]`` stored sampling log-probs.
        advantages: ``[B]`` float, one per episode (broadcast over its action tokens).
        action_mask: ``[B, T-1]`` float32.
        clip_eps: PPO clip range epsilon (ratio clipped to ``[1 - eps, 1 + eps]``).

    Returns:
        ``(loss, stats)``: scalar ``-sum(mask_s * min(r A, clip(r) A)) / sum(mask_s)`` where
        ``mask_s`` is the action mask of rows with ``A != 0`` (0.0, still differentiable, when
        no row has signal); ``stats`` floats ``ratio_mean``, ``ratio_max``, ``ratio_dev``
        (max ``|r - 1|``) over all action tokens, ``clip_frac`` (fraction of action tokens of
        rows with signal where the clipped term is the active one).
        Tokens with ``action_mask == 0`` have no effect on the loss or its gradient.

    Raises:
        ValueError: shapes disagree.

    Source: PPO clip, Schulman et al. 2017, eq. 7; token-level mean as in DAPO, Yu et al. 2025
    (see the module docstring for why).
    """
    if logp.shape != sample_logp.shape or logp.shape != action_mask.shape or advantages.shape != logp.shape[:1]:
        raise ValueError(f'clipped_surrogate: logp {tuple(logp.shape)}, sample_logp {tuple(sample_logp.shape)}, '
                         f'action_mask {tuple(action_mask.shape)} must be [B, T-1] and advantages '
                         f'{tuple(advantages.shape)} must be [B]')
    ratio = importance_ratio(logp, sample_logp, action_mask)
    adv = advantages[:, None].to(logp.dtype)
    unclipped, clipped = ratio * adv, ratio.clamp(1 - clip_eps, 1 + clip_eps) * adv
    mask_s = action_mask * (advantages != 0).to(action_mask.dtype)[:, None]
    n_s = mask_s.sum()
    loss = -(torch.minimum(unclipped, clipped) * mask_s).sum() / n_s.clamp(min=1)
    with torch.no_grad():
        n = action_mask.sum().clamp(min=1)
        r = ratio.detach()
        stats = {'ratio_mean': float((r * action_mask).sum() / n),
                 'ratio_max': float((r * action_mask).max()) if action_mask.any() else 1.0,
                 'ratio_dev': float(((r - 1).abs() * action_mask).max()) if r.numel() else 0.0,
                 'clip_frac': float(((clipped < unclipped).float() * mask_s).sum() / n_s.clamp(min=1))}
    return loss, stats


def kl_penalty(logp: torch.Tensor, ref_logp: torch.Tensor, action_mask: torch.Tensor) -> torch.Tensor:
    """KL(policy || reference) estimate on action tokens, token-level mean.

    Args:
        logp: ``[B, T-1]`` policy log-probs (with gradient).
        ref_logp: ``[B, T-1]`` reference (SFT) model log-probs of the same tokens.
        action_mask: ``[B, T-1]`` float32.

    Returns:
        scalar: mean over action tokens of ``exp(ref - logp) - (ref - logp) - 1`` (>= 0, an
        unbiased estimator of KL on samples from the policy).

    Source: the k3 estimator (Schulman 2020, "Approximating KL divergence"), as used by GRPO,
    Shao et al. 2024, eq. 4.
    """
    d = (ref_logp - logp) * action_mask
    return ((torch.exp(d) - d - 1) * action_mask).sum() / action_mask.sum().clamp(min=1)


def grpo_loss(model, batch: Batch, advantages: torch.Tensor, clip_eps: float = 0.2, kl_coef: float = 0.0,
              ref_logp: torch.Tensor | None = None, temperature: float = 1.0):
    """GRPO loss of a collated batch: clipped surrogate plus optional KL to a reference.

    Args:
        model: the policy, ids ``[B, T]`` -> logits ``[B, T, V]``.
        batch: :class:`~agentrl.record.Batch` of sampled records (already passed through
            :func:`check_ratio_records`).
        advantages: ``[B]`` from :func:`group_advantages`.
        clip_eps: PPO clip epsilon.
        kl_coef: weight of :func:`kl_penalty` (0 disables; needs ``ref_logp``).
        ref_logp: ``[B, T-1]`` reference log-probs (no gradient), or None.
        temperature: the records' sampling temperature.

    Returns:
        ``(loss, metrics)``: scalar loss with graph; metrics floats ``pg_loss``, ``kl``,
        ``entropy`` (mean over action tokens, nats) and the stats of :func:`clipped_surrogate`.

    Raises:
        ValueError: ``kl_coef > 0`` without ``ref_logp``; shapes disagree.
    """
    if kl_coef > 0 and ref_logp is None:
        raise ValueError('grpo_loss: kl_coef > 0 needs ref_logp (log-probs of the SFT reference model)')
    logp, entropy = token_log_probs(model, batch.ids, temperature)
    mask = batch.action_mask
    pg, stats = clipped_surrogate(logp, batch.sample_logp, advantages, mask, clip_eps)
    kl = kl_penalty(logp, ref_logp, mask) if ref_logp is not None else torch.zeros(())
    loss = pg + kl_coef * kl if kl_coef > 0 else pg
    with torch.no_grad():
        ent = float((entropy * mask).sum() / mask.sum().clamp(min=1))
    return loss, dict(stats, pg_loss=float(pg.detach()), kl=float(kl.detach()), entropy=ent)


def grpo_step(model, optimizer, trajs: list[Trajectory], group_size: int, pad_id: int, *, updates: int = 1,
              clip_eps: float = 0.2, kl_coef: float = 0.0, ref_model=None, temperature: float = 1.0,
              max_grad_norm: float = 1.0, eps: float = 1e-6, ratio_tol: float | None = None) -> dict:
    """One GRPO step on sampled groups: check, collate, advantages, ``updates`` clipped updates.

    Args:
        model: the policy that sampled ``trajs`` (not updated since; put in train mode here).
        optimizer: torch optimiser over ``model``'s parameters.
        trajs: ``n_groups * G`` records from ``rollout_batch``, each group consecutive.
        group_size: G.
        pad_id: the tokenizer's pad id (for :func:`~agentrl.batching.collate`).
        updates: optimiser updates on this batch (> 1 makes the ratio and the clip matter).
        clip_eps: PPO clip epsilon.
        kl_coef: KL weight; needs ``ref_model`` when > 0.
        ref_model: frozen reference (the SFT model), or None.
        temperature: the records' sampling temperature.
        max_grad_norm: global gradient-norm clip (<= 0 disables).
        eps: std offset of :func:`group_advantages`.
        ratio_tol: when given, raise if ``max |ratio - 1|`` before the first update exceeds it.

    Returns:
        dict of floats: :func:`episode_metrics`, ``zero_var_frac`` (fraction of groups with
        equal rewards), ``zero_var_groups`` (count), ``ratio_dev0`` (max ``|ratio - 1|`` before
        the first update), ``ratio_mean`` / ``clip_frac`` / ``pg_loss`` / ``kl`` / ``entropy``
        (means over updates), ``ratio_max`` (max over updates), ``grad_norm`` (last update),
        ``updates`` (0 when no group has reward variance and ``kl_coef == 0``: the gradient is
        exactly zero, and the step is skipped so Adam's momentum cannot move the weights).

    Raises:
        ValueError: from :func:`check_ratio_records` (placeholder or mismatched records), from
            :func:`group_advantages`, or when ``ratio_tol`` is exceeded (the records are not exact:
            a shifted ``sample_logp`` or ``action_mask``, or another sampler).
    """
    from ..batching import collate
    check_ratio_records(trajs, temperature)
    if kl_coef > 0 and ref_model is None:
        raise ValueError('grpo_step: kl_coef > 0 needs ref_model (the frozen SFT model)')
    batch = collate(trajs, pad_id, getattr(model, 'max_len', None))
    adv, zero = group_advantages(batch.rewards, group_size, eps)
    ref_logp = None
    if kl_coef > 0:
        with torch.no_grad():
            ref_logp, _ = token_log_probs(ref_model, batch.ids, temperature)
    model.train()
    # No row with signal and no KL: the gradient is exactly zero, but Adam's momentum would still
    # move the weights, so a step with nothing to learn makes no update at all.
    skip = not bool((adv != 0).any()) and kl_coef == 0
    acc: dict = {'updates': 0 if skip else max(1, updates)}
    for u in range(max(1, updates)):
        loss, m = grpo_loss(model, batch, adv, clip_eps, kl_coef, ref_logp, temperature)
        if u == 0:
            acc['ratio_dev0'] = m['ratio_dev']
            if ratio_tol is not None and m['ratio_dev'] > ratio_tol:
                raise ValueError(f'GRPO step: max |ratio - 1| = {m["ratio_dev"]:.2e} > {ratio_tol:.0e} before any '
                                 'update; sample_logp or action_mask is misaligned with ids[:, 1:] or the records '
                                 'were not sampled by this model at this temperature')
        n_avg = 1 if skip else max(1, updates)
        for k in ('ratio_mean', 'clip_frac', 'pg_loss', 'kl', 'entropy'):
            acc[k] = acc.get(k, 0.0) + m[k] / n_avg
        acc['ratio_max'] = max(acc.get('ratio_max', 0.0), m['ratio_max'])
        if skip:
            acc['grad_norm'] = 0.0
            break
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        acc['grad_norm'] = float(torch.nn.utils.clip_grad_norm_(
            model.parameters(), max_grad_norm if max_grad_norm > 0 else float('inf')))
        optimizer.step()
    return dict(episode_metrics(trajs), zero_var_frac=float(zero.float().mean()), zero_var_groups=int(zero.sum()),
                **acc)
