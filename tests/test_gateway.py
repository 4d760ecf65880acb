"""agentrl.gateway (``agentrl serve``): the openai SDK against a real server over a small random Qwen3.

One gateway server per test session (uvicorn in a thread on 127.0.0.1, stopped at the end) over
``make_test_model``'s 2-layer Qwen3 with the real Qwen3 tokenizer. Turns that must hold tool
calls are teacher-forced through the same ``HFSampler`` (the ids are given, the log-probs are
the model's), so the records still replay with ratio 1.
"""
import json
import os
import re
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

from _families import trl_template  # noqa: E402
from _gateway import ForcingHF  # noqa: E402
from agentrl.families import QWEN3, family_names  # noqa: E402
from agentrl.gateway import Gateway, GatewayError, Limits, parse_reply, message_deltas  # noqa: E402
from agentrl.gateway import parse_request, read_journal  # noqa: E402
from agentrl.gateway.conformance import CORPUS as CONFORMANCE_CORPUS  # noqa: E402
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
    (b'{"messages": [{"role": "user", "content": "hi"}], "chat_template_kwargs": [1]}', 400,
     '^chat_template_kwargs must be a JSON object of template options, got list$'),
    (b'{"messages": [{"role": "user", "content": "hi"}], "chat_template_kwargs": {"chat_template": "x"}}', 400,
     r'^chat_template_kwargs.chat_template cannot be honoured: the gateway renders with the template and options it '
     r'serves; remove it$'),
    (b'{"messages": [{"role": "user", "content": "hi"}], "reasoning_effort": "extreme"}', 400,
     '^reasoning_effort must be one of none, minimal, low, medium, high, xhigh, max, got "extreme"$'),
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
    for _ in range(6000):
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
        p.wait(timeout=120)
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


def test_reasoning_effort_and_chat_template_kwargs_render_per_session_and_are_recorded(gw, upstream):
    from agentrl import store
    _, s = gw.open_session({'rollout_id': 'effort'})
    req, _ = parse_request(json.dumps({'messages': USER, 'max_tokens': 4, 'reasoning_effort': 'none'}).encode(), 1 << 20)
    assert (req.reasoning_effort, req.chat_template_kwargs) == ('none', {})
    p = gw.prepare(s, req, 'd', 0)
    gw.drop(p)
    assert p.template.template_kwargs == {'enable_thinking': False}        # Qwen3's template reads no reasoning_effort
    assert upstream.tokenizer.decode(p.plan.prompt_ids[-7:]) == '<|im_start|>assistant\n<think>\n\n</think>\n\n'
    assert p.plan.prompt_ids[-4:] == [151667, 271, 151668, 271]
    call(gw, s, USER, reasoning_effort='none')
    more = USER + [{'role': 'assistant', 'content': 'x'}, {'role': 'user', 'content': 'y'}]
    with pytest.raises(GatewayError) as e:
        call(gw, s, more, reasoning_effort='high')
    assert (e.value.status, e.value.param, e.value.message) == (
        400, 'reasoning_effort', "reasoning_effort: enable_thinking=true differs from this session's first call "
                                 "(enable_thinking=false): one session renders under one set of template options; "
                                 "open a new session for another")
    with pytest.raises(GatewayError) as e:
        call(gw, s, more, chat_template_kwargs={'enable_thinking': True})
    assert e.value.param == 'chat_template_kwargs.enable_thinking'
    call(gw, s, more, chat_template_kwargs={'enable_thinking': False, 'unread_option': 1})   # unread: dropped
    gw.finish(s, 1.0, {})
    (rec,) = [r for r in store.read_trajectories(gw.out / 'trajectories') if r.provenance.rollout_id == 'effort']
    assert rec.info['template']['template_kwargs'] == {'enable_thinking': False}
    assert json.loads((gw.out / 'journal.jsonl').read_text().splitlines()[1])['req']['reasoning_effort'] == 'none'


#: Written here: a template that reads ``reasoning_effort`` as gpt-oss's does (``Reasoning: high`` in the system turn)
#: and ``enable_thinking`` (an empty think block after the generation prompt when it is false).
EFFORT = ("{%- if reasoning_effort is defined and reasoning_effort %}<|im_start|>system\nReasoning: {{ reasoning_effort }}"
          "<|im_end|>\n{% endif %}{%- for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n"
          "{% endfor %}{%- if add_generation_prompt %}<|im_start|>assistant\n"
          "{%- if enable_thinking is defined and enable_thinking is false %}<think></think>{%- endif %}{%- endif %}")


