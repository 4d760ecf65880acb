"""L5: the one rollout job: plan, run (in this process or on Ray actors), stream to shards, summarise.

The job reads as its three phases: :func:`prepare` (every check and load, nothing written) ->
:func:`run` (under ``OUT/.lock``: manifest, model, the missing chunks) -> :func:`summarise`
(a :class:`RunSummary`); :func:`rollout_job` calls them. The resume rules are
:mod:`agentrl.jobs.resume`.

``agentrl rollout`` lands here, whatever the engine (scripted, TinyAgent, Hugging Face) and the
scale (``--workers 0``: this process; ``N``: Ray actors). Every path writes the same run folder::

    OUT/.lock                       held while a job writes (a second job into OUT refuses); removed after
    OUT/run.json                    the plan (:func:`agentrl.jobs.resume.manifest_of`)
    OUT/model.pt                    the untrained TinyAgent (when no checkpoint is given)
    OUT/trajectories/part-*.parquet one shard per chunk, written as chunks finish
    OUT/summary.json                written last: a run with a summary is complete

and the same records wherever a chunk runs (docs/design.md#scale-out, docs/design.md#seeds). Memory is
bounded by the chunk: records go to disk as each chunk finishes and the summary is accumulated on the way.

Nothing is written before every refusal check has passed (options, checkpoint, an existing run
in ``OUT``, Ray installed). A run that fails before its first shard leaves ``OUT`` as it found
it; after that it resumes as docs/design.md#scale-out says. Ctrl-C finishes the chunk in hand, keeps every
finished shard and raises :class:`RunInterrupted` naming the command that resumes (a second Ctrl-C stops at once);
SIGTERM stops at once (within seconds, whatever the chunk in hand is doing: docs/design.md#bounds),
keeps every finished shard (the chunk in hand runs again on resume) and raises the same.
"""
from __future__ import annotations

import contextlib
import errno
import hashlib
import io as _bytes_io
import os
import signal
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from ..engines.contract import EngineDied
from ..engines.factory import BACKENDS, backend, rollout_kit
from ..engines.fingerprint import model_fingerprint
from ..fields import check_fields
from ..io import LOCK, FolderLockedError, atomic_write, folder_lock
from .plan import MANIFEST, SUMMARY, TRAJECTORY_DIR, RolloutOptions, plan_episodes, public_options
from .resume import RunComplete, holds_run, manifest_of, refuse_if_complete, resume_command, resume_options, \
    stored_records
from ..stats import SummaryBuilder
from .runner import RunReport, RunSpec, run_chunks
from .servers import server_died_line, server_run_spec

__all__ = ['RunReport', 'RunInterrupted', 'RunComplete', 'RunLockedError', 'run_chunks', 'rollout_job', 'run_lock',
           'model_fingerprint', 'resume_command', 'LOCK', 'Prepared', 'prepare', 'run', 'summarise', 'RunSummary',
           'EngineSummary', 'rollout_summary']


class RunInterrupted(Exception):
    """A rollout stopped by Ctrl-C or SIGTERM after finishing the chunk in hand.

    Attributes:
        out: the run folder. done: episodes stored. total: episodes planned.
    """

    def __init__(self, out: str, done: int, total: int, command: str | None = None):
        self.out, self.done, self.total = out, done, total
        super().__init__(f'interrupted: {done} of {total} episodes are stored in {out!r}; finish the run with: '
                         f'{command or resume_command(out)}')


#: Another job is writing the run folder (it holds ``OUT/.lock``).
RunLockedError = FolderLockedError


# ----------------------------------------------------------------------------- run folder: lock, model

#: ``run_lock(folder)``: hold ``folder/.lock`` for the block (:func:`agentrl.io.folder_lock`).
run_lock = folder_lock


def _checkpoint_bytes(net) -> bytes:
    import torch
    buf = _bytes_io.BytesIO()
    torch.save({'config': net.config(), 'state_dict': net.state_dict()}, buf)
    return buf.getvalue()


class _Terminated(KeyboardInterrupt):
    """SIGTERM arrived: the job stops where it is (raised once, by :class:`_Signals`)."""


