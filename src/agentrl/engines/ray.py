"""L4: a pool of Ray actors that runs chunks of episodes and hands each finished chunk to a sink.

:func:`run` knows nothing of options, plans or files: it gets the chunks (lists of items with
``group_id``, ``rollout_id`` and ``attempt``), a picklable ``runner_factory`` (called once in
each actor; the result's ``run(chunk)`` returns the chunk's records) and a ``sink(chunk,
records)`` called on the driver, in completion order, for every finished chunk.

Faults: when an actor dies (its process is killed, its node is lost), every chunk it had in
flight runs again on another actor as a new attempt (:func:`agentrl.checks.new_attempt`;
docs/design.md#scale-out, docs/design.md#seeds); the chunks it finished were already given to the
sink, so nothing is lost or stored twice. A dead actor is replaced (up to ``max_replacements``).

Ray is an extra (``pip install 'agentrl[ray]'``), imported only when a run starts.

Networking: without ``address`` the pool starts a local instance bound to 127.0.0.1 only (no
dashboard) and stops it at the end. Ray normally rewrites ``127.0.0.1``/``localhost`` to the
machine's routable IP; for a local instance or a loopback ``address`` this module keeps the
loopback address (it sets ``ray._private.ray_constants.ENABLE_RAY_CLUSTER = False`` in the driver,
which only changes how localhost is resolved). Ray 2.5x turns on token authentication for the
local clusters it starts (and writes ``~/.ray/auth_token``); set ``RAY_AUTH_MODE`` and
``RAY_AUTH_TOKEN`` to choose otherwise. Every node of a cluster needs agentrl and torch installed.

Priority: Ray starts its worker processes at nice 15, so on a busy machine any normal-priority
process starves them (actors that take minutes to start, or die while starting). The actors do
the run's work, so a local instance started here runs them at nice 0 (``RAY_worker_niceness=0``
unless set); a cluster keeps what its ``ray start`` was given (start it with
``RAY_worker_niceness=0`` in the environment for the same). An actor that dies while starting is
replaced like one that dies mid-run.
"""
from __future__ import annotations

import logging
import os
import socket
import time
from collections import deque
from dataclasses import dataclass, field, replace
from typing import Callable, Sequence

from ..record import Provenance, Trajectory

__all__ = ['RAY_EXTRA', 'require_ray', 'check_address', 'WorkerInfo', 'PoolState', 'PoolReport', 'run', 'pack', 'unpack']

#: The pip extra that installs Ray.
RAY_EXTRA = 'agentrl[ray]'
_LOOPBACK = ('localhost', '::1')
log = logging.getLogger(__name__)


def require_ray():
    """Import and return the ``ray`` module.

    Raises:
        ImportError: Ray is not installed. Fix: ``pip install 'agentrl[ray]'``.
    """
    try:
        import ray
    except ImportError as e:
        raise ImportError(f"the Ray engine needs Ray, which is not installed ({e}); install the extra: "
                          f"pip install '{RAY_EXTRA}'") from None
    return ray


# ----------------------------------------------------------------------------- records over the wire

_TOKEN_FIELDS = ('ids', 'owner', 'turn', 'action_mask', 'sample_logp')


