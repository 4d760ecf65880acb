"""Scale-out on Ray: the same records at any scale, lost workers, resume (agentrl.jobs + agentrl.engines.ray).

A real two-node Ray cluster (a head and one extra worker node, 1 CPU each, on 127.0.0.1, no
dashboard) is started once for the module and stopped after it; one test also starts the local
instance of ``--workers N`` without ``--address``. Ray servers are kept on the loopback interface:
the head runs with ``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0`` (Ray then resolves localhost to
127.0.0.1 instead of the routable IP) and the worker node's ``ray start`` keeps its 127.0.0.1
addresses as given. The cluster is stopped by terminating, by process id, the processes it started
(found by its private temp folder and port), not by a machine-wide ``ray stop``.

Tests that need no Ray (seeds, plans, the in-process engine, resume, errors) run without it.
"""
import importlib.util
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import time
import uuid
from pathlib import Path

import pytest
import torch

import agentrl as arl
from agentrl import checks
from agentrl import store
from agentrl.engines import ray as ray_pool
from agentrl.jobs import plan as jp
from agentrl.jobs import rollout as jr
from agentrl.jobs import runner as jrun
from agentrl.sampling import episode_seed

HAS_RAY = importlib.util.find_spec('ray') is not None
needs_ray = pytest.mark.skipif(not HAS_RAY, reason="Ray is not installed (pip install 'agentrl[ray]')")
AGENTRL = [sys.executable, '-m', 'agentrl']
RAY_CLI = str(Path(sys.executable).parent / 'ray')
# the plan of the CLI runs: 48 episodes, 6 chunks of 8 (model and a seeded scripted policy)
PLAN = ['--policy', 'model,random', '--split', 'heldout', '--repeats', '4', '--seed', '5', '--chunk-size', '8']

# keeps the worker node's 127.0.0.1 addresses (Ray rewrites localhost to the routable IP)
_WORKER_START = textwrap.dedent('''
    import sys
    import ray._private.services as services
    services.resolve_ip_for_localhost = lambda host: host
    from ray.scripts.scripts import main
    sys.argv = ['ray', 'start', *sys.argv[1:]]
    main()
''')


def agentrl(*args, check=True, timeout=240, env=None):
    p = subprocess.run([*AGENTRL, *args], capture_output=True, text=True, timeout=timeout, env=env)
    if check:
        assert p.returncode == 0, p.stdout + p.stderr
    return p


def by_id(path):
    """Records of a store keyed by (group_id, rollout_id); each episode must appear once."""
    recs = arl.read_trajectories(path)
    out = {}
    for t in recs:
        key = (t.provenance.group_id, t.provenance.rollout_id)
        assert key not in out, f'{key} stored twice'
        out[key] = t
    return out


def assert_same(a, b, same_attempt=True):
    """Equal records: ids, owners, masks, rewards; log-probs bit for bit; seeds; identity."""
    assert torch.equal(a.ids, b.ids) and torch.equal(a.owner, b.owner) and torch.equal(a.turn, b.turn)
    assert torch.equal(a.action_mask, b.action_mask) and a.reward == b.reward and a.info == b.info
    assert a.sample_logp.numpy().tobytes() == b.sample_logp.numpy().tobytes()
    assert checks.record_digest(a) == checks.record_digest(b)
    pa, pb = a.provenance, b.provenance
    assert (pa.group_id, pa.rollout_id, pa.seed, pa.policy, pa.sampling) == \
        (pb.group_id, pb.rollout_id, pb.seed, pb.policy, pb.sampling)
    if same_attempt:
        assert pa.attempt == pb.attempt


# ----------------------------------------------------------------------------- no Ray needed

def test_episode_seed_is_stable_and_distinct():
    s = episode_seed(0, '0/model/clamp', '0/model/clamp/0')
    assert s == episode_seed(0, '0/model/clamp', '0/model/clamp/0') == 4294082752081807618
    assert 0 <= s < 2 ** 63
    jobs = jp.plan_episodes(['model', 'blind'], [t.name for t in arl.make_tasks('all')], 5, seed=0)
    assert len({j.seed for j in jobs}) == len(jobs) == 300
    assert episode_seed(1, '0/model/clamp', '0/model/clamp/0') != s


