"""The gateway answers every malformed input with a 4xx naming the field, and holds no other client while it reads one.

One uvicorn server (a thread on 127.0.0.1) over ``make_test_model``'s 2-layer Qwen3 with the tiny chat tokenizer
committed under tests/assets (small vocabulary: a turn samples in milliseconds). Bodies are sent as bytes, so a test
controls every escape and header byte; each case names the exact input and the field its error must name. The
loop tests block the parser or the planner on an event the test holds, then ask ``/health``: it is answered only
if the loop is free (no timing is asserted; the event is always released).
"""
import json
import logging
import threading

import pytest

from _tokenizers import tokenizer_path

pytest.importorskip('transformers')
pytest.importorskip('starlette')
pytest.importorskip('uvicorn')
try:                       # openai >= 3 ships httpx2; older versions use httpx
    import httpx2 as httpx
except ImportError:
    httpx = pytest.importorskip('httpx')
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from _gateway import ForcingHF  # noqa: E402
from agentrl.engines.hf.engine import MAX_SAMPLERS  # noqa: E402
from agentrl.gateway import Gateway, Limits  # noqa: E402
from agentrl.gateway import app as gateway_app  # noqa: E402
from agentrl.gateway.app import INLINE_BYTES  # noqa: E402
from agentrl.gateway.inputs import MAX_JSON_DEPTH  # noqa: E402
from agentrl.gateway.server import Server  # noqa: E402
from agentrl.gateway.service import MAX_TEMPLATES  # noqa: E402
from agentrl.record import SamplingSpec  # noqa: E402

H = httpx.Client(timeout=60)
USER = {'role': 'user', 'content': 'Fix clamp.'}
TOOL = {'type': 'function', 'function': {'name': 'read', 'parameters': {'type': 'object', 'properties': {}}}}


@pytest.fixture(scope='module')
def upstream(tmp_path_factory):
    from agentrl.engines import hf
    model = hf.make_test_model(tmp_path_factory.mktemp('gw-inputs-model'), tokenizer_path('tiny'))
    return ForcingHF(model, device='cpu', max_new_tokens=4)


@pytest.fixture(scope='module')
def server(upstream, tmp_path_factory):
    gw = Gateway(upstream, tmp_path_factory.mktemp('gw-inputs') / 'run', limits=Limits(max_output_tokens=16))
    srv = Server(gw, pause_wait=0.5).start()
    yield srv
    srv.stop()


def session(server, **ident) -> dict:
    r = H.post(server.url + '/sessions', json=ident)
    assert r.status_code == 201, r.text
    return r.json()


def chat(server, sess, body, headers=None):
    """POST ``body`` (bytes sent as they are; anything else as JSON with ASCII escapes) to the session's route."""
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    return H.post(f'{server.url}/s/{sess["token"]}/v1/chat/completions', content=raw,
                  headers=dict({'content-type': 'application/json'}, **(headers or {})))


def refused(r, status: int, param) -> str:
    """The error's message, after checking the status, the OpenAI error shape and the field it names."""
    assert r.status_code == status, r.text
    err = r.json()['error']
    assert sorted(err) == ['code', 'message', 'param', 'type'] and err['type'] == 'invalid_request_error', err
    assert err['param'] == param, err
    assert 'Error' not in err['message'] and 'Traceback' not in err['message'], err     # no exception text
    return err['message']


# ---------------------------------------------------------------------------- malformed bodies: 400 naming the field
def test_json_nested_past_the_parser_stack_is_400_naming_the_body(server):
    body = b'{"messages": ' + b'[' * 100_000 + b']' * 100_000 + b'}'
    assert refused(chat(server, session(server), body), 400, None) == (
        f'request body nests lists and objects too deep to parse; send a JSON object nested at most {MAX_JSON_DEPTH} '
        'levels (docs/design.md#bounds)')


def test_json_nested_past_the_depth_bound_is_400_naming_the_field(server):
    deep = 'x'
    for _ in range(MAX_JSON_DEPTH - 2):          # the body, messages and the message are 3 levels: one too many
        deep = [deep]
    msg = refused(chat(server, session(server), {'messages': [dict(USER, meta=deep)]}), 400, 'messages')
    assert msg == ('messages[0].meta' + '[0]' * 40)[:120] + (
        f' nests lists and objects more than {MAX_JSON_DEPTH} levels deep; send a flatter body (docs/design.md#bounds)')
    ok = deep[0]                                                           # one level less: within the bound
    assert chat(server, session(server), {'messages': [dict(USER, meta=ok)], 'max_tokens': 1}).status_code == 200


