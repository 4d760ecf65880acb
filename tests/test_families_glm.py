"""The GLM-4.5/4.6/4.7 family, and what a template with no end-of-turn token asks of stops, bridges and records.

GLM's template writes no end-of-turn: the model stops a turn by sampling the next role token
(``<|observation|>`` before tool results, ``<|user|>`` before the user), which the template writes as
that message's header. The kit tokenizer (``tests/_families.py``, TRL's ``glm4moe`` template over
Qwen3's vocabulary with GLM's control tokens) gives the ids below: ``<|endoftext|>`` 151643,
``<|user|>`` 151672, ``<|assistant|>`` 151673, ``<|observation|>`` 151674.

* Parsing: a rendered turn parses back with exact spans; GLM-4.7's newline-free blocks; each malformed
  block's status; values typed by the tool schema.
* Stops: per turn kind from the family; the generation config's eos list joins the template's stops.
* Records: the bridge after a sampled ``<|observation|>`` starts after it (8 ids, where re-rendering the
  call gave 23 with ``<|observation|>`` twice); the record equals the template's own rendering in both
  history modes; a turn stopped at ``eos`` or cut gets the template's header, template-owned.
* The gateway's conformance gate records GLM with its sampled stops and passes, strict.
"""
import json

import pytest

pytest.importorskip('transformers')

from _families import kit_dir, kit_tokenizer  # noqa: E402
from agentrl.families import (GLM, INVALID_JSON, MISSING_NAME, OK, UNCLOSED_BLOCK, UNKNOWN_TOOL,  # noqa: E402
                              TurnEnd, family_for)
from agentrl.families.glm import typed_value  # noqa: E402
from agentrl.gateway.conformance import conformance  # noqa: E402
from agentrl.gym import TOOL_SCHEMAS  # noqa: E402
from agentrl.record import OWNER  # noqa: E402
from agentrl.templates import ChatRecorder, ChatTemplate  # noqa: E402
from agentrl.templates.bridge import template_bridge  # noqa: E402
from agentrl.templates.loading import generation_eos_ids  # noqa: E402

EOS, USER_ID, ASSISTANT_ID, OBS = 151643, 151672, 151673, 151674
USER = [{'role': 'user', 'content': 'Fix clamp.'}]
CALL = {'role': 'assistant', 'content': '', 'reasoning_content': 'look',
        'tool_calls': [{'type': 'function', 'function': {'name': 'read', 'arguments': {'path': 'clamp.py'}}}]}
CALL_TEXT = '\n<think>look</think>\n<tool_call>read\n<arg_key>path</arg_key>\n<arg_value>clamp.py</arg_value>\n</tool_call>'
TOOL = {'role': 'tool', 'content': 'def clamp'}
ANSWER = {'role': 'assistant', 'content': 'Done.'}
READ_TOOL = [{'name': 'read', 'description': 'Read a file.',
              'inputSchema': {'type': 'object', 'properties': {'path': {'type': 'string'}}}}]


@pytest.fixture(scope='module')
def tok():
    return kit_tokenizer('glm-4.5')


@pytest.fixture(scope='module')
def template(tok):
    return ChatTemplate(tok, tools=READ_TOOL)


# ---------------------------------------------------------------------------- parsing
def test_a_rendered_turn_with_reasoning_content_and_two_calls_parses_back(template):
    turn = {'role': 'assistant', 'content': 'Let me look.', 'reasoning_content': 'Read it first.',
            'tool_calls': [{'type': 'function', 'function': {'name': 'read', 'arguments': {'path': 'a.py'}}},
                           {'type': 'function', 'function': {'name': 'read', 'arguments': {'path': 'b c.py'}}}]}
    prompt = template.render(USER, True)
    text = template.render(USER + [turn, TOOL], True)[len(prompt):]
    text = text[:text.index('<|observation|>') + len('<|observation|>')]
    ids = template.encode(text)
    assert family_for(template) is GLM and ids[-1] == OBS
    reply = GLM.parse(ids, template, think_open=GLM.prompt_opens_reasoning(template, template.encode(prompt)))
    assert (reply.reasoning, reply.content) == ('Read it first.', 'Let me look.')
    assert [(c.name, c.arguments, c.status) for c in reply.calls] == [('read', {'path': 'a.py'}, OK),
                                                                      ('read', {'path': 'b c.py'}, OK)]
    assert [(c.chars, c.tokens) for c in reply.calls] == [((44, 124), (12, 25)), ((125, 207), (26, 40))]
    for c in reply.calls:
        assert template.decode(ids[c.tokens[0]:c.tokens[1]]).strip('\n') == c.text == reply.text[slice(*c.chars)]


