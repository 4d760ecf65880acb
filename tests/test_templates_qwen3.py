"""agentrl.templates on the real Qwen3 tokenizer: the chapter 5.2-5.4 and 5.8 facts, exactly."""
import pytest

from _tokenizers import load

import agentrl.templates as tt
from agentrl.record import OWNER

IM_END = 151645
# the chapter's hand-authored compact call (section 5.4) and its 19 ids
GENERATED = '<think>\nRead first.\n</think>\n\n<tool_call>\n{"name":"read","arguments":{}}\n</tool_call>'
GENERATED_IDS = [151667, 198, 4418, 1156, 624, 151668, 271, 151657, 198, 4913, 606, 3252, 878, 2198, 16370,
                 788, 6257, 532, 151658]
TOOLS = [{'name': 'read', 'description': 'Return the current source.',
          'inputSchema': {'type': 'object', 'properties': {}, 'required': []}}]


@pytest.fixture(scope='module')
def qwen():
    return load('qwen3')


def enc(tok, text):
    return tok(text, add_special_tokens=False)['input_ids']


def call(name, **arguments):
    return [{'type': 'function', 'function': {'name': name, 'arguments': arguments}}]


def chapter():
    """The chapter's two-turn clamp episode and the gym's tool schemas."""
    from agentrl.cli.template import chapter_messages
    from agentrl.gym import TOOL_SCHEMAS
    return chapter_messages(), TOOL_SCHEMAS


def test_special_token_ids(qwen):
    ids = {'<|im_start|>': 151644, '<|im_end|>': 151645, '<think>': 151667, '</think>': 151668,
           '<tool_call>': 151657, '</tool_call>': 151658, '<tool_response>': 151665}
    assert {t: enc(qwen, t) for t in ids} == {t: [i] for t, i in ids.items()}
    assert tt.ChatTemplate(qwen).stop_ids == frozenset({IM_END})


def test_compact_call_19_tokens_vs_rerendered_21(qwen):
    sampled = enc(qwen, GENERATED)
    assert sampled == GENERATED_IDS
    rec = tt.ChatRecorder(qwen, [{'role': 'user', 'content': 'Fix clamp.'}], tools=TOOLS)
    rec.add_turn(sampled + [IM_END], [-0.5] * 20)
    traj = rec.finish()
    parsed = [{'role': 'user', 'content': 'Fix clamp.'},
              {'role': 'assistant', 'content': '', 'reasoning_content': 'Read first.', 'tool_calls': call('read')}]
    rep = tt.audit_drift(qwen, traj, parsed, tools=TOOLS)
    assert rep.n_spans == 1 and rep.turns('reencode') == [] and rep.turns('rerender') == [0]
    d = rep.drifts[0]
    assert (len(d.sampled_ids) - 1, len(d.other_ids) - 1) == (19, 21)     # without <|im_end|>
    assert qwen.convert_ids_to_tokens(d.sampled_ids)[9:16] == ['{"', 'name', '":"', 'read', '","', 'arguments', '":']
    assert qwen.convert_ids_to_tokens(d.other_ids)[9:16] == ['{"', 'name', '":', 'Ġ"', 'read', '",', 'Ġ"']
    assert d.at == 11 and d.sampled == ['":"', 'read'] and d.other == ['":', 'Ġ"']
    assert traj.ids[-20:].tolist() == GENERATED_IDS + [IM_END]          # the record keeps what was sampled


def test_thinking_switch_generation_prompts(qwen):
    rep = tt.audit_thinking(qwen)
    assert rep.supported
    assert rep.prompt_thinking == ' clamp.<|im_end|>\n<|im_start|>assistant\n'
    assert rep.prompt_non_thinking == '|im_start|>assistant\n<think>\n\n</think>\n\n'
    assert rep.inserted_text == '<think>\n\n</think>\n\n' and rep.removed_text == ''
    assert rep.inserted_ids == [151667, 271, 151668, 271]


