"""agentrl.gateway (``agentrl serve``): the openai SDK against a real server over a small random Qwen3.

One gateway server per test session (uvicorn in a thread on 127.0.0.1, stopped at the end) over
``make_test_model``'s 2-layer Qwen3 with the real Qwen3 tokenizer. Turns that must hold tool
calls are teacher-forced through the same ``HFSampler`` (the ids are given, the log-probs are
the model's), so the records still replay with ratio 1.
"""
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from _tokenizers import tokenizer_path

pytest.importorskip('transformers')
pytest.importorskip('starlette')
pytest.importorskip('uvicorn')
openai = pytest.importorskip('openai')
try:                       # openai >= 3 ships httpx2; older versions use httpx
    import httpx2 as httpx
except ImportError:
    httpx = pytest.importorskip('httpx')
H = httpx.Client(timeout=120)

from _gateway import ForcingHF  # noqa: E402
from agentrl.families import QWEN3  # noqa: E402
from agentrl.gateway import Gateway, GatewayError, Limits, parse_reply, message_deltas  # noqa: E402
from agentrl.gateway import parse_request, read_journal  # noqa: E402
from agentrl.gateway.server import Server  # noqa: E402
from agentrl.gym import TOOL_SCHEMAS  # noqa: E402
from agentrl.templates.chat import function_tools  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
TOOLS = function_tools(TOOL_SCHEMAS)
USER = [{'role': 'user', 'content': 'Fix clamp.'}]
READ = '<think>\nhm\n</think>\n\n<tool_call>\n{"name": "read", "arguments": {}}\n</tool_call><|im_end|>'


@pytest.fixture(scope='session')
def model_dir(tmp_path_factory):
    from agentrl.engines import hf
    return hf.make_test_model(tmp_path_factory.mktemp('gw-model'), tokenizer_path('qwen3'),
                              token_rates={'</think>': 0.05})


@pytest.fixture(scope='session')
def upstream(model_dir):
    return ForcingHF(model_dir, device='cpu', max_new_tokens=24)


@pytest.fixture(scope='session')
def run_dir(tmp_path_factory):
    return tmp_path_factory.mktemp('gw-run') / 'run'


@pytest.fixture(scope='session')
def server(upstream, run_dir):
    srv = Server(Gateway(upstream, run_dir), stream_interval=0.02, pause_wait=0.5).start()
    yield srv
    srv.stop()


def new_session(server, **ident):
    r = H.post(server.url + '/sessions', json=ident)
    assert r.status_code == 201, r.text
    return r.json()


def client(sess, **kw):
    return openai.OpenAI(api_key='unused', base_url=sess['base_url'], **kw)


def finish(server, sess, reward=1.0):
    r = H.post(f'{server.url}/sessions/{sess["token"]}/finish', json={'reward': reward, 'info': {'by': 'test'}})
    assert r.status_code == 200, r.text
    return r.json()


def records_of(run_dir, sid):
    from agentrl import store
    return [t for t in store.read_trajectories(run_dir / 'trajectories') if t.info['gateway']['session'] == sid]


def journal_len(run_dir):
    return len(read_journal(run_dir / 'journal.jsonl'))


# ---------------------------------------------------------------------------- parsing (no server)
def test_parse_reply_splits_reasoning_tool_calls_and_keeps_leftover_text():
    m = parse_reply('<think>\nhm\n</think>\n\nLet me look.\n<tool_call>\n{"name": "edit", "arguments": '
                    '{"op": "swap_minmax"}}\n</tool_call>', QWEN3, id_seed='s/0')
    assert m == {'role': 'assistant', 'content': 'Let me look.', 'reasoning_content': 'hm',
                 'tool_calls': [{'id': m['tool_calls'][0]['id'], 'type': 'function',
                                 'function': {'name': 'edit', 'arguments': '{"op": "swap_minmax"}'}}]}
    assert m['tool_calls'][0]['id'].startswith('call_') and len(m['tool_calls'][0]['id']) == 29
    assert parse_reply('<tool_call>\n{not json}\n</tool_call>', QWEN3) == {
        'role': 'assistant', 'content': '<tool_call>\n{not json}\n</tool_call>'}
    assert parse_reply('plain', QWEN3, tools=False) == {'role': 'assistant', 'content': 'plain'}
    deltas = message_deltas(m)
    assert ''.join(d.get('content', '') for d in deltas) == 'Let me look.'
    assert ''.join(d['tool_calls'][0]['function']['arguments'] for d in deltas if 'tool_calls' in d) == \
        '{"op": "swap_minmax"}'


