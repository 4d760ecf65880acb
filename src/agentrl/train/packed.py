"""Packed scoring for training: score records laid end to end (:func:`agentrl.packing.collate_packed`), then
scatter the per-token values back to the padded ``[B, T-1]`` layout of :func:`agentrl.batching.collate`.

Only the model's forward runs on the packed rows (no padding, per-record attention,
:func:`agentrl.engines.packed.packed_logits`); every loss and statistic after it stays the padded one, so
``--packed`` changes the cost and nothing else (equal to fp32 rounding: tests/test_train_packed.py).
"""
from __future__ import annotations

import torch

from ..engines.packed import packed_logits
from ..packing import PackedBatch, concat_ranges, collate_packed
from ..record import SamplingSpec, Trajectory
from ..sampling import token_logp

__all__ = ['to_padded', 'pack_for', 'packed_log_probs', 'packed_step_logits']


def to_padded(values: torch.Tensor, packed: PackedBatch, n_records: int, n_cols: int) -> torch.Tensor:
    """Per-prediction values of packed rows ``[R, N-1, ...]`` -> ``[B, n_cols, ...]`` in record order.

    Record ``i``'s ``T_i - 1`` columns land in row ``i``, columns ``0 .. T_i - 2``; the rest is 0.
    Differentiable (one ``index_put``).

    Raises:
        ValueError: ``values`` not ``[R, N-1, ...]``, or a record longer than ``n_cols + 1``.
    """
    R, N = packed.ids.shape
    if values.dim() < 2 or tuple(values.shape[:2]) != (R, N - 1):
        raise ValueError(f'to_padded: values {tuple(values.shape)} must be [R, N-1] = [{R}, {N - 1}]')
    cols = (packed.seq_lens.long() - 1).clamp(min=0)
    if len(cols) and int(cols.max()) > n_cols:
        raise ValueError(f'to_padded: a record has {int(cols.max())} predictions > n_cols={n_cols}')
    src = concat_ranges(packed.row * (N - 1) + packed.offset, cols)
    dst = concat_ranges(packed.index * n_cols, cols)
    flat = values.reshape(R * (N - 1), *values.shape[2:])
    out = flat.new_zeros((n_records * n_cols, *values.shape[2:]))
    dev = values.device
    out = out.index_put((dst.to(dev),), flat[src.to(dev)])
    return out.view(n_records, n_cols, *values.shape[2:])


def pack_for(trajs: list[Trajectory], max_tokens: int, pad_id: int = 0) -> PackedBatch:
    """:func:`~agentrl.packing.collate_packed` with rows of at least the longest record (``max_tokens``
    is raised to it, so a run's ``--max-tokens`` never refuses a record)."""
    longest = max((len(t.ids) for t in trajs), default=1)
    return collate_packed(trajs, max(int(max_tokens), longest), pad_id=pad_id)


def packed_log_probs(model, packed: PackedBatch, n_records: int, n_cols: int,
                     spec: SamplingSpec | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """``(logp, entropy)`` ``[B, n_cols]`` float32 nats, as :func:`agentrl.train.token_log_probs` of the padded
    batch (column j scores ``ids[:, j+1]``; ``logp`` with gradients when enabled, ``entropy`` without), from
    one packed forward. Raises as :func:`agentrl.sampling.token_logp`."""
    logits = packed_logits(model, packed)
    logp, ent = token_logp(logits, packed.ids.to(logits.device), spec if spec is not None else SamplingSpec(),
                           entropy=True)
    return to_padded(logp, packed, n_records, n_cols), to_padded(ent, packed, n_records, n_cols)


def packed_step_logits(model, packed: PackedBatch, n_records: int, n_cols: int) -> torch.Tensor:
    """``[B, n_cols, V]`` logits at the predicting positions (``model(ids)[:, :-1]`` of the padded batch; 0 on
    padding), from one packed forward: what SFT's :func:`~agentrl.train.sft.masked_nll` takes."""
    return to_padded(packed_logits(model, packed)[:, :-1], packed, n_records, n_cols)
