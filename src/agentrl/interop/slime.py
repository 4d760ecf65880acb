"""L4: agentrl records <-> slime ``Sample`` dicts (``Sample.to_dict()``, the ``--load-debug-rollout-data`` file).

Per record (slime ``slime/utils/types.py`` ``Sample``): ``tokens = ids[:end]`` (prompt + response),
``response_length = end - P``, ``loss_mask = action_mask[P-1:end-1]`` and
``rollout_log_probs = sample_logp[P-1:end-1]`` (own index over ``tokens[-response_length:]``),
``reward``, ``status`` (``'truncated'`` when ``info['stop'] == 'truncated'``, else ``'completed'``),
``group_index`` (one int per group, in order of appearance), ``index`` (the row), ``rollout_id``.
``metadata`` carries the agentrl provenance and info. The file slime reads is
``torch.save({'samples': [Sample.to_dict(), ...]}, '{rollout_id}.pt')``.

slime normalises rewards over ``(-1, n_samples_per_prompt)`` rows, so a group's rows must be
contiguous (refused otherwise). slime replays the top-p keep set, so top-p alone is not a support
mismatch there; top-k and min-p are.
"""
from __future__ import annotations

import json
import numbers

from ..checks import errors as E
from ..record import Provenance, SamplingSpec, StopReason, Trajectory
from .common import (ResponseColumns, check_ids, check_reward, group_key, prepare_export, provenance_for_import,
                     record_from_response, split)
from .owners import finish_import

__all__ = ['to_slime', 'from_slime']

#: slime's names of the parts of a sample (one ``tokens`` list holds prompt and response).
_COLUMNS = ResponseColumns('from_slime', prompt='tokens', response='tokens', mask='loss_mask',
                           logp='rollout_log_probs')
#: slime's ``Sample.Status.TRUNCATED`` value (slime's word, not an agentrl stop reason).
_SLIME_TRUNCATED = 'truncated'


def to_slime(records, *, trim: bool = False, allow_support_mismatch: bool = False) -> list[dict]:
    """Export records as slime ``Sample.to_dict()`` dicts (``Sample.from_dict`` rebuilds them).

    Args:
        records: records, each group's rows contiguous.
        trim: drop the trailing observation (default False: slime keeps the whole sequence).
        allow_support_mismatch: warn instead of refusing top-k/min-p log-probs.

    Returns:
        list of dicts with the fields of the module docstring.

    Raises:
        agentrl.checks.errors.RecordError: refused records, SupportMismatchError, GroupOrderError.
    """
    records, _ = prepare_export(records, 'to_slime', 'slime', allow_support_mismatch=allow_support_mismatch,
                                replays_top_p=True, groups='slime (n_samples_per_prompt contiguous rows)')
    groups: dict = {}
    out = []
    for i, rec in enumerate(records):
        s = split(rec, i)
        end = s.end(trim)
        stop = (rec.info or {}).get('stop')
        prov = rec.provenance
        out.append({
            'group_index': groups.setdefault(group_key(rec, i), len(groups)),
            'index': i,
            'rollout_id': i,
            'prompt': '',
            'tokens': rec.ids[:end].tolist(),
            'response': '',
            'response_length': end - s.P,
            'label': None,
            'reward': float(rec.reward),
            'loss_mask': rec.action_mask[s.P - 1:end - 1].long().tolist(),
            'rollout_log_probs': rec.sample_logp[s.P - 1:end - 1].tolist(),
            'status': _SLIME_TRUNCATED if stop == StopReason.TRUNCATED else 'completed',
            'metadata': {'agentrl_provenance': None if prov is None else prov.to_json(),
                         'agentrl_info': json.dumps(rec.info, sort_keys=True, default=str)},
        })
    return out


def from_slime(samples, *, spec: SamplingSpec | None = None, tokenizer=None, model: str = '') -> list[Trajectory]:
    """Import slime samples (``Sample`` objects or their ``to_dict()``) as records.

    The prompt is ``tokens[:len - response_length]``; ``loss_mask`` 1 -> policy, 0 -> tool;
    log-probs ``[0]*P ++ rollout_log_probs``; ``status`` -> ``info['stop']``.

    Raises:
        agentrl.checks.errors.MaskAlignmentError / LogProbLengthError: ``loss_mask`` or
            ``rollout_log_probs`` not of length ``response_length``.
        agentrl.checks.errors.LengthMismatchError: ``response_length`` not an int in ``(0, len(tokens))``.
        agentrl.checks.errors.TokenIdError, MaskValueError: non-integer ids, mask entries outside {0, 1}.
        agentrl.checks.errors.TokenizerMismatchError: ``tokenizer`` is not the records' own
            (:func:`agentrl.interop.owners.finish_import`, which also rebuilds template ownership).
    """
    out = []
    for b, s in enumerate(samples):
        d = s if isinstance(s, dict) else dict(vars(s))
        status = d.get('status')
        status = getattr(status, 'value', status)
        where = f'from_slime row {b}'
        tokens, R = check_ids(d['tokens'], 'tokens', where), d['response_length']
        if isinstance(R, bool) or not isinstance(R, numbers.Integral) or not 0 < R < len(tokens):
            raise E.LengthMismatchError(
                f'{where}: is {R!r}, but tokens has {len(tokens)} entries; the response is the last '
                'response_length tokens after a non-empty prompt (0 < response_length < len(tokens))',
                field='response_length', fix='pass Sample.to_dict() as slime wrote it')
        R = int(R)
        mask = d.get('loss_mask')
        mask = [1] * R if mask is None else mask
        meta = d.get('metadata') or {}
        lp = d.get('rollout_log_probs')
        if meta.get('agentrl_provenance'):
            prov = Provenance.from_dict(json.loads(meta['agentrl_provenance']))
        else:
            prov = provenance_for_import('slime', spec=spec, group_id=str(d.get('group_index', '')),
                                         rollout_id=str(d.get('index', b)), tokenizer=tokenizer, model=model,
                                         placeholder=lp is None)
        info = json.loads(meta['agentrl_info']) if meta.get('agentrl_info') else {
            'source': 'slime', 'stop': StopReason.TRUNCATED if status == _SLIME_TRUNCATED else str(status)}
        reward = d.get('reward')
        reward = check_reward(reward if not isinstance(reward, dict) else next(iter(reward.values()), 0.0) or 0.0,
                              'reward', f'from_slime row {b}')
        out.append(record_from_response(tokens[:len(tokens) - R], tokens[len(tokens) - R:], mask, lp, reward=reward,
                                        info=info, provenance=prov, row=b, columns=_COLUMNS))
    return finish_import(out, tokenizer, 'from_slime')