class _Signals:
    """While active: the first SIGINT asks the job to stop after the chunk in hand; a second SIGINT
    raises KeyboardInterrupt at once; SIGTERM raises :class:`_Terminated` at once (once: a second one
    is ignored while the job unwinds). Only in the main thread (signals are delivered there)."""

    def __init__(self):
        self.stop = False
        self.terminated = False
        self._old = {}

    def _handle(self, signum, frame):
        if signum == signal.SIGTERM:
            self.stop = True
            if not self.terminated:
                self.terminated = True
                raise _Terminated
            return
        if self.stop and signum == signal.SIGINT:
            raise KeyboardInterrupt
        self.stop = True

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():
            for s in (signal.SIGINT, signal.SIGTERM):
                self._old[s] = signal.signal(s, self._handle)
        return self

    def __exit__(self, *exc):
        for s, h in self._old.items():
            signal.signal(s, h)


# ----------------------------------------------------------------------------- phase 1: prepare

@dataclass
class Prepared:
    """What :func:`prepare` checked and loaded; nothing is written yet.

    Attributes:
        opts: the options the run goes with (a resume's: its plan plus this command's scale-out).
        manifest: ``run.json`` of a resume (None: a new run).
        jobs: the plan (:func:`~agentrl.jobs.plan.plan_episodes`). tasks: the BugFix tasks.
        spec: the runners' :class:`~agentrl.jobs.runner.RunSpec`.
        weights: ``{'config', 'state_dict'}`` of the TinyAgent policy (None without one).
        model: ``{'name', 'fingerprint'}`` of the model policy (None without one).
        model_bytes: the untrained TinyAgent to save as ``OUT/model.pt`` (None otherwise).
        tok: agentrl's word-level tokenizer.
        logp_mode: a server backend's probed log-prob mode (set by :func:`run`; '' otherwise).
    """
    opts: RolloutOptions
    manifest: dict | None
    jobs: list
    tasks: list
    spec: RunSpec
    weights: dict | None
    model: dict | None
    model_bytes: bytes | None
    tok: object
    logp_mode: str = ''

    @property
    def out(self) -> Path:
        """The run folder."""
        return Path(self.opts.out)


def prepare(opts: RolloutOptions) -> Prepared:
    """Every check and every load of a rollout, before anything is written.

    Raises:
        ValueError, ImportError, ConnectionError: as :func:`rollout_job` (options, ``OUT`` already
            holding a run, a resume's plan or model, Ray).
        RunComplete: a resume of a complete run (nothing to run).
    """
    from .. import gym
    opts, manifest = _resolved_options(opts)
    out = Path(opts.out)
    if out.exists() and not out.is_dir():
        raise ValueError(f'--out {opts.out!r} is a file; pass a folder')
    tasks = gym.make_tasks(opts.split)
    tok = gym.bugfix_tokenizer()
    if manifest is None:
        _refuse_a_run_in(out, opts, 'model' in opts.policy and not backend(opts.engine).model_dir and not opts.checkpoint)
    weights, model, model_bytes = _policy_model(opts, manifest, tok)
    if manifest is not None and manifest.get('model') and model and manifest['model'] != model:
        raise ValueError(f'--resume {opts.out!r}: the run was sampled from {manifest["model"]["name"]}@'
                         f'{manifest["model"]["fingerprint"]}, the model there now is {model["name"]}@'
                         f'{model["fingerprint"]}; restore that model or start a new --out')
    jobs = plan_episodes(opts.policy, [t.name for t in tasks], opts.repeats, opts.seed)
    if manifest is not None:
        refuse_if_complete(out, jobs)                # nothing to run: nothing is written, not even OUT/.lock
    spec = RunSpec(opts, model_id=f'{model["name"]}@{model["fingerprint"]}' if model else '')
    return Prepared(opts, manifest, jobs, tasks, spec, weights, model, model_bytes, tok)


