"""The Liquid AI LFM2 / LFM2.5 family: Python-call tool calls in one bracketed list, ``<think>``, ``<|im_end|>``.

No LFM2 tokenizer is in ``../shared/tokenizers``: the kit tokenizer (``tests/_families.py`` ``'lfm2.5'``) is
Qwen3's (which has ``<|im_start|>``, ``<|im_end|>`` 151645, ``<think>``, ``</think>``) with LFM2's bos and tool
marks added (``<|tool_call_start|>`` 151672, ``<|tool_call_end|>`` 151673) and TRL's ``lfm2_2_5`` template; it
tests the format, stops and spans, not LFM2's vocabulary.

* Parsing: a turn the template renders (reasoning, content, two calls, a value holding ``'``, ``,`` and ``)``
  that the template writes unescaped) parses back with exact spans; ``lfm2_v2``'s escaped values give the
  same arguments; every literal kind; each malformed call's status and span; the rewrites vLLM's parser
  also makes (raw newline, ``07``, ``from=``, nested quotes) and an ambiguous nesting refused.
* A call block inside the reasoning is ``in_reasoning``; ``strict_calls``; the streaming parser equals the
  one-shot parse at every split of a reply, and on any text of the format's pieces (hypothesis).
* Stops: ``<|im_end|>`` ends both turn kinds; the registry picks ``lfm2`` from the template's marks, or from
  the tokenizer's added tokens alone (``lfm2.jinja`` never writes a call); the conformance gate passes.
"""
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

pytest.importorskip('transformers')

from _families import kit_tokenizer, trl_template  # noqa: E402
from agentrl.families import (INVALID_JSON, MISSING_NAME, OK, UNCLOSED_BLOCK,  # noqa: E402
                              UNKNOWN_TOOL, TurnEnd, family_for)
from agentrl.families.base import IN_REASONING  # noqa: E402
from agentrl.families.lfm2 import LFM2  # noqa: E402
from agentrl.gateway.conformance import conformance  # noqa: E402
from agentrl.gym import TOOL_SCHEMAS  # noqa: E402
from agentrl.templates import ChatTemplate  # noqa: E402

IM_END, CALL_START, CALL_END = 151645, 151672, 151673
S, E = '<|tool_call_start|>', '<|tool_call_end|>'
USER = [{'role': 'user', 'content': 'Fix clamp.'}]
TRICKY = "it's, (x)"                                       # lfm2_2_5 writes it as 'it's, (x)'


def _call(name, **args):
    return {'type': 'function', 'function': {'name': name, 'arguments': args}}


TURN = {'role': 'assistant', 'content': 'Let me look.', 'thinking': 'Read it first.',
        'tool_calls': [_call('read', path='a.py'), _call('edit', op=TRICKY, n=3)]}


@pytest.fixture(scope='module')
def tok():
    return kit_tokenizer('lfm2.5')


@pytest.fixture(scope='module')
def template(tok):
    return ChatTemplate(tok, tools=TOOL_SCHEMAS)


def _turn_ids(template, turn):
    """``(prompt ids, the turn's ids through <|im_end|>)`` as the template renders them."""
    prompt = template.render(USER, True)
    text = template.render(USER + [turn, {'role': 'tool', 'content': 'x'}], True)[len(prompt):]
    return template.encode(prompt), template.encode(text[:text.index('<|im_end|>') + len('<|im_end|>')])


# ---------------------------------------------------------------------------- parsing
def test_a_rendered_turn_with_reasoning_content_and_two_calls_parses_back(template):
    prompt_ids, ids = _turn_ids(template, TURN)
    assert template.decode(ids) == ("<think>Read it first.</think>Let me look.<|tool_call_start|>[read(path='a.py'), "
                                    "edit(op='it's, (x)', n=3)]<|tool_call_end|><|im_end|>")
    assert family_for(template) is LFM2 and ids[-1] == IM_END
    think = LFM2.prompt_opens_reasoning(template, prompt_ids)
    assert think is False                                   # the model writes <think> itself
    reply = LFM2.parse(ids, template, think_open=think)
    assert (reply.reasoning, reply.content) == ('Read it first.', 'Let me look.')
    assert [(c.name, c.arguments, c.status) for c in reply.calls] == [('read', {'path': 'a.py'}, OK),
                                                                      ('edit', {'op': TRICKY, 'n': 3}, OK)]
    assert [(c.chars, c.tokens) for c in reply.calls] == [((41, 79), (10, 18)), ((79, 123), (18, 32))]
    assert (ids[10], ids[31]) == (CALL_START, CALL_END)
    for c in reply.calls:                                   # the spans tile the block, each ends after its comma
        assert template.decode(ids[c.tokens[0]:c.tokens[1]]) == c.text == reply.text[slice(*c.chars)]
    assert [c.text for c in reply.calls] == ["<|tool_call_start|>[read(path='a.py'),",
                                             " edit(op='it's, (x)', n=3)]<|tool_call_end|>"]


