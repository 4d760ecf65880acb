"""L5: run chunks of planned episodes (a scripted, TinyAgent or Hugging Face policy) and stream them to shards.

The same :class:`EpisodeRunner` runs in this process (``--workers 0``) and inside every Ray
actor (:mod:`agentrl.engines.ray`), so a chunk gives the same records wherever it runs
(docs/design.md#seeds; a chunk is one batch). :func:`run_chunks` runs a
plan's chunks (in this process or on the actor pool) and writes each as one shard.
"""
from __future__ import annotations

import contextlib
import dataclasses
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

from ..engines import ray as ray_pool
from ..engines.contract import EngineDied
from ..engines.factory import backend, rollout_kit
from .plan import EpisodeJob, RolloutOptions, plan_chunks

__all__ = ['RunSpec', 'EpisodeRunner', 'RunnerFactory', 'RunReport', 'run_chunks']


@dataclass(frozen=True)
class RunSpec:
    """What every runner needs besides the TinyAgent weights (small; sent to each actor).

    The run's own options, not a restatement of them: the runner reads ``max_turns``,
    ``reward_tests``, ``batch``, ``engine``, ``model`` (the ``hf`` folder), ``max_new_tokens``,
    ``profile`` and the sampler (:meth:`~agentrl.jobs.plan.RolloutOptions.sampling_spec`) there.

    Attributes:
        options: the run's :class:`~agentrl.jobs.plan.RolloutOptions` (default: the defaults).
        model_id: ``provenance.model`` of model records: the model's name and fingerprint
            (``model.pt@1a2b3c4d5e6f``), never a local path.
        threads: torch intra-op threads while a chunk runs (1: reproducible, one core per worker).
        logp_mode: a server backend's log-prob mode, probed once at the job's start (its rollout kit's
            ``probe``, :func:`~agentrl.jobs.servers.server_run_spec`); '' for other engines. The servers are
            ``options.server`` (a local server's URL is set there once it runs).
    """
    options: RolloutOptions = field(default_factory=RolloutOptions)
    model_id: str = ''
    threads: int = 1
    logp_mode: str = ''

    @property
    def sampling(self):
        """The model policy's :class:`~agentrl.record.SamplingSpec` (either engine)."""
        return self.options.sampling_spec()


@contextlib.contextmanager
def _threads(n: int):
    import torch
    before = torch.get_num_threads()
    if n > 0:
        torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


