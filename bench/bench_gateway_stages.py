"""Where a gateway call's time goes, stage by stage, with the design's alternatives side by side (issue 23).

Run by hand (results go to bench/RESULTS.md, "The gateway's hand-offs")::

    PYTHONPATH=src .venv/bin/python bench/bench_gateway_stages.py [--engine process|inproc]
        [--variants current,state-thread] [--rounds 4] [--sessions 32] [--turns 4]

The load is ``bench_gateway.py``'s phase 1 (``--sessions`` sessions at once, ``--turns`` turns of up to 8
tokens, an aiohttp client in another process), on a fresh gateway per round and variant, the variants
alternating round by round. The gateway's methods are wrapped to note epoch times per call (by seed):

    client->serve   the client's send to the start of the call's serving (HTTP in, body, parse_request)
    serve->plan     to the start of ``Gateway.prepare`` (a hand-off to the state thread, or none)
    plan            ``Gateway.prepare``
    engine end->ret the engine's own end (``TurnResult.span``) to the sample reaching the gateway's code
    ret->complete   to the start of ``Gateway.complete``
    complete        ``Gateway.complete`` (decode, parse, the fsync'd journal line, apply)
    complete->resp  to the call's return to the HTTP handler
    resp->client    the response JSON, HTTP out, the client's read
    cost            latency - (engine end - plan end), as ``bench_gateway.py``

Variants: ``current`` (as shipped); ``state-thread`` (every change of state handed to the state thread,
the design before 2026-12-02).
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
STAGES = ['client->serve', 'serve->plan', 'plan', 'engine end->ret', 'ret->complete', 'complete', 'complete->resp',
          'resp->client', 'cost']


def client(url: str, sessions: int, turns: int) -> None:
    """The load (second process): prints ``[{seed, c0, c1}]`` (epoch seconds around each call)."""
    import aiohttp
    out = []

    async def one(http, k):
        async with http.post(f'{url}/sessions', json={'rollout_id': f'r{k}'}) as r:
            sess = await r.json()
        msgs = [{'role': 'user', 'content': f'Fix clamp, episode {k}.'}]
        for t in range(turns):
            seed = k * 100000 + t
            data = json.dumps({'messages': msgs, 'seed': seed, 'max_tokens': 8, 'return_token_ids': True})
            c0 = time.time()
            async with http.post(sess['base_url'] + '/chat/completions', data=data,
                                 headers={'Content-Type': 'application/json'}) as r:
                raw = await r.read()
            out.append({'seed': seed, 'c0': c0, 'c1': time.time()})
            msgs = msgs + [json.loads(raw)['choices'][0]['message'], {'role': 'tool', 'content': f'ok {t}'}]
        async with http.post(f'{url}/sessions/{sess["token"]}/finish', json={'reward': 1.0}) as r:
            await r.read()

    async def go():
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as http:
            await asyncio.gather(*(one(http, k) for k in range(sessions)))
    asyncio.run(go())
    print(json.dumps(out))


def _instrument(up, T: dict):
    """Wrap the gateway's steps to note times in ``T[seed]``; returns the variant switch."""
    from agentrl.gateway import app, service
    prep, comp, serve = service.Gateway.prepare, service.Gateway.complete, app._Routes.serve_call

    def prepare(self, s, req, *a):
        t = time.time()
        p = prep(self, s, req, *a)
        T.setdefault(req.seed, {}).update(p0=t, p1=time.time())
        return p

    def complete(self, p, sample):
        t = time.time()
        r = comp(self, p, sample)
        T[p.req.seed].update(q0=t, q1=time.time())
        return r

    async def serve_call(self, s, req, *a, **k):
        T.setdefault(req.seed, {})['h1'] = time.time()
        r = await serve(self, s, req, *a, **k)
        T[req.seed]['h2'] = time.time()
        return r
    service.Gateway.prepare, service.Gateway.complete, app._Routes.serve_call = prepare, complete, serve_call
    sync, current_work = up.sample, app._Routes.work

    def sample(*a, **k):
        s = sync(*a, **k)
        T.setdefault(int(s.seed), {}).update(span=s.span, ret=time.time())
        return s

    async def state_thread_work(self, fn, *args, inline=True):
        return await asyncio.get_running_loop().run_in_executor(self.gw.pool, fn, *args)
    up.sample = sample

    def variant(name: str) -> None:
        app._Routes.work = state_thread_work if name == 'state-thread' else current_work
    return variant


