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

from ..jobs.check import CheckOptions

#: rows from which a progress display is shown
PROGRESS_MIN_ROWS = 5000
#: seconds between progress lines when stderr is not a terminal
PROGRESS_EVERY_S = 5.0


def register(sub) -> None:
    """Add this subcommand's parser (every flag documented) to ``sub`` and set ``func=run``."""
    d = CheckOptions()
    p = sub.add_parser('check', help='validate trajectory records (masks, log-probs, provenance, replay)',
                       description='Validate every record of a trajectory file or folder; print refusals by '
                                   'kind, truncation rate, length stats and (with --model) replay ratio stats. '
                                   'Exit 1 if any record is refused.')
    p.add_argument('path', help='trajectory .parquet file or folder of shards')
    p.add_argument('--model', default=None, metavar='CKPT',
                   help='TinyAgent checkpoint (model.pt) to replay sampled records under their declared sampler; '
                        'a record it cannot replay fails the check')
    p.add_argument('--expect-tokenizer', default=None, metavar='FP', help='expected tokenizer fingerprint')
    p.add_argument('--expect-template', default=None, metavar='FP', help='expected template fingerprint')
    p.add_argument('--pad-id', type=int, default=None, help='padding id (default: from the word-level tokenizer)')
    p.add_argument('--eot-id', type=int, action='append', default=[], dest='eot_ids',
                   help='end-of-turn id, repeatable (default: the word-level </call>)')
    p.add_argument('--vocab-size', type=int, default=None, metavar='V',
                   help='refuse ids outside [0, V) (default: the word-level tokenizer\'s when the records use it, '
                        'else the model\'s; without either only negative ids are refused)')
    p.add_argument('--tol', type=float, default=d.tol, help='replay agreement tolerance, nats (default: 1e-4)')
    p.add_argument('--max-ratio-dev', type=float, default=d.max_ratio_dev,
                   help='fail if any replay ratio differs from 1 by more than this (default: 1e-3, the step-0 '
                        'check; inf: only report, e.g. when replaying with another checkpoint; NaN is refused)')
    p.add_argument('--examples', type=int, default=d.examples, help='refusal messages to print (default: 5)')
    p.add_argument('--batch-size', type=int, default=d.batch_size, help='records per read batch (default: 256)')
    p.set_defaults(func=run)


def options_from_args(args) -> CheckOptions:
    """Build the options dataclass from the parsed ``args``."""
    return CheckOptions(path=args.path, model=args.model, expect_tokenizer=args.expect_tokenizer,
                        expect_template=args.expect_template, pad_id=args.pad_id, eot_ids=list(args.eot_ids),
                        vocab_size=args.vocab_size, tol=args.tol, max_ratio_dev=args.max_ratio_dev,
                        examples=args.examples, batch_size=args.batch_size)


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
    from ..jobs.check import count_rows, run_check
    opts.validate()
    total = count_rows(opts.path)
    bar = Progress(total, progress_stream) if total >= PROGRESS_MIN_ROWS else None
    try:
        report = run_check(opts, progress=bar)
    finally:
        if bar is not None:
            bar.close()
    out(report.format())
    return report.code


def run(args) -> int:
    """Run the subcommand for parsed ``args``; return the exit code (errors raise, printed as one line)."""
    return check(options_from_args(args))
