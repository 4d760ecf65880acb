"""agentrl serve in front of a real vLLM CPU server (conftest's, one per test session): the openai SDK
through the gateway, token-exact records equal to the server's own answers, replay by ``agentrl check``.
"""
import json
import os
import signal
import struct
import subprocess
import sys
import threading
from pathlib import Path

import pytest

pytest.importorskip('starlette')
pytest.importorskip('uvicorn')
openai = pytest.importorskip('openai')
try:
    import httpx2 as httpx
except ImportError:
    httpx = pytest.importorskip('httpx')

from agentrl import store  # noqa: E402
from agentrl.engines.vllm.engine import VLLMEngine  # noqa: E402
from agentrl.gateway import Gateway, read_journal  # noqa: E402
from agentrl.gateway.server import Server  # noqa: E402
from agentrl.engines.vllm.engine import complete_ids  # noqa: E402
from agentrl.gym import TOOL_SCHEMAS  # noqa: E402
from agentrl.record import SamplingSpec  # noqa: E402
from agentrl.templates.chat import function_tools  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
H = httpx.Client(timeout=300)
TOOLS = function_tools(TOOL_SCHEMAS)
USER = [{'role': 'user', 'content': 'Fix clamp.'}]


def f32(x: float) -> float:
    return struct.unpack('f', struct.pack('f', x))[0]


@pytest.fixture(scope='module')
def upstream(server, model_dir):
    return VLLMEngine([server.url], model_dir, max_new_tokens=16, concurrency=8)


@pytest.fixture(scope='module')
def run_dir(tmp_path_factory):
    return tmp_path_factory.mktemp('gw-vllm') / 'run'


@pytest.fixture(scope='module')
def gateway(upstream, run_dir):
    srv = Server(Gateway(upstream, run_dir)).start()
    yield srv
    srv.stop()


def episode(gateway, rollout_id, seed, *, turns=2, stream=False):
    """A two-turn tool conversation through the openai SDK; returns (session, [response token_ids], [logprobs])."""
    sess = H.post(gateway.url + '/sessions', json={'rollout_id': rollout_id, 'task': 'clamp'}).json()
    client = openai.OpenAI(api_key='unused', base_url=sess['base_url'])
    msgs, ids, lps = list(USER), [], []
    for k in range(turns):
        r = client.chat.completions.create(model='policy', messages=msgs, tools=TOOLS, seed=seed + k, max_tokens=12,
                                           temperature=0.9, top_p=0.95, logprobs=True,
                                           extra_body={'return_token_ids': True})
        ch = r.choices[0]
        ids.append(ch.model_extra['token_ids'])
        lps.append([c.logprob for c in ch.logprobs.content])
        msgs += [ch.message.model_dump(exclude_none=True), {'role': 'user', 'content': f'observation {k}'}]
    out = H.post(f'{gateway.url}/sessions/{sess["token"]}/finish', json={'reward': 1.0}).json()
    assert out['records'] == 1, out
    return sess, ids, lps


def record(run_dir, sid):
    [t] = [t for t in store.read_trajectories(run_dir / 'trajectories') if t.info['gateway']['session'] == sid]
    return t


def trained(t):
    ids, mask, lp = t.ids.tolist(), t.action_mask.tolist(), t.sample_logp.tolist()
    return [ids[j + 1] for j in range(len(mask)) if mask[j]], [lp[j] for j in range(len(mask)) if mask[j]]


def test_sdk_chat_with_tools_through_the_gateway_records_the_servers_ids(gateway, run_dir, upstream, server):
    assert upstream.logp_mode == 'processed' and upstream.urls == [server.url]
    sess, ids, lps = episode(gateway, 'sdk-1', 11)
    t = record(run_dir, sess['session'])
    got_ids, got_lp = trained(t)
    assert got_ids == [i for turn in ids for i in turn]
    assert got_lp == [f32(x) for turn in lps for x in turn]
    assert t.provenance.policy == 'vllm' and t.provenance.sampling.logp_mode == 'processed'
    assert (t.provenance.sampling.temperature, t.provenance.sampling.top_p) == (0.9, 0.95)
    assert t.info['gateway']['servers'] == [server.url, server.url]
    assert t.info['gateway']['seeds'] == [11, 12] and t.info['gateway']['calls'] == [0, 1]
    serve = json.loads((run_dir / 'serve.json').read_text())
    assert serve['engine'] == {'policy': 'vllm', 'concurrency': 8, 'servers': [server.url], 'logp_mode': 'processed'}


def test_every_journalled_call_equals_the_servers_answer_to_the_same_body(gateway, run_dir, upstream, server):
    episode(gateway, 'direct-1', 21)
    calls = [e for e in read_journal(run_dir / 'journal.jsonl') if e['ev'] == 'call']
    assert calls
    stop_ids = gateway.gateway.template(TOOLS).stop_ids
    for e in calls:
        body = upstream.body(e['response']['prompt_token_ids'], SamplingSpec.from_dict(e['req']['spec']),
                             e['max_tokens'], e['seed'], stop_ids, server.url)
        assert body['seed'] == e['seed'] and body['stop_token_ids'] == sorted(stop_ids) and body['ignore_eos']
        assert {'temperature', 'top_p', 'top_k', 'min_p', 'repetition_penalty', 'presence_penalty',
                'frequency_penalty', 'n', 'stop', 'logprobs', 'return_token_ids'} <= set(body)
        direct = complete_ids(server.url, body)
        assert direct['ids'] == e['ids'] and direct['logp'] == e['logp'], e['index']
        assert e['response']['choices'][0]['token_ids'] == e['ids']


