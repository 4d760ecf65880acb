"""agentrl.sampling: the one sampler (support, penalties, processed log-probs, draw, sample, gather).

Golden values, then hypothesis properties against slow, obviously-right pure-Python twins.
"""
import math

import pytest
import torch
from hypothesis import HealthCheck, assume, given, settings, strategies as st

import agentrl as arl
from agentrl import checks
from agentrl.record import SamplingSpec
from agentrl.sampling import (PenaltyContext, apply_penalties, draw, processed_logp, sample, stored_logp,
                              support_mask, token_logp)

# ------------------------------------------------------------------------------ slow twins


def ref_penalize(x, spec, context, output):
    """Penalties on one row of logits, token by token (CTRL / transformers / vLLM rules)."""
    x = list(x)
    seen = set(context) | set(output)
    for t in sorted(seen):
        if spec.repetition_penalty != 1.0:
            x[t] = x[t] / spec.repetition_penalty if x[t] > 0 else x[t] * spec.repetition_penalty
        n = output.count(t)
        x[t] -= spec.frequency_penalty * n
        x[t] -= spec.presence_penalty * (1 if n else 0)
    return x


def ref_processed(x, spec, context=(), output=()):
    """``(log-probs, margin)``: one row's processed distribution; ``margin`` is how far the
    closest top-p / min-p decision was from its threshold (ties of float rounding are skipped)."""
    x = ref_penalize(x, spec, list(context), list(output))
    T = spec.temperature if spec.temperature > 0 else 1.0
    z = [v / T for v in x]
    m = max(z)
    lse = m + math.log(sum(math.exp(v - m) for v in z))
    lp = [v - lse for v in z]
    keep = [True] * len(lp)
    margin = math.inf
    if spec.temperature > 0:
        V = len(lp)
        if 0 < spec.top_k < V:
            kth = sorted(lp, reverse=True)[spec.top_k - 1]
            keep = [k and v >= kth for k, v in zip(keep, lp)]

        def renorm():
            mass = sum(math.exp(v) for v, k in zip(lp, keep) if k)
            return [math.exp(v) / mass if k else 0.0 for v, k in zip(lp, keep)]
        if spec.top_p < 1.0:
            p = renorm()
            order = sorted(range(V), key=lambda i: -p[i])
            before = 0.0
            for i in order:
                if not keep[i]:
                    continue
                margin = min(margin, abs(before - spec.top_p))
                keep[i] = before < spec.top_p
                before += p[i]
        if spec.min_p > 0.0:
            p = renorm()
            top = max(p)
            for i in range(V):
                if keep[i]:
                    margin = min(margin, abs(p[i] - spec.min_p * top) / top)
                    keep[i] = p[i] >= spec.min_p * top
    mass = sum(math.exp(v) for v, k in zip(lp, keep) if k)
    return [v - math.log(mass) if k else -math.inf for v, k in zip(lp, keep)], margin


def ref_draw(w, u):
    """Inverse CDF by a linear scan: the first positive-weight token whose cumulative mass passes u * total."""
    total = sum(w)
    acc, last = 0.0, max(i for i, v in enumerate(w) if v > 0)
    for i, v in enumerate(w):
        acc += v
        if v > 0 and acc > u * total:
            return i, abs(acc - u * total)
    return last, 0.0


def old_sample_next(logits, temperature, generator):
    """The pre-refactor ``model.sample_next`` arithmetic (float32 softmax, float64 CDF)."""
    logits = logits.float()
    if temperature <= 0:
        lp = torch.log_softmax(logits, dim=-1)
        ids = lp.argmax(dim=-1)
        return ids, lp.gather(-1, ids[:, None]).squeeze(-1)
    probs = torch.softmax(logits if temperature == 1 else logits / temperature, dim=-1)
    u = torch.rand(probs.shape[0], 1, generator=generator, dtype=torch.float64)
    cdf = probs.double().cumsum(dim=-1)
    total = cdf[:, -1:].contiguous()
    ids = torch.minimum(torch.searchsorted(cdf, u * total, right=True),
                        torch.searchsorted(cdf, total, right=False)).squeeze(-1)
    return ids, probs.gather(-1, ids[:, None]).squeeze(-1).log()


# ------------------------------------------------------------------------------ golden values

