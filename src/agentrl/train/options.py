"""The settings of one GRPO step (:func:`agentrl.train.grpo_step`), with their defaults and checks in one place.

A frozen value: build it once per run (``agentrl train`` builds it from its
:class:`~agentrl.train.TrainConfig`, :func:`agentrl.train.loop.grpo_options`) and hand it to every step;
``dataclasses.replace(options, updates=4)`` derives another.
"""
from __future__ import annotations

from dataclasses import dataclass

from .correction import CORRECTION_MODES

__all__ = ['GRPOOptions']


@dataclass(frozen=True)
class GRPOOptions:
    """How :func:`~agentrl.train.grpo_step` scores and updates (all but the model, the records and their version).

    Attributes:
        updates: optimiser updates on one batch, >= 1 (> 1 makes the ratio and the clip matter).
        clip_eps: PPO clip epsilon, > 0 (the ratio is clipped to ``[1 - clip_eps, 1 + clip_eps]``).
        kl_coef: weight of the KL to ``ref_model``, >= 0 (0 disables; > 0 needs ``ref_model``).
        temperature: None (default): ratio under the records' own sampler; a number > 0: refuse
            records sampled at another temperature.
        max_grad_norm: global gradient-norm clip (<= 0 disables).
        eps: std offset of :func:`~agentrl.train.group_advantages`, >= 0.
        ratio_tol: when given (>= 0), raise if ``max |ratio - 1|`` before the first update exceeds it.
        correction: an off-policy correction mode (:data:`~agentrl.train.correction.CORRECTION_MODES`),
            or None (the ratio is taken against ``sample_logp``).
        rollout_is_threshold: the truncation C > 0 of ``token_tis`` / ``seq_tis`` (verl's name).
        is_correction_threshold: ``(low, high)`` with ``0 <= low <= high``, the band of the masking modes
            (OpenRLHF's name; the modes themselves need ``low > 0``).
        mask_truncated: overlong filtering (:func:`~agentrl.train.mask_overlong`) after the group advantages.
        mask_forced: leave tokens a declared grammar forced out of the loss (:func:`agentrl.constraints.mask_forced`).
        packed: score with one packed forward per pass instead of the padded batch (same values to fp32 rounding).
        max_tokens: the packed row length in tokens, >= 1 (raised to the longest record).
        max_staleness: refuse records sampled more than k >= 0 versions before ``current_version``
            (:func:`agentrl.checks.require_fresh`); None: no limit.

    Raises:
        ValueError: a field out of its range, one line naming the field and the fix.
    """
    updates: int = 1
    clip_eps: float = 0.2
    kl_coef: float = 0.0
    temperature: float | None = None
    max_grad_norm: float = 1.0
    eps: float = 1e-6
    ratio_tol: float | None = None
    correction: str | None = None
    rollout_is_threshold: float = 2.0
    is_correction_threshold: tuple[float, float] = (0.5, 5.0)
    mask_truncated: bool = False
    mask_forced: bool = False
    packed: bool = False
    max_tokens: int = 2048
    max_staleness: int | None = None

    def __post_init__(self):
        def bad(field: str, need: str, fix: str):
            raise ValueError(f'GRPOOptions.{field} = {getattr(self, field)!r}: must be {need}; {fix}')
        if isinstance(self.updates, bool) or not isinstance(self.updates, int) or self.updates < 1:
            bad('updates', 'an int >= 1', 'pass the number of optimiser updates per batch')
        if not self.clip_eps > 0:
            bad('clip_eps', '> 0', 'pass the PPO clip range, e.g. 0.2')
        if not self.kl_coef >= 0:
            bad('kl_coef', '>= 0', 'pass 0 to train without a KL term')
        if self.temperature is not None and not self.temperature > 0:
            bad('temperature', 'None or > 0', "pass None to use the records' own sampler")
        if not self.eps >= 0:
            bad('eps', '>= 0', 'pass a small offset such as 1e-6')
        if self.ratio_tol is not None and not self.ratio_tol >= 0:
            bad('ratio_tol', 'None or >= 0', 'pass e.g. 1e-4, or None to skip the step-0 ratio guard')
        if self.correction is not None and self.correction not in CORRECTION_MODES:
            bad('correction', f'None or one of {list(CORRECTION_MODES)}', 'pick a mode or pass None')
        if not self.rollout_is_threshold > 0:
            bad('rollout_is_threshold', '> 0', 'pass the truncation C, e.g. 2.0')
        band = self.is_correction_threshold
        if not (isinstance(band, (tuple, list)) and len(band) == 2 and 0 <= band[0] <= band[1]):
            bad('is_correction_threshold', 'a pair (low, high) with 0 <= low <= high', 'pass e.g. (0.5, 5.0)')
        object.__setattr__(self, 'is_correction_threshold', (float(band[0]), float(band[1])))
        if isinstance(self.max_tokens, bool) or not isinstance(self.max_tokens, int) or self.max_tokens < 1:
            bad('max_tokens', 'an int >= 1', 'pass the packed row length, e.g. 2048')
        if self.max_staleness is not None and (not isinstance(self.max_staleness, int) or self.max_staleness < 0):
            bad('max_staleness', 'None or an int >= 0', 'pass None for no limit')
