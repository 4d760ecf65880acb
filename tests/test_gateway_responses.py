"""The OpenAI Responses dialect of ``agentrl serve`` (``POST {base_url}/responses``), driven by the real openai SDK.

One gateway server per module (uvicorn in a thread) over ``make_test_model``'s 2-layer Qwen3 with the
real Qwen3 tokenizer; tool-call turns are teacher-forced through ``ForcingHF`` (tests/_gateway.py), so the
records replay with ratio 1 (``agentrl check``). A Responses conversation must land in one branch (the
echoed output items, reasoning restored from ``encrypted_content`` or from ``previous_response_id``),
and give the same record as the same conversation sent as chat completions.
"""
import json

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

from _gateway import ForcingHF  # noqa: E402
from agentrl.gateway import Gateway, read_journal  # noqa: E402
from agentrl.gateway.responses import RESPONSES, seal  # noqa: E402
from agentrl.gateway.server import Server  # noqa: E402

H = httpx.Client(timeout=120)
TOOLS = [{'type': 'function', 'name': 'read', 'description': 'Read a file.',
          'parameters': {'type': 'object', 'properties': {'path': {'type': 'string'}}, 'required': ['path']}},
         {'type': 'web_search'}]
CHAT_TOOLS = [{'type': 'function', 'function': {'name': 'read', 'description': 'Read a file.',
                                                'parameters': TOOLS[0]['parameters']}}]


def _read(thought, path):
    call = json.dumps({'name': 'read', 'arguments': {'path': path}})
    return f'<think>\n{thought}\n</think>\n\n<tool_call>\n{call}\n</tool_call><|im_end|>'


READ, READ_B = _read('I read it first.', 'a.py'), _read('Now b.', 'b.py')
ANSWER = '<think>\nBoth read.\n</think>\n\nThe bug is in b.py.<|im_end|>'


@pytest.fixture(scope='module')
def model_dir(tmp_path_factory):
    from agentrl.engines import hf
    return hf.make_test_model(tmp_path_factory.mktemp('rs-model'), tokenizer_path('qwen3'))


@pytest.fixture(scope='module')
def upstream(model_dir):
    return ForcingHF(model_dir, device='cpu', max_new_tokens=24)


@pytest.fixture(scope='module')
def run_dir(tmp_path_factory):
    return tmp_path_factory.mktemp('rs-run') / 'run'


@pytest.fixture(scope='module')
def server(upstream, run_dir):
    srv = Server(Gateway(upstream, run_dir)).start()
    yield srv
    srv.stop()


def new_session(server, **ident):
    r = H.post(server.url + '/sessions', json=ident)
    assert r.status_code == 201, r.text
    return r.json()


def client(sess):
    return openai.OpenAI(api_key='unused', base_url=sess['base_url'], max_retries=0)


def finish(server, sess, reward=1.0):
    r = H.post(f'{server.url}/sessions/{sess["token"]}/finish', json={'reward': reward})
    assert r.status_code == 200, r.text
    return r.json()


def records(run_dir, sid):
    from agentrl import store
    return [t for t in store.read_trajectories(run_dir / 'trajectories') if t.info['gateway']['session'] == sid]


def calls_of(run_dir, sid):
    return [e for e in read_journal(run_dir / 'journal.jsonl') if e['ev'] == 'call' and e['sid'] == sid]


def echo(output):
    """Output items as a client sends them back (the SDK's models, ``None`` fields left out)."""
    return [o.model_dump(exclude_none=True) for o in output]


