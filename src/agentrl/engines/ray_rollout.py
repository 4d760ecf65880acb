"""L4: scale rollouts out on Ray, with the same records at any scale, fault tolerance and resume.

``agentrl rollout --workers N [--address auto|HOST:PORT] [--resume DIR]`` lands here. The run is
planned once, on the driver, as a list of episodes (policy, task, repeat) with the identities of
the single-process job (``group_id = '{seed}/{policy}/{task}'``, ``rollout_id = group_id +
'/{repeat}'``), and cut into fixed **chunks** of ``chunk_size`` consecutive episodes of one
policy. Ray actors (one model copy each; the weights are put in the object store once) run
whole chunks with :func:`agentrl.rollouts.rollout_batch`; the driver streams each finished chunk
into a :class:`~agentrl.store.ShardWriter` folder (one shard per chunk) as it arrives.

Same results at any scale: every episode samples from its own ``torch.Generator`` seeded with
:func:`episode_seed` (run seed, group, rollout), stored in ``provenance.seed``; and a chunk's
composition never depends on the number of workers, so ``--workers 1`` and ``--workers 4``
produce the same records, id for id and log-prob for log-prob (bit for bit on one machine type).

Faults: when an actor dies (its process is killed, its node is lost), every chunk it had in
flight runs again on another actor as a **new attempt** (``attempt + 1``, a new record identity:
:func:`agentrl.checks.new_attempt`); the chunks it finished were already written, so nothing is
lost or stored twice. A dead actor is replaced (up to ``max_replacements`` times). A driver
killed mid-run leaves complete shards only; ``--resume DIR`` reads them and runs only the
episodes that have no record yet (same seeds, same chunks, so the finished store equals an
uninterrupted run's).

Ray is an extra (``pip install 'agentrl[ray]'``) imported only when a run starts.

Networking: without ``--address`` the job starts a local instance bound to 127.0.0.1 only (no
dashboard) and stops it at the end. Ray normally rewrites ``127.0.0.1``/``localhost`` to the
machine's routable IP; for a local instance or a loopback ``--address`` this module keeps the
loopback address (it sets ``ray._private.ray_constants.ENABLE_RAY_CLUSTER = False`` in the driver,
which only changes how localhost is resolved). Ray 2.5x turns on token authentication for the
local clusters it starts (and writes ``~/.ray/auth_token``); set ``RAY_AUTH_MODE`` and
``RAY_AUTH_TOKEN`` to choose otherwise. Every node of a cluster needs agentrl and torch installed.

Source: issue 9 (scale out on Ray); issue 4 (record integrity: retries, resends, shards).
"""
from __future__ import annotations

import json
import logging
import os
import time
from collections import deque
from contextlib import nullcontext
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Callable, Sequence

from ..sampling import episode_seed

__all__ = ['RAY_EXTRA', 'MANIFEST', 'TRAJECTORY_DIR', 'EpisodeJob', 'RunSpec', 'WorkerInfo', 'RunState',
           'RunReport', 'require_ray', 'episode_seed', 'plan_episodes', 'plan_chunks', 'stored_rollouts',
           'EpisodeRunner', 'run_chunks', 'rollout_job']

#: The pip extra that installs Ray for this engine.
RAY_EXTRA = 'agentrl[ray]'
#: File in the run folder that records the plan, so ``--resume`` can refuse a different one.
MANIFEST = 'run.json'
#: Folder of shards inside the run folder.
TRAJECTORY_DIR = 'trajectories'
_LOOPBACK = ('localhost', '::1')
log = logging.getLogger(__name__)


def require_ray():
    """Import and return the ``ray`` module.

    Returns:
        The ``ray`` module.

    Raises:
        ImportError: Ray is not installed. Fix: ``pip install 'agentrl[ray]'``.
    """
    try:
        import ray
    except ImportError as e:
        raise ImportError(f"the Ray engine needs Ray, which is not installed ({e}); install the extra: "
                          f"pip install '{RAY_EXTRA}'") from None
    return ray


# ----------------------------------------------------------------------------- the plan

