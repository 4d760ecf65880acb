"""``agentrl train``: SFT warm start on oracle demonstrations, then GRPO on BugFix train tasks."""
from __future__ import annotations

from dataclasses import dataclass, fields

from ..train.loop import TrainConfig

#: help text of each flag (the option's field name with ``-`` for ``_``)
HELP = {
    'sft_steps': 'SFT steps on the oracle demonstrations of the 24 train tasks',
    'grpo_steps': 'GRPO steps after SFT',
    'group': 'G, episodes per task in a GRPO group',
    'out': 'output folder (sft.pt, model.pt, metrics.jsonl, reward.svg, summary.json)',
    'reward_tests': 'training reward: hidden (public + hidden tests) or public (public only: hackable)',
    'seed': 'seed of the model init, the task draw and every sampler',
    'sft_lr': 'Adam learning rate of SFT',
    'sft_batch': 'demonstrations per SFT step (0 = all, full batch)',
    'hacker_demos': 'also imitate the hardcode hacker on N train tasks, so GRPO can learn or unlearn the hack',
    'grpo_lr': 'Adam learning rate of GRPO',
    'tasks_per_step': 'train tasks per GRPO step (each sampled G times)',
    'updates': 'optimiser updates per GRPO batch (>1 makes the ratio and clip matter)',
    'clip_eps': 'PPO clip epsilon',
    'kl_coef': 'KL weight to the frozen SFT model (0 = off)',
    'temperature': 'sampling temperature of GRPO and evaluation',
    'max_turns': 'turn budget per episode',
    'eval_every': 'evaluate on train and held-out tasks every this many GRPO steps',
    'eval_repeats': 'evaluation episodes per task',
    'max_grad_norm': 'global gradient-norm clip',
    'ratio_tol': 'fail if max |ratio - 1| before the first update of a step exceeds this',
    'threads': 'torch threads (1 is fastest for TinyAgent; 0 = torch default)',
}


@dataclass
class TrainOptions(TrainConfig):
    """Options of ``agentrl train``: one field per flag (``--sft-steps`` is ``sft_steps`` ...).

    Every field is documented in :class:`agentrl.train.loop.TrainConfig` (and in :data:`HELP`,
    the flags' help). Defaults: 150 SFT steps at lr 3e-3 (full batch of 24 demonstrations),
    40 GRPO steps of 8 tasks x G=8 at lr 1e-4 with 2 updates per batch, clip 0.2, KL 0.1 to
    the SFT model, temperature 1, evaluation every 5 steps with 16 episodes per task, one
    torch thread.
    """

    def validate(self) -> None:
        """Raise :class:`~agentrl.cli.main.UserError` naming the bad flag and its allowed range."""
        from .main import UserError
        for name in ('sft_steps', 'grpo_steps', 'sft_batch', 'threads', 'hacker_demos'):
            if getattr(self, name) < 0:
                raise UserError(f'--{name.replace("_", "-")} must be >= 0, got {getattr(self, name)}')
        for name in ('group', 'tasks_per_step', 'updates', 'max_turns', 'eval_every', 'eval_repeats'):
            if getattr(self, name) < 1:
                raise UserError(f'--{name.replace("_", "-")} must be >= 1, got {getattr(self, name)}')
        if self.grpo_steps and self.group < 2:
            raise UserError(f'--group must be >= 2 for GRPO (a group of one has advantage 0 on every episode), '
                            f'got {self.group}')
        if self.tasks_per_step > 24 or self.hacker_demos > 24:
            raise UserError('--tasks-per-step and --hacker-demos must be <= 24 (the number of train tasks), got '
                            f'{self.tasks_per_step} and {self.hacker_demos}')
        for name in ('sft_lr', 'grpo_lr', 'temperature', 'clip_eps', 'ratio_tol'):
            if not getattr(self, name) > 0:
                raise UserError(f'--{name.replace("_", "-")} must be > 0, got {getattr(self, name)}')
        if self.kl_coef < 0:
            raise UserError(f'--kl-coef must be >= 0, got {self.kl_coef}')
        if self.reward_tests not in ('hidden', 'public'):
            raise UserError(f'--reward-tests {self.reward_tests!r}: choose hidden or public')
        if self.sft_steps == 0 and self.grpo_steps > 0:
            raise UserError('--sft-steps 0 with GRPO: an untrained TinyAgent earns reward 0, so every advantage '
                            'is zero; give SFT at least ~100 steps')