def test_processed_logp_golden():
    x = torch.tensor([[2.0, 1.0, 0.0]])
    want = -math.log(1 + math.exp(-2) + math.exp(-4))            # T = 0.5: logits [4, 2, 0]
    assert processed_logp(x, SamplingSpec(temperature=0.5))[0, 0].item() == pytest.approx(want, abs=1e-12)
    assert round(want, 4) == -0.1429
    lp = torch.tensor([[0.50, 0.30, 0.15, 0.05]]).log()
    got = processed_logp(lp, SamplingSpec(top_k=2)).exp()[0].tolist()
    assert got == pytest.approx([0.625, 0.375, 0.0, 0.0], abs=1e-7)
    got = processed_logp(lp, SamplingSpec(top_p=0.75)).exp()[0].tolist()     # 0.5 < 0.75, 0.8 crosses it
    assert got == pytest.approx([0.625, 0.375, 0.0, 0.0], abs=1e-7)
    got = processed_logp(lp, SamplingSpec(min_p=0.25)).exp()[0].tolist()     # 0.15 >= 0.125, 0.05 < 0.125
    assert got == pytest.approx([0.5 / 0.95, 0.3 / 0.95, 0.15 / 0.95, 0.0], abs=1e-7)
    # greedy: the temperature-1 distribution (its argmax is drawn)
    assert processed_logp(lp, SamplingSpec(temperature=0)).exp()[0].tolist() == pytest.approx([0.5, 0.3, 0.15, 0.05])


def test_penalties_golden():
    x = torch.tensor([[2.0, -1.0, 0.5, 0.0, 3.0]])
    ctx = PenaltyContext.of([[1, 4]], [[0, 0, 3]])               # context {1, 4}; output 0, 0, 3
    rep = SamplingSpec(repetition_penalty=2.0)
    # seen {0, 1, 3, 4}: 2 -> 1, -1 -> -2, 0 -> 0 (x 2), 3 -> 1.5; 0.5 (unseen) unchanged
    assert apply_penalties(x, rep, ctx)[0].tolist() == [1.0, -2.0, 0.5, 0.0, 1.5]
    vllm = SamplingSpec(repetition_penalty=2.0, frequency_penalty=0.5, presence_penalty=0.25, penalty_semantics='vllm')
    # output counts: token 0 twice, token 3 once; the context (1, 4) gets no presence/frequency penalty
    assert apply_penalties(x, vllm, ctx)[0].tolist() == [1.0 - 1.0 - 0.25, -2.0, 0.5, 0.0 - 0.5 - 0.25, 1.5]
    assert apply_penalties(x, SamplingSpec(), None).dtype == torch.float64
    with pytest.raises(ValueError, match='the spec has penalties but no PenaltyContext was given'):
        apply_penalties(x, rep, None)


def test_repetition_penalty_equals_transformers_processor():
    transformers = pytest.importorskip('transformers')
    g = torch.Generator().manual_seed(0)
    scores = torch.randn(3, 50, generator=g, dtype=torch.float64)
    prompts = [[1, 2, 3, 3], [7], [10, 11]]
    outs = [[3, 4, 4], [8, 9], []]
    proc = transformers.RepetitionPenaltyLogitsProcessor(1.3)
    for b in range(3):
        input_ids = torch.tensor([prompts[b] + outs[b]])
        want = proc(input_ids, scores[b:b + 1].clone())
        got = apply_penalties(scores[b:b + 1], SamplingSpec(repetition_penalty=1.3),
                              PenaltyContext.of([prompts[b]], [outs[b]]))
        assert torch.equal(got, want)


def test_spec_penalty_fields_validated_and_old_records_load():
    for kw, msg in [({'repetition_penalty': 0.0}, 'repetition_penalty must be a finite number > 0'),
                    ({'repetition_penalty': float('nan')}, 'repetition_penalty must be a finite number > 0'),
                    ({'presence_penalty': 2.5, 'penalty_semantics': 'vllm'}, r'presence_penalty must be in \[-2, 2\]'),
                    ({'frequency_penalty': -3.0, 'penalty_semantics': 'vllm'}, r'frequency_penalty must be in \[-2, 2\]'),
                    ({'penalty_semantics': 'sglang'}, "penalty_semantics must be one of \\('transformers', 'vllm'\\)"),
                    ({'presence_penalty': 0.5}, "need penalty_semantics='vllm'")]:
        with pytest.raises(ValueError, match=msg):
            SamplingSpec(**kw)
    old = {'temperature': 0.7, 'top_k': 0, 'top_p': 0.9, 'min_p': 0.0, 'logp_mode': 'processed'}
    spec = SamplingSpec.from_dict(old)
    assert spec.repetition_penalty == 1.0 and spec.penalty_semantics == 'transformers' and not spec.penalized
    assert spec.to_dict() == old                                  # stored exactly as before penalties existed
    pen = SamplingSpec(repetition_penalty=1.3, frequency_penalty=0.1, penalty_semantics='vllm')
    assert SamplingSpec.from_dict(pen.to_dict()) == pen and pen.penalized
    with pytest.raises(ValueError, match=r"SamplingSpec: unknown key\(s\) \['typical_p'\]"):
        SamplingSpec.from_dict(dict(old, typical_p=0.5))