def pack(recs) -> dict:
    """Records -> a few flat numpy arrays (what an actor sends back; exact, cheap to serialise).

    Pickling each torch tensor costs about 0.1 ms in Ray; one array per field per chunk does not.

    Args:
        recs: list of :class:`~agentrl.record.Trajectory`.

    Returns:
        dict: ``meta`` (reward, info, provenance dict, turn contexts per record) and, per token
        field, ``(values, lengths)`` (or a list with None entries when a record lacks the field).
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


def unpack(packed: dict) -> list:
    """Inverse of :func:`pack`: the same records, tensors equal bit for bit."""
    import numpy as np
    import torch

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
                       provenance=None if prov is None else Provenance.from_dict(prov), turn_contexts=tc)
            for i, (reward, info, prov, tc) in zip(range(n), packed['meta'])]


class _Actor:
    """The Ray actor: builds its runner once (``runner_factory()``) and runs chunks with it."""

    def __init__(self, runner_factory):
        self.runner = runner_factory()

    def run_packed(self, chunk) -> dict:
        return pack(self.runner.run(chunk))

    def where(self) -> dict:
        import socket

        import ray
        return {'pid': os.getpid(), 'host': socket.gethostname(),
                'node_id': ray.get_runtime_context().get_node_id()}


# ----------------------------------------------------------------------------- the driver

@dataclass
class WorkerInfo:
    """One actor of the pool.

    Attributes:
        index: slot (replacements get new indices). pid: its process id. host: hostname.
        node_id: Ray node id. alive: False once it died. chunks: chunks it finished.
        lost: keys ``(group_id, rollout_id)`` of the episodes lost with it (re-run as new attempts).
    """
    index: int
    pid: int | None = None
    host: str = ''
    node_id: str = ''
    alive: bool = True
    chunks: int = 0
    lost: list[tuple[str, str]] = field(default_factory=list)


@dataclass
class PoolState:
    """What the driver knows after each finished chunk (passed to ``on_chunk``).

    Attributes:
        done: episodes handed to the sink (plus ``done`` given at the start, e.g. by a resume).
        total: episodes in the run.
        workers: :class:`WorkerInfo` of every actor so far (empty in process).
        inflight: worker index -> keys ``(group_id, rollout_id)`` of the episodes it is running.
        retried: the new identities ``(group_id, rollout_id, attempt)`` given to re-run episodes.
        shards: what the sink returned for each chunk (shard paths), None entries skipped.
    """
    done: int = 0
    total: int = 0
    workers: list[WorkerInfo] = field(default_factory=list)
    inflight: dict[int, list[tuple[str, str]]] = field(default_factory=dict)
    retried: list[tuple[str, str, int]] = field(default_factory=list)
    shards: list[str] = field(default_factory=list)


@dataclass
class PoolReport:
    """The outcome of :func:`run`.

    Attributes:
        retried: new identities of re-run episodes. workers: :class:`WorkerInfo` list.
        startup_seconds: Ray start/connect plus actor start. ray_version: Ray's version.
        address: cluster address (``'local'`` for a local instance). stopped: True when
        ``should_stop`` ended the run before every chunk ran.
    """
    retried: list[tuple[str, str, int]]
    workers: list[WorkerInfo]
    startup_seconds: float
    ray_version: str = ''
    address: str = ''
    stopped: bool = False


def _is_loopback(address: str | None) -> bool:
    if address is None:
        return True
    if address == 'auto':
        return False
    host = address.rsplit(':', 1)[0].strip('[]') if ':' in address else address
    return host in _LOOPBACK or host.startswith('127.')


def _host_port(address: str) -> tuple[str, int]:
    """``(host, port)`` of a Ray address: ``HOST:PORT``, ``[IPv6]:PORT``, ``ray://HOST:PORT`` or a bare host.

    A bare host gets Ray's default port (6379 for the GCS, 10001 for ``ray://`` clients).

    Raises:
        ValueError: the port is not a number in [1, 65535].
    """
    target = address.removeprefix('ray://')
    default = '10001' if target != address else '6379'
    if target.startswith('['):                          # [IPv6] or [IPv6]:PORT
        host, _, rest = target[1:].partition(']')
        port = rest.removeprefix(':') or default
    elif target.count(':') == 1:
        host, port = target.split(':')
    else:                                               # a bare host or a bare IPv6 address
        host, port = target, default
    if not port.isdigit() or not 1 <= int(port) <= 65535:
        raise ValueError(f'--address {address!r}: the port {port!r} is not a number in [1, 65535]; pass HOST:PORT '
                         'of a Ray head (`ray start --head` prints it), or auto')
    return host, int(port)


def check_address(address: str | None, timeout: float = 3.0) -> None:
    """Refuse a Ray cluster ``address`` nothing answers at, within ``timeout`` seconds.

    ``ray.init`` retries an unreachable address for minutes; one TCP connect to the head's
    port fails at once (connection refused) or after ``timeout`` (no route, a firewall). ``None``,
    ``'auto'`` and ``'local'`` are not checked (Ray finds or starts the cluster itself).

    Args:
        address: the ``--address`` given: ``HOST:PORT``, ``[IPv6]:PORT``, ``ray://HOST:PORT``, a
            bare host (Ray's default port), ``auto``, ``local`` or None.
        timeout: seconds to wait for the connection.

    Raises:
        ValueError: the port is not a number in [1, 65535].
        ConnectionError: nothing accepts connections there, e.g. ``--address '127.0.0.1:1': no Ray
            cluster answers there (connection refused); start one with `ray start --head` and pass
            the address it prints, or drop --address to start a local instance``.
    """
    if address is None or address in ('auto', 'local'):
        return
    host, port = _host_port(address)
    try:
        with socket.create_connection((host, port), timeout=timeout):
            pass
    except OSError as e:
        if isinstance(e, ConnectionRefusedError):
            why = 'connection refused'
        elif isinstance(e, socket.timeout):
            why = f'no answer within {timeout:g} s'
        elif isinstance(e, socket.gaierror):
            why = f'cannot resolve the host {host!r}'
        else:
            why = e.strerror or type(e).__name__
        raise ConnectionError(f'--address {address!r}: no Ray cluster answers there ({why}); start one with '
                              '`ray start --head` and pass the address it prints, or drop --address to start a '
                              'local instance') from None


def connect(ray, address: str | None, num_cpus: int, object_store_mb: int | None) -> bool:
    """Start a local Ray instance (``address=None``) or join a cluster; return True if we started it."""
    if ray.is_initialized():
        return False
    os.environ.setdefault('RAY_USAGE_STATS_ENABLED', '0')
    if address is None:                   # the raylet started here reads it: actors at normal priority
        os.environ.setdefault('RAY_worker_niceness', '0')
    if _is_loopback(address):
        constants = getattr(getattr(ray, '_private', None), 'ray_constants', None)
        if constants is not None and hasattr(constants, 'ENABLE_RAY_CLUSTER'):
            constants.ENABLE_RAY_CLUSTER = False   # resolve localhost to 127.0.0.1, not the routable IP
    common = dict(logging_level=logging.WARNING, log_to_driver=False, namespace='agentrl')
    check_address(address)                           # ray.init would retry an unreachable address for minutes
    try:
        if address is None:
            kw = dict(num_cpus=num_cpus, include_dashboard=False, _node_ip_address='127.0.0.1')
            if object_store_mb:
                kw['object_store_memory'] = int(object_store_mb) << 20
            ray.init(address='local', **kw, **common)   # 'local': never attach to a running cluster
        else:
            ray.init(address=address, **common)
    except ConnectionError as e:
        if address in (None, 'auto', 'local'):
            raise ConnectionError(f'could not join the Ray cluster at --address {address!r} ({e}); start one with '
                                  '`ray start --head`, or drop --address to start a local instance') from None
        # something answers there (check_address): a Ray head that refused us, or not a Ray head
        raise ConnectionError(f'could not join the Ray cluster at --address {address!r} ({e}); it answers but '
                              'refused this driver: with token authentication (the default of clusters Ray 2.5x '
                              "starts) give this process the cluster's token in RAY_AUTH_TOKEN before it imports "
                              f'ray; else check it is a Ray head (`ray status --address {address}`)') from None
    return True


def _retry(item):
    """The item with the attempt :func:`agentrl.checks.new_attempt` gives its record identity."""
    from ..checks import new_attempt
    prov = new_attempt(Provenance(group_id=item.group_id, rollout_id=item.rollout_id, attempt=item.attempt))
    return replace(item, attempt=prov.attempt)


class _ActorPool:
    """The actors of one :func:`run` and the chunks in flight on them.

    Args:
        ray: the ``ray`` module (initialised). runner_factory: see :func:`run` (put in the object
            store once). state: the :class:`PoolState` it keeps up to date. cpus_per_worker,
            actor_start_timeout: see :func:`run`. replacements: dead actors it may still replace.
    """

    def __init__(self, ray, runner_factory: Callable, state: PoolState, *, cpus_per_worker: float,
                 actor_start_timeout: float, replacements: int):
        self.ray, self.state = ray, state
        self.cpus_per_worker, self.actor_start_timeout = cpus_per_worker, actor_start_timeout
        self.replacements = replacements
        self.handles: dict[int, object] = {}
        self.inflight: dict = {}                            # ref -> (worker index, chunk)
        self.start_errors: list[str] = []                   # why actors died while starting
        self._actor_cls = ray.remote(_Actor)
        self._factory_ref = ray.put(runner_factory)

    def _spawn(self) -> int:
        i = len(self.state.workers)
        self.state.workers.append(WorkerInfo(index=i))
        self.handles[i] = self._actor_cls.options(num_cpus=self.cpus_per_worker, max_restarts=0,
                                                  max_task_retries=0).remote(self._factory_ref)
        return i

    def _await_started(self, indices) -> list:
        """Wait for the actors ``indices``; return those that died while starting (marked dead)."""
        ray = self.ray
        refs = {self.handles[i].where.remote(): i for i in indices}
        _, pending = ray.wait(list(refs), num_returns=len(refs), timeout=self.actor_start_timeout)
        if pending:
            free = ray.available_resources().get('CPU', 0)
            raise TimeoutError(f'{len(pending)} Ray workers did not start within {self.actor_start_timeout:.0f} s '
                               f'(each needs {self.cpus_per_worker} CPU; the cluster has {free} free); use fewer '
                               '--workers or add nodes')
        died = []
        for ref, i in refs.items():
            w = self.state.workers[i]
            try:
                info = ray.get(ref)
            except (ray.exceptions.RayActorError, ray.exceptions.WorkerCrashedError) as e:
                w.alive = False
                died.append(i)
                lines = [x.strip() for x in str(e).splitlines() if x.strip()]
                self.start_errors.append(lines[-1][:300] if lines else type(e).__name__)   # the cause, last
                log.warning('Ray worker %d died while starting: %s', i, type(e).__name__)
                continue
            w.pid, w.host, w.node_id = info['pid'], info['host'], info['node_id']
        return died

    def start(self, n: int) -> None:
        """Start ``n`` actors; replace (within ``replacements``) those that die while starting.

        Raises:
            TimeoutError: they did not start within ``actor_start_timeout``.
        """
        todo = [self._spawn() for _ in range(n)]
        while todo:
            died = self._await_started(todo)
            k = min(len(died), self.replacements)
            self.replacements -= k
            todo = [self._spawn() for _ in range(k)]

    def submit(self, queue: deque, per_worker: int) -> None:
        """Queue chunks on every live actor until each has ``per_worker`` in flight.

        Raises:
            RuntimeError: nothing is in flight (every actor died and no replacement is left).
        """
        for i, w in enumerate(self.state.workers):
            while w.alive and queue and sum(1 for v in self.inflight.values() if v[0] == i) < per_worker:
                chunk = queue.popleft()
                self.inflight[self.handles[i].run_packed.remote(chunk)] = (i, chunk)
        _track(self.state, self.inflight)
        if not self.inflight:
            raise RuntimeError(f'every Ray worker died and no replacement is left ({len(queue)} chunks '
                               f'not run; {self.state.done} of {self.state.total} episodes done): fix the cause and '
                               'finish with --resume')

    def collect(self, sink: Callable, queue: deque) -> bool:
        """Wait for one chunk and give its records to ``sink``; True when it did.

        False when the chunk's actor died: the chunk is queued again as new attempts
        (:meth:`replace_dead`).
        """
        ray = self.ray
        [ref], _ = ray.wait(list(self.inflight), num_returns=1)
        i, chunk = self.inflight.pop(ref)
        try:
            recs = unpack(ray.get(ref))
        except (ray.exceptions.RayActorError, ray.exceptions.WorkerCrashedError,
                ray.exceptions.ObjectLostError) as e:
            self.replace_dead(i, chunk, e, queue)
            return False
        self.state.workers[i].chunks += 1
        shard = sink(chunk, recs)
        if shard is not None:
            self.state.shards.append(str(shard))
        self.state.done += len(recs)
        _track(self.state, self.inflight)
        return True

    def replace_dead(self, i: int, chunk, err: BaseException, queue: deque) -> None:
        """Queue ``chunk`` of dead actor ``i`` again as new attempts; replace the actor (once, if any replacement is left)."""
        state = self.state
        retry = [_retry(j) for j in chunk]
        state.retried.extend((j.group_id, j.rollout_id, j.attempt) for j in retry)
        state.workers[i].lost.extend(j.key for j in chunk)
        queue.appendleft(retry)
        if not state.workers[i].alive:
            return
        state.workers[i].alive = False
        log.warning('Ray worker %d (pid %s) died: %s; re-running its chunks as new attempts',
                    i, state.workers[i].pid, type(err).__name__)
        self.ray.kill(self.handles[i], no_restart=True)
        if self.replacements > 0:
            self.replacements -= 1
            try:
                self.start(1)
            except TimeoutError as e:   # no room for it: go on with the survivors
                log.warning('replacement Ray worker did not start: %s', e)
                k = len(state.workers) - 1
                state.workers[k].alive = False
                self.ray.kill(self.handles[k], no_restart=True)

    def close(self) -> None:
        """Kill every actor of the pool (dead ones too; errors ignored)."""
        for h in self.handles.values():
            try:
                self.ray.kill(h, no_restart=True)
            except Exception:       # already dead, or Ray going down
                pass


def run(chunks: Sequence[Sequence], runner_factory: Callable, sink: Callable, *, workers: int,
        address: str | None = None, state: PoolState | None = None, cpus_per_worker: float = 1.0,
        max_replacements: int | None = None, inflight_per_worker: int = 2, actor_start_timeout: float = 300.0,
        object_store_mb: int | None = None, should_stop: Callable[[], bool] | None = None,
        on_chunk: Callable[[PoolState], None] | None = None) -> PoolReport:
    """Run ``chunks`` on ``workers`` Ray actors; give each finished chunk's records to ``sink``.

    Args:
        chunks: lists of items (e.g. :class:`~agentrl.jobs.plan.EpisodeJob`) with ``group_id``,
            ``rollout_id``, ``attempt`` and ``key``; frozen dataclasses (a retry is ``replace``\\ d).
        runner_factory: picklable callable, called once per actor; its result's ``run(chunk)``
            returns the chunk's records in chunk order. Put in the object store once.
        sink: ``sink(chunk, records)`` on the driver, for every finished chunk; its return value
            (a shard path or None) is appended to ``state.shards``.
        workers: number of actors, >= 1.
        address: None starts a local Ray instance on 127.0.0.1 (``num_cpus = workers *
            cpus_per_worker``, no dashboard); ``'auto'`` or ``'HOST:PORT'`` joins a cluster. A Ray
            already initialised in this process is used as it is.
        state: the :class:`PoolState` to update (its ``done``/``total`` may count earlier work).
        cpus_per_worker: Ray CPUs reserved per actor.
        max_replacements: how many dead actors may be replaced (None: ``2 * workers``).
        inflight_per_worker: chunks queued on each actor at once (2 keeps it busy while the
            driver writes).
        actor_start_timeout: seconds to wait for the actors to start (they need free CPUs).
        object_store_mb: object store size of a local instance (None: Ray's default).
        should_stop: polled after each finished chunk; True stops the run there (chunks still in
            flight are dropped, not given to the sink).
        on_chunk: called with the state after each finished chunk.

    Returns:
        :class:`PoolReport`.

    Raises:
        ValueError: ``workers < 1``.
        ImportError: Ray is not installed. Fix: ``pip install 'agentrl[ray]'``.
        ConnectionError: no Ray cluster at ``address`` (:func:`check_address`). Fix: start one, or
            drop ``address``.
        TimeoutError: the actors did not start within ``actor_start_timeout``. Fix: fewer
            ``workers`` or a bigger cluster.
        RuntimeError: every actor died (while starting, or later with no replacement left); what
            the sink got stays.
        ray.exceptions.RayTaskError: a chunk raised inside an actor (its traceback is attached).
    """
    if workers < 1:
        raise ValueError(f'engines.ray.run: workers must be >= 1, got {workers}')
    ray = require_ray()
    t_start = time.perf_counter()
    state = state if state is not None else PoolState(total=sum(len(c) for c in chunks))
    queue = deque(list(c) for c in chunks if c)
    started = connect(ray, address, max(1, int(round(workers * cpus_per_worker))), object_store_mb)
    pool, stopped = None, False
    try:
        pool = _ActorPool(ray, runner_factory, state, cpus_per_worker=cpus_per_worker,
                          actor_start_timeout=actor_start_timeout,
                          replacements=2 * workers if max_replacements is None else max_replacements)
        pool.start(workers)
        if not any(w.alive for w in state.workers):
            raise RuntimeError(f'no Ray worker started ({len(state.workers)} tried; each died while starting: '
                               f'{pool.start_errors[-1]}); fix the cause (every node needs agentrl and torch) and '
                               'run again')
        startup = time.perf_counter() - t_start
        while queue or pool.inflight:
            pool.submit(queue, inflight_per_worker)
            if not pool.collect(sink, queue):           # its actor died: the chunk runs again, as new attempts
                continue
            if on_chunk is not None:
                on_chunk(state)
            if should_stop is not None and should_stop() and (queue or pool.inflight):
                stopped = True
                break
    finally:
        if pool is not None:
            pool.close()
        if started:
            ray.shutdown()
    return PoolReport(list(state.retried), list(state.workers), startup,
                      ray_version=getattr(ray, '__version__', ''), address=address or 'local', stopped=stopped)


def _track(state: PoolState, inflight: dict) -> None:
    state.inflight = {}
    for i, chunk in inflight.values():
        state.inflight.setdefault(i, []).extend(j.key for j in chunk)