def test_prefix_stable_across_tool_turns_not_after_user(qwen):
    messages, tools = chapter()
    after_tool = messages + [{'role': 'assistant', 'content': 'Fixed.', 'reasoning_content': 'Tests pass now.'}]
    after_user = after_tool + [{'role': 'user', 'content': 'Also handle reversed bounds.'}]
    a = tt.audit_prefix_stability(qwen, after_tool, tools=tools)
    b = tt.audit_prefix_stability(qwen, after_user, tools=tools)
    assert a.stable and a.token_stable and a.breaking == []
    assert not b.stable and b.breaking == [6]
    assert (a.reasoning_total, a.reasoning_rendered, b.reasoning_rendered) == (3, 3, 0)     # think blocks 3 -> 0
    reason = b.messages[6].reason
    assert reason.startswith('message 6 (user) ')
    assert 'the reasoning of messages [1, 3, 5] is stripped once message 6 is added' in reason
    # the chapter's own check, on the renderings themselves
    t = tt.ChatTemplate(qwen, tools=tools)
    before = t.render(messages[:3], True)
    assert t.render(after_tool, True).startswith(before) and not t.render(after_user, True).startswith(before)
    assert t.render(after_tool, True).count('<think>') == 3 and t.render(after_user, True).count('<think>') == 0


def test_retokenization_drift_minus_hi(qwen):
    assert (qwen.convert_tokens_to_ids('-'), qwen.convert_tokens_to_ids('hi')) == (12, 6023)
    assert qwen.decode([12, 6023]) == '-hi'
    assert qwen.convert_ids_to_tokens(enc(qwen, '-hi')) == ['-h', 'i']


def test_drift_reported_on_exactly_the_drifting_span(qwen):
    rec = tt.ChatRecorder(qwen, [{'role': 'user', 'content': 'Name a flag.'}])
    first = enc(qwen, 'Pass a flag.') + [IM_END]
    rec.add_turn(first, [-0.1] * len(first))
    rec.add_messages([{'role': 'tool', 'content': 'ok'}])
    second = enc(qwen, 'Pass') + [12, 6023] + enc(qwen, ' now.') + [IM_END]      # '-', 'hi' as sampled
    rec.add_turn(second, [-0.2] * len(second))
    rec.add_messages([{'role': 'tool', 'content': 'ok'}])
    third = enc(qwen, 'Done.') + [IM_END]
    rec.add_turn(third, [-0.3] * len(third))
    traj = rec.finish()
    rep = tt.audit_drift(qwen, traj)
    assert rep.n_spans == 3 and len(rep.drifts) == 1
    d = rep.drifts[0]
    start = int((traj.turn == 1).nonzero()[0])
    assert (d.turn, d.kind, d.start, d.end) == (1, 'reencode', start, start + len(second))
    assert (d.at, d.sampled, d.other) == (1, ['-', 'hi'], ['-h', 'i'])
    assert traj.ids[d.start:d.end].tolist() == second                    # the record keeps the sampled ids


def test_chapter_owner_counts(qwen):
    messages, tools = chapter()
    lab = tt.label_owners(qwen, messages, tools=tools, add_generation_prompt=True)
    counts = lab.counts()
    assert {k: counts[k] for k in ('prompt', 'policy', 'tool')} == {'prompt': 37, 'policy': 55, 'tool': 23}
    assert lab.ids == qwen.apply_chat_template(messages, tools=tt.function_tools(tools), add_generation_prompt=True,
                                               return_dict=True)['input_ids']
    first = next(s for m, s, e in lab.spans('policy'))
    n = next(e - s for m, s, e in lab.spans('policy'))
    assert n == 24 and qwen.decode(lab.ids[first:first + n]) == (
        '<think>\nRead the source first.\n</think>\n\n<tool_call>\n{"name": "read", "arguments": {}}\n'
        '</tool_call><|im_end|>')


def _chapter_turns():
    return ['<think>\nRead the source first.\n</think>\n\n<tool_call>\n{"name": "read", "arguments": {}}\n'
            '</tool_call><|im_end|>',
            '<think>\nmin and max are swapped.\n</think>\n\n<tool_call>\n{"name": "edit", "arguments": '
            '{"op": "swap_minmax"}}\n</tool_call><|im_end|>']


