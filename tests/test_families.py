"""Model families: a reply rendered by the real template parses back to its message, per family.

* Round trips: a conversation with reasoning and tool calls rendered through the Qwen3 tokenizer's
  template and the tiny test template; its assistant part's ids parse back to the message, each
  call ``ok`` with its exact token and character span. The generic family (Llama 3) gives the
  answer back as content.
* Each malformed call: its exact status, character span and token span.
* The streaming parser: for every split of a reply into pieces, what it gives out concatenates to
  the whole-reply parse (hypothesis).
* The registry: the pick per tokenizer, the override by name, and the one-line refusals.
"""
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from _tokenizers import load
from agentrl.families import (FAMILIES, GENERIC, INVALID_JSON, MISSING_NAME, OK, QWEN3, QWEN3_CODER, UNCLOSED_BLOCK,
                              UNKNOWN_TOOL, Family, TurnEnd, family_for, family_names, register)
from agentrl.gym import TOOL_SCHEMAS


def _template(name, **kw):
    from agentrl.templates import ChatTemplate
    return ChatTemplate(load(name), **kw)


READ = {'type': 'function', 'function': {'name': 'read', 'arguments': {}}}
EDIT = {'type': 'function', 'function': {'name': 'edit', 'arguments': {'op': 'swap_minmax'}}}
TURN = {'role': 'assistant', 'content': 'Let me look.', 'reasoning_content': 'Read it first.',
        'tool_calls': [READ, EDIT]}
USER = {'role': 'user', 'content': 'Fix clamp.'}


def _assistant_ids(template, messages):
    """``(prompt ids, the last assistant message's ids through its end of turn)`` as the template renders them."""
    prompt = template.render(messages[:-1], True)
    part = template.render(messages)[len(prompt):]
    part = part[:part.index(template.end_of_turn_text) + len(template.end_of_turn_text)]
    return template.encode(prompt), template.encode(part)


# ---------------------------------------------------------------------------- round trips
@pytest.mark.parametrize('name, spans', [
    ('qwen3', [((46, 104), (12, 26)), ((105, 182), (27, 47))]),
    ('tiny', [((46, 104), (20, 34)), ((105, 182), (35, 62))]),
])
def test_a_rendered_turn_with_reasoning_and_calls_parses_back_to_its_message(name, spans):
    template = _template(name, tools=TOOL_SCHEMAS)
    family = family_for(template)
    assert family is QWEN3
    prompt_ids, ids = _assistant_ids(template, [USER, TURN])
    assert ids[-1] == template.end_of_turn_id
    reply = family.parse(ids, template, think_open=family.prompt_opens_reasoning(template, prompt_ids))
    assert (reply.reasoning, reply.content) == ('Read it first.', 'Let me look.')
    assert [(c.name, c.arguments, c.status) for c in reply.calls] == [('read', {}, OK),
                                                                      ('edit', {'op': 'swap_minmax'}, OK)]
    assert [(c.chars, c.tokens) for c in reply.calls] == spans
    for c in reply.calls:               # each token span decodes to a text that holds exactly its block
        assert template.decode(ids[c.tokens[0]:c.tokens[1]]).strip('\n') == c.text == reply.text[c.chars[0]:c.chars[1]]
        assert c.text.startswith('<tool_call>') and c.text.endswith('</tool_call>')


def test_qwen3_without_thinking_opens_no_reasoning_and_an_answer_is_content():
    template = _template('qwen3', enable_thinking=False)
    answer = {'role': 'assistant', 'content': 'It is fixed.'}
    prompt_ids, ids = _assistant_ids(template, [USER, answer])
    assert template.decode(prompt_ids).endswith('<think>\n\n</think>\n\n')
    think = QWEN3.prompt_opens_reasoning(template, prompt_ids)
    assert think is False
    reply = QWEN3.parse(ids, template, think_open=think)
    assert (reply.content, reply.reasoning, reply.calls) == ('It is fixed.', None, ())


def test_the_generic_family_gives_an_answer_back_as_content():
    template = _template('llama3')
    family = family_for(template)
    assert family is GENERIC and not family.parses_tools
    answer = {'role': 'assistant', 'content': 'It is fixed. <tool_call>{"name": "read"}</tool_call>'}
    prompt_ids, ids = _assistant_ids(template, [USER, answer])
    reply = family.parse(ids, template, think_open=family.prompt_opens_reasoning(template, prompt_ids))
    assert (reply.content, reply.reasoning, reply.calls) == (answer['content'], None, ())


# ---------------------------------------------------------------------------- malformed calls
@pytest.mark.parametrize('text, tool_names, want', [
    ('Ok.\n<tool_call>{bad}</tool_call>', None, (None, None, INVALID_JSON, (4, 32), (2, 7))),
    ('<tool_call>[1]</tool_call>', None, (None, None, INVALID_JSON, (0, 26), (0, 5))),
    ('<tool_call>{"name": "a", "arguments": "[1]"}</tool_call>', None, ('a', None, INVALID_JSON, (0, 56), (0, 15))),
    ('<tool_call>{"arguments": {}}</tool_call>', None, (None, None, MISSING_NAME, (0, 40), (0, 7))),
    ('<tool_call>{"name": 3}</tool_call>', None, (None, None, MISSING_NAME, (0, 34), (0, 8))),
    ('x<tool_call>{"name": "read"', None, (None, None, UNCLOSED_BLOCK, (1, 27), (1, 8))),
    ('<tool_call>{"name": "rm", "arguments": {}}</tool_call>', ('read',), ('rm', {}, UNKNOWN_TOOL, (0, 54), (0, 13))),
])
def test_each_malformed_call_has_its_status_and_exact_spans(text, tool_names, want):
    template = _template('qwen3')
    ids = template.encode(text)
    reply = QWEN3.parse(ids, template, tool_names=tool_names)
    assert [(c.name, c.arguments, c.status, c.chars, c.tokens) for c in reply.calls] == [want]
    assert reply.content == text and reply.ok_calls == ()          # a malformed block stays content, verbatim
    assert QWEN3.parse_text(text, tool_names=tool_names).calls[0].tokens is None
    assert QWEN3.strict_calls(text) is None or want[2] == UNKNOWN_TOOL


