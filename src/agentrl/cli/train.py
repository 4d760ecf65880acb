"""``agentrl train``: SFT warm start on oracle demonstrations, then GRPO on BugFix train tasks."""
from __future__ import annotations

from ..train.config import TrainConfig
from .options import UserError, add_fields, from_args


def register(sub) -> None:
    """Add this subcommand's parser (every flag documented) to ``sub`` and set ``func=run``."""
    p = sub.add_parser('train', help='SFT warm start, then GRPO on BugFix tasks (TinyAgent, CPU, minutes)',
                       description='Imitate oracle demonstrations (SFT), then run GRPO on the 24 train tasks, '
                                   'evaluating on train and held-out tasks; write OUT/sft.pt, OUT/model.pt '
                                   '(for `agentrl rollout --policy model --checkpoint`), OUT/metrics.jsonl, '
                                   'OUT/reward.svg and OUT/summary.json, together at the end.')
    add_fields(p, TrainConfig)
    p.set_defaults(func=run)


def run(args) -> int:
    """Run the subcommand for parsed ``args``; return the exit code (errors raise ``UserError``, one line)."""
    opts = from_args(TrainConfig, args)
    try:
        opts.validate()
    except ValueError as e:
        raise UserError(str(e)) from None
    import signal

    def on_sigterm(signum, frame):            # unwind like Ctrl-C, so the staging folder is removed
        raise SystemExit(128 + signum)
    previous = signal.signal(signal.SIGTERM, on_sigterm)
    try:
        summary = run_training(opts)
    finally:
        signal.signal(signal.SIGTERM, previous)
    print_summary(summary, opts.out)
    return 0


def run_training(opts) -> dict:
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


def print_summary(s: dict, out: str) -> None:
    """Print the one-line summary of a run (``out``: the run folder as the user named it)."""
    import os
    from rich.console import Console
    a, f, g = s['after_sft'], s['final'], s['grpo']
    ratio = '' if g['ratio_dev_first_step'] is None else f" (step-0 max|ratio-1| {g['ratio_dev_first_step']:.1e})"
    Console(width=200).print(
        f"after SFT: train reward {a['train_reward']:.2f} (well-formed calls {a['train_well_formed']:.1%}), "
        f"held-out {a['heldout_reward']:.2f}, hardcode {a['train_hardcode_rate']:.0%} | after {g['steps']} GRPO "
        f"steps{ratio}: train {f['train_reward']:.2f}, held-out {f['heldout_reward']:.2f}, hardcode "
        f"{f['train_hardcode_rate']:.0%} ({g['hardcode_call_frac']:.1%} of GRPO calls) | {s['seconds']:.0f} s "
        f"-> {os.path.join(out, s['files']['checkpoint'])}", highlight=False, soft_wrap=True)