@dataclass(frozen=True)
class EpisodeJob:
    """One episode to run: what to run and the identity its record gets.

    Attributes:
        policy: ``'model'`` or a scripted kind (``'oracle'``, ``'blind'``, ``'random'``, ``'hacker'``).
        task: task name (``Task.name`` of the BugFix gym).
        repeat: repeat index within (policy, task).
        group_id, rollout_id, attempt: the record's identity.
        seed: :func:`episode_seed` of the episode (its own sampling seed).
    """
    policy: str
    task: str
    repeat: int
    group_id: str
    rollout_id: str
    seed: int
    attempt: int = 1

    @property
    def key(self) -> tuple[str, str]:
        """``(group_id, rollout_id)``: the episode, whatever its attempt."""
        return (self.group_id, self.rollout_id)


def plan_episodes(policies: Sequence[str], tasks: Sequence[str], repeats: int, seed: int) -> list[EpisodeJob]:
    """Every episode of a run, in the order of ``agentrl rollout`` (policy, task, repeat).

    Args:
        policies: policy names. tasks: task names. repeats: episodes per (policy, task), >= 1.
        seed: the run seed.

    Returns:
        list of :class:`EpisodeJob` (attempt 1), ``len(policies) * len(tasks) * repeats`` long.

    Raises:
        ValueError: ``repeats < 1``, or a repeated policy or task name (identities would
            collide). Fix: pass each once.
    """
    if repeats < 1:
        raise ValueError(f'plan_episodes: repeats must be >= 1, got {repeats}')
    for what, names in (('policy', policies), ('task', tasks)):
        if len(set(names)) != len(names):
            raise ValueError(f'plan_episodes: a {what} is listed twice in {list(names)}; list each once')
    jobs = []
    for policy in policies:
        for task in tasks:
            group = f'{seed}/{policy}/{task}'
            for r in range(repeats):
                rid = f'{group}/{r}'
                jobs.append(EpisodeJob(policy, task, r, group, rid, episode_seed(seed, group, rid)))
    return jobs


def plan_chunks(jobs: Sequence[EpisodeJob], chunk_size: int) -> list[list[EpisodeJob]]:
    """Cut the plan into chunks of at most ``chunk_size`` consecutive episodes of one policy.

    The cut depends only on the plan and ``chunk_size``, never on the number of workers, so a
    chunk is batched the same way wherever it runs (the records are then equal bit for bit).

    Args:
        jobs: the plan (:func:`plan_episodes`). chunk_size: episodes per chunk, >= 1.

    Returns:
        list of chunks (lists of :class:`EpisodeJob`), in plan order.

    Raises:
        ValueError: ``chunk_size < 1``.
    """
    if chunk_size < 1:
        raise ValueError(f'plan_chunks: chunk_size must be >= 1, got {chunk_size}')
    chunks: list[list[EpisodeJob]] = []
    for job in jobs:
        if chunks and chunks[-1][0].policy == job.policy and len(chunks[-1]) < chunk_size:
            chunks[-1].append(job)
        else:
            chunks.append([job])
    return chunks


def stored_rollouts(directory: str | os.PathLike) -> dict[tuple[str, str], int]:
    """The episodes a shard folder already holds: ``(group_id, rollout_id) -> highest attempt``.

    Reads only the identity columns. Hidden temporary files (shards a killed writer did not
    finish) are not read.

    Args:
        directory: a :class:`~agentrl.store.ShardWriter` folder; a missing folder holds nothing.

    Returns:
        dict, empty for a missing or empty folder.

    Raises:
        ValueError: a file in the folder is not an agentrl trajectory file.
    """
    import pyarrow.parquet as pq

    from .. import store
    if not Path(directory).is_dir():
        return {}
    out: dict[tuple[str, str], int] = {}
    for f in store.data_files(directory):
        pf = pq.ParquetFile(f)
        store._check_schema(pf.schema_arrow, f)
        t = pf.read(columns=['group_id', 'rollout_id', 'attempt']).to_pydict()
        for g, r, a in zip(t['group_id'], t['rollout_id'], t['attempt']):
            key = (g or '', r or '')
            out[key] = max(out.get(key, 0), int(a or 0))
    return out


# ----------------------------------------------------------------------------- the worker side

@dataclass(frozen=True)
class RunSpec:
    """What every worker needs besides the weights (small; sent with each actor).

    Attributes:
        temperature: sampling temperature of the model policy.
        max_turns: turn budget per episode.
        reward_tests: ``'hidden'`` or ``'public'``.
        model_id: ``provenance.model`` of model records (checkpoint path).
        threads: torch intra-op threads per worker (1: one core per worker, reproducible).
    """
    temperature: float = 1.0
    max_turns: int = 6
    reward_tests: str = 'hidden'
    model_id: str = ''
    threads: int = 1