def test_reasoning_effort_is_passed_to_a_template_that_reads_it_and_served_options_are_kept(upstream, tmp_path):
    opened = []

    def gateway(name, **kw):
        opened.append(Gateway(upstream, tmp_path / name, **kw))
        return opened[-1]
    g = gateway('run', template_options={'chat_template': EFFORT})
    off = gateway('run2', template_options={'enable_thinking': False}, conformance=False)
    try:
        assert g.conformance_report['null']['tool_calls'] == 'not rendered'
        _, s = g.open_session({})
        req, _ = parse_request(json.dumps({'messages': USER, 'reasoning_effort': 'high'}).encode(), 1 << 20)
        assert g.request_options(req) == {'enable_thinking': True, 'reasoning_effort': 'high'}
        p = g.prepare(s, req, 'd', 0)
        g.drop(p)
        assert upstream.tokenizer.decode(p.plan.prompt_ids) == (
            '<|im_start|>system\nReasoning: high<|im_end|>\n<|im_start|>user\nFix clamp.<|im_end|>\n'
            '<|im_start|>assistant')
        assert g.conformance_report['null {"enable_thinking": true, "reasoning_effort": "high"}']['turns'] == 7
        req, _ = parse_request(json.dumps({'messages': USER, 'reasoning_effort': 'none',
                                           'chat_template_kwargs': {'enable_thinking': True}}).encode(), 1 << 20)
        assert g.request_options(req) == {'enable_thinking': True, 'reasoning_effort': 'none'}   # the kwargs win
        _, s = off.open_session({})
        with pytest.raises(GatewayError) as e:
            call(off, s, USER, chat_template_kwargs={'enable_thinking': True})
        assert (e.value.param, e.value.message) == (
            'chat_template_kwargs.enable_thinking', 'chat_template_kwargs.enable_thinking: enable_thinking=true cannot '
            'be honoured: this gateway serves the template with enable_thinking=false; remove it')
        assert off.request_options(parse_request(json.dumps({'messages': USER, 'reasoning_effort': 'none'}).encode(),
                                                 1 << 20)[0]) == {'enable_thinking': False}
        # TRL's gpt-oss template reads reasoning_effort (default medium), not enable_thinking
        oss = gateway('run3', template_options={'chat_template': trl_template('gptoss')}, conformance=False,
                      family='generic')
        _, s = oss.open_session({})
        req, _ = parse_request(json.dumps({'messages': USER, 'reasoning_effort': 'high'}).encode(), 1 << 20)
        assert oss.request_options(req) == {'reasoning_effort': 'high'}
        p = oss.prepare(s, req, 'd', 0)
        oss.drop(p)
        prompt = upstream.tokenizer.decode(p.plan.prompt_ids)
        assert 'Reasoning: high\n' in prompt and 'Reasoning: medium' not in prompt
    finally:
        for x in opened:
            x.pool.shutdown()
            x.journal.close()


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
    assert conformance(ChatTemplate(tok, tools=TOOLS), family=QWEN3) == {
        'conversations': 2, 'turns': 7, 'bridges': 5, 'history_rewrites': 0, 'turn_rewrites': 0, 'tool_calls': 'parsed',
        'found': 'conformance: 7 turns, 5 bridges: the bridged record equals the full render; tool calls parsed back '
                 'by the qwen3 family'}
    assert conformance(ChatTemplate(tok, enable_thinking=False))['found'] == (
        'conformance: 7 turns, 5 bridges: 5 of 5 bridges follow a rewrite of earlier history (the template drops or '
        'changes earlier text when a message is added), recorded as sampled')
    with pytest.raises(ConformanceError, match=r"conversation 0, after turn 3: the bridged record differs from the "
                                               r"full render at token 88: recorded '\\nResult 7: def', rendered "
                                               r"'\\nResult 9: def'"):
        conformance(ChatTemplate(tok, chat_template=COUNTING))
    with pytest.raises(ConformanceError, match='after turn 3'):
        Gateway(upstream, tmp_path / 'run', template_options={'chat_template': COUNTING})
    Gateway(upstream, tmp_path / 'run2', template_options={'chat_template': COUNTING}, conformance=False).pool.shutdown()


