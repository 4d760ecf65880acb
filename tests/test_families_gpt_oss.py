"""The gpt-oss (harmony) family and how gpt-oss turns are recorded, on TRL's ``gptoss`` template.

The tokenizer is the family kit's (``tests/_families.py``: Qwen3's vocabulary with the harmony control
tokens added, ``<|return|>`` as eos): ``<|end|>`` 151670, ``<|return|>`` 151674, ``<|call|>`` 151675.
The template writes ``Current date:`` from the clock, so every comparison here is within one run.

* Parsing: a sampled call turn (both header orderings) with its exact character and token spans;
  each malformed call with its status; call-like text inside ``analysis`` stays reasoning.
* Streaming: on every prefix, what is settled is a prefix of the whole parse; every split's pieces
  concatenate to it.
* Stops: the answer stops at ``<|return|>`` and is written ``<|end|>`` in history; a call stops at
  ``<|call|>``, which the template writes itself, so the template counts it an end of turn.
* Recording: the stability probe builds its turn as messages (never channel text in content); the
  bridge after a call starts after ``<|call|>``; after an answer the next context holds ``<|end|>``
  where the record keeps the sampled ``<|return|>`` (never both); template-mode contexts equal the
  template's own rendering; the conformance gate passes with no history rewrite.
* ``reasoning_effort`` is a template option the template renders.
"""
import json

import pytest

pytest.importorskip('transformers')

from _families import kit_tokenizer  # noqa: E402
from agentrl.families import (GPT_OSS, INVALID_JSON, MISSING_NAME, OK, QWEN3,  # noqa: E402
                              UNCLOSED_BLOCK, UNKNOWN_TOOL, TurnEnd, family_for)
from agentrl.gym import TOOL_SCHEMAS  # noqa: E402

END, RETURN, CALL = 151670, 151674, 151675
CALL_TURN = ('<|channel|>analysis<|message|>Read it first.<|end|><|start|>assistant to=functions.read<|channel|>'
             'commentary json<|message|>{"path": "clamp.py"}<|call|>')
CONSTRAIN_TURN = ('<|channel|>analysis<|message|>Swap.<|end|><|start|>assistant<|channel|>commentary '
                  'to=functions.edit <|constrain|>json<|message|>{"op": "swap_minmax"}<|call|>')
ANSWER_TURN = ('<|channel|>analysis<|message|>Tests pass.<|end|><|start|>assistant<|channel|>final<|message|>'
               'Fixed.<|return|>')
READ_MSG = {'role': 'assistant', 'content': '', 'reasoning_content': 'Read it first.',
            'tool_calls': [{'type': 'function', 'function': {'name': 'read', 'arguments': {'path': 'clamp.py'}}}]}
ANSWER_MSG = {'role': 'assistant', 'content': 'Fixed.', 'reasoning_content': 'Tests pass.'}
USER = [{'role': 'user', 'content': 'Fix clamp.'}]


@pytest.fixture(scope='module')
def tok():
    return kit_tokenizer('gpt-oss')


def _template(tok, **kw):
    from agentrl.templates import ChatTemplate
    return ChatTemplate(tok, tools=TOOL_SCHEMAS, **kw)


@pytest.fixture(scope='module')
def template(tok):
    """The template as the gateway builds it for gpt-oss: the family's ``<|call|>`` joins the stops."""
    return _template(tok, stop_tokens=['<|call|>'])


# ---------------------------------------------------------------------------- parsing
@pytest.mark.parametrize('turn, reasoning, name, args, chars, tokens', [
    (CALL_TURN, 'Read it first.', 'read', {'path': 'clamp.py'}, (51, 144), (8, 26)),
    (CONSTRAIN_TURN, 'Swap.', 'edit', {'op': 'swap_minmax'}, (42, 149), (6, 27)),
])
def test_a_sampled_call_turn_parses_with_exact_spans(template, turn, reasoning, name, args, chars, tokens):
    assert family_for(template) is GPT_OSS
    ids = template.encode(turn)
    assert ids[-1] == CALL
    reply = GPT_OSS.parse(ids, template, tool_names=['read', 'edit'])
    assert (reply.reasoning, reply.content) == (reasoning, '')
    [c] = reply.calls
    assert (c.name, c.arguments, c.status, c.chars, c.tokens) == (name, args, OK, chars, tokens)
    assert template.decode(ids[c.tokens[0]:c.tokens[1]]) == c.text == reply.text[c.chars[0]:c.chars[1]]
    assert c.text.startswith('<|start|>assistant') and c.text.endswith('}')


