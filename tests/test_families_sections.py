"""DeepSeek V3, DeepSeek V3.1 and Kimi K2: calls inside a calls section, parsed with statuses, spans and ids.

* Round trips: a turn with content and two calls, rendered by the family's test template
  (``tests/_families.py`` kits), parses back from its ids: each call ``ok`` with its exact character and
  token spans (the first span holds the section's open mark, the last its close mark); Kimi's calls
  keep their own ids, which the gateway returns as the calls' ids.
* Reasoning: R1's and V3-0324's generation prompt (TRL's templates) and V3.1's thinking mode open
  the block; a call inside the reasoning is not a call.
* Each malformed call: its exact status and span; strict reading refuses it.
* Streaming: for every cut of each reply (and one piece per character), what the parser gives out
  concatenates to the whole-reply parse.
"""
import pytest

from _families import kit_tokenizer, trl_template
from agentrl.families import (DEEPSEEK_V3, DEEPSEEK_V31, INVALID_JSON, KIMI_K2, MISSING_NAME, OK, UNCLOSED_BLOCK,
                              UNKNOWN_TOOL, family_for)
from agentrl.gateway.parse import parse_reply, tool_call_id
from agentrl.gym import TOOL_SCHEMAS

READ = {'type': 'function', 'function': {'name': 'read', 'arguments': {'path': 'a.py'}}}
EDIT = {'type': 'function', 'function': {'name': 'edit', 'arguments': {'op': 'swap_minmax'}}}
USER = {'role': 'user', 'content': 'Fix clamp.'}
KIMI_TURN = {'role': 'assistant', 'content': 'Let me look.', 'reasoning_content': 'Read it first.',
             'tool_calls': [dict(READ, id='functions.read:0'), dict(EDIT, id='functions.edit:1')]}

V3_SEC, V3_END = '<｜tool▁calls▁begin｜>', '<｜tool▁calls▁end｜>'
V3_CALL = ('<｜tool▁call▁begin｜>function<｜tool▁sep｜>read\n```json\n{"path": "a.py"}\n```<｜tool▁call▁end｜>')
V31_CALL = '<｜tool▁call▁begin｜>read<｜tool▁sep｜>{"path": "a.py"}<｜tool▁call▁end｜>'
K_SEC, K_END = '<|tool_calls_section_begin|>', '<|tool_calls_section_end|>'
K_CALL = '<|tool_call_begin|>functions.read:0<|tool_call_argument_begin|>{"path": "a.py"}<|tool_call_end|>'


def _template(kit, **kw):
    from agentrl.templates import ChatTemplate
    return ChatTemplate(kit_tokenizer(kit), **kw)


def _assistant_ids(template, messages):
    """``(prompt ids, the last assistant message's ids through its end of turn)`` as the template renders them."""
    prompt = template.render(messages[:-1], True)
    part = template.render(messages)[len(prompt):]
    part = part[:part.index(template.end_of_turn_text) + len(template.end_of_turn_text)]
    return template.encode(prompt), template.encode(part)