def test_glm47_blocks_without_newlines_parse_and_strict_calls_read_after_reasoning():
    text = '<think>x <tool_call>no</tool_call></think><tool_call>edit<arg_key>op</arg_key><arg_value>flip</arg_value>' \
           '</tool_call><tool_call>test</tool_call>'
    reply = GLM.parse_text(text)
    assert reply.reasoning == 'x <tool_call>no</tool_call>' and reply.content == ''
    assert [(c.name, c.arguments, c.status, c.chars) for c in reply.calls] == [
        ('edit', {'op': 'flip'}, OK, (42, 117)), ('test', {}, OK, (117, 144))]
    assert [c.name for c in GLM.strict_calls(text)] == ['edit', 'test']
    assert GLM.strict_calls(text + '</tool_call>') is None


@pytest.mark.parametrize('text, tool_names, want', [
    ('a<tool_call>\n<arg_key>k</arg_key><arg_value>v</arg_value></tool_call>', None, (MISSING_NAME, None, None, (1, 69))),
    ('<tool_call>read\n<arg_key>k</arg_key>\n</tool_call>', None, (INVALID_JSON, 'read', None, (0, 49))),
    ('<tool_call>read\n<arg_key>k</arg_key><arg_value>v</arg_value> stray</tool_call>', None,
     (INVALID_JSON, 'read', None, (0, 78))),
    ('<tool_call>rm\n<arg_key>p</arg_key><arg_value>/</arg_value></tool_call>', ['read'],
     (UNKNOWN_TOOL, 'rm', {'p': '/'}, (0, 70))),
    ('ok <tool_call>read\n<arg_key>path</arg_key><arg_val', None, (UNCLOSED_BLOCK, None, None, (3, 50))),
])
def test_each_malformed_block_has_its_status_and_span(text, tool_names, want):
    [c] = GLM.parse_text(text, tool_names=tool_names).calls
    assert (c.status, c.name, c.arguments, c.chars) == want
    assert GLM.parse_text(text, tool_names=tool_names).content == text      # a malformed block stays content


@pytest.mark.parametrize('text, schema, want', [
    ('12', {'type': 'integer'}, 12), ('12', {'type': 'string'}, '12'), ('12', None, '12'),
    ('2.0', {'type': 'number'}, 2), ('2.5', {'type': 'number'}, 2.5), ('inf', {'type': 'number'}, 'inf'),
    ('1', {'type': 'boolean'}, True), (' False', {'type': 'boolean'}, False), ('yes', {'type': 'boolean'}, 'yes'),
    ('null', {'type': ['null', 'string']}, None), ('x', {'type': ['null', 'string']}, 'x'),
    ('{"a": [1]}', {'type': 'object'}, {'a': [1]}), ('[1, 2]', {'type': 'array'}, [1, 2]),
    ('[1e999]', {'type': 'array'}, '[1e999]'), ('3', {'enum': [1, 2, 3]}, 3), ('7', {'type': 'int'}, 7),
    ('[1]', {'type': 'object'}, [1]), ('twelve', {'type': 'integer'}, 'twelve'),
    ('5', {'anyOf': [{'type': 'integer'}, {'type': 'string'}]}, 5),
    ('null', {'enum': ['a', None]}, None), ('7', {'enum': ['a', '7']}, '7'), ('true', {'enum': [True]}, True),
])
def test_values_are_typed_by_the_schema_as_vllm_types_them(text, schema, want):
    got = typed_value(text, schema)
    assert (got, type(got)) == (want, type(want))


