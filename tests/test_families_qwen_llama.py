"""The Qwen3-Coder (XML calls, schema-typed values) and Llama 3.x (JSON calls) families.

* The registry: TRL's Qwen3.5/3.6 templates pick ``qwen3_coder``, Qwen3's and Qwen2.5's stay ``qwen3``,
  Llama 3.1/3.2 pick ``llama3``, Llama 3.0 (no call format) stays generic and is refused where calls
  are needed.
* Round trips: a turn with reasoning and calls rendered by the template parses back to its message,
  every value typed by its schema, with exact character and token spans.
* Each parameter type's conversion, and each malformed call's status and exact spans.
* Streaming equals the whole-reply parse on every split (hypothesis).
* Llama 3.x stops: the template's and ``<|eom_id|>``.
"""
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from _families import kit_tokenizer, trl_template
from _tokenizers import load
from agentrl.families import (FAMILIES, GENERIC, INVALID_JSON, LLAMA3, MISSING_NAME, OK, QWEN3, QWEN3_CODER, UNCLOSED_BLOCK,
                              UNKNOWN_TOOL, TurnEnd, family_for)
from agentrl.families.qwen3_coder import tool_properties, typed_value
from agentrl.gateway.parse import parse_reply
from agentrl.templates.labels import locate_messages

GREP = {'type': 'function', 'function': {'name': 'grep', 'description': 'Search.', 'parameters': {
    'type': 'object', 'properties': {'pattern': {'type': 'string'}, 'max': {'type': 'integer'},
                                     'case': {'type': 'boolean'}, 'paths': {'type': 'array'},
                                     'opts': {'type': 'object'}, 'frac': {'type': 'number'}}}}}
READ = {'type': 'function', 'function': {'name': 'read', 'parameters': {'type': 'object', 'properties': {}}}}
TOOLS = [GREP, READ]
ARGS = {'pattern': 'a b\n c', 'max': 3, 'case': True, 'paths': ['x', 'y'], 'opts': {'z': 1}, 'frac': 0.5}
USER = {'role': 'user', 'content': 'Find it.'}


def _template(base, trl=None, **kw):
    """The real ``base`` tokenizer with TRL's template ``trl`` (None: its own)."""
    from agentrl.templates import ChatTemplate
    return ChatTemplate(load(base), chat_template=trl_template(trl) if trl else None, **kw)


def _kit_template(name, **kw):
    from agentrl.templates import ChatTemplate
    return ChatTemplate(kit_tokenizer(name), **kw)


def _assistant_ids(template, messages):
    prompt = template.render(messages[:-1], True)
    part = template.render(messages)[len(prompt):]
    part = part[:part.index(template.end_of_turn_text) + len(template.end_of_turn_text)]
    return template.encode(prompt), template.encode(part)


def _xml(name, params):
    body = ''.join(f'<parameter={k}>\n{v}\n</parameter>\n' for k, v in params.items())
    return f'<tool_call>\n<function={name}>\n{body}</function>\n</tool_call>'


# ---------------------------------------------------------------------------- the registry
@pytest.mark.parametrize('base, trl, want', [
    ('qwen3', 'qwen3_5_think', 'qwen3_coder'), ('qwen3', 'qwen3_5_nothink', 'qwen3_coder'),
    ('qwen3', 'qwen3_6', 'qwen3_coder'), ('qwen3', 'qwen3', 'qwen3'), ('qwen3', 'qwen2_5', 'qwen3'),
    ('qwen3', None, 'qwen3'), ('llama3', 'llama3_1', 'llama3'), ('llama3', 'llama3_2', 'llama3'),
    ('llama3', None, 'generic'), ('llama3', 'llama3', 'generic'),
])
def test_the_registry_picks_the_family_from_the_template(base, trl, want):
    assert family_for(_template(base, trl)).name == want


def test_llama_3_0_writes_no_call_format_and_is_refused_where_calls_are_needed():
    template = _template('llama3')
    assert family_for(template) is GENERIC
    with pytest.raises(ValueError) as e:
        family_for(template, require_tools=True)
    assert str(e.value).startswith("no model family parses the tool calls of this template (picked 'generic'); pass "
                                   f"family= one of {', '.join(FAMILIES)} if")
    assert family_for(_template('llama3', 'llama3_1'), require_tools=True) is LLAMA3
    call = {'role': 'assistant', 'content': '',
            'tool_calls': [{'type': 'function', 'function': {'name': 'read', 'arguments': {}}}]}
    with pytest.raises(ValueError, match=r'^messages\[1\]\["tool_calls"\]: this chat template does not render tool '
                                         r"calls \(the call to 'read' is missing from its rendering\)"):
        locate_messages(template, [USER, call])            # the 3.0 refusal stays where it was