@pytest.mark.parametrize('body, status, message', [
    (b'{"messages": [', 400, 'request body is not valid JSON'),
    (b'[]', 400, 'request body must be a JSON object, got list'),
    (b'{"messages": [{"role": "robot", "content": "hi"}]}', 400, r'messages\[0\]\["role"\] is \'robot\''),
    (b'{"messages": [{"role": "user", "content": "hi"}], "tools": [{"type": "function"}]}', 400, r'tools\[0\] must be'),
    (b'{"messages": [{"role": "user", "content": "hi"}], "n": 2}', 400, 'n=2 cannot be honoured'),
    (b'{"messages": [{"role": "user", "content": "hi"}], "tool_choice": "required"}', 400, 'tool_choice="required"'),
    (b'{"messages": [{"role": "user", "content": "hi"}], "temperature": 5}', 400, r'temperature must be a number'),
    (b'{"messages": [{"role": "user", "content": "hi"}], "guided_json": {}}', 400, "unsupported field 'guided_json'"),
    (b'{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "x"}]}', 400,
     r'messages\[1\] is an assistant message'),
    (b'{"messages": [{"role": "user", "content": "' + b'x' * 300 + b'"}]}', 413, 'over the limit of 256'),
])
def test_parse_request_refuses_with_one_message(body, status, message):
    with pytest.raises(GatewayError, match=message) as e:
        parse_request(body, 256)
    assert e.value.status == status


# ---------------------------------------------------------------------------- through the server
def test_sdk_streaming_equals_non_streaming_and_token_ids(server):
    got = []
    for stream in (False, True):
        sess = new_session(server)
        c = client(sess)
        kw = dict(model='m', messages=USER, tools=TOOLS, seed=11, max_tokens=20, extra_body={'return_token_ids': True})
        if not stream:
            r = c.chat.completions.create(**kw)
            got.append((r.choices[0].message.content or '', r.choices[0].message.model_extra.get('reasoning_content'),
                        r.choices[0].finish_reason, r.choices[0].model_extra['token_ids']))
        else:
            parts = list(c.chat.completions.create(stream=True, **kw))
            deltas = [p.choices[0] for p in parts if p.choices]
            reasoning = [d.delta.model_extra.get('reasoning_content') for d in deltas]
            got.append((''.join(d.delta.content or '' for d in deltas),
                        ''.join(r for r in reasoning if r) if any(reasoning) else None,
                        deltas[-1].finish_reason, deltas[-1].model_extra['token_ids']))
    assert got[0] == got[1]
    assert got[0][2] in ('stop', 'length') and len(got[0][3]) <= 20


def test_echo_without_reasoning_and_with_new_tool_call_ids_continues_the_branch(server, upstream, run_dir):
    sess = new_session(server, group_id='g-echo', rollout_id='r0', task='clamp')
    c = client(sess)
    upstream.force.append(READ)
    r = c.chat.completions.create(model='m', messages=USER, tools=TOOLS, seed=3)
    m = r.choices[0].message
    assert r.choices[0].finish_reason == 'tool_calls' and m.content is None
    assert m.model_extra['reasoning_content'] == 'hm' and m.tool_calls[0].function.name == 'read'
    echo = {'role': 'assistant', 'content': '', 'tool_calls': [
        {'id': 'harness-1', 'type': 'function', 'function': {'name': 'read', 'arguments': '{ }'}}]}
    msgs = USER + [echo, {'role': 'tool', 'tool_call_id': 'harness-1', 'content': 'def clamp(x, lo, hi): ...'}]
    c.chat.completions.create(model='m', messages=msgs, tools=TOOLS, seed=4, max_tokens=8)
    state = H.get(f'{server.url}/sessions/{sess["token"]}').json()
    assert (state['calls'], state['branches'], state['forks']) == (2, 1, [])
    assert finish(server, sess)['records'] == 1
    [t] = records_of(run_dir, sess['session'])
    g = t.info['gateway']
    assert g['variants'] == [{'call': 1, 'notes': ['reasoning_dropped', 'tool_call_ids_changed',
                                                   'arguments_reserialized', 'content_null'], 'turn': 0}]
    forced = upstream.tokenizer(READ, add_special_tokens=False)['input_ids']
    ids = t.ids.tolist()
    start = next(i for i in range(len(ids)) if ids[i:i + len(forced)] == forced)
    assert t.action_mask[start - 1:start - 1 + len(forced)].tolist() == [1] * len(forced)
    assert (t.provenance.group_id, t.provenance.rollout_id, t.reward) == ('g-echo', 'r0', 1.0)


