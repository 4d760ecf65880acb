"""Property tests: label_owners and ChatRecorder against a slow reference that renders message by message.

The reference is deliberately naive: it renders the conversation up to every assistant turn with the
generation prompt (the turn's sampling context), takes the turn as the text from there through the
end-of-turn token, and finds every other message's content by plain string search. It only works for
prefix-stable conversations, so the strategies generate those (reasoning only after the last user
message; in non-thinking mode one final answer).
"""
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from _tokenizers import load

import agentrl.templates as tt
from agentrl.record import OWNER, OWNER_NAMES
from agentrl.templates.labels import _locate_fast, locate_messages

# words that occur in none of the three templates nor in the tool schema below
WORDS = ['apple', 'river', 'stone', 'cloud', 'maple', 'tiger', 'lemon', 'piano', 'x1', '42', 'fix', 'bug', 'zeta']
TOOLS = [{'name': 'read', 'description': 'Read a file.',
          'inputSchema': {'type': 'object', 'properties': {'path': {'type': 'string'}}, 'required': ['path']}}]
SETTINGS = settings(deadline=None, suppress_health_check=[HealthCheck.too_slow])


@st.composite
def text(draw):
    words = draw(st.lists(st.sampled_from(WORDS), min_size=1, max_size=6))
    seps = draw(st.lists(st.sampled_from([' ', ' ', ', ', '.\n', '\n', ' (', ') ']),
                         min_size=len(words) - 1, max_size=len(words) - 1))
    out = words[0]
    for sep, w in zip(seps, words[1:]):
        out += sep + w
    return out + draw(st.sampled_from(['', '.', '?', '!']))


@st.composite
def conversation(draw, family):
    """(messages, options) of a prefix-stable conversation for ``family``."""
    qwen = family in ('qwen3', 'tiny')   # tools and thinking
    thinking = draw(st.booleans()) if qwen else True
    tools = qwen and draw(st.booleans())
    msgs = [{'role': 'system', 'content': draw(text())}] if draw(st.booleans()) else []
    if not thinking:  # non-thinking Qwen3 drops each earlier turn's think block: one final answer only
        msgs.append({'role': 'user', 'content': draw(text())})
        if draw(st.booleans()):
            msgs.append({'role': 'assistant', 'content': draw(text())})
        return msgs, {'enable_thinking': False}
    n_seg = draw(st.integers(1, 2))
    for seg in range(n_seg):
        msgs.append({'role': 'user', 'content': draw(text())})
        n_rounds = draw(st.integers(0 if seg == n_seg - 1 else 1, 4))
        for r in range(n_rounds):
            a = {'role': 'assistant', 'content': draw(st.one_of(st.just(''), text()) if qwen else text())}
            if qwen and seg == n_seg - 1 and draw(st.booleans()):
                a['reasoning_content'] = draw(text())
            if tools and draw(st.booleans()):
                a['tool_calls'] = [{'type': 'function',
                                    'function': {'name': 'read', 'arguments': {'path': draw(text())}}}
                                   for _ in range(draw(st.integers(1, 2)))]
            msgs.append(a)
            last = seg == n_seg - 1 and r == n_rounds - 1
            if not last or draw(st.booleans()):
                if seg < n_seg - 1 and r == n_rounds - 1 and draw(st.booleans()):
                    continue  # next segment's user message follows the answer directly
                for _ in range(draw(st.integers(1, 2))):
                    msgs.append({'role': 'tool', 'content': draw(text())})
    return msgs, ({'tools': TOOLS} if tools else {})