class EpisodeRunner:
    """Runs chunks of episodes in one process (a Ray actor, or the driver with ``workers=0``).

    Args:
        spec: the :class:`RunSpec`.
        weights: ``{'config': TinyAgent.config(), 'state_dict': ...}`` of the model policy, or
            None when the run has no model episodes.
        set_threads: call ``torch.set_num_threads(spec.threads)`` (actors do; the driver not).

    Raises:
        ValueError: :meth:`run` gets a model episode but the runner has no weights, or an
            unknown task or policy. Fix: plan with :func:`plan_episodes` and pass the weights.
    """

    def __init__(self, spec: RunSpec, weights: dict | None, set_threads: bool = False):
        import torch

        from .. import gym, model as model_mod, tokenizer
        if set_threads:
            torch.set_num_threads(max(1, int(spec.threads)))
        self.spec = spec
        all_tasks = gym.make_tasks('all')
        self.tasks = {t.name: t for t in all_tasks}
        self.tok = tokenizer.build_tokenizer(all_tasks)
        self.model = None
        if weights is not None:
            self.model = model_mod.TinyAgent(**weights['config'])
            self.model.load_state_dict(weights['state_dict'])
            self.model.eval()

    def _env(self):
        from .. import gym
        return gym.BugFixEnv(max_turns=self.spec.max_turns, reward_tests=self.spec.reward_tests)

    def _task(self, name: str):
        try:
            return self.tasks[name]
        except KeyError:
            raise ValueError(f'EpisodeRunner: unknown task {name!r}; plan with task names of '
                             'agentrl.gym.make_tasks') from None

    def run(self, jobs: Sequence[EpisodeJob]) -> list:
        """Run one chunk and return its records, in chunk order, with their identities set.

        Model episodes run together through ``rollout_batch`` (each with its own generator
        seeded by ``job.seed``); scripted ones one by one, each policy object seeded by
        ``job.seed``.

        Args:
            jobs: the chunk (all of one policy).

        Returns:
            list of :class:`~agentrl.record.Trajectory` with ``provenance.group_id``,
            ``rollout_id``, ``attempt`` and ``seed`` from the jobs.

        Raises:
            ValueError: see the class.
        """
        import torch

        from .. import gym, rollouts
        jobs = list(jobs)
        if not jobs:
            return []
        policies = {j.policy for j in jobs}
        if len(policies) != 1:
            raise ValueError(f'EpisodeRunner.run: one policy per chunk, got {sorted(policies)}; '
                             'cut chunks with plan_chunks')
        policy = jobs[0].policy
        tasks = [self._task(j.task) for j in jobs]
        kw = dict(max_turns=self.spec.max_turns)
        if policy == 'model':
            if self.model is None:
                raise ValueError('EpisodeRunner.run: a model episode but no weights; pass the weights '
                                 'of the model policy')
            gens = [torch.Generator().manual_seed(j.seed) for j in jobs]
            recs = rollouts.rollout_batch(self.model, [self._env() for _ in jobs], tasks, self.tok,
                                          temperature=self.spec.temperature, generators=gens, **kw)
        else:
            recs = [rollouts.scripted_rollout(gym.scripted_policy(policy, seed=j.seed), self._env(), t,
                                              self.tok, **kw) for j, t in zip(jobs, tasks)]
        for rec, job in zip(recs, jobs):
            p = rec.provenance
            p.group_id, p.rollout_id, p.attempt, p.seed = job.group_id, job.rollout_id, job.attempt, job.seed
            if policy == 'model':
                p.model = self.spec.model_id
        return recs


_TOKEN_FIELDS = ('ids', 'owner', 'turn', 'action_mask', 'sample_logp')