class EpisodeRunner:
    """Runs chunks of episodes in one process (a Ray actor, or the driver with ``workers=0``).

    A server backend's servers are ``spec.options.server`` (connected at its first model chunk)
    and its log-prob mode ``spec.logp_mode``; the tokenizer and template come from ``options.model``.

    Args:
        spec: the :class:`RunSpec`.
        weights: ``{'config': TinyAgent.config(), 'state_dict': ...}`` of the TinyAgent policy,
            or None (no TinyAgent episodes; the ``hf`` engine loads ``spec.options.model`` instead,
            once, at its first model chunk).

    Raises:
        ValueError: :meth:`run` gets a model episode but the runner has no model, or an
            unknown task or policy. Fix: plan with :func:`~agentrl.jobs.plan.plan_episodes`.
    """

    def __init__(self, spec: RunSpec, weights: dict | None = None):
        from .. import gym
        self.spec = spec
        self.tasks = {t.name: t for t in gym.make_tasks('all')}
        self.tok = gym.bugfix_tokenizer()
        self.model = None
        self._hf = None
        self._servers = None
        self.profiles: list = []            # the hf engine's time split per chunk (options.profile)
        self.images: dict = {}              # digest -> PNG bytes of the screenshots since the last take_images
        if weights is not None:
            from ..model import TinyAgent
            self.model = TinyAgent(**weights['config'])
            self.model.load_state_dict(weights['state_dict'])
            self.model.eval()

    def _env(self):
        from .. import gym
        return gym.BugFixEnv(max_turns=self.spec.options.max_turns, reward_tests=self.spec.options.reward_tests)

    def _task(self, name: str):
        try:
            return self.tasks[name]
        except KeyError:
            raise ValueError(f'EpisodeRunner: unknown task {name!r}; plan with task names of '
                             'agentrl.gym.make_tasks') from None

    def _hf_model(self):
        """The ``hf`` engine's (model, template, image processor), loaded once per runner; the image processor
        only with ``--screenshots`` (else None)."""
        if self._hf is None:
            import torch

            from ..engines.hf import load_model
            from ..gym import TOOL_SCHEMAS
            from ..templates import ChatTemplate
            device = 'cuda' if torch.cuda.is_available() else 'cpu'
            model, tok = load_model(self.spec.options.model, device=device)
            proc = None
            if self.spec.options.screenshots:
                from ..engines.hf.vlm import load_image_processor
                proc = load_image_processor(self.spec.options.model)
            self._hf = (model, ChatTemplate(tok, tools=TOOL_SCHEMAS), proc)
        return self._hf

    def take_images(self) -> dict:
        """``digest -> PNG bytes`` of the screenshots the records run since the last call named (``--screenshots``;
        empty otherwise), handed over once: the writer stores them with those records."""
        out, self.images = self.images, {}
        return out

    def _server_endpoints(self):
        """A server backend's (endpoints, template): ``options.server`` connected by its rollout kit,
        ``--model``'s tokenizer; once."""
        if self._servers is None:
            from .bugfix import bugfix_template
            kit = rollout_kit(self.spec.options.engine)
            self._servers = (kit.connect(self.spec.options.server), bugfix_template(self.spec.options.model))
        return self._servers

    def run(self, jobs: Sequence[EpisodeJob]) -> list:
        """Run one chunk and return its records, in chunk order, with their identities set.

        TinyAgent episodes run together through ``rollout_batch`` (each with its own generator
        seeded by ``job.seed``); ``hf`` episodes together through
        :func:`~agentrl.jobs.bugfix.bugfix_rollouts` (seeds ``job.seed``); scripted ones one by
        one, each policy object seeded by ``job.seed``.

        Args:
            jobs: the chunk (all of one policy).

        Returns:
            list of :class:`~agentrl.record.Trajectory` with ``provenance.group_id``,
            ``rollout_id``, ``attempt`` and ``seed`` from the jobs.

        Raises:
            ValueError: see the class.
            EngineDied: a server stopped answering; ``err.finished`` maps chunk position ->
                record (identities set) of every episode of the chunk that had ended.
        """
        jobs = list(jobs)
        if not jobs:
            return []
        policies = {j.policy for j in jobs}
        if len(policies) != 1:
            raise ValueError(f'EpisodeRunner.run: one policy per chunk, got {sorted(policies)}; '
                             'cut chunks with plan_chunks')
        try:
            with _threads(self.spec.threads):
                recs = self._run(jobs[0].policy, jobs)
        except EngineDied as err:                 # the episodes that ended are kept: give them their identities
            for i, rec in getattr(err, 'finished', {}).items():
                self._identify(rec, jobs[i])
            raise
        for rec, job in zip(recs, jobs):
            self._identify(rec, job)
        return recs

    def _identify(self, rec, job: EpisodeJob) -> None:
        p = rec.provenance
        p.group_id, p.rollout_id, p.attempt, p.seed = job.group_id, job.rollout_id, job.attempt, job.seed
        if job.policy == 'model':
            p.model = self.spec.model_id
            if p.policy_version is None and '@' in self.spec.model_id:   # the weights that sampled every turn
                p.policy_version = self.spec.model_id.rsplit('@', 1)[1]

    def _sampling(self, template):
        """The model policy's spec with the grammar of ``--tool-choice`` / ``--response-format`` (docs/grammar.md)."""
        c = self.spec.options.constraint(template.stop_ids)
        return self.spec.sampling if c is None else dataclasses.replace(self.spec.sampling, constraint=c)

    def _run(self, policy: str, jobs: list) -> list:
        import torch

        from .. import gym, rollouts
        opts = self.spec.options
        tasks = [self._task(j.task) for j in jobs]
        kw = dict(max_turns=opts.max_turns)
        if policy != 'model':
            return [rollouts.scripted_rollout(gym.scripted_policy(policy, seed=j.seed), self._env(), t,
                                              self.tok, **kw) for j, t in zip(jobs, tasks)]
        b = backend(opts.engine)
        if b.chat:
            from .bugfix import BugFixOptions, bugfix_rollouts, bugfix_server_rollouts
            seeds = [j.seed for j in jobs]
            if b.servers:
                endpoints, template = self._server_endpoints()
                o = BugFixOptions(spec=self._sampling(template), max_new_tokens=opts.max_new_tokens,
                                  reward_tests=opts.reward_tests, model_name=self.spec.model_id,
                                  logp_mode=self.spec.logp_mode or None, screenshots=opts.screenshots, **kw)
                return bugfix_server_rollouts(opts.engine, endpoints, template, tasks, o, seeds=seeds,
                                              images=self.images)
            model, template, proc = self._hf_model()
            prof = {} if opts.profile else None
            o = BugFixOptions(spec=self._sampling(template), max_new_tokens=opts.max_new_tokens,
                              reward_tests=opts.reward_tests, batch_size=len(jobs), model_name=self.spec.model_id,
                              screenshots=opts.screenshots, **kw)
            recs = bugfix_rollouts(model, template.tokenizer, tasks, o, seeds=seeds, template=template, profile=prof,
                                   image_processor=proc, images=self.images)
            if prof:
                self.profiles.append(prof)
            return recs
        if self.model is None:
            raise ValueError('EpisodeRunner.run: a model episode but no weights; pass the weights '
                             'of the model policy')
        gens = [torch.Generator().manual_seed(j.seed) for j in jobs]
        kw['spec'] = self.spec.sampling
        if opts.batch:
            options = rollouts.RolloutBatchOptions(max_turns=opts.max_turns, spec=self.spec.sampling)
            return rollouts.rollout_batch(self.model, [self._env() for _ in jobs], tasks, self.tok,
                                          generators=gens, options=options)
        return [rollouts.rollout(self.model, self._env(), t, self.tok, generator=g, **kw)
                for t, g in zip(tasks, gens)]


