"""The settings of one ``agentrl train`` run: a documented dataclass, no torch (``--help`` stays quick).

Each field is an :func:`agentrl.fields.option`: its flag's help and range (read by :mod:`agentrl.cli.options`).
"""
from __future__ import annotations

from dataclasses import dataclass

from ..fields import check_fields, option

__all__ = ['TrainConfig']

#: Number of BugFix train tasks (bounds ``tasks_per_step`` and ``hacker_demos``).
N_TRAIN_TASKS = 24
#: ``--correction`` choices: none, or a mode of :data:`agentrl.correction.CORRECTION_MODES` (a test
#: keeps the two equal; this module imports no torch).
CORRECTIONS = ('none', 'token_tis', 'seq_tis', 'token_mask', 'icepop', 'geo_mask', 'seq_mask_tis')


@dataclass
class TrainConfig:
    """Settings of one SFT-then-GRPO run (the flags of ``agentrl train``).

    Attributes:
        sft_steps: SFT optimiser steps on the oracle demonstrations of the 24 train tasks.
        grpo_steps: GRPO steps after SFT (each samples ``tasks_per_step * group`` episodes).
        group: G, episodes per task in a GRPO group.
        out: output folder.
        reward_tests: reward of the training env: ``hidden`` (public + hidden tests, the true
            reward) or ``public`` (public tests only: the hackable reward). Evaluation always
            reports the hidden-test reward, and the public-test pass rate beside it.
        seed: seeds the model initialisation, the task choice and every sampler.
        sft_lr: Adam learning rate of SFT.
        sft_batch: demonstrations per SFT step (0 = all, full batch).
        hacker_demos: also imitate the scripted hacker (``read``, ``edit hardcode``, ``submit``)
            on this many train tasks (drawn with the seed; 0 = oracle only). A warm start on
            oracle demonstrations alone gives ``edit hardcode`` a probability of ~4e-6 per
            edit, so GRPO never samples the hack; this seeds it, so that the reward can be
            seen to teach it (``public``) or to remove it (``hidden``).
        grpo_lr: Adam learning rate of GRPO.
        tasks_per_step: train tasks per GRPO step (drawn without replacement).
        updates: optimiser updates per GRPO batch (> 1 makes the ratio and the clip matter).
        clip_eps: PPO clip epsilon.
        kl_coef: weight of the KL penalty to the frozen SFT model (0 disables).
        temperature: sampling temperature of GRPO and of evaluation.
        max_turns: turn budget per episode.
        eval_every: evaluate every this many GRPO steps (and after SFT and at the end).
        eval_repeats: evaluation episodes per task (24 train and 6 held-out tasks).
        max_grad_norm: global gradient-norm clip.
        ratio_tol: raise if ``max |ratio - 1|`` before the first update of a GRPO step exceeds it.
        threads: torch intra-op threads during the run (restored afterwards); 0 leaves torch's
            setting. 1 is the default because TinyAgent's matrices are tiny: on the 2-core
            machine one thread was 4-6x faster than two whenever another process was running.
        packed: SFT and GRPO score packed rows (``collate_packed`` + per-record attention) instead of
            padded batches; the same values to fp32 rounding.
        max_tokens: packed row length (raised to the longest record).
        correction: GRPO off-policy correction mode (``none``: the ratio against ``sample_logp``);
            its ``corr_weight_*`` / ``corr_kept_frac`` statistics enter the metrics.
        rollout_is_threshold: C, the upper truncation of the IS weight (``token_tis``, ``seq_tis``).
        is_correction_threshold: ``LOW,HIGH`` bounds of the masking modes.
        mask_truncated: overlong filtering: no gradient on truncated episodes' tokens.
        mask_forced: no loss on grammar-forced tokens (records that declare a constraint).
        max_staleness: refuse records sampled more than K policy versions (GRPO steps) ago; -1 disables.
    """
    sft_steps: int = option(150, 'SFT steps on the oracle demonstrations of the 24 train tasks', min=0, max=10 ** 7)
    grpo_steps: int = option(40, 'GRPO steps after SFT', min=0, max=10 ** 7)
    group: int = option(8, 'G, episodes per task in a GRPO group', min=1, max=4096)
    out: str = option('runs/train', 'output folder (sft.pt, model.pt, metrics.jsonl, reward.svg, summary.json)',
                    metavar='DIR')
    reward_tests: str = option('hidden', 'training reward: hidden (public + hidden tests) or public (public only: '
                                       'hackable)', choices=('hidden', 'public'))
    seed: int = option(0, 'seed of the model init, the task draw and every sampler', min=0, max=2 ** 63 - 1)
    sft_lr: float = option(3e-3, 'Adam learning rate of SFT', gt=0.0, max=10.0)
    sft_batch: int = option(0, 'demonstrations per SFT step (0 = all, full batch)', min=0, max=10 ** 6)
    hacker_demos: int = option(0, 'also imitate the hardcode hacker on N train tasks, so GRPO can learn or unlearn '
                                'the hack', min=0, max=N_TRAIN_TASKS)
    grpo_lr: float = option(1e-4, 'Adam learning rate of GRPO', gt=0.0, max=10.0)
    tasks_per_step: int = option(8, 'train tasks per GRPO step (each sampled G times)', min=1, max=N_TRAIN_TASKS)
    updates: int = option(2, 'optimiser updates per GRPO batch (>1 makes the ratio and clip matter)', min=1,
                        max=1000)
    clip_eps: float = option(0.2, 'PPO clip epsilon', gt=0.0, max=10.0)
    kl_coef: float = option(0.1, 'KL weight to the frozen SFT model (0 = off)', min=0.0, max=1e6)
    temperature: float = option(1.0, 'sampling temperature of GRPO and evaluation', gt=0.0, max=100.0)
    max_turns: int = option(6, 'turn budget per episode', min=1, max=1000)
    eval_every: int = option(5, 'evaluate on train and held-out tasks every this many GRPO steps', min=1,
                           max=10 ** 7)
    eval_repeats: int = option(16, 'evaluation episodes per task', min=1, max=10 ** 5)
    max_grad_norm: float = option(1.0, 'global gradient-norm clip', gt=0.0, max=1e9)
    ratio_tol: float = option(1e-4, 'fail if max |ratio - 1| before the first update of a step exceeds this',
                            gt=0.0, max=1e9)
    threads: int = option(1, 'torch threads (1 is fastest for TinyAgent; 0 = torch default)', min=0, max=1024)
    packed: bool = option(False, 'score SFT and GRPO batches as packed rows (collate_packed, per-record attention)')
    max_tokens: int = option(2048, 'packed row length in tokens (raised to the longest record)', min=1,
                             max=10 ** 7)
    correction: str = option('none', 'GRPO off-policy correction mode (none: ratio against sample_logp)',
                             choices=CORRECTIONS)
    rollout_is_threshold: float = option(2.0, 'C, upper truncation of the IS weight (token_tis, seq_tis)',
                                         gt=0.0, max=1e9)
    is_correction_threshold: str = option('0.5,5.0', 'LOW,HIGH bounds of the masking correction modes',
                                          metavar='LOW,HIGH')
    mask_truncated: bool = option(False, 'overlong filtering: no gradient on truncated episodes\' tokens')
    mask_forced: bool = option(False, 'no loss on tokens a declared grammar forced (support of one token; '
                                      'docs/grammar.md)')
    max_staleness: int = option(-1, 'refuse records sampled more than K GRPO steps ago (-1 = off)', min=-1,
                                max=10 ** 7)

    @property
    def is_bounds(self) -> tuple[float, float]:
        """``--is-correction-threshold`` as ``(low, high)`` floats.

        Raises:
            ValueError: not two comma-separated numbers with ``0 <= low < high``.
        """
        parts = self.is_correction_threshold.split(',')
        try:
            low, high = (float(x) for x in parts)
        except ValueError:
            raise ValueError(f'--is-correction-threshold must be LOW,HIGH (two numbers), got '
                             f'{self.is_correction_threshold!r}') from None
        if not 0 <= low < high < float('inf'):
            raise ValueError(f'--is-correction-threshold must have 0 <= LOW < HIGH, got {low},{high}')
        return low, high

    def validate(self) -> None:
        """Check every setting before anything runs.

        Raises:
            ValueError: a number out of its range or not finite (``--kl-coef nan``, ``--sft-lr inf``),
                an unknown choice, or settings that cannot learn; the message names the flag.
        """
        if self.tasks_per_step > N_TRAIN_TASKS or self.hacker_demos > N_TRAIN_TASKS:
            raise ValueError(f'--tasks-per-step and --hacker-demos must be <= {N_TRAIN_TASKS} (the number of train '
                             f'tasks), got {self.tasks_per_step} and {self.hacker_demos}')
        check_fields(self)
        self.is_bounds                                    # noqa: B018  (raises on a bad LOW,HIGH)
        if self.grpo_steps and self.group < 2:
            raise ValueError(f'--group must be >= 2 for GRPO (a group of one has advantage 0 on every episode), '
                             f'got {self.group}')
        if self.sft_steps == 0 and self.grpo_steps > 0:
            raise ValueError('--sft-steps 0 with GRPO: an untrained TinyAgent earns reward 0, so every advantage '
                             'is zero; give SFT at least ~100 steps')
