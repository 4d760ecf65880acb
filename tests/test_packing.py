"""collate_packed: first-fit-decreasing rows, per-record positions, no target across a record boundary, and
packed scoring (TinyAgent, a transformers Qwen3 with sdpa and eager) equal to the padded collate on every action token.
"""
import pytest
import torch
from hypothesis import given, strategies as st

import agentrl as arl
from agentrl.batching import collate
from agentrl.packing import balance_micro_batches, collate_packed, document_mask, pack_order, unpack_rows
from agentrl.record import Provenance, SamplingSpec
from agentrl.sampling import token_logp

from _tokenizers import TINY


def _rec(n, seed=0, vocab=50, rid=''):
    """A record of n tokens: a prompt token, then policy / tool tokens alternating in runs."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, vocab, (n,), generator=g).tolist()
    owner = ['prompt'] + ['tool' if j % 3 == 2 else 'policy' for j in range(n - 1)]
    turn = [-1] + [j // 4 for j in range(n - 1)]
    logp = [0.0] + [-0.01 * (j + 1) for j in range(n - 1)]
    prov = Provenance(policy='model', sampling=SamplingSpec(), rollout_id=rid) if rid else None
    return arl.Trajectory.from_tokens(ids, owner, turn, logp, float(seed), {}, provenance=prov)


LENS = [76, 40, 40, 30, 30, 20, 10, 10]


def test_collate_packed_layout_literal():
    trajs = [_rec(n, i) for i, n in enumerate(LENS)]
    p = collate_packed(trajs, 128, pad_id=0)
    assert p.ids.shape == (3, 126) and p.action_mask.shape == (3, 125)
    assert p.cu_seqlens.tolist() == [0, 76, 116, 126, 166, 196, 226, 246, 256] and p.cu_seqlens.dtype == torch.int32
    assert p.seq_lens.tolist() == [76, 40, 10, 40, 30, 30, 20, 10]
    assert p.index.tolist() == [0, 1, 6, 2, 3, 4, 5, 7]
    assert (p.row.tolist(), p.offset.tolist()) == ([0, 0, 0, 1, 1, 1, 1, 2], [0, 76, 116, 0, 40, 70, 100, 0])
    assert p.rewards.tolist() == [0.0, 1.0, 6.0, 2.0, 3.0, 4.0, 5.0, 7.0]
    assert p.position_ids[1].tolist() == (list(range(40)) + list(range(30)) + list(range(30)) + list(range(20))
                                          + [0] * 6)
    assert p.attention_mask.sum(1).tolist() == [126.0, 120.0, 10.0]
    assert p.ids[2, 10:].eq(0).all() and p.padding_share == pytest.approx(1 - 256 / 378)
    # the real tokens in row-major order are the records in segment order: the varlen layout of cu_seqlens
    flat = p.ids[p.attention_mask.bool()]
    for s, i in enumerate(p.index.tolist()):
        assert torch.equal(flat[p.cu_seqlens[s]:p.cu_seqlens[s + 1]], trajs[i].ids)
    seg = p.segment_of()
    assert seg[0, 75:77].tolist() == [0, 1] and seg[2, 9:].tolist() == [7] + [-1] * 116


def test_no_target_across_a_record_boundary():
    trajs = [_rec(n, i) for i, n in enumerate(LENS)]
    p = collate_packed(trajs, 128)
    for r, o, n in zip(p.row.tolist(), p.offset.tolist(), p.seq_lens.tolist()):
        if o > 0:      # the column predicting this record's first token from the previous record
            assert (p.action_mask[r, o - 1], p.sample_logp[r, o - 1], p.turn_ids[r, o - 1]) == (0.0, 0.0, -1)
        assert p.position_ids[r, o] == 0
    for field, width in (('ids', 0), ('action_mask', 1), ('sample_logp', 1)):
        for t, got in zip(trajs, unpack_rows(getattr(p, field), p)):
            assert torch.equal(got, getattr(t, field))
    for t, got in zip(trajs, unpack_rows(p.turn_ids, p)):
        assert torch.equal(got, t.turn[1:])
    assert p.action_mask.sum() == sum(t.action_mask.sum() for t in trajs)


@given(lens=st.lists(st.integers(1, 40), min_size=1, max_size=30), cap=st.integers(40, 90))
def test_packed_rows_round_trip_every_record(lens, cap):
    trajs = [_rec(n, i) for i, n in enumerate(lens)]
    p = collate_packed(trajs, cap)
    assert int(p.attention_mask.sum(1).max()) <= cap and sorted(p.index.tolist()) == list(range(len(lens)))
    assert p.ids.shape[1] == int(p.attention_mask.sum(1).max())
    for t, m, lp in zip(trajs, unpack_rows(p.action_mask, p), unpack_rows(p.sample_logp, p)):
        assert torch.equal(m, t.action_mask) and torch.equal(lp, t.sample_logp)
    assert p.action_mask.sum() == sum(float(t.action_mask.sum()) for t in trajs)
    # a record's first token is never a target: every target column lies inside one record
    seg = p.segment_of()
    both = (seg[:, :-1] == seg[:, 1:]) & (seg[:, 1:] >= 0)
    assert not (p.action_mask.bool() & ~both).any()
    # first-fit decreasing never uses more rows than placing each record alone
    assert len(pack_order(lens, cap)) <= len(lens)


def test_a_record_longer_than_max_tokens_is_refused_by_name():
    trajs = [_rec(20, 0), _rec(130, 1, rid='g3/r7')]
    with pytest.raises(ValueError, match=r"collate_packed: trajectory 1 \(rollout_id 'g3/r7'\) has 130 tokens > "
                                         r"max_tokens=128; a record is never split across rows"):
        collate_packed(trajs, 128)
    with pytest.raises(ValueError, match=r'collate_packed: trajectory 0 has 20 tokens > max_tokens=16'):
        collate_packed(trajs[:1], 16)
    with pytest.raises(ValueError, match=r'collate_packed\(\[\]\): no trajectories'):
        collate_packed([], 128)
    bad = _rec(10, 0)
    bad = arl.Trajectory(bad.ids, bad.action_mask[:-1], bad.sample_logp, 0.0, {}, bad.owner, bad.turn)
    with pytest.raises(ValueError, match=r'collate_packed: trajectory 0: Trajectory.action_mask has length 8 but ids '
                                         r'has length 10'):
        collate_packed([bad], 128)
    with pytest.raises(ValueError, match=r'pack_order: record 1 has 9 tokens > max_tokens=8'):
        pack_order([3, 9], 8)


def test_document_mask_literal():
    m = document_mask(torch.tensor([[0, 1, 2, 0, 1, 0]]))[0, 0].int().tolist()
    assert m == [[1, 0, 0, 0, 0, 0], [1, 1, 0, 0, 0, 0], [1, 1, 1, 0, 0, 0],
                 [0, 0, 0, 1, 0, 0], [0, 0, 0, 1, 1, 0], [0, 0, 0, 0, 0, 1]]


def _max_action_dev(packed_logp, p, trajs, padded_logp):
    out = 0.0
    for i, (t, lp) in enumerate(zip(trajs, unpack_rows(packed_logp, p))):
        ref = padded_logp[i, :len(t.ids) - 1]
        if t.action_mask.any():
            out = max(out, float(((lp - ref).abs() * t.action_mask).max()))
    return out


def test_tinyagent_packed_equals_padded_on_sampled_records(tasks, tok):
    torch.manual_seed(0)
    model = arl.TinyAgent(tok.vocab_size).eval()
    trajs = arl.rollout_batch(model, [arl.BugFixEnv() for _ in range(6)], tasks[:6], tok,
                              generator=torch.Generator().manual_seed(3))
    trajs += [_rec(n, i, vocab=tok.vocab_size) for i, n in enumerate([200, 9, 2, 1])]
    p = collate_packed(trajs, 512, pad_id=tok.pad_id)
    b = collate(trajs, tok.pad_id)
    from agentrl.engines.packed import packed_token_logp
    with torch.no_grad():
        packed = packed_token_logp(model, p)
        padded = token_logp(model, b.ids)
        assert p.ids.shape[1] > model.max_len        # rows longer than the context: positions restart per record
        unmasked = token_logp(lambda x: model(x, position_ids=torch.arange(x.shape[1]).expand_as(x) % 256), p.ids)
    assert _max_action_dev(packed, p, trajs, padded) <= 1e-5
    assert _max_action_dev(unmasked, p, trajs, padded) > 1e-3        # without the document mask they differ
    # the sampled records' own log-probs agree too (step-0 ratio 1)
    for t, lp in zip(trajs[:6], unpack_rows(packed, p)):
        assert float(((lp - t.sample_logp).abs() * t.action_mask).max()) <= 1e-5


def test_tinyagent_position_ids_errors():
    model = arl.TinyAgent(50, max_len=8)
    with pytest.raises(ValueError, match=r'sequence length 9 exceeds TinyAgent.max_len=8'):
        model(torch.ones(1, 12, dtype=torch.long), position_ids=torch.arange(12).view(1, -1) % 9)
    with pytest.raises(ValueError, match=r'TinyAgent: position_ids \(1, 3\) must match ids \(1, 4\)'):
        model(torch.ones(1, 4, dtype=torch.long), position_ids=torch.arange(3).view(1, -1))


@pytest.mark.parametrize('impl', ['sdpa', 'eager'])
def test_hf_packed_equals_padded_score_rows(tmp_path_factory, impl):
    pytest.importorskip('transformers')
    from agentrl.engines import hf
    from agentrl.engines.hf.models import score_rows
    from agentrl.engines.packed import packed_token_logp
    path = hf.make_test_model(tmp_path_factory.mktemp('m'), TINY, layers=2, hidden=32, heads=2, kv_heads=1,
                              max_positions=2048)
    model, _ = hf.load_model(path, attn_implementation=impl)
    assert model.config._attn_implementation == impl
    trajs = [_rec(n, i, vocab=500) for i, n in enumerate(LENS + [2, 1, 128])]
    p = collate_packed(trajs, 256)
    b = collate(trajs, 0)
    spec = SamplingSpec(temperature=0.7, top_p=0.9)
    with torch.no_grad():
        packed = packed_token_logp(model, p, spec)
        dense = packed_token_logp(model, p, spec, varlen=False)           # transformers' packed block mask
        logits = score_rows(model, b.ids, b.attention_mask, [torch.arange(b.ids.shape[1] - 1)] * len(trajs))
        padded = token_logp(torch.stack(logits), b.ids, spec)
        whole = token_logp(model(input_ids=p.ids, use_cache=False).logits, p.ids, spec)  # no positions: no mask
    assert _max_action_dev(packed, p, trajs, padded) <= 1e-5
    assert _max_action_dev(dense, p, trajs, padded) <= 1e-5
    assert model.config._attn_implementation == impl                  # switched back after scoring
    assert _max_action_dev(torch.where(p.action_mask > 0, whole, 0.0), p, trajs, padded) > 1e-4
    with pytest.raises(ValueError, match=r'packed_token_logp: where \(1, 2\) must be \[R, N-1\]'):
        packed_token_logp(model, p, where=torch.ones(1, 2, dtype=torch.bool))


def test_balance_micro_batches():
    # longest first into the lighter micro-batch: 10 | 7, 5 | 5, 3 | 1 -> token sums 16 and 15
    assert balance_micro_batches([10, 1, 7, 3, 5, 5], 2) == [[0, 1, 5], [2, 3, 4]]
    assert balance_micro_batches(torch.tensor([4, 4, 4]), 3) == [[0], [1], [2]]
    with pytest.raises(ValueError, match=r'balance_micro_batches: n_micro must be in \[1, 2\]'):
        balance_micro_batches([3, 4], 3)


@given(lens=st.lists(st.integers(1, 2000), min_size=1, max_size=64), data=st.data())
def test_balanced_micro_batches_differ_by_at_most_the_longest_item(lens, data):
    k = data.draw(st.integers(1, len(lens)))
    parts = balance_micro_batches(lens, k)
    assert sorted(i for b in parts for i in b) == list(range(len(lens)))
    sums = [sum(lens[i] for i in b) for b in parts]
    assert max(sums) - min(sums) <= max(lens)
