"""L4: agentrl records <-> OpenRLHF ``Experience`` tensors (the only layout that shares agentrl's alignment).

OpenRLHF (``openrlhf/trainer/ppo_utils/experience.py``): ``sequences [B, T]`` int64 and
``attention_mask [B, T]`` int64, right-padded; ``action_mask [B, T-1]`` and
``rollout_log_probs [B, T-1]`` **aligned to ``sequences[:, 1:]``** (the actor takes
``log_probs[:, :-1]``), so the export is the identity on masks and log-probs; ``rewards [B]``,
``response_length [B]``, ``total_length [B]``, ``truncated [B]``. Groups are contiguous runs of
``n_samples_per_prompt`` rows (refused otherwise).
"""
from __future__ import annotations

import json

import torch

from ..batching import pad_rows
from ..gym.calls import StopReason
from ..record import Provenance, SamplingSpec, Trajectory
from .common import prepare_export, provenance_for_import, split
__all__ = ['to_openrlhf', 'from_openrlhf']


def to_openrlhf(records, *, pad_id: int = 0, allow_support_mismatch: bool = False) -> dict:
    """Export records as OpenRLHF ``Experience`` fields.

    Args:
        records: records, each group's rows contiguous.
        pad_id: padding id of ``sequences`` (OpenRLHF pads with 0).
        allow_support_mismatch: warn instead of refusing top-k/top-p log-probs.

    Returns:
        dict: ``sequences``, ``attention_mask`` ``[B, T]`` int64; ``action_mask [B, T-1]`` int64;
        ``rollout_log_probs [B, T-1]`` float32; ``rewards``, ``scores`` ``[B]`` float32;
        ``response_length``, ``total_length`` ``[B]`` int64 (action tokens, real tokens);
        ``truncated [B]`` bool; ``agentrl_provenance``, ``agentrl_info`` lists.

    Raises:
        agentrl.checks.errors.RecordError: refused records, SupportMismatchError, GroupOrderError.
    """
    records, _ = prepare_export(records, 'to_openrlhf', 'OpenRLHF', allow_support_mismatch=allow_support_mismatch,
                                groups='OpenRLHF (n_samples_per_prompt contiguous rows)')
    for i, r in enumerate(records):
        split(r, i)
    T = max(len(r.ids) for r in records)
    rewards = torch.tensor([float(r.reward) for r in records], dtype=torch.float32)
    return {
        'sequences': pad_rows([r.ids.long() for r in records], T, pad_id),
        'attention_mask': pad_rows([torch.ones(len(r.ids), dtype=torch.long) for r in records], T, 0),
        'action_mask': pad_rows([r.action_mask.long() for r in records], T - 1, 0),
        'rollout_log_probs': pad_rows([r.sample_logp.float() for r in records], T - 1, 0.0),
        'rewards': rewards, 'scores': rewards.clone(),
        'response_length': torch.tensor([int(r.action_mask.sum()) for r in records], dtype=torch.long),
        'total_length': torch.tensor([len(r.ids) for r in records], dtype=torch.long),
        'truncated': torch.tensor([(r.info or {}).get('stop') == StopReason.TRUNCATED for r in records]),
        'agentrl_provenance': [None if r.provenance is None else r.provenance.to_json() for r in records],
        'agentrl_info': [json.dumps(r.info, sort_keys=True, default=str) for r in records],
    }


def from_openrlhf(data, *, spec: SamplingSpec | None = None, tokenizer=None, model: str = '') -> list[Trajectory]:
    """Import OpenRLHF experience rows as records (the identity on masks and log-probs).

    Owner: ``prompt`` on token 0; for ``t > 0`` ``policy`` where ``action_mask[t-1]`` is 1, else
    ``prompt`` before the first action and ``tool`` after it.

    Raises:
        agentrl.checks.errors.MaskAlignmentError: ``action_mask`` as wide as ``sequences`` (a
            full-length mask where OpenRLHF stores ``[T-1]``).
    """
    from ..checks import errors as E
    seqs, attn, amask = data['sequences'], data['attention_mask'], data['action_mask']
    if amask.shape[1] != seqs.shape[1] - 1:
        raise E.MaskAlignmentError(
            f'from_openrlhf: action_mask has width {amask.shape[1]} but sequences {seqs.shape[1]}; OpenRLHF aligns '
            'it to sequences[:, 1:] (width T-1)', field='action_mask', fix='pass Experience.action_mask unchanged')
    lps = data.get('rollout_log_probs')
    provs = data.get('agentrl_provenance') or [None] * len(seqs)
    infos = data.get('agentrl_info') or [None] * len(seqs)
    out = []
    for b in range(seqs.shape[0]):
        n = int(attn[b].sum())
        ids = seqs[b, :n]
        m = amask[b, :n - 1].long().tolist()
        seen, owner, turn, k = False, [1], [-1], -1
        for j, x in enumerate(m):
            if x and (j == 0 or not m[j - 1]):
                k += 1
            seen = seen or bool(x)
            owner.append(2 if x else (3 if seen else 1))
            turn.append(k)
        lp = [0.0] + (lps[b, :n - 1].tolist() if lps is not None else [0.0] * (n - 1))
        prov = (Provenance.from_dict(json.loads(provs[b])) if provs[b] else
                provenance_for_import('openrlhf', spec=spec, rollout_id=str(b), tokenizer=tokenizer, model=model,
                                      placeholder=lps is None))
        info = json.loads(infos[b]) if infos[b] else {'source': 'openrlhf', 'row': b}
        out.append(Trajectory.from_tokens(ids, owner, turn, lp, float(data['rewards'][b]), info, provenance=prov))
    return out