def test_lfm2_v2_escapes_values_and_they_parse_to_the_same_arguments(tok):
    v2 = kit_tokenizer('lfm2.5')
    v2.chat_template = trl_template('lfm2_v2')
    t = ChatTemplate(v2, tools=TOOL_SCHEMAS)
    turn = {'role': 'assistant', 'content': '',
            'tool_calls': [_call('edit', op="a'b\nc", opts={'k': [1, 'x']}, flags=['-v', 2], on=True, none=None)]}
    _, ids = _turn_ids(t, turn)
    text = t.decode(ids)
    assert text == ('<|tool_call_start|>[edit(op=\'a\\\'b\\nc\', opts={"k": [1, "x"]}, flags=["-v", 2], on=True, '
                    'none=None)]<|tool_call_end|><|im_end|>')
    [c] = LFM2.parse(ids, t).calls
    assert (c.status, c.name, c.arguments, c.chars) == (OK, 'edit', turn['tool_calls'][0]['function']['arguments'],
                                                        (0, len(text) - len('<|im_end|>')))


def test_every_literal_kind_and_json_spellings_are_read_never_evaluated():
    text = (f"{S}[a.b(s=\"d\", i=-3, f=+1.5, t=(1, 2), st={{'x'}}, fs=f'y', n=null, y=true, no=False, "
            f"d={{'k': {{'j': [None]}}}}), rm()]{E}")
    reply = LFM2.parse_text(text)
    assert [(c.status, c.name, c.arguments) for c in reply.calls] == [
        (OK, 'a.b', {'s': 'd', 'i': -3, 'f': 1.5, 't': [1, 2], 'st': ['x'], 'fs': 'y', 'n': None, 'y': True,
                     'no': False, 'd': {'k': {'j': [None]}}}), (OK, 'rm', {})]
    assert reply.content == ''


@pytest.mark.parametrize('text, tool_names, want', [
    (f"Ok.{S}[read(path='a.py']{E}", None, (INVALID_JSON, 'read', None, (3, 57))),          # not Python syntax
    (f"{S}[read('a.py')]{E}", None, (INVALID_JSON, 'read', None, (0, 50))),               # positional: vLLM drops it
    (f"{S}[read(path=open('x'))]{E}", None, (INVALID_JSON, 'read', None, (0, 58))),       # not a literal
    (f"{S}read(path='a.py'){E}", None, (INVALID_JSON, 'read', None, (0, 53))),            # not a list
    (f'{S}[read(-1 if x else 2)]{E}', None, (INVALID_JSON, 'read', None, (0, 58))),
    (f'{S}[]{E}', None, (MISSING_NAME, None, None, (0, 38))),
    (f"{S}[{{'path': 'a.py'}}]{E}", None, (MISSING_NAME, None, None, (0, 54))),          # parses, not a call
    (f"{S}[f()(path='a')]{E}", None, (MISSING_NAME, None, None, (0, 51))),
    (f"x{S}[read(path='a", None, (UNCLOSED_BLOCK, None, None, (1, 33))),
    (f"{S}[rm(path='/')]{E}", ['read'], (UNKNOWN_TOOL, 'rm', {'path': '/'}, (0, 50))),
])
def test_each_malformed_call_has_its_status_and_span(text, tool_names, want):
    reply = LFM2.parse_text(text, tool_names=tool_names)
    assert [(c.status, c.name, c.arguments, c.chars) for c in reply.calls] == [want]
    assert reply.content == text and reply.ok_calls == ()         # a malformed call stays content, verbatim
    assert LFM2.strict_calls(text) is None or want[0] == UNKNOWN_TOOL


def test_calls_of_one_block_have_their_own_status_and_a_bad_one_keeps_its_span_in_the_content():
    text = f"Go.{S}[read(path='a.py'), edit(op=), test(),]{E}\nDone."
    reply = LFM2.parse_text(text)
    assert [(c.status, c.name, c.chars, c.text) for c in reply.calls] == [
        (OK, 'read', (3, 41), f"{S}[read(path='a.py'),"), (INVALID_JSON, 'edit', (41, 52), ' edit(op=),'),
        (OK, 'test', (52, 78), f' test(),]{E}')]
    assert reply.content == 'Go. edit(op=),\nDone.'


@pytest.mark.parametrize('text, want', [
    (f"{S}[run(cmd='a\nb', month=07, from=1, n=0)]{E}", {'cmd': 'a\nb', 'month': 7, 'from': 1, 'n': 0}),
    (f"{S}[run(cmd='sed -n '1,9p' f.py')]{E}", {'cmd': "sed -n '1,9p' f.py"}),
    (f"{S}[run(cmd='it's, (x)', n=1)]{E}", {'cmd': "it's, (x)", 'n': 1}),
    (f"{S}[run(cmd='it\\'s')]{E}", {'cmd': "it's"}),
])
def test_the_rewrites_vllm_also_makes_read_what_the_model_meant(text, want):
    [c] = LFM2.parse_text(text).calls
    assert (c.status, c.name, c.arguments, c.chars) == (OK, 'run', want, (0, len(text)))


