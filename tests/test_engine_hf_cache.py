"""The HF engine's cross-turn KV cache: same records with and without it, fewer tokens fed, the profile.

Random small Qwen3 models (2 layers, hidden 64, ``make_test_model``) paired with the real Qwen3,
DeepSeek-V3 and Llama 3 tokenizers, run in float64: the two paths then compute the same logits to
~1e-15, so with the same seeds they must draw the same ids (a draw landing within 1e-15 of a CDF
boundary is astronomically rare) and store log-probs equal within 1e-6. In float32 the logits
differ by ~1e-6 and the near-uniform random model may then draw a neighbouring id now and then;
that path is covered with a tolerance below.
"""
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from _tokenizers import tokenizer_path

pytest.importorskip('transformers')

import agentrl as arl  # noqa: E402
from agentrl import checks  # noqa: E402
from agentrl.engines.scorer import hf_scorer  # noqa: E402
from agentrl.engines import hf  # noqa: E402
from agentrl.record import SamplingSpec  # noqa: E402
from agentrl.templates import ChatRecorder, ChatTemplate  # noqa: E402

T1 = SamplingSpec()
T07 = SamplingSpec(temperature=0.7, top_p=0.9)
PEN = SamplingSpec(temperature=0.8, top_k=50, repetition_penalty=1.3)
_MODELS = {}


def fp64_model(family, tmp_path_factory):
    """A 2-layer random Qwen3 with the family's tokenizer, in float64 (built once per session)."""
    if family not in _MODELS:
        out = tmp_path_factory.mktemp(f'tiny-{family}')
        rates = {'</think>': 0.05} if family == 'qwen3' else None
        d = hf.make_test_model(out, tokenizer_path(family), token_rates=rates, end_of_turn_rate=0.08)
        model, tok = hf.load_model(d)
        _MODELS[family] = (model.double(), tok)
    return _MODELS[family]


#: (family, template options, tools, observation role): Qwen3 with tools (prefix-stable), Qwen3
#: without thinking (not prefix-stable: the empty think block of earlier turns is dropped),
#: DeepSeek-V3 and Llama 3 (no tools: observations as user messages).
CASES = [('qwen3', {}, True, 'tool'), ('qwen3', {'enable_thinking': False}, True, 'tool'),
         ('qwen3', {'enable_thinking': False}, False, 'user'), ('deepseek-v3', {}, False, 'user'),
         ('llama3', {}, False, 'user')]


def run(model, template, n, *, reuse, seeds, spec, max_new, batch_size, ends, role, max_turns=4, profile=None,
        max_context=None):
    recs = [ChatRecorder(template, [{'role': 'user', 'content': f'Task {i}: fix the clamp function.'}])
            for i in range(n)]
    calls = []

    def respond(i, turn, text):
        calls.append((i, len(turn.ids)))
        k = sum(1 for j, _ in calls if j == i) - 1
        return hf.Reply(messages=[{'role': role, 'content': f'observation {k} for {i}: ' + 'ok ' * (i % 3)}],
                        done=k >= ends[i], reward=float(k), action=text)

    s = hf.HFSampler(model, template.stop_ids, spec, max_new_tokens=max_new)
    trajs = hf.run_chat_episodes(s, recs, respond, seeds=seeds, max_turns=max_turns, batch_size=batch_size,
                                 reuse_cache=reuse, profile=profile, max_context=max_context)
    return trajs, s


def assert_same_records(a, b, tol=1e-6):
    for x, y in zip(a, b):
        assert torch.equal(x.ids, y.ids) and torch.equal(x.owner, y.owner) and torch.equal(x.turn, y.turn)
        assert torch.equal(x.action_mask, y.action_mask)
        assert float((x.sample_logp.double() - y.sample_logp.double()).abs().max()) <= tol
        assert x.reward == y.reward and x.info == y.info and x.provenance == y.provenance
        assert (x.turn_contexts is None) == (y.turn_contexts is None)
        if x.turn_contexts is not None:
            assert all(s == t and torch.equal(c, d) for (s, c), (t, d) in zip(x.turn_contexts, y.turn_contexts))


@pytest.mark.parametrize('case', CASES, ids=['qwen3-tools', 'qwen3-nothink-tools', 'qwen3-nothink-user',
                                             'deepseek-v3', 'llama3'])