def test_draw_one_edge_case_policy():
    w = torch.tensor([[0.5, 0.5, 0.0], [float('nan'), 1.0, 0.0], [0.0, 0.0, 0.0], [float('inf'), 1.0, 0.0]])
    with pytest.raises(ValueError, match=r'draw: rows \[1, 2, 3\] have no distribution to sample from'):
        draw(w, torch.zeros(4, dtype=torch.float64))
    assert draw(w[:1], torch.tensor([0.999999999999], dtype=torch.float64)).tolist() == [1]   # never the 0-weight tail
    from agentrl.sampling import choose              # the one chooser (HFSampler.choose): same message
    with pytest.raises(ValueError, match=r'draw: rows \[0\] have no distribution'):
        choose(torch.full((1, 3), -math.inf, dtype=torch.float64), SamplingSpec(), torch.zeros(1, dtype=torch.float64))
    with pytest.raises(ValueError, match=r'sample: rows \[0\] have no distribution'):
        sample(torch.tensor([[float('nan'), 0.0]]), SamplingSpec(top_p=0.5))


def test_sample_spec_paths():
    x = torch.tensor([[0.0, 5.0, 1.0]])
    ids, lp = sample(x, SamplingSpec(top_k=1))
    assert ids.tolist() == [1] and lp.tolist() == [0.0] and lp.dtype == torch.float32
    ids, lp = sample(x, SamplingSpec(temperature=0))
    assert ids.tolist() == [1] and lp.item() == pytest.approx(float(torch.log_softmax(x, -1)[0, 1]))
    # raw mode stores the unmodified log-softmax of the drawn token; the draw is from the processed one
    ids, lp = sample(x, SamplingSpec(top_k=1, logp_mode='raw'))
    assert ids.tolist() == [1] and lp.item() == pytest.approx(float(torch.log_softmax(x.double(), -1)[0, 1]), abs=1e-7)
    with pytest.raises(ValueError, match=r'sample expects logits \[B, V\]'):
        sample(torch.zeros(3), SamplingSpec())
    with pytest.raises(ValueError, match=r'sample: pass generator or one generator per row \(1\)'):
        sample(x, SamplingSpec(), generators=[])


def test_token_logp_is_the_one_gather():
    torch.manual_seed(0)
    model = arl.TinyAgent(40, max_len=16).eval()
    ids = torch.randint(0, 40, (2, 9))
    with torch.no_grad():
        logits = model(ids)
    want = torch.log_softmax(logits[:, :-1], -1).gather(-1, ids[:, 1:, None]).squeeze(-1)
    assert torch.equal(token_logp(model, ids), want)
    assert torch.equal(token_logp(logits, ids), want) and torch.equal(token_logp(logits[:, :-1], ids), want)
    assert torch.equal(arl.sequence_log_probs(model, ids), want)
    spec = SamplingSpec(temperature=0.7, top_p=0.8)
    got = token_logp(logits, ids, spec)
    full = processed_logp(logits[:, :-1].reshape(-1, 40), spec).reshape(2, 8, 40)
    assert torch.allclose(got.double(), full.gather(-1, ids[:, 1:, None]).squeeze(-1), atol=1e-5)
    with pytest.raises(ValueError, match='temperature must be > 0'):
        token_logp(logits, ids, SamplingSpec(temperature=0))
    with pytest.raises(ValueError, match='the spec has penalties'):
        token_logp(logits, ids, SamplingSpec(repetition_penalty=1.3))
    with pytest.raises(ValueError, match=r'logits \(2, 9, 40\) do not match ids \(2, 7\)'):
        token_logp(logits, ids[:, :7])


# ------------------------------------------------------------------------------ properties

specs = st.builds(SamplingSpec, temperature=st.sampled_from([0.0, 0.5, 0.7, 1.0, 1.3]),
                  top_k=st.sampled_from([0, 1, 3, 7]), top_p=st.sampled_from([1.0, 0.95, 0.8, 0.5, 0.3]),
                  min_p=st.sampled_from([0.0, 0.05, 0.2]))
