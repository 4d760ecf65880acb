"""Packed training (docs/design.md#training): a packed SFT or GRPO step equals the padded one;
`agentrl train --packed` gives the same step-0 metrics; per-record attention equals the dense document mask."""
import copy
import json

import pytest
import torch
import torch.nn.functional as F

import agentrl as arl
from agentrl.batching import collate
from agentrl.model import segment_attention, segment_pieces
from agentrl.packing import collate_packed, document_mask
from agentrl import correction as corr_mod
from agentrl.train.config import CORRECTIONS
from agentrl.train.packed import pack_for, to_padded


def test_segment_attention_equals_the_document_mask_with_gqa_and_gradients():
    torch.manual_seed(0)
    pos = torch.tensor([[0, 1, 2, 0, 0, 1, 0, 0], [0, 1, 2, 3, 4, 0, 1, 0]])
    assert segment_pieces(pos) == [[(0, 3, True), (3, 4, False), (4, 6, True), (6, 8, False)],
                                   [(0, 5, True), (5, 7, True), (7, 8, False)]]
    q = torch.randn(2, 4, 8, 16, requires_grad=True)
    k = torch.randn(2, 2, 8, 16, requires_grad=True)
    v = torch.randn(2, 2, 8, 16, requires_grad=True)
    out = segment_attention(q, k, v, segment_pieces(pos))
    ref = F.scaled_dot_product_attention(q, k.repeat_interleave(2, 1), v.repeat_interleave(2, 1),
                                         attn_mask=document_mask(pos))
    assert out.shape == (2, 4, 8, 16) and float((out - ref).detach().abs().max()) <= 1e-6
    g = torch.randn_like(out)
    ga = torch.autograd.grad(out, (q, k, v), g)
    gb = torch.autograd.grad(ref, (q, k, v), g)
    assert max(float((a - b).abs().max()) for a, b in zip(ga, gb)) <= 1e-5


def test_to_padded_places_every_record_in_its_row():
    recs = [arl.Trajectory.from_tokens(list(range(1, n + 1)), ['prompt'] + ['policy'] * (n - 1), [-1] + [0] * (n - 1),
                                       [0.0] + [-0.5] * (n - 1), 0.0, {}) for n in (5, 2, 7, 1, 3)]
    p = collate_packed(recs, 8)
    b = collate(recs, 0)
    assert torch.equal(to_padded(p.sample_logp, p, 5, b.ids.shape[1] - 1), b.sample_logp)
    assert torch.equal(to_padded(p.action_mask, p, 5, b.ids.shape[1] - 1), b.action_mask)
    with pytest.raises(ValueError, match=r'^to_padded: values \(1, 2\) must be \[R, N-1\]'):
        to_padded(torch.zeros(1, 2), p, 5, 6)
    assert pack_for(recs, 4).ids.shape[1] == 7          # rows raised to the longest record


def test_correction_choices_match_the_modes():
    assert CORRECTIONS == ('none',) + corr_mod.CORRECTION_MODES


@pytest.fixture(scope='module')
def sampled(tasks, tok):
    from agentrl.train.loop import sample_groups
    torch.manual_seed(0)
    model = arl.TinyAgent(tok.vocab_size)
    trajs = sample_groups(model, tasks[:2], 4, tok, torch.Generator().manual_seed(1), policy_version=0)
    for i, t in enumerate(trajs):
        t.reward = float(i % 2)
    return model, trajs


def _close(a: dict, b: dict, tol=1e-5):
    assert a.keys() == b.keys()
    bad = {k: (a[k], b[k]) for k in a if isinstance(a[k], float) and not abs(a[k] - b[k]) <= tol}
    assert not bad, bad
    assert {k: v for k, v in a.items() if not isinstance(v, float)} == \
        {k: v for k, v in b.items() if not isinstance(v, float)}


@pytest.mark.parametrize('mode', [None, 'token_tis', 'icepop'])
def test_packed_grpo_step_equals_padded(sampled, tok, mode):
    model, trajs = sampled
    out = []
    for packed in (False, True):
        m = copy.deepcopy(model)
        opt = torch.optim.SGD(m.parameters(), lr=0.1)     # Adam's first step is ~lr * sign(grad): flips at ~0
        options = arl.train.GRPOOptions(updates=2, kl_coef=0.1, correction=mode, mask_truncated=True, packed=packed,
                                        max_tokens=300, max_staleness=0)
        metrics = arl.train.grpo_step(m, opt, trajs, 4, tok.pad_id, options, ref_model=copy.deepcopy(model),
                                      current_version=0)
        out.append((metrics, m))
    (a, ma), (b, mb) = out
    assert a['updates'] == 2 and a['fresh_records'] == 8
    _close(a, b)
    assert max(float((x - y).detach().abs().max()) for x, y in zip(ma.parameters(), mb.parameters())) <= 1e-5


