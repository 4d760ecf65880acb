"""verl 0.9.1 on agentrl records: DataProto checks, its unpad/log-prob/policy-loss path gives step-0 ratio 1."""
import pytest
import torch

pytest.importorskip('verl.protocol', reason='verl is not in this venv; `make test-interop` runs these tests in .venv-interop')
pytest.importorskip('verl.workers.utils.padding')

from agentrl import interop  # noqa: E402
from agentrl.record import OWNER  # noqa: E402


def test_dataproto_passes_verls_checks_and_round_trips(records, lm):
    from verl.protocol import DataProto
    tok = lm[2]
    dp = interop.to_verl_dataproto(records, pad_id=tok.pad_token_id, trim=False)
    assert isinstance(dp, DataProto)
    dp.check_consistency()
    assert len(dp) == len(records)
    assert dp.non_tensor_batch['uid'].tolist() == ['g0', 'g0', 'g1', 'g1']
    back = interop.from_verl(dp)
    for a, b in zip(records, back):
        assert torch.equal(a.ids, b.ids) and torch.equal(a.action_mask, b.action_mask)
        assert torch.equal(a.sample_logp.view(torch.int32), b.sample_logp.view(torch.int32))
        assert torch.equal(a.owner == OWNER['policy'], b.owner == OWNER['policy'])


def test_verl_logprob_and_policy_loss_step0_ratio(records, lm):
    from omegaconf import OmegaConf
    from verl.trainer.ppo.core_algos import compute_grpo_outcome_advantage, get_policy_loss_fn
    from verl.utils.torch_functional import logprobs_from_logits
    from verl.workers.utils.padding import left_right_2_no_padding, no_padding_2_padding
    _, model, tok = lm
    dp = interop.to_verl_dataproto(records, pad_id=tok.pad_token_id)
    td = dp.batch.clone()
    n_actions = sum(int(r.action_mask.sum()) for r in records)
    assert int(td['response_mask'].sum()) == n_actions
    packed = left_right_2_no_padding(td)                # verl's engine input: no padding, nested
    ids = packed['input_ids']
    offsets = ids.offsets().tolist()
    values = ids.values()
    temperature = dp.meta_info['temperature']
    per_token = []
    with torch.no_grad():
        for s, e in zip(offsets[:-1], offsets[1:]):
            seq = values[s:e]
            logits = model(input_ids=seq[None]).logits[0].float() / temperature
            per_token.append(logprobs_from_logits(logits, torch.roll(seq, -1)))   # verl's label roll
    log_prob = no_padding_2_padding(torch.cat(per_token), packed)             # [B, Lr], own index
    old = td['rollout_log_probs']
    mask = td['response_mask'].bool()
    ratio = torch.exp(log_prob - old)[mask]
    dev = float((ratio - 1).abs().max())
    print(f'verl step-0 ratio over {int(mask.sum())} action tokens: max |ratio - 1| = {dev:.2e}')
    assert dev < 1e-5
    adv, _ = compute_grpo_outcome_advantage(td['rm_scores'], td['response_mask'], dp.non_tensor_batch['uid'])
    cfg = OmegaConf.create({'clip_ratio': 0.2, 'clip_ratio_low': 0.2, 'clip_ratio_high': 0.2, 'clip_ratio_c': 3.0,
                            'global_batch_info': {}})
    loss, metrics = get_policy_loss_fn('vanilla')(old, log_prob, adv, td['response_mask'], 'token-mean', cfg)
    assert abs(metrics['actor/ppo_kl']) < 1e-5 and metrics['actor/pg_clipfrac'] == 0.0
    want = -(adv * td['response_mask']).sum() / td['response_mask'].sum()
    assert float(loss) == pytest.approx(float(want), abs=1e-5)


def test_export_writes_the_skip_rollout_cache_file(records, lm, tmp_path):
    from verl.protocol import DataProto
    m = interop.export(records, 'verl', tmp_path, pad_id=lm[2].pad_token_id, trim=False)
    assert m['files'] == ['verl_batch.pt', 'gen_batch.dp']
    dp = DataProto.load_from_disk(str(tmp_path / 'gen_batch.dp'))         # what verl's skip.rollout loads
    dp.check_consistency()
    with pytest.raises(ValueError, match=r"is a pickle \(verl's DataProto.save_to_disk\): unpickling runs any code "
                                         r'the file holds, so it is not read; pass trust_pickle=True'):
        interop.import_records(tmp_path / 'gen_batch.dp', 'verl')           # the library refuses it too
    for a, b in zip(records, interop.import_records(tmp_path / 'gen_batch.dp', 'verl', trust_pickle=True)):
        assert torch.equal(a.ids, b.ids) and torch.equal(a.action_mask, b.action_mask)
        assert torch.equal(a.sample_logp.view(torch.int32), b.sample_logp.view(torch.int32))