def register(sub) -> None:
    """Add this subcommand's parser (every flag documented) to ``sub`` and set ``func=run``."""
    d = TrainOptions()
    p = sub.add_parser('train', help='SFT warm start, then GRPO on BugFix tasks (TinyAgent, CPU, minutes)',
                       description='Imitate oracle demonstrations (SFT), then run GRPO on the 24 train tasks, '
                                   'evaluating on train and held-out tasks; write OUT/sft.pt, OUT/model.pt '
                                   '(for `agentrl rollout --policy model --checkpoint`), OUT/metrics.jsonl, '
                                   'OUT/reward.svg and OUT/summary.json.')
    for f in fields(TrainOptions):
        flag = '--' + f.name.replace('_', '-')
        default = getattr(d, f.name)
        kw = dict(default=default, help=f'{HELP[f.name]} (default: {default})')
        if f.name == 'reward_tests':
            kw['choices'] = ['hidden', 'public']
        elif not isinstance(default, str):
            kw['type'] = type(default)
        p.add_argument(flag, **kw)
    p.set_defaults(func=run)


def options_from_args(args) -> TrainOptions:
    """Build the options dataclass from the parsed ``args``."""
    return TrainOptions(**{f.name: getattr(args, f.name) for f in fields(TrainOptions)})


def run(args) -> int:
    """Run the subcommand for parsed ``args``; return the exit code (errors raise ``UserError``, one line)."""
    opts = options_from_args(args)
    opts.validate()
    summary = run_training(opts)
    print_summary(summary)
    return 0


def run_training(opts: TrainOptions) -> dict:
    """Run :func:`agentrl.train.loop.train` under a rich progress bar showing the current reward."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from ..train.loop import train
    state = {'sft': '', 'grpo': '', 'eval': ''}
    with Progress(TextColumn('{task.description}'), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  transient=True) as progress:
        bar = progress.add_task('starting', total=opts.sft_steps + opts.grpo_steps)

        def on_event(r):
            if r['phase'] == 'sft':
                state['sft'] = f"sft loss {r['loss']:.3f}"
            elif r['phase'] == 'grpo':
                state['grpo'] = f"grpo reward {r['reward']:.2f} hardcode {r['hardcode_rate']:.2f}"
            elif r['phase'] == 'eval':
                state['eval'] = f"eval train {r['train_reward']:.2f} held-out {r['heldout_reward']:.2f}"
            progress.update(bar, description=' | '.join(v for v in state.values() if v))
            if r['phase'] in ('sft', 'grpo'):
                progress.advance(bar)
        return train(opts, on_event)


def print_summary(s: dict) -> None:
    """Print the one-line summary of a run."""
    from rich.console import Console
    a, f, g = s['after_sft'], s['final'], s['grpo']
    ratio = '' if g['ratio_dev_first_step'] is None else f" (step-0 max|ratio-1| {g['ratio_dev_first_step']:.1e})"
    Console(width=200).print(
        f"after SFT: train reward {a['train_reward']:.2f} (well-formed calls {a['train_well_formed']:.1%}), "
        f"held-out {a['heldout_reward']:.2f}, hardcode {a['train_hardcode_rate']:.0%} | after {g['steps']} GRPO "
        f"steps{ratio}: train {f['train_reward']:.2f}, held-out {f['heldout_reward']:.2f}, hardcode "
        f"{f['train_hardcode_rate']:.0%} ({g['hardcode_call_frac']:.1%} of GRPO calls) | {s['seconds']:.0f} s "
        f"-> {s['files']['checkpoint']}", highlight=False, soft_wrap=True)
