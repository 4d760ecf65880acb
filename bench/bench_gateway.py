"""The recording gateway's own cost per call (``agentrl serve``), side by side with the engine it fronts.

Run by hand (results go to bench/RESULTS.md)::

    PYTHONPATH=src .venv/bin/python bench/bench_gateway.py [--engines inproc,process] [--sessions 32] [--turns 4]
        [--long 200] [--repeats 3] [--json OUT] [--variants httptools/asyncio,h11/asyncio,httptools/uvloop]

One process serves the gateway (uvicorn in a thread, ``Gateway`` over ``make_test_model``'s tiny Qwen3
with the real tokenizer, ``--no-conformance``), once per engine: ``inproc`` (``HFEngine`` in the
gateway's process) and ``process`` (``HFProcessEngine``: the same sampler in a child process over a
pipe). The clients are another process (aiohttp), so client work does not count as gateway work. The
engine's own span is ``Sample.span`` (measured where it samples: in the gateway's process, or in the
child), keyed by the call's seed.

Per call: ``gateway cost = client latency - (engine end - dispatch)``, where dispatch is the
journal's ``t0`` (the end of planning on the state thread): everything the gateway adds (HTTP,
JSON, planning, state-thread queueing, the pipe to a child engine, the fsync'd journal line, the
response) and nothing the engine spends or queues for (the HF engine samples one call at a time).

1. ``--sessions`` sessions at once, ``--turns`` turns each (8 new tokens a turn): p50/p99 of the
   gateway cost, next to the same calls made directly on the engine (same prompts, budgets, seeds);
   once per ``--variants`` uvicorn ``HTTP/LOOP`` pair, each on a fresh gateway over the same engine.
   Then, side by side, the same calls (the journalled prompt ids, budgets and seeds, the same sessions
   and concurrency, the same client) on a **bare engine server**: uvicorn + Starlette, one route
   that takes prompt ids and answers the sampled ids and log-probs, over the same engine called the
   same way (one engine thread). Its cost, measured
   the same way, is what HTTP and the client cost on this machine; ``gateway_over_bare`` is what
   recording adds to serving the engine over HTTP at all. ``--rounds`` alternates the two.
2. ``--repeats`` turn sweeps (``--long`` 0: skipped), each on a fresh gateway: one session per length
   10, 50 and ``--long``, advanced untimed to 5 turns short of it, then 5 timed calls of each session
   round-robin (4 new tokens a turn, a short tool result after each), so a drift of the machine's load
   hits every length alike: the median gateway cost per length, the log-log slope, and the same for a
   full re-render of the conversation (``template.render`` + ``encode``), the cost a gateway that
   re-tokenizes the history every call would pay.
3. The floor: p50/p99 of one fsync'd 2 KB line in the run folder (every call waits for one), back to
   back and 70 ms apart (the engine's pace, ``fsync_spaced_ms``).
"""
from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def client_main(url: str, sessions: int, turns: int, max_tokens: int, prefix: str, ids: bool) -> None:
    """The load (second process): prints one JSON line ``[{seed, latency}]``."""
    import aiohttp
    out = []

    async def one(http, k: int):
        async with http.post(f'{url}/sessions', json={'rollout_id': f'{prefix}{k}'}) as r:
            sess = await r.json()
        msgs = [{'role': 'user', 'content': f'Fix clamp, episode {k}.'}]
        for t in range(turns):
            seed = k * 100000 + t
            data = json.dumps({'messages': msgs, 'seed': seed, 'max_tokens': max_tokens, 'return_token_ids': ids})
            t0 = time.perf_counter()                  # the client's own JSON work is outside the timed span
            async with http.post(sess['base_url'] + '/chat/completions', data=data,
                                 headers={'Content-Type': 'application/json'}) as r:
                raw = await r.read()
            out.append({'seed': seed, 'latency': time.perf_counter() - t0, 'turn': t})
            resp = json.loads(raw)
            assert r.status == 200, resp
            msgs = msgs + [resp['choices'][0]['message'], {'role': 'tool', 'content': f'ok {t}'}]
        async with http.post(f'{url}/sessions/{sess["token"]}/finish', json={'reward': 1.0}) as r:
            await r.read()

    async def go():
        conn = aiohttp.TCPConnector(limit=0)
        async with aiohttp.ClientSession(connector=conn, timeout=aiohttp.ClientTimeout(total=None)) as http:
            await asyncio.gather(*(one(http, k) for k in range(sessions)))
    asyncio.run(go())
    print(json.dumps(out))