def test_plan_matches_the_single_process_identities():
    jobs = jp.plan_episodes(['oracle', 'model'], ['clamp', 'double'], 2, seed=7)
    assert [j.rollout_id for j in jobs[:3]] == ['7/oracle/clamp/0', '7/oracle/clamp/1', '7/oracle/double/0']
    assert jobs[0].group_id == '7/oracle/clamp' and {j.attempt for j in jobs} == {1}
    chunks = jp.plan_chunks(jobs, 3)
    assert [[j.policy for j in c] for c in chunks] == [['oracle'] * 3, ['oracle'], ['model'] * 3, ['model']]
    with pytest.raises(ValueError, match='chunk_size must be >= 1'):
        jp.plan_chunks(jobs, 0)
    with pytest.raises(ValueError, match='a task is listed twice'):
        jp.plan_episodes(['model'], ['clamp', 'clamp'], 1, seed=0)


@pytest.fixture(scope='module')
def weights():
    tok = arl.build_tokenizer(arl.make_tasks('all'))
    torch.manual_seed(0)
    net = arl.TinyAgent(tok.vocab_size).eval()
    return {'config': net.config(), 'state_dict': net.state_dict()}


def test_records_do_not_depend_on_the_batch(weights):
    """Property: an episode's record is the same whichever episodes share its chunk.

    Ids exactly; log-probs to fp32 rounding of differently shaped batches (bit for bit when the
    chunks are the same, which is what ``--workers`` guarantees).
    """
    hyp = pytest.importorskip('hypothesis')
    st = hyp.strategies
    runner = jrun.EpisodeRunner(jrun.RunSpec(), weights)
    jobs = jp.plan_episodes(['model'], ['clamp', 'double', 'halve'], 2, seed=1)
    alone = {j.key: runner.run([j])[0] for j in jobs}

    @hyp.settings(max_examples=6, deadline=None, derandomize=True)
    @hyp.given(st.permutations(jobs), st.integers(1, len(jobs)))
    def check(order, size):
        for chunk in jp.plan_chunks(order, size):
            for job, rec in zip(chunk, runner.run(chunk)):
                ref = alone[job.key]
                assert torch.equal(rec.ids, ref.ids) and rec.provenance.seed == job.seed
                assert torch.allclose(rec.sample_logp, ref.sample_logp, atol=1e-5, rtol=0)
    check()


def test_in_process_resume_after_a_crash_completes_exactly_the_missing(tmp_path, weights):
    jobs = jp.plan_episodes(['model', 'blind'], ['clamp', 'double', 'halve'], 3, seed=2)   # 18
    spec = jrun.RunSpec()
    full = jr.run_chunks(jobs, tmp_path / 'full', spec, weights, workers=0, chunk_size=4, progress=False)
    assert full.written == 18 and len(full.workers) == 0

    class Crash(Exception):
        pass

    def crash(state):
        if state.done >= 8:
            raise Crash
    with pytest.raises(Crash):
        jr.run_chunks(jobs, tmp_path / 'cut', spec, weights, workers=0, chunk_size=4, progress=False,
                      on_chunk=crash)
    before = store.stored_identities(tmp_path / 'cut')
    assert len(before) == 8
    with pytest.raises(ValueError, match='already holds 8 of the 18 planned episodes; pass --resume'):
        jr.run_chunks(jobs, tmp_path / 'cut', spec, weights, workers=0, chunk_size=4, progress=False)
    rep = jr.run_chunks(jobs, tmp_path / 'cut', spec, weights, workers=0, chunk_size=4, progress=False, resume=True)
    assert (rep.skipped, rep.written, rep.resends) == (8, 10, 0)
    a, b = by_id(tmp_path / 'full'), by_id(tmp_path / 'cut')
    assert a.keys() == b.keys() and len(a) == 18
    for k in a:
        assert_same(a[k], b[k])
    again = jr.run_chunks(jobs, tmp_path / 'cut', spec, weights, workers=0, chunk_size=4, progress=False, resume=True)
    assert (again.skipped, again.written) == (18, 0)


def test_resume_errors_name_the_fix(tmp_path):
    (tmp_path / 'plain').mkdir()
    p = agentrl('rollout', '--resume', str(tmp_path / 'plain'), check=False)
    assert p.returncode == 2
    assert "no run.json there; pass the --out folder of an `agentrl rollout` run" in p.stderr
    p = agentrl('rollout', '--address', 'auto', '--out', str(tmp_path / 'x'), check=False)
    assert p.returncode == 2 and 'add --workers N' in p.stderr