def _resolved_options(opts: RolloutOptions) -> tuple[RolloutOptions, dict | None]:
    """The validated options to run with and the manifest of a resume (None for a new run)."""
    opts.validate()
    manifest = None
    if opts.resume:
        opts, manifest = resume_options(opts)
        opts.validate()
        check_fields(opts, engine=opts.engine)          # a flag that does not apply to the run's engine
    if opts.workers > 0:
        from ..engines.ray import check_address, require_ray
        require_ray()
        check_address(opts.address)          # before anything is written: ray.init would hang on it
    return opts, manifest


def _refuse_a_run_in(out: Path, opts: RolloutOptions, writes_model: bool) -> None:
    found = holds_run(out, writes_model)
    if found:
        raise ValueError(f'--out {opts.out!r} already holds a run ({", ".join(found)}); pass --resume '
                         f'{opts.out} to finish it, or choose a new --out')


def _policy_model(opts: RolloutOptions, manifest: dict | None, tok) -> tuple[dict | None, dict | None, bytes | None]:
    """``(weights, {'name', 'fingerprint'}, model_bytes)`` of the model policy (Nones without one)."""
    out = Path(opts.out)
    if 'model' not in opts.policy:
        return None, None, None
    if backend(opts.engine).model_dir:
        return None, {'name': Path(opts.model).resolve().name, 'fingerprint': model_fingerprint(opts.model)}, None
    from ..checkpoint import load_checkpoint
    from ..model import TinyAgent
    model_bytes = None
    if opts.checkpoint:
        net = load_checkpoint(opts.checkpoint)
        _check_vocabulary(net, tok, f'--checkpoint {opts.checkpoint!r}')
        model = {'name': Path(opts.checkpoint).name, 'fingerprint': model_fingerprint(opts.checkpoint)}
    elif manifest is not None and (out / 'model.pt').exists():
        net = load_checkpoint(str(out / 'model.pt'))
        model = {'name': 'model.pt', 'fingerprint': model_fingerprint(out / 'model.pt')}
    else:
        import torch
        torch.manual_seed(opts.seed)
        net = TinyAgent(tok.vocab_size).eval()
        model_bytes = _checkpoint_bytes(net)
        model = {'name': 'model.pt', 'fingerprint': hashlib.sha256(model_bytes).hexdigest()[:12]}
    return {'config': net.config(), 'state_dict': net.state_dict()}, model, model_bytes


def _check_vocabulary(net, tok, where: str) -> None:
    """Refuse a TinyAgent whose vocabulary is not the word-level tokenizer's: it would index past its embedding
    (smaller) or sample ids the tokenizer cannot decode (larger)."""
    v = net.config()['vocab_size']
    if v != tok.vocab_size:
        raise ValueError(f"{where}: the model's vocab_size is {v} but the BugFix tokenizer has {tok.vocab_size} "
                         'entries; pass a checkpoint of a TinyAgent built for this tokenizer (the model.pt that '
                         '`agentrl rollout` or `agentrl train` wrote)')


# ----------------------------------------------------------------------------- phase 2: run

class _Tally:
    """Per-policy statistics of a run's records (those a resume finds, then the new ones) and the
    first ``hf`` record's provenance; memory is the builders', not the records'."""

    def __init__(self, p: Prepared):
        self.index = {j.key: j for j in p.jobs}
        self.builders = {pol: SummaryBuilder(None if pol == 'model' and backend(p.opts.engine).chat
                                             else p.tok.unk_id)
                         for pol in p.opts.policy}
        self.hf_provenance = None
        self.chat_policies = {b.policy for b in BACKENDS.values() if b.chat}   # records of a chat engine's model

    def add(self, recs) -> None:
        by_policy: dict = {}
        for t in recs:
            j = self.index.get((t.provenance.group_id, t.provenance.rollout_id))
            if j is not None:
                ts, order = by_policy.setdefault(j.policy, ([], []))
                ts.append(t)
                order.append(j.index)
            if self.hf_provenance is None and t.provenance.policy in self.chat_policies:
                self.hf_provenance = t.provenance
        for pol, (ts, order) in by_policy.items():
            self.builders[pol].add(ts, order)


