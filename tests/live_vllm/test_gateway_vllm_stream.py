"""``stream: true`` through agentrl serve in front of a real vLLM CPU server (conftest's, one per test session):
the upstream streams ``/v1/completions`` chunk by chunk, and the streamed turn is the unstreamed one bit for bit.

``pytest -s -k latency`` prints the first-delta and whole-turn latencies that docs/gateway.md#streaming quotes.
"""
import json
import os
import signal
import struct
import threading
import time

import pytest

pytest.importorskip('starlette')
pytest.importorskip('uvicorn')
openai = pytest.importorskip('openai')
try:
    import httpx2 as httpx
except ImportError:
    httpx = pytest.importorskip('httpx')

from agentrl import store  # noqa: E402
from agentrl.engines.vllm import ServerDied, VLLMError  # noqa: E402
from agentrl.engines.contract import TurnRequest  # noqa: E402
from agentrl.engines.vllm.engine import VLLMEngine  # noqa: E402
from agentrl.gateway import Gateway, read_journal  # noqa: E402
from agentrl.gateway.server import Server  # noqa: E402
from agentrl.engines.vllm.engine import complete_ids, stream_ids  # noqa: E402
from agentrl.gym import TOOL_SCHEMAS  # noqa: E402
from agentrl.record import SamplingSpec  # noqa: E402
from agentrl.templates import ChatRecorder  # noqa: E402
from agentrl.templates.chat import function_tools  # noqa: E402

H = httpx.Client(timeout=300)
TOOLS = function_tools(TOOL_SCHEMAS)
USER = [{'role': 'user', 'content': 'Fix clamp.'}]
SPEC = SamplingSpec(temperature=0.9, top_p=0.95)


def f32(x: float) -> float:
    return struct.unpack('f', struct.pack('f', x))[0]


@pytest.fixture(scope='module')
def upstream(server, model_dir):
    return VLLMEngine([server.url], model_dir, max_new_tokens=48, concurrency=8)


@pytest.fixture(scope='module')
def run_dir(tmp_path_factory):
    return tmp_path_factory.mktemp('gw-vllm-stream') / 'run'


@pytest.fixture(scope='module')
def gateway(upstream, run_dir):
    srv = Server(Gateway(upstream, run_dir)).start()
    yield srv
    srv.stop()


@pytest.fixture(scope='module')
def prompt(gateway):
    template = gateway.gateway.template(TOOLS)
    return ChatRecorder(template, USER, history='sampled').prompt_ids, template.stop_ids


@pytest.fixture(scope='module')
def long_seeds(upstream, prompt):
    """``{seed: TurnResult}`` of the first 3 seeds whose unstreamed 24-token turn has 16+ tokens (the test model
    often samples ``<|im_end|>`` early)."""
    ids, stops = prompt
    found = {}
    for seed in range(200):
        s = upstream.sample(TurnRequest(ids, SPEC, 24, seed, stops))
        if len(s.ids) >= 16:
            found[seed] = s
            if len(found) == 3:
                return found
    pytest.fail(f'only {len(found)} of 200 seeds give a 16+ token turn')


def test_streamed_sample_is_the_unstreamed_sample_bit_for_bit(upstream, server, prompt, long_seeds):
    ids, stops = prompt
    for seed, whole in long_seeds.items():
        seen = []
        streamed = upstream.sample(TurnRequest(ids, SPEC, 24, seed, stops, on_token=seen.append))
        assert streamed == whole                              # ids, float logp bit for bit, truncated, seed, server
        assert whole.truncated == (whole.ids[-1] not in stops) and whole.server == server.url
        assert len(seen) > 1 and seen[-1] == whole.ids        # more than one chunk
        assert all(whole.ids[:len(s)] == s for s in seen) and len({len(s) for s in seen}) == len(seen)


def test_a_turn_that_stops_on_a_stop_id_streams_the_same_stop(upstream, prompt, long_seeds):
    ids, stops = prompt
    seed, whole = next(iter(long_seeds.items()))
    stop = whole.ids[5]                                       # a token this seed samples: a stop id now
    k = whole.ids.index(stop)
    body = upstream.body(ids, SPEC, 24, seed, stops | {stop}, upstream.urls[0])
    a, seen = complete_ids(upstream.urls[0], body), []
    b = stream_ids(upstream.urls[0], body, seen.append)
    assert a == b and a['ids'] == whole.ids[:k + 1] and (a['finish_reason'], a['stop_reason']) == ('stop', stop)
    s = upstream.sample(TurnRequest(ids, SPEC, 24, seed, stops | {stop}, on_token=lambda _: None))
    assert (s.ids, s.logp, s.truncated) == (whole.ids[:k + 1], whole.logp[:k + 1], False)