rows = st.lists(st.floats(-6, 6, allow_nan=False).map(lambda v: round(v, 3)), min_size=2, max_size=12)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(x=rows, spec=specs, pen=st.sampled_from([1.0, 1.3, 0.8]), freq=st.sampled_from([0.0, 0.5]),
       pres=st.sampled_from([0.0, -0.3]), data=st.data())
def test_processed_logp_matches_the_slow_twin(x, spec, pen, freq, pres, data):
    V = len(x)
    spec = SamplingSpec(**{**spec.__dict__, 'repetition_penalty': pen, 'frequency_penalty': freq,
                           'presence_penalty': pres, 'penalty_semantics': 'vllm'})
    context = data.draw(st.lists(st.integers(0, V - 1), max_size=4))
    output = data.draw(st.lists(st.integers(0, V - 1), max_size=4))
    want, margin = ref_processed(x, spec, context, output)
    assume(margin > 1e-9)
    got = processed_logp(torch.tensor([x], dtype=torch.float64), spec, PenaltyContext.of([context], [output]))[0]
    assert [math.isinf(v) for v in got.tolist()] == [math.isinf(v) for v in want]
    fin = torch.isfinite(got)
    assert torch.allclose(got[fin], torch.tensor(want, dtype=torch.float64)[fin], atol=1e-9)
    # the support helper alone agrees with the twin's support
    if not spec.penalized and spec.temperature > 0:
        lp = torch.log_softmax(torch.tensor([x], dtype=torch.float64) / spec.temperature, -1)
        assert support_mask(lp, spec)[0].tolist() == [not math.isinf(v) for v in want]


@settings(max_examples=150, deadline=None)
@given(w=st.lists(st.sampled_from([0.0, 1e-9, 0.1, 0.25, 1.0, 3.0]), min_size=1, max_size=10),
       u=st.floats(0, 1, exclude_max=True))
def test_draw_matches_a_linear_scan(w, u):
    assume(sum(w) > 0)
    want, margin = ref_draw(w, u)
    assume(margin > 1e-12)
    assert draw(torch.tensor([w], dtype=torch.float64), torch.tensor([u], dtype=torch.float64)).tolist() == [want]


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), T=st.sampled_from([0.0, 0.5, 1.0, 1.7]), B=st.integers(1, 6))
def test_temperature_only_sample_is_bit_identical_to_the_old_sample_next(seed, T, B):
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(B, 30, generator=g) * 3
    a = old_sample_next(logits, T, torch.Generator().manual_seed(seed))
    b = arl.sample_next(logits, T, generator=torch.Generator().manual_seed(seed))
    c = sample(logits, SamplingSpec(temperature=T), generator=torch.Generator().manual_seed(seed))
    for x, y in ((a, b), (a, c)):
        assert torch.equal(x[0], y[0]) and torch.equal(x[1], y[1])


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), spec=specs)
def test_per_row_generators_match_row_by_row(seed, spec):
    logits = torch.randn(4, 20, generator=torch.Generator().manual_seed(seed)) * 2
    ids, lp = sample(logits, spec, generators=[torch.Generator().manual_seed(seed + b) for b in range(4)])
    for b in range(4):
        one, one_lp = sample(logits[b:b + 1], spec, generator=torch.Generator().manual_seed(seed + b))
        assert ids[b] == one[0] and lp[b] == one_lp[0]
    # and every stored value is the processed log-prob of the drawn token
    assert torch.allclose(lp.double(), stored_logp(logits, ids, spec), atol=1e-6)
    if spec.temperature > 0:
        assert bool(torch.isfinite(processed_logp(logits, spec).gather(-1, ids[:, None])).all())


# ------------------------------------------------------------------------------ TinyAgent rollouts with a spec

@pytest.fixture(scope='module')
def untrained(tok):
    torch.manual_seed(0)
    return arl.TinyAgent(tok.vocab_size).eval()


def test_rollout_batch_temperature_spec_is_bit_identical(untrained, tasks, tok):
    envs = lambda: [arl.BugFixEnv() for _ in range(6)]  # noqa: E731
    a = arl.rollout_batch(untrained, envs(), tasks[:6], tok, temperature=0.7, generator=torch.Generator().manual_seed(3))
    b = arl.rollout_batch(untrained, envs(), tasks[:6], tok, options=arl.RolloutBatchOptions(spec=SamplingSpec(0.7)),
                          generator=torch.Generator().manual_seed(3))
    for x, y in zip(a, b):
        assert torch.equal(x.ids, y.ids) and torch.equal(x.sample_logp, y.sample_logp)
        assert y.provenance.sampling == SamplingSpec(temperature=0.7)


