"""L0 record: the one shift, shape checks, Batch mapping, provenance round trip."""
import pytest
import torch

from agentrl.record import OWNER, Batch, Provenance, SamplingSpec, Trajectory


def test_from_tokens_shifts_once():
    # the lesson's fixture: prompt, prompt, policy, policy, policy -> mask over ids[1:] = [0,1,1,1]
    t = Trajectory.from_tokens([11, 12, 21, 22, 99], ['prompt', 'prompt', 'policy', 'policy', 'policy'],
                               [-1, -1, 0, 0, 0], [0.0, 0.0, -0.5, -0.25, -0.125], 1.0, {'stop': 'x'})
    assert t.action_mask.tolist() == [0.0, 1.0, 1.0, 1.0]
    assert t.sample_logp.tolist() == [0.0, -0.5, -0.25, -0.125]
    assert t.turn_ids.tolist() == [-1, 0, 0, 0]
    assert t.ids.dtype == torch.int64 and t.action_mask.dtype == torch.float32
    assert t.owner.tolist() == [1, 1, 2, 2, 2]


def test_from_tokens_errors():
    with pytest.raises(ValueError, match=r"disagree in length \{'ids': 2, 'owner': 1"):
        Trajectory.from_tokens([1, 2], ['prompt'], [-1, -1], [0.0, 0.0], 0.0, {})
    with pytest.raises(ValueError, match='ids is empty'):
        Trajectory.from_tokens([], [], [], [], 0.0, {})
    with pytest.raises(ValueError, match='owner\\[0\\] is policy'):
        Trajectory.from_tokens([1, 2], ['policy', 'policy'], [0, 0], [0.0, 0.0], 0.0, {})


def test_check_shapes_names_field():
    t = Trajectory.from_tokens([1, 2, 3], [0, 1, 2], [-1, -1, 0], [0, 0, -1.0], 0.0, {})
    t.sample_logp = torch.zeros(3)
    with pytest.raises(ValueError, match=r'Trajectory.sample_logp has length 3 but ids has length 3: '
                                         r'sample_logp must be aligned to ids\[1:\] \(length 2\)'):
        t.check_shapes()


def test_batch_is_a_mapping():
    z = torch.zeros(2, 3)
    b = Batch(ids=z.long(), attention_mask=z, action_mask=z[:, 1:], sample_logp=z[:, 1:],
              turn_ids=z[:, 1:].long(), rewards=torch.zeros(2))
    assert b.keys() == ['ids', 'attention_mask', 'action_mask', 'sample_logp', 'turn_ids', 'rewards']
    assert b['ids'] is b.ids and dict(b.items())['rewards'] is b.rewards
    with pytest.raises(KeyError, match="'logp' is not a Batch field"):
        b['logp']


def test_provenance_round_trip_and_spec_errors():
    p = Provenance(policy='model', sampling=SamplingSpec(temperature=0.7, top_p=0.9), attempt=2)
    q = Provenance.from_dict(p.to_dict())
    assert q == p and q.sampling.top_p == 0.9
    with pytest.raises(ValueError, match='SamplingSpec.top_p must be in'):
        SamplingSpec(top_p=0.0)
    with pytest.raises(ValueError, match="logp_mode must be one of"):
        SamplingSpec(logp_mode='cooked')
    assert OWNER == {'template': 0, 'prompt': 1, 'policy': 2, 'tool': 3}