def test_a_schema_mapping_types_the_arguments_of_known_tools():
    text = '<tool_call>goto\n<arg_key>line</arg_key>\n<arg_value>12</arg_value>\n<arg_key>why</arg_key>\n' \
           '<arg_value> 3 </arg_value>\n</tool_call>'
    schemas = {'goto': {'type': 'object', 'properties': {'line': {'type': 'integer'}}}}
    assert GLM.parse_text(text, tool_names=schemas).calls[0].arguments == {'line': 12, 'why': ' 3 '}
    assert GLM.parse_text(text).calls[0].arguments == {'line': '12', 'why': ' 3 '}


# ---------------------------------------------------------------------------- stops
def test_each_turn_kind_stops_at_the_next_role_token_and_the_generation_config_joins_the_stops(tok):
    t = ChatTemplate(tok)
    assert (t.end_of_turn_id, sorted(t.stop_ids), t.stop_texts) == (
        None, [EOS, USER_ID, OBS], ['<|observation|>', '<|endoftext|>', '<|user|>'])
    assert GLM.turn_end(t, 'tool_call') == TurnEnd(frozenset({OBS}), None)
    assert GLM.turn_end(t, 'answer') == TurnEnd(frozenset({USER_ID, EOS}), None)
    bare = ChatTemplate(tok, generation_config=None)           # no generation config: the family still stops
    assert (sorted(bare.stop_ids), sorted(GLM.stop_ids(bare))) == ([EOS], [EOS, USER_ID, OBS])
    with pytest.raises(ValueError, match=r"^kind='call'; use one of \('answer', 'tool_call'\)$"):
        GLM.turn_end(t, 'call')


def test_generation_eos_ids_reads_the_list_the_file_or_the_tokenizer_folder(tok, tmp_path):
    assert generation_eos_ids(kit_dir('glm-4.5')) == (EOS, USER_ID, OBS) == generation_eos_ids(tok)
    assert generation_eos_ids({'eos_token_id': 7}) == (7,)
    assert generation_eos_ids({}) == () == generation_eos_ids(tmp_path) == generation_eos_ids(None)
    (tmp_path / 'generation_config.json').write_text(json.dumps({'eos_token_id': ['<|user|>']}))
    with pytest.raises(ValueError, match=r"generation_config.json: eos_token_id is \['<\|user\|>'\]; it must be an "
                                         r'int or a list of ints \(token ids\)$'):
        generation_eos_ids(tmp_path)
    with pytest.raises(ValueError, match=r'^generation_config: eos_token_id 999999 is outside the vocabulary'):
        ChatTemplate(tok, generation_config={'eos_token_id': [999999]})


# ---------------------------------------------------------------------------- records
@pytest.mark.parametrize('history', ['sampled', 'template'])
def test_the_bridge_after_a_sampled_observation_starts_after_it(template, history):
    rec = ChatRecorder(template, USER, history=history)
    turn_ids = template.encode(CALL_TEXT + '<|observation|>')
    rec.add_turn(turn_ids, message=CALL)
    prompt = rec.add_messages([TOOL])
    bridge = rec.bridges[-1]
    assert bridge.text == '\n<tool_response>\ndef clamp\n</tool_response><|assistant|>' and bridge.stop == '<|observation|>'
    assert len(bridge.ids) == 8 and bridge.ids[-1] == ASSISTANT_ID   # re-rendering the call gave 23 ids
    assert prompt == template.encode(template.render(USER + [CALL, TOOL], True))
    assert prompt.count(OBS) == 1
    rec.add_turn(template.encode('\n<think>ok</think>\nDone.<|user|>'), message=dict(ANSWER, reasoning_content='ok'))
    t = rec.finish()
    n = len(prompt)
    assert t.ids.tolist() == prompt + template.encode('\n<think>ok</think>\nDone.<|user|>')
    assert t.owner.tolist()[n - 9] == OWNER['policy'] and t.ids.tolist()[n - 9] == OBS   # the sampled stop
    assert t.owner.tolist()[n - 8:n] == [OWNER['template']] * 3 + [OWNER['tool']] * 2 + [OWNER['template']] * 3
    assert (t.info['template']['render_matches'], t.info['template']['closed_by_template']) == (True, [])