def test_tool_episode_with_encrypted_reasoning_is_one_branch(server, upstream, run_dir, model_dir):
    from agentrl.cli.main import main as agentrl
    sess = new_session(server, group_id='rs', rollout_id='enc')
    c = client(sess)
    opts = dict(model='m', tools=TOOLS, store=False, include=['reasoning.encrypted_content'],
                instructions='You fix bugs.', extra_body={'seed': 11})
    upstream.force += [READ, READ_B]
    r1 = c.responses.create(input='Find the bug.', **opts)
    assert r1.status == 'completed' and r1.object == 'response' and r1.id.startswith('resp_')
    assert [o.type for o in r1.output] == ['reasoning', 'function_call']
    rs, fc = r1.output
    assert rs.content[0].text == 'I read it first.' and rs.summary == []
    assert rs.encrypted_content == seal(sess['session'], 0, 'I read it first.')
    assert (fc.name, json.loads(fc.arguments), fc.status) == ('read', {'path': 'a.py'}, 'completed')
    assert fc.call_id.startswith('call_') and fc.id.startswith('fc_')
    assert r1.usage.total_tokens == r1.usage.input_tokens + r1.usage.output_tokens and r1.usage.output_tokens == \
        len(upstream.tokenizer(READ, add_special_tokens=False)['input_ids'])
    history = [{'role': 'user', 'content': 'Find the bug.'}]
    for r, out in ((r1, 'x = 1'), (None, 'y = 2')):
        if r is None:                                    # the second turn is streamed
            with c.responses.stream(input=history, **opts) as st:
                kinds = [e.type for e in st]
                r = st.get_final_response()
            assert kinds[:2] == ['response.created', 'response.in_progress'] and kinds[-1] == 'response.completed'
            assert 'response.function_call_arguments.delta' in kinds
        history += echo(r.output) + [{'type': 'function_call_output', 'call_id': r.output[-1].call_id,
                                      'output': out}]
        for item in history:                             # what Codex does: the raw reasoning text is not echoed
            if item.get('type') == 'reasoning':
                item.pop('content', None)
    upstream.force.append(ANSWER)
    r3 = c.responses.create(input=history, **opts)
    assert r3.output_text == 'The bug is in b.py.' and [o.type for o in r3.output] == ['reasoning', 'message']
    calls = calls_of(run_dir, sess['session'])
    assert [e['req']['dialect'] for e in calls] == ['responses'] * 3
    assert calls[2]['req']['messages'][0] == {'role': 'assistant', 'content': None, 'reasoning_content': 'Now b.',
                                              'tool_calls': [{'id': r.output[-1].call_id, 'type': 'function',
                                                              'function': {'name': 'read',
                                                                           'arguments': '{"path": "b.py"}'}}]}
    assert finish(server, sess)['records'] == 1
    [t] = records(run_dir, sess['session'])
    g = t.info['gateway']
    assert (g['calls'], g['fork'], g['variants'], g['dialects']) == ([0, 1, 2], None, [], ['responses'] * 3)
    assert agentrl(['check', str(run_dir), '--model', str(model_dir)]) == 0


def test_previous_response_id_continues_the_stored_conversation(server, upstream, run_dir):
    sess = new_session(server, group_id='rs', rollout_id='prev')
    c = client(sess)
    upstream.force.append(READ)
    r1 = c.responses.create(model='m', input='Find the bug.', tools=TOOLS, instructions='You fix bugs.')
    assert r1.store is True
    upstream.force.append(ANSWER)
    r2 = c.responses.create(model='m', previous_response_id=r1.id, tools=TOOLS, instructions='You fix bugs.',
                            input=[{'type': 'function_call_output', 'call_id': r1.output[-1].call_id,
                                    'output': 'x = 1'}])
    assert r2.output_text == 'The bug is in b.py.' and r2.previous_response_id == r1.id
    with pytest.raises(openai.BadRequestError) as e:
        c.responses.create(model='m', previous_response_id='resp_nope', input='again')
    assert e.value.status_code == 400 and e.value.body == {
        'message': 'previous_response_id "resp_nope" is not a stored response of this session (responses are kept in '
                   'memory with store=true); send the whole input instead', 'type': 'invalid_request_error',
        'param': 'previous_response_id', 'code': 'previous_response_not_found'}
    other = client(new_session(server))                  # another session's ids are not visible
    with pytest.raises(openai.BadRequestError):
        other.responses.create(model='m', previous_response_id=r1.id, input='again')
    finish(server, sess)
    [t] = records(run_dir, sess['session'])
    assert (t.info['gateway']['calls'], t.info['gateway']['variants']) == ([0, 1], [])


