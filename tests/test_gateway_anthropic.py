"""The Anthropic Messages dialect of ``agentrl serve``: the real ``anthropic`` SDK against a real server.

One gateway server per test module (uvicorn in a thread on 127.0.0.1, stopped at the end) over
``make_test_model``'s 2-layer Qwen3 with the real Qwen3 tokenizer; turns that must hold reasoning,
text or tool calls are teacher-forced through ``ForcingHF`` (tests/_gateway.py: the ids are given,
the log-probs are the model's), so the records replay with ratio 1 under ``agentrl check``.
"""

import pytest

from _tokenizers import tokenizer_path

pytest.importorskip('transformers')
pytest.importorskip('starlette')
pytest.importorskip('uvicorn')
anthropic = pytest.importorskip('anthropic')
openai = pytest.importorskip('openai')
try:                       # the SDKs ship httpx2; older versions use httpx
    import httpx2 as httpx
except ImportError:
    httpx = pytest.importorskip('httpx')
H = httpx.Client(timeout=120)

from _gateway import ForcingHF, policy_turns  # noqa: E402
from agentrl.gateway import GatewayError, Session, read_journal  # noqa: E402
from agentrl.gateway.anthropic import ANTHROPIC, thinking_signature  # noqa: E402
from agentrl.gateway.parse import tool_call_id  # noqa: E402
from agentrl.gateway import Gateway  # noqa: E402
from agentrl.gateway.server import Server  # noqa: E402

SYSTEM = 'You fix bugs. Use the tools.'
USER = 'Fix clamp.'
TOOLS = [{'name': 'read', 'description': 'Read the file.', 'input_schema': {'type': 'object', 'properties': {}}},
         {'name': 'edit', 'description': 'Edit the file.',
          'input_schema': {'type': 'object', 'properties': {'op': {'type': 'string'}}, 'required': ['op']}}]
CHAT_TOOLS = [{'type': 'function', 'function': {'name': t['name'], 'description': t['description'],
                                                'parameters': t['input_schema']}} for t in TOOLS]
READ = '<think>\nhm\n</think>\n\nLet me look.\n<tool_call>\n{"name": "read", "arguments": {}}\n</tool_call><|im_end|>'
EDIT = '<think>\nswap them\n</think>\n\n<tool_call>\n{"name": "edit", "arguments": {"op": "swap_minmax"}}\n' \
       '</tool_call><|im_end|>'
DONE = '<think>\ntests pass\n</think>\n\nFixed: lo and hi were swapped.<|im_end|>'


@pytest.fixture(scope='module')
def model_dir(tmp_path_factory):
    from agentrl.engines import hf
    return hf.make_test_model(tmp_path_factory.mktemp('anth-model'), tokenizer_path('qwen3'),
                              token_rates={'</think>': 0.05})


@pytest.fixture(scope='module')
def upstream(model_dir):
    return ForcingHF(model_dir, device='cpu', max_new_tokens=24)


@pytest.fixture(scope='module')
def run_dir(tmp_path_factory):
    return tmp_path_factory.mktemp('anth-run') / 'run'


@pytest.fixture(scope='module')
def server(upstream, run_dir):
    srv = Server(Gateway(upstream, run_dir), pause_wait=0.5).start()
    yield srv
    srv.stop()


def new_session(server, **ident):
    r = H.post(server.url + '/sessions', json=ident)
    assert r.status_code == 201, r.text
    return r.json()


def client(sess):
    """The SDK on the session URL without ``/v1`` (the SDK adds ``/v1/messages``), as Claude Code is set up."""
    assert sess['base_url'].endswith('/v1')
    return anthropic.Anthropic(api_key='unused', base_url=sess['base_url'][:-len('/v1')], max_retries=0)


def finish(server, sess, reward=1.0):
    r = H.post(f'{server.url}/sessions/{sess["token"]}/finish', json={'reward': reward, 'info': {'by': 'test'}})
    assert r.status_code == 200, r.text
    return r.json()


