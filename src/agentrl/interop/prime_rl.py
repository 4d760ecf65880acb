"""L4: agentrl records -> prime-rl ``TrainingSample`` dicts (and back).

prime-rl (``src/prime_rl/transports/rollouts/types.py``): "There is no prompt/completion split";
``token_ids = ids``, ``mask = [False] + (action_mask == 1)`` (own index, full length),
``logprobs = [0.0] + sample_logp``, ``temperatures = [temperature] * T``, ``advantages`` = the
GRPO advantage ``reward - mean(group rewards)`` on the policy tokens, 0 elsewhere; ``env_name``.
prime-rl groups episodes per task, so group order is free.
"""
from __future__ import annotations

import json

from ..record import OWNER, Provenance, SamplingSpec, Trajectory
from .common import (check_ids, check_len, check_mask, check_reward, group_key, prepare_export,
                     provenance_for_import, split)
from .owners import finish_import
__all__ = ['to_prime_rl', 'from_prime_rl']


def to_prime_rl(records, *, env_name: str = 'agentrl', allow_support_mismatch: bool = False) -> list[dict]:
    """Export records as prime-rl ``TrainingSample`` dicts (full-length, own index).

    Raises:
        agentrl.checks.errors.RecordError: refused records, SupportMismatchError.
    """
    records, temperature = prepare_export(records, 'to_prime_rl', 'prime-rl',
                                          allow_support_mismatch=allow_support_mismatch)
    groups: dict = {}
    for i, r in enumerate(records):
        split(r, i)
        groups.setdefault(group_key(r, i), []).append(float(r.reward))
    out = []
    for i, r in enumerate(records):
        rs = groups[group_key(r, i)]
        adv = float(r.reward) - sum(rs) / len(rs)
        mask = [False] + [bool(x) for x in r.action_mask.tolist()]
        out.append({'token_ids': r.ids.tolist(), 'mask': mask, 'logprobs': [0.0] + r.sample_logp.tolist(),
                    'temperatures': [1.0 if temperature is None else float(temperature)] * len(r.ids),
                    'advantages': [adv if m else 0.0 for m in mask], 'env_name': env_name,
                    'reward': float(r.reward),
                    'agentrl_provenance': None if r.provenance is None else r.provenance.to_json(),
                    'agentrl_info': json.dumps(r.info, sort_keys=True, default=str)})
    return out


def from_prime_rl(samples, *, spec: SamplingSpec | None = None, tokenizer=None, model: str = '') -> list[Trajectory]:
    """Import prime-rl ``TrainingSample`` dicts: ``mask`` True -> policy, else prompt before the
    first policy token and tool after it; ``logprobs`` at own index.

    Raises:
        agentrl.checks.errors.MaskAlignmentError: ``mask`` of length ``T-1``.
        agentrl.checks.errors.LogProbLengthError: ``logprobs`` not of length ``T``.
        agentrl.checks.errors.TokenIdError, MaskValueError: non-integer ids, mask entries outside {0, 1}.
        agentrl.checks.errors.TokenizerMismatchError: ``tokenizer`` is not the records' own
            (:func:`agentrl.interop.owners.finish_import`, which also rebuilds template ownership).
    """
    out = []
    for b, s in enumerate(samples):
        where = f'from_prime_rl row {b}'
        ids = check_ids(s['token_ids'], 'token_ids', where)
        check_len('mask', len(s['mask']), len(ids), b, 'from_prime_rl')
        check_len('logprobs', len(s['logprobs']), len(ids), b, 'from_prime_rl')
        mask = check_mask(s['mask'], 'mask', where)
        owner, turn, seen, k = [], [], False, -1
        for j, m in enumerate(mask):
            if m and (j == 0 or not mask[j - 1]):
                k += 1
            seen = seen or bool(m)
            owner.append(OWNER['policy'] if m else (OWNER['tool'] if seen else OWNER['prompt']))
            turn.append(k)
        if s.get('agentrl_provenance'):
            prov = Provenance.from_dict(json.loads(s['agentrl_provenance']))
        else:
            t = (s.get('temperatures') or [None])[0]
            prov = provenance_for_import('prime-rl', spec=spec or (SamplingSpec(temperature=t) if t else None),
                                         rollout_id=str(b), tokenizer=tokenizer, model=model)
        info = json.loads(s['agentrl_info']) if s.get('agentrl_info') else {'source': 'prime-rl', 'row': b}
        reward = check_reward(s.get('reward', 0.0), 'reward', f'from_prime_rl row {b}')
        out.append(Trajectory.from_tokens(ids, owner, turn, list(s['logprobs']), reward, info, provenance=prov))
    return finish_import(out, tokenizer, 'from_prime_rl')
