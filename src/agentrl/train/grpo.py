"""GRPO on collated batches: group-relative advantages, token-level ratios, PPO clipping (ch. 9).

A GRPO step samples a group (docs/design.md#names) per task, scores each episode relative to its
group, and takes clipped policy-gradient steps on the action tokens (docs/design.md#training). The
importance ratio ``exp(logp - sample_logp)`` is 1 before the first update of a step when the records are
exact (docs/design.md#replay; book chapter 5.7, "max |recomputed - sampled| = 9.5e-07"). A shifted
``sample_logp`` or ``action_mask`` breaks that at once, which is why :func:`max_ratio_deviation` is the first
check of every run.

Normalisation is docs/design.md#training's token mean (used by :func:`clipped_surrogate`; DAPO, Yu et al.
2025). Why: every action token weighs the same, so a long episode's tokens are
not down-weighted as with GRPO's original per-sequence mean (Shao et al. 2024), whose length
bias Dr. GRPO (Liu et al. 2025) points out; and rows of zero-variance groups are left out of
the denominator as well as the numerator (they carry no signal; keeping them would shrink the
step by the fraction of degenerate groups, DAPO's dynamic-sampling argument). The KL term is
a token-level mean over all action tokens.
"""
from __future__ import annotations

import contextlib
from dataclasses import replace

import torch

from ..batching import collate
from ..checks.errors import GroupSizeError, MissingGroupError
from ..checks.replay import require_trainable
from ..checks.staleness import require_fresh, require_one_version, sampled_by
from ..record import Batch, SamplingSpec, Trajectory
from ..sampling import token_logp
from ..stats import episode_metrics, is_truncated
from ..correction import Correction, off_policy_correction
from .options import GRPOOptions
from .packed import pack_for, packed_log_probs

__all__ = ['group_advantages', 'group_index', 'grouped_advantages', 'token_log_probs', 'importance_ratio',
           'max_ratio_deviation', 'clipped_surrogate', 'kl_penalty', 'grpo_loss', 'episode_metrics',
           'scoring_mode', 'is_overlong', 'mask_overlong', 'grpo_step', 'GRPOOptions']


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


def group_index(trajs: list[Trajectory], group_size: int) -> torch.Tensor:
    """Each record's group, read from its sampling identity ``provenance.group_id``.

    Args:
        trajs: the records of one step, in any order.
        group_size: G, the declared number of records per group.

    Returns:
        ``[B]`` int64 group number of each record (0, 1, ... in order of first appearance).

    Raises:
        MissingGroupError: a record without provenance or with an empty ``group_id`` while
            ``group_size > 1`` (fix: sample groups with identities, e.g.
            ``rollout_batch(..., identities=...)``).
        GroupSizeError: a group with another number of records than ``group_size`` (a lost or
            duplicated episode; fix: drop the incomplete group or resample it).
        ValueError: ``group_size < 1``.
    """
    if group_size < 1:
        raise ValueError(f'group_index: group_size must be >= 1, got {group_size}')
    if group_size == 1:
        return torch.arange(len(trajs))
    ids: dict = {}
    out = []
    for i, t in enumerate(trajs):
        gid = t.provenance.group_id if t.provenance is not None else ''
        if not gid:
            raise MissingGroupError(f'of record {i} is empty, but group-relative advantages (group_size={group_size}) '
                                    'need each record\'s group', field='provenance.group_id',
                                    fix='record the group identity at sampling time (rollout_batch(..., identities=...))')
        out.append(ids.setdefault(gid, len(ids)))
    index = torch.tensor(out, dtype=torch.long)
    sizes = torch.bincount(index, minlength=len(ids))
    bad = (sizes != group_size).nonzero().flatten()
    if len(bad):
        name = list(ids)[int(bad[0])]
        raise GroupSizeError(f'{name!r} holds {int(sizes[bad[0]])} records but group_size is {group_size}',
                             field='provenance.group_id', count=len(bad),
                             fix='train complete groups only (drop or resample a group that lost or repeated an '
                                 'episode), or pass the group size the records were sampled with')
    return index


