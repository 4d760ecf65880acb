"""L0 record: the one shift, shape checks, Batch mapping, provenance round trip."""
from collections.abc import Mapping
from dataclasses import FrozenInstanceError, replace

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
    assert isinstance(b, Mapping) and len(b) == 6 and 'rewards' in b and 'logp' not in b
    assert b.get('logp') is None and list(b) == b.keys() and dict(b)['turn_ids'] is b.turn_ids


def test_batch_is_frozen_after_construction():
    z = torch.zeros(2, 3)
    b = Batch(ids=z.long(), attention_mask=z, action_mask=z[:, 1:], sample_logp=z[:, 1:],
              turn_ids=z[:, 1:].long(), rewards=torch.zeros(2))
    with pytest.raises(FrozenInstanceError, match="cannot assign to field 'rewards'"):
        b.rewards = torch.ones(2)
    with pytest.raises(FrozenInstanceError, match="cannot delete field 'ids'"):
        del b.ids
    with pytest.raises(TypeError, match="'Batch' object does not support item assignment"):
        b['rewards'] = torch.ones(2)
    with pytest.raises(FrozenInstanceError, match="cannot assign to field 'extra'"):
        b.extra = 1
    c = replace(b, rewards=torch.ones(2))          # a new batch; the old one is unchanged
    assert c.rewards.tolist() == [1.0, 1.0] and b.rewards.tolist() == [0.0, 0.0] and c.ids is b.ids


def test_trajectory_owner_and_turn_are_required():
    with pytest.raises(TypeError, match="missing 2 required positional arguments: 'owner' and 'turn'"):
        Trajectory(torch.tensor([1, 2]), torch.ones(1), torch.zeros(1), 0.0, {})
    t = Trajectory(torch.tensor([1, 2]), torch.ones(1), torch.zeros(1), 0.0, {}, torch.tensor([1, 2]),
                   torch.tensor([-1, 0]))
    assert t.owner.tolist() == [1, 2] and t.turn_ids.tolist() == [0]


def test_provenance_round_trip_and_spec_errors():
    p = Provenance(policy='model', sampling=SamplingSpec(temperature=0.7, top_p=0.9), attempt=2)
    q = Provenance.from_dict(p.to_dict())
    assert q == p and q.sampling.top_p == 0.9
    with pytest.raises(ValueError, match='SamplingSpec.top_p must be in'):
        SamplingSpec(top_p=0.0)
    with pytest.raises(ValueError, match="logp_mode must be one of"):
        SamplingSpec(logp_mode='cooked')
    assert OWNER == {'template': 0, 'prompt': 1, 'policy': 2, 'tool': 3}


# ---------------------------------------------------------------------------- the one token writer
def test_token_log_appends_spans_and_freezes_through_from_tokens():
    from agentrl.record import OWNER, TokenLog
    log = TokenLog()
    log.append([1, 7], 'prompt', -1)
    log.append([9, 4], 'policy', 0, [-0.5, -0.25])
    log.append([5, 6, 8], [OWNER['template'], OWNER['tool'], 'template'], 0)
    assert (log.ids, log.owner, log.turn) == ([1, 7, 9, 4, 5, 6, 8], [1, 1, 2, 2, 0, 3, 0], [-1, -1, 0, 0, 0, 0, 0])
    assert log.logp == [0.0, 0.0, -0.5, -0.25, 0.0, 0.0, 0.0] and len(log) == 7
    traj = log.freeze(1.0, {'stop': 'submitted'})
    assert traj.action_mask.tolist() == [0, 1, 1, 0, 0, 0] and traj.sample_logp.tolist() == [0, -0.5, -0.25, 0, 0, 0]
    log.truncate(4)
    assert log.ids == [1, 7, 9, 4] and log.logp == [0.0, 0.0, -0.5, -0.25] and len(log.turn) == 4


def test_token_log_refuses_spans_that_disagree():
    import pytest
    from agentrl.record import TokenLog
    log = TokenLog()
    with pytest.raises(ValueError, match='TokenLog.append: 1 log-probs for 2 ids; pass one per id'):
        log.append([1, 2], 'policy', 0, [-0.1])
    with pytest.raises(ValueError, match='TokenLog.append: 1 owners for 2 ids'):
        log.append([1, 2], [0], 0)
    with pytest.raises(ValueError, match="TokenLog.append: owner 'robot' is not one of"):
        log.append([1], 'robot', 0)
    with pytest.raises(ValueError, match=r'TokenLog.truncate: n=3 outside \[0, 0\]'):
        log.truncate(3)
    assert len(log) == 0                                    # nothing half-written


def test_owner_runs_turn_spans_and_turn_records():
    import agentrl as arl
    from agentrl.record import OWNER, TokenLog, owner_runs, turn_records, turn_spans
    assert owner_runs([1, 2, 2, 0, 2], [-1, 0, 0, 0, 1], OWNER['policy']) == [(0, 1, 3), (1, 4, 5)]
    log = TokenLog()
    log.append([1, 7], 'prompt', -1)
    log.append([9, 4], 'policy', 0, [-0.5, -0.25])
    log.append([5], 'tool', 0)
    log.append([3], 'policy', 1, [-1.0])
    traj = log.freeze(0.0, {})
    assert turn_spans(traj) == [(0, 2, 4), (1, 5, 6)] and arl.turn_records is turn_records
    per = turn_records(traj)
    assert [r.ids.tolist() for r in per] == [[1, 7, 9, 4], [1, 7, 9, 4, 5, 3]]
    assert per[1].action_mask.tolist() == [0, 0, 0, 0, 1] and per[1].sample_logp.tolist()[-1] == -1.0
