"""``agentrl report``: write RUN_DIR/report.html, a self-contained summary of a rollout run.

Parse the flags, run :func:`agentrl.jobs.report.write_report`, print one line. A run that is not
finished (``run.json`` plans more episodes than are stored, or ``summary.json`` is missing) is
reported as such, on the page and in the printed line, with the command that finishes it.
"""
from __future__ import annotations

import time

from ..jobs.report import (ReportOptions, duplicates_note, incompleteness, unique_records,  # noqa: F401 - their
                           write_report)                                                  # old home
from ..io import printable
from .options import from_args


def register(sub) -> None:
    """Add this subcommand's parser (every flag documented) to ``sub`` and set ``func=run``."""
    p = sub.add_parser('report', help='write RUN_DIR/report.html: rewards, stops, lengths, context, a strip',
                       description='Summarise a rollout folder in one self-contained HTML page: per-policy '
                                   'reward, stop reasons, truncation rate, episode length and action-token '
                                   'distributions, context length per turn, and the first episode\'s '
                                   'ownership strip. Charts are inline SVG; the page fetches nothing.')
    p.add_argument('run_dir', metavar='RUN_DIR', help='folder written by `agentrl rollout --out RUN_DIR`')
    p.add_argument('--out', '-o', default=None, help='output file (default: RUN_DIR/report.html)')
    p.add_argument('--fold', type=int, default=40,
                   help='fold tool/template runs longer than this in the strip; 0 = never (default: 40)')
    p.set_defaults(func=run)


def run(args) -> int:
    """Run the subcommand for parsed ``args``; return the exit code (errors raise, printed as one line)."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    opts = from_args(ReportOptions, args)
    opts.validate()
    t0 = time.time()
    err = Console(stderr=True)          # a bar only on a terminal: piped, it would leave a blank line
    with Progress(TextColumn('{task.description}'), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=err, transient=True, disable=not err.is_terminal) as progress:
        res = write_report(opts, progress)
    policies = f"{res.policies} polic{'y' if res.policies == 1 else 'ies'}"
    note = f'; {res.incomplete}' if res.incomplete else ''
    Console().print(printable(f'wrote {res.out}: {res.episodes} episodes, {policies}, '
                              f'{res.bytes / 1024:.0f} KB in {time.time() - t0:.1f} s{note}'),
                    highlight=False, markup=False, soft_wrap=True)
    return 0