def grouped_advantages(rewards: torch.Tensor, groups: torch.Tensor, eps: float = 1e-6):
    """Group-relative advantages with groups given per row (any row order).

    Args:
        rewards: ``[B]`` float episode rewards.
        groups: ``[B]`` int64 group number of each row (:func:`group_index`), groups of equal size.
        eps: added to the std.

    Returns:
        ``(advantages [B] float32, zero_variance [n_groups] bool)``: the same numbers as
        :func:`group_advantages` on the rows sorted by group, put back in the rows' order, so
        shuffling the records permutes the advantages with them and changes none.

    Raises:
        ValueError: shapes disagree, or groups of unequal size.
    """
    if rewards.dim() != 1 or groups.shape != rewards.shape:
        raise ValueError(f'grouped_advantages: rewards {tuple(rewards.shape)} and groups {tuple(groups.shape)} must '
                         'both be [B]')
    if not len(rewards):
        return rewards.float(), torch.zeros(0, dtype=torch.bool)
    order = torch.sort(groups, stable=True).indices
    size = int(torch.bincount(groups).max())
    adv_sorted, zero = group_advantages(rewards[order], size, eps)
    adv = torch.empty_like(adv_sorted)
    adv[order] = adv_sorted
    return adv, zero


def token_log_probs(model, ids: torch.Tensor, temperature: float = 1.0, *, spec: SamplingSpec | None = None):
    """Log-prob of each predicted token under the records' sampler, and each position's entropy.

    Args:
        model: ids ``[B, T]`` -> logits ``[B, T, V]`` (or an output with ``.logits``).
        ids: ``[B, T]`` int64.
        temperature: > 0; the distribution sampled from is ``softmax(logits / temperature)``.
        spec: instead of ``temperature``, the records' :class:`~agentrl.record.SamplingSpec`: the
            log-probs are those of its *processed* distribution (temperature, then top-k / top-p /
            min-p support, renormalised), the distribution the tokens were drawn from.

    Returns:
        ``(logp [B, T-1] float32 nats, entropy [B, T-1] float32 nats)``; column j scores
        ``ids[:, j+1]``. ``logp`` carries gradients when called with grad enabled; ``entropy``
        (of the whole next-token distribution) never does.

    Raises:
        ValueError: ``temperature <= 0`` (greedy records have no density to ratio against).

    Source: book chapter 3.4 (``sequence_log_probs``); the gather is :func:`agentrl.sampling.token_logp`.
    """
    if spec is None and not temperature > 0:
        raise ValueError(f'token_log_probs: temperature must be > 0, got {temperature}')
    return token_logp(_logits_of(model), ids, spec if spec is not None else SamplingSpec(temperature=temperature),
                      entropy=True)


def _logits_of(model):
    """``ids -> logits`` for modules that return logits or an output object with ``.logits``."""
    def f(ids):
        out = model(ids)
        return getattr(out, 'logits', out)
    return f


@contextlib.contextmanager
def scoring_mode(*models):
    """Score with dropout disabled: put the modules in eval mode, restore their modes after.

    The importance ratio compares the trainer's log-probs with those of sampling, which ran in
    eval mode; scoring in train mode would let dropout move the ratio off 1 before any update
    (``max |ratio - 1|`` 0.105 with p = 0.1 on one TinyAgent block). Gradients still flow.
    This is what common GRPO trainers do: TRL's ``GRPOTrainer`` and verl disable dropout in
    the policy they train (attention and hidden dropout of Hugging Face configs included).
    """
    mods = [m for m in models if isinstance(m, torch.nn.Module)]
    was = [m.training for m in mods]
    for m in mods:
        m.eval()
    try:
        yield
    finally:
        for m, w in zip(mods, was):
            m.train(w)