def test_an_answer_is_content_and_analysis_is_reasoning(template):
    reply = GPT_OSS.parse(template.encode(ANSWER_TURN), template)
    assert (reply.reasoning, reply.content, reply.calls) == ('Tests pass.', 'Fixed.', ())
    two = '<|channel|>analysis<|message|>a<|end|><|start|>assistant<|channel|>analysis<|message|>b<|end|>' \
          '<|start|>assistant<|channel|>commentary<|message|>Reading.<|end|><|start|>assistant<|channel|>final' \
          '<|message|>Done.'
    assert (GPT_OSS.parse_text(two).reasoning, GPT_OSS.parse_text(two).content) == ('a\nb', 'Reading.\nDone.')


@pytest.mark.parametrize('text, tool_names, want, content', [
    # a call message closed by <|end|> whose body is not JSON
    (' to=functions.read<|channel|>commentary json<|message|>{bad<|end|>', None,
     [('read', INVALID_JSON, (0, 59))], ' to=functions.read<|channel|>commentary json<|message|>{bad'),
    # arguments that are not an object
    (' to=functions.read<|channel|>commentary json<|message|>[1]', None, [('read', INVALID_JSON, (0, 58))], None),
    # cut inside the arguments
    (' to=functions.read<|channel|>commentary json<|message|>{"path": ', None,
     [('read', UNCLOSED_BLOCK, (0, 64))], None),
    # cut inside the header
    ('<|channel|>analysis<|message|>hm<|end|><|start|>assistant to=functions.read<|chan', None,
     [('read', UNCLOSED_BLOCK, (39, 81))], None),
    (' to=functions.<|channel|>commentary json<|message|>{}', None, [(None, MISSING_NAME, (0, 53))], None),
    (' to=functions.rm<|channel|>commentary json<|message|>{}', ['read'], [('rm', UNKNOWN_TOOL, (0, 55))], None),
    # a built-in tool's recipient is no function
    (' to=browser.search<|channel|>analysis<|message|>{"query": "x"}', None,
     [('browser.search', UNKNOWN_TOOL, (0, 62))], None),
])
def test_each_malformed_call_has_its_status_span_and_stays_in_content(text, tool_names, want, content):
    reply = GPT_OSS.parse_text(text, tool_names=tool_names)
    assert [(c.name, c.status, c.chars) for c in reply.calls] == want
    assert reply.content == (content if content is not None else reply.calls[0].text)
    assert GPT_OSS.strict_calls(text) is None or tool_names is not None     # strict reading takes any name


def test_call_text_inside_analysis_is_reasoning_and_a_recipient_on_analysis_is_a_call():
    text = '<|channel|>analysis<|message|>call to=functions.read {"path": "a"}?<|end|><|start|>assistant' \
           '<|channel|>final<|message|>Not yet.'
    reply = GPT_OSS.parse_text(text)
    assert (reply.reasoning, reply.content, reply.calls) == ('call to=functions.read {"path": "a"}?', 'Not yet.', ())
    assert GPT_OSS.strict_calls(text) == []
    on_analysis = GPT_OSS.parse_text('<|channel|>analysis to=functions.read<|message|>{"path": "a"}')
    assert [(c.name, c.arguments, c.status) for c in on_analysis.calls] == [('read', {'path': 'a'}, OK)]
    assert [c.name for c in GPT_OSS.strict_calls(CALL_TURN)] == ['read']


# ---------------------------------------------------------------------------- streaming
STREAMED = [
    CALL_TURN[:-len('<|call|>')],
    CONSTRAIN_TURN,
    ANSWER_TURN[:-len('<|return|>')],
    '<|channel|>commentary<|message|>Reading.<|end|><|start|>assistant to=functions.read<|channel|>commentary json'
    '<|message|>{bad<|end|><|start|>assistant<|channel|>final<|message|>a<|end|>stray<|start|>assistant<|channel|>'
    'final<|message|>b <',
]