def test_recorder_matches_apply_chat_template_and_bridge_starts_with_newline(qwen):
    messages, tools = chapter()
    rec = tt.ChatRecorder(qwen, messages[:1], tools=tools)
    prompts = [rec.prompt_ids]
    for k, turn in enumerate(_chapter_turns()):
        ids = enc(qwen, turn)
        assert rec.add_turn(ids, [-0.25] * len(ids)) == turn[:-len('<|im_end|>')]
        prompts.append(rec.add_messages([messages[2 * k + 2]]))
    traj = rec.finish(reward=1.0)
    full = qwen.apply_chat_template(messages, tools=tt.function_tools(tools), add_generation_prompt=True,
                                    return_dict=True)['input_ids']
    assert traj.ids.tolist() == full                                      # token for token
    assert prompts[-1] == full and all(full[:len(p)] == p for p in prompts)
    lab = tt.label_owners(qwen, messages, tools=tools, add_generation_prompt=True)
    assert traj.owner.tolist() == lab.owner
    # the engine stopped at <|im_end|> (policy); the template's '\n' after it opens the bridge
    b = rec.bridges[0]
    assert b.stop == '<|im_end|>' and b.text.startswith('\n<|im_start|>user\n<tool_response>\n')
    assert b.ids[0] == 198 and b.owner[0] == OWNER['template']
    end = int((traj.turn == 0).nonzero()[0]) + len(enc(qwen, _chapter_turns()[0]))
    assert traj.ids[end - 1] == IM_END and traj.owner[end - 1] == OWNER['policy'] and traj.action_mask[end - 2] == 1
    assert traj.ids[end] == 198 and traj.owner[end] == OWNER['template'] and traj.action_mask[end - 1] == 0
    assert traj.action_mask.sum() == 55 and traj.turn_contexts is None
    assert (traj.sample_logp[traj.action_mask.bool()] == -0.25).all()
    assert (traj.sample_logp[~traj.action_mask.bool()] == 0).all()
    info = traj.info['template']
    assert info['prefix_stable'] and info['render_matches'] and info['unterminated_turns'] == []
    assert traj.provenance.template == tt.template_fingerprint(qwen, tools=tools)
    assert traj.provenance.tokenizer == tt.tokenizer_fingerprint(qwen)


def test_non_thinking_answer_mask_sum_2(qwen):
    user = [{'role': 'user', 'content': 'What is 2+2?'}]
    rec = tt.ChatRecorder(qwen, user, enable_thinking=False)
    assert qwen.decode(rec.prompt_ids).endswith('<|im_start|>assistant\n<think>\n\n</think>\n\n')
    rec.add_turn([19, IM_END], [-0.01, -0.02])                           # '4<|im_end|>'
    traj = rec.finish()
    assert traj.action_mask.sum() == 2
    assert traj.ids[-6:-2].tolist() == [151667, 271, 151668, 271]
    assert traj.owner[-6:].tolist() == [OWNER['template']] * 4 + [OWNER['policy']] * 2
    assert traj.sample_logp[-2:].tolist() == pytest.approx([-0.01, -0.02])
    # label_owners agrees on the finished conversation
    lab = tt.label_owners(qwen, user + [{'role': 'assistant', 'content': '4'}], enable_thinking=False)
    assert lab.owner_names()[-7:] == ['template'] * 4 + ['policy', 'policy', 'template']


def test_thinking_mode_sampled_tags_are_policy(qwen):
    user = [{'role': 'user', 'content': 'What is 2+2?'}]
    rec = tt.ChatRecorder(qwen, user)
    sampled = enc(qwen, '<think>\n\n</think>\n\n4<|im_end|>')
    assert sampled == [151667, 271, 151668, 271, 19, IM_END]
    rec.add_turn(sampled, [-0.1] * 6)
    traj = rec.finish()
    assert traj.action_mask.sum() == 6 and traj.owner[-6:].tolist() == [OWNER['policy']] * 6
    lab = tt.label_owners(qwen, user + [{'role': 'assistant', 'content': '4'}])
    assert lab.owner_names()[-7:] == ['policy'] * 6 + ['template']


def _strip_episode(qwen, history):
    rec = tt.ChatRecorder(qwen, [{'role': 'user', 'content': 'Fix clamp.'}], tools=TOOLS, history=history)
    turns = ['<think>\nRead first.\n</think>\n\n<tool_call>\n{"name": "read", "arguments": {}}\n</tool_call><|im_end|>',
             '<think>\nSwap them.\n</think>\n\nFixed.<|im_end|>',
             '<think>\nCheck the order.\n</think>\n\nDone.<|im_end|>']
    news = [[{'role': 'tool', 'content': 'def clamp(v, lo, hi): return min(lo, max(v, hi))'}],
            [{'role': 'user', 'content': 'Also handle reversed bounds.'}]]
    contexts, messages = [rec.prompt_ids], [{'role': 'user', 'content': 'Fix clamp.'}]
    for k, turn in enumerate(turns):
        ids = enc(qwen, turn)
        messages.append({'role': 'assistant', 'content': rec.add_turn(ids, [-0.5] * len(ids))})
        if k < len(news):
            contexts.append(rec.add_messages(news[k]))
            messages += news[k]
    return rec.finish(reward=1.0), contexts, messages, turns


