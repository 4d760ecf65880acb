"""Benchmark agentrl.store: write and read 1M tokens of trajectories.

Reports tokens per second each way (best of ``--repeat`` runs) and bytes per token on disk
against the raw in-memory arrays (``ids`` int64 + ``action_mask`` float32 + ``sample_logp``
float32 = 16 bytes per token; with ``owner`` and ``turn`` int64 = 32 bytes per token).

Records are shaped like TinyAgent episodes: ``--len`` tokens each, a prompt, then turns of a
6-token policy call (random ids over a 316-word vocabulary, float32 log-probs) and a
tool observation. Source: issue 4, "Benchmark (bench/)".

Usage:
    .venv/bin/python bench/bench_store.py [--tokens 1000000] [--len 250] [--repeat 3]
"""
from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time

import pyarrow.parquet as pq
import torch

from agentrl import store
from agentrl.record import OWNER, Provenance, SamplingSpec, Trajectory


def make_records(n_tokens: int, length: int, vocab: int = 316, seed: int = 0) -> list[Trajectory]:
    """Synthetic TinyAgent-like records totalling ``n_tokens`` tokens (``length`` each)."""
    g = torch.Generator().manual_seed(seed)
    n = max(1, n_tokens // length)
    pattern = [OWNER['template']] + [OWNER['prompt']] * 20
    while len(pattern) < length:
        pattern += [OWNER['policy']] * 6 + [OWNER['template']] + [OWNER['tool']] * 25 + [OWNER['template']]
    owner = torch.tensor(pattern[:length])
    turn = torch.cumsum((owner == OWNER['policy']).long().diff(prepend=torch.tensor([0])).clamp(min=0), 0) - 1
    out = []
    for i in range(n):
        ids = torch.randint(8, vocab, (length,), generator=g)
        mask = (owner[1:] == OWNER['policy']).float()
        logp = -torch.rand(length - 1, generator=g) * 6 * mask
        prov = Provenance(policy='model', tokenizer='f3a1c0de5b2e9d47', template='0b9e2c71d4a8f365',
                          sampling=SamplingSpec(1.0), model='TinyAgent-untrained-seed0', group_id=f'0/model/t{i % 30}',
                          rollout_id=f'0/model/t{i % 30}/{i}', seed=i)
        out.append(Trajectory(ids=ids, action_mask=mask, sample_logp=logp, reward=float(i % 2), owner=owner.clone(),
                              turn=turn.clone(), info={'task': f't{i % 30}', 'stop': 'truncated', 'n_turns': 6},
                              provenance=prov))
    return out


def best(fn, repeat: int) -> tuple[float, object]:
    times, result = [], None
    for _ in range(repeat):
        t0 = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - t0)
    return min(times), result


def measure(tokens: int = 1_000_000, length: int = 250, repeat: int = 3, shards: int = 16) -> dict:
    """Time writing and reading ``tokens`` tokens of records; return seconds and sizes."""
    torch.set_num_threads(1)
    recs = make_records(tokens, length)
    n_tok = sum(len(r.ids) for r in recs)
    n_pred = sum(len(r.sample_logp) for r in recs)
    raw_core = n_tok * 8 + n_pred * 4 * 2
    root = tempfile.mkdtemp(prefix='agentrl-bench-')
    try:
        path = os.path.join(root, 'one.parquet')
        t_write, _ = best(lambda: store.write_trajectories(path, recs), repeat)
        t_write_nosync, _ = best(lambda: store.write_trajectories(path, recs, fsync=False), repeat)
        size = os.path.getsize(path)
        t_read, back = best(lambda: store.read_trajectories(path), repeat)
        assert len(back) == len(recs) and torch.equal(back[-1].sample_logp, recs[-1].sample_logp)
        t_stream, _ = best(lambda: sum(len(b) for b in store.iter_batches(path, 256)), repeat)
        t_arrow, _ = best(lambda: pq.read_table(path), repeat)
        per = -(-len(recs) // shards)

        def sharded():
            d = os.path.join(root, 'ds')
            shutil.rmtree(d, ignore_errors=True)
            w = store.ShardWriter(d)
            for s in range(0, len(recs), per):
                w.write(recs[s:s + per])
            return d
        t_shard, d = best(sharded, repeat)
        shard_size = sum(os.path.getsize(f) for f in store.data_files(d))
        t_shard_read, _ = best(lambda: store.read_trajectories(d), repeat)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return {'records': len(recs), 'length': length, 'tokens': n_tok, 'repeat': repeat, 'shards': shards,
            'raw_core': raw_core, 'raw_full': raw_core + n_tok * 8 * 2, 'size': size, 'shard_size': shard_size,
            'times': [('write_trajectories (fsync)', t_write),
                      ('write_trajectories (no fsync)', t_write_nosync),
                      (f'ShardWriter, {shards} shards (fsync, dedupe)', t_shard),
                      ('read_trajectories -> Trajectory', t_read),
                      ('iter_batches(256) -> Trajectory', t_stream),
                      (f'read_trajectories, {shards} shards', t_shard_read),
                      ('pyarrow.parquet.read_table only', t_arrow)]}


def run(quick: bool) -> list[dict]:
    """bench/run.py entry: tokens/s each way and bytes per token (1M tokens; 100k with quick)."""
    m = measure(tokens=100_000 if quick else 1_000_000, repeat=1 if quick else 3)
    rows = [{'name': name, 'value': round(m['tokens'] / t / 1e6, 3), 'unit': 'Mtok/s',
             'notes': f"{m['tokens']:,} tokens, best of {m['repeat']}"} for name, t in m['times']]
    rows.append({'name': 'Parquet bytes per token (one file)', 'value': round(m['size'] / m['tokens'], 2),
                 'unit': 'B/tok', 'notes': f"raw int64 ids + float32 mask/logp: {m['raw_core'] / m['tokens']:.2f} B/tok"})
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument('--tokens', type=int, default=1_000_000, help='total tokens (default 1M)')
    ap.add_argument('--len', type=int, default=250, help='tokens per record (default 250)')
    ap.add_argument('--repeat', type=int, default=3, help='runs per measurement; best is reported')
    ap.add_argument('--shards', type=int, default=16, help='shards for the ShardWriter rows (default 16)')
    args = ap.parse_args()
    m = measure(args.tokens, args.len, args.repeat, args.shards)
    n_tok = m['tokens']
    print(f"{m['records']} records x {args.len} tokens = {n_tok:,} tokens (torch threads 1, best of {args.repeat})")
    print(f'{"operation":<44} {"seconds":>8} {"Mtok/s":>8}')
    for name, t in m['times']:
        print(f'{name:<44} {t:>8.3f} {n_tok / t / 1e6:>8.2f}')
    print()
    print(f'{"bytes per token":<44} {"B/tok":>8} {"vs raw":>8}')
    for name, b in [('raw ids i64 + mask f32 + logp f32', m['raw_core']), ('raw + owner i64 + turn i64', m['raw_full']),
                    ('Parquet, one file (zstd)', m['size']), (f'Parquet, {args.shards} shards', m['shard_size'])]:
        print(f'{name:<44} {b / n_tok:>8.2f} {b / m["raw_core"]:>8.3f}')


if __name__ == '__main__':
    main()