def importance_ratio(logp: torch.Tensor, sample_logp: torch.Tensor, action_mask: torch.Tensor) -> torch.Tensor:
    """Token-level importance ratio ``exp(logp - sample_logp)`` on action tokens.

    Args:
        logp: ``[B, T-1]`` recomputed log-probs (nats).
        sample_logp: ``[B, T-1]`` log-probs stored at sampling time (nats).
        action_mask: ``[B, T-1]`` float32.

    Returns:
        ``[B, T-1]`` float32; exactly 1.0 where ``action_mask == 0`` (the difference is masked
        before the exponential, so padding and tool positions can never overflow, and a context
        token outside a truncated sampler's support, log-prob ``-inf``, cannot make a NaN).

    Source: PPO, Schulman et al. 2017 (r_t = pi / pi_old), per token as in GRPO.
    """
    return torch.exp(torch.where(action_mask > 0, (logp - sample_logp) * action_mask, 0.0))


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


def clipped_surrogate(logp, sample_logp, advantages, action_mask, clip_eps: float = 0.2,
                      weights: torch.Tensor | None = None):
    """PPO-clipped policy-gradient loss, token-level mean over rows with signal.

    Args:
        logp: ``[B, T-1]`` recomputed log-probs with gradient.
        sample_logp: ``[B, T-1]`` the ratio's anchor: the stored sampling log-probs, or with an
            off-policy correction the trainer's log-probs before the step's first update.
        advantages: ``[B]`` float, one per episode (broadcast over its action tokens).
        action_mask: ``[B, T-1]`` float32.
        clip_eps: PPO clip range epsilon (ratio clipped to ``[1 - eps, 1 + eps]``).
        weights: optional ``[B, T-1]`` per-token importance weights without gradient
            (:class:`~agentrl.correction.Correction` ``weights``) multiplying each term.

    Returns:
        ``(loss, stats)``: scalar ``-sum(mask_s * w * min(r A, clip(r) A)) / sum(mask_s)`` (w = 1 without
        ``weights``) where
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
    term = torch.minimum(unclipped, clipped) * (mask_s if weights is None else mask_s * weights.detach())
    loss = -term.sum() / n_s.clamp(min=1)
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
    d = torch.where(action_mask > 0, (ref_logp - logp) * action_mask, 0.0)
    return ((torch.exp(d) - d - 1) * action_mask).sum() / action_mask.sum().clamp(min=1)


def grpo_loss(model, batch: Batch, advantages: torch.Tensor, clip_eps: float = 0.2, kl_coef: float = 0.0,
              ref_logp: torch.Tensor | None = None, temperature: float = 1.0, *, spec: SamplingSpec | None = None,
              correction: Correction | None = None, old_logp: torch.Tensor | None = None, packed=None):
    """GRPO loss of a collated batch: clipped surrogate plus optional KL to a reference.

    Args:
        model: the policy, ids ``[B, T]`` -> logits ``[B, T, V]``.
        batch: :class:`~agentrl.record.Batch` of sampled records (already passed through
            :func:`agentrl.checks.require_trainable`).
        advantages: ``[B]`` from :func:`group_advantages`.
        clip_eps: PPO clip epsilon.
        kl_coef: weight of :func:`kl_penalty` (0 disables; needs ``ref_logp``).
        ref_logp: ``[B, T-1]`` reference log-probs (no gradient), or None.
        temperature: the records' sampling temperature (when ``spec`` is None).
        spec: the records' :class:`~agentrl.record.SamplingSpec`: log-probs of its processed
            distribution (see :func:`token_log_probs`).
        correction: an off-policy :class:`~agentrl.correction.Correction` of this batch, or
            None. Given, its ``mask`` replaces the action mask, its ``weights`` multiply the
            surrogate, and the PPO ratio is taken against ``old_logp`` (decoupled PPO, as verl and
            OpenRLHF: the weight corrects sampler to trainer, the ratio trainer to trainer).
        old_logp: ``[B, T-1]`` trainer log-probs before the step's first update (with ``correction``).
        packed: the same records as a :class:`~agentrl.packing.PackedBatch` (row order of ``batch``):
            the log-probs come from one packed forward (:func:`agentrl.train.packed.packed_log_probs`).

    Returns:
        ``(loss, metrics)``: scalar loss with graph; metrics floats ``pg_loss``, ``kl``,
        ``entropy`` (mean over action tokens, nats) and the stats of :func:`clipped_surrogate`.

    Raises:
        ValueError: ``kl_coef > 0`` without ``ref_logp``; ``correction`` without ``old_logp``; shapes disagree.
    """
    if kl_coef > 0 and ref_logp is None:
        raise ValueError('grpo_loss: kl_coef > 0 needs ref_logp (log-probs of the SFT reference model)')
    if correction is not None and old_logp is None:
        raise ValueError('grpo_loss: a correction needs old_logp (the trainer\'s log-probs before the first update)')
    logp, entropy = _score(model, batch, spec, temperature, packed)
    if correction is None:
        mask = batch.action_mask
        pg, stats = clipped_surrogate(logp, batch.sample_logp, advantages, mask, clip_eps)
    else:
        mask = correction.mask
        pg, stats = clipped_surrogate(logp, old_logp, advantages, mask, clip_eps, correction.weights)
    kl = kl_penalty(logp, ref_logp, mask) if ref_logp is not None else torch.zeros(())
    loss = pg + kl_coef * kl if kl_coef > 0 else pg
    with torch.no_grad():
        ent = float((entropy * mask).sum() / mask.sum().clamp(min=1))
    return loss, dict(stats, pg_loss=float(pg.detach()), kl=float(kl.detach()), entropy=ent)


def is_overlong(traj: Trajectory) -> bool:
    """Whether a record was cut short: :func:`agentrl.stats.is_truncated` (``info['stop']`` truncated, or
    ``info['truncated_turns']``) or a turn the template closed after a cut (``info['template']['unterminated_turns']``,
    written by :class:`~agentrl.templates.ChatRecorder`)."""
    template = (traj.info or {}).get('template')
    return is_truncated(traj) or (isinstance(template, dict) and bool(template.get('unterminated_turns')))


def mask_overlong(batch: Batch, trajs: list[Trajectory]) -> tuple[Batch, torch.Tensor]:
    """Overlong filtering: zero the action mask of the rows of overlong records (:func:`is_overlong`).

    Args:
        batch: the collated ``trajs`` (row b is ``trajs[b]``).
        trajs: the B records.

    Returns:
        ``(batch, cut)``: a new :class:`~agentrl.record.Batch` whose ``action_mask`` is 0 on the cut
        rows (other fields shared), and ``cut`` ``[B]`` bool.

    Source: DAPO's overlong filtering (Yu et al. 2025, section 3.4): a truncated answer's reward
    says nothing about its tokens, so they get no gradient; apply it after the group advantages
    (the group statistics keep every record).
    """
    cut = torch.tensor([is_overlong(t) for t in trajs], dtype=torch.bool)
    keep = (~cut).to(batch.action_mask.dtype)[:, None]
    return replace(batch, action_mask=batch.action_mask * keep), cut


def _score(model, batch, spec, temperature=1.0, packed=None):
    """``(logp, entropy)`` ``[B, T-1]`` of the padded batch, from a padded or a packed forward."""
    if packed is None:
        return token_log_probs(model, batch.ids, temperature, spec=spec)
    spec = spec if spec is not None else SamplingSpec(temperature=temperature)
    return packed_log_probs(model, packed, batch.ids.shape[0], batch.ids.shape[1] - 1, spec)


def _correct(model, batch, spec, mode, thresholds, packed, fresh):
    """``(correction, old_logp, ratio_dev0)``: an off-policy mode's, and the step-0 ratio deviation over the
    ``fresh`` rows (sampled by the current weights); three Nones without a mode when every row is fresh."""
    if mode is None and bool(fresh.all()):
        return None, None, None
    with torch.no_grad():
        old, _ = _score(model, batch, spec, packed=packed)
    dev0 = max_ratio_deviation(old, batch.sample_logp, batch.action_mask * fresh[:, None])
    if mode is None:
        return None, None, dev0
    corr = off_policy_correction(old, batch.sample_logp, batch.action_mask, mode,
                                 rollout_is_threshold=thresholds[0], is_correction_threshold=thresholds[1])
    return corr, old, dev0


def grpo_step(model, optimizer, trajs: list[Trajectory], group_size: int, pad_id: int,
              options: GRPOOptions = GRPOOptions(), *, ref_model=None,
              current_version: int | str | None = None) -> dict:
    """One GRPO step on sampled groups: check, collate, advantages, ``updates`` clipped updates.

    Groups come from the records' identity (``provenance.group_id``, :func:`group_index`), never
    from row order: any order of the same records gives the same advantages. Log-probs are
    recomputed under the records' *processed* distribution (their
    :class:`~agentrl.record.SamplingSpec`: temperature, top-k, top-p, min-p), the one the tokens
    were drawn from, with dropout disabled (:func:`scoring_mode`), so the ratio before the first
    update is 1 up to float rounding.

    Args:
        model: the policy that sampled ``trajs`` (not updated since); its mode is restored after.
        optimizer: torch optimiser over ``model``'s parameters.
        trajs: ``n_groups * G`` records, in any order, each with its ``provenance.group_id``.
        group_size: G, records per group.
        pad_id: the tokenizer's pad id (for :func:`~agentrl.batching.collate`).
        options: the step's settings (:class:`~agentrl.train.options.GRPOOptions`: updates, clip,
            KL weight, off-policy correction, overlong and forced-token masking, packing, staleness).
        ref_model: frozen reference (the SFT model) for the KL term, or None; needed when
            ``options.kl_coef > 0``.
        current_version: the version of ``model``'s weights; given, the step-0 ratio guard (``ratio_dev0``,
            ``options.ratio_tol``) covers only the records it sampled (:func:`agentrl.checks.sampled_by`):
            older ones are off-policy. Needed with ``options.max_staleness``.

    Returns:
        dict of floats: :func:`episode_metrics`, ``zero_var_frac`` (fraction of groups with
        equal rewards), ``zero_var_groups`` (count), ``ratio_dev0`` (max ``|ratio - 1|`` before
        the first update, against ``sample_logp`` also with a correction), ``ratio_mean`` / ``clip_frac`` / ``pg_loss`` / ``kl`` / ``entropy``
        (means over updates), ``ratio_max`` (max over updates), ``grad_norm`` (last update),
        ``updates`` (0 when no group has reward variance and ``kl_coef == 0``: the gradient is
        exactly zero, and the step is skipped so Adam's momentum cannot move the weights),
        ``dropout_disabled`` (1.0: log-probs are scored in eval mode, see :func:`scoring_mode`);
        with ``mask_truncated`` also ``masked_truncated`` (records whose tokens were masked), with
        ``correction`` the ``corr_*`` statistics of :class:`~agentrl.correction.Correction`, with
        ``current_version`` ``fresh_records`` (the records the ratio guard covers).

    Raises:
        ScriptedRecordError, MissingProvenanceError, SamplerMismatchError: from
            :func:`agentrl.checks.require_trainable` (placeholder records, no sampler, mixed or
            untrainable samplers).
        MissingGroupError, GroupSizeError: from :func:`group_index`.
        StaleVersionError: a record older than ``max_staleness`` versions, or versions without an order; records
            of several policy versions without ``current_version`` (:func:`agentrl.checks.require_one_version`).
        ValueError: ``options.max_staleness`` without ``current_version``; ``options.kl_coef > 0`` without
            ``ref_model``, or ``options.ratio_tol`` exceeded (the records are not exact: a shifted
            ``sample_logp`` or ``action_mask``, or another sampler); ``options`` not a :class:`GRPOOptions`.
    """
    if not isinstance(options, GRPOOptions):
        raise ValueError(f'grpo_step: options must be an agentrl.train.GRPOOptions, got {type(options).__name__}; '
                         'build one with GRPOOptions(updates=..., clip_eps=..., ...)')
    o = options
    if o.mask_forced:
        from ..constraints import mask_forced as _mask_forced
        trajs = [_mask_forced(t) for t in trajs]
    spec = require_trainable(trajs, o.temperature)
    if o.max_staleness is not None:
        if current_version is None:
            raise ValueError('grpo_step: max_staleness needs current_version (the training step of the weights)')
        require_fresh(trajs, current_version, o.max_staleness)
    if current_version is None:
        require_one_version(trajs, 'grpo_step')
    groups = group_index(trajs, group_size)
    if o.kl_coef > 0 and ref_model is None:
        raise ValueError('grpo_step: kl_coef > 0 needs ref_model (the frozen SFT model)')
    batch = collate(trajs, pad_id, getattr(model, 'max_len', None))
    adv, zero = grouped_advantages(batch.rewards, groups, o.eps)
    fresh = torch.tensor(sampled_by(trajs, current_version), dtype=torch.bool)
    extra: dict = {} if current_version is None else {'fresh_records': int(fresh.sum())}
    pk = pack_for(trajs, o.max_tokens, pad_id) if o.packed else None
    if o.mask_truncated:                        # after the advantages: the groups stay whole
        batch, cut = mask_overlong(batch, trajs)
        extra['masked_truncated'] = int(cut.sum())
    with scoring_mode(model, ref_model):
        ref_logp = None
        if o.kl_coef > 0:
            with torch.no_grad():
                ref_logp, _ = _score(ref_model, batch, spec, packed=pk)
        corr, old, dev0 = _correct(model, batch, spec, o.correction,
                                   (o.rollout_is_threshold, o.is_correction_threshold), pk, fresh)
        extra.update(corr.metrics if corr is not None else {})
        # No row with signal and no KL: the gradient is exactly zero, but Adam's momentum would still
        # move the weights, so a step with nothing to learn makes no update at all.
        signal = (adv != 0) & (batch.action_mask.sum(1) > 0) if o.mask_truncated else adv != 0
        skip = not bool(signal.any()) and o.kl_coef == 0
        acc: dict = {'updates': 0 if skip else o.updates}
        for u in range(o.updates):
            loss, m = grpo_loss(model, batch, adv, o.clip_eps, o.kl_coef, ref_logp, spec=spec, correction=corr,
                                old_logp=old, packed=pk)
            if u == 0:
                acc['ratio_dev0'] = m['ratio_dev'] if dev0 is None else dev0
                dev = acc['ratio_dev0']
                if o.ratio_tol is not None and not dev <= o.ratio_tol:
                    raise ValueError(f'GRPO step: max |ratio - 1| = {dev:.2e} > {o.ratio_tol:.0e} before any '
                                     'update; sample_logp or action_mask is misaligned with ids[:, 1:] or the records '
                                     'were not sampled by this model under their declared sampler')
            n_avg = 1 if skip else o.updates
            for k in ('ratio_mean', 'clip_frac', 'pg_loss', 'kl', 'entropy'):
                acc[k] = acc.get(k, 0.0) + m[k] / n_avg
            acc['ratio_max'] = max(acc.get('ratio_max', 0.0), m['ratio_max'])
            if skip:
                acc['grad_norm'] = 0.0
                break
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            acc['grad_norm'] = float(torch.nn.utils.clip_grad_norm_(
                model.parameters(), o.max_grad_norm if o.max_grad_norm > 0 else float('inf')))
            optimizer.step()
    return dict(episode_metrics(trajs), zero_var_frac=float(zero.float().mean()), zero_var_groups=int(zero.sum()),
                dropout_disabled=1.0, **acc, **extra)