def test_edited_history_forks_into_two_records_with_the_fork_stored(server, run_dir):
    sess = new_session(server)
    c = client(sess)
    r = c.chat.completions.create(model='m', messages=USER, tools=TOOLS, seed=5, max_tokens=8)
    turn = r.choices[0].message.model_dump(exclude_none=True)
    msgs = USER + [turn, {'role': 'tool', 'content': 'result A'}]
    c.chat.completions.create(model='m', messages=msgs, tools=TOOLS, seed=6, max_tokens=8)
    edited = USER + [turn, {'role': 'tool', 'content': 'result B (edited)'}]
    c.chat.completions.create(model='m', messages=edited, tools=TOOLS, seed=7, max_tokens=8)
    assert finish(server, sess)['records'] == 2
    recs = records_of(run_dir, sess['session'])
    assert [t.info['gateway']['branch'] for t in recs] == [0, 1]
    fork = recs[1].info['gateway']['fork']
    assert (fork['category'], fork['parent'], fork['message_index'], fork['call']) == ('history_edited', 0, 2, 2)
    a, b = recs[0].ids.tolist(), recs[1].ids.tolist()
    assert a[:fork['token_offset']] == b[:fork['token_offset']] and a[fork['token_offset']] != b[fork['token_offset']]
    assert recs[1].provenance.rollout_id.endswith('/b1')


def test_compacting_harness_forks_as_compaction(server, run_dir):
    sess = new_session(server)
    c = client(sess)
    msgs = list(USER)
    for k in range(2):
        r = c.chat.completions.create(model='m', messages=msgs, tools=TOOLS, seed=20 + k, max_tokens=6)
        msgs += [r.choices[0].message.model_dump(exclude_none=True), {'role': 'tool', 'content': f'obs {k}'}]
    compacted = USER + [{'role': 'user', 'content': 'Summary so far: read the code, ran the tests.'}]
    c.chat.completions.create(model='m', messages=compacted, tools=TOOLS, seed=30, max_tokens=6)
    finish(server, sess)
    recs = records_of(run_dir, sess['session'])
    assert [t.info['gateway']['fork'] and t.info['gateway']['fork']['category'] for t in recs] == [None, 'compaction']


def test_unmarked_identical_body_samples_again_and_marked_retry_is_replayed(server):
    sess = new_session(server)
    url = sess['base_url'] + '/chat/completions'
    body = {'model': 'm', 'messages': USER, 'max_tokens': 6}
    a = H.post(url, json=body).json()
    b = H.post(url, json=body, headers={'x-stainless-retry-count': '1'}).json()
    c = H.post(url, json=body).json()
    assert b == a and c['id'] != a['id']
    state = H.get(f'{server.url}/sessions/{sess["token"]}').json()
    assert state['calls'] == 2 and [f['category'] for f in state['forks']] == ['retry']


def test_a_token_reaches_only_its_session_and_nothing_is_written(server, run_dir):
    a, b = new_session(server), new_session(server)
    n = journal_len(run_dir)
    bogus = a['base_url'].replace(a['token'], a['token'][:-2] + 'xx')
    r = H.post(bogus + '/chat/completions', json={'messages': USER})
    assert r.status_code == 404 and r.json()['error']['code'] == 'session_not_found'
    assert H.get(f'{server.url}/sessions/{b["token"]}x').status_code == 404
    assert H.post(f'{server.url}/sessions/nope/finish', json={'reward': 1}).status_code == 404
    assert journal_len(run_dir) == n
    assert H.get(f'{server.url}/sessions/{b["token"]}').json()['calls'] == 0


def test_malformed_json_is_400_with_one_message_and_the_server_keeps_serving(server, run_dir):
    sess = new_session(server)
    n = journal_len(run_dir)
    r = H.post(sess['base_url'] + '/chat/completions', content=b'{"messages": [',
                   headers={'content-type': 'application/json'})
    assert r.status_code == 400
    assert r.json()['error']['message'].startswith('request body is not valid JSON')
    with pytest.raises(openai.BadRequestError, match='unknown|role'):
        client(sess).chat.completions.create(model='m', messages=[{'role': 'robot', 'content': 'x'}])
    assert journal_len(run_dir) == n
    assert H.get(server.url + '/health').json()['ok'] is True


