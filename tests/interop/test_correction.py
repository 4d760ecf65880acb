"""agentrl's off-policy correction modes equal verl 0.9.1's and OpenRLHF 0.11.2's own functions within 1e-6.

verl: ``verl.trainer.ppo.rollout_corr_helper.compute_rollout_correction_weights`` (TIS, IcePop) and
``compute_rollout_rejection_mask`` (MIS ``token_k1``, geometric mean ``seq_mean_k1``), called as they are.
OpenRLHF: ``openrlhf.models.loss.PolicyLoss.forward``. Its package ``openrlhf.models`` imports the actor
(peft, flash_attn) and ``openrlhf/models/utils.py`` imports deepspeed for ZeRO-3 hooks, none of which
this CPU venv has, so ``loss.py`` and ``utils.py`` are loaded from their installed files as the modules
``openrlhf.models.loss`` / ``.utils``, with an empty ``deepspeed`` module only when deepspeed is missing
(``utils.masked_mean`` and ``PolicyLoss`` never touch it), and ``sys.modules`` is restored after (transformers
probes for deepspeed). PolicyLoss returns only the reduced loss, so its
per-token coefficient is read back exactly: with ``log_probs == old_log_probs`` the PPO ratio is 1, the
per-token loss is ``-coef * advantage``, and ``d loss / d advantage[b, t] = -coef[b, t] / n_action_tokens``.
"""
import functools
import importlib.util
import sys
import types
from pathlib import Path

import pytest
import torch

rc = pytest.importorskip('verl.trainer.ppo.rollout_corr_helper',
                         reason='verl is not in this venv; `make test-interop` runs these tests in .venv-interop')

from agentrl.correction import off_policy_correction  # noqa: E402


@functools.cache
def _openrlhf_loss():
    """OpenRLHF's ``PolicyLoss`` from its installed ``loss.py``; sys.modules is left as it was found."""
    spec = importlib.util.find_spec('openrlhf')
    if spec is None:
        pytest.skip('OpenRLHF is not in this venv')
    root = Path(spec.origin).parent / 'models'
    names = ('deepspeed', 'openrlhf.models', 'openrlhf.models.utils', 'openrlhf.models.loss')
    saved = {n: sys.modules[n] for n in names if n in sys.modules}
    try:
        if 'deepspeed' not in sys.modules and importlib.util.find_spec('deepspeed') is None:
            sys.modules['deepspeed'] = types.ModuleType('deepspeed')
        pkg = sys.modules['openrlhf.models'] = types.ModuleType('openrlhf.models')
        pkg.__path__ = [str(root)]
        for name in ('utils', 'loss'):
            full = f'openrlhf.models.{name}'
            s = importlib.util.spec_from_file_location(full, root / f'{name}.py')
            mod = importlib.util.module_from_spec(s)
            sys.modules[full] = mod
            s.loader.exec_module(mod)
        return sys.modules['openrlhf.models.loss'].PolicyLoss
    finally:
        for n in names:
            sys.modules.pop(n, None)
        sys.modules.update(saved)


@pytest.fixture(scope='module')
def data():
    """8 rows of 40 columns: ragged action masks, log-ratios of a bf16-like mismatch (sd 0.3) and 2 stale rows."""
    g = torch.Generator().manual_seed(0)
    B, W = 8, 40
    rollout = -torch.rand(B, W, generator=g) * 3 - 0.05
    lr = torch.randn(B, W, generator=g) * 0.3
    lr[5] += 0.8
    lr[6] -= 0.6
    mask = (torch.rand(B, W, generator=g) < 0.7).float()
    mask *= (torch.arange(W) < (30 + torch.arange(B) % 5)[:, None]).float()       # right padding, ragged
    mask[7, 0] = 1.0
    return rollout + lr, rollout, mask               # (trainer logp, sample_logp, action mask)