def test_a_span_starts_at_the_token_that_holds_its_first_character():
    template = _template('tiny')
    ids = template.encode('é<tool_call>{"arguments": {}}</tool_call>')
    assert template.tokens(ids)[:3] == ['Ã', '©', '<tool_call>']       # é is two byte tokens
    (call,) = QWEN3.parse(ids, template).calls
    assert (call.status, call.chars, call.tokens) == (MISSING_NAME, (1, 41), (2, 8))


def test_strict_calls_read_after_the_reasoning_and_refuse_a_stray_mark():
    call = '<tool_call>\n{"name": "read", "arguments": {}}\n</tool_call>'
    assert [(c.name, c.arguments) for c in QWEN3.strict_calls(f'<think>\n{call}\n</think>\n\n{call}')] == [('read', {})]
    assert QWEN3.strict_calls(f'<think>\n{call}\n</think>\n\nno call') == []
    assert QWEN3.strict_calls(call + '</tool_call>') is None
    assert QWEN3.strict_calls('<tool_call>{"name": "read"}') is None


# ---------------------------------------------------------------------------- streaming
CALL = '<tool_call>\n{"name": "read", "arguments": {"path": "clamp.py"}}\n</tool_call>'
PIECES = ['<think>', '</think>', '\n', '\n\n', 'a', 'hm ', '<', '</', '<tool_', CALL, '<tool_call>{bad}</tool_call>',
          '<tool_call>', '{"name": "x", "arguments": {}}', '</tool_call>', 'é']


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from(PIECES), max_size=10), st.booleans(), st.booleans(), st.data())
def test_the_streaming_parser_equals_the_whole_reply_parse_on_every_split(pieces, think, tools, data):
    text = ''.join(pieces)
    cuts = sorted(data.draw(st.lists(st.integers(0, len(text)), max_size=8)))
    parser, out = QWEN3.stream(think, tools), []
    for a, b in zip([0] + cuts, cuts + [len(text)]):
        out.append(parser.feed(text[a:b]))
    last, reply = parser.finish()
    out.append(last)
    assert reply == QWEN3.parse_text(text, think_open=think, tools=tools)
    assert ''.join(r for r, _, _ in out) == (reply.reasoning or '')
    assert ''.join(c for _, c, _ in out) == reply.content
    assert [c for _, _, calls in out for c in calls] == list(reply.ok_calls)


# ---------------------------------------------------------------------------- stops and ends of turn
def test_stops_and_ends_of_turn_come_from_the_template():
    template = _template('qwen3')
    assert QWEN3.stop_ids(template) == template.stop_ids == frozenset({151645})
    for kind in ('answer', 'tool_call'):
        assert QWEN3.turn_end(template, kind) == TurnEnd(frozenset({151645}), 151645)
    with pytest.raises(ValueError, match=r"^kind='call'; use one of \('answer', 'tool_call'\)$"):
        QWEN3.turn_end(template, 'call')


# ---------------------------------------------------------------------------- the registry
def test_the_registry_picks_by_markers_and_takes_a_name():
    assert [family_for(load(n)).name for n in ('qwen3', 'tiny', 'llama3', 'deepseek-v3')] == \
        ['qwen3', 'qwen3', 'generic', 'deepseek-v3']
    assert family_for(_template('qwen3')).name == 'qwen3'           # a ChatTemplate or its tokenizer
    assert family_for(load('llama3'), name='qwen3') is QWEN3
    assert family_for(name='generic') is GENERIC
    assert family_names()[0] == 'qwen3' and family_names()[-1] == 'generic'
    assert {'qwen3_coder', 'llama3', 'glm', 'gpt-oss'} <= set(family_names())
    with pytest.raises(ValueError) as e:
        family_for(load('llama3'), name='llama2')
    assert str(e.value) == f"family='llama2' is not a model family; use one of {', '.join(family_names())}"


def test_a_caller_that_needs_tool_calls_refuses_a_template_no_family_parses():
    with pytest.raises(ValueError) as e:
        family_for(load('llama3'), require_tools=True)
    assert str(e.value) == ("no model family parses the tool calls of this template (picked 'generic'); pass family= "
                            f"one of {', '.join(FAMILIES)} if its calls are in that format, or add a family module "
                            "(docs/design.md#families)")
    assert family_for(load('qwen3'), require_tools=True) is QWEN3


def test_the_family_with_more_matching_markers_wins_and_names_are_unique():
    class Coder(Family):
        name, markers, call_open = 'coder-test', ('<tool_call>', '<function=', '<parameter='), '<tool_call>'

    class Source:
        source, tokenizer = 'x <tool_call> <function=NAME> y', None

    assert family_for(Source()) is QWEN3_CODER                      # two markers beat Hermes' one
    try:
        fam = register(Coder())
        assert family_for(Source()) is QWEN3_CODER                  # all of a family's markers must occur
        Source.source += ' <parameter=P>'
        assert family_for(Source()) is fam
        assert family_for(_template('qwen3')) is QWEN3
    finally:
        FAMILIES.pop('coder-test', None)
    with pytest.raises(ValueError) as e:
        register(QWEN3)
    assert str(e.value) == f"family name 'qwen3' is empty, reserved or taken; registered: {family_names()}"