def client_sweep(url: str, lengths: list, timed: int, prefix: str) -> None:
    """The turn sweep's load: one session per length n, each advanced to ``n - timed`` turns untimed, then
    ``timed`` calls of every session round-robin (so load drift hits every length alike); prints
    ``[{seed, latency, n, turn}]``."""
    import aiohttp

    async def go():
        conn = aiohttp.TCPConnector(limit=0)
        async with aiohttp.ClientSession(connector=conn, timeout=aiohttp.ClientTimeout(total=None)) as http:
            sess, msgs = {}, {}
            for n in lengths:
                async with http.post(f'{url}/sessions', json={'rollout_id': f'{prefix}-{n}'}) as r:
                    sess[n] = await r.json()
                msgs[n] = [{'role': 'user', 'content': f'Fix clamp, {n} turns.'}]

            async def call(n, t, timed_call):
                seed = hash((prefix, n, t)) & ((1 << 62) - 1)
                data = json.dumps({'messages': msgs[n], 'seed': seed, 'max_tokens': 4})
                t0 = time.perf_counter()
                async with http.post(sess[n]['base_url'] + '/chat/completions', data=data,
                                     headers={'Content-Type': 'application/json'}) as r:
                    raw = await r.read()
                lat = time.perf_counter() - t0
                resp = json.loads(raw)
                assert r.status == 200, resp
                msgs[n] = msgs[n] + [resp['choices'][0]['message'], {'role': 'tool', 'content': f'ok {t}'}]
                return {'seed': seed, 'latency': lat, 'n': n, 'turn': t} if timed_call else None
            for n in lengths:
                for t in range(n - timed):
                    await call(n, t, False)
            out = []
            for k in range(timed):
                for n in lengths:
                    out.append(await call(n, n - timed + k, True))
            print(json.dumps(out))
    asyncio.run(go())


def _pct(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, max(0, math.ceil(q * len(xs)) - 1))]


def _slope(points):
    lx = [math.log(x) for x, _ in points]
    ly = [math.log(y) for _, y in points]
    mx, my = sum(lx) / len(lx), sum(ly) / len(ly)
    return sum((a - mx) * (b - my) for a, b in zip(lx, ly)) / sum((a - mx) ** 2 for a in lx)