def test_dropped_stream_is_undelivered_and_excluded(server, run_dir):
    sess = new_session(server)
    with H.stream('POST', sess['base_url'] + '/chat/completions',
                      json={'messages': USER, 'stream': True, 'max_tokens': 24, 'seed': 2}) as r:
        next(r.iter_raw())
    for _ in range(100):
        if H.get(server.url + '/health').status_code == 200 and \
                any(e['ev'] == 'undelivered' and e['sid'] == sess['session'] for e in read_journal(run_dir / 'journal.jsonl')):
            break
        time.sleep(0.05)
    assert finish(server, sess)['records'] == 0
    assert json.loads((run_dir / 'summary.json').read_text())['undelivered_calls'] >= 1


def test_check_passes_on_gateway_records(server, run_dir, model_dir):
    from agentrl.jobs.check import CheckOptions, run_check
    sess = new_session(server)
    c = client(sess)
    r = c.chat.completions.create(model='m', messages=USER, tools=TOOLS, seed=9, max_tokens=10)
    msgs = USER + [r.choices[0].message.model_dump(exclude_none=True), {'role': 'tool', 'content': 'ok'}]
    c.chat.completions.create(model='m', messages=msgs, tools=TOOLS, seed=10, max_tokens=10)
    finish(server, sess)
    rep = run_check(CheckOptions(path=str(run_dir), model=str(model_dir), max_ratio_dev=1e-4))
    assert rep.refused == 0 and rep.n >= 1 and rep.code == 0, rep.format()
    assert rep.replays and max(x.stats.max_abs_dev for x in rep.replays if x.stats.n) <= 1e-4
    summary = json.loads((run_dir / 'summary.json').read_text())
    assert summary['rows_per_episode'] >= 1 and 0 < summary['trainable_fraction_of_sampled'] <= 1


def test_limits_and_idle_timeout(upstream, tmp_path):
    gw = Gateway(upstream, tmp_path / 'run', limits=Limits(max_turns=1), session_timeout=0.05)
    token, s = gw.open_session({'task': 't'})
    req, _ = parse_request(json.dumps({'messages': USER, 'max_tokens': 4}).encode(), 1 << 20)
    gw.chat(s, req, 'd1', 0)
    with pytest.raises(GatewayError, match=r'the session has used its 1 turns \(--max-turns\)'):
        gw.chat(s, req, 'd2', 0)
    time.sleep(0.1)
    assert gw.reap() == 1 and s.state == 'committed' and s.aborted
    from agentrl import store
    [t] = store.read_trajectories(tmp_path / 'run' / 'trajectories')
    assert t.reward == 0.0 and t.info['aborted'] == 'session_timeout' and t.info['gateway']['aborted'] is True
    gw.pool.shutdown()
    gw.journal.close()


def _serve(model_dir, out):
    env = dict(os.environ, PYTHONPATH=str(ROOT / 'src'), HF_HUB_OFFLINE='1')
    p = subprocess.Popen([sys.executable, '-m', 'agentrl', 'serve', '--out', str(out), '--model', str(model_dir),
                          '--device', 'cpu', '--max-new-tokens', '8'], stdout=subprocess.PIPE, text=True, env=env)
    line = p.stdout.readline()
    assert line.startswith('serving on http://127.0.0.1:'), line
    return p, line.split()[2]


def test_sigkill_and_restart_loses_and_doubles_nothing(model_dir, tmp_path):
    out = tmp_path / 'run'
    p, url = _serve(model_dir, out)
    try:
        sess = H.post(url + '/sessions', json={'rollout_id': 'kill-1'}, timeout=60).json()
        assert json.loads((out / 'serve.json').read_text())['url'] == url
        msgs, sent = list(USER), []
        for k in range(2):
            r = H.post(sess['base_url'] + '/chat/completions', timeout=60,
                           json={'messages': msgs, 'seed': k, 'return_token_ids': True}).json()
            sent.append(r['choices'][0]['token_ids'])
            msgs += [r['choices'][0]['message'], {'role': 'tool', 'content': f'obs {k}'}]
    finally:
        p.send_signal(signal.SIGKILL)
        p.wait()
    p, url2 = _serve(model_dir, out)
    try:
        base = sess['base_url'].replace(url, url2)
        r = H.post(base + '/chat/completions', timeout=60,
                       json={'messages': msgs, 'seed': 5, 'return_token_ids': True}).json()
        sent.append(r['choices'][0]['token_ids'])
        assert H.post(f'{url2}/sessions/{sess["token"]}/finish', json={'reward': 0.5}, timeout=60).json()['records'] == 1
    finally:
        p.send_signal(signal.SIGTERM)
        p.wait(timeout=30)
    from agentrl import store
    [t] = store.read_trajectories(out / 'trajectories')
    ids, mask = t.ids.tolist(), t.action_mask.tolist()
    trained = [ids[j + 1] for j in range(len(mask)) if mask[j]]
    assert trained == [i for turn in sent for i in turn]
    assert t.info['gateway']['calls'] == [0, 1, 2] and t.reward == 0.5