@dataclass(frozen=True)
class RunnerFactory:
    """A picklable recipe for an :class:`EpisodeRunner` (what the actor pool builds in each actor).

    Attributes:
        spec: the :class:`RunSpec`. weights: the TinyAgent weights or None.
    """
    spec: RunSpec
    weights: dict | None = None

    def __call__(self) -> EpisodeRunner:
        return EpisodeRunner(self.spec, self.weights)


# ----------------------------------------------------------------------------- every chunk of a plan

@dataclass
class RunReport:
    """The outcome of :func:`run_chunks`.

    Attributes:
        directory: the shard folder. planned: episodes in the plan. skipped: episodes a resume
        found stored. written: records written by this run. resends: resends skipped.
        retried: new identities of re-run episodes. workers: the Ray actors
        (:class:`~agentrl.engines.ray.WorkerInfo`; empty in process). seconds: wall time.
        startup_seconds: Ray start/connect plus actor start (or the runner's set-up).
        ray_version: Ray's version ('' in process). address: cluster address ('' in process,
        'local' for a local instance). stopped: True when ``should_stop`` ended the run early.
        profiles: the hf engine's time split of each chunk (in process, with ``RunSpec.profile``).
    """
    directory: str
    planned: int
    skipped: int
    written: int
    resends: int
    retried: list
    workers: list
    seconds: float
    startup_seconds: float
    ray_version: str = ''
    address: str = ''
    stopped: bool = False
    profiles: list = field(default_factory=list)


