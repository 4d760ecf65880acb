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
from ..checks import errors as E
from ..record import Provenance, SamplingSpec, StopReason, Trajectory
from .common import check_ids, check_mask, check_same, prepare_export, provenance_for_import, split
from .owners import finish_import
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
        agentrl.checks.errors.LengthMismatchError: a field that does not line up with ``sequences``
            (rows, columns), or an ``attention_mask`` with a hole in its padding.
        agentrl.checks.errors.TokenIdError, MaskValueError: non-integer ids, mask entries outside {0, 1}
            or 1 on padding.
        agentrl.checks.errors.TokenizerMismatchError: ``tokenizer`` is not the records' own
            (:func:`agentrl.interop.owners.finish_import`, which also rebuilds template ownership).
    """
    seqs, attn, amask = data['sequences'], data['attention_mask'], data['action_mask']
    if amask.shape[1] != seqs.shape[1] - 1:
        raise E.MaskAlignmentError(
            f'from_openrlhf: action_mask has width {amask.shape[1]} but sequences {seqs.shape[1]}; OpenRLHF aligns '
            'it to sequences[:, 1:] (width T-1)', field='action_mask', fix='pass Experience.action_mask unchanged')
    B, T = seqs.shape[0], seqs.shape[1]
    check_same('attention_mask', tuple(attn.shape), (B, T), 'from_openrlhf', 'sequences')
    check_same('action_mask', tuple(amask.shape), (B, T - 1), 'from_openrlhf', 'sequences[:, 1:]')
    lps = data.get('rollout_log_probs')
    if lps is not None:
        check_same('rollout_log_probs', tuple(lps.shape), (B, T - 1), 'from_openrlhf', 'sequences[:, 1:]')
    provs = data.get('agentrl_provenance') or [None] * B
    infos = data.get('agentrl_info') or [None] * B
    for k, v in (('rewards', data['rewards']), ('agentrl_provenance', provs), ('agentrl_info', infos)):
        if len(v) != B:
            check_same(k, (len(v),), (B,), 'from_openrlhf', 'sequences (rows)')
    out = []
    for b in range(B):
        where = f'from_openrlhf row {b}'
        a = check_mask(attn[b], 'attention_mask', where)
        n = sum(a)
        if any(a[n:]):
            raise E.LengthMismatchError(f'{where}: is not right padding (1...1 0...0): 1 at column '
                                        f'{n + a[n:].index(1)}', field='attention_mask', position=n + a[n:].index(1),
                                        fix='pass Experience.attention_mask unchanged')
        ids = check_ids(seqs[b, :n], 'sequences', where)
        full = check_mask(amask[b], 'action_mask', where)
        if any(full[n - 1:]):
            j = n - 1 + full[n - 1:].index(1)
            raise E.MaskValueError(f'{where}: is 1 at column {j}, on padding past the {n} real tokens '
                                   '(attention_mask)', field='action_mask', position=j,
                                   fix='action_mask is 0 on padding')
        m = full[:n - 1]
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
    return finish_import(out, tokenizer, 'from_openrlhf')