#: Written here: a template that rewrites history like Kimi K2's (every turn up to the last final answer loses its
#: reasoning, `<think></think>` kept) and writes Hermes calls; the reasoning of later tool-call turns is kept.
KIMI_LIKE = ("{%- set ns = namespace(last=-1) %}{%- for m in messages %}{%- if m.role == 'assistant' and not m.tool_calls %}"
             "{%- set ns.last = loop.index0 %}{%- endif %}{%- endfor %}"
             "{%- for m in messages %}{%- if m.role == 'assistant' %}<|im_start|>assistant\n"
             "{%- if loop.index0 > ns.last and m.reasoning_content %}<think>{{ m.reasoning_content }}</think>"
             "{%- else %}<think></think>{%- endif %}{{ m.content }}{%- for c in m.tool_calls or [] %}<tool_call>"
             "{{ {'name': c.function.name, 'arguments': c.function.arguments} | tojson }}</tool_call>{%- endfor %}"
             "<|im_end|>\n{%- else %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{%- endif %}{%- endfor %}"
             "{%- if add_generation_prompt %}<|im_start|>assistant\n{%- endif %}")
#: Written here: calls as `CALL>name({...})`, a format no family parses.
OWN_CALLS = ("{%- for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}{%- for c in m.tool_calls or [] %}"
             "CALL>{{ c.function.name }}({{ c.function.arguments | tojson }}){%- endfor %}<|im_end|>\n{%- endfor %}"
             "{%- if add_generation_prompt %}<|im_start|>assistant\n{%- endif %}")
#: Written here: the generation prompt opens `assistant`, history writes `model`: no turn continues the prompt.
OTHER_ROLE = ("{%- for m in messages %}{%- if m.role == 'assistant' %}<|im_start|>model\n{{ m.content }}<|im_end|>\n"
              "{%- else %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{%- endif %}{%- endfor %}"
              "{%- if add_generation_prompt %}<|im_start|>assistant\n{%- endif %}")


def test_conformance_gate_tells_a_history_rewrite_from_a_template_that_cannot_be_served(upstream, tmp_path):
    from agentrl.gateway import ConformanceError, conformance
    from agentrl.templates import ChatTemplate
    tok = upstream.tokenizer
    kimi = ChatTemplate(tok, chat_template=KIMI_LIKE)
    assert conformance(kimi, family=QWEN3) == {
        'conversations': 2, 'turns': 7, 'bridges': 5, 'history_rewrites': 0, 'turn_rewrites': 2, 'tool_calls': 'parsed',
        'found': "conformance: 7 turns, 5 bridges: 2 of 7 turns rewrite earlier turns when rendered (a final answer "
                 "drops earlier reasoning, as Kimi K2's template does), recorded as sampled; tool calls parsed back by "
                 "the qwen3 family"}
    with pytest.raises(ConformanceError, match=r'rewrites earlier turns when it renders an assistant turn '
                                               r'\(2 of 7 turns\), refused in strict mode'):
        conformance(kimi, strict=True)
    gw = Gateway(upstream, tmp_path / 'run', template_options={'chat_template': KIMI_LIKE})
    gw.pool.shutdown()
    assert gw.conformance_report['null']['turn_rewrites'] == 2
    with pytest.raises(ConformanceError) as e:
        Gateway(upstream, tmp_path / 'run2', template_options={'chat_template': OTHER_ROLE})
    assert str(e.value) == (
        "conformance: conversation 0, turn 0: the chat template passed as chat_template= for "
        f"{tok.name_or_path!r} writes the assistant turn after no copy of its own generation prompt "
        "'<|im_start|>assistant', so a sampled turn cannot be recorded as it renders; it cannot be served "
        "token-in/token-out (fix the chat template)")
    # recorded following the template (history='template'), each turn keeps the context it was sampled in
    from agentrl.templates import ChatRecorder
    from agentrl.templates.bridge import rendered_turn
    opening, (t0, after0), (t1, _) = CONFORMANCE_CORPUS[1][0], *CONFORMANCE_CORPUS[1][1]
    rec = ChatRecorder(kimi, opening)
    rec.add_turn(kimi.encode(rendered_turn(kimi, opening, t0)[0]), message=t0)
    assert rec.add_messages(after0) == kimi.encode(kimi.render(rec.messages, True))     # tool turns stay prefixes
    text, how = rendered_turn(kimi, rec.messages, t1)
    assert (text, how) == ('<think></think>All green.<|im_end|>', 'rewrites_history')
    rec.add_turn(kimi.encode(text), message=t1)
    ctx = rec.add_messages([{'role': 'user', 'content': 'Thanks.'}])
    assert ctx == kimi.encode(kimi.render(rec.messages, True)) and 'Both.' not in kimi.decode(ctx)
    rec.add_turn(kimi.encode('<think></think>Bye.<|im_end|>'))
    traj = rec.finish()
    assert not traj.info['template']['prefix_stable'] and traj.turn_contexts[2][1].tolist() == ctx
    assert traj.ids[:len(ctx)].tolist() != ctx                      # the record keeps the sampled reasoning


