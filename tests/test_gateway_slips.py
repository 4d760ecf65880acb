"""The chat-completions requests a harness sends that the gateway used to refuse or record oddly.

* ``tool_choice`` ``required`` / a named function: sampled under the family's call grammar (the HF
  engine's xgrammar mask), the record declares it and ``agentrl check --model`` replays it.
* ``reasoning`` (an adapter's ``{"effort", "enabled"}``) maps like ``reasoning_effort``.
* A request without ``tools`` gets the sampled ``<tool_call>`` text as content, streamed or not.
* A side call (another system prompt and other tools: a title request) is a root of its own, never the
  root the agent's conversation forks from.
* A route of another API dialect answers 404 naming it and the served ones, never the token.
* ``agentrl make-test-model --context N``.

Over ``make_test_model``'s 2-layer Qwen3 with the real Qwen3 tokenizer; turns that must hold given
text are teacher-forced (tests/_gateway.py), the grammar turns are really sampled.
"""
import json

import pytest

from _tokenizers import tokenizer_path

pytest.importorskip('transformers')
pytest.importorskip('starlette')
pytest.importorskip('uvicorn')
pytest.importorskip('xgrammar')
try:                       # openai >= 3 ships httpx2; older versions use httpx
    import httpx2 as httpx
except ImportError:
    httpx = pytest.importorskip('httpx')

from _gateway import ForcingHF  # noqa: E402
from agentrl.families import family_for  # noqa: E402
from agentrl.gateway import Gateway, GatewayError, parse_request, read_journal  # noqa: E402
from agentrl.gateway.protocol import template_options  # noqa: E402
from agentrl.gateway.server import Server  # noqa: E402
from agentrl.gym import TOOL_SCHEMAS  # noqa: E402
from agentrl.templates.chat import function_tools  # noqa: E402

TOOLS = function_tools(TOOL_SCHEMAS)
USER = [{'role': 'user', 'content': 'Fix clamp.'}]
OFF = {'enable_thinking': False}
READ = '<think>\nhm\n</think>\n\n<tool_call>\n{"name": "read", "arguments": {}}\n</tool_call><|im_end|>'
CALL_READ = '<tool_call>\n{"name": "read", "arguments": {}}\n</tool_call><|im_end|>'
NAMED = {'type': 'function', 'function': {'name': 'read'}}


@pytest.fixture(scope='module')
def model_dir(tmp_path_factory):
    from agentrl.engines import hf
    return hf.make_test_model(tmp_path_factory.mktemp('slips-model'), tokenizer_path('qwen3'),
                              token_rates={'</think>': 0.05})


@pytest.fixture(scope='module')
def upstream(model_dir):
    return ForcingHF(model_dir, device='cpu', max_new_tokens=24)


@pytest.fixture
def gw(upstream, tmp_path):
    g = Gateway(upstream, tmp_path / 'run')
    yield g
    g.pool.shutdown()
    g.journal.close()


def request(messages, **fields):
    return parse_request(json.dumps(dict({'messages': messages, 'max_tokens': 4}, **fields)).encode(), 1 << 20)[0]


def call(gw, s, messages, **fields):
    return gw.chat(s, request(messages, **fields), 'd', 0)[0]


def reply(resp):
    return {k: v for k, v in resp['choices'][0]['message'].items() if v is not None}


def records(run):
    from agentrl import store
    return store.read_trajectories(run / 'trajectories')


# ---------------------------------------------------------------------------- tool_choice required / named
def test_required_and_named_tool_choice_sample_a_call_that_the_record_declares_and_check_replays(
        gw, upstream, model_dir, tmp_path):
    from agentrl.cli.main import main as agentrl
    got = []
    for choice in (NAMED, 'required'):
        _, s = gw.open_session({'group_id': 'g', 'rollout_id': json.dumps(choice)[:12]})
        r = call(gw, s, USER, tools=TOOLS, tool_choice=choice, seed=2, temperature=0.5, max_tokens=120,
                 chat_template_kwargs=OFF)
        c = r['choices'][0]
        got.append((c['finish_reason'], c['message']['content'],
                    [(t['function']['name'], t['function']['arguments']) for t in c['message']['tool_calls']]))
        assert gw.finish(s, 1.0, {})['records'] == 1
    assert got == [('tool_calls', None, [('read', '{}')]), ('tool_calls', None, [('read', '{}')])]
    recs = sorted(records(tmp_path / 'run'), key=lambda t: t.provenance.sampling.constraint.tool_choice)
    assert [t.provenance.sampling.constraint.tool_choice for t in recs] == ['read', 'required']
    assert [(t.provenance.sampling.constraint.kind, t.provenance.sampling.constraint.start_after) for t in recs] == \
        [('tool_call', ())] * 2
    assert [[c['status'] for c in t.info['turn_calls'][0]] for t in recs] == [['ok'], ['ok']]
    calls = [e for e in read_journal(tmp_path / 'run' / 'journal.jsonl') if e['ev'] == 'call']
    assert [e['constraint']['tool_choice'] for e in calls] == ['read', 'required']
    _, s = gw.open_session({'group_id': 'g', 'rollout_id': 'open'})      # left open: a restart folds it back in
    call(gw, s, USER, tools=TOOLS, tool_choice=NAMED, seed=2, temperature=0.5, max_tokens=120, chat_template_kwargs=OFF)
    gw.pool.shutdown()
    gw.journal.close()
    again = Gateway(upstream, tmp_path / 'run')          # the restart folds the journalled grammar back in
    assert [c['constraint']['tool_choice'] for s in again.sessions.values() for c in s.calls] == ['read']
    again.pool.shutdown()
    again.journal.close()
    assert agentrl(['check', str(tmp_path / 'run'), '--model', str(model_dir)]) == 0