def test_packed_sft_step_equals_padded(tasks, tok):
    demos = arl.train.oracle_demos(tasks[:6], tok)
    torch.manual_seed(0)
    model = arl.TinyAgent(tok.vocab_size)
    res = []
    for packed in (None, pack_for(demos, 512, tok.pad_id)):
        m = copy.deepcopy(model)
        opt = torch.optim.SGD(m.parameters(), lr=0.1)
        res.append((arl.train.sft_step(m, opt, collate(demos, tok.pad_id), packed=packed), m))
    (a, ma), (b, mb) = res
    _close(a, b)
    assert max(float((x - y).detach().abs().max()) for x, y in zip(ma.parameters(), mb.parameters())) <= 1e-5


def test_agentrl_train_packed_gives_the_same_step0_metrics(tmp_path):
    from agentrl.cli.main import main
    rows = {}
    for flags in ([], ['--packed', '--max-tokens', '600']):
        out = tmp_path / ('packed' if flags else 'padded')
        argv = ['train', '--sft-steps', '2', '--grpo-steps', '1', '--group', '2', '--tasks-per-step', '2',
                '--eval-repeats', '1', '--eval-every', '1', '--correction', 'token_tis', '--max-staleness', '0',
                '--out', str(out), *flags]
        assert main(argv) == 0
        rows[bool(flags)] = [json.loads(line) for line in (out / 'metrics.jsonl').read_text().splitlines()]
    drop = ('seconds', 'sample_seconds')
    a, b = ([{k: v for k, v in r.items() if k not in drop} for r in rows[p] if r['phase'] in ('sft', 'grpo')]
            for p in (False, True))
    assert [r['phase'] for r in a] == ['sft', 'sft', 'grpo']
    for x, y in zip(a, b):
        _close(x, y)
    assert 'corr_weight_mean' in a[-1] and a[-1]['fresh_records'] == 4


def test_train_flags_refuse_bad_values(tmp_path, capsys):
    from agentrl.cli.main import main
    assert main(['train', '--is-correction-threshold', '5,1', '--out', str(tmp_path / 'a')]) == 2
    assert '--is-correction-threshold must have 0 <= LOW < HIGH, got 5.0,1.0' in capsys.readouterr().err
    assert main(['train', '--is-correction-threshold', 'x', '--out', str(tmp_path / 'b')]) == 2
    assert "--is-correction-threshold must be LOW,HIGH (two numbers), got 'x'" in capsys.readouterr().err
    assert main(['train', '--max-staleness', '-2', '--out', str(tmp_path / 'c')]) == 2
    assert '--max-staleness must be >= -1 and <= 10000000, got -2' in capsys.readouterr().err


def test_packed_grpo_step_equals_padded_on_a_transformers_model(tmp_path):
    pytest.importorskip('transformers')
    from _tokenizers import TINY
    from agentrl.engines import hf
    from agentrl.record import Provenance, SamplingSpec
    path = hf.make_test_model(tmp_path / 'm', TINY, layers=2, hidden=32, heads=2, kv_heads=1, max_positions=512)
    model, _ = hf.load_model(path)
    g = torch.Generator().manual_seed(0)
    recs = []
    for i, n in enumerate([40, 7, 90, 23, 61, 12]):
        ids = torch.randint(1, 500, (n,), generator=g)
        owner = ['prompt'] * 3 + ['policy' if (j // 5) % 2 == 0 else 'tool' for j in range(n - 3)]
        logp = [0.0] * 3 + (-torch.rand(n - 3, generator=g)).tolist()
        prov = Provenance(policy='hf', sampling=SamplingSpec(temperature=0.8), group_id=f'g{i // 3}',
                          rollout_id=f'r{i}')
        recs.append(arl.Trajectory.from_tokens(ids, owner, [-1] * 3 + [0] * (n - 3), logp, float(i % 2), {},
                                               provenance=prov))
    out = []
    for packed in (False, True):
        m = copy.deepcopy(model)
        opt = torch.optim.SGD(m.parameters(), lr=0.1)
        options = arl.train.GRPOOptions(updates=2, correction='token_tis', packed=packed, max_tokens=128)
        out.append((arl.train.grpo_step(m, opt, recs, 3, 0, options), m))
    (a, ma), (b, mb) = out
    assert a['updates'] == 2 and model.config._attn_implementation == mb.config._attn_implementation
    _close(a, b)
    assert max(float((x - y).detach().abs().max()) for x, y in zip(ma.parameters(), mb.parameters())) <= 1e-5