def _stream(client, kw, on_delta=lambda: None):
    """One streamed SDK call: (content, reasoning, calls, finish chunk, the text received before each delta chunk);
    ``on_delta()`` is called at each delta chunk."""
    content, reasoning, calls, arrivals, last = '', '', {}, [], None
    for p in client.chat.completions.create(stream=True, **kw):
        if not p.choices:
            continue
        d = p.choices[0].delta
        if p.choices[0].finish_reason is None and (d.content or d.model_extra.get('reasoning_content')
                                                   or d.tool_calls):
            arrivals.append(len(content) + len(reasoning))
            on_delta()
        content += d.content or ''
        reasoning += d.model_extra.get('reasoning_content') or ''
        for t in d.tool_calls or ():
            e = calls.setdefault(t.index, ['', '', ''])
            e[0] += t.id or ''
            e[1] += t.function.name or ''
            e[2] += t.function.arguments or ''
        last = p.choices[0]
    return content, reasoning, [tuple(e) for _, e in sorted(calls.items())], last, arrivals


def _session(gateway, rollout_id):
    sess = H.post(gateway.url + '/sessions', json={'rollout_id': rollout_id, 'task': 'clamp'}).json()
    return sess, openai.OpenAI(api_key='unused', base_url=sess['base_url'])


def _finish(gateway, sess):
    assert H.post(f'{gateway.url}/sessions/{sess["token"]}/finish', json={'reward': 1.0}).json()['records'] == 1


def _record(run_dir, sid):
    [t] = [t for t in store.read_trajectories(run_dir / 'trajectories') if t.info['gateway']['session'] == sid]
    return t


@pytest.mark.parametrize('k', [0, 1])
def test_sdk_stream_equals_the_message_byte_for_byte_and_records_match(gateway, upstream, run_dir, long_seeds, k,
                                                                       monkeypatch):
    """The streamed turn equals the unstreamed one; a delta reaches the client before the upstream turn ends
    (the upstream's ``sample`` does not return until the client got one, at most 600 s: order, not timing)."""
    seed = list(long_seeds)[k]
    kw = dict(model='policy', messages=USER, tools=TOOLS, seed=seed, max_tokens=24, temperature=0.9, top_p=0.95,
              logprobs=True, extra_body={'return_token_ids': True})
    sa, ca = _session(gateway, f'whole-{seed}')
    t0 = time.time()
    r = ca.chat.completions.create(**kw).choices[0]
    whole_s = time.time() - t0
    sb, cb = _session(gateway, f'stream-{seed}')
    got_delta, held, real = threading.Event(), [], upstream.sample

    def sample(request, *a, **k):
        s = real(request, *a, **k)
        held.append(got_delta.wait(600))
        return s
    monkeypatch.setattr(upstream, 'sample', sample)
    t0 = time.time()
    content, reasoning, calls, last, arrivals = _stream(cb, kw, got_delta.set)
    stream_s = time.time() - t0
    monkeypatch.setattr(upstream, 'sample', real)
    m = r.message
    assert content == (m.content or '') and reasoning == (m.model_extra.get('reasoning_content') or '')
    assert calls == [(t.id, t.function.name, t.function.arguments) for t in m.tool_calls or ()]
    assert last.finish_reason == r.finish_reason and last.model_extra['token_ids'] == r.model_extra['token_ids']
    assert r.model_extra['token_ids'] == long_seeds[seed].ids      # the gateway's prompt is the fixture's
    assert held == [True] and len(arrivals) > 1          # a delta reached the client before the upstream turn ended
    print(f'\nseed {seed}: {len(r.model_extra["token_ids"])} tokens, {len(arrivals)} delta chunks; streamed turn '
          f'{stream_s:.3f} s, unstreamed turn {whole_s:.3f} s')
    _finish(gateway, sa)
    _finish(gateway, sb)
    ta, tb = _record(run_dir, sa['session']), _record(run_dir, sb['session'])
    assert ta.ids.tolist() == tb.ids.tolist() and ta.action_mask.tolist() == tb.action_mask.tolist()
    assert ta.sample_logp.tolist() == tb.sample_logp.tolist()
    mask, lp = tb.action_mask.tolist(), tb.sample_logp.tolist()
    assert [lp[j] for j in range(len(mask)) if mask[j]] == [f32(c.logprob) for c in r.logprobs.content]


def test_latency_first_delta_vs_whole_turn(upstream, prompt, long_seeds):
    """The numbers docs/gateway.md#streaming quotes (``pytest -s -k latency``, printed, not asserted: they depend on
    the machine's load): the 16-24-token turns streamed. Asserted: ``on_token`` sees growing prefixes of the turn."""
    ids, stops = prompt
    first, whole, chunks, tokens = [], [], [], []
    for seed, ref in long_seeds.items():
        t0, seen = time.time(), []
        s = upstream.sample(TurnRequest(ids, SPEC, 24, seed, stops, on_token=lambda x: seen.append((time.time() - t0, len(x)))))
        whole.append(time.time() - t0)
        first.append(seen[0][0])
        chunks.append(len(seen))
        tokens.append(len(s.ids))
        assert s == ref
        lengths = [n for _, n in seen]
        assert lengths == sorted(set(lengths)) and lengths[-1] == len(s.ids)
    print(f'\nvLLM upstream streamed: tokens {tokens}, chunks {chunks}, first chunk {[round(x, 3) for x in first]} s, '
          f'whole turn {[round(x, 3) for x in whole]} s')


