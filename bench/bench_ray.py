"""Benchmark the Ray engine: episodes per second with 1 and 2 workers against in-process rollouts.

The same 1,024 model episodes (an untrained TinyAgent on the 30 BugFix tasks, per-episode
seeds, chunks of 32) are run four ways:

* ``rollout_batch`` in this process: the chunks one after another, nothing stored (the floor);
* the engine in this process (``workers=0``): the same chunks, streamed to a shard folder;
* the engine on a local Ray instance with 1 worker, then with 2 workers (one Ray start for
  both; its time is reported apart and not counted in episodes/s).

The per-episode overhead that Ray adds is ``(t_ray1 - t_inprocess_engine) / episodes`` (the
extra cost of shipping chunks to an actor and records back, per episode), also given against
bare ``rollout_batch``. Torch runs one thread per worker and in this process.

Usage:
    .venv/bin/python bench/bench_ray.py [--episodes 1024] [--chunk-size 32] [--quick]

Source: issue 9, "Benchmark (bench/)".
"""
from __future__ import annotations

import argparse
import importlib.util
import shutil
import tempfile
import time
from pathlib import Path


def _plan(episodes: int):
    import agentrl as arl
    from agentrl.jobs import plan as rr
    names = [t.name for t in arl.make_tasks('all')]
    jobs = rr.plan_episodes(['model'], names, -(-episodes // len(names)), seed=0)
    return jobs[:episodes]


def _weights():
    import torch

    import agentrl as arl
    tok = arl.build_tokenizer(arl.make_tasks('all'))
    torch.manual_seed(0)
    net = arl.TinyAgent(tok.vocab_size).eval()
    return {'config': net.config(), 'state_dict': net.state_dict()}


def measure(episodes: int = 1024, chunk_size: int = 32, ray_workers=(1, 2)) -> dict:
    """Time the four ways; return seconds per way and the Ray start time.

    Args:
        episodes: episodes per way. chunk_size: episodes per chunk.
        ray_workers: worker counts to time on Ray (empty: no Ray).

    Returns:
        dict ``{'episodes', 'chunk_size', 'batch', 'inprocess', 'ray_start', 'ray': {workers: s}}``
        (seconds).

    Raises:
        ImportError: ``ray_workers`` given but Ray is not installed (``pip install 'agentrl[ray]'``).
    """
    import torch

    from agentrl.engines import ray as ray_pool
    from agentrl.jobs import plan, rollout, runner
    torch.set_num_threads(1)
    jobs, weights, spec = _plan(episodes), _weights(), runner.RunSpec()
    out = {'episodes': len(jobs), 'chunk_size': chunk_size, 'ray': {}}
    root = Path(tempfile.mkdtemp(prefix='agentrl-bench-ray-'))
    try:
        episodes_runner = runner.EpisodeRunner(spec, weights)
        t0 = time.perf_counter()
        n = sum(len(episodes_runner.run(c)) for c in plan.plan_chunks(jobs, chunk_size))
        out['batch'] = time.perf_counter() - t0
        assert n == len(jobs)
        rep = rollout.run_chunks(jobs, root / 'inproc', spec, weights, workers=0, chunk_size=chunk_size, progress=False)
        out['inprocess'] = rep.seconds
        if ray_workers:
            ray = ray_pool.require_ray()
            t0 = time.perf_counter()
            started = ray_pool.connect(ray, None, max(ray_workers), None)
            out['ray_start'] = time.perf_counter() - t0
            try:
                for w in ray_workers:
                    rep = rollout.run_chunks(jobs, root / f'ray{w}', spec, weights, workers=w, chunk_size=chunk_size,
                                        progress=False)
                    assert rep.written == len(jobs)
                    out['ray'][w] = rep.seconds - rep.startup_seconds
                    out.setdefault('actor_start', {})[w] = rep.startup_seconds
            finally:
                if started:
                    ray.shutdown()
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return out


def run(quick: bool) -> list[dict]:
    """Rows for ``bench/run.py``: episodes/s per way and Ray's per-episode overhead.

    ``quick`` times 128 episodes in this process only (a Ray start alone takes about 10 s).
    """
    has_ray = importlib.util.find_spec('ray') is not None
    m = measure(128 if quick else 1024, ray_workers=() if quick or not has_ray else (1, 2))
    n = m['episodes']
    mode = 'rollout_batch, per-row generators'
    rows = [{'name': f'in-process rollout_batch, {n} episodes', 'value': round(n / m['batch'], 1),
             'unit': 'episodes/s', 'notes': f'chunks of {m["chunk_size"]}, nothing stored; {mode}'},
            {'name': 'in-process engine (workers=0)', 'value': round(n / m['inprocess'], 1), 'unit': 'episodes/s',
             'notes': 'same chunks, streamed to a shard folder (one shard per chunk, fsync)'}]
    if not m['ray']:
        why = 'quick mode (a Ray start takes ~10 s)' if has_ray else "Ray not installed (pip install 'agentrl[ray]')"
        rows.append({'name': 'Ray workers', 'value': None, 'unit': 'episodes/s', 'notes': f'skipped: {why}'})
        return rows
    for w, t in m['ray'].items():
        rows.append({'name': f'Ray, {w} worker{"s" * (w > 1)}', 'value': round(n / t, 1), 'unit': 'episodes/s',
                     'notes': f'local instance; actor start {m["actor_start"][w]:.1f} s not counted'})
    rows += [{'name': 'Ray overhead per episode (1 worker vs in-process engine)',
              'value': round((m['ray'][1] - m['inprocess']) / n * 1e3, 3), 'unit': 'ms',
              'notes': 'chunk to actor, records back, driver waits; negative = noise'},
             {'name': 'Ray overhead per episode (1 worker vs bare rollout_batch)',
              'value': round((m['ray'][1] - m['batch']) / n * 1e3, 3), 'unit': 'ms',
              'notes': 'also counts the shard writes'},
             {'name': 'Ray local start (ray.init)', 'value': round(m['ray_start'], 2), 'unit': 's',
              'notes': 'once per job; not counted above'}]
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    ap.add_argument('--episodes', type=int, default=1024, help='episodes per way (default 1024)')
    ap.add_argument('--chunk-size', type=int, default=32, help='episodes per chunk (default 32)')
    ap.add_argument('--quick', action='store_true', help='128 episodes, no Ray (the bench/run.py --quick rows)')
    args = ap.parse_args(argv)
    if args.quick:
        rows = run(True)
    else:
        m = measure(args.episodes, args.chunk_size)
        n = m['episodes']
        print(f'{n} model episodes, chunks of {m["chunk_size"]}, torch threads 1, '
              'batched with per-row generators')
        print(f'Ray local start {m["ray_start"]:.2f} s; actor start ' +
              ', '.join(f'{w} worker(s) {s:.2f} s' for w, s in m['actor_start'].items()))
        print(f'{"way":<36} {"seconds":>8} {"episodes/s":>11}')
        ways = [('rollout_batch in-process (no store)', m['batch']), ('engine in-process (workers=0)', m['inprocess'])]
        ways += [(f'Ray, {w} worker(s)', t) for w, t in m['ray'].items()]
        for name, t in ways:
            print(f'{name:<36} {t:>8.2f} {n / t:>11.1f}')
        print(f'Ray overhead per episode: {(m["ray"][1] - m["inprocess"]) / n * 1e3:.3f} ms vs the in-process engine, '
              f'{(m["ray"][1] - m["batch"]) / n * 1e3:.3f} ms vs bare rollout_batch')
        return 0
    for r in rows:
        print(f'{r["name"]:<58} {r["value"]!s:>10} {r["unit"]:<11} {r["notes"]}')
    return 0


if __name__ == '__main__':
    raise SystemExit(main())