# ---------------------------------------------------------------------------- Qwen3-Coder: round trip
@pytest.mark.parametrize('trl, case_text', [('qwen3_5_think', 'True'), ('qwen3_6', 'true')])
def test_a_rendered_xml_turn_parses_back_with_every_value_typed(trl, case_text):
    template = _template('qwen3', trl, tools=TOOLS)
    family = family_for(template).for_tools(TOOLS)
    turn = {'role': 'assistant', 'content': 'Let me look.', 'reasoning_content': 'Read it.',
            'tool_calls': [{'type': 'function', 'function': {'name': 'grep', 'arguments': ARGS}},
                           {'type': 'function', 'function': {'name': 'read', 'arguments': {}}}]}
    prompt_ids, ids = _assistant_ids(template, [USER, turn])
    think = family.prompt_opens_reasoning(template, prompt_ids)
    assert think is True and ids[-1] == template.end_of_turn_id
    reply = family.parse(ids, template, think_open=think, tool_names=('grep', 'read'))
    assert (reply.reasoning, reply.content) == ('Read it.', 'Let me look.')
    assert [(c.name, c.arguments, c.status) for c in reply.calls] == [('grep', ARGS, OK), ('read', {}, OK)]
    assert f'<parameter=case>\n{case_text}\n</parameter>' in reply.calls[0].text
    assert [(c.chars, c.tokens) for c in reply.calls] == [((33, 306), (9, 92)), ((307, 359), (93, 103))]
    for c in reply.calls:
        assert template.decode(ids[c.tokens[0]:c.tokens[1]]).strip('\n') == c.text == reply.text[c.chars[0]:c.chars[1]]
    untyped = QWEN3_CODER.parse(ids, template, think_open=think).calls[0].arguments
    assert untyped == {'pattern': 'a b\n c', 'max': '3', 'case': case_text, 'paths': '["x", "y"]',
                       'opts': '{"z": 1}', 'frac': '0.5'}


def test_the_gateway_message_of_an_xml_call_has_typed_json_arguments():
    text = 'Ok.\n\n' + _xml('grep', {'max': '7', 'pattern': ' two spaces '})
    msg = parse_reply(text, QWEN3_CODER.for_tools(TOOLS), id_seed='s/0', think_open=False)
    assert msg['content'] == 'Ok.'
    assert [c['function'] for c in msg['tool_calls']] == [{'name': 'grep',
                                                           'arguments': '{"max": 7, "pattern": " two spaces "}'}]
    assert QWEN3.for_tools(TOOLS) is QWEN3 and LLAMA3.for_tools(TOOLS) is LLAMA3


def test_tool_properties_reads_openai_and_bare_tools():
    assert tool_properties([GREP, READ, {'name': 'bare', 'parameters': {'properties': {'n': {'type': 'int'}}}},
                            {'type': 'function', 'function': {'name': 'noparams'}}]) == \
        {'grep': GREP['function']['parameters']['properties'], 'read': {}, 'bare': {'n': {'type': 'int'}},
         'noparams': {}}
    assert tool_properties(None) == {}