def records_of(run_dir, sid):
    from agentrl import store
    return [t for t in store.read_trajectories(run_dir / 'trajectories') if t.info['gateway']['session'] == sid]


def blocks(message) -> list:
    return [b.model_dump(exclude_none=True) for b in message.content]


# ---------------------------------------------------------------------------- the SDK, end to end
def test_sdk_tool_episode_with_thinking_echoed_is_one_branch_and_check_passes(server, upstream, run_dir, model_dir):
    from agentrl.cli.main import main as agentrl
    sess = new_session(server, group_id='anth', rollout_id='r0', task='clamp')
    c = client(sess)
    msgs = [{'role': 'user', 'content': USER}]
    kw = dict(model='claude-test', system=[{'type': 'text', 'text': SYSTEM, 'cache_control': {'type': 'ephemeral'}}],
              tools=TOOLS, thinking={'type': 'enabled', 'budget_tokens': 1024})
    counted = c.messages.count_tokens(messages=msgs, **kw).input_tokens
    upstream.force.append(READ)
    r = c.messages.create(max_tokens=64, messages=msgs, **kw)
    rid = f'chatcmpl-{sess["session"][:12]}-0'
    assert blocks(r) == [{'type': 'thinking', 'thinking': 'hm', 'signature': thinking_signature(rid, 'hm')},
                         {'type': 'text', 'text': 'Let me look.'},
                         {'type': 'tool_use', 'id': r.content[2].id, 'name': 'read', 'input': {}}]
    assert (r.id, r.role, r.stop_reason, r.stop_sequence) == (f'msg_{sess["session"][:12]}-0', 'assistant', 'tool_use',
                                                              None)
    forced = [upstream.tokenizer(x, add_special_tokens=False)['input_ids'] for x in (READ, EDIT, DONE)]
    assert (r.usage.input_tokens, r.usage.output_tokens) == (counted, len(forced[0]))
    msgs += [{'role': 'assistant', 'content': blocks(r)},
             {'role': 'user', 'content': [{'type': 'tool_result', 'tool_use_id': r.content[2].id,
                                           'content': 'def clamp(x, lo, hi): return max(hi, min(lo, x))'}]}]
    counted = c.messages.count_tokens(messages=msgs, **kw).input_tokens
    upstream.force.append(EDIT)
    with c.messages.stream(max_tokens=64, messages=msgs, **kw) as s:
        r2 = s.get_final_message()
    assert [b['type'] for b in blocks(r2)] == ['thinking', 'tool_use'] and r2.content[1].input == {'op': 'swap_minmax'}
    assert (r2.stop_reason, r2.usage.input_tokens, r2.usage.output_tokens) == ('tool_use', counted, len(forced[1]))
    msgs += [{'role': 'assistant', 'content': blocks(r2)},
             {'role': 'user', 'content': [{'type': 'tool_result', 'tool_use_id': r2.content[1].id, 'is_error': True,
                                           'content': [{'type': 'text', 'text': 'edited; '},
                                                       {'type': 'text', 'text': 'tests: 3 passed'}]},
                                          {'type': 'text', 'text': 'Now summarize.'}]}]
    upstream.force.append(DONE)
    r3 = c.messages.create(max_tokens=64, messages=msgs, **kw)
    assert upstream.force == []
    assert [b['type'] for b in blocks(r3)] == ['thinking', 'text'] and r3.content[1].text == \
        'Fixed: lo and hi were swapped.'
    assert (r3.stop_reason, r3.stop_sequence) == ('end_turn', None)
    state = H.get(f'{server.url}/sessions/{sess["token"]}').json()
    assert (state['calls'], state['branches'], state['forks']) == (3, 1, [])
    assert finish(server, sess)['records'] == 1
    [t] = records_of(run_dir, sess['session'])
    g = t.info['gateway']
    assert (g['calls'], g['dialects'], g['variants']) == ([0, 1, 2], ['anthropic'] * 3, [])
    assert policy_turns(t) == forced
    text = upstream.tokenizer.decode(t.ids.tolist())
    assert '<tool_response>\nedited; tests: 3 passed\n</tool_response><|im_end|>\n<|im_start|>user\nNow summarize.' \
        '<|im_end|>\n' in text                # a tool_result's text blocks joined as chat joins content parts
    assert agentrl(['check', str(run_dir), '--model', str(model_dir)]) == 0