LONE = '{"x": "\\ud800"}'      # JSON text of an object whose string is an unpaired high surrogate


@pytest.mark.parametrize('where, body', [
    ('messages[0].content', '{"messages": [{"role": "user", "content": "a\\ud800b"}]}'),
    ('messages[0].content[0].text', '{"messages": [{"role": "user", "content": [{"type": "text", "text": "\\udfff"}]}]}'),
    ('messages[1].tool_calls[0].function.arguments',
     '{"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "", "tool_calls": [{"id": "c", '
     '"type": "function", "function": {"name": "read", "arguments": "{\\"p\\": \\"\\ud83d\\"}"}}]}, '
     '{"role": "tool", "content": "ok"}]}'),
    ('tools[0].function.name',
     '{"messages": [{"role": "user", "content": "a"}], "tools": [{"type": "function", "function": {"name": "r\\udc00", '
     '"parameters": {"type": "object", "properties": {}}}}]}'),
    ('stop[0]', '{"messages": [{"role": "user", "content": "a"}], "stop": ["\\ud800"]}'),
    ('messages[0].\\udc80', '{"messages": [{"role": "user", "content": "a", "\\udc80": 1}]}'),
])
def test_a_lone_surrogate_in_a_request_is_400_naming_the_field(server, where, body):
    msg = refused(chat(server, session(server), body.encode()), 400, where)
    assert msg.startswith(where) or msg.startswith('a key of messages[0]'), msg
    pair = '{"messages": [{"role": "user", "content": "a \\ud83d\\ude00 b"}], "max_tokens": 1}'     # a pair is text
    assert chat(server, session(server), pair.encode()).status_code == 200


def test_a_lone_surrogate_in_the_identity_or_the_finish_info_is_400_naming_the_field(server):
    r = H.post(server.url + '/sessions', content=b'{"task": "t\\ud800", "rollout_id": "r-lone"}')
    assert refused(r, 400, 'task').startswith('task holds a lone UTF-16 surrogate')
    sess = session(server, rollout_id='r-lone')                                # nothing was opened under that id
    r = H.post(f'{server.url}/sessions/{sess["token"]}/finish', content=b'{"reward": 1, "info": {"note": "\\udfff"}}')
    assert refused(r, 400, 'info.note').startswith('info.note holds a lone UTF-16 surrogate')
    r = H.post(f'{server.url}/sessions/{sess["token"]}/finish', content=b'{"reward": 1, "info": {"note": "ok"}}')
    assert r.status_code == 200 and r.json()['state'] == 'committed', r.text


def test_a_401_digit_reward_is_400_naming_reward(server):
    sess = session(server)
    r = H.post(f'{server.url}/sessions/{sess["token"]}/finish', content=b'{"reward": ' + b'1' * 401 + b'}')
    assert refused(r, 400, 'reward') == f'reward must be a finite number, got {"1" * 60}'
    r = H.post(f'{server.url}/sessions/{sess["token"]}/finish', content=b'{"reward": ' + b'1' * 5000 + b'}')
    assert refused(r, 400, None) == ('request body holds an integer of more than 4300 digits; send '
                                     '{"reward": R, "info": {}} with numbers of ordinary size')


@pytest.mark.parametrize('calls, where', [
    (5, 'messages[1].tool_calls'),
    ([7], 'messages[1].tool_calls[0]'),
    ([{'id': 'c', 'type': 'function', 'function': 'read'}], 'messages[1].tool_calls[0].function'),
    ([{'id': 'c', 'type': 'function', 'function': {'arguments': '{}'}}], 'messages[1].tool_calls[0].function.name'),
    ([{'id': 'c', 'type': 'function', 'function': {'name': 'read', 'arguments': 5}}],
     'messages[1].tool_calls[0].function.arguments'),
    ([{'id': 3, 'type': 'function', 'function': {'name': 'read', 'arguments': '{}'}}], 'messages[1].tool_calls[0].id'),
])
def test_a_malformed_echoed_tool_call_is_400_naming_the_call(server, calls, where):
    sess = session(server)
    first = chat(server, sess, {'messages': [USER], 'max_tokens': 2})
    assert first.status_code == 200, first.text
    echo = dict(first.json()['choices'][0]['message'], tool_calls=calls)       # the turn echoed with broken calls
    msg = refused(chat(server, sess, {'messages': [USER, echo, {'role': 'tool', 'content': 'ok'}]}), 400, where)
    assert msg.startswith(f'{where} must be '), msg