def test_an_answer_stopped_at_user_is_bridged_after_it_and_reasoning_history_is_rewritten(template):
    rec = ChatRecorder(template, USER, history='template')
    rec.add_turn(template.encode('\n<think>sure</think>\nDone.<|user|>'), message=ANSWER)
    follow = {'role': 'user', 'content': 'Sure?'}
    prompt = rec.add_messages([follow])
    assert rec.bridges[-1].text == '\nSure?<|assistant|>'
    assert prompt == template.encode(template.render(USER + [ANSWER, follow], True))


def test_a_call_turn_stopped_at_eos_gets_the_template_header_template_owned(template):
    rec = ChatRecorder(template, USER, history='sampled')
    rec.add_turn(template.encode(CALL_TEXT + '<|endoftext|>'), message=CALL)
    prompt = rec.add_messages([TOOL])
    assert rec.bridges[-1].text.startswith('<|observation|>\n<tool_response>') and rec.bridges[-1].stop == ''
    full = template.encode(template.render(USER + [CALL, TOOL], True))
    k = full.index(OBS)
    assert prompt == full[:k] + [EOS] + full[k:]
    rec.add_turn(template.encode('\n<think></think>\nDone.<|user|>'), message=ANSWER)
    t = rec.finish()
    assert t.owner.tolist()[k:k + 2] == [OWNER['policy'], OWNER['template']]
    assert (t.info['template']['closed_by_template'], t.info['template']['render_matches']) == ([0], True)


def test_a_cut_call_turn_gets_the_template_header(template):
    rec = ChatRecorder(template, USER, history='sampled')
    rec.add_turn(template.encode(CALL_TEXT), message=CALL)
    prompt = rec.add_messages([TOOL])
    assert prompt == template.encode(template.render(USER + [CALL, TOOL], True))
    assert rec.bridges[-1].text.startswith('<|observation|>') and rec.finish().info['template']['unterminated_turns'] == [0]


def test_template_bridge_without_the_sampled_stop_takes_the_one_the_template_writes(template):
    b = template_bridge(template, USER, [TOOL], turn=CALL)
    assert (b.stop, b.text) == ('<|observation|>', '\n<tool_response>\ndef clamp\n</tool_response><|assistant|>')


def test_the_conformance_gate_records_glm_with_its_sampled_stops(tok):
    for tools in (None, TOOL_SCHEMAS):
        rep = conformance(ChatTemplate(tok, tools=tools), strict=True, family=GLM)
        assert {k: rep[k] for k in ('conversations', 'turns', 'bridges', 'history_rewrites', 'turn_rewrites',
                                    'tool_calls')} == {'conversations': 2, 'turns': 7, 'bridges': 5,
                                                       'history_rewrites': 0, 'turn_rewrites': 0,
                                                       'tool_calls': 'parsed'}


def test_the_streaming_parser_equals_the_whole_parse_at_every_split():
    text = CALL_TEXT + '\nThen <tool_call>edit<arg_key>op</arg_key><arg_value>flip</arg_value></tool_call> ok'
    whole = GLM.parse_text(text, think_open=False)
    for k in range(len(text) + 1):
        s = GLM.stream(think_open=False)
        parts = [s.feed(text[:k]), s.feed(text[k:])]
        last, reply = s.finish()
        parts.append(last)
        assert (''.join(p[0] for p in parts), ''.join(p[1] for p in parts), [c for p in parts for c in p[2]]) == \
            (whole.reasoning, whole.content, list(whole.ok_calls)) == ('look', 'Then  ok', list(reply.ok_calls)), k