def test_same_seeds_give_identical_records(gateway, run_dir):
    a, ids_a, _ = episode(gateway, 'seed-a', 31)
    b, ids_b, _ = episode(gateway, 'seed-b', 31)
    ta, tb = record(run_dir, a['session']), record(run_dir, b['session'])
    assert ids_a == ids_b
    assert ta.ids.tolist() == tb.ids.tolist() and ta.action_mask.tolist() == tb.action_mask.tolist()
    assert ta.sample_logp.tolist() == tb.sample_logp.tolist()


def test_sessions_sample_concurrently(gateway, run_dir):
    errors = []

    def one(i):
        try:
            sess = H.post(gateway.url + '/sessions', json={'rollout_id': f'conc-{i}'}).json()
            r = H.post(sess['base_url'] + '/chat/completions', json={'messages': USER, 'seed': i, 'max_tokens': 48})
            assert r.status_code == 200, r.text
        except Exception as e:  # noqa: BLE001
            errors.append(e)
    threads = [threading.Thread(target=one, args=(i,)) for i in range(3)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert not errors
    calls = [e for e in read_journal(run_dir / 'journal.jsonl') if e['ev'] == 'call' and e['req']['max_tokens'] == 48]
    spans = sorted((e['t0'], e['t']) for e in calls)
    assert len(spans) == 3
    assert spans[1][0] < spans[0][1] and spans[2][0] < spans[0][1]      # all dispatched before the first is done


def test_check_replays_the_gateway_records_within_1e4(gateway, run_dir, model_dir, capsys):
    episode(gateway, 'check-1', 41)
    from agentrl.cli.main import main
    assert main(['check', str(run_dir), '--model', str(model_dir), '--max-ratio-dev', '1e-4']) == 0, \
        capsys.readouterr()


def test_cli_serve_with_server_url(server, model_dir, tmp_path):
    out = tmp_path / 'run'
    env = dict(os.environ, PYTHONPATH=str(ROOT / 'src'), HF_HUB_OFFLINE='1')
    p = subprocess.Popen([sys.executable, '-m', 'agentrl', 'serve', '--out', str(out), '--server', server.url,
                          '--model', str(model_dir), '--max-new-tokens', '8'], stdout=subprocess.PIPE, text=True,
                         env=env)
    try:
        line = p.stdout.readline()
        assert line.startswith('serving on http://127.0.0.1:') and line.rstrip().endswith('vllm log-probs processed)')
        url = line.split()[2]
        sess = H.post(url + '/sessions', json={}).json()
        r = H.post(sess['base_url'] + '/chat/completions', json={'messages': USER, 'seed': 3}).json()
        assert r['choices'][0]['logprobs'] is None and 1 <= r['usage']['completion_tokens'] <= 8
        assert H.post(f'{url}/sessions/{sess["token"]}/finish', json={}).json()['records'] == 1
    finally:
        p.send_signal(signal.SIGTERM)
        assert p.wait(timeout=60) == 0
    [t] = store.read_trajectories(out / 'trajectories')
    assert t.provenance.policy == 'vllm' and json.loads((out / 'serve.json').read_text())['engine']['logp_mode'] == \
        'processed'


def test_cli_serve_engine_vllm_starts_and_stops_its_own_server(model_dir, vllm_py, tmp_path):
    """``agentrl serve --engine vllm --model DIR``: its own vLLM server, one streamed SDK call, SIGTERM stops both."""
    out = tmp_path / 'run'
    env = dict(os.environ, PYTHONPATH=str(ROOT / 'src'), HF_HUB_OFFLINE='1', AGENTRL_VLLM_PYTHON=str(vllm_py))
    p = subprocess.Popen([sys.executable, '-m', 'agentrl', 'serve', '--out', str(out), '--engine', 'vllm',
                          '--model', str(model_dir), '--max-new-tokens', '8',
                          '--vllm-cpus', os.environ.get('AGENTRL_VLLM_CPUS', '1')],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    vllm_pid = None
    try:
        err = p.stderr.readline()                    # agentrl serve: vllm server URL (pid N) started
        assert ' started' in err and '(pid ' in err, err
        vllm_pid = int(err.split('(pid ')[1].split(')')[0])
        line = p.stdout.readline()
        assert line.startswith('serving on http://127.0.0.1:') and line.rstrip().endswith('vllm log-probs processed)')
        url = line.split()[2]
        sess = H.post(url + '/sessions', json={'rollout_id': 'own'}).json()
        c = openai.OpenAI(api_key='unused', base_url=sess['base_url'])
        kw = dict(model='policy', messages=USER, tools=TOOLS, seed=4, max_tokens=8, extra_body={'return_token_ids': True})
        whole = c.chat.completions.create(**kw).choices[0]
        sess2 = H.post(url + '/sessions', json={'rollout_id': 'own2'}).json()
        parts = list(openai.OpenAI(api_key='unused', base_url=sess2['base_url']).chat.completions.create(
            stream=True, **kw))
        assert ''.join(x.choices[0].delta.content or '' for x in parts if x.choices) == (whole.message.content or '')
        assert parts[-1].choices[0].model_extra['token_ids'] == whole.model_extra['token_ids']
        for s in (sess, sess2):
            assert H.post(f'{url}/sessions/{s["token"]}/finish', json={'reward': 1.0}).json()['records'] == 1
    finally:
        p.send_signal(signal.SIGTERM)
        assert p.wait(timeout=120) == 0
    assert vllm_pid is not None and not Path(f'/proc/{vllm_pid}').exists()     # stopped with the gateway
    recs = store.read_trajectories(out / 'trajectories')
    assert len(recs) == 2 and {t.provenance.policy for t in recs} == {'vllm'}
    assert (out / 'vllm-server.log').is_file()
