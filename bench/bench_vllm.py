"""agentrl's cost over raw vLLM, and ``--engine vllm`` vs ``--engine hf`` on the same model and core (issue 22).

Run by hand (it starts a vLLM CPU server, minutes on a loaded machine)::

    .venv/bin/python bench/bench_vllm.py [--episodes 32] [--turns 4] [--new-tokens 32] [--cpus 1]

1. Overhead: ``bugfix_server_rollouts`` on N BugFix episodes (template, recorder, gym, records) vs the
   very same token-id request bodies replayed straight at the same server (each episode's turns in
   order, episodes concurrent, the same concurrency). Prefix caching is on (vLLM's default), so
   the first run warms it; the rounds alternate agentrl, raw, agentrl, raw and the best of each
   after the warm-up is kept. Goal: agentrl / raw <= 1.15 (wall).
2. Engines: the same episodes with :func:`agentrl.jobs.bugfix.bugfix_rollouts` (one batch, one
   torch thread) pinned to the server's core, episodes/s both ways; tokens prefilled per episode on
   the vLLM side (``vllm:prefix_cache_queries`` minus ``vllm:prefix_cache_hits`` from ``/metrics``)
   vs the record length.

Model: ``make_test_model(layers=8, hidden=512, heads=8, kv_heads=4)`` (head_dim 64), float32.
``bench/run.py`` gets one skipped row: the numbers are in bench/RESULTS.md with the command.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def run(quick: bool) -> list[dict]:
    """Rows for bench/run.py: skipped (it needs a vLLM server; run this file by hand)."""
    return [{'name': 'vllm', 'value': None, 'unit': '', 'notes': 'skipped: starts a vLLM server; run '
             'bench/bench_vllm.py by hand (results in bench/RESULTS.md)'}]


def metrics(url: str) -> dict:
    """The prefix-cache counters of the server (tokens)."""
    text = urllib.request.urlopen(url + '/metrics', timeout=30).read().decode()
    out = {}
    for name in ('prefix_cache_queries', 'prefix_cache_hits', 'prompt_tokens', 'generation_tokens'):
        vals = [float(m.group(1)) for m in re.finditer(rf'^vllm:{name}_total\{{[^}}]*\}} (\S+)$', text, re.M)]
        out[name] = sum(vals)
    return out


async def raw_replay(url: str, bodies_by_episode: list, concurrency: int) -> float:
    """Send each episode's recorded bodies in turn order (episodes concurrent); wall seconds.

    The bodies are sent as they are (JSON-encoded again per request, as any client would)."""
    from agentrl.engines.vllm import client
    gate = asyncio.Semaphore(concurrency)

    async def episode(bodies):
        for b in bodies:
            async with gate:
                await client.complete(http, url, b)
    t0 = time.perf_counter()
    async with client.session(limit=concurrency) as http:
        await asyncio.gather(*[episode(b) for b in bodies_by_episode])
    return time.perf_counter() - t0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    ap.add_argument('--episodes', type=int, default=32)
    ap.add_argument('--turns', type=int, default=4)
    ap.add_argument('--new-tokens', type=int, default=32)
    ap.add_argument('--cpus', default='1', help='core of the server and of the hf run (default 1)')
    ap.add_argument('--python', default=None, help='vLLM venv python (default .venv-vllm/bin/python)')
    ap.add_argument('--model', default=None, help='model folder (default: build the 8-layer test model)')
    ap.add_argument('--rounds', type=int, default=2, help='timed rounds of each side after the warm-up')
    ap.add_argument('--no-hf', action='store_true')
    a = ap.parse_args(argv)
    import torch

    import agentrl as arl
    from agentrl.engines import hf
    from agentrl.engines.vllm import VLLMServer, VLLMServerOptions, check_logp_mode
    from agentrl.jobs.bugfix import BugFixOptions, bugfix_rollouts, bugfix_server_rollouts, bugfix_template
    from agentrl.record import SamplingSpec
    sys.path.insert(0, str(ROOT / 'tests'))
    from _tokenizers import tokenizer_path
    torch.set_num_threads(1)
    tmp = Path(tempfile.mkdtemp(prefix='bench-vllm-'))
    model_dir = a.model or str(hf.make_test_model(tmp / 'm8', tokenizer_path('qwen3'), layers=8, hidden=512, heads=8,
                                                  kv_heads=4))
    tasks = (arl.make_tasks('all') * ((a.episodes + 29) // 30))[:a.episodes]
    seeds = list(range(1000, 1000 + a.episodes))
    spec = SamplingSpec()
    res: dict = {'episodes': a.episodes, 'turns': a.turns, 'new_tokens': a.new_tokens, 'model': '8x512 h8 kv4'}
    t0 = time.time()
    with VLLMServer(model_dir, VLLMServerOptions(name='m8', cpus=a.cpus, ready_timeout=900), python=a.python,
                    log_path=tmp / 'server.log') as srv:
        res['server_start_s'] = round(time.time() - t0, 1)
        template = bugfix_template(model_dir)
        ep = [srv.endpoint]
        mode = check_logp_mode(ep, [1, 2, 3])
        agentrl_s, raw_s, recs, before, after, rounds = [], [], None, None, None, []
        for r in range(a.rounds + 1):
            responses: list = []
            m0 = metrics(srv.url)
            t, c = time.perf_counter(), time.process_time()
            recs = bugfix_server_rollouts('vllm', ep, template, tasks, BugFixOptions(spec=spec, max_new_tokens=a.new_tokens, max_turns=a.turns, logp_mode=mode), seeds=seeds, responses=responses)
            dt, cpu = time.perf_counter() - t, time.process_time() - c
            m1 = metrics(srv.url)
            if r == 0:
                before, after = m0, m1            # the cold run: what prefix caching saves from the start
            else:
                agentrl_s.append(dt)
            bodies = [[b for i, _, b, _ in sorted(responses, key=lambda x: (x[0], x[1])) if i == e]
                      for e in range(a.episodes)]
            c = time.process_time()
            raw = asyncio.run(raw_replay(srv.url, bodies, 64))
            raw_cpu = time.process_time() - c
            if r > 0:
                raw_s.append(raw)
            rounds.append({'agentrl_s': round(dt, 2), 'raw_s': round(raw, 2), 'agentrl_client_cpu_s': round(cpu, 2),
                           'raw_client_cpu_s': round(raw_cpu, 2)})
            print(f'round {r}: {rounds[-1]}', flush=True)
    q = after['prefix_cache_queries'] - before['prefix_cache_queries']
    h = after['prefix_cache_hits'] - before['prefix_cache_hits']
    n_req = sum(len(x.info['vllm']['turn_seeds']) for x in recs)
    warm = rounds[1:]
    res.update(rounds=rounds,
               client_cpu_per_episode_ms=round(1000 * min(x['agentrl_client_cpu_s'] for x in warm) / a.episodes, 1),
               raw_client_cpu_per_episode_ms=round(1000 * min(x['raw_client_cpu_s'] for x in warm) / a.episodes, 1),
               overhead_median=round(sorted(x['agentrl_s'] / x['raw_s'] for x in warm)[len(warm) // 2], 3),
               agentrl_s=round(min(agentrl_s), 3), raw_s=round(min(raw_s), 3),
               overhead=round(min(agentrl_s) / min(raw_s), 3), requests=n_req,
               vllm_episodes_per_s=round(a.episodes / min(agentrl_s), 3),
               record_len_mean=round(sum(len(x.ids) for x in recs) / len(recs), 1),
               prompt_tokens_per_episode=round(q / a.episodes, 1),
               prefilled_per_episode=round((q - h) / a.episodes, 1),
               generated_per_episode=round(sum(int(x.action_mask.sum()) for x in recs) / len(recs), 1))
    if not a.no_hf:
        os.sched_setaffinity(0, {int(c) for c in a.cpus.split(',')})
        model, tok = hf.load_model(model_dir)
        t = time.perf_counter()
        hrecs = bugfix_rollouts(model, tok, tasks, BugFixOptions(spec=spec, max_new_tokens=a.new_tokens, max_turns=a.turns, batch_size=a.episodes), seeds=seeds, template=template)
        dt = time.perf_counter() - t
        res.update(hf_s=round(dt, 3), hf_episodes_per_s=round(a.episodes / dt, 3),
                   hf_record_len_mean=round(sum(len(x.ids) for x in hrecs) / len(hrecs), 1),
                   vllm_over_hf=round((a.episodes / min(agentrl_s)) / (a.episodes / dt), 2))
    print(json.dumps(res, indent=2))
    return 0


if __name__ == '__main__':
    sys.exit(main())
