"""The one rollout job, streamed to disk: peak memory of a long run, and shard writes vs one file.

Usage::

    .venv/bin/python bench/bench_jobs.py [--episodes 100000] [--chunk-size 256]

1. **Memory**: a fresh process runs :func:`agentrl.jobs.rollout.rollout_job` (untrained TinyAgent,
   every BugFix task, ``--workers 0``) for ``--episodes`` episodes and reports its peak RSS growth
   (``ru_maxrss`` after the run minus the RSS after a warm-up run of one chunk), against the total
   bytes of the records it wrote (as tensors in memory: ids, owner, turn int64, mask, log-probs
   float32; and on disk). Streaming keeps one chunk in memory, so the growth must not scale with
   the run.
2. **Write throughput**: the same records written as one file (``write_trajectories``: the old
   in-memory path) and as the job writes them (``ShardWriter``, one shard per chunk, fsync each),
   in million tokens per second, best of 3, side by side.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

_CHILD = r'''
import json, os, resource, sys, time
import torch
torch.set_num_threads(1)
from agentrl.jobs.plan import RolloutOptions
from agentrl.jobs.rollout import rollout_job

def rss_mb():
    with open('/proc/self/status') as f:
        for line in f:
            if line.startswith('VmRSS:'):
                return int(line.split()[1]) / 1024

root, episodes, chunk = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
repeats = -(-episodes // 30)
rollout_job(RolloutOptions(policy=['model'], repeats=1, chunk_size=chunk, out=os.path.join(root, 'warm')),
            progress=False, handle_signals=False)
base = rss_mb()
peak_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
t = time.perf_counter()
s = rollout_job(RolloutOptions(policy=['model'], repeats=repeats, chunk_size=chunk, out=os.path.join(root, 'run')),
                progress=False, handle_signals=False)
seconds = time.perf_counter() - t
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
print(json.dumps({'episodes': s['episodes'], 'seconds': seconds, 'rss_base_mb': base,
                  'peak_before_mb': peak_before, 'peak_mb': peak,
                  'length_mean': s['policies']['model']['length_mean']}))
'''


def memory(episodes: int, chunk_size: int) -> dict:
    """Run the child job; return its numbers plus the records' bytes (tensors and disk)."""
    root = tempfile.mkdtemp(prefix='agentrl-bench-jobs-')
    try:
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(
            [str(Path(__file__).resolve().parents[1] / 'src'), os.environ.get('PYTHONPATH', '')]))
        p = subprocess.run([sys.executable, '-c', _CHILD, root, str(episodes), str(chunk_size)], capture_output=True,
                           text=True, env=env, check=True)
        out = json.loads(p.stdout.strip().splitlines()[-1])
        tokens = out['episodes'] * out['length_mean']
        out['tokens'] = tokens
        out['tensor_mb'] = tokens * (3 * 8 + 2 * 4) / 2 ** 20      # ids, owner, turn int64; mask, logp float32
        shards = Path(root) / 'run' / 'trajectories'
        out['disk_mb'] = sum(f.stat().st_size for f in shards.iterdir()) / 2 ** 20
        out['shards'] = len(list(shards.iterdir()))
        out['growth_mb'] = out['peak_mb'] - out['rss_base_mb']
        return out
    finally:
        shutil.rmtree(root, ignore_errors=True)


def write_throughput(episodes: int = 8192, chunk_size: int = 256, rounds: int = 3) -> dict:
    """Mtok/s of one-file writes vs shard-per-chunk writes of the same records (best of ``rounds``)."""
    import torch

    import agentrl as arl
    from agentrl import store
    from agentrl.jobs import plan, runner
    torch.set_num_threads(1)
    tok = arl.gym.bugfix_tokenizer()
    torch.manual_seed(0)
    net = arl.TinyAgent(tok.vocab_size).eval()
    jobs = plan.plan_episodes(['model'], [t.name for t in arl.make_tasks('all')], -(-episodes // 30), 0)[:episodes]
    r = runner.EpisodeRunner(runner.RunSpec(), {'config': net.config(), 'state_dict': net.state_dict()})
    chunks = [r.run(c) for c in plan.plan_chunks(jobs, chunk_size)]
    recs = [t for c in chunks for t in c]
    tokens = sum(len(t.ids) for t in recs)
    best = {'one_file': float('inf'), 'shards': float('inf')}
    root = Path(tempfile.mkdtemp(prefix='agentrl-bench-write-'))
    try:
        for k in range(rounds):
            t = time.perf_counter()
            store.write_trajectories(root / f'one-{k}.parquet', recs)
            best['one_file'] = min(best['one_file'], time.perf_counter() - t)
            t = time.perf_counter()
            w = store.ShardWriter(root / f'shards-{k}')
            for c in chunks:
                w.write(c)
            best['shards'] = min(best['shards'], time.perf_counter() - t)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return {'episodes': len(recs), 'tokens': tokens, 'chunk_size': chunk_size, 'shards': len(chunks),
            'one_file_mtok_s': tokens / best['one_file'] / 1e6, 'shards_mtok_s': tokens / best['shards'] / 1e6,
            'ratio': best['one_file'] / best['shards']}


def run(quick: bool) -> list[dict]:
    """Rows for ``bench/run.py`` (``quick``: 3,000 episodes and 2,048 written records)."""
    n, m = (3000, 2048) if quick else (100_000, 8192)
    mem = memory(n, 256)
    w = write_throughput(m, 256)
    rows = [
        {'name': f'rollout_{mem["episodes"]}_peak_rss_growth_mb', 'value': round(mem['growth_mb'], 1), 'unit': 'MB',
         'target': '<= 300', 'ok': mem['growth_mb'] <= 300,
         'notes': f'against {mem["tensor_mb"]:.0f} MB of record tensors ({mem["tokens"]:.0f} tokens), '
                  f'{mem["disk_mb"]:.1f} MB on disk in {mem["shards"]} shards; RSS after warm-up '
                  f'{mem["rss_base_mb"]:.0f} MB, peak {mem["peak_mb"]:.0f} MB; {mem["seconds"]:.1f} s'},
        {'name': f'rollout_{mem["episodes"]}_episodes_per_s', 'value': round(mem['episodes'] / mem['seconds']),
         'unit': 'ep/s', 'notes': 'untrained TinyAgent, workers 0, chunk 256, streamed to shards'},
        {'name': 'write_one_file_mtok_s', 'value': round(w['one_file_mtok_s'], 2), 'unit': 'Mtok/s',
         'notes': f'write_trajectories of {w["episodes"]} records ({w["tokens"]} tokens), fsync'},
        {'name': 'write_shards_mtok_s', 'value': round(w['shards_mtok_s'], 2), 'unit': 'Mtok/s',
         'notes': f'ShardWriter, {w["shards"]} shards of {w["chunk_size"]}, fsync and dedupe each'},
        {'name': 'write_shards_vs_one_file', 'value': round(w['ratio'], 3), 'unit': 'x', 'target': '>= 0.9',
         'ok': w['ratio'] >= 0.9, 'notes': 'one-file time / shard time (1 = as fast as the in-memory path)'},
    ]
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument('--episodes', type=int, default=100_000)
    ap.add_argument('--chunk-size', type=int, default=256)
    ap.add_argument('--write-episodes', type=int, default=8192)
    a = ap.parse_args()
    mem = memory(a.episodes, a.chunk_size)
    print(json.dumps(mem, indent=2))
    print(json.dumps(write_throughput(a.write_episodes, a.chunk_size), indent=2))


if __name__ == '__main__':
    main()
