"""L5: the report job: read a rollout run folder, render ``RUN_DIR/report.html``, say what is unfinished.

A run that is not finished (``run.json`` plans more episodes than are stored, or ``summary.json``
is missing) is reported as such, on the page and in the returned note, with the command that
finishes it. Records are counted once (:class:`agentrl.checks.Deduper`); ``agentrl check``
refuses the repeats. Errors are ``ValueError`` with the fix (``agentrl report`` prints them as one
line), or the refused row's :class:`~agentrl.checks.RecordError`.
"""
from __future__ import annotations

import os
from dataclasses import dataclass

from ..io import atomic_write, read_json
from .plan import POLICIES
from .resume import read_manifest

__all__ = ['ReportOptions', 'ReportResult', 'write_report', 'unique_records', 'duplicates_note', 'incompleteness']


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
        """Check the options before anything is read.

        Raises:
            ValueError: naming the bad flag (or RUN_DIR) and the fix; a shard folder names its run
                folder; a ``summary.json`` that is not a run summary names the file.
        """
        if os.path.isfile(self.run_dir):
            run = _run_of(os.path.dirname(self.run_dir))
            raise ValueError(f'{self.run_dir!r} is a file; pass the run folder that holds it ' +
                             (f'(`agentrl report {run}`)' if run else '(RUN_DIR of `agentrl rollout --out RUN_DIR`)'))
        if not os.path.isdir(self.run_dir):
            raise ValueError(f'run folder {self.run_dir!r} does not exist; create it with '
                             f'`agentrl rollout --out {self.run_dir}`')
        if not os.path.exists(self.trajectories()):
            run = _run_of(self.run_dir)
            if run:
                raise ValueError(f'{self.run_dir!r} is the shard folder of the run {run!r}; pass the run folder: '
                                 f'`agentrl report {run}`')
            if any(f.endswith('.parquet') for f in os.listdir(self.run_dir)):
                raise ValueError(f'{self.run_dir!r} holds trajectory files but is not a run folder (no trajectories/ '
                                 'or trajectories.parquet in it); `agentrl check` and `agentrl show` read such a '
                                 'folder, `agentrl report` reads the run folder that holds trajectories/')
            if os.path.isfile(os.path.join(self.run_dir, 'run.json')):     # a run stopped before its first shard
                raise ValueError(f'{self.trajectories()} not found: the run stopped before its first shard; '
                                 f'finish it with `{_resume_of(self.run_dir)}`')
            raise ValueError(f'{self.run_dir!r} is not a run folder (no run.json, trajectories/ or '
                             'trajectories.parquet in it); pass a run folder written by `agentrl rollout`, '
                             '`agentrl serve` or `agentrl import`')
        if self.fold < 0:
            raise ValueError(f'--fold must be >= 0 (0 = never fold), got {self.fold}')
        _read_summary(self.run_dir)                # a summary.json that is not one: refused before any reading
        if self.out and os.path.isdir(self.out):
            raise ValueError(f'--out {self.out!r} is a folder; pass a file name such as '
                             f'{os.path.join(self.out, "report.html")!r}')


def _run_of(folder: str) -> str:
    """The run folder whose shard folder ``folder`` is (``RUN`` for ``RUN/trajectories``), or ''."""
    folder = folder.rstrip(os.sep) or os.sep
    parent = os.path.dirname(folder) or '.'
    if os.path.basename(folder) == 'trajectories' and any(
            os.path.isfile(os.path.join(parent, n)) for n in ('run.json', 'summary.json')):
        return parent
    return ''


@dataclass
class ReportResult:
    """What :func:`write_report` wrote.

    Attributes:
        out: the page's path. episodes: records on it (each identity once). policies: policies on it.
        bytes: the page's size in bytes. incomplete: the notes (unfinished run, duplicates; '' when none).
        duplicates: repeated records left out. calls: the tool-call statuses the records store
            (:func:`agentrl.checks.calls.records_calls_line`; '' when none does).
    """
    out: str
    episodes: int
    policies: int
    bytes: int
    incomplete: str
    duplicates: int
    calls: str = ''