def run(p: Prepared, tally: _Tally, written: list, *, on_chunk: Callable | None = None, progress: bool = True,
        handle_signals: bool = True, **pool) -> RunReport:
    """Write the manifest (new run) and the untrained model, tally what a resume finds, run the missing chunks.

    Called with ``OUT/.lock`` held (:func:`rollout_summary`); appends every file it writes before
    the first shard to ``written`` (removed again if the run fails before one).

    Returns:
        the :class:`RunReport` of :func:`run_chunks`.

    Raises:
        RunInterrupted: Ctrl-C stopped the run after a chunk, or SIGTERM during one (shards stored). ValueError: as
            :func:`rollout_job`; and what :func:`run_chunks` raises.
    """
    out, opts = p.out, p.opts
    if p.manifest is None:
        _refuse_a_run_in(out, opts, p.model_bytes is not None)             # again, under the lock
        written.append(out / MANIFEST)      # named before it is written: an exception after the rename still undoes it
        atomic_write(out / MANIFEST, _json(manifest_of(opts, len(p.jobs), p.model)))
    shard_dir = out / TRAJECTORY_DIR
    command = resume_command(opts.out, opts.checkpoint, opts.model, opts.server)
    # a local server starts before the signal handlers (Ctrl-C while it starts stops it) and stops after them
    with server_run_spec(p) as spec, _Signals() if handle_signals else contextlib.nullcontext() as sig:
        if p.manifest is not None and shard_dir.is_dir():
            for batch in stored_records(shard_dir, p.jobs, spec, p.tok):   # what a resume finds, provenance checked
                tally.add(batch)
        if p.model_bytes is not None and not (out / 'model.pt').exists():
            written.append(out / 'model.pt')    # before the write: SIGTERM in its folder fsync, after the rename, undoes it
            atomic_write(out / 'model.pt', p.model_bytes)
        p.logp_mode = spec.logp_mode
        try:
            report = run_chunks(p.jobs, shard_dir, spec, p.weights, workers=opts.workers, address=opts.address,
                                chunk_size=opts.chunk_size, resume=p.manifest is not None, progress=progress,
                                on_chunk=on_chunk, on_records=lambda c, r: tally.add(r),
                                should_stop=(lambda: sig.stop) if sig is not None else None, **pool)
        except EngineDied as err:                   # one line naming the server; the finished shards are kept
            if not backend(opts.engine).servers:
                raise
            line = server_died_line(err, str(opts.out), len(p.jobs), command)
            raise rollout_kit(opts.engine).ServerDied(err.url, err.detail, line) from None
        except _Terminated:                         # SIGTERM: finished shards are kept, the chunk in hand is not
            from ..store import stored_identities
            stored = len(stored_identities(shard_dir))
            if not stored:
                raise                               # nothing kept: OUT is left as it was (agentrl: interrupted)
            raise RunInterrupted(str(opts.out), stored, len(p.jobs), command) from None
    if report.stopped:
        raise RunInterrupted(str(opts.out), report.skipped + report.written, report.planned, command)
    return report


@contextlib.contextmanager
def _run_folder(p: Prepared):
    """Create ``OUT`` and hold ``OUT/.lock`` for the block; yield the list of files written before the first shard.

    A block that fails before the first shard removes them (and ``OUT`` when it made it), so ``OUT``
    is as it was; a full disk after some shards keeps them and says how to resume.
    """
    out, opts = p.out, p.opts
    made_out = not out.exists()
    out.mkdir(parents=True, exist_ok=True)
    written: list = []
    undone = False
    try:
        with run_lock(out):                             # OUT/.lock, removed when the block ends
            try:
                yield written
            except BaseException as e:
                if not _has_shards(out):
                    _undo(out, written)       # no shard yet: leave OUT as it was
                    undone = True
                elif isinstance(e, OSError) and e.errno == errno.ENOSPC:      # the finished shards are kept
                    where = f': {e.filename!r}' if e.filename else ''
                    raise ValueError(f'No space left on device{where}; the finished shards are kept in {opts.out!r}: '
                                     'free some space, then finish the run with: '
                                     f'{resume_command(opts.out, opts.checkpoint, opts.model)}') from e
                raise
    except BaseException:
        if undone and made_out:
            with contextlib.suppress(OSError):
                out.rmdir()                   # empty now: run_lock has removed OUT/.lock
        raise