# ---------------------------------------------------------------------------- round trips
@pytest.mark.parametrize('kit, turn, options, reasoning, spans, ids', [
    ('deepseek-v3', {'role': 'assistant', 'content': 'Let me look.', 'tool_calls': [READ, EDIT]}, {}, None,
     [((12, 121), (4, 22)), ((121, 234), (22, 42))], (None, None)),
    ('deepseek-v3.1', {'role': 'assistant', 'content': 'Let me look.', 'tool_calls': [READ, EDIT]}, {}, None,
     [((12, 100), (4, 16)), ((100, 191), (16, 29))], (None, None)),
    ('kimi-k2', KIMI_TURN, {'tools': TOOL_SCHEMAS}, 'Read it first.',
     [((41, 165), (10, 25)), ((165, 292), (25, 41))], ('functions.read:0', 'functions.edit:1')),
])
def test_a_rendered_turn_with_calls_parses_back_with_exact_spans(kit, turn, options, reasoning, spans, ids):
    template = _template(kit, **options)
    family = family_for(template)
    assert family.name == kit
    prompt_ids, reply_ids = _assistant_ids(template, [USER, turn])
    assert reply_ids[-1] == template.end_of_turn_id and family.stop_ids(template) == {template.end_of_turn_id}
    reply = family.parse(reply_ids, template, think_open=family.prompt_opens_reasoning(template, prompt_ids))
    assert (reply.reasoning, reply.content) == (reasoning, 'Let me look.')
    assert [(c.name, c.arguments, c.status, c.id) for c in reply.calls] == [
        ('read', {'path': 'a.py'}, OK, ids[0]), ('edit', {'op': 'swap_minmax'}, OK, ids[1])]
    assert [(c.chars, c.tokens) for c in reply.calls] == spans
    for c in reply.calls:               # each token span decodes to exactly its block
        assert template.decode(reply_ids[c.tokens[0]:c.tokens[1]]) == c.text == reply.text[c.chars[0]:c.chars[1]]
    assert reply.calls[0].text.startswith(family.call_open) and reply.calls[1].text.endswith(family.call_close)
    assert family.strict_calls(reply.text) == list(family.parse_text(reply.text).calls)


def test_kimi_ids_are_the_gateway_ids_and_other_formats_get_the_gateway_s_own():
    kimi = parse_reply(f'<think>r</think>{K_SEC}{K_CALL}{K_END}', KIMI_K2, id_seed='s/0')
    assert [(c['id'], c['function']['name'], c['function']['arguments']) for c in kimi['tool_calls']] == [
        ('functions.read:0', 'read', '{"path": "a.py"}')]
    assert (kimi['content'], kimi['reasoning_content']) == (None, 'r')
    v3 = parse_reply(V3_SEC + V3_CALL + V3_END, DEEPSEEK_V3, id_seed='s/0')
    assert [c['id'] for c in v3['tool_calls']] == [tool_call_id('s/0', 0)]


def test_the_families_are_told_apart_by_template_and_tokens():
    from agentrl.templates import ChatTemplate
    from _tokenizers import load
    assert [family_for(kit_tokenizer(k)).name for k in ('deepseek-v3', 'deepseek-v3.1', 'kimi-k2')] == \
        ['deepseek-v3', 'deepseek-v3.1', 'kimi-k2']
    tok = load('deepseek-v3')
    assert family_for(tok) is DEEPSEEK_V3                                        # its own template
    for name in ('deepseekv3', 'deepseek_r1_distill'):
        assert family_for(ChatTemplate(tok, chat_template=trl_template(name))) is DEEPSEEK_V3


# ---------------------------------------------------------------------------- reasoning
@pytest.mark.parametrize('trl_name', ['deepseekv3', 'deepseek_r1_distill'])
def test_r1_style_prompts_open_the_reasoning_block(trl_name):
    from agentrl.templates import ChatTemplate
    from _tokenizers import load
    template = ChatTemplate(load("deepseek-v3"), chat_template=trl_template(trl_name))
    prompt_ids = template.encode(template.render([USER], True))
    assert template.decode(prompt_ids).endswith('<｜Assistant｜><think>\n')
    assert DEEPSEEK_V3.prompt_opens_reasoning(template, prompt_ids) is True
    text = f'Read a.py first.\n</think>\n\nReading.{V3_SEC}{V3_CALL}{V3_END}'
    reply = DEEPSEEK_V3.parse(template.encode(text) + [template.end_of_turn_id], template, think_open=True)
    assert (reply.reasoning, reply.content, [(c.name, c.status) for c in reply.calls]) == \
        ('Read a.py first.', 'Reading.', [('read', OK)])


def test_v31_thinking_mode_opens_the_block_and_non_thinking_closes_it():
    for options, want in (({}, False), ({'thinking': True}, True)):
        template = _template('deepseek-v3.1', **options)
        prompt_ids = template.encode(template.render([USER], True))
        assert template.decode(prompt_ids).endswith('<｜Assistant｜>' + ('<think>' if want else '</think>'))
        assert DEEPSEEK_V31.prompt_opens_reasoning(template, prompt_ids) is want


