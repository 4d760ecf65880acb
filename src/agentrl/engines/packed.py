"""L4: score packed rows (:func:`agentrl.packing.collate_packed`) with document masking, TinyAgent or transformers.

TinyAgent masks attention by record from ``position_ids`` itself (``TinyAgent.forward(ids,
position_ids=...)``). A transformers causal LM does the same when it gets ``position_ids`` and
**no** attention mask and no cache: ``transformers.masking_utils._preprocess_mask_arguments``
then calls ``find_packed_sequence_indices(position_ids)`` (a new sequence wherever the position
does not grow by 1) and ``create_causal_mask`` ANDs ``packed_sequence_mask_function`` into the
causal mask, for the sdpa and eager kernels alike (checked on transformers 5.24 and 5.10;
``tests/test_packing.py``). Hence ``use_cache=False`` and no ``attention_mask`` below: either one
would silently turn the packed rows into one long sequence per row.

Cost: scoring does not run that dense masked attention. TinyAgent and (by default) a transformers
model attend per record instead: :func:`agentrl.model.segment_attention`, one causal sdpa per
segment, cut from ``position_ids`` by :func:`agentrl.model.segment_pieces`. For transformers it is
the attention function ``'agentrl_segments'`` (``AttentionInterface.register``), switched on with
``set_attn_implementation`` only for the call and switched back after; having no mask function
registered, transformers builds no mask for it. ``varlen=False`` keeps the masked dense path (the
reference the tests compare). Speed: bench/RESULTS.md, "Packed vs padded". The switch is on the model
object for the duration of the forward: do not score one model from two threads at once.
"""
from __future__ import annotations

import contextvars
from contextlib import contextmanager, nullcontext

import torch

from ..packing import PackedBatch
from ..record import SamplingSpec
from ..model import segment_attention, segment_pieces
from ..sampling import token_logp

__all__ = ['packed_token_logp', 'packed_logits', 'SEGMENT_ATTENTION']

#: the transformers attention implementation name registered by :func:`packed_token_logp`
SEGMENT_ATTENTION = 'agentrl_segments'
_PIECES = contextvars.ContextVar('agentrl_segment_pieces', default=None)


def _hf_segment_attention(module, query, key, value, attention_mask, dropout=0.0, scaling=None, **kwargs):
    """transformers attention function: ``query [R, H, N, Dh]`` -> ``([R, N, H, Dh], None)``, per-record causal."""
    if attention_mask is not None or kwargs.get('softcap') is not None:
        raise ValueError(f'{SEGMENT_ATTENTION} attention: got an attention mask or softcap; it only scores packed '
                         'rows (position_ids, no mask); use packed_token_logp(..., varlen=False)')
    pieces = _PIECES.get()
    if pieces is None:
        pos = kwargs.get('position_ids')
        if pos is None:
            raise ValueError(f'{SEGMENT_ATTENTION} attention needs position_ids; call it through packed_token_logp')
        pieces = segment_pieces(pos.expand(query.shape[0], -1))
    window = kwargs.get('sliding_window')
    if window is not None and max((b - a for row in pieces for a, b, att in row if att), default=0) > window:
        raise ValueError(f'{SEGMENT_ATTENTION} attention: a record is longer than the sliding window {window}; '
                         'use packed_token_logp(..., varlen=False)')
    out = segment_attention(query, key, value, pieces, scaling, dropout if module.training else 0.0)
    return out.transpose(1, 2).contiguous(), None


@contextmanager
def segments_attention(model, pos):
    """Switch ``model`` to :data:`SEGMENT_ATTENTION` for one call (a model that cannot switch keeps its masked path)."""
    from transformers import AttentionInterface
    if SEGMENT_ATTENTION not in AttentionInterface._global_mapping:
        AttentionInterface.register(SEGMENT_ATTENTION, _hf_segment_attention)
    prev = model.config._attn_implementation
    model.set_attn_implementation(SEGMENT_ATTENTION)
    token = _PIECES.set(segment_pieces(pos))
    try:
        yield
    finally:
        _PIECES.reset(token)
        model.set_attn_implementation(prev)


def _is_hf(model) -> bool:
    return hasattr(getattr(model, 'config', None), 'model_type')


def packed_logits(model, packed: PackedBatch) -> torch.Tensor:
    """Logits at every position of packed rows, each record attending only to itself.

    Args:
        model: a TinyAgent or a transformers causal LM (then through :data:`SEGMENT_ATTENTION`).
        packed: :class:`~agentrl.packing.PackedBatch`.

    Returns:
        ``[R, N, V]`` float logits on the model's device, with gradients when grad is enabled;
        row ``r``, column ``j`` predicts ``ids[r, j+1]``. Padding columns hold logits that no
        record uses.

    Raises:
        ValueError: TinyAgent: a record longer than ``max_len``.
    """
    if not _is_hf(model):
        return model(packed.ids, position_ids=packed.position_ids)
    dev = next(model.parameters()).device
    pos = packed.position_ids.to(dev)
    with segments_attention(model, packed.position_ids):
        return model(input_ids=packed.ids.to(dev), position_ids=pos, use_cache=False).logits


def packed_token_logp(model, packed: PackedBatch, spec: SamplingSpec | None = None, *,
                      where: torch.Tensor | None = None, varlen: bool = True) -> torch.Tensor:
    """Log-prob of each predicted token of packed rows, every record attending only to itself.

    Args:
        model: a TinyAgent (``forward(ids, position_ids=...)``) or a transformers causal LM.
        packed: :class:`~agentrl.packing.PackedBatch`.
        spec: the records' sampler (temperature, top-k / top-p / min-p; no penalties), as in
            :func:`agentrl.sampling.token_logp`; None: temperature 1.
        where: ``[R, N-1]`` bool, the columns to score; default ``packed.action_mask > 0``. A
            transformers model puts only these rows through its output head.
        varlen: transformers only: True (default) attends per record (:data:`SEGMENT_ATTENTION`);
            False runs the model's own kernel with transformers' packed block mask. TinyAgent always
            attends per record.

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
    from .hf.models import scoring_head                  # transformers only when scoring an HF model
    dev = next(model.parameters()).device
    ids_d, pos_d, mask_d = ids.to(dev), pos.to(dev), mask.to(dev)
    parts = scoring_head(model)
    r, j = mask_d.nonzero(as_tuple=True)
    with segments_attention(model, pos) if varlen else nullcontext():
        logits = scored_logits(model, parts, ids_d, pos_d, r, j)
    pair = torch.stack([torch.zeros_like(j), ids_d[r, j + 1]], dim=1)             # [K, 2]: (unused, target)
    lp = token_logp(logits.float()[:, None, :], pair, spec)[:, 0]                  # [K]
    out = torch.zeros(mask.shape, dtype=torch.float32, device=dev)
    return out.index_put((r, j), lp)


def scored_logits(model, parts, ids_d, pos_d, r, j):
    """``[K, V]`` logits at the scored (row, column) pairs of a transformers model."""
    if parts is None:
        return model(input_ids=ids_d, position_ids=pos_d, use_cache=False).logits[r, j]
    dec, head, cap = parts
    hidden = dec(input_ids=ids_d, position_ids=pos_d, use_cache=False).last_hidden_state
    logits = head(hidden[r, j])
    return torch.tanh(logits / cap) * cap if cap else logits