def _pack(recs) -> dict:
    """Records -> a few flat numpy arrays (what an actor sends back; exact, cheap to serialise).

    Pickling each torch tensor costs about 0.1 ms in Ray; one array per field per chunk does not.
    """
    import numpy as np
    out = {'meta': [(float(t.reward), t.info, None if t.provenance is None else t.provenance.to_dict(),
                     t.turn_contexts) for t in recs]}
    for name in _TOKEN_FIELDS:
        vals = [getattr(t, name) for t in recs]
        if not vals or any(v is None for v in vals):
            out[name] = [None if v is None else v.detach().cpu().numpy() for v in vals]
        else:
            arrs = [v.detach().cpu().numpy() for v in vals]
            out[name] = (np.concatenate(arrs), np.array([len(a) for a in arrs], dtype=np.int64))
    return out


def _unpack(packed: dict) -> list:
    """Inverse of :func:`_pack`: the same records, tensors equal bit for bit."""
    import numpy as np
    import torch

    from ..record import Provenance, Trajectory
    n = len(packed['meta'])
    cols = {}
    for name in _TOKEN_FIELDS:
        v = packed[name]
        if isinstance(v, tuple):
            flat = torch.from_numpy(np.array(v[0], copy=True))    # the object store's copy is read-only
            cols[name] = list(torch.split(flat, v[1].tolist()))
        else:
            cols[name] = [None if a is None else torch.from_numpy(np.array(a, copy=True)) for a in v]
    return [Trajectory(ids=cols['ids'][i], action_mask=cols['action_mask'][i], sample_logp=cols['sample_logp'][i],
                       reward=reward, info=info, owner=cols['owner'][i], turn=cols['turn'][i],
                       provenance=Provenance.from_dict(prov), turn_contexts=tc)
            for i, (reward, info, prov, tc) in zip(range(n), packed['meta'])]


class _RayWorker(EpisodeRunner):
    """The Ray actor: an :class:`EpisodeRunner` that also says where it runs."""

    def __init__(self, spec: RunSpec, weights: dict | None):
        super().__init__(spec, weights, set_threads=True)

    def run_packed(self, jobs: Sequence[EpisodeJob]) -> dict:
        """:meth:`EpisodeRunner.run`, packed for the trip back to the driver (:func:`_unpack`)."""
        return _pack(self.run(jobs))

    def where(self) -> dict:
        import socket

        import ray
        return {'pid': os.getpid(), 'host': socket.gethostname(),
                'node_id': ray.get_runtime_context().get_node_id()}


# ----------------------------------------------------------------------------- the driver

@dataclass
class WorkerInfo:
    """One actor of the run.

    Attributes:
        index: slot (replacements get new indices). pid: its process id. host: hostname.
        node_id: Ray node id. alive: False once it died. chunks: chunks it finished.
        lost: keys ``(group_id, rollout_id)`` of the episodes that were lost with it (re-run
        as new attempts).
    """
    index: int
    pid: int | None = None
    host: str = ''
    node_id: str = ''
    alive: bool = True
    chunks: int = 0
    lost: list[tuple[str, str]] = field(default_factory=list)


@dataclass
class RunState:
    """What the driver knows after each written chunk (passed to ``on_chunk``).

    Attributes:
        done: episodes stored (including those a resume found). total: episodes planned.
        workers: :class:`WorkerInfo` of every actor so far (empty in-process).
        inflight: worker index -> keys ``(group_id, rollout_id)`` of the episodes it is running.
        retried: the new identities ``(group_id, rollout_id, attempt)`` given to re-run episodes.
        shards: shard paths written so far.
    """
    done: int = 0
    total: int = 0
    workers: list[WorkerInfo] = field(default_factory=list)
    inflight: dict[int, list[tuple[str, str]]] = field(default_factory=dict)
    retried: list[tuple[str, str, int]] = field(default_factory=list)
    shards: list[str] = field(default_factory=list)


@dataclass
class RunReport:
    """The outcome of :func:`run_chunks`.

    Attributes:
        directory: the shard folder. planned: episodes in the plan. skipped: episodes a resume
        found stored. written: records written by this run. resends: resends skipped.
        retried: new identities of re-run episodes. workers: :class:`WorkerInfo` list.
        seconds: wall time of the run. startup_seconds: Ray start/connect plus actor start.
        ray_version: Ray's version ('' in-process). address: cluster address ('' in-process,
        'local' for a local instance).
    """
    directory: str
    planned: int
    skipped: int
    written: int
    resends: int
    retried: list[tuple[str, str, int]]
    workers: list[WorkerInfo]
    seconds: float
    startup_seconds: float
    ray_version: str = ''
    address: str = ''