@pytest.mark.parametrize('text', STREAMED)
def test_the_streaming_parser_equals_the_one_shot_parse_on_every_prefix_and_split(text):
    whole = GPT_OSS.parse_text(text)
    for k in range(len(text) + 1):
        reasoning, content, calls = GPT_OSS.stable_parts(text[:k], False, True)
        assert reasoning is None or (whole.reasoning or '').startswith(reasoning), k
        assert whole.content.startswith(content), k
        assert calls == list(whole.ok_calls[:len(calls)]), k
        s = GPT_OSS.stream(False)
        pieces = [s.feed(text[:k]), s.feed(text[k:])]
        last, reply = s.finish()
        pieces.append(last)
        assert (''.join(p[0] for p in pieces) or None, ''.join(p[1] for p in pieces)) == (whole.reasoning,
                                                                                          whole.content), k
        assert [c for p in pieces for c in p[2]] == list(whole.ok_calls) and reply == whole, k


# ---------------------------------------------------------------------------- stops
def test_an_answer_stops_at_return_a_call_at_call_and_the_template_counts_call_an_end(tok, template):
    eot = tok.convert_tokens_to_ids('<|endoftext|>')      # from generation_config.json
    assert GPT_OSS.turn_end(template, 'answer') == TurnEnd(frozenset({RETURN, eot}), END)
    assert GPT_OSS.turn_end(template, 'tool_call') == TurnEnd(frozenset({CALL}), CALL)
    # the kit's generation_config.json lists <|return|>, <|endoftext|>, <|call|> (as gpt-oss's does): all stop
    assert GPT_OSS.stop_ids(template) == frozenset({RETURN, CALL, eot})
    bare = _template(tok, generation_config=None)  # eos only: the family still stops a call at <|call|>
    assert (bare.stop_ids, GPT_OSS.stop_ids(bare)) == (frozenset({RETURN}), frozenset({RETURN, CALL}))
    assert (template.end_of_turn_text, template.end_texts) == ('<|return|>', ('<|return|>', '<|call|>'))
    assert template.chat_tokens()['end_of_turn'] == [RETURN, CALL]
    assert template.is_end_of_turn(CALL) and not template.is_end_of_turn(END)
    with pytest.raises(ValueError, match=r"kind='x'; use one of \('answer', 'tool_call'\)"):
        GPT_OSS.turn_end(template, 'x')


def test_the_registry_picks_gpt_oss_for_harmony_and_keeps_qwen3(tok):
    from _tokenizers import load
    assert family_for(tok) is GPT_OSS and family_for(load('qwen3')) is QWEN3


# ---------------------------------------------------------------------------- recording
def test_the_stability_probe_builds_its_turn_as_messages(template):
    from agentrl.templates.bridge import probe_stability, probe_turn, probe_turn_text
    assert probe_turn_text(template, USER) == (
        '<|channel|>analysis<|message|>Probe reasoning.<|end|><|start|>assistant<|channel|>final<|message|>'
        'Probe answer.<|return|>')
    msg, text = probe_turn(template, USER, call=True)
    assert msg == {'role': 'assistant', 'content': '', 'reasoning_content': 'Probe reasoning.',
                   'tool_calls': [{'id': 'functions.probe:0', 'type': 'function', 'function': {'name': 'probe',
                                                                                   'arguments': {}}}]}
    assert text == ('<|channel|>analysis<|message|>Probe reasoning.<|end|><|start|>assistant to=functions.probe'
                    '<|channel|>commentary json<|message|>{}<|call|>')
    patterns = [('tool',), ('user',), ('tool', 'user')]
    # a final answer drops the analysis of the turns before it (a history rewrite: per-turn contexts) ...
    assert [probe_stability(template, USER, p) for p in patterns] == [False, False, False]
    # ... a call turn keeps it, whatever follows
    assert [probe_stability(template, USER, p, turn=msg) for p in patterns] == [True, True, True]


