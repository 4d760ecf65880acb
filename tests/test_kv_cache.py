"""KV-cached rollouts (docs/design.md#hf-engine) against the KV-free reference, the ragged cache, the fast collate."""
import pytest
import torch
import torch.nn as nn
from hypothesis import HealthCheck, given, settings, strategies as st

import agentrl as arl

arl.collate  # resolve the lazy export before the submodule of the same name is imported below
from agentrl.batching import _collate_reference, collate  # noqa: E402
from agentrl.model import KVCache
from agentrl.record import SamplingSpec
from agentrl.rollouts import supports_kv_cache


@pytest.fixture(scope='module')
def untrained(tok):
    torch.manual_seed(0)
    return arl.TinyAgent(tok.vocab_size).eval()


def _same(a, b, atol=1e-5):
    """Identical ids, owners, turns, rewards and infos; log-probs within atol."""
    assert len(a) == len(b)
    for x, y in zip(a, b):
        assert torch.equal(x.ids, y.ids) and torch.equal(x.owner, y.owner) and torch.equal(x.turn, y.turn)
        assert torch.equal(x.action_mask, y.action_mask)
        assert float((x.sample_logp - y.sample_logp).abs().max()) < atol
        assert x.reward == y.reward and x.info == y.info


def _recompute_gap(model, trajs):
    with torch.no_grad():
        return max(float(((arl.sequence_log_probs(model, t.ids[None])[0] - t.sample_logp) * t.action_mask).abs().max())
                   for t in trajs)


class Wrapped(nn.Module):
    """A user's model: maps ids to logits and nothing else (no cache interface)."""

    def __init__(self, inner):
        super().__init__()
        self.inner, self.max_len = inner, inner.max_len

    def forward(self, ids):
        return self.inner(ids)


class Shifted(arl.TinyAgent):
    """A subclass that changes forward but not extend: the cache must not be used."""

    def forward(self, ids, past=None, start=0):
        return super().forward(ids) * 0.5


