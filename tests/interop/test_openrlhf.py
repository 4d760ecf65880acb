"""OpenRLHF 0.11.2 on agentrl records: its Experience, the replay buffer's split/unpad/re-batch, the actor's slice.

Only ``openrlhf.trainer.ppo_utils.experience`` imports on a CPU machine (the models need flash_attn), so the
actor's two slicing lines (``log_probs[:, :-1]``, then the last ``action_mask.shape[1]`` columns) are applied
here to the test model's log-probs, as ``openrlhf/models/actor.py`` does.
"""
import pytest
import torch

pytest.importorskip('openrlhf.trainer.ppo_utils.experience', reason='OpenRLHF is not in this venv; `make test-interop` runs these tests in .venv-interop')

from agentrl import interop  # noqa: E402
from agentrl.record import OWNER  # noqa: E402


def test_experience_replay_buffer_path_and_step0_ratio(records, lm):
    from openrlhf.trainer.ppo_utils.experience import (Experience, make_experience_batch,
                                                         remove_padding_in_sequences, split_experience_batch)
    _, model, tok = lm
    d = interop.to_openrlhf(records, pad_id=0)
    fields = {k: v for k, v in d.items() if not k.startswith('agentrl_')}
    exp = Experience(**fields)
    items = remove_padding_in_sequences(split_experience_batch(exp))      # NaiveReplayBuffer.append
    for it, r in zip(items, records):
        assert torch.equal(it.sequences, r.ids) and torch.equal(it.action_mask, r.action_mask.long())
        assert torch.equal(it.rollout_log_probs, r.sample_logp)
    batch = make_experience_batch(items)                                   # NaiveReplayBuffer.collate_fn
    back = interop.from_openrlhf({**{k: getattr(batch, k) for k in ('sequences', 'attention_mask', 'action_mask',
                                                                     'rollout_log_probs', 'rewards')},
                                  'agentrl_provenance': d['agentrl_provenance'], 'agentrl_info': d['agentrl_info']})
    for a, b in zip(records, back):
        assert torch.equal(a.ids, b.ids) and torch.equal(a.action_mask, b.action_mask)
        assert torch.equal(a.sample_logp.view(torch.int32), b.sample_logp.view(torch.int32))
        assert torch.equal(a.owner == OWNER['policy'], b.owner == OWNER['policy'])
    with torch.no_grad():
        logits = model(input_ids=batch.sequences, attention_mask=batch.attention_mask).logits.float()
    log_probs = torch.log_softmax(logits, -1)[:, :-1].gather(-1, batch.sequences[:, 1:, None])[..., 0]
    action_log_probs = log_probs[:, -batch.action_mask.shape[1]:] * batch.action_mask.float()
    mask = batch.action_mask.bool()
    dev = float((torch.exp(action_log_probs - batch.rollout_log_probs)[mask] - 1).abs().max())
    print(f'OpenRLHF step-0 ratio over {int(mask.sum())} action tokens: max |ratio - 1| = {dev:.2e}')
    assert dev < 1e-5