def _is_loopback(address: str | None) -> bool:
    if address is None:
        return True
    if address == 'auto':
        return False
    host = address.rsplit(':', 1)[0].strip('[]') if ':' in address else address
    return host in _LOOPBACK or host.startswith('127.')


def _connect(ray, address: str | None, num_cpus: int, object_store_mb: int | None) -> bool:
    """Start a local Ray instance (``address=None``) or join a cluster; return True if we started it.

    Loopback addresses stay loopback: Ray normally rewrites ``127.0.0.1`` to the machine's
    routable IP (and binds its servers there); for a local instance or a cluster on 127.0.0.1 we
    keep every Ray server on the loopback interface.
    """
    if ray.is_initialized():
        return False
    os.environ.setdefault('RAY_USAGE_STATS_ENABLED', '0')
    if _is_loopback(address):
        constants = getattr(getattr(ray, '_private', None), 'ray_constants', None)
        if constants is not None and hasattr(constants, 'ENABLE_RAY_CLUSTER'):
            constants.ENABLE_RAY_CLUSTER = False   # resolve localhost to 127.0.0.1, not the routable IP
    common = dict(logging_level=logging.WARNING, log_to_driver=False, namespace='agentrl')
    try:
        if address is None:
            kw = dict(num_cpus=num_cpus, include_dashboard=False, _node_ip_address='127.0.0.1')
            if object_store_mb:
                kw['object_store_memory'] = int(object_store_mb) << 20
            ray.init(address='local', **kw, **common)   # 'local': never attach to a running cluster
        else:
            ray.init(address=address, **common)
    except ConnectionError as e:
        raise ConnectionError(f'could not join the Ray cluster at --address {address!r} ({e}); start one with '
                              '`ray start --head`, or drop --address to start a local instance') from None
    return True


def _write_chunk(writer, recs, state: RunState, progress) -> None:
    path = writer.write(recs)
    if path is not None:
        state.shards.append(str(path))
    state.done += len(recs)
    if progress is not None:
        progress.update(progress.task_ids[0], completed=state.done)


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