# ----------------------------------------------------------------------------- phase 3: summarise

@dataclass
class EngineSummary:
    """Where and how a run's chunks ran (``summary.json``'s ``engine``).

    Attributes:
        workers, address, ray_version, chunk_size: as run ('' address / version in process).
        planned: episodes in the plan. skipped_by_resume: episodes a resume found stored.
        written: records this run wrote. retried: ``[group_id, rollout_id, attempt]`` of re-run
        episodes. startup_seconds: Ray start plus actor start (or the runner's set-up).
        workers_started, nodes, workers_died: actors started, nodes that ran chunks, actors lost.
    """
    workers: int
    address: str
    ray_version: str
    chunk_size: int
    planned: int
    skipped_by_resume: int
    written: int
    retried: list
    startup_seconds: float
    workers_started: int
    nodes: int
    workers_died: int


@dataclass
class RunSummary:
    """A rollout's summary (``OUT/summary.json`` is :meth:`to_dict`).

    Attributes:
        options: the options with local paths as their last component (:func:`~agentrl.jobs.plan.public_options`).
        tasks: BugFix tasks. episodes: episodes stored. seconds: wall time of this job.
        trajectories: the shard folder's name. tokenizer, vocab_size: the word-level tokenizer's
        fingerprint and size. policies: :class:`~agentrl.stats.PolicySummary` per policy.
        model: ``{'name', 'fingerprint'}`` of the model policy (None without one).
        engine: :class:`EngineSummary`. hf: the ``hf`` engine's model, tokenizer, template and
        sampling (and ``profile`` with ``--profile``); None for other engines.
    """
    options: dict
    tasks: int
    episodes: int
    seconds: float
    trajectories: str
    tokenizer: str
    vocab_size: int
    policies: dict
    model: dict | None
    engine: EngineSummary
    hf: dict | None = None

    def to_dict(self) -> dict:
        """The summary as ``summary.json`` holds it (keys in this order; ``hf`` only for the hf engine)."""
        from dataclasses import asdict
        d = {'options': self.options, 'tasks': self.tasks, 'episodes': self.episodes, 'seconds': self.seconds,
             'trajectories': self.trajectories, 'tokenizer': self.tokenizer, 'vocab_size': self.vocab_size,
             'policies': {k: v.to_dict() for k, v in self.policies.items()}, 'model': self.model,
             'engine': asdict(self.engine)}
        if self.hf is not None:
            d['hf'] = self.hf
        return d


def summarise(p: Prepared, report: RunReport, tally: _Tally, seconds: float) -> RunSummary:
    """The :class:`RunSummary` of a finished run from its plan, its :class:`RunReport` and its records' tally."""
    opts = p.opts
    engine = EngineSummary(
        workers=opts.workers, address=report.address, ray_version=report.ray_version, chunk_size=opts.chunk_size,
        planned=report.planned, skipped_by_resume=report.skipped, written=report.written,
        retried=[list(r) for r in report.retried], startup_seconds=round(report.startup_seconds, 3),
        workers_started=len(report.workers), nodes=len({w.node_id for w in report.workers if w.chunks}),
        workers_died=sum(not w.alive for w in report.workers))
    hf = None
    if tally.hf_provenance is not None:
        hp = tally.hf_provenance
        hf = {'model': hp.model, 'tokenizer': hp.tokenizer, 'template': hp.template,
              'sampling': hp.sampling.to_dict() if hp.sampling is not None else None}
        if backend(p.opts.engine).servers:
            hf.update(servers=len(p.opts.server or [None]), logp_mode=p.logp_mode)
        if report.profiles:
            from ..engines.hf import merge_profiles
            hf['profile'] = merge_profiles(report.profiles)
    return RunSummary(options=public_options(opts), tasks=len(p.tasks), episodes=report.skipped + report.written,
                      seconds=round(seconds, 3), trajectories=TRAJECTORY_DIR, tokenizer=p.tok.fingerprint,
                      vocab_size=p.tok.vocab_size,
                      policies={pol: b.summary() for pol, b in tally.builders.items() if b.n},
                      model=p.model, engine=engine, hf=hf)