def test_example_harness_solves_bugfix_through_the_gateway(server, run_dir, model_dir, capsys):
    import importlib.util
    spec = importlib.util.spec_from_file_location('gateway_bugfix', ROOT / 'examples' / 'gateway_bugfix.py')
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    assert mod.main(['--url', server.url, '--run', str(run_dir), '--model', str(model_dir), '--tasks', '2',
                     '--max-turns', '2', '--max-tokens', '12']) == 0
    assert '2 episodes, mean reward' in capsys.readouterr().out
    from agentrl import store
    from agentrl.gym import make_tasks
    names = [t.name for t in make_tasks('all')[:2]]
    got = [t for t in store.read_trajectories(run_dir / 'trajectories') if t.info['gateway']['task'] in names
           and t.provenance.rollout_id.startswith(t.info['gateway']['task'] + '/')]
    assert sorted({t.provenance.group_id for t in got}) == sorted(names)
    assert all(t.info['done'] in (True, False) for t in got)


# ---------------------------------------------------------------------------- the Gateway object (no HTTP)
@pytest.fixture
def gw(upstream, tmp_path):
    g = Gateway(upstream, tmp_path / 'run')
    yield g
    g.pool.shutdown()
    g.journal.close()


def call(gw, s, messages, digest='d', retry=0, **fields):
    req, _ = parse_request(json.dumps(dict({'messages': messages, 'max_tokens': 4}, **fields)).encode(), 1 << 20)
    return gw.chat(s, req, digest, retry)[0]


def reply(resp):
    return {k: v for k, v in resp['choices'][0]['message'].items() if v is not None}


def test_fork_categories_for_tools_system_prompt_and_subagent(gw):
    _, s = gw.open_session({})
    sys_a = [{'role': 'system', 'content': 'You fix bugs.'}, USER[0]]
    r = call(gw, s, sys_a, seed=1)
    call(gw, s, sys_a, seed=2, tools=TOOLS)                                              # tools changed
    call(gw, s, [{'role': 'system', 'content': 'You fix bugs fast.'}, USER[0]], seed=3)   # system prompt changed
    sub = [{'role': 'system', 'content': 'You are a code searcher.'}, {'role': 'user', 'content': 'Find clamp.'}]
    rs = call(gw, s, sub, seed=4)                                                         # a sub-agent
    call(gw, s, sys_a + [reply(r), {'role': 'user', 'content': 'Go on.'}], seed=5)        # the parent goes on
    call(gw, s, sub + [reply(rs), {'role': 'user', 'content': 'More.'}], seed=6)          # and so does the sub-agent
    assert [f['category'] for f in s.forks] == ['tools_changed', 'system_prompt_changed', 'subagent']
    assert [len(b.turns) for b in s.branches] == [2, 1, 1, 2]
    assert gw.finish(s, 1.0, {})['records'] == 4


def test_a_removed_turn_is_history_edited_and_a_summary_is_compaction(gw):
    _, s = gw.open_session({})
    msgs = list(USER)
    for k in range(3):
        msgs += [reply(call(gw, s, msgs, seed=40 + k)), {'role': 'tool', 'content': f'obs {k}'}]
    call(gw, s, [msgs[0]] + msgs[3:5], seed=50)                                   # turn 0 and its result removed
    call(gw, s, msgs[:3] + [{'role': 'user', 'content': 'Summary: read clamp.'}], seed=51)
    call(gw, s, msgs[:3] + [{'role': 'tool', 'content': 'obs 0, edited'}], seed=52)
    assert [(f['category'], f['message_index']) for f in s.forks] == [
        ('history_edited', 1), ('compaction', 3), ('history_edited', 3)]     # the last one forks off the longest match
    assert [f['parent'] for f in s.forks] == [0, 0, 2]
    first = len(s.branches[0].turns[0].ids)
    assert [f['shared_sampled_tokens'] for f in s.forks] == [0, first, first]