def run_chunks(jobs: Sequence[EpisodeJob], directory: str | os.PathLike, spec: RunSpec,
               weights: dict | None = None, *, workers: int = 1, address: str | None = None,
               chunk_size: int = 32, resume: bool = False, progress: bool = True,
               on_chunk: Callable | None = None, on_records: Callable | None = None,
               should_stop: Callable[[], bool] | None = None, **pool) -> RunReport:
    """Run planned episodes (in this process or on Ray actors) and stream their records into shards.

    Args:
        jobs: the plan (:func:`~agentrl.jobs.plan.plan_episodes`), attempt 1 each.
        directory: the shard folder (a :class:`~agentrl.store.ShardWriter` folder; created).
        spec: the :class:`~agentrl.jobs.runner.RunSpec`.
        weights: ``{'config', 'state_dict'}`` of the TinyAgent (None: no TinyAgent episodes).
        workers: Ray actors (>= 1), or 0 to run in this process (same chunks, same records).
        address: see :func:`agentrl.engines.ray.run`.
        chunk_size: episodes per chunk (one batch and one shard each).
        resume: skip the episodes the folder already holds (any attempt); the others run as
            attempt 1. Without ``resume`` the folder must hold none of the planned episodes.
        progress: show a rich progress bar on stderr.
        on_chunk: called with the :class:`~agentrl.engines.ray.PoolState` after each written chunk.
        on_records: called with ``(chunk, records)`` after each written chunk (summaries).
        should_stop: polled after each written chunk; True ends the run there (``stopped``).
        **pool: more options of :func:`agentrl.engines.ray.run` (``cpus_per_worker``,
            ``max_replacements``, ``actor_start_timeout``, ``object_store_mb``, ...).

    Returns:
        :class:`RunReport`.

    Raises:
        ValueError: ``workers < 0``; ``workers > 0`` with ``--screenshots``; without ``resume`` a folder that
            already holds planned
            episodes (fix: ``--resume DIR``, or a new ``--out``).
        ImportError, ConnectionError, TimeoutError, RuntimeError: from the Ray pool.
        EngineDied: a server stopped answering (in process): the chunk's finished episodes
            are written as a shard first; ``err.stored`` counts the episodes stored.
    """
    from .. import store
    if workers < 0:
        raise ValueError(f'run_chunks: workers must be >= 0, got {workers}')
    if workers and spec.options.screenshots:
        raise ValueError('--screenshots stores the images from this process (Ray actors do not send them back); '
                         'drop --workers')
    t_start = time.perf_counter()
    directory = Path(directory)
    stored = store.stored_identities(directory)
    planned = {j.key for j in jobs}
    already = planned & set(stored)
    if already and not resume:
        raise ValueError(f'{str(directory)!r} already holds {len(already)} of the {len(planned)} planned episodes; '
                         'pass --resume to run only the missing ones, or choose a new --out')
    chunks = [c for c in ([j for j in chunk if j.key not in already] for chunk in plan_chunks(jobs, chunk_size)) if c]
    state = ray_pool.PoolState(done=len(already), total=len(planned))
    writer = store.ShardWriter(directory)
    bar = _progress(progress, state.total, state.done, f'ray x{workers}' if workers else 'in-process')

    def sink(chunk, recs, images=None):
        # --screenshots: RUN/images before the shard naming them (ShardWriter.write stores them first)
        path = writer.write(recs, images=images) if images else writer.write(recs)
        if on_records is not None:
            on_records(chunk, recs)
        if bar is not None:
            bar.update(bar.task_ids[0], completed=state.done + len(recs))
        return path

    with bar if bar is not None else contextlib.nullcontext():
        if workers == 0:
            runner = RunnerFactory(spec, weights)()
            startup = time.perf_counter() - t_start
            stopped = False
            for n, chunk in enumerate(chunks):
                try:
                    recs = runner.run(chunk)
                except EngineDied as err:         # keep the chunk's finished episodes, then stop with the one line
                    finished = getattr(err, 'finished', {})
                    kept = [finished[i] for i in sorted(finished)]
                    if kept:
                        sink(chunk, kept, runner.take_images())
                    err.stored = state.done + len(kept)
                    raise
                path = sink(chunk, recs, runner.take_images())
                if path is not None:
                    state.shards.append(str(path))
                state.done += len(chunk)
                if on_chunk is not None:
                    on_chunk(state)
                if should_stop is not None and should_stop() and n + 1 < len(chunks):
                    stopped = True
                    break
            return RunReport(str(directory), len(planned), len(already), writer.n_written, writer.n_resent,
                             [], [], time.perf_counter() - t_start, startup, stopped=stopped,
                             profiles=runner.profiles)
        rep = ray_pool.run(chunks, RunnerFactory(spec, weights), sink, workers=workers, address=address,
                           state=state, should_stop=should_stop, on_chunk=on_chunk, **pool)
    return RunReport(str(directory), len(planned), len(already), writer.n_written, writer.n_resent,
                     list(rep.retried), list(rep.workers), time.perf_counter() - t_start, rep.startup_seconds,
                     ray_version=rep.ray_version, address=rep.address, stopped=rep.stopped)


def _progress(show: bool, total: int, done: int, label: str):
    if not show:
        return None
    from rich.console import Console
    from rich.progress import (BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn,
                               TimeRemainingColumn)
    p = Progress(TextColumn('{task.description}'), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                 TimeRemainingColumn(), console=Console(stderr=True), transient=True)
    p.add_task(label, total=total, completed=done)
    return p
