"""The gateway's hand-offs: a change of state runs on the event loop while the state thread is idle, and a JSON
reply is one sized body.

``_Routes.work`` runs a change of state on the loop only when the state thread holds nothing; else it
queues behind what the state thread holds, so every change stays serial and in order. A non-streaming
reply carries its `content-length` (no chunked framing); a stream stays chunked.
"""
import asyncio
import threading
import time
import types
from concurrent.futures import ThreadPoolExecutor

import pytest

pytest.importorskip('starlette')
from agentrl.gateway.app import _Routes  # noqa: E402


def test_work_runs_on_the_loop_only_while_the_state_thread_is_idle():
    pool = ThreadPoolExecutor(max_workers=1)
    r = _Routes(types.SimpleNamespace(pool=pool), '', 0.0, None, 1.0)
    order = []

    async def go():
        loop_thread = threading.get_ident()

        def slow():
            time.sleep(0.2)
            order.append(('slow', threading.get_ident() == loop_thread))

        def fast(tag):
            order.append((tag, threading.get_ident() == loop_thread))
            return tag
        held = asyncio.ensure_future(r.work(slow, inline=False))
        await asyncio.sleep(0)                       # the slow job is on the state thread now
        assert r.queued == 1
        assert await r.work(fast, 'behind') == 'behind'
        await held
        assert r.queued == 0
        assert await r.work(fast, 'idle') == 'idle'
    try:
        asyncio.run(go())
    finally:
        pool.shutdown()
    assert order == [('slow', False), ('behind', False), ('idle', True)]


def test_a_json_reply_is_one_sized_body_and_a_stream_stays_chunked(tmp_path):
    pytest.importorskip('transformers')
    pytest.importorskip('uvicorn')
    try:                   # openai >= 3 ships httpx2; older versions use httpx
        import httpx2 as httpx
    except ImportError:
        httpx = pytest.importorskip('httpx')
    from _tokenizers import tokenizer_path
    from agentrl.engines import hf
    from agentrl.engines.hf.engine import HFEngine
    from agentrl.gateway import Gateway
    from agentrl.gateway.server import Server
    model = hf.make_test_model(tmp_path / 'm', tokenizer_path('qwen3'))
    srv = Server(Gateway(HFEngine(model, device='cpu', max_new_tokens=4), tmp_path / 'run', conformance=False))
    srv.start()
    try:
        base = httpx.post(srv.url + '/sessions', json={}, timeout=120).json()['base_url']
        body = {'messages': [{'role': 'user', 'content': 'hi'}], 'seed': 1, 'max_tokens': 4}
        r = httpx.post(base + '/chat/completions', json=body, timeout=120)
        assert r.status_code == 200 and r.headers['content-type'] == 'application/json'
        assert r.headers['content-length'] == str(len(r.content)) and 'transfer-encoding' not in r.headers
        assert r.json()['choices'][0]['message']['role'] == 'assistant'
        body['messages'] += [r.json()['choices'][0]['message'], {'role': 'user', 'content': 'again'}]
        s = httpx.post(base + '/chat/completions', json=dict(body, stream=True), timeout=120)
        assert s.status_code == 200 and s.headers['content-type'].startswith('text/event-stream')
        assert s.headers['transfer-encoding'] == 'chunked' and 'content-length' not in s.headers
        assert s.text.endswith('data: [DONE]\n\n')
    finally:
        srv.stop()