def test_streamed_reply_equals_the_non_streamed_one_and_the_events_are_in_order(server, upstream):
    got, raw = [], []
    text = '<think>\nfirst look at the function body\n</think>\n\nI will read the file now, then edit it.\n' \
           '<tool_call>\n{"name": "edit", "arguments": {"op": "swap_minmax"}}\n</tool_call><|im_end|>'
    for stream in (False, True, 'raw'):
        sess = new_session(server)
        c = client(sess)
        upstream.force.append(text)
        kw = dict(model='m', max_tokens=64, messages=[{'role': 'user', 'content': USER}], tools=TOOLS)
        if stream == 'raw':
            r = H.post(sess['base_url'] + '/messages', json=dict(kw, stream=True))
            assert r.status_code == 200 and r.headers['content-type'].startswith('text/event-stream')
            raw = [line for line in r.text.split('\n') if line.startswith('event: ')]
            continue
        if stream:
            with c.messages.stream(**kw) as s:
                m = s.get_final_message()
        else:
            m = c.messages.create(**kw)
        rid = f'chatcmpl-{sess["session"][:12]}-0'
        assert m.content[0].signature == thinking_signature(rid, 'first look at the function body')
        assert m.content[2].id == tool_call_id(f'{sess["session"]}/0', 0)          # the gateway's ids, per call
        got.append(m.model_dump(exclude={'id'}, exclude_none=True))
    a, b = got
    for x in (a, b):
        x['content'][0]['signature'] = x['content'][2]['id'] = 'per call'
    assert a == b
    assert [x['type'] for x in a['content']] == ['thinking', 'text', 'tool_use'] and a['stop_reason'] == 'tool_use'
    assert a['content'][2]['input'] == {'op': 'swap_minmax'}
    # 3 blocks: thinking (2 deltas of 16 chars + the signature), text (3 deltas), tool_use (2 deltas of its JSON)
    assert raw == ['event: message_start'] + \
        ['event: content_block_start'] + ['event: content_block_delta'] * 3 + ['event: content_block_stop'] + \
        ['event: content_block_start'] + ['event: content_block_delta'] * 3 + ['event: content_block_stop'] + \
        ['event: content_block_start'] + ['event: content_block_delta'] * 2 + ['event: content_block_stop'] + \
        ['event: message_delta', 'event: message_stop']


