"""``export(..., correction=)`` read back by the trainers' own loaders and checked against their own functions.

verl 0.9.1: the ``gen_batch.dp`` file is loaded with ``DataProto.load_from_disk``; its ``rollout_is_weights`` and
``response_mask`` equal what ``rollout_corr_helper.compute_rollout_correction_and_add_to_batch`` puts into the
plain export's batch (within 1e-6), and its ``agentrl_old_log_probs`` equal verl's own log-prob path (no-padding
input, ``logprobs_from_logits``) within 1e-5. OpenRLHF 0.11.2: ``Experience(**experience.pt)`` takes the exported
``action_log_probs``; ``PolicyLoss`` fed with it gives per-token coefficients equal to ``agentrl_is_weights``.
"""
import shutil

import pytest
import torch

rc = pytest.importorskip('verl.trainer.ppo.rollout_corr_helper',
                         reason='verl is not in this venv; `make test-interop` runs these tests in .venv-interop')
pytest.importorskip('verl.workers.utils.padding')

from agentrl import interop  # noqa: E402

BAND = (0.97, 1.03)


@pytest.fixture(scope='module')
def trainer(lm, tmp_path_factory):
    """The test model with its output head moved a little (a trainer a step away), saved with the same tokenizer."""
    from agentrl.engines import hf
    path = tmp_path_factory.mktemp('trainer') / 'm'
    shutil.copytree(lm[0], path)
    model, _ = hf.load_model(path)
    with torch.no_grad():
        head = model.get_output_embeddings().weight
        head.add_(0.02 * torch.randn(head.shape, generator=torch.Generator().manual_seed(0)))
    model.save_pretrained(path)
    return path, hf.load_model(path)[0]


def _verl_old_log_probs(model, dp):
    """verl's own log-prob path over a DataProto: no-padding nested input, per sequence, label roll."""
    from verl.utils.torch_functional import logprobs_from_logits
    from verl.workers.utils.padding import left_right_2_no_padding, no_padding_2_padding
    packed = left_right_2_no_padding(dp.batch.clone())
    ids = packed['input_ids']
    offsets, values = ids.offsets().tolist(), ids.values()
    out = []
    with torch.no_grad():
        for s, e in zip(offsets[:-1], offsets[1:]):
            seq = values[s:e]
            logits = model(input_ids=seq[None]).logits[0].float() / dp.meta_info['temperature']
            out.append(logprobs_from_logits(logits, torch.roll(seq, -1)))
    return no_padding_2_padding(torch.cat(out), packed)


#: agentrl mode -> verl rollout_corr config (verl's k1 rejection keeps 1/upper <= r <= 1/lower)
VERL = {'token_tis': {'rollout_is': 'token', 'rollout_is_threshold': 1.02},
        'seq_tis': {'rollout_is': 'sequence', 'rollout_is_threshold': 1.02},
        'icepop': {'rollout_is': 'token', 'rollout_is_threshold': f'{BAND[0]}_{BAND[1]}'},
        'token_mask': {'rollout_rs': 'token_k1', 'rollout_rs_threshold': f'{1 / BAND[1]}_{1 / BAND[0]}'},
        'geo_mask': {'rollout_rs': 'seq_mean_k1', 'rollout_rs_threshold': f'{1 / BAND[1]}_{1 / BAND[0]}'}}


@pytest.mark.parametrize('mode', list(VERL))
def test_verl_loads_the_weights_and_its_helper_agrees(records, lm, trainer, tmp_path, mode):
    from verl.protocol import DataProto
    tok = lm[2]
    corr = interop.load_correction(trainer[0], mode, rollout_is_threshold=1.02, is_correction_threshold=BAND)
    m = interop.export(records, 'verl', tmp_path / 'c', pad_id=tok.pad_token_id, correction=corr)
    interop.export(records, 'verl', tmp_path / 'p', pad_id=tok.pad_token_id)
    dp = DataProto.load_from_disk(str(tmp_path / 'c' / 'gen_batch.dp'))          # verl's skip.rollout loader
    plain = DataProto.load_from_disk(str(tmp_path / 'p' / 'gen_batch.dp'))
    dp.check_consistency()
    mask = plain.batch['response_mask']
    verl_old = _verl_old_log_probs(trainer[1], plain)
    ours_old = dp.batch['agentrl_old_log_probs']
    dev = float(((verl_old - ours_old) * mask).abs().max())
    print(f'{mode}: agentrl_old_log_probs vs verl\'s log-prob path: max |diff| {dev:.2e}')
    assert dev <= 1e-5
    plain.batch['old_log_probs'] = ours_old.clone()
    got, _ = rc.compute_rollout_correction_and_add_to_batch(plain, VERL[mode])    # verl's own function
    if 'rollout_is' in VERL[mode]:
        assert float((dp.batch['rollout_is_weights'] - got.batch['rollout_is_weights']).abs().max()) <= 1e-6
        kept = (got.batch['rollout_is_weights'] != 0).long() * got.batch['response_mask']
    else:
        kept = got.batch['response_mask']
        assert torch.equal(dp.batch['rollout_is_weights'], kept.float())            # weight 1 on every kept token
    assert torch.equal(dp.batch['response_mask'], kept)
    n_act, n_kept = int(mask.sum()), int(kept.sum())
    assert m['correction']['masked_tokens'] == n_act - n_kept
    if mode in ('icepop', 'token_mask', 'geo_mask'):
        assert 0 < n_kept < n_act, f'{mode}: the band {BAND} keeps {n_kept} of {n_act}: the test would not test it'
    w = dp.batch['rollout_is_weights'][kept.bool()]
    assert m['correction']['weights'] == pytest.approx({'mean': float(w.mean()), 'min': float(w.min()),
                                                        'max': float(w.max())}, abs=1e-6)


