"""L4: score packed rows (:func:`agentrl.packing.collate_packed`) with document masking, TinyAgent or transformers.

TinyAgent masks attention by record from ``position_ids`` itself (``TinyAgent.forward(ids,
position_ids=...)``). A transformers causal LM does the same when it gets ``position_ids`` and
**no** attention mask and no cache: ``transformers.masking_utils._preprocess_mask_arguments``
then calls ``find_packed_sequence_indices(position_ids)`` (a new sequence wherever the position
does not grow by 1) and ``create_causal_mask`` ANDs ``packed_sequence_mask_function`` into the
causal mask, for the sdpa and eager kernels alike (checked on transformers 5.24 and 5.10;
``tests/test_packing.py``). Hence ``use_cache=False`` and no ``attention_mask`` below: either one
would silently turn the packed rows into one long sequence per row.

Cost: a packed row is one dense attention with a block-diagonal mask. On CPU sdpa that is no faster
than the padded path (bench/RESULTS.md, "Packed vs padded"); kernels that skip masked blocks
(flash-attention varlen) are where packing pays.
"""
from __future__ import annotations

import torch

from ..packing import PackedBatch
from ..record import SamplingSpec
from ..sampling import token_logp

__all__ = ['packed_token_logp']


def _is_hf(model) -> bool:
    return hasattr(getattr(model, 'config', None), 'model_type')


def packed_token_logp(model, packed: PackedBatch, spec: SamplingSpec | None = None, *,
                      where: torch.Tensor | None = None) -> torch.Tensor:
    """Log-prob of each predicted token of packed rows, every record attending only to itself.

    Args:
        model: a TinyAgent (``forward(ids, position_ids=...)``) or a transformers causal LM.
        packed: :class:`~agentrl.packing.PackedBatch`.
        spec: the records' sampler (temperature, top-k / top-p / min-p; no penalties), as in
            :func:`agentrl.sampling.token_logp`; None: temperature 1.
        where: ``[R, N-1]`` bool, the columns to score; default ``packed.action_mask > 0``. A
            transformers model puts only these rows through its output head.

    Returns:
        ``[R, N-1]`` float32 nats, column j scoring ``ids[:, j+1]``; 0.0 outside ``where``.
        Carries gradients when called with grad enabled. Equal to scoring each record alone
        (the padded :func:`~agentrl.batching.collate` path) within fp32 rounding (1e-5 tested).

    Raises:
        ValueError: ``where`` of another shape than ``packed.action_mask``; from
            :func:`~agentrl.sampling.token_logp` (temperature <= 0, penalties); TinyAgent: a record
            longer than its ``max_len``.
    """
    ids, pos = packed.ids, packed.position_ids
    mask = packed.action_mask > 0 if where is None else where.bool()
    if mask.shape != packed.action_mask.shape:
        raise ValueError(f'packed_token_logp: where {tuple(mask.shape)} must be [R, N-1] = '
                         f'{tuple(packed.action_mask.shape)}')
    if not _is_hf(model):
        logp = token_logp(lambda x: model(x, position_ids=pos.to(x.device)), ids, spec)
        return torch.where(mask.to(logp.device), logp, 0.0)
    from .hf.models import _head                  # transformers only when scoring an HF model
    dev = next(model.parameters()).device
    ids_d, pos_d, mask_d = ids.to(dev), pos.to(dev), mask.to(dev)
    parts = _head(model)
    r, j = mask_d.nonzero(as_tuple=True)
    if parts is None:
        logits = model(input_ids=ids_d, position_ids=pos_d, use_cache=False).logits[r, j]
    else:
        dec, head, cap = parts
        hidden = dec(input_ids=ids_d, position_ids=pos_d, use_cache=False).last_hidden_state
        logits = head(hidden[r, j])
        if cap:
            logits = torch.tanh(logits / cap) * cap
    pair = torch.stack([torch.zeros_like(j), ids_d[r, j + 1]], dim=1)             # [K, 2]: (unused, target)
    lp = token_logp(logits.float()[:, None, :], pair, spec)[:, 0]                  # [K]
    out = torch.zeros(mask.shape, dtype=torch.float32, device=dev)
    return out.index_put((r, j), lp)