def test_stop_strings_logprobs_and_tool_choice_none(gw, upstream):
    _, s = gw.open_session({})
    free = call(gw, s, USER, seed=8, max_tokens=24, logprobs=True, return_token_ids=True)
    text = free['choices'][0]['message']['content']
    stop = next(ch for ch in text[2:] if ch.strip())
    _, s2 = gw.open_session({})
    cut = call(gw, s2, USER, seed=8, max_tokens=24, stop=[stop], return_token_ids=True)
    c = cut['choices'][0]
    assert c['finish_reason'] == 'stop' and c['message']['content'] == text[:text.index(stop)]
    assert c['token_ids'] == free['choices'][0]['token_ids'][:len(c['token_ids'])]
    lp = free['choices'][0]['logprobs']['content']
    assert len(lp) == len(free['choices'][0]['token_ids']) == free['usage']['completion_tokens']
    assert [x['logprob'] for x in lp] == s.branches[0].turns[0].logp
    upstream.force.append(READ)
    _, s3 = gw.open_session({})
    r = call(gw, s3, USER, seed=1, tools=TOOLS, tool_choice='none')
    assert 'tool_calls' not in r['choices'][0]['message'] and r['choices'][0]['finish_reason'] == 'stop'
    assert r['choices'][0]['message']['content'].startswith('<tool_call>')


def test_sampling_fields_are_fixed_per_session_and_identities_are_unique(gw):
    _, s = gw.open_session({'group_id': 'g', 'rollout_id': 'r'})
    call(gw, s, USER, temperature=0.7)
    with pytest.raises(GatewayError, match=r"temperature=1.0 differs from this session's first call \(0.7\)"):
        call(gw, s, USER + [{'role': 'assistant', 'content': 'x'}, {'role': 'user', 'content': 'y'}])
    with pytest.raises(GatewayError, match="another session already records group_id='g' rollout_id='r'"):
        gw.open_session({'group_id': 'g', 'rollout_id': 'r'})
    with pytest.raises(GatewayError, match="unknown session field 'colour'"):
        gw.open_session({'colour': 'red'})


def test_cli_serve_refuses_without_a_model(tmp_path, capsys):
    from agentrl.cli.main import main
    assert main(['serve', '--out', str(tmp_path / 'r')]) == 2
    assert 'agentrl: error: --engine hf needs --model DIR' in capsys.readouterr().err
    assert main(['serve', '--out', str(tmp_path / 'r'), '--server', 'http://x']) == 2
    assert "--server needs --model DIR: the served model's folder" in capsys.readouterr().err
    assert main(['serve', '--out', str(tmp_path / 'r'), '--server', 'http://x', '--engine', 'hf', '--model', 'm']) == 2
    assert '--server is a vLLM server: drop --engine hf' in capsys.readouterr().err
    assert main(['serve', '--out', str(tmp_path / 'r'), '--server', 'http://127.0.0.1:9', '--model',
                 str(tmp_path)]) == 2
    assert 'vllm server http://127.0.0.1:9 is not ready' in capsys.readouterr().err


#: A template whose tool wrapper counts messages: a bridge's shape cannot be reused across rounds.
COUNTING = ("{%- for m in messages %}{%- if m.role == 'tool' %}<|im_start|>user\nResult {{ loop.index }}: "
            "{{ m.content }}<|im_end|>\n{%- else %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{%- endif %}"
            "{%- endfor %}{%- if add_generation_prompt %}<|im_start|>assistant\n{%- endif %}")


def test_conformance_gate_passes_real_templates_and_refuses_a_counting_one(upstream, tmp_path):
    from agentrl.gateway import ConformanceError, conformance
    from agentrl.templates import ChatTemplate
    tok = upstream.tokenizer
    assert conformance(ChatTemplate(tok, tools=TOOLS)) == {'conversations': 2, 'turns': 7, 'bridges': 5,
                                                           'history_rewrites': 0}
    assert conformance(ChatTemplate(tok, enable_thinking=False))['history_rewrites'] == 5
    with pytest.raises(ConformanceError, match=r"conversation 0, after turn 3: the bridged record differs from the "
                                               r"full render at token 88: recorded '\\nResult 7: def', rendered "
                                               r"'\\nResult 9: def'"):
        conformance(ChatTemplate(tok, chat_template=COUNTING))
    with pytest.raises(ConformanceError, match='after turn 3'):
        Gateway(upstream, tmp_path / 'run', template_options={'chat_template': COUNTING})
    Gateway(upstream, tmp_path / 'run2', template_options={'chat_template': COUNTING}, conformance=False).pool.shutdown()