def test_an_ambiguous_nested_quote_is_not_guessed():
    text = f"{S}[read(path='it's a'), edit(op='x')]{E}"      # both later quotes close a string that parses
    assert [(c.status, c.name, c.chars) for c in LFM2.parse_text(text).calls] == [(INVALID_JSON, 'read', (0, 71))]


def test_a_block_in_the_reasoning_is_in_reasoning_and_strict_calls_read_after_it():
    call = f"{S}[read(path='a.py')]{E}"
    text = f'<think>maybe {call}</think>{call}'
    reply = LFM2.parse_text(text)
    assert reply.reasoning == f'maybe {call}' and [(c.chars, c.status) for c in reply.calls] == [((76, 131), OK)]
    assert [(c.status, c.name, c.chars) for c in LFM2.reasoning_calls(reply)] == [(IN_REASONING, 'read', (13, 68))]
    assert [c.arguments for c in LFM2.strict_calls(text)] == [{'path': 'a.py'}]
    assert LFM2.strict_calls(text + E) is None and LFM2.strict_calls(f'{S}[read()]') is None
    assert LFM2.strict_calls('<think>x</think>no call') == []


def test_the_streaming_parser_equals_the_whole_parse_at_every_split():
    text = (f"<think>look</think>Reading.\n{S}[read(path='a, b).py'), edit(op='x')]{E}\nThen {S}[test(]{E} and "
            f"{S}[submit()]{E}")
    whole = LFM2.parse_text(text, think_open=False)
    assert [(c.name, c.status) for c in whole.calls] == [('read', OK), ('edit', OK), ('test', INVALID_JSON),
                                                         ('submit', OK)]
    for k in range(len(text) + 1):
        s = LFM2.stream(think_open=False)
        parts = [s.feed(text[:k]), s.feed(text[k:])]
        last, reply = s.finish()
        parts.append(last)
        assert (''.join(p[0] for p in parts), ''.join(p[1] for p in parts), [c for p in parts for c in p[2]]) == \
            (whole.reasoning, whole.content, list(whole.ok_calls)) == \
            ('look', f'Reading.\n\nThen {S}[test(]{E} and ', list(reply.ok_calls)), k


PIECES = ['<think>', '</think>', S, E, '[', ']', '(', ')', "'", '"', ',', ' ', '\n', 'read', 'path=', '07', 'from=1',
          '\\', '{', '}', 'x=[1]', "read(path='a, b)')", 'é']


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from(PIECES), max_size=14), st.booleans(), st.booleans(), st.data())
def test_the_streaming_parser_equals_the_whole_parse_on_any_text_and_split(pieces, think, tools, data):
    text = ''.join(pieces)
    cuts = sorted(data.draw(st.lists(st.integers(0, len(text)), max_size=6)))
    parser, out = LFM2.stream(think, tools), []
    for a, b in zip([0] + cuts, cuts + [len(text)]):
        out.append(parser.feed(text[a:b]))
    last, reply = parser.finish()
    out.append(last)
    assert reply == LFM2.parse_text(text, think_open=think, tools=tools)
    assert all(text[slice(*c.chars)] == c.text for c in reply.calls)
    assert ''.join(r for r, _, _ in out) == (reply.reasoning or '')
    assert ''.join(c for _, c, _ in out) == reply.content
    assert [c for _, _, calls in out for c in calls] == list(reply.ok_calls)


# ---------------------------------------------------------------------------- stops and the registry
def test_both_turn_kinds_end_at_im_end_which_the_template_tells(template):
    assert LFM2.stop_ids(template) == template.stop_ids == frozenset({IM_END})
    for kind in ('answer', 'tool_call'):
        assert LFM2.turn_end(template, kind) == TurnEnd(frozenset({IM_END}), IM_END)
    with pytest.raises(ValueError, match=r"^kind='call'; use one of \('answer', 'tool_call'\)$"):
        LFM2.turn_end(template, 'call')


def test_the_registry_picks_lfm2_from_the_marks_or_the_added_tokens_and_takes_its_name(tok):
    assert family_for(tok) is LFM2 and family_for(tok, name='lfm2') is LFM2
    v1 = kit_tokenizer('lfm2.5')
    v1.chat_template = trl_template('lfm2')                # LFM2's first template never writes a call
    assert '<|tool_call_start|>' not in v1.chat_template and family_for(v1) is LFM2


def test_the_conformance_gate_passes_strict(tok):
    for tools in (None, TOOL_SCHEMAS):
        rep = conformance(ChatTemplate(tok, tools=tools), strict=True, family=LFM2)
        assert {k: rep[k] for k in ('conversations', 'turns', 'bridges', 'history_rewrites', 'turn_rewrites',
                                    'tool_calls')} == {'conversations': 2, 'turns': 7, 'bridges': 5,
                                                       'history_rewrites': 0, 'turn_rewrites': 0,
                                                       'tool_calls': 'parsed'}