def test_a_deep_arguments_string_in_an_echo_is_not_a_500(server):
    sess = session(server)
    first = chat(server, sess, {'messages': [USER], 'max_tokens': 2})
    call = {'id': 'c', 'type': 'function', 'function': {'name': 'read', 'arguments': '[' * 2000}}   # past json's stack
    echo = dict(first.json()['choices'][0]['message'], tool_calls=[call])
    r = chat(server, sess, {'messages': [USER, echo, {'role': 'tool', 'content': 'ok'}], 'max_tokens': 1})
    assert r.status_code == 200, r.text                   # not an echo of the turn (other calls): a fork, sampled


@pytest.mark.parametrize('fields, where', [
    ({'stream': 'false'}, 'stream'),
    ({'logprobs': 'true'}, 'logprobs'),
    ({'return_token_ids': 1}, 'return_token_ids'),
    ({'parallel_tool_calls': 'no'}, 'parallel_tool_calls'),
    ({'store': 0}, 'store'),
    ({'stream': True, 'stream_options': {'include_usage': 'yes'}}, 'stream_options.include_usage'),
    ({'stream': True, 'stream_options': 'usage'}, 'stream_options'),
])
def test_a_boolean_field_that_is_not_a_boolean_is_400_naming_it(server, fields, where):
    msg = refused(chat(server, session(server), dict({'messages': [USER], 'max_tokens': 1}, **fields)), 400, where)
    assert msg.startswith(f'{where} must be '), msg
    ok = chat(server, session(server), dict({'messages': [USER], 'max_tokens': 1}, stream=False, logprobs=None,
                                            stream_options={'include_usage': False}))
    assert ok.status_code == 200 and ok.headers['content-type'] == 'application/json', ok.text


@pytest.mark.parametrize('route, body', [
    ('/v1/messages', {'model': 'm', 'max_tokens': 1, 'messages': [{'role': 'user', 'content': 'hi'}]}),
    ('/v1/responses', {'model': 'm', 'max_output_tokens': 16, 'input': 'hi'}),
])
@pytest.mark.parametrize('value', ['false', 'true', 1])
def test_a_dialects_stream_that_is_not_a_boolean_is_400_naming_it(server, route, body, value):
    r = H.post(f'{server.url}/s/{session(server)["token"]}{route}', json=dict(body, stream=value))
    assert r.status_code == 400, r.text
    err = r.json()['error']                                   # each dialect's own error shape
    assert err['message'] == f'stream must be true or false, got {json.dumps(value)}', err
    assert 'text/event-stream' not in r.headers['content-type'], r.headers


@pytest.mark.parametrize('first, then, where, message', [
    ({}, {'presence_penalty': 0.5}, 'presence_penalty',                 # a field left out of the first spec's dict
     "presence_penalty=0.5 differs from this session's first call (0.0): one session samples under one sampler; "
     'open a new session for another'),
    ({}, {'chat_template_kwargs': {'enable_thinking': None}}, 'chat_template_kwargs.enable_thinking',   # null vs unset
     "chat_template_kwargs.enable_thinking: enable_thinking=null differs from this session's first call "
     '(enable_thinking unset): one session renders under one set of template options; open a new session for another'),
])
def test_a_second_call_that_changes_a_default_is_400_naming_it(server, first, then, where, message):
    sess = session(server)
    assert chat(server, sess, dict({'messages': [USER], 'max_tokens': 1}, **first)).status_code == 200
    assert refused(chat(server, sess, dict({'messages': [USER, USER], 'max_tokens': 1}, **then)), 400, where) == message


# ---------------------------------------------------------------------------- headers
@pytest.mark.parametrize('count', [b'\xb2', b'9' * 5000])
def test_a_retry_count_that_is_no_plain_integer_is_no_retry(server, count):
    sess = session(server)
    body = {'messages': [USER], 'max_tokens': 1, 'seed': 3}
    assert chat(server, sess, body).status_code == 200
    r = chat(server, sess, body, headers={'x-stainless-retry-count': count})     # '²': str.isdigit, not int()
    assert r.status_code == 200, r.text
    assert r.json()['id'].endswith('-1')                   # sampled as call 1, not a replay of call 0
    r = chat(server, sess, body, headers={'x-stainless-retry-count': b'1'})
    assert r.json()['id'].endswith('-1')                   # a plain count still replays the latest same body


