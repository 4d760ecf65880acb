"""The gate: acceptance rules, `agentrl check` refusals, row validation on read, checkpoint bounds,
the sandbox's hard deadline, terminal escaping."""
import importlib
import math

import pytest
import torch

from agentrl import checks
from agentrl.record import Provenance, SamplingSpec, Trajectory


def sampled_record(ids=(11, 12, 21, 22, 6), reward=1.0):
    return Trajectory.from_tokens(list(ids), ['prompt', 'prompt', 'policy', 'policy', 'policy'],
                                  [-1, -1, 0, 0, 0], [0.0, 0.0, -0.5, -0.25, -0.125], reward, {},
                                  provenance=Provenance(policy='model', tokenizer='tokA', template='tplA',
                                                        sampling=SamplingSpec()))


# ------------------------------------------------------------------------------ acceptance rules

def test_acceptance_module_is_not_shadowed():
    mod = importlib.import_module('agentrl.checks.acceptance')
    assert mod.__name__ == 'agentrl.checks.acceptance'
    assert checks.validate is mod.validate and checks.find_problems is mod.find_problems
    import agentrl as arl
    assert arl.validate is mod.validate and arl.find_problems is mod.find_problems
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module('agentrl.checks.validate')
    names = [r.name for r in checks.RULES]
    assert names[:3] == ['fields_present', 'lengths_agree', 'owner_codes_known']
    assert len(set(names)) == len(names) and all(callable(r.check) for r in checks.RULES)
    assert {r.stage for r in checks.RULES} == {'shape', 'position', 'record'}


def test_ids_outside_vocabulary_refused():
    t = sampled_record()
    t.ids[0] = -7
    with pytest.raises(checks.TokenIdError, match=r'^ids\[0\]: is -7, not a token id \(ids are >= 0\)'):
        checks.validate(t)
    t = sampled_record()
    t.ids[3] = 10**6
    checks.validate(t)                                    # vocabulary unknown: any id >= 0
    with pytest.raises(checks.TokenIdError, match=r'^ids\[3\]: is 1000000, not a token id \(ids are in \[0, 316\)'):
        checks.validate(t, checks.Expected(vocab_size=316))
    assert [p.kind for p in checks.find_problems(t, {'vocab_size': 316})] == ['TokenIdError']


@pytest.mark.parametrize('reward', [float('nan'), float('inf'), None, 'x'])
def test_non_finite_reward_refused(reward):
    t = sampled_record()
    t.reward = reward
    with pytest.raises(checks.NonFiniteRewardError, match=r'^reward: is .*not a finite number'):
        checks.validate(t)
    assert checks.validate(sampled_record(reward=0.0)) is None
    assert math.isfinite(sampled_record().reward)


def test_rules_run_in_order_and_can_be_selected():
    t = sampled_record()
    t.reward = float('nan')
    t.action_mask[0] = 1.0
    assert [p.kind for p in checks.find_problems(t)] == ['MaskOnNonPolicyError', 'NonFiniteRewardError']
    only = tuple(r for r in checks.RULES if r.name == 'reward_finite')
    assert [p.kind for p in checks.find_problems(t, rules=only)] == ['NonFiniteRewardError']