def test_missing_ray_names_the_extra(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, 'ray', None)
    with pytest.raises(ImportError, match=r"pip install 'agentrl\[ray\]'"):
        ray_pool.require_ray()
    from agentrl.jobs.plan import RolloutOptions
    with pytest.raises(ImportError, match=r"pip install 'agentrl\[ray\]'"):
        jr.rollout_job(RolloutOptions(policy=['oracle'], workers=2, out=str(tmp_path / 'run')), progress=False)
    assert not (tmp_path / 'run').exists()          # nothing written before the error


def test_ray_address_is_checked_without_ray():
    """None, auto and local are Ray's to resolve; a bad port is refused before any connection."""
    for address in (None, 'auto', 'local'):
        assert ray_pool.check_address(address) is None
    assert ray_pool._host_port('10.0.0.5:6380') == ('10.0.0.5', 6380)
    assert ray_pool._host_port('ray://head') == ('head', 10001)
    assert ray_pool._host_port('head') == ('head', 6379)
    assert ray_pool._host_port('[::1]:7000') == ('::1', 7000) and ray_pool._host_port('::1') == ('::1', 6379)
    with pytest.raises(ValueError, match=r"^--address '127\.0\.0\.1:x': the port 'x' is not a number in \[1, 65535\]; "
                                         r'pass HOST:PORT of a Ray head \(`ray start --head` prints it\), or auto$'):
        ray_pool.check_address('127.0.0.1:x')
    port = _free_port()
    with pytest.raises(ConnectionError, match=rf"^--address '127\.0\.0\.1:{port}': no Ray cluster answers there "
                                              r'\(connection refused\); start one'):
        ray_pool.check_address(f'127.0.0.1:{port}')


@needs_ray
def test_unreachable_address_is_refused_before_anything_is_written(tmp_path, capsys, monkeypatch):
    """Nothing listens at --address: one line at once (ray.init would retry for minutes), no OUT folder."""
    from agentrl.cli.main import main
    import ray
    address = f'127.0.0.1:{_free_port()}'
    inits = []
    monkeypatch.setattr(ray, 'init', lambda *a, **k: inits.append(k) or (_ for _ in ()).throw(AssertionError('init')))
    assert main(['rollout', '--policy', 'oracle', '--workers', '1', '--address', address,
                 '--out', str(tmp_path / 'run')]) == 2
    assert inits == []                     # refused by the address probe, before ray.init (which retries for minutes)
    assert capsys.readouterr().err == (
        f"agentrl: error: --address '{address}': no Ray cluster answers there (connection refused); start one with "
        '`ray start --head` and pass the address it prints, or drop --address to start a local instance\n')
    assert not (tmp_path / 'run').exists()
    with pytest.raises(ConnectionError, match=rf"^--address '{address}': no Ray cluster answers there"):
        ray_pool.run([[]], lambda: None, lambda c, r: None, workers=1, address=address)


# ----------------------------------------------------------------------------- a real Ray cluster

def _free_port() -> int:
    with socket.socket() as s:
        s.bind(('127.0.0.1', 0))
        return s.getsockname()[1]