def run_chunks(jobs: Sequence[EpisodeJob], directory: str | os.PathLike, spec: RunSpec,
               weights: dict | None = None, *, workers: int = 1, address: str | None = None,
               chunk_size: int = 32, resume: bool = False, cpus_per_worker: float = 1.0,
               max_replacements: int | None = None, inflight_per_worker: int = 2,
               actor_start_timeout: float = 300.0, object_store_mb: int | None = None,
               progress: bool = True, on_chunk: Callable[[RunState], None] | None = None) -> RunReport:
    """Run the planned episodes on Ray actors and stream their records into a shard folder.

    Args:
        jobs: the plan (:func:`plan_episodes`), attempt 1 each.
        directory: the shard folder (a :class:`~agentrl.store.ShardWriter` folder; created).
        spec: the :class:`RunSpec`.
        weights: ``{'config', 'state_dict'}`` of the TinyAgent (None: no model episodes);
            put in the object store once and loaded once per actor.
        workers: number of Ray actors (>= 1), or 0 to run in this process without Ray (same
            chunks, same records, same streaming).
        address: None starts a local Ray instance on 127.0.0.1 (``num_cpus = workers *
            cpus_per_worker``, no dashboard); ``'auto'`` or ``'HOST:PORT'`` joins a running
            cluster. A Ray already initialised in this process is used as it is.
        chunk_size: episodes per chunk (one ``rollout_batch`` call and one shard each).
        resume: skip the episodes the folder already holds (any attempt); the others run as
            attempt 1. Without ``resume`` the folder must hold none of the planned episodes.
        cpus_per_worker: Ray CPUs reserved per actor.
        max_replacements: how many dead actors may be replaced (None: ``2 * workers``).
        inflight_per_worker: chunks queued on each actor at once (2 keeps it busy while the
            driver writes).
        actor_start_timeout: seconds to wait for the actors to start (they need free CPUs).
        object_store_mb: object store size of a local instance (None: Ray's default).
        progress: show a rich progress bar on stderr.
        on_chunk: called with the :class:`RunState` after each chunk is written (tests use it
            to kill a worker or the driver at a known point).

    Returns:
        :class:`RunReport`.

    Raises:
        ValueError: ``workers < 0``, or without ``resume`` a folder that already holds planned
            episodes (fix: ``--resume DIR`` to finish that run, or a new ``--out``).
        ImportError: Ray is not installed (``workers >= 1``). Fix: ``pip install 'agentrl[ray]'``.
        ConnectionError: no Ray cluster at ``address``. Fix: start one, or drop ``address``.
        TimeoutError: the actors did not start within ``actor_start_timeout`` (too few free
            CPUs in the cluster). Fix: fewer ``workers`` or a bigger cluster.
        RuntimeError: every actor died and no replacement is left. The shards written so far
            stay; fix the cause and finish with ``resume=True``.
        ray.exceptions.RayTaskError: an episode raised inside an actor (a bug; its traceback
            is attached).
    """
    from .. import store
    if workers < 0:
        raise ValueError(f'run_chunks: workers must be >= 0, got {workers}')
    t_start = time.perf_counter()
    directory = Path(directory)
    stored = stored_rollouts(directory)
    planned = {j.key for j in jobs}
    already = planned & set(stored)
    if already and not resume:
        raise ValueError(f'{str(directory)!r} already holds {len(already)} of the {len(planned)} planned episodes; '
                         'pass --resume to run only the missing ones, or choose a new --out')
    queue = deque(c for c in ([j for j in chunk if j.key not in already] for chunk in plan_chunks(jobs, chunk_size))
                  if c)
    state = RunState(done=len(already), total=len(planned))
    writer = store.ShardWriter(directory)
    label = f'ray x{workers}' if workers else 'in-process'
    if workers == 0:
        runner = EpisodeRunner(spec, weights)
        startup = time.perf_counter() - t_start
        bar = _progress(progress, state.total, state.done, label)
        with bar if bar is not None else nullcontext():
            while queue:
                _write_chunk(writer, runner.run(queue.popleft()), state, bar)
                if on_chunk is not None:
                    on_chunk(state)
        return RunReport(str(directory), len(planned), len(already), writer.n_written, writer.n_resent,
                         [], [], time.perf_counter() - t_start, startup)

    ray = require_ray()
    started = _connect(ray, address, max(1, int(round(workers * cpus_per_worker))), object_store_mb)
    actor_cls = ray.remote(_RayWorker)
    replacements = 2 * workers if max_replacements is None else max_replacements
    handles: dict[int, object] = {}
    try:
        weights_ref = ray.put(weights)

        def spawn() -> int:
            i = len(state.workers)
            state.workers.append(WorkerInfo(index=i))
            handles[i] = actor_cls.options(num_cpus=cpus_per_worker, max_restarts=0,
                                           max_task_retries=0).remote(spec, weights_ref)
            return i

        def locate(indices) -> None:
            refs = [handles[i].where.remote() for i in indices]
            try:
                infos = ray.get(refs, timeout=actor_start_timeout)
            except ray.exceptions.GetTimeoutError:
                free = ray.available_resources().get('CPU', 0)
                raise TimeoutError(f'{len(indices)} Ray workers did not start within {actor_start_timeout:.0f} s '
                                   f'(each needs {cpus_per_worker} CPU; the cluster has {free} free); use fewer '
                                   '--workers or add nodes') from None
            for i, info in zip(indices, infos):
                w = state.workers[i]
                w.pid, w.host, w.node_id = info['pid'], info['host'], info['node_id']

        locate([spawn() for _ in range(workers)])
        startup = time.perf_counter() - t_start
        inflight: dict = {}                                 # ref -> (worker index, chunk)
        bar = _progress(progress, state.total, state.done, label)
        with bar if bar is not None else nullcontext():
            while queue or inflight:
                for i, w in enumerate(state.workers):
                    while w.alive and queue and sum(1 for v in inflight.values() if v[0] == i) < inflight_per_worker:
                        chunk = queue.popleft()
                        inflight[handles[i].run_packed.remote(chunk)] = (i, chunk)
                _track(state, inflight)
                if not inflight:
                    raise RuntimeError(f'every Ray worker died and no replacement is left ({len(queue)} chunks '
                                       f'not run); {state.done} of {state.total} episodes are stored in '
                                       f'{str(directory)!r}: fix the cause and finish with --resume')
                [ref], _ = ray.wait(list(inflight), num_returns=1)
                i, chunk = inflight.pop(ref)
                try:
                    recs = _unpack(ray.get(ref))
                except (ray.exceptions.RayActorError, ray.exceptions.WorkerCrashedError,
                        ray.exceptions.ObjectLostError) as e:
                    retry = [replace(j, attempt=j.attempt + 1) for j in chunk]   # checks.new_attempt's rule
                    state.retried.extend((j.group_id, j.rollout_id, j.attempt) for j in retry)
                    state.workers[i].lost.extend(j.key for j in chunk)
                    queue.appendleft(retry)
                    if state.workers[i].alive:
                        state.workers[i].alive = False
                        log.warning('Ray worker %d (pid %s) died: %s; re-running its chunks as new attempts',
                                    i, state.workers[i].pid, type(e).__name__)
                        ray.kill(handles[i], no_restart=True)
                        if replacements > 0:
                            replacements -= 1
                            k = spawn()
                            try:
                                locate([k])
                            except TimeoutError as err:   # no room for it: go on with the survivors
                                log.warning('replacement Ray worker did not start: %s', err)
                                state.workers[k].alive = False
                                ray.kill(handles[k], no_restart=True)
                    continue
                state.workers[i].chunks += 1
                _write_chunk(writer, recs, state, bar)
                if on_chunk is not None:
                    _track(state, inflight)
                    on_chunk(state)
    finally:
        for h in handles.values():
            try:
                ray.kill(h, no_restart=True)
            except Exception:       # already dead, or Ray going down
                pass
        if started:
            ray.shutdown()
    return RunReport(str(directory), len(planned), len(already), writer.n_written, writer.n_resent,
                     list(state.retried), list(state.workers), time.perf_counter() - t_start, startup,
                     ray_version=getattr(ray, '__version__', ''), address=address or 'local')


