"""agentrl's own minimal trainer: the proof that the records train (book chapters 6 and 9).

Small pure functions, no trainer class. A user of :mod:`agentrl.rollouts` and
:mod:`agentrl.batching`: every loss takes a :class:`~agentrl.record.Batch` (``ids``,
``attention_mask [B, T]``; ``action_mask``, ``sample_logp``, ``turn_ids [B, T-1]``;
``rewards [B]``).

- :mod:`.sft`: masked next-token NLL on oracle demonstrations (the warm start).
- :mod:`.grpo`: group-relative advantages, token-level importance ratios, PPO clipping, KL.
- :mod:`.loop`: the SFT-then-GRPO driver behind ``agentrl train`` (evaluation, checkpoints,
  ``metrics.jsonl``, the reward plot).
"""
from .grpo import (clipped_surrogate, episode_metrics, group_advantages, group_index, grouped_advantages,
                   grpo_loss, grpo_step, importance_ratio, kl_penalty, max_ratio_deviation, scoring_mode,
                   token_log_probs)
from .loop import TrainConfig, call_stats, evaluate, run_sft, sample_groups, train
from .sft import masked_nll, oracle_demos, scripted_demos, sft_loss, sft_step

__all__ = ['clipped_surrogate', 'episode_metrics', 'group_advantages', 'group_index', 'grouped_advantages',
           'scoring_mode', 'grpo_loss', 'grpo_step', 'importance_ratio', 'kl_penalty', 'max_ratio_deviation',
           'token_log_probs', 'masked_nll', 'oracle_demos', 'scripted_demos', 'sft_loss', 'sft_step', 'TrainConfig', 'call_stats',
           'evaluate', 'run_sft', 'sample_groups', 'train']