# ---------------------------------------------------------------------------- Qwen3-Coder: typing
@pytest.mark.parametrize('text, schema, want', [
    ('42', {'type': 'integer'}, (True, 42)),
    ('-4', {'type': 'int'}, (True, -4)),
    ('4.5', {'type': 'integer'}, (False, None)),
    ('abc', {'type': 'integer'}, (False, None)),
    ('4.5', {'type': 'number'}, (True, 4.5)),
    ('2.0', {'type': 'number'}, (True, 2)),
    ('1e999', {'type': 'number'}, (False, None)),
    ('nan', {'type': 'float'}, (False, None)),
    ('True', {'type': 'boolean'}, (True, True)),
    (' FALSE ', {'type': 'boolean'}, (True, False)),
    ('1', {'type': 'bool'}, (True, True)),
    ('0', {'type': 'boolean'}, (True, False)),
    ('yes', {'type': 'boolean'}, (False, None)),
    ('NULL', {'type': ['null', 'string']}, (True, None)),
    ('nil', {'type': ['null', 'string']}, (True, 'nil')),
    ('null', {'type': 'null'}, (True, None)),
    ('[1, "a"]', {'type': 'array'}, (True, [1, 'a'])),
    ('{"a": {"b": null}}', {'type': 'object'}, (True, {'a': {'b': None}})),
    ('[1e999]', {'type': 'list'}, (False, None)),
    ('{bad', {'type': 'dict'}, (False, None)),
    ('12', {'type': 'string'}, (True, '12')),
    ('12', None, (True, '12')),
    ('12', {'description': 'no type'}, (True, '12')),
    (' x \n', {'type': 'string'}, (True, ' x \n')),
    ('7', {'enum': [1, 2, 7]}, (True, 7)),
    ('true', {'enum': [True, 'maybe']}, (True, True)),
    ('7', {'anyOf': [{'type': 'integer'}, {'type': 'string'}]}, (True, 7)),
    ('x', {'anyOf': [{'type': 'integer'}, {'type': 'string'}]}, (True, 'x')),
    ('3', {'type': ['boolean', 'integer']}, (True, 3)),
    ('1', {'type': ['boolean', 'number']}, (True, 1)),
])
def test_each_schema_type_converts_a_value_as_vllm_does(text, schema, want):
    got = typed_value(text, schema)
    assert got == want and type(got[1]) is type(want[1])


# ---------------------------------------------------------------------------- Qwen3-Coder: malformed calls
_CALL = _xml('read', {'path': 'a.py'})


@pytest.mark.parametrize('text, tool_names, want', [
    ('x' + _CALL[:-12], None, (None, None, UNCLOSED_BLOCK, (1, 76), (1, 20))),
    ('<tool_call>\n<function=>\n</function>\n</tool_call>', None, (None, None, MISSING_NAME, (0, 48), (0, 10))),
    ('<tool_call>\n{"name": "read"}\n</tool_call>', None, (None, None, MISSING_NAME, (0, 41), (0, 9))),
    ('<tool_call>\n<function=read>\n</tool_call>', None, ('read', None, INVALID_JSON, (0, 40), (0, 7))),
    ('<tool_call>\n<function=read>\nhm\n</function>\n</tool_call>', None, ('read', None, INVALID_JSON, (0, 55),
                                                                          (0, 12))),
    ('<tool_call>\n<function=read>\n<parameter=path>\na.py\n</function>\n</tool_call>', None,
     ('read', None, INVALID_JSON, (0, 74), (0, 17))),
    ('<tool_call>\n<function=read>\n<parameter=>\nx\n</parameter>\n</function>\n</tool_call>', None,
     ('read', None, INVALID_JSON, (0, 80), (0, 19))),
    ('<tool_call>\n<function=grep>\n<parameter=max>\nten\n</parameter>\n</function>\n</tool_call>', None,
     ('grep', None, INVALID_JSON, (0, 85), (0, 20))),
    (_CALL.replace('read', 'rm'), ('read',), ('rm', {'path': 'a.py'}, UNKNOWN_TOOL, (0, 85), (0, 21))),
])
def test_each_malformed_xml_call_has_its_status_and_exact_spans(text, tool_names, want):
    template = _template('qwen3')
    family = QWEN3_CODER.for_tools(TOOLS)
    ids = template.encode(text)
    reply = family.parse(ids, template, tool_names=tool_names)
    assert [(c.name, c.arguments, c.status, c.chars, c.tokens) for c in reply.calls] == [want]
    (c,) = reply.calls
    assert template.decode(ids[c.tokens[0]:c.tokens[1]]).endswith(c.text)
    assert reply.content == text and reply.ok_calls == ()          # a malformed block stays content, verbatim
    assert family.strict_calls(text) is None or want[2] == UNKNOWN_TOOL


def test_a_function_outside_a_block_is_content_and_the_last_of_a_repeated_parameter_wins():
    text = '<function=read>\n</function>'
    assert (QWEN3_CODER.parse_text(text).content, QWEN3_CODER.parse_text(text).calls) == (text, ())
    twice = _xml('grep', {'max': '1'}).replace('</function>', '<parameter=max>\n2\n</parameter>\n</function>')
    assert QWEN3_CODER.for_tools(TOOLS).parse_text(twice).calls[0].arguments == {'max': 2}
    assert [c.arguments for c in QWEN3_CODER.strict_calls(f'<think>\n{_CALL}\n</think>\n\n{_CALL}')] == \
        [{'path': 'a.py'}]