def test_one_conversation_in_the_three_dialects_gives_the_same_record(server, upstream, run_dir):
    """Three turns (tool call, tool call, answer), sent as chat completions, as Anthropic Messages and as OpenAI
    Responses (each reply echoed as its client sends it back): the three records have the same ids, owner, action
    mask and log-probs (one branch model behind every dialect)."""
    recs = []
    for dialect in ('chat', 'anthropic', 'responses'):
        sess = new_session(server, group_id='same', rollout_id=dialect)
        results = ['def clamp(x, lo, hi): ...', 'tests: 3 passed']
        if dialect == 'chat':
            c = openai.OpenAI(api_key='unused', base_url=sess['base_url'])
            msgs = [{'role': 'system', 'content': SYSTEM}, {'role': 'user', 'content': USER}]
            for k, forced in enumerate((READ, EDIT, DONE)):
                upstream.force.append(forced)
                r = c.chat.completions.create(model='m', messages=msgs, tools=CHAT_TOOLS, max_tokens=64, seed=k)
                m = r.choices[0].message
                if k < 2:
                    msgs += [m.model_dump(exclude_none=True),
                             {'role': 'tool', 'tool_call_id': m.tool_calls[0].id, 'content': results[k]}]
        elif dialect == 'responses':
            c = openai.OpenAI(api_key='unused', base_url=sess['base_url'])
            items = [{'role': 'user', 'content': USER}]
            tools = [dict(t['function'], type='function') for t in CHAT_TOOLS]
            for k, forced in enumerate((READ, EDIT, DONE)):
                upstream.force.append(forced)
                r = c.responses.create(model='m', instructions=SYSTEM, input=items, tools=tools, max_output_tokens=64,
                                       store=False, include=['reasoning.encrypted_content'])
                if k < 2:
                    out = [o.model_dump(exclude_none=True) for o in r.output]
                    call = next(o for o in out if o['type'] == 'function_call')
                    items += out + [{'type': 'function_call_output', 'call_id': call['call_id'], 'output': results[k]}]
        else:
            c = client(sess)
            msgs = [{'role': 'user', 'content': USER}]
            for k, forced in enumerate((READ, EDIT, DONE)):
                upstream.force.append(forced)
                r = c.messages.create(model='m', system=SYSTEM, messages=msgs, tools=TOOLS, max_tokens=64)
                if k < 2:
                    msgs += [{'role': 'assistant', 'content': blocks(r)},
                             {'role': 'user', 'content': [{'type': 'tool_result', 'tool_use_id': r.content[-1].id,
                                                           'content': results[k]}]}]
        assert upstream.force == []
        assert finish(server, sess)['records'] == 1
        [t] = records_of(run_dir, sess['session'])
        recs.append(t)
    chat, msg, resp = recs
    assert msg.info['gateway']['dialects'] == ['anthropic'] * 3 and 'dialects' not in chat.info['gateway']
    assert resp.info['gateway']['dialects'] == ['responses'] * 3
    for other in (msg, resp):
        assert chat.ids.tolist() == other.ids.tolist()
        assert chat.owner.tolist() == other.owner.tolist()
        assert chat.action_mask.tolist() == other.action_mask.tolist() and sum(chat.action_mask.tolist()) > 40
        assert chat.sample_logp.tolist() == other.sample_logp.tolist()
        assert other.info['gateway']['variants'] == [] and other.info['gateway']['leaves'] == 1


def test_stop_sequences_count_tokens_and_max_tokens_beyond_the_context(server, upstream, run_dir):
    sess = new_session(server)
    c = client(sess)
    msgs = [{'role': 'user', 'content': 'Say it.'}]
    upstream.force.append('<think>\n\n</think>\n\nalpha STOP beta<|im_end|>')
    r = c.messages.create(model='m', max_tokens=64, messages=msgs, stop_sequences=['STOP', 'never'])
    assert blocks(r) == [{'type': 'text', 'text': 'alpha '}]
    assert (r.stop_reason, r.stop_sequence) == ('stop_sequence', 'STOP')
    # the SDK given the session's base_url as it is (ending in /v1) reaches the same routes
    full = anthropic.Anthropic(api_key='unused', base_url=sess['base_url'], max_retries=0)
    more = msgs + [{'role': 'assistant', 'content': blocks(r)}, {'role': 'user', 'content': 'Again.'}]
    n = full.messages.count_tokens(model='m', messages=more).input_tokens
    assert n == c.messages.count_tokens(model='m', messages=more).input_tokens
    with full.messages.stream(model='m', max_tokens=10 ** 9, messages=more) as s:
        r2 = s.get_final_message()
    assert r2.usage.input_tokens == n
    last = [e for e in read_journal(run_dir / 'journal.jsonl') if e.get('sid') == sess['session'] and
            e['ev'] == 'call'][-1]
    assert (last['ev'], last['max_tokens']) == ('call', upstream.max_context - n)      # capped to the room left
    assert H.get(f'{server.url}/sessions/{sess["token"]}').json()['calls'] == 2       # counting is no call