@pytest.mark.parametrize('family, call', [(DEEPSEEK_V3, V3_SEC + V3_CALL + V3_END),
                                          (DEEPSEEK_V31, V3_SEC + V31_CALL + V3_END),
                                          (KIMI_K2, K_SEC + K_CALL + K_END)])
def test_a_call_inside_the_reasoning_is_not_a_call(family, call):
    text = f'<think>maybe {call} no</think>Nothing to do.'
    reply = family.parse_text(text)
    assert (reply.reasoning, reply.content, reply.calls) == (f'maybe {call} no', 'Nothing to do.', ())
    assert family.strict_calls(text) == []
    assert [c.name for c in family.strict_calls(f'<think>{call}</think>{call}')] == ['read']


# ---------------------------------------------------------------------------- malformed calls
@pytest.mark.parametrize('family, text, tool_names, want', [
    (DEEPSEEK_V3, f'Ok.{V3_SEC}{V3_CALL}', None, [(None, None, UNCLOSED_BLOCK, (3, 112), None)]),
    (DEEPSEEK_V3, f'{V3_SEC}{V3_END}', None, [(None, None, MISSING_NAME, (0, 38), None)]),
    (DEEPSEEK_V3, f'{V3_SEC}{V3_CALL.replace("}", ",}")}{V3_END}', None,
     [('read', None, INVALID_JSON, (0, 128), None)]),
    (DEEPSEEK_V3, f'{V3_SEC}{V3_CALL.replace("```json", "```")}{V3_END}', None,
     [('read', None, INVALID_JSON, (0, 123), None)]),
    (DEEPSEEK_V3, f'{V3_SEC}{V3_CALL.replace("function<｜tool▁sep｜>", "")}{V3_END}', None,
     [(None, None, MISSING_NAME, (0, 107), None)]),
    (DEEPSEEK_V3, f'{V3_SEC}{V3_CALL}\n{V3_CALL.replace("read", "rm")}{V3_END}', ('read',),
     [('read', {'path': 'a.py'}, OK, (0, 109), None), ('rm', {'path': 'a.py'}, UNKNOWN_TOOL, (109, 215), None)]),
    (DEEPSEEK_V3, f'{V3_SEC}{V3_CALL} and{V3_END}', None, [('read', None, INVALID_JSON, (0, 131), None)]),
    (DEEPSEEK_V3, f'{V3_SEC}{V3_CALL[:-18]}{V3_END}', None, [('read', None, INVALID_JSON, (0, 109), None)]),
    (DEEPSEEK_V31, f'{V3_SEC}{V31_CALL.replace("{", "[")}{V3_END}', None,
     [('read', None, INVALID_JSON, (0, 106), None)]),
    (DEEPSEEK_V31, f'{V3_SEC}{V31_CALL.replace("read<｜tool▁sep｜>", "")}{V3_END}', None,
     [(None, None, MISSING_NAME, (0, 90), None)]),
    (KIMI_K2, f'{K_SEC}{K_CALL.replace("functions.read:0", "read")}{K_END}', None,
     [(None, None, MISSING_NAME, (0, 138), None)]),
    (KIMI_K2, f'{K_SEC}{K_CALL.replace("}", "")}{K_END}', None,
     [('read', None, INVALID_JSON, (0, 149), 'functions.read:0')]),
    (KIMI_K2, f'{K_SEC}{K_CALL}{K_END}', ('edit',),
     [('read', {'path': 'a.py'}, UNKNOWN_TOOL, (0, 150), 'functions.read:0')]),
    (KIMI_K2, f'x{K_SEC}{K_CALL}', None, [(None, None, UNCLOSED_BLOCK, (1, 125), None)]),
])
def test_each_malformed_call_has_its_status_and_exact_span(family, text, tool_names, want):
    reply = family.parse_text(text, tool_names=tool_names)
    assert [(c.name, c.arguments, c.status, c.chars, c.id) for c in reply.calls] == want
    bad = [c for c in reply.calls if c.status != OK]
    assert bad and all(c.text.strip('\n') in reply.content for c in bad)       # a malformed block stays content
    ok = ''.join(c.text for c in reply.ok_calls)
    assert reply.content == (text.replace(ok, '', 1).strip('\n') if ok else text)
    assert family.strict_calls(text) is None or want[-1][2] == UNKNOWN_TOOL