def test_dropped_stream_still_completes_and_is_undelivered(gateway, run_dir, long_seeds):
    sess, _ = _session(gateway, 'dropped')
    seed, ref = next(iter(long_seeds.items()))
    with H.stream('POST', sess['base_url'] + '/chat/completions',
                  json={'messages': USER, 'tools': TOOLS, 'stream': True, 'max_tokens': 24, 'seed': seed,
                        'temperature': 0.9, 'top_p': 0.95}) as r:
        assert r.status_code == 200
        next(r.iter_raw())
    for _ in range(6000):
        journal = read_journal(run_dir / 'journal.jsonl')
        if any(e['ev'] == 'undelivered' and e['sid'] == sess['session'] for e in journal):
            break
        time.sleep(0.05)
    calls = [e for e in read_journal(run_dir / 'journal.jsonl') if e['ev'] == 'call' and e['sid'] == sess['session']]
    assert len(calls) == 1 and calls[0]['ids'] == ref.ids              # sampled to its end though dropped
    out = H.post(f'{gateway.url}/sessions/{sess["token"]}/finish', json={}).json()
    assert out['records'] == 0


def test_check_replays_the_streamed_records(gateway, run_dir, model_dir, capsys):
    sess, c = _session(gateway, 'check-stream')
    kw = dict(model='policy', messages=list(USER), tools=TOOLS, seed=21, max_tokens=24)
    _, _, _, last, _ = _stream(c, kw)
    assert last.finish_reason in ('stop', 'length', 'tool_calls')
    _finish(gateway, sess)
    from agentrl.cli.main import main
    assert main(['check', str(run_dir), '--model', str(model_dir), '--max-ratio-dev', '1e-4']) == 0, \
        capsys.readouterr()


def test_stream_errors_are_one_line(upstream, server, prompt):
    ids, stops = prompt
    url = upstream.urls[0]
    with pytest.raises(VLLMError, match=rf'^vllm server {url}: /v1/completions answered HTTP 400: .*maximum'):
        upstream.sample(TurnRequest([ids[0]] * 3000, SPEC, 4, 1, stops, on_token=lambda _: None))
    body = upstream.body(ids, SPEC, 8, 1, stops, url)
    dead = 'http://127.0.0.1:9'
    with pytest.raises(ServerDied, match=rf'^vllm server {dead} died mid-run \(ConnectError: .*refused'):
        stream_ids(dead, body, lambda _: None)


def test_a_server_that_stops_answering_mid_stream_is_server_died(upstream, server, prompt, long_seeds):
    """The server is stopped (SIGSTOP) after its first chunk: the read times out; SIGCONT resumes it."""
    ids, stops = prompt
    url, seen = upstream.urls[0], []

    def stop_it(x):
        seen.append(x)
        if len(seen) == 1:
            os.killpg(server.pid, signal.SIGSTOP)
    try:
        with pytest.raises(ServerDied, match=rf'^vllm server {url} died mid-run \(ReadTimeout mid-stream: '):
            stream_ids(url, upstream.body(ids, SPEC, 24, next(iter(long_seeds)), stops, url), stop_it, timeout=3)
    finally:
        os.killpg(server.pid, signal.SIGCONT)
    assert len(seen) == 1
    assert upstream.sample(TurnRequest(ids, SPEC, 4, 1, stops, on_token=lambda _: None)).ids    # answering again


def test_sse_parser_reads_the_bytes_the_server_streamed(upstream, prompt):
    """The captured stream as lines: the same Completion as the unstreamed answer (tests/test_vllm_stream_sse.py
    checks a fixture of such bytes without a server)."""
    from agentrl.engines.vllm.client import parse_stream
    ids, stops = prompt
    url = upstream.urls[0]
    body = upstream.body(ids, SPEC, 16, 5, stops, url)
    seen = []
    got = stream_ids(url, body, seen.append)
    raw = b''.join(_raw_lines(url, body))
    c = parse_stream(url, raw.splitlines(keepends=True), ids)
    assert (c.ids, c.logp, c.finish_reason) == (got['ids'], got['logp'], got['finish_reason'])
    events = [json.loads(x[5:]) for x in raw.split(b'\n\n') if x.startswith(b'data: {')]
    assert events[0]['choices'][0]['prompt_token_ids'] == ids and 'usage' in events[-1]
    assert all(e['choices'][0].get('prompt_token_ids') is None for e in events[1:-1])


def _raw_lines(url, body):
    """The streamed body's bytes, read by the client library itself (not agentrl's reader)."""
    from agentrl.engines.vllm.client import stream_body
    with httpx.stream('POST', f'{url}/v1/completions', json=stream_body(body), timeout=300) as r:
        return [r.read()]