# ---------------------------------------------------------------------------- errors
def test_errors_are_in_anthropics_shape_with_the_http_status(server):
    sess = new_session(server)
    c = client(sess)
    with pytest.raises(anthropic.BadRequestError) as e:
        c.messages.create(model='m', max_tokens=8, messages=[{'role': 'user', 'content': 'hi'}],
                          extra_body={'best_of': 2})
    assert e.value.status_code == 400 and e.value.body == {'type': 'error', 'error': {
        'type': 'invalid_request_error', 'message': "unsupported field 'best_of': this gateway cannot honour it; "
                                                   'remove it'}}
    bad = anthropic.Anthropic(api_key='unused', base_url=sess['base_url'].replace(sess['token'], 'nope')[:-3],
                              max_retries=0)
    with pytest.raises(anthropic.NotFoundError) as e:
        bad.messages.create(model='m', max_tokens=8, messages=[{'role': 'user', 'content': 'hi'}])
    assert e.value.body == {'type': 'error', 'error': {
        'type': 'not_found_error', 'message': 'no such session: the token is unknown (create one with POST /sessions)'}}
    r = H.post(sess['base_url'] + '/messages', json={'model': 'm', 'max_tokens': 8, 'stream': True,
                                                     'messages': [{'role': 'user', 'content': 'a'},
                                                                  {'role': 'assistant', 'content': 'The answer is'}]})
    assert (r.status_code, r.json()['error']['type']) == (400, 'invalid_request_error')
    assert r.json()['error']['message'].startswith('messages[1] is an assistant message (a prefill)')
    r = H.post(sess['base_url'] + '/messages/count_tokens', json={'messages': []})
    assert r.status_code == 400 and r.json()['error']['message'].startswith('messages must be a non-empty list')
    finish(server, sess)
    with pytest.raises(anthropic.ConflictError) as e:
        c.messages.create(model='m', max_tokens=8, messages=[{'role': 'user', 'content': 'hi'}])
    assert e.value.body == {'type': 'error', 'error': {'type': 'invalid_request_error',
                                                       'message': 'the session is committed (0 records stored); open a new one'}}
    assert ANTHROPIC.error(GatewayError(429, 'paused', type='rate_limit_error'))['error']['type'] == 'rate_limit_error'
    assert ANTHROPIC.error(GatewayError(503, 'gone', type='server_error'))['error']['type'] == 'overloaded_error'
    assert ANTHROPIC.error(GatewayError(502, 'refused', type='server_error'))['error']['type'] == 'api_error'