def _track(state: RunState, inflight: dict) -> None:
    state.inflight = {}
    for i, chunk in inflight.values():
        state.inflight.setdefault(i, []).extend(j.key for j in chunk)


# ----------------------------------------------------------------------------- agentrl rollout

#: RolloutOptions fields that define the plan; a resumed run must keep them.
_PLAN_FIELDS = ('policy', 'split', 'repeats', 'seed', 'checkpoint', 'temperature', 'max_turns', 'reward_tests')


def _write_json(path: Path, obj) -> None:
    tmp = path.with_name(f'.{path.name}.tmp-{os.getpid()}')
    tmp.write_text(json.dumps(obj, indent=2))
    os.replace(tmp, path)


def _plan_of(opts) -> dict:
    return {k: getattr(opts, k) for k in _PLAN_FIELDS}


def _resume_options(opts):
    """Read DIR/run.json and return the options to resume with (plan from the manifest)."""
    run_dir = Path(opts.resume)
    if run_dir.name == TRAJECTORY_DIR and not (run_dir / MANIFEST).exists():
        run_dir = run_dir.parent
    manifest_path = run_dir / MANIFEST
    if not manifest_path.exists():
        raise ValueError(f'--resume {opts.resume!r}: no {MANIFEST} there; pass the --out folder of a run started '
                         'with --workers')
    manifest = json.loads(manifest_path.read_text())
    default = type(opts)()
    clash = [k for k in _PLAN_FIELDS if getattr(opts, k) != manifest['plan'][k] and getattr(opts, k) != getattr(default, k)]
    if clash:
        k = clash[0]
        raise ValueError(f'--resume {opts.resume!r}: the run was planned with {k}={manifest["plan"][k]!r}, this command '
                         f'says {getattr(opts, k)!r}; drop the flag (resume keeps the plan) or start a new --out')
    return replace(opts, out=str(run_dir), **manifest['plan']), manifest