def _resume_of(run_dir: str) -> str:
    """``agentrl rollout --resume RUN_DIR``, plus ``--checkpoint FILE`` / ``--model DIR`` when run.json names one."""
    cmd = f'agentrl rollout --resume {run_dir}'
    try:
        plan = (read_manifest(run_dir) or {}).get('plan', {})
    except ValueError:
        return cmd
    for key, flag in (('checkpoint', '--checkpoint FILE'), ('model', '--model DIR')):
        if plan.get(key):
            cmd += f' {flag}'
    return cmd


def _read_records(opts: ReportOptions, progress=None) -> list:
    """Every record of the run (a rich ``progress`` advances as batches are read)."""
    from .. import store
    from ..checks import RecordError
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
    except RecordError:                 # a refused row: its message names the file, row and field
        raise
    except ValueError as e:             # the store's messages name the file already: not twice
        msg = str(e)
        raise ValueError(msg if msg.startswith(("'", '"')) or str(path) in msg else f'{path}: {msg}') from None
    if not trajs:
        if os.path.isfile(os.path.join(opts.run_dir, 'run.json')):     # a run stopped before its first shard
            raise ValueError(f'{path} holds no records; finish the run with `{_resume_of(opts.run_dir)}`')
        raise ValueError(f'{path} holds no records; remove {opts.run_dir!r} and run `agentrl rollout --out '
                         f'{opts.run_dir}`, or pass the folder of a run with records')
    if progress:
        progress.update(bar, description='rendering report')
    return trajs


def _read_summary(run_dir: str) -> dict | None:
    """``RUN_DIR/summary.json`` (None when there is none)."""
    spath = os.path.join(run_dir, 'summary.json')
    if not os.path.exists(spath):
        return None
    summary = read_json(spath, fix='delete it or rerun `agentrl rollout`')
    if not isinstance(summary, dict):
        raise ValueError(f'{spath!r} is not a run summary (a JSON object); delete it or rerun `agentrl rollout`')
    for key in ('policies', 'options'):          # what the page reads from it
        if summary.get(key) is not None and not isinstance(summary[key], dict):
            what = {bool: 'true/false', int: 'a number', float: 'a number', str: 'a string', list: 'a list'}.get(
                type(summary[key]), 'not an object')
            raise ValueError(f'{spath!r}: {key} is {what}, not a JSON object, so this is not a run summary; delete '
                             'it or rerun `agentrl rollout`')
    return summary


def write_report(opts: ReportOptions, progress=None) -> ReportResult:
    """Read the run, render the page (:func:`agentrl.viz.report_html`), write it atomically.

    Records of ``agentrl rollout``'s policies (:data:`agentrl.jobs.plan.POLICIES`) keep the BugFix gym's
    words; imported and gateway records are described by their stop reasons, as ``agentrl check`` does.

    Args:
        opts: the :class:`ReportOptions` (validated by the caller). progress: a rich ``Progress``
            to show the reading on (None: none).

    Returns:
        :class:`ReportResult`.

    Raises:
        ValueError: no records, a file that is not a trajectory file, a summary or manifest that is
            not one (the message names the file and the fix). RecordError: a refused row.
        OSError: the page could not be written.
    """
    from .. import viz
    from ..checks.calls import records_calls_line
    trajs = _read_records(opts, progress)
    summary = _read_summary(opts.run_dir)
    trajs, n_dup = unique_records(trajs)
    incomplete = incompleteness(opts.run_dir, trajs, summary is not None)
    notes = '; '.join(n for n in (duplicates_note(n_dup, opts.run_dir), incomplete) if n)
    html = viz.report_html(trajs, summary, run_dir=opts.run_dir, fold=opts.fold, notice=notes, gym_policies=POLICIES)
    out = opts.out or os.path.join(opts.run_dir, 'report.html')
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    atomic_write(out, html)
    return ReportResult(out=out, episodes=len(trajs), policies=len(viz.group_by_policy(trajs)),
                        bytes=len(html.encode()), incomplete=notes, duplicates=n_dup,
                        calls=records_calls_line(trajs))


