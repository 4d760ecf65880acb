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
    from agentrl.model import load_checkpoint, save_checkpoint
    torch.manual_seed(3)
    m = arl.TinyAgent(20, max_len=32)
    save_checkpoint(m, str(tmp_path / 'm.pt'))
    m2 = load_checkpoint(str(tmp_path / 'm.pt'))
    ids = torch.randint(0, 20, (1, 6))
    assert m2.max_len == 32 and torch.equal(m(ids), m2(ids))
    with pytest.raises(FileNotFoundError, match='not found'):
        load_checkpoint(str(tmp_path / 'missing.pt'))