def test_conformance_gate_parses_the_templates_tool_calls_back_with_the_family(upstream, tmp_path):
    from agentrl.gateway import ConformanceError, conformance
    from agentrl.templates import ChatTemplate
    tok = upstream.tokenizer
    with pytest.raises(ConformanceError) as e:
        Gateway(upstream, tmp_path / 'run', template_options={'chat_template': OWN_CALLS})
    assert str(e.value) == (
        f"the chat template passed as chat_template= for {tok.name_or_path!r} writes tool calls as 'CALL>read({{}})' "
        "(the qwen3 family reads no such calls); no model family parses them: pass --family NAME or add a family "
        "module (docs/design.md#families)")
    with pytest.raises(ConformanceError) as e:
        Gateway(upstream, tmp_path / 'run2', family='generic')
    assert str(e.value) == (
        f"the chat template of {tok.name_or_path!r} writes tool calls as "
        "'<tool_call>\\n{\"name\": \"read\", \"arguments\": {}}\\n</tool_call>' (the generic family reads no such "
        "calls); the qwen3 family parses them: pass --family qwen3")
    assert conformance(ChatTemplate(tok, chat_template=OWN_CALLS))['tool_calls'] == 'unchecked'     # no family
    with pytest.raises(ConformanceError) as e:          # TRL's Qwen3.5 template: XML calls, not Hermes JSON
        conformance(ChatTemplate(tok, chat_template=trl_template('qwen3_5_think')), family=QWEN3)
    assert re.fullmatch(
        f"the chat template passed as chat_template= for {re.escape(repr(tok.name_or_path))} writes tool calls as "
        r"'<tool_call>\\n<function=read>\\n</function>\\n</tool_call>' \(the qwen3 family reads no such calls\); "
        r'(no model family parses them: pass --family NAME or add a family module \(docs/design.md#families\)'
        r'|the \w+ family parses them: pass --family \w+)', str(e.value)), str(e.value)


def test_the_gateway_picks_the_model_family_or_takes_one_by_name(upstream, tmp_path):
    gw = Gateway(upstream, tmp_path / 'run', conformance=False)
    gw.pool.shutdown()
    assert gw.family is QWEN3
    gw = Gateway(upstream, tmp_path / 'run2', conformance=False, family='generic')
    gw.pool.shutdown()
    assert (gw.family.name, gw.family.parses_tools, gw.family.think_close) == ('generic', False, '</think>')
    with pytest.raises(ValueError) as e:
        Gateway(upstream, tmp_path / 'run3', conformance=False, family='hermes')
    assert str(e.value) == f"family='hermes' is not a model family; use one of {', '.join(family_names())}"


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
    t.join(300)
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
    opened = {'ev': 'session', 'sid': 'a', 'identity': {}, 't': 1.0}
    j.append(opened)
    j.close()
    with open(tmp_path / 'j.jsonl', 'ab') as f:
        f.write(b'{"ev": "call", "sid"')                     # killed mid-write
    assert read_journal(tmp_path / 'j.jsonl') == [opened]
    j = Journal(tmp_path / 'j.jsonl')                        # reopening cuts the torn line off
    j.append({'ev': 'finish', 'sid': 'a', 'reward': 1.0, 'info': {}, 'aborted': False})
    j.close()
    assert [e['ev'] for e in read_journal(tmp_path / 'j.jsonl')] == ['session', 'finish']
    (tmp_path / 'bad.jsonl').write_bytes(b'{"ev": "policy", "version": "1"}\nnot json\n{"ev": "policy"}\n')
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