def _openrlhf_coef(PolicyLoss, old, rollout, mask, level, mode, threshold):
    loss_fn = PolicyLoss(is_correction_level=level, is_correction_mode=mode, is_correction_gating='ratio',
                         is_correction_threshold=threshold)
    adv = torch.ones_like(old, requires_grad=True)
    loss = loss_fn(old.clone(), old.clone(), adv, action_mask=mask, rollout_log_probs=rollout)[0]
    (grad,) = torch.autograd.grad(loss, adv)
    return -grad * mask.sum()


def _ours(data, mode, **kw):
    logp, slp, mask = data
    c = off_policy_correction(logp, slp, mask, mode, **kw)
    return c.weights * c.mask, c.mask


def _close(a, b):
    assert a.shape == b.shape
    assert float((a - b).abs().max()) <= 1e-6


@pytest.mark.parametrize('C', [2.0, 1.2])
def test_token_and_sequence_tis_equal_verl(data, C):
    logp, slp, mask = data
    for level in ('token', 'sequence'):
        w, _ = rc.compute_rollout_correction_weights(logp - slp, mask, rollout_is=level, rollout_is_threshold=C)
        ours, m = _ours(data, 'token_tis' if level == 'token' else 'seq_tis', rollout_is_threshold=C)
        _close(ours, w)
        assert torch.equal(m, mask)
    assert float(_ours(data, 'token_tis', rollout_is_threshold=C)[0].max()) == pytest.approx(C)
    assert float(_ours(data, 'seq_tis', rollout_is_threshold=C)[0].max()) == pytest.approx(C)


def test_token_tis_equals_openrlhf_token_clip(data):
    logp, slp, mask = data
    coef = _openrlhf_coef(_openrlhf_loss(), logp, slp, mask, 'token', 'clip', (0.0, 2.0))
    _close(_ours(data, 'token_tis', rollout_is_threshold=2.0)[0], coef * mask)


@pytest.mark.parametrize('band', [(0.5, 2.0), (0.8, 1.25), (0.6, 1.5)])
def test_icepop_equals_verl_and_openrlhf(data, band):
    logp, slp, mask = data
    low, high = band
    w, _ = rc.compute_rollout_correction_weights(logp - slp, mask, rollout_is='token',
                                                 rollout_is_threshold=f'{low}_{high}')
    ours, kept = _ours(data, 'icepop', is_correction_threshold=band)
    _close(ours, w)
    _close(ours, _openrlhf_coef(_openrlhf_loss(), logp, slp, mask, 'token', 'mask', band) * mask)
    assert 0 < float(kept.sum()) < float(mask.sum())


@pytest.mark.parametrize('band', [(0.5, 2.0), (0.8, 1.25), (0.6, 1.5)])
def test_token_mask_and_geometric_mask_equal_verl_rejection(data, band):
    """verl's k1 statistics are -log r: its 'lower_upper' keeps 1/upper <= r <= 1/lower."""
    logp, slp, mask = data
    low, high = band
    spec = f'{1 / high}_{1 / low}'
    for rs, mode in (('token_k1', 'token_mask'), ('seq_mean_k1', 'geo_mask')):
        verl_mask, _ = rc.compute_rollout_rejection_mask(logp - slp, mask, rollout_rs=rs, rollout_rs_threshold=spec)
        ours, kept = _ours(data, mode, is_correction_threshold=band)
        assert torch.equal(kept, verl_mask) and torch.equal(ours, verl_mask)
        assert bool((verl_mask < mask).any())                       # something is rejected
    geo_kept = _ours(data, 'geo_mask', is_correction_threshold=band)[1]
    assert geo_kept[5].sum() == 0 or geo_kept[6].sum() == 0          # a stale row is dropped whole


@pytest.mark.parametrize('band', [(0.5, 2.0), (0.8, 1.25), (0.6, 1.5)])
def test_seq_mask_tis_equals_openrlhf_seq_mask(data, band):
    logp, slp, mask = data
    coef = _openrlhf_coef(_openrlhf_loss(), logp, slp, mask, 'seq', 'mask', band)
    ours, kept = _ours(data, 'seq_mask_tis', is_correction_threshold=band)
    _close(ours, coef * mask)
    assert torch.equal(kept.bool(), (coef * mask) != 0)