def test_the_grammar_starts_after_the_reasoning_unless_the_prompt_closed_it(gw, upstream):
    _, s = gw.open_session({})
    close = tuple(upstream.tokenizer('</think>', add_special_tokens=False)['input_ids'])
    for kw, after in (({}, close), ({'chat_template_kwargs': OFF}, ())):
        p = gw.prepare(s, request(USER, tools=TOOLS, tool_choice='required', **kw), 'd', 0)
        assert (p.constraint.kind, p.constraint.tool_choice, p.constraint.start_after) == ('tool_call', 'required',
                                                                                          after)
        assert p.constraint.stop_ids == tuple(sorted(gw.family.stop_ids(p.template)))
        gw.drop(p)
    assert close == (151668,)


def test_a_forced_call_is_refused_where_it_cannot_be_honoured(gw, upstream, monkeypatch):
    for body, message in [
        ({'tool_choice': 'required'}, 'tool_choice="required" forces a tool call, but the request has no tools; send '
                                      'tools or use "auto"'),
        ({'tool_choice': {'type': 'function', 'function': {'name': 'write'}}, 'tools': TOOLS},
         "tool_choice names 'write', which is not one of the tools (read, edit, test, submit); name one of them"),
        ({'tool_choice': 'any', 'tools': TOOLS}, 'tool_choice="any" is not a tool choice; use "auto", "none", '
                                                 '"required" or {"type": "function", "function": {"name": ...}}'),
    ]:
        with pytest.raises(GatewayError) as e:
            request(USER, **body)
        assert (e.value.status, e.value.message, e.value.param) == (400, message, 'tool_choice')
    _, s = gw.open_session({})
    monkeypatch.setattr(upstream, 'policy', 'vllm')
    with pytest.raises(GatewayError) as e:
        call(gw, s, USER, tools=TOOLS, tool_choice='required')
    assert e.value.message == ('tool_choice="required": the turn reasons before its call, and the vllm engine\'s '
                               'servers apply a grammar from the first token; send chat_template_kwargs '
                               '{"enable_thinking": false}, or serve with --engine hf')
    gw.drop(gw.prepare(s, request(USER, tools=TOOLS, chat_template_kwargs=OFF), 'd', 0))   # the template, gated
    monkeypatch.setattr(gw, 'family', family_for(name='qwen3_coder'))  # a family whose calls have no grammar here
    with pytest.raises(GatewayError) as e:
        call(gw, s, USER, tools=TOOLS, tool_choice=NAMED, chat_template_kwargs=OFF)
    assert e.value.message == ('tool_choice={"type": "function", "function": {"name": "read"}} cannot be honoured: '
                               'the qwen3_coder family has no tool-call grammar here (only Hermes JSON calls, the '
                               'qwen3 family, are constrained); use "auto"')
    assert s.calls == [] and s.branches == []


def test_one_conversation_samples_under_one_grammar(gw, upstream):
    _, s = gw.open_session({})
    upstream.force.append(CALL_READ)                     # a forced turn the grammar accepts
    r = call(gw, s, USER, tools=TOOLS, tool_choice=NAMED, chat_template_kwargs=OFF)
    assert r['choices'][0]['finish_reason'] == 'tool_calls'
    later = USER + [reply(r), {'role': 'tool', 'content': 'def clamp(x, lo, hi): ...'}]
    with pytest.raises(GatewayError) as e:
        call(gw, s, later, tools=TOOLS, chat_template_kwargs=OFF)
    assert (e.value.status, e.value.message) == (400, 'tool_choice="auto": this conversation\'s earlier turns were '
                                                      'sampled under tool_choice "read", and its record declares one '
                                                      'grammar for every turn; keep tool_choice the same within a '
                                                      'conversation, or open a new session')
    assert [len(b.steps) for b in s.branches] == [1]     # the refused call left the branch as it was


