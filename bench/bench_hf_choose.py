"""The HF sampler's per-step token choice: fresh float64 tensors vs the reused buffers.

    PYTHONPATH=src .venv/bin/python bench/bench_hf_choose.py [--rows 32] [--vocab 151669] [--steps 40]

Both ways run in one process, alternating, on the same logits and generators, with glibc's
default allocator and one torch thread: "fresh" is the arithmetic of ``sampling.processed_logp`` +
``sampling.draw`` (each ``[rows, V]`` float64 tensor allocated per step, as ``HFSampler.choose``
did before), "reused" is ``HFSampler.choose`` (two ``[rows, V]`` float64 buffers kept across steps).
Prints ms per step (best and median of the rounds) and checks that both choose the same ids.
"""
import argparse
import statistics
import time

import torch

from agentrl.engines.hf.sampler import HFSampler
from agentrl.record import SamplingSpec
from agentrl.sampling import draw, processed_logp


def fresh(logits, spec, gens):
    lp = processed_logp(logits, spec)
    u = torch.stack([torch.rand((), dtype=torch.float64, generator=g) for g in gens])
    ids = draw(lp.exp(), u)
    return ids, lp.gather(-1, ids[:, None]).squeeze(-1)


def measure(rows: int = 32, vocab: int = 151669, steps: int = 40, rounds: int = 5) -> dict:
    """ms per step of both ways (lists over rounds); raises AssertionError if they choose differently."""
    torch.set_num_threads(1)
    spec = SamplingSpec()
    sampler = HFSampler.__new__(HFSampler)          # choose() needs only the spec and its buffers
    sampler.spec, sampler._buffers = spec, None
    logits = [torch.randn(rows, vocab) * 3 for _ in range(4)]
    times = {'fresh': [], 'reused': []}
    for _ in range(rounds):
        for name, fn in (('fresh', lambda x, g: fresh(x, spec, g)), ('reused', lambda x, g: sampler.choose(x, g))):
            gens = [torch.Generator().manual_seed(r) for r in range(rows)]
            t0 = time.perf_counter()
            out = [fn(logits[i % 4], gens) for i in range(steps)]
            times[name].append((time.perf_counter() - t0) / steps * 1e3)
            if name == 'fresh':
                ref = out
            else:
                assert all(torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]) for a, b in zip(ref, out))
    return times


def run(quick: bool) -> list[dict]:
    """Rows for bench/run.py."""
    t = measure(steps=10 if quick else 40, rounds=3 if quick else 5)
    f, r = statistics.median(t['fresh']), statistics.median(t['reused'])
    note = '32 rows x 151,669 entries, median ms per step, same ids and log-probs'
    return [{'name': 'hf_choose_fresh_ms', 'value': round(f, 1), 'unit': 'ms', 'notes': note},
            {'name': 'hf_choose_reused_ms', 'value': round(r, 1), 'unit': 'ms', 'notes': note},
            {'name': 'hf_choose_speedup', 'value': round(f / r, 2), 'unit': 'x', 'notes': 'fresh / reused'}]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument('--rows', type=int, default=32)
    ap.add_argument('--vocab', type=int, default=151669)
    ap.add_argument('--steps', type=int, default=40)
    ap.add_argument('--rounds', type=int, default=5)
    args = ap.parse_args()
    times = measure(args.rows, args.vocab, args.steps, args.rounds)
    for name, ts in times.items():
        print(f'{name:7s} best {min(ts):7.1f} ms/step  median {statistics.median(ts):7.1f} ms/step')
    print(f'fresh / reused (medians): {statistics.median(times["fresh"]) / statistics.median(times["reused"]):.2f}x; '
          f'same ids and log-probs: yes')


if __name__ == '__main__':
    main()