# ---------------------------------------------------------------------------- the request mapping (no server)
def test_a_claude_code_request_maps_to_chat_messages():
    s = Session('s' * 32, {})
    body = {'model': 'claude-opus-5-5', 'max_tokens': 128000, 'stream': True, 'metadata': {'user_id': 'u'},
            'system': [{'type': 'text', 'text': 'A.'}, {'type': 'text', 'text': 'B.', 'cache_control': {'type': 'x'}}],
            'thinking': {'type': 'adaptive', 'display': 'omitted'}, 'output_config': {'effort': 'medium'},
            'context_management': {'edits': [{'type': 'clear_thinking_20251015', 'keep': 'all'}]},
            'tools': [dict(TOOLS[1], cache_control={'type': 'ephemeral'})], 'temperature': 0.5, 'top_k': 40,
            'stop_sequences': ['END'], 'tool_choice': {'type': 'any'},
            'messages': [{'role': 'user', 'content': [{'type': 'text', 'text': '<r>x</r>\n'},
                                                      {'type': 'text', 'text': 'Go.'}]},
                         {'role': 'system', 'content': 'Env.', 'output_config': {'effort': 'medium'}},
                         {'role': 'assistant', 'content': [
                             {'type': 'thinking', 'thinking': 'not ours', 'signature': 'chatcmpl-x-0.abc'},
                             {'type': 'redacted_thinking', 'data': 'opaque'},
                             {'type': 'text', 'text': 'Editing.'},
                             {'type': 'tool_use', 'id': 'toolu_1', 'name': 'edit', 'input': {'op': 'swap'}}]},
                         {'role': 'user', 'content': [
                             {'type': 'tool_result', 'tool_use_id': 'toolu_1', 'is_error': True,
                              'content': 'no such op'},
                             {'type': 'text', 'text': 'Try again.', 'cache_control': {'type': 'ephemeral'}}]}]}
    assert ANTHROPIC.to_chat(body, s) == {
        'messages': [{'role': 'system', 'content': [{'type': 'text', 'text': 'A.'}, {'type': 'text', 'text': 'B.'}]},
                     {'role': 'user', 'content': [{'type': 'text', 'text': '<r>x</r>\n'},
                                                  {'type': 'text', 'text': 'Go.'}]},
                     {'role': 'system', 'content': [{'type': 'text', 'text': 'Env.'}]},
                     {'role': 'assistant', 'content': 'Editing.', 'reasoning_content': 'not ours',
                      'tool_calls': [{'id': 'toolu_1', 'type': 'function',
                                      'function': {'name': 'edit', 'arguments': '{"op": "swap"}'}}]},
                     {'role': 'tool', 'tool_call_id': 'toolu_1', 'content': [{'type': 'text', 'text': 'no such op'}]},
                     {'role': 'user', 'content': [{'type': 'text', 'text': 'Try again.'}]}],
        'max_tokens': 128000, 'temperature': 0.5, 'top_k': 40, 'stop': ['END'], 'tools': [CHAT_TOOLS[1]],
        'tool_choice': 'required', 'chat_template_kwargs': {'reasoning_effort': 'medium'}}
    one = {'messages': [{'role': 'user', 'content': 'hi'}]}
    assert ANTHROPIC.to_chat(dict(one, tool_choice={'type': 'tool', 'name': 'edit'}), s)['tool_choice'] == {
        'type': 'function', 'function': {'name': 'edit'}}
    parts = {'messages': [{'role': 'user', 'content': [{'type': 'text', 'text': 'hi'}]}]}
    assert ANTHROPIC.to_chat(dict(one, tool_choice={'type': 'none'}, thinking={'type': 'disabled'}), s) == dict(
        parts, tool_choice='none', chat_template_kwargs={'enable_thinking': False})
    assert ANTHROPIC.to_chat(dict(one, thinking={'type': 'enabled', 'budget_tokens': 2048}), s) == dict(
        parts, chat_template_kwargs={'enable_thinking': True})


REFUSED = [
    ({'tools': [{'type': 'web_search_20250305', 'name': 'web_search'}]}, 'tools[0].type',
     "tools[0] is a 'web_search_20250305' tool: only client tools"),
    ({'tools': [dict(TOOLS[0], strict=True)]}, 'tools[0].strict', 'tools[0].strict=true cannot be honoured'),
    ({'tool_choice': {'type': 'auto', 'disable_parallel_tool_use': True}}, 'tool_choice.disable_parallel_tool_use',
     'tool_choice.disable_parallel_tool_use=true cannot be honoured'),
    ({'thinking': {'type': 'between_tools'}}, 'thinking.type', 'thinking must be {"type": "enabled" | "adaptive"'),
    ({'output_config': {'format': {'type': 'json_schema', 'schema': {}}}}, 'output_config.format',
     'output_config.format cannot be honoured'),
    ({'mcp_servers': [{'name': 'x', 'url': 'http://x'}]}, 'mcp_servers', 'mcp_servers cannot be honoured'),
    ({'stop_sequences': ['a', 'b', 'c', 'd', 'e']}, 'stop_sequences', 'stop_sequences must be a list of at most 4'),
    ({'messages': [{'role': 'user', 'content': [{'type': 'document', 'source': {}}]}]}, 'messages[0].content[0]',
     "messages[0].content[0]: block type 'document' cannot be rendered"),
    ({'messages': [{'role': 'user', 'content': [
        {'type': 'image', 'source': {'type': 'url', 'url': 'https://x/a.png'}}]}]},
     'messages[0].content[0].source.type', "messages[0].content[0].source.type is 'url': this gateway does not fetch "
                                           'images'),
    ({'messages': [{'role': 'user', 'content': [{'type': 'tool_result', 'tool_use_id': 't', 'content': [
        {'type': 'image', 'source': {'type': 'base64', 'media_type': 'image/gif', 'data': 'R0lG'}}]}]}]},
     'messages[0].content[0].content[0].source.media_type',
     "messages[0].content[0].content[0].source.media_type is 'image/gif'; send one of image/jpeg, image/jpg, "
     'image/png'),
    ({'messages': [{'role': 'system', 'content': [{'type': 'image', 'source': {}}]}]}, 'messages[0].content[0]',
     "messages[0].content[0]: block type 'image' cannot be rendered"),
    ({'messages': [{'role': 'user', 'content': 'a', 'output_config': {'effort': 'low'}}],
      'output_config': {'effort': 'high'}}, 'messages[0].output_config.effort',
     "messages[0].output_config.effort='low' differs from the request's ('high')"),
    ({'messages': [{'role': 'tool', 'content': 'a'}]}, 'messages[0].role', "messages[0].role is 'tool'"),
]