def _cluster_pids(marks) -> list[int]:
    """Process ids whose command line names this cluster (its temp folder or port), and their children."""
    pids, parents = set(), {}
    for d in Path('/proc').iterdir():
        if not d.name.isdigit():
            continue
        try:
            cmd = (d / 'cmdline').read_bytes().replace(b'\0', b' ').decode(errors='replace')
            ppid = int((d / 'stat').read_text().rsplit(')', 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        parents[int(d.name)] = ppid
        if any(m in cmd for m in marks) and int(d.name) != os.getpid():
            pids.add(int(d.name))
    grew = True
    while grew:
        kids = {p for p, pp in parents.items() if pp in pids} - pids
        grew = bool(kids)
        pids |= kids
    return sorted(pids)


def _stop_cluster(marks) -> None:
    pids = _cluster_pids(marks)
    for sig, wait in ((signal.SIGTERM, 5.0), (signal.SIGKILL, 2.0)):
        for p in pids:
            try:
                os.kill(p, sig)
            except ProcessLookupError:
                pass
        deadline = time.time() + wait
        while time.time() < deadline:
            pids = [p for p in pids if Path(f'/proc/{p}').exists() and 'Z' not in _state(p)]
            if not pids:
                return
            time.sleep(0.1)


def _state(pid: int) -> str:
    try:
        return Path(f'/proc/{pid}/stat').read_text().rsplit(')', 1)[1].split()[0]
    except (OSError, IndexError):
        return 'Z'


@pytest.fixture(scope='module')
def ray_env():
    """Environment of every Ray process of these tests: token auth with a token of their own.

    Ray 2.5x enables token auth for clusters it starts; passing the token in the environment
    keeps head, worker node and drivers agreeing without touching ``~/.ray/auth_token``. Ray runs
    its workers at nice 15 unless ``RAY_worker_niceness`` says otherwise: on a loaded machine the
    test's own processes (nice 0) would starve the actors, which then take minutes to start or die
    while starting; the cluster runs them at nice 0, like the local instance agentrl starts. Ray's memory
    monitor is off: other jobs' memory on a shared machine must not kill the test's actors.
    """
    return dict(os.environ, RAY_USAGE_STATS_ENABLED='0', RAY_AUTH_MODE='token', RAY_AUTH_TOKEN=uuid.uuid4().hex,
                RAY_worker_niceness='0', RAY_memory_monitor_refresh_ms='0')


@pytest.fixture(scope='module')
def cluster(ray_env):
    """``127.0.0.1:PORT`` of a head plus one worker node (1 CPU each), stopped after the module."""
    if not HAS_RAY:
        pytest.skip("Ray is not installed (pip install 'agentrl[ray]')")
    port = _free_port()
    temp = tempfile.mkdtemp(prefix='arl-ray-')
    marks = [temp, f'127.0.0.1:{port}']
    env = ray_env
    common = ['--num-cpus=1', '--disable-usage-stats', f'--temp-dir={temp}']
    try:
        subprocess.run([RAY_CLI, 'start', '--head', '--node-ip-address=127.0.0.1', f'--port={port}',
                        '--include-dashboard=false', *common], check=True, capture_output=True, timeout=120,
                       env=dict(env, RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER='0'))
        subprocess.run([sys.executable, '-c', _WORKER_START, f'--address=127.0.0.1:{port}',
                        '--node-ip-address=127.0.0.1', *common], check=True, capture_output=True, timeout=120,
                       env=env)
        yield f'127.0.0.1:{port}'
    finally:
        _stop_cluster(marks)
        shutil.rmtree(temp, ignore_errors=True)


@pytest.fixture(scope='module')
def one_worker(cluster, ray_env, tmp_path_factory):
    """The reference run: ``--workers 1`` on the cluster."""
    out = tmp_path_factory.mktemp('w1')
    agentrl('rollout', *PLAN, '--workers', '1', '--address', cluster, '--out', str(out), env=ray_env)
    return out


@needs_ray
def test_workers_1_and_2_give_identical_records(cluster, ray_env, one_worker, tmp_path):
    out = tmp_path / 'w2'
    p = agentrl('rollout', *PLAN, '--workers', '2', '--address', cluster, '--out', str(out), env=ray_env)
    assert 'wrote 48 episodes to' in p.stdout and 'trajectories' in p.stdout
    a, b = by_id(one_worker / 'trajectories'), by_id(out / 'trajectories')
    assert len(a) == len(b) == 48 and a.keys() == b.keys()
    for k in a:
        assert_same(a[k], b[k])
        assert a[k].provenance.attempt == 1
        assert a[k].provenance.seed == episode_seed(5, *k)
    summary = json.loads((out / 'summary.json').read_text())
    eng = summary['engine']
    assert (eng['workers'], eng['written'], eng['retried'], eng['address']) == (2, 48, [], cluster)
    assert eng['nodes'] == 2                     # the head and the extra worker node both ran chunks
    assert summary['episodes'] == 48 and set(summary['policies']) == {'model', 'random'}
    for run in (one_worker, out):
        c = agentrl('check', str(run / 'trajectories'), '--model', str(run / 'model.pt'), '--max-ratio-dev', '1e-5')
        assert 'records          48' in c.stdout and 'result: OK' in c.stdout


@needs_ray
def test_workers_0_gives_the_records_of_workers_1(one_worker, tmp_path):
    """In this process (no Ray) the same plan gives the same records, bit for bit: one seed rule, one job."""
    out = tmp_path / 'w0'
    p = agentrl('rollout', *PLAN, '--workers', '0', '--out', str(out))
    assert 'wrote 48 episodes to' in p.stdout
    a, b = by_id(one_worker / 'trajectories'), by_id(out / 'trajectories')
    assert len(a) == len(b) == 48 and a.keys() == b.keys()
    for k in a:
        assert_same(a[k], b[k])
    s0, s1 = (json.loads((d / 'summary.json').read_text()) for d in (out, one_worker))
    assert s0['policies'] == s1['policies'] and s0['model'] == s1['model']
    assert (out / 'model.pt').read_bytes() == (one_worker / 'model.pt').read_bytes()


# The in-process Ray drivers of these tests run in a child process: Ray reads its token-auth
# settings (RAY_AUTH_MODE, RAY_AUTH_TOKEN) once per process, when it is first imported, and keeps
# them. A test process that imported Ray earlier without this cluster's token (another test, another
# module of the same pytest worker) is refused by the cluster ("Authentication token is missing or
# incorrect", raised by ray.init as ConnectionError); which tests share a process varies with load
# under pytest-xdist. A child of its own starts from ray_env.
_KILLED_WORKER = textwrap.dedent('''
    import json, os, signal, sys
    import torch
    import agentrl as arl
    from agentrl.jobs import plan as jp, rollout as jr, runner as jrun

    out, address, weights_file = sys.argv[1:4]
    weights = torch.load(weights_file, weights_only=True)
    jobs = jp.plan_episodes(['model'], [t.name for t in arl.make_tasks('all')][:25], 8, seed=11)
    killed = {}

    def kill_one(state):
        if killed:
            return
        victim = next(w for w in state.workers if w.alive and state.inflight.get(w.index))
        killed['pid'] = victim.pid
        os.kill(victim.pid, signal.SIGKILL)

    rep = jr.run_chunks(jobs, out, jrun.RunSpec(model_id='tiny'), weights, workers=2, address=address, chunk_size=8,
                        progress=False, on_chunk=kill_one)
    print(json.dumps({'killed': killed.get('pid'), 'written': rep.written, 'resends': rep.resends,
                      'retried': rep.retried, 'workers': [[w.pid, w.alive, w.lost] for w in rep.workers]}))
''')


def _driver(script: str, *args, env) -> dict:
    """Run the Ray driver ``script`` in a child process with ``env``; its last stdout line, as JSON."""
    p = subprocess.run([sys.executable, '-c', script, *map(str, args)], capture_output=True, text=True, timeout=600,
                       env=dict(env, PYTHONPATH=str(Path(arl.__file__).parents[1])))
    assert p.returncode == 0, p.stderr[-3000:]
    return json.loads(p.stdout.strip().splitlines()[-1])


@needs_ray
def test_killed_worker_loses_nothing(cluster, ray_env, tmp_path, weights):
    """SIGKILL one actor's process mid-run: 200 episodes, each once; its unfinished ones are attempt 2."""
    torch.save(weights, tmp_path / 'weights.pt')
    rep = _driver(_KILLED_WORKER, tmp_path / 'trajs', cluster, tmp_path / 'weights.pt', env=ray_env)
    jobs = jp.plan_episodes(['model'], [t.name for t in arl.make_tasks('all')][:25], 8, seed=11)
    assert len(jobs) == 200
    assert rep['killed'] and rep['written'] == 200 and rep['resends'] == 0
    workers = rep['workers']
    assert sum(not alive for _, alive, _ in workers) == 1 and len(workers) == 3    # one replaced
    stored = by_id(tmp_path / 'trajs')
    assert len(stored) == 200 and set(stored) == {j.key for j in jobs}
    twice = {k for k, t in stored.items() if t.provenance.attempt == 2}
    # the episodes lost with the killed worker (its unfinished chunks: those in flight when it was
    # killed, less any that had just finished) are stored once, as attempt 2; all others as attempt 1
    [(pid, _, lost)] = [w for w in workers if not w[1]]
    assert pid == rep['killed'] and twice and twice == {tuple(k) for k in lost}
    assert {(g, r) for g, r, _ in rep['retried']} == twice and {a for _, _, a in rep['retried']} == {2}
    assert {t.provenance.attempt for k, t in stored.items() if k not in twice} == {1}
    # a retry samples what the lost attempt would have: the store equals a run without faults
    ref = jr.run_chunks(jobs, tmp_path / 'ref', jrun.RunSpec(model_id='tiny'), weights, workers=0, chunk_size=8,
                        progress=False)
    assert ref.written == 200
    expected = by_id(tmp_path / 'ref')
    for k, t in stored.items():
        assert_same(t, expected[k], same_attempt=k not in twice)


_START_FAILS = textwrap.dedent('''
    import functools, json, operator, sys
    from agentrl.engines import ray as ray_pool

    state = ray_pool.PoolState()
    try:
        ray_pool.run([], functools.partial(operator.truediv, 1, 0), lambda c, r: None, workers=1, address=sys.argv[1],
                     max_replacements=2, state=state)
        error = None
    except RuntimeError as e:
        error = str(e)
    print(json.dumps({'error': error, 'alive': [w.alive for w in state.workers]}))
''')


@needs_ray
def test_actors_that_die_while_starting_are_replaced_then_reported(cluster, ray_env):
    """A runner that cannot be built: each actor dies while starting; replaced up to the budget, then one line."""
    rep = _driver(_START_FAILS, cluster, env=ray_env)
    assert rep['alive'] == [False, False, False]
    assert rep['error'].startswith('no Ray worker started (3 tried; each died while starting: ZeroDivisionError: '
                                   'division by zero); fix the cause'), rep['error']


_STALE_AUTH = textwrap.dedent('''
    import json, os, sys
    import ray                                    # imported before the token is in the environment
    from agentrl.engines import ray as ray_pool

    os.environ.update(RAY_AUTH_MODE='token', RAY_AUTH_TOKEN=sys.argv[2])
    try:
        ray_pool.run([], lambda: None, lambda c, r: None, workers=1, address=sys.argv[1])
        error = None
    except ConnectionError as e:
        error = str(e)
    print(json.dumps({'error': error}))
''')


@needs_ray
def test_a_driver_without_the_token_is_told_how_to_join(cluster, ray_env):
    """The failure mode of an in-process driver whose Ray was imported without the cluster's token: one line."""
    env = {k: v for k, v in ray_env.items() if k not in ('RAY_AUTH_MODE', 'RAY_AUTH_TOKEN')}
    rep = _driver(_STALE_AUTH, cluster, ray_env['RAY_AUTH_TOKEN'], env=env)
    assert rep['error'] == (
        f"could not join the Ray cluster at --address '{cluster}' (Failed to connect to Ray cluster at {cluster}); it "
        'answers but refused this driver: with token authentication (the default of clusters Ray 2.5x starts) give '
        "this process the cluster's token in RAY_AUTH_TOKEN before it imports ray; else check it is a Ray head "
        f'(`ray status --address {cluster}`)')


_KILL_DRIVER = textwrap.dedent('''
    import os, signal, sys
    from agentrl.jobs.plan import RolloutOptions
    from agentrl.jobs.rollout import rollout_job

    def die(state):
        if state.done >= 16:
            os.kill(os.getpid(), signal.SIGKILL)

    opts = RolloutOptions(policy=['model', 'random'], split='heldout', repeats=4, seed=5, out=sys.argv[1],
                          workers=2, address=sys.argv[2], chunk_size=8)
    rollout_job(opts, on_chunk=die, progress=False)
''')


@needs_ray
def test_resume_after_the_driver_is_killed(cluster, ray_env, one_worker, tmp_path):
    out = tmp_path / 'cut'
    p = subprocess.run([sys.executable, '-c', _KILL_DRIVER, str(out), cluster], capture_output=True, text=True,
                       timeout=240, env=ray_env)
    assert p.returncode == -signal.SIGKILL, p.stderr
    before = store.stored_identities(out / 'trajectories')
    assert 16 <= len(before) < 48 and not (out / 'summary.json').exists()
    agentrl('rollout', '--resume', str(out), '--workers', '2', '--address', cluster, env=ray_env)
    eng = json.loads((out / 'summary.json').read_text())['engine']
    assert (eng['skipped_by_resume'], eng['written']) == (len(before), 48 - len(before))
    a, b = by_id(one_worker / 'trajectories'), by_id(out / 'trajectories')
    assert a.keys() == b.keys()
    for k in a:
        assert_same(a[k], b[k])
    p = agentrl('rollout', '--resume', str(out), '--workers', '1', '--address', cluster, '--repeats', '9', check=False,
                env=ray_env)
    assert p.returncode == 2 and 'the run was planned with --repeats 4, this command says --repeats 9' in p.stderr


@needs_ray
def test_local_instance_gives_the_same_records(one_worker, ray_env, tmp_path):
    """Without --address the job starts (and stops) its own Ray instance on 127.0.0.1."""
    out = tmp_path / 'local'
    agentrl('rollout', *PLAN, '--workers', '2', '--out', str(out), env=ray_env)
    summary = json.loads((out / 'summary.json').read_text())
    assert summary['engine']['address'] == 'local' and summary['engine']['written'] == 48
    a, b = by_id(one_worker / 'trajectories'), by_id(out / 'trajectories')
    assert a.keys() == b.keys()
    for k in a:
        assert_same(a[k], b[k])
