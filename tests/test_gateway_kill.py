"""agentrl serve killed with SIGKILL mid-run and restarted on the same --out: no delivered call lost or doubled.

100 sessions of 2 short turns each run through ``agentrl serve`` (HF engine, the tiny test model)
from 16 client threads; after 80 responses the gateway is killed, restarted on the same folder,
and the clients carry on against the new address, resending a call whose answer never came
with the openai SDK's retry mark (``x-stainless-retry-count``). The records must hold exactly the
responses the clients received, each once.
"""
import json
import os
import signal
import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from _tokenizers import tokenizer_path

pytest.importorskip('transformers')
pytest.importorskip('starlette')
pytest.importorskip('uvicorn')
try:
    import httpx2 as httpx
except ImportError:
    httpx = pytest.importorskip('httpx')

ROOT = Path(__file__).resolve().parents[1]
SESSIONS, TURNS, KILL_AFTER = 100, 2, 80


def _serve(model_dir, out):
    env = dict(os.environ, PYTHONPATH=str(ROOT / 'src'), HF_HUB_OFFLINE='1')
    p = subprocess.Popen([sys.executable, '-m', 'agentrl', 'serve', '--out', str(out), '--model', str(model_dir),
                          '--device', 'cpu', '--max-new-tokens', '2', '--no-conformance', '--max-concurrent', '0'],
                         stdout=subprocess.PIPE, text=True, env=env)
    line = p.stdout.readline()
    assert line.startswith('serving on http://127.0.0.1:'), line
    return p, line.split()[2]


def test_sigkill_mid_run_loses_and_doubles_no_delivered_call(tmp_path):
    from agentrl import store
    from agentrl.engines import hf
    from agentrl.gateway import read_journal
    model_dir = hf.make_test_model(tmp_path / 'm', tokenizer_path('qwen3'))
    out = tmp_path / 'run'
    proc, url = _serve(model_dir, out)
    state = {'url': url, 'received': 0}
    lock, back = threading.Lock(), threading.Event()
    http = httpx.Client(timeout=60)

    def post(path, body, retry=0):
        """POST to the gateway, waiting for the restart when it is down; resends carry the retry mark."""
        while True:
            try:
                r = http.post(state['url'] + path, json=body, headers={'x-stainless-retry-count': str(retry)})
                assert r.status_code in (200, 201), r.text
                return r.json()
            except httpx.TransportError:
                back.wait(60)
                retry += 1

    def session(k):
        sess = post('/sessions', {})
        msgs, got = [{'role': 'user', 'content': f'Fix clamp {k}.'}], []
        for t in range(TURNS):
            r = post(f'/s/{sess["token"]}/v1/chat/completions', {'messages': msgs, 'seed': k * 10 + t,
                                                                  'return_token_ids': True})
            got.append(r['choices'][0]['token_ids'])
            with lock:
                state['received'] += 1
            msgs = msgs + [r['choices'][0]['message'], {'role': 'tool', 'content': f'ok {t}'}]
        return sess, got

    pool = ThreadPoolExecutor(16)
    try:
        futures = [pool.submit(session, k) for k in range(SESSIONS)]
        while state['received'] < KILL_AFTER:
            threading.Event().wait(0.05)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        killed_at = state['received']
        proc, state['url'] = _serve(model_dir, out)
        back.set()
        results = [f.result(timeout=120) for f in futures]
        for sess, _ in results:
            assert post(f'/sessions/{sess["token"]}/finish', {'reward': 1.0})['records'] == 1
    finally:
        pool.shutdown(wait=False, cancel_futures=True)
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)
    assert KILL_AFTER <= killed_at < SESSIONS * TURNS
    by_sid = {}
    for t in store.read_trajectories(out / 'trajectories'):
        by_sid.setdefault(t.info['gateway']['session'], []).append(t)
    calls = [e for e in read_journal(out / 'journal.jsonl') if e['ev'] == 'call']
    assert len(calls) == SESSIONS * TURNS                  # every call sampled once: none lost, none doubled
    for sess, got in results:
        [t] = by_sid[sess['session']]
        ids, mask = t.ids.tolist(), t.action_mask.tolist()
        assert [ids[j + 1] for j in range(len(mask)) if mask[j]] == [i for turn in got for i in turn]
        assert t.info['gateway']['calls'] == list(range(TURNS))
    summary = json.loads((out / 'summary.json').read_text())
    assert summary['calls'] == SESSIONS * TURNS and summary['records'] == SESSIONS