# ---------------------------------------------------------------------------- reasoning
def test_an_adapters_reasoning_object_maps_like_reasoning_effort(gw, upstream):
    req = request(USER, reasoning={'effort': 'high', 'enabled': False})
    assert (req.reasoning_effort, req.reasoning_enabled) == ('high', False)
    assert template_options(req, {'enable_thinking', 'reasoning_effort'}) == {'enable_thinking': False,
                                                                             'reasoning_effort': 'high'}
    assert request(USER, reasoning={'effort': 'none'}).reasoning_effort == 'none'
    assert request(USER, reasoning={'enabled': True}, reasoning_effort='low').recorded()['reasoning_enabled'] is True
    _, s = gw.open_session({})
    p = gw.prepare(s, req, 'd', 0)
    assert upstream.tokenizer.decode(p.plan.prompt_ids[-6:]) == 'assistant\n<think>\n\n</think>\n\n'
    gw.drop(p)
    for body, param, message in [
        ({'reasoning': {'effort': 'high', 'max_tokens': 9}}, 'reasoning.max_tokens',
         'reasoning.max_tokens cannot be honoured by this gateway; send only reasoning.effort and reasoning.enabled'),
        ({'reasoning': {'effort': 'huge'}}, 'reasoning.effort',
         'reasoning.effort must be one of none, minimal, low, medium, high, xhigh, max, got "huge"'),
        ({'reasoning': {'effort': 'low'}, 'reasoning_effort': 'high'}, 'reasoning.effort',
         'reasoning.effort="low" differs from reasoning_effort="high"; send one'),
        ({'reasoning': {'enabled': 'no'}}, 'reasoning.enabled', 'reasoning.enabled must be true or false, got "no"'),
        ({'reasoning': {'enabled': False}, 'chat_template_kwargs': {'enable_thinking': True}}, 'reasoning.enabled',
         'reasoning.enabled=false contradicts chat_template_kwargs.enable_thinking=true; send one'),
        ({'reasoning': 'high'}, 'reasoning',
         'reasoning must be a JSON object like {"effort": "high", "enabled": true}, got str'),
    ]:
        with pytest.raises(GatewayError) as e:
            request(USER, **body)
        assert (e.value.status, e.value.param, e.value.message) == (400, param, message)


# ---------------------------------------------------------------------------- no tools: no tool_calls
def test_without_tools_a_sampled_call_block_stays_content_streamed_or_not(upstream, tmp_path):
    srv = Server(Gateway(upstream, tmp_path / 'run')).start()
    try:
        sess = httpx.post(srv.url + '/sessions', json={'rollout_id': 'plain'}, timeout=120).json()
        url = f'{sess["base_url"]}/chat/completions'
        body = {'messages': USER, 'max_tokens': 40, 'seed': 3}
        upstream.force.append(READ)
        r = httpx.post(url, json=body, timeout=120).json()
        want = {'role': 'assistant', 'content': '<tool_call>\n{"name": "read", "arguments": {}}\n</tool_call>',
                'reasoning_content': 'hm'}
        assert (r['choices'][0]['message'], r['choices'][0]['finish_reason']) == (want, 'stop')
        upstream.force.append(READ)
        text, reasoning, reasons, calls = '', '', [], []
        with httpx.stream('POST', url, json=dict(body, stream=True), timeout=120) as resp:
            for line in resp.iter_lines():
                if line.startswith('data: {'):
                    ch = json.loads(line[6:])['choices'][0]
                    text += ch['delta'].get('content') or ''
                    reasoning += ch['delta'].get('reasoning_content') or ''
                    calls += ch['delta'].get('tool_calls') or []
                    reasons.append(ch['finish_reason'])
        assert (text, reasoning, calls, [x for x in reasons if x]) == (want['content'], 'hm', [], ['stop'])
        assert httpx.post(f'{srv.url}/sessions/{sess["token"]}/finish', json={'reward': 0.0}, timeout=120).json()['records'] == 2
    finally:
        srv.stop()
    recs = records(tmp_path / 'run')
    assert [t.info['turn_calls'] for t in recs] == [[[]], [[]]]
    assert [t.info['gateway']['finish_reasons'] for t in recs] == [['stop'], ['stop']]


# ---------------------------------------------------------------------------- side calls
TITLE = [{'role': 'system', 'content': 'Write a five-word title for the request.'}, USER[0]]
AGENT = [{'role': 'system', 'content': 'You fix bugs.'}, USER[0]]