def rollout_job(opts, *, on_chunk: Callable[[RunState], None] | None = None, progress: bool = True) -> dict:
    """The ``agentrl rollout --workers N / --resume DIR`` job: plan, run, store, summarise.

    Writes ``OUT/run.json`` (the plan), ``OUT/trajectories/`` (shards, one per chunk),
    ``OUT/model.pt`` (the untrained TinyAgent when no checkpoint is given) and
    ``OUT/summary.json``.

    Args:
        opts: a :class:`agentrl.cli.rollout.RolloutOptions` (``workers``, ``address``,
            ``resume``, ``chunk_size`` and the plan fields are read).
        on_chunk: see :func:`run_chunks`.
        progress: show the progress bar.

    Returns:
        The summary dict (also written to ``OUT/summary.json``), with an ``engine`` entry:
        workers, address, Ray version, retried identities, episodes skipped by a resume.

    Raises:
        ValueError: ``--resume`` of a folder without ``run.json``, or with a different plan;
            a new run into a folder that already holds its episodes. Each names the fix.
        See :func:`run_chunks` for Ray errors.
    """
    import torch

    from .. import gym, model as model_mod, store, tokenizer
    from ..stats import policy_summary
    manifest = None
    if opts.resume:
        opts, manifest = _resume_options(opts)
    if opts.workers > 0:
        require_ray()            # before anything is written into OUT
    out = Path(opts.out)
    out.mkdir(parents=True, exist_ok=True)
    chunk_size = int(manifest['chunk_size']) if manifest else int(getattr(opts, 'chunk_size', 32) or 32)
    tasks = gym.make_tasks(opts.split)
    tok = tokenizer.build_tokenizer(gym.make_tasks('all'))
    weights, model_id = None, ''
    if 'model' in opts.policy:
        if opts.checkpoint:
            net = model_mod.load_checkpoint(opts.checkpoint)
            model_id = os.path.abspath(opts.checkpoint)
        else:
            model_id = os.path.abspath(out / 'model.pt')
            if manifest and os.path.exists(model_id):
                net = model_mod.load_checkpoint(model_id)
            else:
                torch.manual_seed(opts.seed)
                net = model_mod.TinyAgent(tok.vocab_size).eval()
                model_mod.save_checkpoint(net, model_id)   # so `agentrl check --model` can replay the records
        weights = {'config': net.config(), 'state_dict': net.state_dict()}   # detached; loaded by copy
    jobs = plan_episodes(opts.policy, [t.name for t in tasks], opts.repeats, opts.seed)
    if manifest is None and (out / TRAJECTORY_DIR).is_dir() and store.data_files(out / TRAJECTORY_DIR):
        raise ValueError(f'{str(out / TRAJECTORY_DIR)!r} already holds records; pass --resume {str(out)} to finish '
                         'that run, or choose a new --out')
    if manifest is None:
        _write_json(out / MANIFEST, {'plan': _plan_of(opts), 'chunk_size': chunk_size, 'episodes': len(jobs),
                                     'agentrl_seed_rule': 'blake2b(run seed, group_id, rollout_id)'})
    spec = RunSpec(temperature=opts.temperature, max_turns=opts.max_turns, reward_tests=opts.reward_tests,
                   model_id=model_id)
    t0 = time.time()
    report = run_chunks(jobs, out / TRAJECTORY_DIR, spec, weights, workers=opts.workers, address=opts.address,
                        chunk_size=chunk_size, resume=bool(manifest), progress=progress, on_chunk=on_chunk)
    records = store.read_trajectories(out / TRAJECTORY_DIR)
    order = {j.key: n for n, j in enumerate(jobs)}
    records.sort(key=lambda t: (order.get((t.provenance.group_id, t.provenance.rollout_id), len(order)),
                                t.provenance.attempt))
    policy_of = {j.key: j.policy for j in jobs}
    per_policy = {}
    for policy in opts.policy:
        trajs = [t for t in records if policy_of.get((t.provenance.group_id, t.provenance.rollout_id)) == policy]
        if trajs:
            per_policy[policy] = policy_summary(trajs, unk_id=tok.unk_id)
    summary = {'options': asdict(opts), 'tasks': len(tasks), 'episodes': len(records),
               'seconds': round(time.time() - t0, 3), 'trajectories': str(out / TRAJECTORY_DIR),
               'tokenizer': tok.fingerprint(), 'vocab_size': tok.vocab_size, 'policies': per_policy,
               'engine': {'workers': opts.workers, 'address': report.address, 'ray_version': report.ray_version,
                          'chunk_size': chunk_size, 'planned': report.planned, 'skipped_by_resume': report.skipped,
                          'written': report.written, 'retried': [list(r) for r in report.retried],
                          'startup_seconds': round(report.startup_seconds, 3),
                          'workers_started': len(report.workers),
                          'nodes': len({w.node_id for w in report.workers if w.chunks}),
                          'workers_died': sum(not w.alive for w in report.workers)}}
    _write_json(out / 'summary.json', summary)
    return summary