# ----------------------------------------------------------------------------- the job

def rollout_summary(opts: RolloutOptions, *, on_chunk: Callable | None = None, progress: bool = True,
                    handle_signals: bool = True, **pool) -> RunSummary:
    """The rollout job as its three phases: :func:`prepare`, :func:`run`, :func:`summarise`.

    Writes ``OUT/summary.json`` (:meth:`RunSummary.to_dict`) last, under the lock. Arguments and
    errors: :func:`rollout_job`.
    """
    p = prepare(opts)
    t0 = time.time()
    with _run_folder(p) as written:
        tally = _Tally(p)
        report = run(p, tally, written, on_chunk=on_chunk, progress=progress, handle_signals=handle_signals, **pool)
        summary = summarise(p, report, tally, time.time() - t0)
        atomic_write(p.out / SUMMARY, _json(summary.to_dict()))
    return summary


def rollout_job(opts: RolloutOptions, *, on_chunk: Callable | None = None, progress: bool = True,
                handle_signals: bool = True, **pool) -> dict:
    """The ``agentrl rollout`` job: check, plan, run, stream to shards, summarise.

    Args:
        opts: the :class:`~agentrl.jobs.plan.RolloutOptions`.
        on_chunk: called after each written chunk (see :func:`run_chunks`; tests use it to kill
            a worker or the job at a known point).
        progress: show the progress bar on stderr.
        handle_signals: Ctrl-C/SIGTERM finish the chunk in hand (main thread only).
        **pool: more options of :func:`agentrl.engines.ray.run`.

    Returns:
        The summary dict (also written to ``OUT/summary.json``; :meth:`RunSummary.to_dict`): options
        (local paths as their last component), tasks, episodes, seconds, ``trajectories`` (the shard
        folder's name), tokenizer fingerprint, vocabulary size, ``policies``
        (:class:`~agentrl.stats.PolicySummary` dicts), ``model`` (name and fingerprint), ``hf`` (for
        the ``hf`` engine) and ``engine`` (workers, address, Ray version, retried identities,
        episodes skipped by a resume).

    Raises:
        ValueError: a bad option; ``OUT`` already holds a run (fix: ``--resume OUT`` or a new
            ``--out``); ``--resume`` of a folder without ``run.json``, or with another plan or model,
            or whose stored records are of another plan (an episode it does not plan, or another
            policy, model, sampler, tokenizer, template or seed than run.json fixes: the message
            names the shard file, the row and the field).
        RunComplete: ``--resume`` of a complete run (summary written, every episode stored);
            nothing is written.
        RunLockedError: another job is writing ``OUT``.
        RunInterrupted: Ctrl-C or SIGTERM; finished shards are kept, resume with ``--resume OUT``.
        OSError: a write failed (full disk); a run that had no shard yet leaves ``OUT`` as it was.
        ValueError: ``No space left on device ...`` after some shards: they are kept, and the
            message gives the ``--resume`` command that finishes the run.
        ImportError, ConnectionError, TimeoutError, RuntimeError: from the Ray pool.
    """
    return rollout_summary(opts, on_chunk=on_chunk, progress=progress, handle_signals=handle_signals,
                           **pool).to_dict()


def _has_shards(out: Path) -> bool:
    from .. import store
    shards = out / TRAJECTORY_DIR
    return shards.is_dir() and bool(store.data_files(shards))


def _json(obj) -> str:
    import json
    return json.dumps(obj, indent=2)


def _undo(out: Path, written: list) -> None:
    """Remove what a failed job wrote before its first shard (so ``OUT`` is as it was, but for ``.lock``,
    which :func:`run_lock` removes, and ``OUT`` itself, which the job removes after it)."""
    for f in written:
        with contextlib.suppress(OSError):
            Path(f).unlink()
    with contextlib.suppress(OSError):
        (out / TRAJECTORY_DIR).rmdir()
