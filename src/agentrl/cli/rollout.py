"""``agentrl rollout``: the main job. Parse the flags, run :func:`agentrl.jobs.rollout.rollout_summary`, print.

Every flag is a field of :class:`agentrl.jobs.plan.RolloutOptions` (help and range in its
metadata). The heavy modules (torch, the gym, Ray, transformers) load only when the job runs,
so ``agentrl rollout --help`` is quick.
"""
from __future__ import annotations

import sys

from ..engines.vllm.server import VLLMError
from ..jobs.plan import RolloutOptions
from ..jobs.rollout import RunComplete, RunInterrupted, rollout_summary
from .options import UserError, add_fields, from_args, given_flags


def register(sub) -> None:
    """Add this subcommand's parser (every flag documented) to ``sub`` and set ``func=run``."""
    p = sub.add_parser('rollout', help='roll out policies on BugFix tasks and store token-exact records',
                       description='Roll out scripted policies, TinyAgent or a Hugging Face model on BugFix tasks, '
                                   'in this process or on Ray actors (same seeds, same records); stream the records '
                                   'to OUT/trajectories/part-*.parquet as chunks finish, write OUT/summary.json '
                                   'last, and print a table per policy. Ctrl-C keeps every finished chunk; '
                                   '--resume OUT runs only the missing episodes.')
    add_fields(p, RolloutOptions)
    p.set_defaults(func=run)


def run(args) -> int:
    """Run the subcommand for parsed ``args``; return the exit code (errors raise ``UserError``, one line)."""
    try:
        opts = from_args(RolloutOptions, args)
        opts.given = given_flags(args)      # a --resume compares every flag given with the run's plan
        opts.validate()
    except ValueError as e:
        raise UserError(str(e)) from None
    try:
        summary = rollout_summary(opts)
    except VLLMError as e:                  # a server that does not start, answer, or died mid-run: one line
        raise UserError(str(e)) from None
    except RunInterrupted as e:
        print(f'agentrl: {e}', file=sys.stderr)
        return 130
    except RunComplete as e:                # --resume of a finished run: one line, nothing written
        from ..io import printable
        print(printable(e))
        return 0
    print_summary(summary, (opts.resume or opts.out).rstrip('/'))
    if (summary.hf or {}).get('profile'):
        from ..engines.hf import format_profile
        print(format_profile(summary.hf['profile']))
    return 0


def print_summary(summary, out: str) -> None:
    """Print the per-policy table and a one-line summary of a :class:`~agentrl.jobs.rollout.RunSummary`
    (``out``: the run folder as the user named it).

    The ``unk obs`` column (``<unk>`` tokens of TinyAgent's word tokenizer in observations) is
    shown only when some policy counted them; a policy that did not (the hf engine's model, whose
    tokenizer has no unknown words) shows ``-`` there.
    """
    from rich.console import Console
    from rich.table import Table
    table = Table(title=f'{summary.episodes} episodes on {summary.tasks} tasks')
    unk = any(s.unknown_obs_tokens is not None for s in summary.policies.values())
    for col in ['policy', 'episodes', 'reward', 'stops', 'trunc', 'len mean', 'len max', 'action',
                *(['unk obs'] if unk else []), 'context/turn (ep. 0)']:
        table.add_column(col, justify='left' if col in ('policy', 'stops') else 'right')
    for name, s in summary.policies.items():
        stops = ' '.join(f'{k}:{v}' for k, v in s.stops.items())
        n_unk = s.unknown_obs_tokens
        table.add_row(name, str(s.episodes), f'{s.mean_reward:.3f}', stops, f'{s.truncation_rate:.2f}',
                      f'{s.length_mean:.1f}', str(s.length_max), f'{s.action_tokens_mean:.1f}',
                      *([('-' if n_unk is None else str(n_unk))] if unk else []),
                      f'{s.prompt_length}:' + ','.join(map(str, s.first_context_lengths)))
    console = Console()
    if not console.is_terminal:          # piped or captured: do not squeeze the table to 80 columns
        console = Console(width=140)
    console.print(table)
    console.print(f'wrote {summary.episodes} episodes to {out}/{summary.trajectories} in {summary.seconds:.1f} s',
                  highlight=False, soft_wrap=True)