def reference_labels(tok, messages, options):
    """Owner name of every token of the rendering, found message by message (slow, obvious)."""
    tools = tt.function_tools(options.get('tools'))
    kw = {k: v for k, v in options.items() if k != 'tools'}

    def render(ms, gen):
        return tok.apply_chat_template(ms, tools=tools, tokenize=False, add_generation_prompt=gen, **kw)

    gen = messages[-1]['role'] != 'assistant'
    full = render(messages, gen)
    label = ['template'] * len(full)
    cursor, turns = 0, []
    for i, m in enumerate(messages):
        if m['role'] == 'assistant':
            ctx = render(messages[:i], True)
            assert full.startswith(ctx), 'strategy produced a conversation that is not prefix-stable'
            end = full.index(tok.eos_token, len(ctx)) + len(tok.eos_token)
            label[len(ctx):end] = ['policy'] * (end - len(ctx))
            turns.append((i, len(ctx), end))
            cursor = end
        else:
            c = m['content']
            k = full.index(c, cursor)
            label[k:k + len(c)] = ['tool' if m['role'] == 'tool' else 'prompt'] * len(c)
            cursor = k + len(c)
    enc = tok(full, add_special_tokens=False, return_offsets_mapping=True)
    return full, enc['input_ids'], [label[a] for a, _ in enc['offset_mapping']], enc['offset_mapping'], turns


def _check_labels(tok, messages, options):
    full, ids, ref, _, _ = reference_labels(tok, messages, options)
    lab = tt.label_owners(tok, messages, add_generation_prompt=messages[-1]['role'] != 'assistant', **options)
    assert lab.text == full and lab.ids == ids
    assert len(lab.owner) == len(lab.ids) and set(lab.owner) <= set(OWNER.values())   # one owner per token
    assert lab.owner_names() == ref
    t = tt.ChatTemplate(tok, **options)
    gen = messages[-1]['role'] != 'assistant'
    slow = locate_messages(t, tt.labels.check_messages(messages), gen, fast=False)[1]
    fast = _locate_fast(t, tt.labels.check_messages(messages), gen, full)
    assert fast is None or fast == slow                                   # the one-render path is exact


def _check_recorder(tok, messages, options, history, cache):
    full, ids, ref, offsets, turns = reference_labels(tok, messages, options)
    tok_start = {a: t for t, (a, _) in enumerate(offsets)}
    first = turns[0][0]
    rec = tt.ChatRecorder(tok, messages[:first], history=history, cache_bridges=cache, **options)
    pending = []
    for i, m in enumerate(messages[first:], start=first):
        if m['role'] != 'assistant':
            pending.append(m)
            continue
        if pending:
            rec.add_messages(pending)
            pending = []
        _, a, b = next(t for t in turns if t[0] == i)
        s, e = tok_start[a], next(t for t, (x, _) in enumerate(offsets) if x >= b) if b < len(full) else len(ids)
        assert rec.prompt_ids == ids[:s]                                  # the sampling context, token for token
        rec.add_turn(ids[s:e], [-0.5] * (e - s))
    if pending:
        rec.add_messages(pending)
    traj = rec.finish()
    n = len(traj.ids)
    assert traj.ids.tolist() == ids[:n] and [OWNER_NAMES[o] for o in traj.owner.tolist()] == ref[:n]
    assert set(ref[n:]) <= {'template'}                                  # only the template's trailer is missing
    assert traj.turn_contexts is None and traj.info['template']['render_matches']


@pytest.mark.parametrize('family', ['tiny', 'qwen3', 'deepseek-v3', 'llama3'])
def test_label_owners_matches_message_by_message_reference(family):
    tok = load(family)

    @SETTINGS
    @given(conversation(family))
    def check(case):
        _check_labels(tok, *case)

    check()


@pytest.mark.parametrize('family', ['tiny', 'qwen3', 'deepseek-v3', 'llama3'])
def test_recorder_matches_reference(family):
    tok = load(family)

    @SETTINGS
    @given(conversation(family).filter(lambda c: any(m['role'] == 'assistant' for m in c[0])),
           st.sampled_from(['template', 'sampled']), st.booleans())
    def check(case, history, cache):
        _check_recorder(tok, *case, history, cache)

    check()