def _stages(calls: list, T: dict) -> list:
    rows = []
    for c in calls:
        t = T[c['seed']]
        e1 = t['span'][1]
        rows.append(dict(zip(STAGES, (t['h1'] - c['c0'], t['p0'] - t['h1'], t['p1'] - t['p0'], t['ret'] - e1,
                                      t['q0'] - t['ret'], t['q1'] - t['q0'], t['h2'] - t['q1'], c['c1'] - t['h2'],
                                      (c['c1'] - c['c0']) - (e1 - t['p1'])))))
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    ap.add_argument('--engine', default='process', choices=['process', 'inproc'])
    ap.add_argument('--variants', default='current,state-thread')
    ap.add_argument('--rounds', type=int, default=4)
    ap.add_argument('--sessions', type=int, default=32)
    ap.add_argument('--turns', type=int, default=4)
    a = ap.parse_args(argv)
    import torch
    torch.set_num_threads(1)
    from agentrl.engines import hf
    from agentrl.engines.hf.engine import HFEngine
    from agentrl.engines.hf.process import HFProcessEngine
    from agentrl.gateway import Gateway
    from agentrl.gateway.server import Server
    from agentrl.templates.loading import find_tokenizer_dir
    variants = a.variants.split(',')
    T, res = {}, {v: [] for v in variants}
    with tempfile.TemporaryDirectory() as tmp:
        model = hf.make_test_model(Path(tmp) / 'm', find_tokenizer_dir('qwen3'), max_positions=1 << 15)
        up = HFProcessEngine(model, device='cpu', max_new_tokens=8, threads=1) if a.engine == 'process' else \
            HFEngine(model, device='cpu', max_new_tokens=8)
        use = _instrument(up, T)
        try:
            for k, v in enumerate(['current'] + [v for _ in range(a.rounds) for v in variants]):
                use(v)
                srv = Server(Gateway(up, Path(tmp) / f'run-{k}', conformance=False)).start()
                try:
                    env = dict(os.environ, PYTHONPATH=str(ROOT / 'src'))
                    n = a.sessions if k else 2                      # the first run warms up
                    out = subprocess.run([sys.executable, __file__, '--client', srv.url, str(n), str(a.turns)],
                                         capture_output=True, text=True, env=env, check=True)
                finally:
                    srv.stop()
                if k:
                    rows = _stages(json.loads(out.stdout.strip().splitlines()[-1]), T)
                    res[v].append({s: 1e3 * statistics.median(r[s] for r in rows) for s in STAGES})
                    print(json.dumps({'variant': v, 'p50_ms': {s: round(x, 3) for s, x in res[v][-1].items()}}),
                          flush=True)
        finally:
            if hasattr(up, 'close'):
                up.close()
    print(f'\n{a.engine} engine, {a.sessions} sessions x {a.turns} turns: median over {a.rounds} rounds of each '
          'round\'s p50 (ms)')
    print('| stage | ' + ' | '.join(variants) + ' |\n|---|' + '---|' * len(variants))
    for s in STAGES:
        print(f'| {s} | ' + ' | '.join(f'{statistics.median(r[s] for r in res[v]):.3f}' for v in variants) + ' |')
    return 0


if __name__ == '__main__':
    if len(sys.argv) > 1 and sys.argv[1] == '--client':
        client(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
    else:
        sys.exit(main())