def test_bridges_start_after_the_sampled_stop_and_an_answer_is_ended_as_history_writes_it(template):
    from agentrl.templates import ChatRecorder
    rec = ChatRecorder(template, USER, history='sampled')
    start = len(rec.prompt_ids)
    rec.add_turn(template.encode(CALL_TURN), message=READ_MSG)
    prompt = rec.add_messages([{'role': 'tool', 'content': 'def clamp'}])
    b = rec.bridges[-1]
    assert (b.stop, b.rewrite, b.text) == ('<|call|>', '', '<|start|>functions.read to=assistant<|channel|>'
                                                            'commentary<|message|>"def clamp"<|end|><|start|>assistant')
    assert b.ids == template.encode(b.text) and prompt[start:] == template.encode(CALL_TURN) + b.ids
    assert prompt == template.encode(template.render(rec.messages, True))
    answer = template.encode(ANSWER_TURN)
    rec.add_turn(answer, message=ANSWER_MSG)
    before = len(prompt)
    prompt = rec.add_messages([{'role': 'user', 'content': 'Thanks.'}])
    b = rec.bridges[-1]
    assert (b.stop, b.rewrite, b.text) == ('', '<|end|>', '<|start|>user<|message|>Thanks.<|end|><|start|>assistant')
    assert prompt[before:] == answer[:-1] + [END] + b.ids        # <|end|> in place of <|return|>, never both
    rec.add_turn(template.encode('<|channel|>final<|message|>You are welcome.<|return|>'),
                 message={'role': 'assistant', 'content': 'You are welcome.'})
    t = rec.finish()
    ids = t.ids.tolist()
    assert ids[before + len(answer) - 1:before + len(answer) + 1] == [RETURN, template.encode('<|start|>')[0]]
    assert t.info['template']['prefix_stable'] is False and t.info['template']['unterminated_turns'] == []
    assert [(s, c.tolist()) for s, c in t.turn_contexts][2] == (len(prompt), prompt)   # one id for one
    assert [s for s, _ in t.turn_contexts] == [start, before, len(prompt)]
    assert ids[:len(prompt)] != prompt and ids[:before] == prompt[:before]


def test_template_history_contexts_are_the_templates_own_rendering(template):
    from agentrl.templates import ChatRecorder
    rec = ChatRecorder(template, USER)                  # history='template'
    rec.add_turn(template.encode(CALL_TURN), message=READ_MSG)
    prompt = rec.add_messages([{'role': 'tool', 'content': 'def clamp'}])
    assert prompt == template.encode(template.render(rec.messages, True))
    rec.add_turn(template.encode(ANSWER_TURN), message=ANSWER_MSG)
    prompt = rec.add_messages([{'role': 'user', 'content': 'Thanks.'}])
    assert prompt == template.encode(template.render(rec.messages, True))   # earlier analysis dropped, <|end|>
    assert template.decode(prompt).count('<|channel|>analysis') == 0


def test_the_conformance_gate_passes_and_parses_the_calls_back(template):
    from agentrl.gateway import conformance
    rep = conformance(template, family=GPT_OSS)
    # the two final answers drop the analysis before them: turn rewrites, recorded as sampled, not bridge faults;
    # the template writes one call per message, and the family reads it back
    assert {k: rep[k] for k in ('turns', 'bridges', 'history_rewrites', 'turn_rewrites', 'tool_calls')} == {
        'turns': 7, 'bridges': 5, 'history_rewrites': 0, 'turn_rewrites': 2, 'tool_calls': 'parsed'}


def test_reasoning_effort_is_a_template_option_the_template_renders(tok, template):
    assert '\nReasoning: medium\n\n' in template.render(USER, True)
    assert '\nReasoning: high\n\n' in template.with_options(reasoning_effort='high').render(USER, True)
    assert '\nReasoning: low\n\n' in _template(tok, reasoning_effort='low').render(USER, True)


@pytest.mark.parametrize('turn', [CALL_TURN, CONSTRAIN_TURN, ANSWER_TURN])
def test_the_gateway_streams_a_harmony_turn_token_by_token_to_its_final_message(template, turn):
    from agentrl.gateway.parse import parse_reply
    from agentrl.gateway.stream import ReplyStream
    ids = template.encode(turn)
    stream = ReplyStream(template, GPT_OSS, False, True, 's/0')
    deltas = [d for k in range(1, len(ids) + 1) for d in stream.feed(ids[:k])]
    message = parse_reply(template.decode(ids[:-1]), GPT_OSS, id_seed='s/0', think_open=False)
    deltas += stream.finish(message)
    assert not stream.mismatch
    assert ''.join(d.get('reasoning_content', '') for d in deltas) == message['reasoning_content']
    assert ''.join(d.get('content', '') for d in deltas) == (message['content'] or '')
    streamed = {}
    for piece in (c for d in deltas for c in d.get('tool_calls', ())):
        name, args = streamed.get(piece['index'], ('', ''))
        streamed[piece['index']] = (name + piece['function'].get('name', ''), args + piece['function']['arguments'])
    want = {'read': {'path': 'clamp.py'}, 'edit': {'op': 'swap_minmax'}}
    assert [(n, json.loads(a)) for n, a in streamed.values()] == [(c['function']['name'], want[c['function']['name']])
                                                                   for c in message.get('tool_calls') or ()]
    assert len(streamed) == (0 if turn is ANSWER_TURN else 1)