def test_openrlhf_experience_and_policy_loss_read_the_export(records, lm, trainer, tmp_path):
    pytest.importorskip('openrlhf.trainer.ppo_utils.experience')
    from openrlhf.trainer.ppo_utils.experience import Experience
    from .test_correction import _openrlhf_coef, _openrlhf_loss
    corr = interop.load_correction(trainer[0], 'icepop', is_correction_threshold=BAND)
    interop.export(records, 'openrlhf', tmp_path / 'c', correction=corr)
    interop.export(records, 'openrlhf', tmp_path / 'p')
    d = interop.load_export(tmp_path / 'c', 'openrlhf')
    plain = interop.load_export(tmp_path / 'p', 'openrlhf')
    exp = Experience(**{k: v for k, v in d.items() if not k.startswith('agentrl_')})
    mask = plain['action_mask'].float()
    coef = _openrlhf_coef(_openrlhf_loss(), exp.action_log_probs.float(), exp.rollout_log_probs.float(), mask,
                          'token', 'mask', BAND)
    assert float((coef * mask - d['agentrl_is_weights']).abs().max()) <= 1e-6
    assert torch.equal(exp.action_mask.long(), ((coef * mask) != 0).long())
    assert 0 < int(exp.action_mask.sum()) < int(mask.sum())


def test_trl_compute_loss_reads_the_ratio_and_the_mask(records, lm, trainer, tmp_path, monkeypatch):
    """TRL's own ``_compute_loss`` on the exported ``trl_batch.pt``, with its vLLM IS correction switched on: at step 0
    (``old_per_token_logps`` equal to TRL's recomputation) the GRPO loss with advantage 1 per row is
    ``-mean_b(sum_t w * m / sum_t m)``, ``m = completion_mask * tool_mask``: TRL reads both exported fields."""
    pytest.importorskip('trl')
    datasets = pytest.importorskip('datasets')
    from trl import GRPOConfig, GRPOTrainer
    monkeypatch.setenv('TRL_EXPERIMENTAL_SILENCE', '1')
    tok = lm[2]
    corr = interop.load_correction(trainer[0], 'icepop', is_correction_threshold=BAND)
    interop.export(records, 'trl', tmp_path / 'c', pad_id=tok.pad_token_id, correction=corr)
    d = interop.load_export(tmp_path / 'c', 'trl')
    cfg = GRPOConfig(output_dir=str(tmp_path / 'grpo'), per_device_train_batch_size=4, num_generations=2, max_steps=1,
                     beta=0.0, temperature=1.0, use_cpu=True, report_to=[], save_strategy='no', bf16=False,
                     loss_type='grpo', dataloader_num_workers=0)
    t = GRPOTrainer(model=str(trainer[0]), processing_class=tok, reward_funcs=[interop.trl_reward], args=cfg,
                    train_dataset=datasets.Dataset.from_dict({'prompt': ['fix the bug'] * 4}),
                    rollout_func=interop.trl_rollout_func(records))
    t.use_vllm = t.vllm_importance_sampling_correction = True          # the branch that multiplies by the ratio
    keys = ('prompt_ids', 'prompt_mask', 'completion_ids', 'completion_mask', 'tool_mask', 'old_per_token_logps',
            'sampling_per_token_logps', 'importance_sampling_ratio')
    inputs = {k: d[k] for k in keys}
    inputs['advantages'] = torch.ones(len(records))
    t.model.eval()
    with torch.no_grad():
        loss = float(t._compute_loss(t.model, inputs))
        ones = float(t._compute_loss(t.model, {**inputs, 'importance_sampling_ratio': torch.ones_like(
            d['importance_sampling_ratio'])}))
    m = (d['completion_mask'] * d['tool_mask']).float()
    want = -float(((d['importance_sampling_ratio'] * m).sum(-1) / m.sum(-1).clamp(min=1)).mean())
    print(f'TRL _compute_loss on the exported batch: {loss:.6f}, expected {want:.6f}, with ratio 1: {ones:.6f}')
    assert loss == pytest.approx(want, abs=1e-5)
    assert ones == pytest.approx(-float((m.sum(-1) > 0).float().mean()), abs=1e-5) and abs(loss - ones) > 1e-3