def test_a_stray_mark_outside_a_section_fails_strict_reading():
    assert DEEPSEEK_V3.strict_calls(f'{V3_SEC}{V3_CALL}{V3_END}{V3_END}') is None
    assert DEEPSEEK_V3.strict_calls(f'{V3_CALL}') is None                 # a call with no section is not a call
    assert DEEPSEEK_V3.parse_text(V3_CALL).calls == ()
    assert KIMI_K2.strict_calls(f'{K_CALL}{K_SEC}{K_CALL}{K_END}') is None


# ---------------------------------------------------------------------------- streaming
STREAMED = {
    DEEPSEEK_V3: [f'<think>\nhm {V3_SEC}\n</think>\n\nLet me see.\n{V3_SEC}{V3_CALL}\n{V3_CALL}{V3_END}\ndone',
                  f'a{V3_SEC}{V3_CALL.replace("{", "")}{V3_END}b{V3_SEC}{V3_CALL}'],
    DEEPSEEK_V31: [f'thinking é</think>Ok.{V3_SEC}{V31_CALL}{V31_CALL}{V3_END}',
                   f'{V3_SEC}{V3_END}x{V3_SEC}{V31_CALL}{V3_END}'],
    KIMI_K2: [f'<think>r {K_SEC}</think>Sure.{K_SEC}{K_CALL}{K_CALL.replace(":0", ":1")}{K_END}',
              f'{K_SEC}{K_CALL.replace("{", "")}{K_END}\n{K_SEC}{K_CALL}'],
}


def _streamed(family, pieces, think, tools):
    parser, out = family.stream(think, tools), []
    for p in pieces:
        out.append(parser.feed(p))
    last, reply = parser.finish()
    out.append(last)
    return ''.join(r for r, _, _ in out), ''.join(c for _, c, _ in out), [c for _, _, cs in out for c in cs], reply


@pytest.mark.parametrize('family', list(STREAMED), ids=lambda f: f.name)
def test_streaming_equals_the_one_shot_parse_at_every_cut(family):
    for text in STREAMED[family]:
        for think in (False, True):
            for tools in (True, False):
                want = family.parse_text(text, think_open=think, tools=tools)
                expect = (want.reasoning or '', want.content, list(want.ok_calls), want)
                assert _streamed(family, list(text), think, tools) == expect, (text, think, tools)
                for k in range(len(text) + 1):
                    assert _streamed(family, [text[:k], text[k:]], think, tools) == expect, (text, k, think, tools)
    reply = family.parse_text(STREAMED[family][0])
    assert [c.status for c in reply.calls] == [OK, OK] and reply.reasoning is not None


def test_kimi_s_template_passes_the_gateway_s_conformance_gate():
    # its final answer drops the reasoning of earlier turns: the answer's text is read after the last
    # generation prompt of that render, and the recorded bridges still equal the full renders
    from agentrl.families import KIMI_K2
    from agentrl.gateway.conformance import conformance
    rep = conformance(_template('kimi-k2', tools=TOOL_SCHEMAS), family=KIMI_K2)
    assert {k: rep[k] for k in ('conversations', 'turns', 'bridges', 'history_rewrites', 'turn_rewrites',
                                'tool_calls')} == {'conversations': 2, 'turns': 7, 'bridges': 5, 'history_rewrites': 0,
                                                   'turn_rewrites': 2, 'tool_calls': 'parsed'}