# ---------------------------------------------------------------- property: cache == KV-free
@settings(deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(task_ids=st.lists(st.integers(0, 29), min_size=1, max_size=12), seed=st.integers(0, 2**31 - 1),
       temperature=st.sampled_from([1.0, 0.7, 1.5, 0.0]),
       max_len=st.one_of(st.integers(13, 40), st.sampled_from([48, 64, 256])),
       max_turns=st.integers(1, 10), max_active=st.sampled_from([None, None, 1, 2, 5]),
       model_seed=st.integers(0, 3))
def test_property_cached_batch_equals_kv_free(tasks, tok, task_ids, seed, temperature, max_len, max_turns,
                                              max_active, model_seed):
    torch.manual_seed(model_seed)
    model = arl.TinyAgent(tok.vocab_size, max_len=max_len).eval()
    ts = [tasks[i] for i in task_ids]
    out, states = [], []
    for cache in (False, True):
        g = torch.Generator().manual_seed(seed)
        options = arl.RolloutBatchOptions(max_turns=max_turns, spec=SamplingSpec(temperature=temperature), cache=cache,
                                     max_active=max_active)
        out.append(arl.rollout_batch(model, [arl.BugFixEnv() for _ in ts], ts, tok, generator=g, options=options))
        states.append(g.get_state())
    ref, cached = out
    _same(ref, cached)
    assert torch.equal(states[0], states[1])           # the same draws from the generator
    assert all(len(t.ids) <= max_len for t in cached)
    if temperature == 1.0:
        assert _recompute_gap(model, cached) < 1e-5


@settings(deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(task=st.integers(0, 29), seed=st.integers(0, 2**31 - 1), temperature=st.sampled_from([1.0, 0.5, 0.0]),
       max_len=st.one_of(st.integers(13, 40), st.just(256)), max_turns=st.integers(1, 8))
def test_property_cached_rollout_equals_kv_free(tasks, tok, untrained, task, seed, temperature, max_len, max_turns):
    model = arl.TinyAgent(tok.vocab_size, max_len=max_len).eval() if max_len != 256 else untrained
    out = []
    for cache in (False, True):
        g = torch.Generator().manual_seed(seed)
        out.append([arl.rollout(model, arl.BugFixEnv(), tasks[task], tok, max_turns, temperature, g, cache=cache)
                    for _ in range(2)])
    _same(*out)
    if temperature == 1.0:
        assert _recompute_gap(model, out[1]) < 1e-5


def test_untrained_64_cached_matches_reference_and_recomputation(tasks, tok, untrained):
    ts = [tasks[i % 30] for i in range(64)]
    ref = arl.rollout_batch(untrained, [arl.BugFixEnv() for _ in ts], ts, tok,
                            generator=torch.Generator().manual_seed(2), options=arl.RolloutBatchOptions(cache=False))
    cached = arl.rollout_batch(untrained, [arl.BugFixEnv() for _ in ts], ts, tok,
                               generator=torch.Generator().manual_seed(2))
    _same(ref, cached)
    assert {t.info['stop'] for t in cached} == {'budget'} and sum(t.info['n_invalid'] for t in cached) == 384
    assert _recompute_gap(untrained, cached) < 1e-5


# ---------------------------------------------------------------- fallback for models without a cache
def test_models_without_cache_interface_fall_back(tasks, tok, untrained):
    assert supports_kv_cache(untrained)
    assert not supports_kv_cache(Wrapped(untrained)) and not supports_kv_cache(nn.Linear(2, 2))
    torch.manual_seed(0)
    shifted = Shifted(tok.vocab_size)
    assert not supports_kv_cache(shifted)
    ts = tasks[:5]
    a = arl.rollout_batch(Wrapped(untrained), [arl.BugFixEnv() for _ in ts], ts, tok,
                          generator=torch.Generator().manual_seed(4))          # cache=True by default
    b = arl.rollout_batch(untrained, [arl.BugFixEnv() for _ in ts], ts, tok, generator=torch.Generator().manual_seed(4))
    _same(a, b)
    c = arl.rollout(Wrapped(untrained), arl.BugFixEnv(), tasks[0], tok, generator=torch.Generator().manual_seed(1))
    d = arl.rollout(untrained, arl.BugFixEnv(), tasks[0], tok, generator=torch.Generator().manual_seed(1))
    _same([c], [d])
    s = arl.rollout_batch(shifted, [arl.BugFixEnv() for _ in ts], ts, tok, generator=torch.Generator().manual_seed(4))
    assert _recompute_gap(shifted, s) < 1e-5          # its own forward was used, not TinyAgent.extend


# ---------------------------------------------------------------- generate_call with a carried cache
def test_generate_call_carried_cache(tasks, tok, untrained):
    env = arl.BugFixEnv()
    ep = arl.Episode(env, tasks[3], tok)
    kv = untrained.new_cache(1)
    kv.tokens = []
    g1, g2 = torch.Generator().manual_seed(9), torch.Generator().manual_seed(9)
    while not ep.done:
        ref = arl.generate_call(untrained, ep.ids, tok, 1.0, g1, cache=False)
        held = int(kv.lengths[0])
        got = arl.generate_call(untrained, ep.ids, tok, 1.0, g2, cache=kv)
        assert got[0] == ref[0] and max(abs(x - y) for x, y in zip(got[1], ref[1])) < 1e-5
        assert held <= int(kv.lengths[0]) == len(ep.ids) + len(got[0]) - 1 == len(kv.tokens)
        ep.act(*got)
    with pytest.raises(ValueError, match='does not hold a strict prefix of ids'):
        arl.generate_call(untrained, [1, 2, 3], tok, cache=kv)
    with pytest.raises(ValueError, match='does not hold a strict prefix of ids'):
        arl.generate_call(untrained, ep.ids[:len(kv.tokens)], tok, cache=kv)   # nothing new to feed


# ---------------------------------------------------------------- the ragged cache itself
def test_extend_ragged_matches_full_forward_and_memory_is_bounded():
    torch.manual_seed(5)
    m = arl.TinyAgent(50, max_len=64).eval()
    g = torch.Generator().manual_seed(0)
    seqs = [torch.randint(0, 50, (int(n),), generator=g).tolist() for n in (12, 64, 30, 47, 5)]
    with torch.no_grad():
        full = [m(torch.tensor([s]))[0] for s in seqs]
        kv = m.new_cache(len(seqs), chunk=8)
        rows, fed, err = list(range(len(seqs))), [0] * len(seqs), 0.0
        while rows:
            parts = [seqs[b][fed[b]:fed[b] + int(torch.randint(1, 7, (1,), generator=g))] for b in rows]
            t = max(len(p) for p in parts)
            ids = torch.tensor([p + [0] * (t - len(p)) for p in parts])
            out = m.extend(kv, ids, torch.tensor([len(p) for p in parts]))
            assert out.shape == (len(rows), 50) and out.dtype == torch.float32
            for r, b in enumerate(rows):
                fed[b] += len(parts[r])
                err = max(err, float((out[r] - full[b][fed[b] - 1]).abs().max()))
            longest = max(fed[b] for b in rows)
            assert longest <= kv.capacity <= min(64, (longest * 5 // 4 // 8 + 2) * 8)   # follows the longest row
            keep = [r for r, b in enumerate(rows) if fed[b] < len(seqs[b])]
            rows = [rows[r] for r in keep]
            kv.keep(keep)
            assert kv.lengths.tolist() == [fed[b] for b in rows]
            if rows:
                assert kv.capacity == -(-max(fed[b] for b in rows) // 8) * 8   # finished rows dropped
    assert err < 1e-5
    assert kv.batch_size == 0 and kv.nbytes() == 0


def test_extend_keep_extra_rows_and_errors():
    torch.manual_seed(6)
    m = arl.TinyAgent(30, max_len=16).eval()
    kv = m.new_cache(2)
    with torch.no_grad():
        m.extend(kv, torch.tensor([[1, 2, 3], [4, 5, 0]]), torch.tensor([3, 2]))
        kv.keep([1], extra=2)
        assert kv.lengths.tolist() == [2, 0, 0] and kv.batch_size == 3
        out = m.extend(kv, torch.tensor([[6, 0], [7, 8], [9, 0]]), torch.tensor([1, 2, 1]))
        ref = m(torch.tensor([[4, 5, 6]]))[0, -1], m(torch.tensor([[7, 8]]))[0, -1], m(torch.tensor([[9]]))[0, -1]
        assert all(torch.allclose(out[i], ref[i], atol=1e-5) for i in range(3))
        out = m.extend(kv, torch.tensor([[1, 2, 3], [4, 5, 6], [7, 8, 9]]))             # n_new None: all 3
        ref = m(torch.tensor([[4, 5, 6, 1, 2, 3], [7, 8, 4, 5, 6, 0], [9, 7, 8, 9, 0, 0]]))
    assert torch.allclose(out, ref[torch.arange(3), torch.tensor([5, 4, 3])], atol=1e-5)
    assert kv.lengths.tolist() == [6, 5, 4]
    assert isinstance(kv, KVCache)
    with pytest.raises(ValueError, match=r'expects ids \[B, t\] with B = 3 cache rows'):
        m.extend(kv, torch.tensor([[1]]))
    with pytest.raises(ValueError, match=r'n_new must be in \[1, 2\]'):
        m.extend(kv, torch.zeros(3, 2, dtype=torch.long), torch.tensor([0, 1, 2]))
    with pytest.raises(ValueError, match='sequence length 20 exceeds TinyAgent.max_len=16'):
        m.extend(kv, torch.zeros(3, 14, dtype=torch.long))
    with pytest.raises(ValueError, match=r'^RolloutBatchOptions.max_active = 0: must be None or an int >= 1; '
                                         'pass None to run every episode at once$'):
        arl.RolloutBatchOptions(max_active=0)


# ---------------------------------------------------------------- collate fast path == reference
@settings(deadline=None)
@given(lengths=st.lists(st.integers(1, 40), min_size=1, max_size=12), seed=st.integers(0, 1000),
       pad_id=st.integers(0, 5), tensors=st.booleans())
def test_property_collate_fast_equals_reference(lengths, seed, pad_id, tensors):
    g = torch.Generator().manual_seed(seed)
    trajs = []
    for i, n in enumerate(lengths):
        owner = torch.randint(0, 4, (n,), generator=g)
        owner[0] = 0
        ids, turn = torch.randint(0, 300, (n,), generator=g), torch.randint(-1, 6, (n,), generator=g)
        logp = torch.randn(n, generator=g)
        if not tensors:
            ids, turn, logp = ids.tolist(), turn.tolist(), logp.tolist()
        trajs.append(arl.Trajectory.from_tokens(ids, owner, turn, logp, float(i), {}))
    a, b = collate(trajs, pad_id), _collate_reference(trajs, pad_id, None)
    for (k, x), y in zip(a.items(), b.values()):
        assert x.dtype == y.dtype and torch.equal(x, y), k


def test_collate_odd_inputs_take_the_reference_path(tasks, tok):
    t = arl.scripted_rollout(arl.scripted_policy('oracle'), arl.BugFixEnv(), tasks[0], tok)
    odd = arl.Trajectory(t.ids.int(), t.action_mask.double(), t.sample_logp, 1.0, {}, t.owner, t.turn)
    a, b = collate([t, odd], tok.pad_id), _collate_reference([t, odd], tok.pad_id, None)
    assert all(x.dtype == y.dtype and torch.equal(x, y) for x, y in zip(a.values(), b.values()))
    no_turn = arl.Trajectory(t.ids, t.action_mask, t.sample_logp, 1.0, {}, t.owner, None)
    with pytest.raises(ValueError, match='collate: trajectory 1 has no turn field'):
        collate([t, no_turn], tok.pad_id)
    flat = arl.Trajectory(t.ids[None], t.action_mask, t.sample_logp, 1.0, {}, t.owner, t.turn)
    with pytest.raises(ValueError, match='collate: trajectory 0'):
        collate([flat], tok.pad_id)


def test_drop_moves_rows_into_holes_and_keeps_their_cache():
    torch.manual_seed(7)
    m = arl.TinyAgent(30, max_len=32).eval()
    seqs = [[1, 2, 3], [4, 5], [6, 7, 8, 9], [10], [11, 12, 13]]
    with torch.no_grad():
        kv = m.new_cache(len(seqs), chunk=4)
        ids = torch.tensor([s + [0] * (4 - len(s)) for s in seqs])
        m.extend(kv, ids, torch.tensor([len(s) for s in seqs]))
        cap = kv.capacity
        order = kv.drop([3, 1])
        assert order == [0, 4, 2] and kv.batch_size == 3 and kv.lengths.tolist() == [3, 3, 4]
        assert kv.capacity == cap                                  # drop never trims
        out = m.extend(kv, torch.tensor([[20], [21], [22]]))
        for r, o in enumerate(order):
            ref = m(torch.tensor([seqs[o] + [20 + r]]))[0, -1]
            assert torch.allclose(out[r], ref, atol=1e-5)
        with pytest.raises(ValueError, match=r'KVCache.drop: repeated row indices in \[1, 1\]'):
            kv.drop([1, 1])
        with pytest.raises(IndexError, match=r'KVCache.drop: row index out of range \[0, 3\) in \[3\]'):
            kv.drop([3])
        assert kv.drop([0, 1, 2]) == [] and kv.batch_size == 0 and kv.nbytes() == 0