def test_the_gateway_picks_the_model_family_or_takes_one_by_name(upstream, tmp_path):
    gw = Gateway(upstream, tmp_path / 'run', conformance=False)
    gw.pool.shutdown()
    assert gw.family is QWEN3
    gw = Gateway(upstream, tmp_path / 'run2', conformance=False, family='generic')
    gw.pool.shutdown()
    assert (gw.family.name, gw.family.parses_tools, gw.family.think_close) == ('generic', False, '</think>')
    with pytest.raises(ValueError, match=r"^family='hermes' is not a model family; use one of qwen3, deepseek-v3, "
                                         r"deepseek-v3.1, kimi-k2, generic$"):
        Gateway(upstream, tmp_path / 'run3', conformance=False, family='hermes')


def test_admin_pause_holds_calls_and_policy_versions_are_stamped_at_dispatch(server, run_dir):
    import threading
    admin = {'Authorization': f'Bearer {server.admin_token}'}
    assert json.loads((run_dir / 'serve.json').read_text())['admin_token'] == server.admin_token
    assert H.post(server.url + '/admin/pause').status_code == 401
    assert H.post(server.url + '/admin/pause', headers={'Authorization': 'Bearer nope'}).status_code == 401
    sess = new_session(server)
    url = sess['base_url'] + '/chat/completions'
    assert H.post(server.url + '/admin/pause', headers=admin).json()['paused'] is True
    r = H.post(url, json={'messages': USER, 'max_tokens': 4})                  # held 0.5 s, then refused
    assert r.status_code == 429 and r.headers['retry-after'] == '1' and r.json()['error']['code'] == 'paused'
    assert H.post(server.url + '/admin/policy', headers=admin, json={'version': 'v2'}).json()['policy_version'] == 'v2'
    got = []
    t = threading.Thread(target=lambda: got.append(H.post(url, json={'messages': USER, 'max_tokens': 4})))
    t.start()
    time.sleep(0.05)
    assert t.is_alive() and not got                                            # held while paused
    assert H.post(server.url + '/admin/resume', headers=admin).json()['paused'] is False
    t.join(30)
    assert got[0].status_code == 200
    assert H.post(server.url + '/admin/policy', headers=admin, json={'version': 7}).status_code == 400
    finish(server, sess)
    [rec] = records_of(run_dir, sess['session'])
    assert rec.info['gateway']['policy_versions'] == ['v2']


def test_sdk_retries_a_paused_call_and_gets_one_sample(server, run_dir):
    import threading
    admin = {'Authorization': f'Bearer {server.admin_token}'}
    sess = new_session(server)
    H.post(server.url + '/admin/pause', headers=admin)
    threading.Timer(0.8, lambda: H.post(server.url + '/admin/resume', headers=admin)).start()
    r = client(sess, max_retries=3).chat.completions.with_raw_response.create(model='m', messages=USER, max_tokens=4)
    assert r.retries_taken >= 1 and r.parse().choices[0].finish_reason in ('stop', 'length')
    assert H.get(f'{server.url}/sessions/{sess["token"]}').json()['calls'] == 1


def test_a_retry_after_a_crash_between_journal_and_response_is_replayed(gw, upstream):
    token, s = gw.open_session({})
    body = json.dumps({'messages': USER, 'max_tokens': 5, 'seed': 3}).encode()
    req, _ = parse_request(body, 1 << 20)
    from agentrl.gateway.protocol import body_digest
    sent, _, _ = gw.chat(s, req, body_digest(body), 0)        # journalled; the response never left the process
    again = Gateway(upstream, gw.out)                          # the restarted gateway, same folder
    s2 = again.session(token)
    got, index, replayed = again.chat(s2, req, body_digest(body), 1)
    assert (got, index, replayed) == (sent, 0, True) and len(s2.calls) == 1
    assert s2.branches[0].recorder.prompt_ids == s.branches[0].recorder.prompt_ids
    assert again.finish(s2, 1.0, {})['records'] == 1
    again.pool.shutdown()
    again.journal.close()