def _normalized(r) -> dict:
    """A Response without what differs between two sessions (its ids, seeded by the session, and its time)
    and without ``parsed_arguments`` (the SDK's own parse, on the streamed ``ParsedResponse`` only)."""
    d = r.model_dump()
    for k in ('id', 'created_at'):
        d.pop(k)
    for o in d['output']:
        for k in ('id', 'call_id', 'parsed_arguments'):
            o.pop(k, None)
    return d


def test_streamed_final_response_equals_the_created_one(server, upstream):
    got = []
    for stream in (False, True):
        c = client(new_session(server))
        upstream.force.append(READ)
        kw = dict(model='m', input='Find the bug.', tools=TOOLS, reasoning={'summary': 'auto'},
                  extra_body={'seed': 5}, max_output_tokens=64)
        if stream:
            with c.responses.stream(**kw) as st:
                events = list(st)
                got.append(st.get_final_response())
            assert [e.sequence_number for e in events] == list(range(len(events)))
            summary = [e.text for e in events if e.type == 'response.reasoning_summary_text.done']
            args = [e.delta for e in events if e.type == 'response.function_call_arguments.delta']
            assert summary == ['I read it first.'] and args == ['{"path": "a.py"}']
        else:
            got.append(c.responses.create(**kw))
    a, b = map(_normalized, got)
    assert a == b and a['output'][0]['summary'] == [{'type': 'summary_text', 'text': 'I read it first.'}]
    assert [k for k in a if a[k] != b[k]] == []


def test_a_turn_cut_at_max_output_tokens_is_incomplete(server):
    c = client(new_session(server))
    r = c.responses.create(model='m', input='Say something long.', max_output_tokens=3, extra_body={'seed': 1})
    assert (r.status, r.incomplete_details.reason, r.usage.output_tokens) == ('incomplete', 'max_output_tokens', 3)
    with c.responses.stream(model='m', input='Say more.', max_output_tokens=3, extra_body={'seed': 1}) as st:
        kinds = [e.type for e in st]
    assert kinds[-1] == 'response.incomplete'


def test_namespace_tools_are_flattened_and_calls_carry_the_namespace(server, upstream, run_dir):
    sess = new_session(server)
    c = client(sess)
    tools = [{'type': 'namespace', 'name': 'agents', 'description': 'Sub-agents.',
              'tools': [{'type': 'function', 'name': 'spawn', 'description': 'Start one.',
                         'parameters': {'type': 'object', 'properties': {'task': {'type': 'string'}}}}]}]
    upstream.force.append('<tool_call>\n{"name": "agents__spawn", "arguments": {"task": "t"}}\n</tool_call><|im_end|>')
    r = c.responses.create(model='m', input='Delegate.', tools=tools, store=False, max_output_tokens=128000)
    assert r.max_output_tokens == 128000 and r.status == 'completed'      # capped to the context, not refused
    [fc] = [o for o in r.output if o.type == 'function_call']
    assert (fc.name, fc.namespace, fc.arguments) == ('spawn', 'agents', '{"task": "t"}')
    upstream.force.append('<think>\n\n</think>\n\nDone.<|im_end|>')
    c.responses.create(model='m', tools=tools, store=False,
                       input=[{'role': 'user', 'content': 'Delegate.'}] + echo(r.output) +
                       [{'type': 'function_call_output', 'call_id': fc.call_id, 'output': 'started'}])
    calls = calls_of(run_dir, sess['session'])
    assert [t['function']['name'] for t in calls[0]['req']['tools']] == ['agents__spawn']
    assert calls[1]['req']['messages'][0]['tool_calls'][0]['function'] == {'name': 'agents__spawn',
                                                                           'arguments': '{"task": "t"}'}
    assert H.get(f'{server.url}/sessions/{sess["token"]}').json()['branches'] == 1