# ---------------------------------------------------------------------------- Qwen3-Coder: streaming
XML_PIECES = ['<think>', '</think>', '\n', '\n\n', 'a', 'hm ', '<', '</', '<tool_', '<tool_call>', '</tool_call>',
              '\n<function=grep>\n', '<function=', 'read>', '<parameter=max>\n', '3', 'x', '\n</parameter>\n',
              '</function>\n', _CALL, _xml('grep', {'max': '4', 'case': 'true'}), 'é']


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from(XML_PIECES), max_size=12), st.booleans(), st.booleans(), st.data())
def test_xml_streaming_equals_the_whole_reply_parse_on_every_split(pieces, think, tools, data):
    family = QWEN3_CODER.for_tools(TOOLS)
    text = ''.join(pieces)
    cuts = sorted(data.draw(st.lists(st.integers(0, len(text)), max_size=8)))
    parser, out = family.stream(think, tools), []
    for a, b in zip([0] + cuts, cuts + [len(text)]):
        out.append(parser.feed(text[a:b]))
    last, reply = parser.finish()
    out.append(last)
    assert reply == family.parse_text(text, think_open=think, tools=tools)
    assert ''.join(r for r, _, _ in out) == (reply.reasoning or '')
    assert ''.join(c for _, c, _ in out) == reply.content
    assert [c for _, _, calls in out for c in calls] == list(reply.ok_calls)


# ---------------------------------------------------------------------------- Llama 3.x
def _llama(name, args, key='parameters'):
    return json.dumps({'name': name, key: args})


def test_a_rendered_llama_call_and_answer_parse_back():
    template = _template('llama3', 'llama3_1', tools=TOOLS)
    turn = {'role': 'assistant', 'content': '', 'tool_calls': [{'type': 'function',
                                                                'function': {'name': 'grep', 'arguments': ARGS}}]}
    prompt_ids, ids = _assistant_ids(template, [USER, turn])
    assert LLAMA3.prompt_opens_reasoning(template, prompt_ids) is False
    reply = LLAMA3.parse(ids, template, think_open=False, tool_names=('grep', 'read'))
    assert (reply.content, reply.reasoning) == ('', None)
    assert [(c.name, c.arguments, c.status, c.chars, c.tokens) for c in reply.calls] == \
        [('grep', ARGS, OK, (0, 130), (0, 55))]
    answer = {'role': 'assistant', 'content': 'It is {fixed}.'}
    _, ids = _assistant_ids(template, [USER, answer])
    assert LLAMA3.parse(ids, template, think_open=False) == LLAMA3.parse_text('It is {fixed}.', think_open=False)
    assert LLAMA3.parse_text('It is {fixed}.').calls == ()


def test_llama_stops_are_the_templates_and_eom():
    template = _kit_template('llama3.1')
    eot, eom = template.encode('<|eot_id|>')[0], template.encode('<|eom_id|>')[0]
    # the kit's generation_config.json lists <|end_of_text|>, <|eom_id|>, <|eot_id|> (as Llama 3.1's does)
    assert (eot, template.end_of_turn_id, template.stop_ids) == (128009, 128009, frozenset({128001, 128009, 128256}))
    assert LLAMA3.stop_ids(template) == frozenset({eot, eom, 128001}) and eom == 128256
    assert LLAMA3.turn_end(template, 'tool_call') == TurnEnd(frozenset({eot, eom, 128001}), eot)
    assert LLAMA3.stop_ids(_template('llama3', 'llama3_1')) == frozenset({128009})   # 3.0 vocabulary: no eom
    ids = template.encode(_llama('read', {}) + '<|eom_id|>')
    assert [(c.name, c.status) for c in LLAMA3.parse(ids, template).calls] == [('read', OK)]


