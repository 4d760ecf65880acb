"""TinyAgent, sequence_log_probs, sample_next."""
import pytest
import torch

import agentrl as arl


def test_shapes_and_uniform_init():
    torch.manual_seed(0)
    m = arl.TinyAgent(316)
    assert m.max_len == 256 and m.d_model == 64 and m.head.weight.shape == (316, 64)
    ids = torch.randint(0, 316, (3, 10))
    assert m(ids).shape == (3, 10, 316)
    lp = arl.sequence_log_probs(m, ids)
    assert lp.shape == (3, 9) and lp.dtype == torch.float32
    # near uniform at init: every log-prob close to -log(316) = -5.756
    assert (lp + 5.756).abs().max() < 0.5


def test_right_padding_does_not_change_real_positions():
    torch.manual_seed(1)
    m = arl.TinyAgent(50)
    ids = torch.randint(0, 50, (1, 12))
    padded = torch.cat([ids, torch.zeros(1, 5, dtype=torch.long)], dim=1)
    assert torch.allclose(m(ids), m(padded)[:, :12], atol=1e-6)


def test_kv_cache_matches_full_forward():
    torch.manual_seed(2)
    m = arl.TinyAgent(40)
    ids = torch.randint(0, 40, (2, 15))
    full = m(ids)
    out, past = m(ids[:, :9], past=[None, None])
    steps = [out]
    for j in range(9, 15):
        o, past = m(ids[:, j:j + 1], past=past, start=j)
        steps.append(o)
    assert torch.allclose(torch.cat(steps, 1), full, atol=1e-5)


def test_too_long_raises():
    m = arl.TinyAgent(10, max_len=8)
    with pytest.raises(ValueError, match='sequence length 9 exceeds TinyAgent.max_len=8'):
        m(torch.zeros(1, 9, dtype=torch.long))


def test_sample_next_logp_is_under_sampled_distribution():
    logits = torch.tensor([[2.0, 1.0, 0.0]])
    g = torch.Generator().manual_seed(0)
    ids, lp = arl.sample_next(logits, temperature=0.5, generator=g)
    assert ids.shape == (1,) and lp.shape == (1,)
    expect = torch.log_softmax(logits / 0.5, -1)[0, ids[0]]
    assert float(lp[0]) == pytest.approx(float(expect), abs=1e-7)
    ids, lp = arl.sample_next(logits, temperature=0)
    assert int(ids[0]) == 0 and float(lp[0]) == pytest.approx(-0.4076, abs=1e-4)
    with pytest.raises(ValueError, match=r'sample_next expects logits \[B, V\]'):
        arl.sample_next(torch.zeros(3))


def test_checkpoint_round_trip(tmp_path):
    from agentrl.checkpoint import load_checkpoint, save_checkpoint
    torch.manual_seed(3)
    m = arl.TinyAgent(20, max_len=32)
    save_checkpoint(m, str(tmp_path / 'm.pt'))
    m2 = load_checkpoint(str(tmp_path / 'm.pt'))
    ids = torch.randint(0, 20, (1, 6))
    assert m2.max_len == 32 and torch.equal(m(ids), m2(ids))
    with pytest.raises(FileNotFoundError, match='not found'):
        load_checkpoint(str(tmp_path / 'missing.pt'))


def test_sample_next_inverse_cdf_matches_the_distribution():
    """One uniform per row, located in the row's CDF: frequencies match, zero-prob never drawn."""
    probs = torch.tensor([0.5, 0.0, 0.3, 0.2, 0.0])
    logits = probs.log().expand(20000, 5).contiguous()          # log 0 = -inf: never sampled
    g = torch.Generator().manual_seed(1)
    ids, lp = arl.sample_next(logits, generator=g)
    freq = torch.bincount(ids, minlength=5).float() / len(ids)
    assert freq[1] == 0 and freq[4] == 0
    assert (freq - probs).abs().max() < 0.015                   # 20k draws: standard error <= 0.0036
    assert torch.allclose(lp, probs.log()[ids])
    # the generator decides the draws: same seed, same ids; one uniform per row is consumed
    again, _ = arl.sample_next(logits, generator=torch.Generator().manual_seed(1))
    assert torch.equal(ids, again)
    g2 = torch.Generator().manual_seed(1)
    arl.sample_next(logits[:3], generator=g2)
    ref = torch.Generator().manual_seed(1)
    torch.rand(3, 1, generator=ref, dtype=torch.float64)
    assert torch.equal(g2.get_state(), ref.get_state())


def test_locate_inverts_the_cdf_in_float64():
    """Exact intervals, zero weights skipped, a 1e-9 token after a 0.999 mass keeps its interval."""
    from agentrl.sampling import draw as locate
    probs = torch.tensor([[0.5, 0.0, 0.3, 0.2], [0.999, 1e-9, 0.0, 0.001 - 1e-9]])
    cdf = probs.double().cumsum(-1)
    u = torch.tensor([[0.0], [float(cdf[1, 0] + 0.5e-9) / float(cdf[1, -1])]], dtype=torch.float64)
    assert locate(probs, u).tolist() == [0, 1]                  # in float32 its interval is empty
    u = torch.tensor([[0.5], [0.9999999]], dtype=torch.float64)
    assert locate(probs, u).tolist() == [2, 3]                  # [0.5, 0.8) -> 2; the tail -> 3
    u = torch.tensor([[1.0 - 2 ** -53], [1.0]], dtype=torch.float64)   # rounding up to the total
    assert locate(probs, u).tolist() == [3, 3]                  # never past the last positive token


def test_fill_holes_moves_only_the_tail():
    from agentrl.model import fill_holes
    assert fill_holes(6, [1, 4]) == [0, 5, 2, 3]
    assert fill_holes(6, [4, 5]) == [0, 1, 2, 3]               # nothing moves
    assert fill_holes(5, [0, 1, 2]) == [3, 4]
    assert fill_holes(3, [0, 1, 2]) == []
    assert fill_holes(4, []) == [0, 1, 2, 3]


def test_sample_next_refuses_rows_without_a_distribution():
    logits = torch.tensor([[0.0, 1.0], [float('nan'), 0.0], [float('-inf'), float('-inf')]])
    with pytest.raises(ValueError, match=r'sample_next: rows \[1, 2\] have no distribution to sample from'):
        arl.sample_next(logits, generator=torch.Generator().manual_seed(0))


def test_sample_next_with_one_generator_per_row_matches_row_by_row():
    torch.manual_seed(3)
    logits = torch.randn(5, 40)
    gens = [torch.Generator().manual_seed(10 + b) for b in range(5)]
    ids, lp = arl.sample_next(logits, 0.8, generators=gens)
    for b in range(5):
        one_id, one_lp = arl.sample_next(logits[b:b + 1], 0.8, generator=torch.Generator().manual_seed(10 + b))
        assert int(ids[b]) == int(one_id) and float(lp[b]) == pytest.approx(float(one_lp), abs=1e-7)
        ref = torch.Generator().manual_seed(10 + b)
        torch.rand(1, 1, generator=ref, dtype=torch.float64)
        assert torch.equal(gens[b].get_state(), ref.get_state())          # one uniform consumed per row
    with pytest.raises(ValueError, match=r'sample_next: pass generator or one generator per row \(5\)'):
        arl.sample_next(logits, generators=gens[:4])
