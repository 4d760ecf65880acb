"""L4: agentrl records -> SkyRL ``GeneratorOutput`` (and back).

SkyRL (``skyrl/train/generators/base.py``): lists over rows: ``prompt_token_ids = ids[:P]``,
``response_ids = ids[P:E]`` (the trailing observation trimmed, so the scalar reward SkyRL places
at ``response[-1]`` lands on a policy token), ``loss_masks = action_mask[P-1:E-1]``,
``rollout_logprobs = sample_logp[P-1:E-1]`` (own index over the response), ``rewards`` (float per
row), ``stop_reasons`` (``'length'`` when truncated, else ``'stop'``), ``trajectory_ids``
(``{'instance_id': group, 'repetition_id': k}``). SkyRL groups by ``trajectory_ids``, so group
order is free. A custom ``GeneratorInterface.generate`` returns this dict.
"""
from __future__ import annotations

import json

from ..record import Provenance, SamplingSpec, StopReason, Trajectory
from .common import as_list, check_mask, check_reward, check_same, group_key, prepare_export, provenance_for_import, \
    record_from_response, ResponseColumns, split
from .owners import finish_import
__all__ = ['to_skyrl', 'from_skyrl']

#: SkyRL's names of the parts of a generator output.
_COLUMNS = ResponseColumns('from_skyrl', prompt='prompt_token_ids', mask='loss_masks', logp='rollout_logprobs')


def to_skyrl(records, *, trim: bool = True, allow_support_mismatch: bool = False) -> dict:
    """Export records as a SkyRL ``GeneratorOutput`` dict (see the module docstring).

    Raises:
        agentrl.checks.errors.RecordError: refused records, SupportMismatchError.
    """
    records, _ = prepare_export(records, 'to_skyrl', 'SkyRL', allow_support_mismatch=allow_support_mismatch)
    out = {k: [] for k in ('prompt_token_ids', 'response_ids', 'rewards', 'loss_masks', 'stop_reasons',
                           'rollout_logprobs', 'trajectory_ids', 'agentrl_provenance', 'agentrl_info')}
    reps: dict = {}
    for i, rec in enumerate(records):
        s = split(rec, i)
        end = s.end(trim)
        g = group_key(rec, i)
        reps[g] = reps.get(g, -1) + 1
        out['prompt_token_ids'].append(rec.ids[:s.P].tolist())
        out['response_ids'].append(rec.ids[s.P:end].tolist())
        out['rewards'].append(float(rec.reward))
        out['loss_masks'].append(rec.action_mask[s.P - 1:end - 1].long().tolist())
        out['stop_reasons'].append('length' if (rec.info or {}).get('stop') == StopReason.TRUNCATED else 'stop')
        out['rollout_logprobs'].append(rec.sample_logp[s.P - 1:end - 1].tolist())
        out['trajectory_ids'].append({'instance_id': g, 'repetition_id': reps[g]})
        out['agentrl_provenance'].append(None if rec.provenance is None else rec.provenance.to_json())
        out['agentrl_info'].append(json.dumps(rec.info, sort_keys=True, default=str))
    return out


def from_skyrl(data, *, spec: SamplingSpec | None = None, tokenizer=None, model: str = '') -> list[Trajectory]:
    """Import a SkyRL ``GeneratorOutput`` as records.

    A mask-1 token whose log-prob is exactly 0.0 right at the end of a response is the EOS that
    SkyRL's single-message path appends itself (loss 1, log-prob 0.0): it is imported as a
    non-policy token, since the policy did not sample it.

    Raises:
        agentrl.checks.errors.MaskAlignmentError / LogProbLengthError / LengthMismatchError: per-row
            lengths disagree, or the lists have different numbers of rows.
        agentrl.checks.errors.TokenIdError, MaskValueError: non-integer ids, mask entries outside {0, 1}.
        agentrl.checks.errors.TokenizerMismatchError: ``tokenizer`` is not the records' own
            (:func:`agentrl.interop.owners.finish_import`, which also rebuilds template ownership).
    """
    out = []
    n = len(data['response_ids'])
    for k in ('prompt_token_ids', 'loss_masks', 'rewards', 'stop_reasons', 'rollout_logprobs', 'trajectory_ids',
              'agentrl_provenance', 'agentrl_info'):
        if data.get(k) is not None and len(data[k]) != n:
            check_same(k, (len(data[k]),), (n,), 'from_skyrl', 'response_ids (rows)')
    provs = data.get('agentrl_provenance') or [None] * n
    infos = data.get('agentrl_info') or [None] * n
    lps = data.get('rollout_logprobs')
    for b in range(n):
        mask = as_list(data['loss_masks'][b])
        if len(mask) == len(data['response_ids'][b]):
            mask = check_mask(mask, 'loss_masks', f'from_skyrl row {b}')
        lp = None if lps is None else list(lps[b])
        if provs[b]:
            prov = Provenance.from_dict(json.loads(provs[b]))
        else:
            tid = (data.get('trajectory_ids') or [None] * n)[b]
            gid = tid.get('instance_id', '') if isinstance(tid, dict) else getattr(tid, 'instance_id', '')
            prov = provenance_for_import('skyrl', spec=spec, group_id=gid or '', rollout_id=str(b),
                                         tokenizer=tokenizer, model=model, placeholder=lp is None)
            if lp is not None and mask and mask[-1] == 1 and lp[-1] == 0.0 and len(lp) == len(mask):
                mask[-1] = 0          # the EOS SkyRL appended: not sampled
        info = json.loads(infos[b]) if infos[b] else {
            'source': 'skyrl', 'stop': StopReason.TRUNCATED if data['stop_reasons'][b] == 'length' else data['stop_reasons'][b]}
        reward = check_reward(data['rewards'][b], 'rewards', f'from_skyrl row {b}')
        out.append(record_from_response(data['prompt_token_ids'][b], data['response_ids'][b], mask, lp,
                                        reward=reward, info=info,
                                        provenance=prov, row=b, columns=_COLUMNS))
    return finish_import(out, tokenizer, 'from_skyrl')