def _error(sess, body, url=None):
    r = H.post(url or sess['base_url'] + '/responses', json=body)
    return r.status_code, r.json()


def test_errors_are_openai_shaped_and_name_the_responses_field(server, upstream):
    sess = new_session(server)
    ok = {'model': 'm', 'input': 'hi'}
    assert _error(sess, dict(ok, frobnicate=1)) == (400, {'error': {
        'message': "unsupported field 'frobnicate': this gateway cannot honour it; remove it",
        'type': 'invalid_request_error', 'param': 'frobnicate', 'code': None}})
    status, body = _error(sess, dict(ok, input=[{'role': 'user', 'content': [
        {'type': 'input_text', 'text': 'see'}, {'type': 'input_image', 'image_url': 'data:'}]}]))
    assert (status, body['error']['param']) == (400, 'input')          # a text-only model
    assert body['error']['message'].startswith('messages[0].content[1] is an image_url part and this model has no '
                                               'image processor; serve a vision-language model')
    status, body = _error(sess, dict(ok, input=[{'role': 'user', 'content': [
        {'type': 'input_image', 'image_url': 'https://x/cat.png'}]}]))
    assert (status, body['error']['param']) == (400, 'input[0].content[0].image_url')
    assert body['error']['message'].startswith('input[0].content[0].image_url is not a data URL: this gateway does '
                                               'not fetch images')
    status, body = _error(sess, dict(ok, input=[{'role': 'system', 'content': [
        {'type': 'input_image', 'image_url': 'data:'}]}]))
    assert (status, body['error']['param']) == (400, 'input[0].content[0]')
    assert body['error']['message'].startswith("input[0].content[0] is a 'input_image' part: agentrl records text "
                                               'only here')
    status, body = _error(sess, dict(ok, tools=[{'type': 'custom', 'name': 'apply_patch'}]))
    assert (status, body['error']['param']) == (400, 'tools[0].type')
    status, body = _error(sess, dict(ok, text={'format': {'type': 'json_schema', 'schema': {}}}))
    assert (status, body['error']['param']) == (400, 'text.format')
    status, body = _error(sess, dict(ok, max_output_tokens=0))
    assert (status, body['error']['param']) == (400, 'max_output_tokens')
    status, body = _error(sess, dict(ok, reasoning={'effort': 'extreme'}))
    assert (status, body['error']['param']) == (400, 'reasoning.effort')
    status, body = _error(sess, dict(ok, input=[{'role': 'user', 'content': 'a'},
                                                {'role': 'assistant', 'content': 'b'}]))
    assert (status, body['error']['param']) == (400, 'input')
    forged = [{'role': 'user', 'content': 'a'},
              {'type': 'reasoning', 'summary': [], 'encrypted_content': seal('another-session', 0, 'secret')},
              {'role': 'assistant', 'content': 'b'}, {'role': 'user', 'content': 'c'}]
    assert _error(sess, dict(ok, input=forged)) == (400, {'error': {
        'message': 'input[1].encrypted_content is not a reasoning item this session returned (from another session, '
                   'another gateway run, or edited); send the item as it was returned, or drop it',
        'type': 'invalid_request_error', 'param': 'input[1].encrypted_content', 'code': 'invalid_encrypted_content'}})
    bad = dict(sess, base_url=sess['base_url'].replace(sess['token'], 'nope'))
    status, body = _error(bad, ok)
    assert (status, body['error']['code']) == (404, 'session_not_found')
    assert H.get(f'{server.url}/sessions/{sess["token"]}').json()['calls'] == 0      # nothing was served
    upstream.force.append('<think>\n\n</think>\n\nhello<|im_end|>')
    status, body = _error(sess, dict(ok, seed=2), url=sess['base_url'].removesuffix('/v1') + '/responses')
    assert status == 200 and body['output'][-1]['content'][0]['text'] == 'hello'