@pytest.mark.parametrize('extra, param, message', REFUSED, ids=[param for _, param, _ in REFUSED])
def test_fields_that_cannot_be_honoured_are_refused_by_name(extra, param, message):
    body = dict({'model': 'm', 'max_tokens': 8, 'messages': [{'role': 'user', 'content': 'hi'}]}, **extra)
    with pytest.raises(GatewayError) as e:
        ANTHROPIC.to_chat(body, Session('s' * 32, {}))
    assert (e.value.status, e.value.param) == (400, param) and e.value.message.startswith(message), e.value.message


def test_reply_stop_reasons_and_a_signed_thinking_echo_gives_the_calls_exact_reasoning():
    s = Session('s' * 32, {})
    message = {'role': 'assistant', 'content': '', 'reasoning_content': 'exact\n reasoning '}
    response = {'id': 'chatcmpl-ssssssssssss-0', 'model': 'm', 'usage': {'prompt_tokens': 7, 'completion_tokens': 3},
                'choices': [{'index': 0, 'message': message, 'finish_reason': 'length', 'logprobs': None}]}
    r = ANTHROPIC.reply(response, {'thinking': {'type': 'adaptive', 'display': 'omitted'}})
    sig = thinking_signature('chatcmpl-ssssssssssss-0', 'exact\n reasoning ')
    assert r == {'id': 'msg_ssssssssssss-0', 'type': 'message', 'role': 'assistant', 'model': 'm',
                 'content': [{'type': 'thinking', 'thinking': '', 'signature': sig}],
                 'stop_reason': 'max_tokens', 'stop_sequence': None,
                 'usage': {'input_tokens': 7, 'output_tokens': 3, 'cache_creation_input_tokens': 0,
                           'cache_read_input_tokens': 0}}
    s.calls.append({'response': response})
    echo = {'messages': [{'role': 'user', 'content': 'q'}, {'role': 'assistant', 'content': r['content']},
                         {'role': 'user', 'content': 'more'}]}
    assert ANTHROPIC.to_chat(echo, s)['messages'][1] == {'role': 'assistant', 'content': '',
                                                         'reasoning_content': 'exact\n reasoning '}
    echo['messages'][1]['content'] = [{'type': 'redacted_thinking', 'data': sig}]    # the signature as opaque data
    assert ANTHROPIC.to_chat(echo, s)['messages'][1]['reasoning_content'] == 'exact\n reasoning '
    echo['messages'][1]['content'] = [{'type': 'thinking', 'thinking': 'edited', 'signature': sig[:-1] + 'x'}]
    assert ANTHROPIC.to_chat(echo, s)['messages'][1]['reasoning_content'] == 'edited'     # not ours: as sent
    for finish, extra, want in (('stop', {}, ('end_turn', None)),
                                ('stop', {'stop_reason': 'END'}, ('stop_sequence', 'END')),
                                ('tool_calls', {}, ('tool_use', None))):
        response['choices'][0] = dict(response['choices'][0], finish_reason=finish, **extra)
        r = ANTHROPIC.reply(response, {})
        assert (r['stop_reason'], r['stop_sequence']) == want and r['content'][0]['thinking'] == 'exact\n reasoning '