def test_a_non_ascii_admin_token_is_401(server):
    for got in (b'Bearer \xe9t\xe9', b'\xff' * 40, b'Bearer ' + server.admin_token.encode() + b'\xe9'):
        r = H.get(server.url + '/admin/state', headers={'Authorization': got})
        assert r.status_code == 401 and r.json()['error']['code'] == 'admin_token', r.text
    assert H.get(server.url + '/admin/state', headers={'Authorization': f'Bearer {server.admin_token}'}).status_code == 200


# ---------------------------------------------------------------------------- errors never echo internals or tokens
def test_an_internal_error_answers_without_its_text_or_the_token_and_is_logged(server, monkeypatch, caplog):
    sess = session(server)

    def broken(*a, **k):
        raise RuntimeError('the planner broke: secret detail')
    monkeypatch.setattr(server.gateway, 'prepare', broken)
    with caplog.at_level(logging.ERROR, logger='agentrl.gateway'):      # its own connection: uvicorn closes it after
        r = httpx.post(f'{server.url}/s/{sess["token"]}/v1/chat/completions', json={'messages': [USER]}, timeout=60)
    assert r.status_code == 500 and r.json() == {'error': {
        'message': 'POST /s/TOKEN/v1/chat/completions: internal error; see the server log', 'type': 'server_error',
        'param': None, 'code': None}}
    logged = [rec for rec in caplog.records if rec.name == 'agentrl.gateway']
    assert [rec.getMessage() for rec in logged] == ['POST /s/TOKEN/v1/chat/completions: internal error']
    assert 'secret detail' in str(logged[0].exc_info[1]) and sess['token'] not in caplog.text


def test_no_such_route_masks_the_session_token(server):
    sess = session(server)
    for path in (f'/s/{sess["token"]}/v1/nothing', f'/sessions/{sess["token"]}/nothing'):
        r = H.get(server.url + path)
        assert r.status_code == 404 and sess['token'] not in r.text, r.text
        assert r.json()['error']['message'].startswith(f'GET {path.replace(sess["token"], "TOKEN")}: ')


# ---------------------------------------------------------------------------- the loop is never held by one request
def _health_while_held(server, monkeypatch, target, name, body_of):
    """Hold ``target.name`` (patched) on an event while a chat call is inside it; return /health's answer then."""
    real, entered, release = getattr(target, name), threading.Event(), threading.Event()

    def held(*a, **k):
        entered.set()
        release.wait(600)
        return real(*a, **k)
    monkeypatch.setattr(target, name, held)
    sess = session(server)
    out = {}
    t = threading.Thread(target=lambda: out.setdefault('chat', chat(server, sess, body_of())))
    t.start()
    try:
        assert entered.wait(300), 'the call never reached the held function'
        health = httpx.get(server.url + '/health', timeout=300)          # a held loop answers nothing: a timeout
    finally:
        release.set()
        t.join(600)
    return health, out['chat']


def test_health_is_answered_while_a_request_is_parsed(server, monkeypatch):
    body = {'messages': [USER], 'max_tokens': 1}
    health, r = _health_while_held(server, monkeypatch, gateway_app, 'parse_request', lambda: body)
    assert health.status_code == 200 and health.json()['ok'] is True
    assert r.status_code == 200, r.text