def test_reasoning_stripped_after_user_turn_contexts(qwen):
    traj, contexts, messages, turns = _strip_episode(qwen, 'template')
    # the audit names the user message (index 4) and the reasoning it strips
    rep = tt.audit_prefix_stability(qwen, messages, tools=TOOLS)
    assert rep.breaking == [4] and rep.messages[4].broken == [1, 3]
    parsed = [dict(m) for m in messages]            # the same turns as parsed messages with reasoning_content
    for k, reasoning in ((1, 'Read first.'), (3, 'Swap them.')):
        parsed[k] = {'role': 'assistant', 'reasoning_content': reasoning,
                     'content': parsed[k]['content'].split('</think>\n\n')[1]}
    rep = tt.audit_prefix_stability(qwen, parsed, tools=TOOLS)
    assert rep.breaking == [4]
    assert 'the reasoning of messages [1, 3] is stripped once message 4' in rep.messages[4].reason
    # the record keeps every sampled id, reasoning included
    text = qwen.decode(traj.ids.tolist())
    for turn in turns:
        assert turn in text
    assert traj.action_mask.sum() == sum(len(enc(qwen, t)) for t in turns)
    # per-turn contexts are exactly what each turn was sampled after ...
    assert traj.turn_contexts is not None and len(traj.turn_contexts) == 3
    assert [c.tolist() for _, c in traj.turn_contexts] == contexts
    # ... which is the template's rendering: turn 2's context has no earlier reasoning
    t = tt.ChatTemplate(qwen, tools=TOOLS)
    assert contexts[2] == enc(qwen, t.render(messages[:5], True))
    assert 'Read first.' not in qwen.decode(contexts[2]) and 'Swap them.' not in qwen.decode(contexts[2])
    assert traj.ids[:len(contexts[1])].tolist() == contexts[1]          # tool turns stay prefixes
    assert traj.ids[:len(contexts[2])].tolist() != contexts[2]
    info = traj.info['template']
    assert not info['prefix_stable'] and not info['render_matches']
    # one record per turn, each scored in its own context
    per_turn = tt.turn_records(traj)
    for k, (r, turn) in enumerate(zip(per_turn, turns)):
        n = len(enc(qwen, turn))
        assert r.ids.tolist() == contexts[k] + enc(qwen, turn)
        assert r.action_mask.sum() == n and r.sample_logp[-n:].tolist() == [-0.5] * n


def test_sampled_history_mode_keeps_one_sequence(qwen):
    traj, contexts, messages, turns = _strip_episode(qwen, 'sampled')
    assert traj.turn_contexts is None
    assert all(traj.ids[:len(c)].tolist() == c for c in contexts)
    assert traj.info['template']['prefix_stable'] and not traj.info['template']['render_matches']
    assert len(tt.turn_records(traj)) == 3


def test_sampling_contexts_of_a_conversation(qwen):
    messages, tools = chapter()
    ctx = tt.sampling_contexts(qwen, messages, tools=tools)
    assert [i for i, _ in ctx] == [1, 3]
    full = qwen.apply_chat_template(messages, tools=tt.function_tools(tools), add_generation_prompt=True,
                                    return_dict=True)['input_ids']
    assert all(full[:len(c)] == c for _, c in ctx)


def test_stability_probe(qwen):
    opening = [{'role': 'user', 'content': 'Fix clamp.'}]
    t = tt.ChatTemplate(qwen)
    assert tt.probe_stability(t, opening, ('tool',))
    assert not tt.probe_stability(t, opening, ('user',))
    assert not tt.probe_stability(t.with_options(enable_thinking=False), opening, ('tool',))