def test_streamed_tool_calls_concatenate_to_the_non_streamed_message(server, upstream):
    got = []
    for stream in (False, True):
        sess = new_session(server)
        upstream.force.append(READ.replace('{}', '{"path": "clamp.py", "lines": [1, 2, 3, 4, 5, 6, 7, 8]}'))
        kw = dict(model='m', messages=USER, tools=TOOLS, seed=1)
        if not stream:
            m = client(sess).chat.completions.create(**kw).choices[0].message
            got.append((m.content, m.model_extra['reasoning_content'],
                        [(c.id, c.function.name, c.function.arguments) for c in m.tool_calls]))
            continue
        calls, reasoning, content = {}, '', None
        for p in client(sess).chat.completions.create(stream=True, **kw):
            d = p.choices[0].delta if p.choices else None
            if d is None:
                continue
            reasoning += d.model_extra.get('reasoning_content') or ''
            content = (content or '') + d.content if d.content else content
            for c in d.tool_calls or ():
                e = calls.setdefault(c.index, ['', '', ''])
                e[0] += c.id or ''
                e[1] += c.function.name or ''
                e[2] += c.function.arguments or ''
        got.append((content, reasoning, [tuple(e) for _, e in sorted(calls.items())]))
    (c0, r0, t0), (c1, r1, t1) = got
    assert (c0, r0) == (c1, r1) == (None, 'hm')
    assert [t[1:] for t in t0] == [t[1:] for t in t1] == [
        ('read', '{"path": "clamp.py", "lines": [1, 2, 3, 4, 5, 6, 7, 8]}')]
    assert t0[0][0].startswith('call_') and t1[0][0].startswith('call_')     # ids are per session and call


def test_journal_drops_a_torn_last_line_and_refuses_a_damaged_one(tmp_path):
    from agentrl.gateway import Journal
    j = Journal(tmp_path / 'j.jsonl')
    j.append({'ev': 'session', 'sid': 'a'})
    j.close()
    with open(tmp_path / 'j.jsonl', 'ab') as f:
        f.write(b'{"ev": "call", "sid"')                     # killed mid-write
    assert read_journal(tmp_path / 'j.jsonl') == [{'ev': 'session', 'sid': 'a'}]
    j = Journal(tmp_path / 'j.jsonl')                        # reopening cuts the torn line off
    j.append({'ev': 'finish', 'sid': 'a'})
    j.close()
    assert [e['ev'] for e in read_journal(tmp_path / 'j.jsonl')] == ['session', 'finish']
    (tmp_path / 'bad.jsonl').write_bytes(b'{"ev": 1}\nnot json\n{"ev": 2}\n')
    with pytest.raises(ValueError, match=r'bad.jsonl: line 2 is not a journal event'):
        read_journal(tmp_path / 'bad.jsonl')


def test_models_route_names_the_served_model(server, upstream):
    sess = new_session(server)
    assert [m.id for m in client(sess).models.list()] == [upstream.model_name]
    assert H.get(server.url + '/nowhere').json()['error']['type'] == 'not_found_error'


def test_limits_refuse_with_the_limit_named():
    lim = Limits(max_turns=0, max_prompt_tokens=10, max_output_tokens=5, max_wall_s=2.0)
    lim.check_call(1000, 4, 1.0)
    with pytest.raises(GatewayError, match=r'sampled 5 tokens, its limit is 5 \(--max-output-tokens\)') as e:
        lim.check_call(0, 5, 1.0)
    assert (e.value.status, e.value.code) == (429, 'max_output_tokens')
    with pytest.raises(GatewayError, match=r'over its wall time of 2 s \(--max-wall-s\)'):
        lim.check_call(0, 0, 3.0)
    with pytest.raises(GatewayError, match=r'the prompt is 11 tokens, over the limit of 10'):
        lim.check_prompt(11)
    assert lim.output_budget(3) == 2 and Limits().output_budget(3) is None


def test_output_budget_caps_the_turn(upstream, tmp_path):
    gw = Gateway(upstream, tmp_path / 'run', limits=Limits(max_output_tokens=3))
    _, s = gw.open_session({})
    r = call(gw, s, USER, max_tokens=20, seed=1)
    assert r['usage']['completion_tokens'] <= 3
    gw.pool.shutdown()
    gw.journal.close()


def test_out_holding_a_rollout_run_is_refused_by_name(upstream, tmp_path):
    out = tmp_path / 'r'
    out.mkdir()
    (out / 'run.json').write_text('{"plan": {"policies": ["oracle"]}}')
    with pytest.raises(ValueError, match=r"holds an agentrl rollout run \(run.json has no kind\), not a gateway run; "
                                         r"choose a new --out$"):
        Gateway(upstream, out)
