"""TRL 1.16 on agentrl records: its own per-token log-prob code, one real GRPOTrainer step, the SFT collator."""
import pytest
import torch

trl = pytest.importorskip('trl', reason='TRL is not in this venv; `make test-interop` runs these tests in .venv-interop')
datasets = pytest.importorskip('datasets')

from agentrl import interop  # noqa: E402
from agentrl.checks import errors as E  # noqa: E402
from agentrl.record import OWNER  # noqa: E402


@pytest.fixture(scope='module')
def trainer(lm, records, tmp_path_factory):
    from trl import GRPOConfig, GRPOTrainer
    monkeypatch_env = pytest.MonkeyPatch()
    monkeypatch_env.setenv('TRL_EXPERIMENTAL_SILENCE', '1')       # rollout_func is experimental in TRL 1.16
    path, model, tok = lm
    cfg = GRPOConfig(output_dir=str(tmp_path_factory.mktemp('grpo')), per_device_train_batch_size=4, num_generations=2,
                     max_steps=1, learning_rate=1e-3, beta=0.0, temperature=1.0, use_cpu=True, report_to=[],
                     logging_steps=1, save_strategy='no', bf16=False, dataloader_num_workers=0,
                     mask_truncated_completions=False)
    ds = datasets.Dataset.from_dict({'prompt': ['fix the bug'] * 4})
    return GRPOTrainer(model=str(path), processing_class=tok, reward_funcs=[interop.trl_reward], args=cfg,
                       train_dataset=ds, rollout_func=interop.trl_rollout_func(records))


def test_trl_logps_reproduce_sampling_logps(trainer, records, lm):
    tok = lm[2]
    d = interop.to_trl(records, pad_id=tok.pad_token_id)
    ids = torch.cat([d['prompt_ids'], d['completion_ids']], dim=1)
    attn = torch.cat([d['prompt_mask'], d['completion_mask']], dim=1)
    C = d['completion_ids'].shape[1]
    with torch.no_grad():
        logps, _, _ = trainer._get_per_token_logps_and_entropies(trainer.model, ids, attn, C)
    mask = (d['completion_mask'] * d['tool_mask']).bool()
    assert int(mask.sum()) == sum(int(r.action_mask.sum()) for r in records)
    diff = (logps - d['sampling_per_token_logps'])[mask].abs()
    print(f'TRL per-token log-prob vs sampling_per_token_logps: {int(mask.sum())} tokens, max |diff| '
          f'{float(diff.max()):.2e}')
    assert float(diff.max()) < 1e-5


def test_one_grpo_step_through_the_rollout_hook(trainer, records):
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    out = trainer.train()
    assert out.global_step == 1
    moved = sum(not torch.equal(before[n], p) for n, p in trainer.model.named_parameters())
    assert moved > 0, 'the GRPO step changed no parameter'
    hist = trainer.state.log_history[0]
    assert hist['reward'] == pytest.approx(sum(r.reward for r in records) / len(records))


def _sft_batch(rows, lm, tmp_path):
    """TRL's own SFT path: SFTTrainer prepares the dataset (labels from assistant_masks), its collator pads."""
    from trl import SFTConfig, SFTTrainer
    path, _, tok = lm
    cfg = SFTConfig(output_dir=str(tmp_path), use_cpu=True, report_to=[], max_length=None, bf16=False,
                    per_device_train_batch_size=len(rows))
    t = SFTTrainer(model=str(path), processing_class=tok, args=cfg, train_dataset=datasets.Dataset.from_list(rows))
    return t.data_collator([t.train_dataset[i] for i in range(len(rows))])


def test_sft_collator_trains_exactly_the_action_tokens(records, lm, tmp_path):
    batch = _sft_batch(interop.to_sft(records, form='assistant_masks'), lm, tmp_path / 'a')
    trained = int((batch['labels'][:, 1:] != -100).sum())          # the loss shifts labels by one
    assert trained == sum(int(r.action_mask.sum()) for r in records)
    for b, r in enumerate(records):
        T = len(r.ids)
        got = batch['labels'][b, 1:T] != -100
        assert torch.equal(got, r.action_mask.bool()), 'labels land on the policy tokens, not one off'
        assert torch.equal(batch['labels'][b, 1:T][got], r.ids[1:][r.action_mask.bool()])
    labels = _sft_batch(interop.to_sft(records, form='labels'), lm, tmp_path / 'l')['labels']
    assert torch.equal(labels, batch['labels'])


def test_sft_trap_action_mask_as_assistant_masks_shifts_in_trl(records, lm, tmp_path):
    bad = [{'input_ids': r.ids.tolist(), 'assistant_masks': r.action_mask.long().tolist()} for r in records]
    with pytest.raises(E.MaskAlignmentError, match='aligned to ids\\[1:\\]'):
        interop.check_sft_row(bad[0])
    labels = _sft_batch(bad, lm, tmp_path)['labels']                # TRL accepts it silently ...
    r = records[0]
    T = len(r.ids)
    assert torch.equal(labels[0, :T - 1] != -100, r.action_mask.bool())   # ... one token early
    assert (labels[0, T - 1:] == -100).all()                       # and the last label is dropped


def test_round_trip_through_trl(records):
    back = interop.from_trl(interop.to_trl_rollout(records, trim=False))
    for a, b in zip(records, back):
        assert torch.equal(a.ids, b.ids) and torch.equal(a.action_mask, b.action_mask)
        assert torch.equal(a.sample_logp.view(torch.int32), b.sample_logp.view(torch.int32))
        assert torch.equal(a.owner == OWNER['policy'], b.owner == OWNER['policy'])