def test_stability_is_probed_per_turn_kind_empty_think_included(qwen):
    from agentrl.templates.bridge import probe_message, turn_kind
    opening = [{'role': 'user', 'content': 'Fix clamp.'}]
    t = tt.ChatTemplate(qwen)
    kinds = {'call, reasoning': {'role': 'assistant', 'content': '', 'reasoning_content': 'hm', 'tool_calls': call('read')},
             'call, empty': {'role': 'assistant', 'content': '', 'reasoning_content': '', 'tool_calls': call('read')},
             'answer, empty': {'role': 'assistant', 'content': 'ok', 'reasoning_content': ''},
             'decoded, reasoning': {'role': 'assistant', 'content': '<think>\nhm\n</think>\n\nok'},
             'decoded, empty': {'role': 'assistant', 'content': '<think>\n\n</think>\n\nok'}}
    got = {name: turn_kind(t, m) for name, m in kinds.items()}
    assert got == {'call, reasoning': ('tool_call', 'text', ()), 'call, empty': ('tool_call', 'empty', ()),
                   'answer, empty': ('answer', 'empty', (None,)),
                   'decoded, reasoning': ('answer', 'none', ('<think>', None, '</think>', None)),
                   'decoded, empty': ('answer', 'none', ('<think>', '\n\n', '</think>', None))}
    assert probe_message(got['decoded, empty']) == {'role': 'assistant',
                                                    'content': '<think>\n\n</think>Probe text 3.'}
    stable = {name: tt.probe_stability(t, opening, ('tool',), turn=probe_message(k)) for name, k in got.items()}
    assert stable == {'call, reasoning': True, 'call, empty': False, 'answer, empty': False,
                      'decoded, reasoning': True, 'decoded, empty': False}


def test_non_thinking_tool_loop_gets_turn_contexts(qwen):
    # in non-thinking mode the empty think block of each generation prompt is not kept in history
    rec = tt.ChatRecorder(qwen, [{'role': 'user', 'content': 'Fix clamp.'}], enable_thinking=False)
    ctx = [rec.prompt_ids]
    for k in range(2):
        rec.add_turn(enc(qwen, f'Step {k}.<|im_end|>'))
        ctx.append(rec.add_messages([{'role': 'tool', 'content': f'result {k}'}]))
    traj = rec.finish()
    msgs = [{'role': 'user', 'content': 'Fix clamp.'}, {'role': 'assistant', 'content': 'Step 0.'},
            {'role': 'tool', 'content': 'result 0'}, {'role': 'assistant', 'content': 'Step 1.'},
            {'role': 'tool', 'content': 'result 1'}]
    t = tt.ChatTemplate(qwen, enable_thinking=False)
    assert ctx[1] == enc(qwen, t.render(msgs[:3], True)) and ctx[2] == enc(qwen, t.render(msgs, True))
    assert traj.turn_contexts is not None and traj.provenance.logp_placeholder
    assert [c.tolist() for _, c in traj.turn_contexts] == ctx[:2]


# an empty think block in a tool-call turn: the template keeps a think block in history only when the reasoning is
# non-empty, so the next context drops the block the policy sampled
OPENING_IDS = [151644, 872, 198, 25958, 41904, 13, 151645, 198, 151644, 77091, 198]     # user 'Fix clamp.' + prompt
EMPTY_THINK = [151667, 271, 151668, 271]                                                # '<think>\n\n</think>\n\n'
READ_CALL = [151657, 198, 4913, 606, 788, 330, 878, 497, 330, 16370, 788, 4687, 532, 151658]  # the Hermes block
RESULT = [750, 41904, 2075, 11, 775, 11, 15588, 1648, 12236]                # 'def clamp(x, lo, hi): ...\n'


@pytest.mark.parametrize('parsed', [True, False], ids=['message', 'decoded'])
def test_empty_think_tool_call_turn_gets_the_templates_context(qwen, parsed):
    rec = tt.ChatRecorder(qwen, [{'role': 'user', 'content': 'Fix clamp.'}])
    assert rec.prompt_ids == OPENING_IDS
    first = EMPTY_THINK + READ_CALL + [IM_END]
    msg = {'role': 'assistant', 'content': '', 'reasoning_content': '', 'tool_calls': call('read')}
    rec.add_turn(first, [-0.5] * len(first), message=msg if parsed else None)
    ctx = rec.add_messages([{'role': 'tool', 'content': 'def clamp(x, lo, hi): ...'}])
    bridge = [198, 151644, 872, 198, 151665, 198] + RESULT + [151666, 151645, 198, 151644, 77091, 198]
    assert rec.bridges[0].ids == bridge
    want = OPENING_IDS + READ_CALL + [IM_END] + bridge          # the sampled empty think block is gone from history
    assert ctx == want == rec.template.encode(rec.template.render(rec.messages, True))
    second = enc(qwen, '<think>\nSwap.\n</think>\n\nDone.') + [IM_END]
    rec.add_turn(second, [-0.25] * len(second))
    traj = rec.finish()
    assert not traj.info['template']['prefix_stable']
    assert traj.ids.tolist() == OPENING_IDS + first + bridge + second          # the record keeps what was sampled
    assert [(s, c.tolist()) for s, c in traj.turn_contexts] == [(11, OPENING_IDS), (11 + 19 + 21, want)]