@pytest.mark.parametrize('spec', [SamplingSpec(temperature=0.7, top_p=0.9), SamplingSpec(top_k=20, min_p=0.05)],
                         ids=['T0.7-top_p0.9', 'top_k20-min_p0.05'])
def test_rollouts_with_truncation_replay_to_one(untrained, tasks, tok, spec):
    envs = lambda: [arl.BugFixEnv() for _ in range(6)]  # noqa: E731
    cached = arl.rollout_batch(untrained, envs(), tasks[:6], tok, options=arl.RolloutBatchOptions(spec=spec),
                               generator=torch.Generator().manual_seed(1))
    free = arl.rollout_batch(untrained, envs(), tasks[:6], tok, generator=torch.Generator().manual_seed(1),
                             options=arl.RolloutBatchOptions(spec=spec, cache=False))
    one = arl.rollout(untrained, arl.BugFixEnv(), tasks[0], tok, spec=spec, generator=torch.Generator().manual_seed(1))
    assert [t.ids.tolist() for t in cached] == [t.ids.tolist() for t in free]
    assert all(t.provenance.sampling == spec for t in cached + [one])
    rep = checks.replay_check(cached + [one], untrained)
    assert rep.ok and rep.overall.max_abs_dev <= 1e-5
    assert rep.overall.n == sum(int(t.action_mask.sum()) for t in cached + [one])
    # the same records declared without the truncation: a support mismatch, never a policy change
    bare = [checks_replace(t, SamplingSpec(temperature=spec.temperature)) for t in cached]
    kinds = checks.replay_check(bare, untrained).record_kinds
    assert 'policy_change' not in kinds and set(kinds) <= {'match', 'support_mismatch'} and 'support_mismatch' in kinds


def checks_replace(t, spec):
    from dataclasses import replace
    return replace(t, provenance=replace(t.provenance, sampling=spec))


def test_rollouts_refuse_penalties_and_conflicting_temperature(untrained, tasks, tok):
    with pytest.raises(ValueError, match='^RolloutBatchOptions.spec: has repetition/presence/frequency penalties'):
        arl.RolloutBatchOptions(spec=SamplingSpec(repetition_penalty=1.3))
    with pytest.raises(ValueError, match=r'rollout: temperature=0.5 disagrees with spec.temperature=0.7'):
        arl.rollout(untrained, arl.BugFixEnv(), tasks[0], tok, temperature=0.5, spec=SamplingSpec(temperature=0.7))


@pytest.mark.parametrize('spec', [SamplingSpec(), SamplingSpec(temperature=0.7), SamplingSpec(temperature=0.0),
                                  SamplingSpec(temperature=0.8, logp_mode='raw'), SamplingSpec(top_p=0.8),
                                  SamplingSpec(repetition_penalty=1.3, temperature=0.9)],
                         ids=['t1', 't07', 'greedy', 'raw', 'top_p', 'penalty'])
def test_choose_is_the_one_chooser(spec):
    from agentrl.sampling import PenaltyContext, Scratch, choose, stored_logp, uniforms
    torch.manual_seed(3)
    scratch = Scratch()
    for n in (4, 2, 6):
        logits = torch.randn(n, 50) * 3
        ctx = PenaltyContext.of([[1, 2]] * n, [[3]] * n) if spec.penalized else None
        u = None if spec.temperature <= 0 else uniforms(n, torch.Generator().manual_seed(n))
        ids, lp = choose(logits, spec, u, context=ctx)
        ids2, lp2 = choose(logits, spec, u, context=ctx, buffers=scratch)       # in reused buffers: bit-identical
        assert torch.equal(ids, ids2) and torch.equal(lp, lp2) and lp.dtype == torch.float64
        assert torch.equal(lp, stored_logp(logits, ids, spec, ctx))
        forced_ids, forced_lp = choose(logits, spec, None, context=ctx, forced=ids.tolist())
        assert torch.equal(forced_ids, ids) and torch.equal(forced_lp, lp)
        # sample is choose on its float32 path, with one uniform draw per row
        s_ids, s_lp = sample(logits, spec, generator=torch.Generator().manual_seed(n), context=ctx)
        c_ids, c_lp = choose(logits, spec, u, context=ctx, dtype=torch.float32, caller='sample')
        assert torch.equal(s_ids, c_ids) and torch.equal(s_lp, c_lp.float()) and s_lp.dtype == torch.float32
    assert (scratch.tensor is None) == (spec.penalized or spec.truncated and spec.temperature > 0)