@settings(max_examples=4, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                 HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_cross_turn_cache_gives_the_same_records(case, data, tmp_path_factory):
    family, options, tools, role = case
    model, tok = fp64_model(family, tmp_path_factory)
    template = ChatTemplate(tok, tools=arl.TOOL_SCHEMAS if tools else None, **options)
    n = data.draw(st.integers(1, 5), label='episodes')
    seeds = data.draw(st.lists(st.integers(0, 2 ** 40), min_size=n, max_size=n), label='seeds')
    ends = data.draw(st.lists(st.integers(0, 4), min_size=n, max_size=n), label='last turn')
    spec = data.draw(st.sampled_from([T1, T07, PEN]), label='spec')
    max_new = data.draw(st.integers(1, 12), label='max_new_tokens')
    batch = data.draw(st.integers(1, 5), label='batch_size')       # < n: episodes join as others leave
    prof = {}
    ref, _ = run(model, template, n, reuse=False, seeds=seeds, spec=spec, max_new=max_new, batch_size=batch,
                 ends=ends, role=role)
    new, s = run(model, template, n, reuse=True, seeds=seeds, spec=spec, max_new=max_new, batch_size=batch,
                 ends=ends, role=role, profile=prof)
    assert prof['path'] == 'cross_turn_cache'
    assert_same_records(ref, new)
    tot = prof['totals']
    # every token of the last context goes through the model once (the last sampled one never), plus
    # the positions dropped where the template rewrote history; prefix-stable: the context is the record
    held = [len(t.ids) - 1 if t.turn_contexts is None else len(t.turn_contexts[-1][1]) + t.info['turn_tokens'][-1] - 1
            for t in new]
    assert tot['prefill_tokens'] + tot['decode_tokens'] == sum(held) + tot['rebuilt_tokens']
    assert tot['decode_tokens'] == sum(sum(t.info['turn_tokens']) for t in new)
    assert tot['record_tokens'] == sum(len(t.ids) for t in new)
    if all(t.turn_contexts is None for t in new):
        assert tot['rebuilt_tokens'] == 0


def test_non_prefix_stable_template_rebuilds_only_the_rewritten_tail(tmp_path_factory):
    """Qwen3 without thinking drops the empty think block of earlier turns: the row is cut back to
    the common prefix and refilled from there (not from the start), and the records still agree."""
    model, tok = fp64_model('qwen3', tmp_path_factory)
    template = ChatTemplate(tok, tools=arl.TOOL_SCHEMAS, enable_thinking=False)
    kw = dict(seeds=[1, 2, 3], spec=T1, max_new=8, batch_size=2, ends=[3, 3, 3], role='tool')
    prof = {}
    ref, _ = run(model, template, 3, reuse=False, **kw)
    new, _ = run(model, template, 3, reuse=True, profile=prof, **kw)
    assert_same_records(ref, new)
    assert all(t.turn_contexts is not None and not t.info['template']['prefix_stable'] for t in new)
    tot = prof['totals']
    # each later turn refeeds only the tail after the dropped block: far less than the contexts
    assert 0 < tot['rebuilt_tokens'] < sum(len(t.ids) for t in new) / 4
    per_turn = [t['prefill_tokens'] for t in prof['turns']]
    openings = [len(t.turn_contexts[0][1]) for t in new]
    assert per_turn[0] == sum(k - 1 for k in openings) and all(p < min(openings) for p in per_turn[1:])


def test_float32_paths_agree_to_rounding(tmp_path_factory):
    model, tok = fp64_model('qwen3', tmp_path_factory)
    model32 = model.float()
    try:
        template = ChatTemplate(tok, tools=arl.TOOL_SCHEMAS)
        kw = dict(seeds=[5, 6, 7, 8], spec=T07, max_new=10, batch_size=3, ends=[3, 1, 2, 3], role='tool')
        ref, _ = run(model32, template, 4, reuse=False, **kw)
        new, _ = run(model32, template, 4, reuse=True, **kw)
        same = [torch.equal(x.ids, y.ids) for x, y in zip(ref, new)]
        assert sum(same) >= 3
        assert_same_records([x for x, s in zip(ref, same) if s], [y for y, s in zip(new, same) if s], tol=1e-4)
        assert checks.replay_records(new, hf_scorer(model32)).ok        # step 0 holds on the cached path
    finally:
        model.double()


def test_profile_per_turn_split_and_format(tmp_path_factory):
    model, tok = fp64_model('qwen3', tmp_path_factory)
    template = ChatTemplate(tok, tools=arl.TOOL_SCHEMAS)
    for reuse, path in ((True, 'cross_turn_cache'), (False, 'per_turn')):
        prof = {}
        trajs, s = run(model, template, 3, reuse=reuse, seeds=[1, 2, 3], spec=T1, max_new=6, batch_size=3,
                       ends=[2, 2, 2], role='tool', profile=prof)
        assert prof['path'] == path and prof['episodes'] == 3 and len(prof['turns']) == 3
        assert [t['turn'] for t in prof['turns']] == [0, 1, 2]
        assert set(hf.PROFILE_KEYS) <= set(prof['turns'][0]) and prof['totals']['forward_calls'] == s.forward_calls
        for key in hf.PROFILE_KEYS:
            assert prof['totals'][key] == pytest.approx(sum(t[key] for t in prof['turns']), abs=1e-5)
            assert all(t[key] >= 0 for t in prof['turns'])
        assert [sum(1 for t in trajs for k in range(len(t.info['turn_tokens'])) if k == j) for j in range(3)] == [3] * 3
        assert prof['totals']['decode_s'] > 0 and prof['totals']['forward_s'] <= prof['wall_s']
        text = hf.format_profile(prof)
        assert text.splitlines()[0].startswith(f'hf engine profile ({path}): 3 episodes, ')
        assert len(text.splitlines()) == 2 + 3 + 1 + 1 and text.splitlines()[-2].split()[0] == 'all'
    # the per-turn path feeds each turn's whole context again: turn 2 costs more than turn 1
    assert prof['turns'][2]['prefill_tokens'] > prof['turns'][1]['prefill_tokens'] > prof['turns'][0]['prefill_tokens']


def test_context_limit_and_joins_on_the_cached_path(tmp_path_factory):
    """max_context cuts turns and stops episodes the same way on both paths; batch 1 runs them one by one."""
    model, tok = fp64_model('qwen3', tmp_path_factory)
    template = ChatTemplate(tok, tools=arl.TOOL_SCHEMAS)
    opening = len(ChatRecorder(template, [{'role': 'user', 'content': 'Task 0: fix the clamp function.'}]).prompt_ids)
    kw = dict(seeds=[3, 4], spec=T1, max_new=12, batch_size=1, ends=[9, 9], role='tool', max_turns=6,
              max_context=opening + 45)
    ref, _ = run(model, template, 2, reuse=False, **kw)
    new, _ = run(model, template, 2, reuse=True, **kw)
    assert_same_records(ref, new)
    assert all(t.info['stop'] == 'truncated' and t.reward == 0.0 for t in new)
    assert all(len(t.ids) <= opening + 45 + 45 for t in new)


def test_row_cache_matches_plain_forward(tmp_path_factory):
    """prefill_row / decode_rows on ragged rows, a cut-back row and a moved row give a plain forward's logits."""
    model, _ = fp64_model('qwen3', tmp_path_factory)
    s = hf.HFSampler(model, [0])
    cache = s.new_row_cache(3)
    g = torch.Generator().manual_seed(0)
    seqs = [torch.randint(0, 5000, (k,), generator=g).tolist() for k in (30, 50, 7)]

    def plain(ids):
        with torch.no_grad():
            return model(input_ids=torch.tensor([ids])).logits[0, -1]

    for r, q in enumerate(seqs):
        s.prefill_row(cache, r, q[:-1])
    logits = s.decode_rows(cache, [q[-1] for q in seqs])
    assert logits.shape == (3, model.config.vocab_size) and logits.dtype == torch.float64
    for r, q in enumerate(seqs):
        assert float((logits[r] - plain(q)).abs().max()) < 1e-10
    assert cache.lengths == [30, 50, 7]
    last = s.prefill_row(cache, 1, [5, 6, 7], logits=True)
    assert float((last - plain(seqs[1] + [5, 6, 7])).abs().max()) < 1e-10
    cache.lengths[0] = 10                                      # the template rewrote row 0 after 10 tokens
    s.prefill_row(cache, 0, [9, 9])
    logits = s.decode_rows(cache, [1, 2])
    assert float((logits[0] - plain(seqs[0][:10] + [9, 9, 1])).abs().max()) < 1e-10
    assert float((logits[1] - plain(seqs[1] + [5, 6, 7, 2])).abs().max()) < 1e-10
    cache.move_row(2, 0)
    assert float((s.decode_rows(cache, [3])[0] - plain(seqs[2] + [3])).abs().max()) < 1e-10
    with pytest.raises(ValueError, match='ids is empty'):
        s.prefill_row(cache, 0, [])


def test_cli_rollout_profile(tmp_path, capsys, tmp_path_factory, monkeypatch):
    """``agentrl rollout --engine hf --profile`` prints the split and stores it in summary.json."""
    import json

    from agentrl.cli.main import main
    monkeypatch.setattr(torch.cuda, 'is_available', lambda: False)
    model_dir = hf.make_test_model(tmp_path / 'm', tokenizer_path('qwen3'))
    out = tmp_path / 'run'
    argv = ['rollout', '--engine', 'hf', '--model', str(model_dir), '--split', 'heldout', '--repeats', '1',
            '--max-new-tokens', '6', '--max-turns', '2', '--profile', '--out', str(out)]
    assert main(argv) == 0
    text = capsys.readouterr().out
    assert 'hf engine profile (cross_turn_cache): 6 episodes' in text and '\n  all ' in text
    prof = json.loads((out / 'summary.json').read_text())['hf']['profile']
    assert prof['path'] == 'cross_turn_cache' and prof['episodes'] == 6 and len(prof['turns']) == 2
    assert prof['totals']['record_tokens'] == sum(len(t.ids) for t in arl.read_trajectories(out / 'trajectories'))
    assert main(['rollout', '--profile', '--out', str(tmp_path / 'x')]) == 2
    assert capsys.readouterr().err.startswith('agentrl: error: --profile')
    assert main(['rollout', '--engine', 'hf', '--model', str(model_dir), '--profile', '--workers', '2',
                 '--out', str(tmp_path / 'y')]) == 2
    assert 'profile times the hf engine in this process; drop --workers' in capsys.readouterr().err


def test_merge_profiles_adds_chunks():
    one = {'engine': 'hf', 'path': 'cross_turn_cache', 'episodes': 2, 'wall_s': 1.0,
           'totals': dict(dict.fromkeys(hf.PROFILE_KEYS, 1), forward_s=0.5, record_tokens=10),
           'turns': [dict(turn=0, **dict.fromkeys(hf.PROFILE_KEYS, 1))]}
    two = dict(one, turns=[dict(turn=k, **dict.fromkeys(hf.PROFILE_KEYS, 2)) for k in range(2)])
    m = hf.merge_profiles([one, two])
    assert m['episodes'] == 4 and m['wall_s'] == 2.0 and m['chunks'] == 2 and m['totals']['record_tokens'] == 20
    assert [t['prefill_tokens'] for t in m['turns']] == [3, 2] and m['turns'][1]['turn'] == 1
    with pytest.raises(ValueError, match='different paths'):
        hf.merge_profiles([one, dict(one, path='per_turn')])
    with pytest.raises(ValueError, match='no profiles'):
        hf.merge_profiles([])


def test_row_cache_on_a_llama_model():
    """The 4-D masks go through transformers' create_causal_mask as given, so other decoders work too."""
    transformers = pytest.importorskip('transformers')
    cfg = transformers.LlamaConfig(vocab_size=500, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = transformers.LlamaForCausalLM(cfg).eval().double()
    s = hf.HFSampler(model, [1])
    assert s.supports_row_cache()
    cache = s.new_row_cache(2)
    a, b = list(range(3, 40)), list(range(50, 60))
    s.prefill_row(cache, 0, a[:-1])
    s.prefill_row(cache, 1, b[:-1])
    logits = s.decode_rows(cache, [a[-1], b[-1]])
    with torch.no_grad():
        for row, ids in enumerate((a, b)):
            assert float((logits[row] - model(input_ids=torch.tensor([ids])).logits[0, -1]).abs().max()) < 1e-10