def _sweep(url, lengths, timed, prefix):
    env = dict(os.environ, PYTHONPATH=str(ROOT / 'src'))
    out = subprocess.run([sys.executable, __file__, '--sweep', url, ','.join(map(str, lengths)), str(timed), prefix],
                         capture_output=True, text=True, env=env, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def _load(url, sessions, turns, max_tokens, prefix, ids=False):
    env = dict(os.environ, PYTHONPATH=str(ROOT / 'src'))
    out = subprocess.run([sys.executable, __file__, '--client', url, str(sessions), str(turns), str(max_tokens),
                          prefix, '1' if ids else ''], capture_output=True, text=True, env=env, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def _timed(up):
    """Note each ``sample``'s engine span (``TurnResult.span``: the engine's own start and end) by seed."""
    up.spans, orig = {}, up.sample

    def sample(*a, **k):
        s = orig(*a, **k)
        up.spans[int(s.seed)] = s.span
        return s
    up.sample = sample
    return up


def client_bare(url: str, path: str) -> None:
    """The bare server's load: the sessions of ``path`` (JSON ``[[call body, ...], ...]``) at once, each
    session's calls in turn; prints ``[{seed, latency}]``."""
    import aiohttp
    sessions, out = json.loads(Path(path).read_text()), []

    async def one(http, calls):
        for body in calls:
            data = json.dumps(body)
            t0 = time.perf_counter()
            async with http.post(f'{url}/generate', data=data, headers={'Content-Type': 'application/json'}) as r:
                raw = await r.read()
            out.append({'seed': body['seed'], 'latency': time.perf_counter() - t0})
            assert r.status == 200, raw
            json.loads(raw)

    async def go():
        conn = aiohttp.TCPConnector(limit=0)
        async with aiohttp.ClientSession(connector=conn, timeout=aiohttp.ClientTimeout(total=None)) as http:
            await asyncio.gather(*(one(http, c) for c in sessions))
    asyncio.run(go())
    print(json.dumps(out))


def _bare_server(up, stop_ids):
    """The baseline: ``up`` behind uvicorn + Starlette with one route, ``POST /generate`` ``{prompt_token_ids,
    spec, max_tokens, seed}`` -> ``{ids, logp}`` (what an engine server without recording does). Returns
    ``(uvicorn server, url, dispatch times by seed)``."""
    from concurrent.futures import ThreadPoolExecutor

    import uvicorn
    from starlette.applications import Starlette
    from starlette.responses import Response
    from starlette.routing import Route

    from agentrl.gateway.server import bind
    from agentrl.record import SamplingSpec
    pool, dispatch = ThreadPoolExecutor(max_workers=1), {}

    async def generate(request):
        b = json.loads(await request.body())
        args = (b['prompt_token_ids'], SamplingSpec.from_dict(b['spec']), b['max_tokens'], b['seed'], stop_ids)
        dispatch[b['seed']] = time.time()
        s = await asyncio.get_running_loop().run_in_executor(pool, up.sample, *args)
        return Response(json.dumps({'ids': s.ids, 'logp': s.logp}), media_type='application/json')
    sock = bind()
    srv = uvicorn.Server(uvicorn.Config(Starlette(routes=[Route('/generate', generate, methods=['POST'])]),
                                        log_level='warning', access_log=False))
    import threading
    threading.Thread(target=srv.run, kwargs={'sockets': [sock]}, daemon=True).start()
    while not srv.started:
        time.sleep(0.02)
    return srv, f'http://127.0.0.1:{sock.getsockname()[1]}', dispatch


def _bare(up, journal: dict, calls: list, stop_ids, tmp: Path) -> list:
    """The same calls as the gateway's (sessions, order, prompt ids, budgets, seeds) on the bare server:
    each call's cost = latency - (engine end - dispatch), as for the gateway."""
    by = {}
    for c in calls:
        e = journal[c['seed']]
        by.setdefault(e['sid'], []).append({'prompt_token_ids': e['response']['prompt_token_ids'],
                                            'spec': e['req']['spec'], 'max_tokens': e['max_tokens'],
                                            'seed': e['seed']})
    path = tmp / 'bare-calls.json'
    path.write_text(json.dumps(list(by.values())))
    srv, url, dispatch = _bare_server(up, stop_ids)
    try:
        env = dict(os.environ, PYTHONPATH=str(ROOT / 'src'))
        out = subprocess.run([sys.executable, __file__, '--bare', url, str(path)], capture_output=True, text=True,
                             env=env, check=True)
    finally:
        srv.should_exit = True
    got = json.loads(out.stdout.strip().splitlines()[-1])
    return [c['latency'] - (up.spans[c['seed']][1] - dispatch[c['seed']]) for c in got]


def _engine(kind: str, model):
    from agentrl.engines.hf.engine import HFEngine
    from agentrl.engines.hf.process import HFProcessEngine
    if kind == 'process':
        return _timed(HFProcessEngine(model, device='cpu', max_new_tokens=8, threads=1))
    return _timed(HFEngine(model, device='cpu', max_new_tokens=8))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    ap.add_argument('--sessions', type=int, default=32)
    ap.add_argument('--turns', type=int, default=4)
    ap.add_argument('--long', type=int, default=200)
    ap.add_argument('--repeats', type=int, default=3, help='turn sweeps per engine (each on fresh sessions)')
    ap.add_argument('--rounds', type=int, default=3,
                    help='phase 1 rounds per engine, each the gateway then the bare server (fresh sessions)')
    ap.add_argument('--json', default=None)
    ap.add_argument('--engines', default='inproc,process',
                    help='inproc (HFEngine in the gateway process) and/or process (HFProcessEngine, a child)')
    ap.add_argument('--variants', default='httptools/asyncio',
                    help='uvicorn HTTP/LOOP pairs for phase 1, run one after the other on the same engine')
    ap.add_argument('--switch-interval', type=float, default=None,
                    help='sys.setswitchinterval in the gateway process')
    a = ap.parse_args(argv)
    if a.switch_interval:
        sys.setswitchinterval(a.switch_interval)
    import torch
    torch.set_num_threads(1)
    from agentrl.engines import hf
    rows = {}
    with tempfile.TemporaryDirectory() as tmp:
        from agentrl.templates.loading import find_tokenizer_dir     # $AGENTRL_TOKENIZERS, ../shared, the hub
        model = hf.make_test_model(Path(tmp) / 'm', find_tokenizer_dir('qwen3'), max_positions=1 << 15)
        for kind in a.engines.split(','):
            up = _engine(kind, model)
            try:
                for r in range(a.rounds):
                    for k, variant in enumerate(a.variants.split(',')):      # uvicorn parser/loop, same engine
                        row = dict(_concurrent(up, Path(tmp) / f'run-{kind}-{k}-{r}', variant, a.sessions, a.turns),
                                   engine=kind, round=r)
                        rows.setdefault('concurrent', []).append(row)
                        print(json.dumps(row), flush=True)
                mine = [x for x in rows['concurrent'] if x['engine'] == kind]
                med = {k: round(statistics.median(x[k] for x in mine), 3) for k in
                       ('gateway_cost_ms_p50', 'bare_server_cost_ms_p50', 'gateway_over_bare_ms_p50')}
                rows.setdefault('concurrent_median', {})[kind] = med
                print(json.dumps({'engine': kind, 'median_over_rounds': med}), flush=True)
                if a.long > 0:
                    for r in range(a.repeats):
                        row = dict(_length(up, Path(tmp) / f'run-{kind}-long-{r}', a.long), engine=kind, repeat=r)
                        rows.setdefault('length', []).append(row)
                        print(json.dumps(row), flush=True)
            finally:
                if hasattr(up, 'close'):
                    up.close()
        rows['fsync_ms'] = _fsync_probe(Path(tmp) / 'fsync-probe', 50, 0.0)
        rows['fsync_spaced_ms'] = _fsync_probe(Path(tmp) / 'fsync-probe-spaced', 60, 0.07)   # the engine's pace
        print(json.dumps({'fsync_ms': rows['fsync_ms'], 'fsync_spaced_ms': rows['fsync_spaced_ms']}), flush=True)
    return _finish(rows, a.json)


def _fsync_probe(path: Path, n: int, gap: float) -> dict:
    """p50/p99 ms of ``n`` fsync'd 2 KB lines appended to ``path``, ``gap`` seconds apart."""
    ts = []
    with open(path, 'ab') as f:
        for _ in range(n):
            time.sleep(gap)
            t0 = time.perf_counter()
            f.write(b'x' * 2048 + b'\n')
            f.flush()
            os.fsync(f.fileno())
            ts.append(time.perf_counter() - t0)
    return {'p50': round(1e3 * _pct(ts, 0.5), 3), 'p99': round(1e3 * _pct(ts, 0.99), 3)}


def _length(up, run: Path, long: int, timed: int = 5) -> dict:
    """Phase 2 on a fresh gateway: the gateway cost at 10, 50 and ``long`` turns (median of ``timed`` calls each,
    interleaved), the log-log slope, and a full re-render of the same histories."""
    from agentrl.gateway import Gateway, read_journal
    from agentrl.gateway.server import Server
    lengths = [10, 50, long]
    gw = Gateway(up, run, conformance=False)
    srv = Server(gw).start()
    try:
        calls = _sweep(srv.url, lengths, timed, run.name)
    finally:
        srv.stop()
    journal, last = {}, {}
    for e in read_journal(run / 'journal.jsonl'):
        if e['ev'] == 'call':                          # the journal keeps each call's new messages only
            last[e['sid']] = e['msgs'] = last.get(e['sid'], [])[:e['req']['prefix']] + e['req']['messages']
            journal[e['seed']] = e
    tmpl = gw.template(None)
    pts, rer = [], []
    for n in lengths:
        sel = [c for c in calls if c['n'] == n]
        pts.append((n, statistics.median(c['latency'] - (up.spans[c['seed']][1] - journal[c['seed']]['t0'])
                                         for c in sel)))
        msgs = journal[sel[-1]['seed']]['msgs']
        rs = []
        for _ in range(5):
            t0 = time.perf_counter()
            tmpl.encode(tmpl.render(msgs, True))
            rs.append(time.perf_counter() - t0)
        rer.append((n, statistics.median(rs)))
    return {'turns': lengths, 'gateway_cost_ms': [round(1e3 * y, 3) for _, y in pts], 'slope': round(_slope(pts), 3),
            'full_rerender_ms': [round(1e3 * y, 3) for _, y in rer], 'full_rerender_slope': round(_slope(rer), 3)}


def _finish(rows, path):
    if path:
        Path(path).write_text(json.dumps(rows, indent=2) + '\n')
    return 0


def _concurrent(up, run: Path, variant: str, sessions: int, turns: int) -> dict:
    """Phase 1 on a fresh gateway whose uvicorn runs ``variant`` = ``HTTP/LOOP`` (``h11/asyncio``, ``httptools/uvloop``).

    ``gateway_cost`` = latency - (engine end - dispatch): the engine's time and its queue are not the
    gateway's. ``engine_in_gateway`` - ``engine_direct`` is the engine's slowdown inside the gateway (the
    CPU and GIL time the gateway's threads take from it); ``gateway_cost_plus_engine_slowdown`` adds it.
    """
    from agentrl.gateway import Gateway, read_journal
    from agentrl.gateway.server import Server
    from agentrl.record import SamplingSpec
    http, loop = variant.split('/')
    gw = Gateway(up, run, conformance=False)
    srv = Server(gw)
    srv.server.config.http, srv.server.config.loop = http, loop
    srv.start()
    try:
        _load(srv.url, 2, 2, 8, f'warm-{variant}')                          # warm-up (imports, first forward)
        calls = _load(srv.url, sessions, turns, 8, f'c-{variant}', ids=True)
    finally:
        srv.stop()
    journal = {e['seed']: e for e in read_journal(run / 'journal.jsonl') if e['ev'] == 'call'}
    cost = [c['latency'] - (up.spans[c['seed']][1] - journal[c['seed']]['t0']) for c in calls]
    engine_in = [up.spans[c['seed']][1] - up.spans[c['seed']][0] for c in calls]
    queue = [up.spans[c['seed']][0] - journal[c['seed']]['t0'] for c in calls]
    stop = gw.template(None).stop_ids
    bare = _bare(up, journal, calls, stop, run)
    direct = []
    for c in calls:                                                             # the same calls, straight to the engine
        e = journal[c['seed']]
        t0 = time.perf_counter()
        up.sample(e['response']['prompt_token_ids'], SamplingSpec.from_dict(e['req']['spec']), e['max_tokens'],
                  e['seed'], stop)
        direct.append(time.perf_counter() - t0)
    slow = _pct(engine_in, 0.5) - _pct(direct, 0.5)
    return {'variant': variant, 'sessions': sessions, 'calls': len(calls), 'http': srv.server.config.http_protocol_class.__name__,
            'loop': loop,
            'gateway_cost_ms_p50': 1e3 * _pct(cost, 0.5), 'gateway_cost_ms_p99': 1e3 * _pct(cost, 0.99),
            'bare_server_cost_ms_p50': 1e3 * _pct(bare, 0.5), 'bare_server_cost_ms_p99': 1e3 * _pct(bare, 0.99),
            'gateway_over_bare_ms_p50': 1e3 * (_pct(cost, 0.5) - _pct(bare, 0.5)),
            'latency_ms_p50': 1e3 * _pct([c['latency'] for c in calls], 0.5),
            'engine_queue_ms_p50': 1e3 * _pct(queue, 0.5),
            'engine_in_gateway_ms_p50': 1e3 * _pct(engine_in, 0.5), 'engine_direct_ms_p50': 1e3 * _pct(direct, 0.5),
            'gateway_cost_plus_engine_slowdown_ms_p50': 1e3 * (_pct(cost, 0.5) + slow)}


if __name__ == '__main__':
    if len(sys.argv) > 1 and sys.argv[1] == '--sweep':
        client_sweep(sys.argv[2], [int(x) for x in sys.argv[3].split(',')], int(sys.argv[4]), sys.argv[5])
    elif len(sys.argv) > 1 and sys.argv[1] == '--bare':
        client_bare(sys.argv[2], sys.argv[3])
    elif len(sys.argv) > 1 and sys.argv[1] == '--client':
        client_main(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]), sys.argv[6], bool(sys.argv[7]))
    else:
        sys.exit(main())
