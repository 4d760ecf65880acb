"""``agentrl report``: write RUN_DIR/report.html, a self-contained summary of a rollout run.

A run that is not finished (``run.json`` plans more episodes than are stored, or ``summary.json``
is missing) is reported as such, on the page and in the printed line, with the command that
finishes it.
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass

from .options import UserError


@dataclass
class ReportOptions:
    """Options of ``agentrl report`` (one field per flag).

    Attributes:
        run_dir: a folder written by ``agentrl rollout --out RUN_DIR`` (``trajectories/`` shards
            or an older ``trajectories.parquet``, and ``summary.json``).
        out: output file (default ``RUN_DIR/report.html``).
        fold: fold tool/template runs longer than this many tokens in the episode strip (0 = never).
    """
    run_dir: str
    out: str | None = None
    fold: int = 40

    def trajectories(self) -> str:
        """The shard folder ``RUN_DIR/trajectories/``, or the single ``RUN_DIR/trajectories.parquet``
        of a run written by an older agentrl."""
        single = os.path.join(self.run_dir, 'trajectories.parquet')
        shards = os.path.join(self.run_dir, 'trajectories')
        return shards if not os.path.exists(single) and os.path.isdir(shards) else single

    def validate(self) -> None:
        """Raise :class:`~agentrl.cli.options.UserError` naming the bad flag and the fix."""
        if os.path.isfile(self.run_dir):
            raise UserError(f'{self.run_dir!r} is a file; pass the run folder that holds it (RUN_DIR of '
                            '`agentrl rollout --out RUN_DIR`)')
        if not os.path.isdir(self.run_dir):
            raise UserError(f'run folder {self.run_dir!r} does not exist; create it with '
                            f'`agentrl rollout --out {self.run_dir}`')
        if not os.path.exists(self.trajectories()):
            raise UserError(f'{self.trajectories()} not found; run `agentrl rollout --out {self.run_dir}` first')
        if self.fold < 0:
            raise UserError(f'--fold must be >= 0 (0 = never fold), got {self.fold}')
        if self.out and os.path.isdir(self.out):
            raise UserError(f'--out {self.out!r} is a folder; pass a file name such as '
                            f'{os.path.join(self.out, "report.html")!r}')


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


def options_from_args(args) -> ReportOptions:
    """Build the options dataclass from the parsed ``args``."""
    return ReportOptions(run_dir=args.run_dir, out=args.out, fold=args.fold)


def _resume_of(run_dir: str) -> str:
    """``agentrl rollout --resume RUN_DIR``, plus ``--checkpoint FILE`` / ``--model DIR`` when run.json names one."""
    from ..jobs.plan import read_manifest
    cmd = f'agentrl rollout --resume {run_dir}'
    try:
        plan = (read_manifest(run_dir) or {}).get('plan', {})
    except ValueError:
        return cmd
    for key, flag in (('checkpoint', '--checkpoint FILE'), ('model', '--model DIR')):
        if plan.get(key):
            cmd += f' {flag}'
    return cmd


def write_report(opts: ReportOptions, progress=None) -> dict:
    """Read the run, render the page, write it atomically; return counts for the summary line."""
    from .. import store, viz
    path = opts.trajectories()
    n_rows = None
    try:
        import pyarrow.parquet as pq
        n_rows = sum(pq.ParquetFile(f).metadata.num_rows for f in store.data_files(path))
    except Exception:  # noqa: BLE001 - only the progress total depends on it
        pass
    bar = progress.add_task('reading records', total=n_rows) if progress else None
    trajs = []
    try:
        for batch in store.iter_batches(path, batch_size=256):
            trajs += batch
            if progress:
                progress.advance(bar, len(batch))
    except ValueError as e:
        if getattr(e, 'exit_code', None) == 1:      # a refused row: its message names the file, row and field
            raise
        raise UserError(f'{path}: {e}') from None
    if not trajs:
        if os.path.isfile(os.path.join(opts.run_dir, 'run.json')):     # a run stopped before its first shard
            raise UserError(f'{path} holds no records; finish the run with `{_resume_of(opts.run_dir)}`')
        raise UserError(f'{path} holds no records; remove {opts.run_dir!r} and run `agentrl rollout --out '
                        f'{opts.run_dir}`, or pass the folder of a run with records')
    summary = None
    spath = os.path.join(opts.run_dir, 'summary.json')
    if os.path.exists(spath):
        from ..io import read_json
        try:
            summary = read_json(spath, fix='delete it or rerun `agentrl rollout`')
        except ValueError as e:
            raise UserError(str(e)) from None
        if not isinstance(summary, dict):
            raise UserError(f'{spath!r} is not a run summary (a JSON object); delete it or rerun `agentrl rollout`')
    if progress:
        progress.update(bar, description='rendering report')
    trajs, n_dup = unique_records(trajs)
    incomplete = incompleteness(opts.run_dir, trajs, summary is not None)
    notes = '; '.join(n for n in (duplicates_note(n_dup, opts.run_dir), incomplete) if n)
    html = viz.report_html(trajs, summary, run_dir=opts.run_dir, fold=opts.fold, notice=notes)
    out = opts.out or os.path.join(opts.run_dir, 'report.html')
    from ..io import atomic_write
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    atomic_write(out, html)
    policies = len(viz.group_by_policy(trajs))
    return {'out': out, 'episodes': len(trajs), 'policies': policies, 'bytes': len(html.encode()),
            'incomplete': notes, 'duplicates': n_dup}


def unique_records(trajs: list) -> tuple[list, int]:
    """The records with each identity once (the first kept), and how many repeats were dropped.

    The key is the one ``agentrl check`` uses: ``(group_id, rollout_id, attempt)``
    (:func:`agentrl.checks.dedupe_key`), or the content digest for a record without one; ``check``
    refuses every repeat (DuplicateRecordError, or IdentityConflictError when the content differs).

    Returns:
        ``(kept, n_duplicates)``: a list of Trajectory in input order and an int >= 0.
    """
    from ..checks import dedupe_key
    seen: set = set()
    kept = []
    for t in trajs:
        key = dedupe_key(t)
        if key not in seen:
            seen.add(key)
            kept.append(t)
    return kept, len(trajs) - len(kept)


def duplicates_note(n: int, path: str) -> str:
    """``'N duplicate records (same identity) — `agentrl check PATH` refuses them'``, or '' when ``n`` is 0."""
    if not n:
        return ''
    return f'{n} duplicate record{"s" if n != 1 else ""} (same identity) — `agentrl check {path}` refuses them'


def incompleteness(run_dir: str, trajs: list, has_summary: bool) -> str:
    """What says a rollout run is unfinished, or '' when it is complete (or not a rollout run).

    A run folder with ``run.json`` planning ``N`` episodes is incomplete when fewer distinct episodes
    ``(group_id, rollout_id)`` than ``N`` are stored, or when ``summary.json`` is missing (the job
    was interrupted before its last write).

    Returns:
        ``'incomplete: K of N episodes stored; resume with `agentrl rollout --resume RUN_DIR`'`` (with
        ``', no summary.json'`` after ``stored`` when that is missing), or ``''``.

    Raises:
        UserError: ``run.json`` is not a run manifest.
    """
    from ..jobs.plan import read_manifest
    try:
        manifest = read_manifest(run_dir)
    except ValueError as e:
        raise UserError(str(e)) from None
    if manifest is None:
        return ''
    planned = int(manifest.get('episodes') or 0)
    stored = len({(t.provenance.group_id, t.provenance.rollout_id) for t in trajs if t.provenance is not None})
    if stored >= planned and has_summary:
        return ''
    return (f'incomplete: {stored} of {planned} episodes stored{"" if has_summary else ", no summary.json"}; '
            f'resume with `agentrl rollout --resume {run_dir}`')


def run(args) -> int:
    """Run the subcommand for parsed ``args``; return the exit code (errors raise ``UserError``, one line)."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    opts = options_from_args(args)
    opts.validate()
    t0 = time.time()
    err = Console(stderr=True)
    with Progress(TextColumn('{task.description}'), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=err, transient=True) as progress:
        res = write_report(opts, progress)
    policies = f"{res['policies']} polic{'y' if res['policies'] == 1 else 'ies'}"
    from ..io import printable
    note = f"; {res['incomplete']}" if res['incomplete'] else ''
    Console().print(printable(f"wrote {res['out']}: {res['episodes']} episodes, {policies}, "
                              f"{res['bytes'] / 1024:.0f} KB in {time.time() - t0:.1f} s{note}"),
                    highlight=False, markup=False, soft_wrap=True)
    return 0
