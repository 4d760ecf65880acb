"""The gateway in each dialect vs vLLM's own chat endpoint, side by side on ONE vLLM server, in one run.

Run by hand (it starts a vLLM CPU server; results go to bench/RESULTS.md)::

    PYTHONPATH=src .venv/bin/python bench/bench_dialects.py [--quick] [--repeats 3] [--json OUT]
        [--omp-cpus 1] [--server-cpus none] [--gateway-cpus none] [--python .venv-vllm/bin/python]

One vLLM server (``VLLMServer`` with ``tools``: hermes tool parser, so its own chat endpoint takes
``tools``) serves ``make_test_model``'s tiny Qwen3 (head_dim 32, real tokenizer, random init:
every reply is 16 tokens). One ``agentrl serve`` gateway (``Gateway`` over ``VLLMEngine``, conformance
on, as ``agentrl serve`` runs) in this process fronts it. The load is another process (aiohttp), a
harness that re-sends the whole history each turn: ``--turns`` turns per session, the tool schemas
of ``agentrl.gym`` in every request, 16-token replies, each reply echoed as it came back followed by
a tool result (a ``tool`` message / ``tool_result`` block / ``function_call_output`` item). Targets:

    vllm        the server's own ``/v1/chat/completions`` (it renders and tokenizes the history)
    vllm+logprobs  the same with ``logprobs: true`` (the sampled token's log-prob, as the gateway asks of the
                server for every call): what recording costs the server itself, without the gateway
    chat        the gateway's ``/s/T/v1/chat/completions``
    anthropic   the gateway's ``/s/T/v1/messages``
    responses   the gateway's ``/s/T/v1/responses`` (``store: false``, the full input each turn)

Scenarios: ``first`` (8 sessions of 2 turns, one after another: a session's first call vs its second
with nothing else running), ``s1`` / ``s8`` (1 and 8 sessions at once, ``--turns`` turns), ``long8``
(8 sessions at once, ``--long-turns`` turns over a history that grows from about 4k to 8k tokens: a
3,300-word first message, 100-word tool results). Every scenario runs all five targets back to back,
the order rotated per repeat, so a drift of the machine's load hits every target alike. Per cell:
calls/s (calls / wall time from the first call's send to the last call's answer; sessions are
opened before and finished after), the median first- and second-call latency of the sessions and
the median over sessions of (first - second). The table holds medians over repeats and each
target's calls/s ratio to ``vllm`` (the ratio within each repeat, then their median). Inside the
gateway, ``Gateway.prepare`` + ``Gateway.complete`` (``state``) and ``Gateway.sample`` (``engine``: the
vLLM request) are timed per call, first call vs later ones.

CPUs (2-core machine shared with other jobs: compare ratios within a run, not absolute numbers across
runs): the vLLM engine's compute threads on ``--omp-cpus`` (default core 1); its API server, the gateway
and the client wherever the OS puts them (``--server-cpus`` / ``--gateway-cpus`` pin them).
``--quick``: 1 repeat of ``first`` (4 sessions), ``s1`` and ``s8`` at 6 turns, no ``long8`` (< 3 min with
the server's start).
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
TARGETS = ('vllm', 'vllm+logprobs', 'chat', 'anthropic', 'responses')
WORDS = ('clamp value lower upper bound returns the input when it lies inside the range otherwise the nearest '
         'edge of that range test file passes fails assertion line number traceback').split()


def run(quick: bool) -> list[dict]:
    """Rows for bench/run.py: skipped (it starts a vLLM server; run this file by hand)."""
    return [{'name': 'dialects', 'value': None, 'unit': '', 'notes': 'skipped: starts a vLLM server; run '
             'bench/bench_dialects.py by hand (results in bench/RESULTS.md)'}]


def text(n_words: int, salt: int) -> str:
    """Deterministic filler of ``n_words`` words (about 1.2 tokens each with Qwen3's tokenizer)."""
    return ' '.join(WORDS[(salt * 7 + i * 13 + i // 5) % len(WORDS)] for i in range(n_words))


# ---------------------------------------------------------------------------------------------- the client
def _strip(m: dict) -> dict:
    return {k: v for k, v in m.items() if v not in (None, [], '') or k == 'content'}


class Conversation:
    """One session's history in one target's wire format; ``body()`` the next request, ``add()`` the answer."""

    def __init__(self, target: str, cell: dict, k: int):
        self.target, self.cell, self.k = target, cell, k
        user = f'Fix clamp, episode {k}. ' + text(cell['first_words'], k)
        tools = cell['tools']
        if target == 'anthropic':
            self.tools = [{'name': t['function']['name'], 'description': t['function'].get('description', ''),
                           'input_schema': t['function']['parameters']} for t in tools]
            self.msgs = [{'role': 'user', 'content': user}]
        elif target == 'responses':
            self.tools = [{'type': 'function', 'name': t['function']['name'],
                           'description': t['function'].get('description', ''),
                           'parameters': t['function']['parameters']} for t in tools]
            self.msgs = [{'type': 'message', 'role': 'user', 'content': [{'type': 'input_text', 'text': user}]}]
        else:
            self.tools, self.msgs = tools, [{'role': 'user', 'content': user}]

    def body(self, t: int) -> dict:
        seed = self.k * 1000 + t
        if self.target == 'anthropic':
            return {'model': 'tiny', 'max_tokens': 16, 'messages': self.msgs, 'tools': self.tools, 'temperature': 1.0}
        if self.target == 'responses':
            return {'model': 'tiny', 'input': self.msgs, 'tools': self.tools, 'max_output_tokens': 16,
                    'temperature': 1.0, 'store': False, 'include': ['reasoning.encrypted_content']}
        body = {'model': 'tiny', 'messages': self.msgs, 'tools': self.tools, 'max_tokens': 16, 'temperature': 1.0,
                'seed': seed}
        if self.target == 'vllm+logprobs':
            body.update(logprobs=True, top_logprobs=0)
        return body

    def add(self, t: int, resp: dict) -> int:
        """Echo the reply and append the tool result; returns the reply's completion tokens."""
        obs = f'ok {t}: ' + text(self.cell['obs_words'], self.k * 31 + t)
        if self.target == 'anthropic':
            self.msgs = self.msgs + [{'role': 'assistant', 'content': resp['content']},
                                     {'role': 'user', 'content': [{'type': 'tool_result', 'tool_use_id': f'toolu_{t}',
                                                                   'content': obs}]}]
            return resp['usage']['output_tokens']
        if self.target == 'responses':
            self.msgs = self.msgs + resp['output'] + [{'type': 'function_call_output', 'call_id': f'call_{t}',
                                                       'output': obs}]
            return resp['usage']['output_tokens']
        self.msgs = self.msgs + [_strip(resp['choices'][0]['message']),
                                 {'role': 'tool', 'tool_call_id': f'call_{t}', 'content': obs}]
        return resp['usage']['completion_tokens']


def client_main(spec_path: str) -> None:
    """The load (second process): runs every cell of the schedule in order; prints one JSON line of results."""
    import aiohttp
    spec = json.loads(Path(spec_path).read_text())
    path = {'vllm': '/v1/chat/completions', 'vllm+logprobs': '/v1/chat/completions', 'chat': '/chat/completions',
            'chat-nofsync': '/chat/completions', 'anthropic': '/messages', 'responses': '/responses'}

    async def cell_run(http, cell: dict) -> dict:
        target, n = cell['target'], cell['sessions']
        gateway = spec['gateway_urls'].get(target, spec['gateway_urls']['*'])
        sess = []
        for k in range(n):                                          # opened before the clock starts
            if target.startswith('vllm'):
                sess.append({'base_url': spec['vllm_url']})
            else:
                async with http.post(gateway + '/sessions', json={'rollout_id': f'{cell["tag"]}-{k}'}) as r:
                    sess.append(await r.json())
        lat = [[None] * cell['turns'] for _ in range(n)]
        toks = []

        async def one(k):
            conv = Conversation(target, cell, k)
            url = sess[k]['base_url'] + path[target]
            for t in range(cell['turns']):
                data = json.dumps(conv.body(t))
                t0 = time.perf_counter()
                async with http.post(url, data=data, headers={'Content-Type': 'application/json'}) as r:
                    raw = await r.read()
                lat[k][t] = time.perf_counter() - t0
                if r.status != 200:
                    raise RuntimeError(f'{target} turn {t}: HTTP {r.status} {raw[:400]!r}')
                toks.append(conv.add(t, json.loads(raw)))
        w0 = time.perf_counter()
        if cell.get('serial'):
            for k in range(n):
                await one(k)
        else:
            await asyncio.gather(*(one(k) for k in range(n)))
        wall = time.perf_counter() - w0
        if not target.startswith('vllm'):
            for s in sess:
                async with http.post(f'{gateway}/sessions/{s["token"]}/finish', json={'reward': 1.0}) as r:
                    await r.read()
        return {'target': target, 'scenario': cell['scenario'], 'repeat': cell['repeat'], 'sessions': n,
                'turns': cell['turns'], 'calls': n * cell['turns'], 'wall_s': wall,
                'calls_per_s': n * cell['turns'] / wall,
                'first_ms': 1e3 * statistics.median(x[0] for x in lat),
                'second_ms': 1e3 * statistics.median(x[1] for x in lat),
                'later_ms': 1e3 * statistics.median(y for x in lat for y in x[1:]),
                'first_minus_second_ms': 1e3 * statistics.median(x[0] - x[1] for x in lat),
                'reply_tokens_mean': sum(toks) / len(toks)}

    async def go():
        out = []
        conn = aiohttp.TCPConnector(limit=0)
        async with aiohttp.ClientSession(connector=conn, timeout=aiohttp.ClientTimeout(total=None)) as http:
            for cell in spec['cells']:
                out.append(await cell_run(http, cell))
                print(json.dumps({k: round(v, 3) if isinstance(v, float) else v for k, v in out[-1].items()}),
                      file=sys.stderr, flush=True)
        return out
    print(json.dumps(asyncio.run(go())))


# ---------------------------------------------------------------------------------------------- the run
def scenarios(quick: bool, turns: int, long_turns: int) -> list[dict]:
    """The scenarios: (name, sessions, turns, words in the first message, words per tool result)."""
    out = [dict(scenario='first', sessions=4 if quick else 8, turns=2, first_words=8, obs_words=6, serial=True),
           dict(scenario='s1', sessions=1, turns=turns, first_words=8, obs_words=6),
           dict(scenario='s8', sessions=8, turns=turns, first_words=8, obs_words=6)]
    if long_turns:
        # ~3300 words ~ 4k tokens first, ~100 words per result: ~4k -> ~8k tokens over 30 turns
        out.append(dict(scenario='long8', sessions=8, turns=long_turns, first_words=3300, obs_words=100))
    return out


def schedule(scen: list, repeats: int, tools: list, targets=TARGETS) -> list:
    cells = []
    for r in range(repeats):
        order = targets[r % len(targets):] + targets[:r % len(targets)]     # rotated per repeat
        for sc in scen:
            for tg in order:
                cells.append(dict(sc, target=tg, repeat=r, tools=tools, tag=f'{sc["scenario"]}-{tg}-{r}'))
    return cells


def summarize(rows: list) -> dict:
    """Medians over repeats per (scenario, target), and per-repeat calls/s ratios to vllm (median)."""
    out = {}
    for sc in dict.fromkeys(r['scenario'] for r in rows):
        base = {r['repeat']: r['calls_per_s'] for r in rows if r['scenario'] == sc and r['target'] == 'vllm'}
        for tg in dict.fromkeys(r['target'] for r in rows):
            mine = [r for r in rows if r['scenario'] == sc and r['target'] == tg]
            if not mine:
                continue
            med = {k: statistics.median(r[k] for r in mine) for k in
                   ('calls_per_s', 'first_ms', 'second_ms', 'later_ms', 'reply_tokens_mean')}
            med['first_minus_second_ms'] = statistics.median(r['first_minus_second_ms'] for r in mine)
            med['ratio_to_vllm'] = statistics.median(r['calls_per_s'] / base[r['repeat']] for r in mine
                                                     if r['repeat'] in base)
            med['ratios'] = [round(r['calls_per_s'] / base[r['repeat']], 3) for r in mine if r['repeat'] in base]
            med['sessions'], med['turns'], med['repeats'] = mine[0]['sessions'], mine[0]['turns'], len(mine)
            out[f'{sc}/{tg}'] = med
    return out


def _time_state_changes(gw, out: list) -> list:
    """Wrap ``gw.prepare`` / ``gw.complete`` / ``gw.sample`` to note ``(rollout_id, call index, seconds, what)``."""
    prepare, complete, sample = gw.prepare, gw.complete, gw.sample

    def timed_prepare(session, req, *a):
        t0, n = time.perf_counter(), len(session.calls)
        p = prepare(session, req, *a)
        out.append((session.identity['rollout_id'], n, time.perf_counter() - t0, 'state'))
        return p

    def timed_sample(p, *a):
        t0, n = time.perf_counter(), len(p.session.calls)
        r = sample(p, *a)
        out.append((p.session.identity['rollout_id'], n, time.perf_counter() - t0, 'engine'))
        return r

    def timed_complete(p, sample):
        t0, n = time.perf_counter(), len(p.session.calls)
        r = complete(p, sample)
        out.append((p.session.identity['rollout_id'], n, time.perf_counter() - t0, 'state'))
        return r
    gw.prepare, gw.complete, gw.sample = timed_prepare, timed_complete, timed_sample
    return out


def state_summary(stages: list) -> dict:
    """Per scenario/dialect: the median over sessions of prepare + complete (``state``) and of the engine call
    (``engine``: ``Gateway.sample``, the vLLM request) of the first call and of the later ones, ms."""
    per = {}
    for rid, n, dt, what in stages:
        parts = rid.split('-')                  # SCENARIO-TARGET-REPEAT-K (targets may hold '-')
        sc, tg = parts[0], '-'.join(parts[1:-2])
        if sc != 'warm':
            calls = per.setdefault((sc, tg, what), {}).setdefault(rid, {})
            calls[n] = calls.get(n, 0.0) + dt
    out = {}
    for (sc, tg, what), sess in per.items():
        first = [c[0] for c in sess.values() if 0 in c]
        later = [v for c in sess.values() for n, v in c.items() if n > 0]
        if first and later:
            out.setdefault(f'{sc}/{tg}', {}).update({f'{what}_first': 1e3 * statistics.median(first),
                                                     f'{what}_later': 1e3 * statistics.median(later)})
    return out


def table(summary: dict) -> str:
    lines = ['| scenario | target | calls/s | x vLLM (per-repeat ratios) | first call ms | second call ms | '
             'first - second ms | reply tokens |', '|---|---|---|---|---|---|---|---|']
    for key, m in summary.items():
        sc, tg = key.split('/')
        lines.append(f'| {sc} ({m["sessions"]} sess x {m["turns"]} turns) | {tg} | {m["calls_per_s"]:.2f} | '
                     f'**{m["ratio_to_vllm"]:.2f}** ({", ".join(map(str, m["ratios"]))}) | {m["first_ms"]:.1f} | '
                     f'{m["second_ms"]:.1f} | {m["first_minus_second_ms"]:+.1f} | {m["reply_tokens_mean"]:.1f} |')
    return '\n'.join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    ap.add_argument('--quick', action='store_true', help='1 repeat, 6 turns, no long8 (< 3 min)')
    ap.add_argument('--repeats', type=int, default=3)
    ap.add_argument('--turns', type=int, default=10)
    ap.add_argument('--long-turns', type=int, default=30, help='turns of the long scenario (0: skip it)')
    ap.add_argument('--omp-cpus', default='1', help="the vLLM engine's compute threads (VLLM_CPU_OMP_THREADS_BIND)")
    ap.add_argument('--server-cpus', default='none', help='taskset of the whole vLLM server (its API server too)')
    ap.add_argument('--gateway-cpus', default='none', help='affinity of this process (the gateway)')
    ap.add_argument('--python', default=None, help='vLLM venv python (default .venv-vllm/bin/python)')
    ap.add_argument('--scenarios', default='first,s1,s8,long8', help='which scenarios to run (comma-separated)')
    ap.add_argument('--no-conformance', action='store_true')
    ap.add_argument('--nofsync-variant', action='store_true',
                    help='a diagnostic 6th target: chat on a second gateway whose journal lines are not fsynced')
    ap.add_argument('--json', default=None)
    a = ap.parse_args(argv)
    if a.quick:
        a.repeats, a.turns, a.long_turns = 1, 6, 0
    cpus = None if a.server_cpus == 'none' else a.server_cpus
    os.environ['VLLM_CPU_OMP_THREADS_BIND'] = a.omp_cpus
    from agentrl.engines import hf
    from agentrl.engines.vllm import VLLMServer, VLLMServerOptions
    from agentrl.engines.vllm.engine import VLLMEngine
    from agentrl.gateway import Gateway
    from agentrl.gateway.server import Server
    from agentrl.gym import TOOL_SCHEMAS
    from agentrl.templates.loading import find_tokenizer_dir
    from agentrl.templates.messages import function_tools
    python = Path(a.python or os.environ.get('AGENTRL_VLLM_PYTHON') or ROOT / '.venv-vllm' / 'bin' / 'python')
    if not python.is_file():
        python = Path('/work/main/.venv-vllm/bin/python')
    ctx = 10240 if a.long_turns else 2048
    res = {'argv': sys.argv[1:], 'load_before': os.getloadavg()}
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        model = hf.make_test_model(tmp / 'm', find_tokenizer_dir('qwen3'), hidden=64, heads=2, kv_heads=1,
                                   end_of_turn_rate=None, max_positions=ctx)
        opts = VLLMServerOptions(name='tiny', cpus=cpus, max_model_len=ctx, max_num_seqs=32, tools=True,
                                 ready_timeout=900)
        t0 = time.time()
        with VLLMServer(model, opts, python=python, log_path=tmp / 'server.log') as srv:
            res['server_start_s'] = round(time.time() - t0, 1)
            if a.gateway_cpus != 'none':
                os.sched_setaffinity(0, {int(c) for c in a.gateway_cpus.split(',')})
            up = VLLMEngine([srv.url], model, max_new_tokens=16, concurrency=64)
            gw = Gateway(up, tmp / 'run', conformance=not a.no_conformance)
            stages = _time_state_changes(gw, [])
            gsrv = Server(gw).start()
            try:
                tools = function_tools(TOOL_SCHEMAS)
                warm = [dict(sc, turns=2, sessions=2, scenario='warm') for sc in scenarios(True, 2, 0)[:1]]
                chosen = [sc for sc in scenarios(a.quick, a.turns, a.long_turns)
                          if sc['scenario'] in a.scenarios.split(',')]
                targets = TARGETS + (('chat-nofsync',) if a.nofsync_variant else ())
                cells = schedule(warm, 1, tools, targets) + schedule(chosen, a.repeats, tools, targets)
                for c in cells[:len(targets)]:
                    c['repeat'] = -1                                   # warm-up: not summarized
                spec = tmp / 'spec.json'
                urls = {'*': gsrv.url}
                if a.nofsync_variant:
                    gw2 = Gateway(up, tmp / 'run-nofsync', conformance=not a.no_conformance)
                    _time_state_changes(gw2, stages)
                    append = gw2.journal.append
                    gw2.journal.append = lambda event, sync=True: append(event, False)
                    gsrv2 = Server(gw2).start()
                    urls['chat-nofsync'] = gsrv2.url
                spec.write_text(json.dumps({'vllm_url': srv.url, 'gateway_urls': urls, 'cells': cells}))
                env = dict(os.environ, PYTHONPATH=str(ROOT / 'src'))
                out = subprocess.run([sys.executable, __file__, '--client', str(spec)], stdout=subprocess.PIPE,
                                     text=True, env=env, check=True)
            finally:
                gsrv.stop()
                if a.nofsync_variant:
                    gsrv2.stop()
    rows = [r for r in json.loads(out.stdout.strip().splitlines()[-1]) if r['repeat'] >= 0]
    res.update(rows=rows, summary=summarize(rows), load_after=os.getloadavg(), state_ms=state_summary(stages))
    print(f'\nload average before / after: {res["load_before"][0]:.1f} / {res["load_after"][0]:.1f}; '
          f'vLLM server start {res["server_start_s"]} s')
    print(table(res['summary']))
    print('\nInside the gateway (ms, median over sessions and repeats), a session\'s first call vs its later calls: '
          'planning + completion (Gateway.prepare + Gateway.complete) and the engine call (Gateway.sample)')
    print('| scenario | dialect | state first | state later | state first - later | engine first | engine later |\n'
          '|---|---|---|---|---|---|---|')
    for key, m in res['state_ms'].items():
        print(f'| {key.split("/")[0]} | {key.split("/")[1]} | {m["state_first"]:.2f} | {m["state_later"]:.2f} | '
              f'{m["state_first"] - m["state_later"]:+.2f} | {m["engine_first"]:.1f} | {m["engine_later"]:.1f} |')
    if a.json:
        Path(a.json).write_text(json.dumps(res, indent=2) + '\n')
    return 0


if __name__ == '__main__':
    if len(sys.argv) > 2 and sys.argv[1] == '--client':
        client_main(sys.argv[2])
    else:
        sys.exit(main())