def test_health_is_answered_while_a_7_mb_request_is_parsed(server, monkeypatch):
    """A 7 MB body (under the 8 MiB limit; its bulk in ``metadata``, which is parsed and checked but not rendered):
    /health is answered while it is parsed, then it is served."""
    big = {'messages': [USER], 'max_tokens': 1, 'metadata': {'notes': ['word ' * 1000] * ((7 << 20) // 5000)}}
    assert 7 << 20 < len(json.dumps(big)) < Limits().max_body_bytes
    health, r = _health_while_held(server, monkeypatch, gateway_app, 'parse_request', lambda: big)
    assert health.status_code == 200 and health.json()['ok'] is True
    assert r.status_code == 200 and r.json()['object'] == 'chat.completion', r.text[:400]


def test_health_is_answered_while_a_long_request_is_planned(server, monkeypatch):
    long = {'messages': [dict(USER, content='word ' * (INLINE_BYTES // 5 + 10))], 'max_tokens': 1}
    assert len(json.dumps(long)) > INLINE_BYTES
    health, r = _health_while_held(server, monkeypatch, server.gateway, 'prepare', lambda: long)
    assert health.status_code == 200 and health.json()['ok'] is True
    assert r.status_code in (200, 400) and r.json().get('error', {}).get('code') in (None, 'context_length_exceeded')


def test_a_render_past_its_time_budget_is_400_naming_the_bound(server, upstream, monkeypatch):
    real = upstream.tokenizer.apply_chat_template

    def spinning(conversation, *a, **k):
        while any(m.get('content') == 'SPIN' for m in conversation):         # a template loop that never ends
            pass
        return real(conversation, *a, **k)
    monkeypatch.setattr(upstream.tokenizer, 'apply_chat_template', spinning)
    monkeypatch.setenv('AGENTRL_TEMPLATE_SECONDS', '0.5')
    msg = refused(chat(server, session(server), {'messages': [dict(USER, content='SPIN')]}), 400, 'messages')
    assert 'took more than 0.5 s to render one call (AGENTRL_TEMPLATE_SECONDS)' in msg, msg
    assert chat(server, session(server), {'messages': [USER], 'max_tokens': 1}).status_code == 200


# ---------------------------------------------------------------------------- bounded caches
def test_300_distinct_temperatures_keep_at_most_the_sampler_bound(upstream):
    stops = [upstream.tokenizer.eos_token_id]
    made = [upstream.sampler(SamplingSpec(temperature=0.5 + k / 1000), stops) for k in range(300)]
    assert len(upstream.samplers) == MAX_SAMPLERS
    assert upstream.sampler(SamplingSpec(temperature=0.5 + 299 / 1000), stops) is made[-1]      # the latest kept
    assert upstream.sampler(SamplingSpec(temperature=0.5), stops) is not made[0]                 # the oldest dropped


def test_300_distinct_tool_lists_keep_at_most_the_template_bound(upstream, tmp_path):
    gw = Gateway(upstream, tmp_path / 'run', conformance=False)
    try:
        for k in range(300):
            gw.template([{'type': 'function', 'function': dict(TOOL['function'], name=f'tool_{k}')}])
        assert len(gw._templates) == MAX_TEMPLATES and 'null' in gw._templates      # the tool-less one kept
    finally:
        gw.pool.shutdown()
        gw.journal.close()


def test_a_dropped_template_drops_its_conformance_report(upstream, tmp_path, monkeypatch):
    from agentrl.gateway import service
    monkeypatch.setattr(service, 'MAX_TEMPLATES', 3)
    gw = Gateway(upstream, tmp_path / 'run')
    try:
        tools = [[{'type': 'function', 'function': dict(TOOL['function'], name=f'tool_{k}')}] for k in range(5)]
        for t in tools:
            gw.template(t)
        assert sorted(gw.conformance_report) == sorted(gw._templates) == sorted(
            ['null'] + [json.dumps(t, sort_keys=True) for t in tools[-2:]])
    finally:
        gw.pool.shutdown()
        gw.journal.close()


# ---------------------------------------------------------------------------- fuzz over the request schema
# Every value is of its field's type seven times in eight, else junk of any JSON type (lone surrogates, 400-digit
# integers, NaN, nested lists and objects), so a body is often valid up to one field deep inside it.
_text = st.text(st.characters(codec='utf-8'), max_size=8)
_lone = st.text(st.characters(codec='utf-8') | st.characters(min_codepoint=0xD800, max_codepoint=0xDFFF), min_size=1,
                max_size=3)
_scalar = st.none() | st.booleans() | st.integers() | st.integers(min_value=10 ** 30, max_value=10 ** 420) | \
    st.floats() | _text | _lone
_junk = st.recursive(_scalar, lambda c: st.lists(c, max_size=3) | st.dictionaries(_text, c, max_size=3), max_leaves=6)


def _or_junk(strategy):
    return st.integers(0, 7).flatmap(lambda k: _junk if k == 0 else strategy)


_args = _or_junk(st.dictionaries(_text, _junk, max_size=2) | st.just('{"path": "a.py"}') | _text)
_call = st.fixed_dictionaries({'id': _or_junk(_text), 'type': _or_junk(st.just('function')), 'function': _or_junk(
    st.fixed_dictionaries({'name': _or_junk(st.just('read') | _text), 'arguments': _args}))})
_parts = st.lists(_or_junk(st.fixed_dictionaries({'type': _or_junk(st.just('text')), 'text': _or_junk(_text)})),
                  max_size=2)
_message = _or_junk(st.fixed_dictionaries(
    {'role': _or_junk(st.sampled_from(['user', 'user', 'tool', 'system', 'assistant', 'developer'])),
     'content': _or_junk(_text | _parts)},
    optional={'tool_calls': _or_junk(st.lists(_call, max_size=2)), 'name': _or_junk(_text),
              'tool_call_id': _or_junk(_text), 'reasoning_content': _or_junk(_text)}))
_schema = st.fixed_dictionaries({'type': _or_junk(st.sampled_from(['string', 'integer', 'object', 'array']))},
                                optional={'description': _or_junk(_text), 'enum': _junk})
_tool = _or_junk(st.fixed_dictionaries({'type': _or_junk(st.just('function')), 'function': _or_junk(
    st.fixed_dictionaries({'name': _or_junk(st.just('read') | _text)}, optional={
        'description': _or_junk(_text), 'parameters': _or_junk(st.fixed_dictionaries(
            {'type': _or_junk(st.just('object'))},
            optional={'properties': _or_junk(st.dictionaries(_text, _or_junk(_schema), max_size=2)),
                      'required': _or_junk(st.lists(_text, max_size=2))}))}))}))
_number = st.floats(min_value=0, max_value=2) | st.integers(0, 2)
#: The optional fields of a body: their values when of the right type.
_FIELDS = {
    'stream': st.booleans(), 'temperature': _number, 'top_p': st.floats(0.01, 1), 'top_k': st.integers(-1, 50),
    'min_p': st.floats(0, 0.5), 'presence_penalty': _number, 'frequency_penalty': _number,
    'repetition_penalty': _number, 'max_tokens': st.integers(-1, 3), 'max_completion_tokens': st.integers(-1, 3),
    'stop': st.lists(_text, max_size=2) | _text, 'tools': st.lists(_tool, max_size=2),
    'tool_choice': st.sampled_from(['auto', 'none', 'required']), 'logprobs': st.booleans(),
    'return_token_ids': st.booleans(), 'seed': st.integers(), 'n': st.just(1),
    'stream_options': st.fixed_dictionaries({}, optional={'include_usage': _or_junk(st.booleans())}),
    'chat_template_kwargs': st.dictionaries(st.sampled_from(['enable_thinking', 'x']) | _text, _junk, max_size=2),
    'reasoning_effort': st.sampled_from(['low', 'none', 'high']), 'parallel_tool_calls': st.booleans(),
    'response_format': st.just({'type': 'text'}), 'model': _text, 'user': _text, 'metadata': _junk,
    'logit_bias': st.just({}), 'top_logprobs': st.just(0), 'functions': st.just([]), 'store': st.booleans()}


@st.composite
def _bodies(draw):
    body = {'messages': draw(_or_junk(st.lists(_message, min_size=1, max_size=3)))}
    for name in draw(st.lists(st.sampled_from(sorted(_FIELDS)), max_size=4, unique=True)):
        body[name] = draw(_or_junk(_FIELDS[name]))
    return body


def _named(err: dict) -> bool:
    """The error names what to fix: a field (``param``), a limit (``code``) or the request body."""
    return bool(err['param'] or err['code'] or err['message'].startswith('request body'))


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                 HealthCheck.too_slow, HealthCheck.data_too_large])
@given(body=_bodies(), echo=st.booleans(), stream=st.booleans())
def test_fuzzed_chat_bodies_get_200_or_a_4xx_naming_a_field(server, body, echo, stream):
    sess = session(server)
    body = dict({'stream': True} if stream else {}, **body)
    if echo and isinstance(body['messages'], list):            # a sampled turn first: the body's messages[1] is
        first = chat(server, sess, {'messages': [USER], 'max_tokens': 1})     # compared with it as an echo
        assert first.status_code == 200, first.text
        body = dict(body, messages=[USER] + body['messages'])
    r = chat(server, sess, json.dumps(body).encode())
    assert r.status_code == 200 or 400 <= r.status_code < 500, (r.status_code, r.text[:400], body)
    if r.status_code != 200:
        err = r.json()['error']
        assert sorted(err) == ['code', 'message', 'param', 'type'] and isinstance(err['message'], str), r.text
        assert err['message'] and _named(err) and 'Traceback' not in err['message'], (r.text[:400], body)
    elif r.headers['content-type'].startswith('text/event-stream'):
        assert r.text.endswith('data: [DONE]\n\n') and 'server_error' not in r.text, r.text[-400:]
    else:
        assert r.json()['object'] == 'chat.completion'
