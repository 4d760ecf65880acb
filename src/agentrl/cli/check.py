"""``agentrl check``: validate every record of a trajectory file or dataset folder.

Parse the flags, run :func:`agentrl.jobs.check.run_check`, print its report. The report gives
the record count, refusals by kind (with the first few messages), truncation rate, length
statistics and, with ``--model``, replay ratio statistics under each record's declared sampler.
Exit 1 when anything a trainer must never see is found (see :mod:`agentrl.jobs.check`): a
refused, malformed, edited or repeated row, a record the model cannot replay, a declared sampler
that does not reproduce the stored log-probs, or a replay ratio that is non-finite or further
than ``--max-ratio-dev`` (default 1e-3) from 1. An empty file or folder fails too.

Large inputs show a progress bar on a terminal (stderr), and a progress line every few seconds
when stderr is a pipe or a file.
"""
from __future__ import annotations

import sys
import time
from dataclasses import fields

from ..io import printable
from ..jobs.check import CheckOptions
from .export import incomplete_note
from .options import add_fields, from_args

#: rows from which a progress display is shown
PROGRESS_MIN_ROWS = 5000
#: seconds between progress lines when stderr is not a terminal
PROGRESS_EVERY_S = 5.0


def register(sub) -> None:
    """Add this subcommand's parser (one flag per :class:`~agentrl.jobs.check.CheckOptions` field) and set ``func=run``."""
    p = sub.add_parser('check', help='validate trajectory records (masks, log-probs, provenance, replay)',
                       description='Validate every record of a trajectory file or folder; print refusals by '
                                   'kind, truncation rate, length stats and (with --model) replay ratio stats. '
                                   'Exit 1 if any record is refused.')
    add_fields(p, CheckOptions, skip=('eot_ids',))
    f = {x.name: x for x in fields(CheckOptions)}['eot_ids']
    p.add_argument(f.metadata['flag'], type=int, action='append', default=[], dest='eot_ids', metavar='ID',
                   help=f.metadata['help'])
    p.set_defaults(func=run)


class Progress:
    """Progress of a long check on stderr: a rich bar on a terminal, a line every few seconds otherwise.

    Args:
        total: rows to read (from the Parquet footers).
        stream: where to write (default ``sys.stderr``).
        every_s: seconds between lines when ``stream`` is not a terminal.
    """

    def __init__(self, total: int, stream=None, every_s: float = PROGRESS_EVERY_S):
        self.total, self.stream, self.every_s = total, stream or sys.stderr, every_s
        self.t0 = self.last = time.monotonic()
        self._bar = None
        if getattr(self.stream, 'isatty', lambda: False)():
            from rich.console import Console
            from rich.progress import BarColumn, MofNCompleteColumn, Progress as Bar, TimeRemainingColumn
            self._bar = Bar('checking', BarColumn(), MofNCompleteColumn(), TimeRemainingColumn(),
                            console=Console(file=self.stream), transient=True)
            self._task = self._bar.add_task('check', total=total)
            self._bar.start()

    def __call__(self, done: int) -> None:
        if self._bar is not None:
            self._bar.update(self._task, completed=done)
            return
        now = time.monotonic()
        if now - self.last >= self.every_s:
            self.last = now
            pct = f' ({100 * done / self.total:.0f}%)' if self.total else ''
            print(f'check: {done} of {self.total} records read{pct}, {now - self.t0:.0f} s', file=self.stream,
                  flush=True)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.stop()


def check(opts: CheckOptions, out=print, progress_stream=None) -> int:
    """Run the check job and print its report through ``out``; return the exit code (0 ok, 1 refused)."""
    from ..jobs.check import count_rows, run_check      # looked up per call: tests replace run_check
    opts.validate()
    total = count_rows(opts.path)
    bar = Progress(total, progress_stream) if total >= PROGRESS_MIN_ROWS else None
    try:
        report = run_check(opts, progress=bar)
    finally:
        if bar is not None:
            bar.close()
    out(report.format())
    _warn_incomplete(opts.path)
    return report.code


def _warn_incomplete(path: str) -> None:
    """Say on stderr that the rollout run behind ``path`` is unfinished, as report and export do (the result
    stands: the records it has were checked)."""
    try:
        note = incomplete_note(path, None)
    except (OSError, ValueError):          # a run.json that is not a manifest: nothing to compare with
        return
    if note:
        print(printable(f'agentrl: warning: {path!r} is {note}; the check covers only the stored records'),
              file=sys.stderr)


def run(args) -> int:
    """Run the subcommand for parsed ``args``; return the exit code (errors raise, printed as one line)."""
    return check(from_args(CheckOptions, args))