@pytest.mark.parametrize('title_first', [True, False])
def test_a_side_call_is_its_own_root_and_the_agent_conversation_the_primary(gw, title_first):
    _, s = gw.open_session({'group_id': 'g', 'rollout_id': 'r'})
    if title_first:
        call(gw, s, TITLE, seed=1)
    r = call(gw, s, AGENT, seed=2, tools=TOOLS)
    call(gw, s, AGENT + [reply(r), {'role': 'user', 'content': 'Go on.'}], seed=3, tools=TOOLS)
    if not title_first:
        call(gw, s, TITLE, seed=1)
    agent, title = (1, 0) if title_first else (0, 1)
    assert s.forks == [] and [b.root for b in s.branches] == [0, 1]
    assert [len(b.turns) for b in s.branches] == ([1, 2] if title_first else [2, 1])
    assert gw.finish(s, 1.0, {})['records'] == 2
    got = {t.info['gateway']['branch']: t for t in records(gw.out)}
    assert (got[agent].provenance.rollout_id, got[agent].info['gateway']['side'], got[agent].info['gateway']['fork'],
            got[agent].info['gateway']['root']) == ('r', False, None, agent)
    assert (got[title].provenance.rollout_id, got[title].info['gateway']['side'],
            got[title].info['gateway']['root']) == (f'r/b{title}', True, title)


def test_a_change_of_tools_or_of_the_system_prompt_alone_still_forks(gw):
    _, s = gw.open_session({})
    r = call(gw, s, AGENT, seed=1, tools=TOOLS)
    call(gw, s, AGENT, seed=2)                                                   # the same opening, no tools
    call(gw, s, [{'role': 'system', 'content': 'You fix bugs fast.'}, USER[0]], seed=3, tools=TOOLS)
    call(gw, s, AGENT + [reply(r), {'role': 'user', 'content': 'Go on.'}], seed=4, tools=TOOLS)
    assert [(f['category'], f['parent']) for f in s.forks] == [('tools_changed', 0), ('system_prompt_changed', 0)]
    assert [b.root for b in s.branches] == [0, 0, 0] and [len(b.turns) for b in s.branches] == [2, 1, 1]
    gw.finish(s, 1.0, {})
    assert sorted((t.info['gateway']['branch'], t.info['gateway']['side']) for t in records(gw.out)) == [
        (0, False), (1, False), (2, False)]


# ---------------------------------------------------------------------------- routes of other dialects
def test_a_route_of_another_dialect_is_a_404_naming_it_and_never_the_token(upstream, tmp_path):
    srv = Server(Gateway(upstream, tmp_path / 'run')).start()
    try:
        token = httpx.post(srv.url + '/sessions', json={}, timeout=120).json()['token']
        served = ('it serves POST /s/TOKEN/v1/messages, POST /s/TOKEN/v1/responses, POST /s/TOKEN/v1/messages/count_tokens, '
                  'POST /s/TOKEN/v1/chat/completions, GET /s/TOKEN/v1/models (see docs/gateway.md)')
        for method, tail, status, what in [
            ('POST', 'completions', 404, 'the OpenAI completions (legacy) API is not served by this gateway'),
            ('POST', 'embeddings', 404, 'the OpenAI embeddings API is not served by this gateway'),
            ('GET', 'chat/completions', 405, 'the OpenAI chat completions API is not served with GET'),
            ('POST', 'audio/speech', 404, 'the OpenAI audio API is not served by this gateway'),
        ]:
            r = httpx.request(method, f'{srv.url}/s/{token}/v1/{tail}', json={})
            assert (r.status_code, r.json()['error']['message']) == (
                status, f'{method} /s/TOKEN/v1/{tail}: {what}; {served}')
            assert token not in r.text and r.json()['error']['type'] == 'not_found_error'
        r = httpx.get(f'{srv.url}/sessions/{token}/nothing', timeout=120)
        assert (r.status_code, r.json()['error']['message']) == (404, 'GET /sessions/TOKEN/nothing: no such route '
                                                                      '(see docs/gateway.md)')
    finally:
        srv.stop()


# ---------------------------------------------------------------------------- make-test-model --context
def test_make_test_model_context_sets_max_position_embeddings(tmp_path, capsys):
    from agentrl.cli.main import main
    for bad in ('16', '2000000'):
        assert main(['make-test-model', str(tmp_path / 'm'), '--context', bad]) == 2
        assert capsys.readouterr().err == f'agentrl: error: --context must be >= 32 and <= 1048576, got {bad}\n'
    assert not (tmp_path / 'm').exists()
    assert main(['make-test-model', str(tmp_path / 'm'), '--tokenizer', str(tokenizer_path('qwen3')),
                 '--context', '512', '--layers', '1']) == 0
    assert json.loads((tmp_path / 'm' / 'config.json').read_text())['max_position_embeddings'] == 512