def unique_records(trajs: list) -> tuple[list, int]:
    """The records with each identity once (the first kept), and how many repeats were dropped.

    The key is the one ``agentrl check`` uses (:class:`agentrl.checks.Deduper`:
    ``(group_id, rollout_id, attempt)``, or the content digest for a record without one); ``check``
    refuses every repeat (DuplicateRecordError, or IdentityConflictError when the content differs).

    Returns:
        ``(kept, n_duplicates)``: a list of Trajectory in input order and an int >= 0.
    """
    from ..checks import Deduper
    d = Deduper()
    kept = d.unique(trajs)
    return kept, d.repeats


def duplicates_note(n: int, path: str) -> str:
    """``'N duplicate records (same identity) — `agentrl check PATH` refuses them'``, or '' when ``n`` is 0."""
    if not n:
        return ''
    return f'{n} duplicate record{"s" if n != 1 else ""} (same identity) — `agentrl check {path}` refuses them'


def incompleteness(run_dir: str, trajs: list | None, has_summary: bool) -> str:
    """What says a rollout run is unfinished, or '' when it is complete (or not a rollout run).

    A run folder with ``run.json`` planning ``N`` episodes is incomplete when fewer distinct episodes
    ``(group_id, rollout_id)`` than ``N`` are stored, or when ``summary.json`` is missing (the job
    was interrupted before its last write). A gateway run (``agentrl serve``: ``run.json`` of kind
    ``gateway``, no plan) is incomplete only while it has no ``summary.json`` (written at shutdown).

    ``trajs``: the run's records, or None to count the episodes from the identity columns of its files
    (``agentrl check``, which does not keep the records).

    Returns:
        ``'incomplete: K of N episodes stored; resume with `agentrl rollout --resume RUN_DIR`'`` (with
        ``', no summary.json'`` after ``stored`` when that is missing), or ``''``.

    Raises:
        ValueError: ``run.json`` is not a run manifest.
    """
    if _run_kind(run_dir) == 'gateway':
        return '' if has_summary else ('incomplete: no summary.json (the gateway is still serving, or was killed: '
                                       f'`agentrl serve --out {run_dir}` resumes its open sessions)')
    manifest = read_manifest(run_dir)
    if manifest is None:
        return ''
    planned = int(manifest.get('episodes') or 0)
    if trajs is None:
        stored = len(_stored_episodes(run_dir))
    else:
        stored = len({(t.provenance.group_id, t.provenance.rollout_id) for t in trajs if t.provenance is not None})
    if stored >= planned and has_summary:
        return ''
    return (f'incomplete: {stored} of {planned} episodes stored{"" if has_summary else ", no summary.json"}; '
            f'resume with `agentrl rollout --resume {run_dir}`')


def _stored_episodes(run_dir: str) -> set:
    """The ``(group_id, rollout_id)`` of every row of the run's files (only those two columns are read)."""
    import pyarrow.parquet as pq

    from .. import store
    keys = set()
    for f in store.data_files(run_dir):
        t = pq.read_table(f, columns=['group_id', 'rollout_id'])
        keys.update(zip(t.column('group_id').to_pylist(), t.column('rollout_id').to_pylist()))
    keys.discard((None, None))
    return keys


def _run_kind(run_dir: str) -> str | None:
    """``run.json``'s ``kind`` (``'gateway'`` for ``agentrl serve``; None for a rollout run, none or unreadable)."""
    import json
    try:
        with open(os.path.join(run_dir, 'run.json')) as f:
            kind = json.load(f).get('kind')
    except (OSError, ValueError, AttributeError):
        return None
    return kind if isinstance(kind, str) else None