@pytest.mark.parametrize('text, tool_names, want', [
    ('{"name": "read", "parameters": {"path": "a', None, [(None, None, UNCLOSED_BLOCK, (0, 42), (0, 14))]),
    ('  {"parameters": {}}', None, [(None, None, MISSING_NAME, (2, 20), (1, 6))]),
    ('{"answer": 3}', None, [(None, None, MISSING_NAME, (0, 13), (0, 6))]),
    ('{bad}', None, [(None, None, INVALID_JSON, (0, 5), (0, 3))]),
    ('{"name": "read", "parameters": [1]}', None, [('read', None, INVALID_JSON, (0, 35), (0, 12))]),
    ('<|python_tag|>{"name": "rm", "parameters": {}}', ('read',), [('rm', {}, UNKNOWN_TOOL, (0, 46), (0, 16))]),
    ('{"name": "read", "parameters": {}}; {bad', None, [('read', {}, OK, (0, 34), (0, 11)),
                                                       (None, None, UNCLOSED_BLOCK, (34, 40), (11, 14))]),
])
def test_each_malformed_llama_call_has_its_status_and_exact_spans(text, tool_names, want):
    template = _template('llama3', 'llama3_1')          # the 3.0 vocabulary: <|python_tag|> is plain text here
    reply = LLAMA3.parse(template.encode(text), template, tool_names=tool_names)
    assert [(c.name, c.arguments, c.status, c.chars, c.tokens) for c in reply.calls] == want
    for c in reply.calls:
        assert template.decode(template.encode(text)[c.tokens[0]:c.tokens[1]]).endswith(c.text)
    assert LLAMA3.strict_calls(text) is None or want[0][2] == UNKNOWN_TOOL


def test_llama_calls_are_the_reply_separated_by_semicolons_and_text_before_one_is_content():
    two = '<|python_tag|>' + _llama('read', {}) + ' ;\n' + _llama('grep', {'max': 1}, 'arguments') + '\n'
    reply = LLAMA3.parse_text(two, think_open=False)
    assert [(c.name, c.arguments, c.chars) for c in reply.calls] == [('read', {}, (0, 48)), ('grep', {'max': 1},
                                                                                            (48, 92))]
    assert reply.content == '' and [c.name for c in LLAMA3.strict_calls(two)] == ['read', 'grep']
    after = _llama('read', {}) + ' then more'
    assert LLAMA3.parse_text(after).content == ' then more' and LLAMA3.strict_calls(after) is None
    before = 'Sure: ' + _llama('read', {})
    assert (LLAMA3.parse_text(before).calls, LLAMA3.strict_calls(before)) == ((), [])
    assert LLAMA3.parse_text('{"name": "read", "parameters": {}}', tools=False).content == _llama('read', {})


LLAMA_PIECES = ['<|python_tag|>', '<|python', '_tag|>', ' ', '\n', '{', '}', ';', '"', '\\', 'a', 'Sure ',
                _llama('read', {}), _llama('grep', {'max': 1}), '{"name": "x", ', '"parameters": {}}', '{bad}', 'é']


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from(LLAMA_PIECES), max_size=10), st.booleans(), st.data())
def test_llama_streaming_equals_the_whole_reply_parse_on_every_split(pieces, tools, data):
    text = ''.join(pieces)
    cuts = sorted(data.draw(st.lists(st.integers(0, len(text)), max_size=8)))
    parser, out = LLAMA3.stream(False, tools), []
    for a, b in zip([0] + cuts, cuts + [len(text)]):
        out.append(parser.feed(text[a:b]))
    last, reply = parser.finish()
    out.append(last)
    assert reply == LLAMA3.parse_text(text, think_open=False, tools=tools)
    assert all(r == '' for r, _, _ in out) and reply.reasoning is None
    assert ''.join(c for _, c, _ in out) == reply.content
    assert [c for _, _, calls in out for c in calls] == list(reply.ok_calls)


def test_the_bridge_after_a_llama_call_turn_whose_content_the_template_drops():
    # Llama 3.1's template writes a tool-call turn as the call JSON alone (no content): the bridge starts after
    # the turn's end of turn, found by rendering the conversation up to the turn
    from agentrl.templates import ChatRecorder
    from agentrl.templates.bridge import template_bridge
    from agentrl.gym import TOOL_SCHEMAS
    template = _kit_template('llama3.1', tools=TOOL_SCHEMAS)
    user = [{'role': 'user', 'content': 'Fix clamp.'}]
    call = {'role': 'assistant', 'content': '',
            'tool_calls': [{'type': 'function', 'function': {'name': 'read', 'arguments': {'path': 'a.py'}}}]}
    result = [{'role': 'tool', 'content': 'def clamp(x): ...'}]
    b = template_bridge(template, user, result, turn=call)
    assert b.stop == '<|eot_id|>' and b.text == template.render(user + [call] + result, True)[
        len(template.render(user + [call], False)):]
    rec = ChatRecorder(template, user)
    rec.add_turn(template.encode('{"name": "read", "parameters": {"path": "a.py"}}<|eot_id|>'), message=call)
    assert rec.add_messages(result) == template.encode(template.render(user + [call] + result, True))