def test_a_conversation_records_the_same_as_chat_and_as_responses(server, upstream, run_dir):
    """Three turns (two tool calls, an answer), once as chat completions and once as Responses, same forced
    texts and seeds: the records' ids, owners and action masks are identical."""
    chat, resp = new_session(server, group_id='same', rollout_id='chat'), new_session(server, group_id='same',
                                                                                       rollout_id='responses')
    messages = [{'role': 'system', 'content': 'You fix bugs.'}, {'role': 'user', 'content': 'Find the bug.'}]
    history = [{'role': 'user', 'content': 'Find the bug.'}]
    outs = ['x = 1', 'y = 2']
    for k, text in enumerate((READ, READ_B, ANSWER)):
        upstream.force.append(text)
        m = client(chat).chat.completions.create(model='m', messages=messages, tools=CHAT_TOOLS, seed=k,
                                                 max_tokens=64).choices[0].message
        upstream.force.append(text)
        r = client(resp).responses.create(model='m', input=history, tools=TOOLS, instructions='You fix bugs.',
                                          store=False, include=['reasoning.encrypted_content'], max_output_tokens=64,
                                          extra_body={'seed': k})
        if k < 2:
            messages += [m.model_dump(exclude_none=True),
                         {'role': 'tool', 'tool_call_id': m.tool_calls[0].id, 'content': outs[k]}]
            history += echo(r.output) + [{'type': 'function_call_output', 'call_id': r.output[-1].call_id,
                                          'output': outs[k]}]
    finish(server, chat)
    finish(server, resp)
    [a], [b] = records(run_dir, chat['session']), records(run_dir, resp['session'])
    assert a.ids.tolist() == b.ids.tolist() and a.owner.tolist() == b.owner.tolist()
    assert a.action_mask.tolist() == b.action_mask.tolist() and a.sample_logp.tolist() == b.sample_logp.tolist()
    assert a.info['gateway']['calls'] == b.info['gateway']['calls'] == [0, 1, 2]
    assert 'dialects' not in a.info['gateway'] and b.info['gateway']['dialects'] == ['responses'] * 3


def test_the_app_serves_the_responses_dialect():
    from agentrl.gateway.app import DIALECTS
    assert RESPONSES in DIALECTS and RESPONSES.paths == ('/v1/responses', '/responses')


def test_encrypted_reasoning_is_verified_against_the_journal_after_a_restart(upstream, tmp_path):
    """The sealed reasoning is checked against the session's journalled calls, so it survives a restart of the
    gateway (here a new gateway over the same run folder)."""
    run = tmp_path / 'run'
    srv = Server(Gateway(upstream, run)).start()
    try:
        sess = new_session(srv)
        upstream.force.append(READ)
        r1 = client(sess).responses.create(model='m', input='Find the bug.', tools=TOOLS, store=False,
                                           include=['reasoning.encrypted_content'])
    finally:
        srv.stop()
    srv = Server(Gateway(upstream, run)).start()
    try:
        sess = dict(sess, base_url=sess['base_url'].replace(sess['base_url'].split('/s/')[0], srv.url))
        history = [{'role': 'user', 'content': 'Find the bug.'}] + \
            [{k: v for k, v in o.items() if k != 'content'} for o in echo(r1.output)] + \
            [{'type': 'function_call_output', 'call_id': r1.output[-1].call_id, 'output': 'x = 1'}]
        upstream.force.append(ANSWER)
        client(sess).responses.create(model='m', input=history, tools=TOOLS, store=False)
        finish(srv, sess)
    finally:
        srv.stop()
    [t] = records(run, sess['session'])
    assert (t.info['gateway']['calls'], t.info['gateway']['variants']) == ([0, 1], [])
    assert calls_of(run, sess['session'])[1]['req']['messages'][0]['reasoning_content'] == 'I read it first.'
