"""agentrl's own minimal trainer: the proof that the records train (book chapters 6 and 9).

Small pure functions, no trainer class. A user of :mod:`agentrl.rollouts` and
:mod:`agentrl.batching`: every loss takes a :class:`~agentrl.record.Batch` (``ids``,
``attention_mask [B, T]``; ``action_mask``, ``sample_logp``, ``turn_ids [B, T-1]``;
``rewards [B]``).

- :mod:`.sft`: masked next-token NLL on oracle demonstrations (the warm start).
- :mod:`.grpo`: group-relative advantages, token-level importance ratios, PPO clipping, KL.
- :mod:`.options`: :class:`GRPOOptions`, the settings of one GRPO step.
- :mod:`.config`: :class:`TrainConfig`, the settings (no torch).
- :mod:`.loop`: the SFT-then-GRPO driver behind ``agentrl train`` (evaluation, checkpoints,
  ``metrics.jsonl``, the reward plot).
"""
from .._lazy import lazy_exports

_EXPORTS = {'group_index': 'grpo', 'grouped_advantages': 'grpo', 'scoring_mode': 'grpo',
            'clipped_surrogate': 'grpo', 'group_advantages': 'grpo',
            'grpo_loss': 'grpo', 'grpo_step': 'grpo', 'GRPOOptions': 'options', 'importance_ratio': 'grpo',
            'kl_penalty': 'grpo',
            'max_ratio_deviation': 'grpo', 'token_log_probs': 'grpo', 'episode_metrics': 'grpo',
            'TrainConfig': 'config', 'call_stats': 'loop', 'evaluate': 'loop', 'run_sft': 'loop',
            'sample_groups': 'loop', 'train': 'loop', 'masked_nll': 'sft', 'oracle_demos': 'sft',
            'scripted_demos': 'sft', 'sft_loss': 'sft', 'sft_step': 'sft',
            'off_policy_correction': 'correction', 'Correction': 'correction', 'mask_overlong': 'grpo'}

__all__ = sorted(_EXPORTS)


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
