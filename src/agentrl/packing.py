"""L2: pack trajectories into rows of at most ``max_tokens`` (first-fit decreasing), and balance micro-batches.

:func:`collate` right-pads every record to the longest one; on a length-skewed batch most of the
tensor is padding. :func:`collate_packed` lays several records end to end in one row instead, with
position ids restarting at 0 per record, so a model that masks attention by document (TinyAgent's
``forward(ids, position_ids=...)``, transformers' packed-sequence masks, flash-attention's
``cu_seqlens``) scores every record exactly as if it stood alone. The ``[R, N-1]`` fields follow
docs/design.md#shift; the column that would predict a record's first token from the previous record's
last one is never a target (action mask 0, sample log-prob 0, turn -1).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from .record import Trajectory

__all__ = ['PackedBatch', 'collate_packed', 'pack_order', 'balance_micro_batches', 'unpack_rows',
           'document_mask']


@dataclass
class PackedBatch:
    """S records packed into R rows of N tokens (N = the fullest row's fill, at most ``max_tokens``).

    Attributes:
        ids: ``[R, N]`` int64; padding after each row's last record is ``pad_id``.
        position_ids: ``[R, N]`` int64, 0, 1, ... within each record; 0 on padding, so every padding
            token is a segment of its own for transformers' packed detection and :func:`document_mask`
            (and positions stay below the longest record, whatever ``max_tokens``).
        attention_mask: ``[R, N]`` float32, 1.0 on record tokens, 0.0 on padding.
        action_mask: ``[R, N-1]`` float32 aligned to ``ids[:, 1:]``; 0 on padding and on every
            column that would predict a record's first token.
        sample_logp: ``[R, N-1]`` float32 nats, 0 where ``action_mask`` is 0 by construction.
        turn_ids: ``[R, N-1]`` int64, -1 on prompt, padding and record boundaries.
        seq_lens: ``[S]`` int32 tokens of each segment, segments in row-major order.
        cu_seqlens: ``[S+1]`` int32 cumulative ``seq_lens`` from 0: the flash-attention varlen offsets
            of the real tokens ``ids[attention_mask.bool()]`` (row-major).
        rewards: ``[S]`` float32 reward of each segment's record.
        index: ``[S]`` int64 position of each segment's record in the list given to :func:`collate_packed`.
        row: ``[S]`` int64 row of each segment. offset: ``[S]`` int64 its first column.
    """
    ids: torch.Tensor
    position_ids: torch.Tensor
    attention_mask: torch.Tensor
    action_mask: torch.Tensor
    sample_logp: torch.Tensor
    turn_ids: torch.Tensor
    seq_lens: torch.Tensor
    cu_seqlens: torch.Tensor
    rewards: torch.Tensor
    index: torch.Tensor
    row: torch.Tensor
    offset: torch.Tensor

    @property
    def padding_share(self) -> float:
        """Fraction of the ``[R, N]`` tensor that is padding (0.0 for perfectly full rows)."""
        return 1.0 - float(self.seq_lens.sum()) / max(1, self.ids.numel())

    def segment_of(self) -> torch.Tensor:
        """``[R, N]`` int64 segment number (index into ``seq_lens``) of each token, -1 on padding."""
        R, N = self.ids.shape
        out = torch.full((R * N,), -1, dtype=torch.long)
        starts = self.row * N + self.offset
        lens = self.seq_lens.long()
        pos = concat_ranges(starts, lens)
        return out.index_copy_(0, pos, torch.repeat_interleave(torch.arange(len(lens)), lens)).view(R, N)


def pack_order(lengths, max_tokens: int) -> list[list[int]]:
    """First-fit decreasing: bins of total length at most ``max_tokens``.

    Args:
        lengths: S ints >= 1 (tokens per record).
        max_tokens: capacity of a row.

    Returns:
        R lists of record positions; each list is in placement order (longest first, ties by
        position), rows in the order they were opened. Deterministic.

    Raises:
        ValueError: ``max_tokens < 1`` or a length above it (names the record).

    Source: first-fit decreasing bin packing (Johnson 1973; at most 11/9 OPT + 6/9 bins).
    """
    if max_tokens < 1:
        raise ValueError(f'pack_order: max_tokens must be >= 1, got {max_tokens}')
    lens = np.asarray(lengths, dtype=np.int64).reshape(-1)
    over = np.flatnonzero(lens > max_tokens)
    if len(over):
        raise ValueError(f'pack_order: record {int(over[0])} has {int(lens[over[0]])} tokens > max_tokens={max_tokens}')
    order = np.lexsort((np.arange(len(lens)), -lens))
    rem = np.empty(len(lens), dtype=np.int64)
    rows: list[list[int]] = []
    for i in order.tolist():
        L = lens[i]
        j = int(np.argmax(rem[:len(rows)] >= L)) if rows else 0
        if not rows or rem[j] < L:
            j = len(rows)
            rows.append([])
            rem[j] = max_tokens
        rows[j].append(i)
        rem[j] -= L
    return rows


def concat_ranges(starts: torch.Tensor, lens: torch.Tensor) -> torch.Tensor:
    """Concatenation of ``arange(starts[k], starts[k] + lens[k])`` over k, as one int64 tensor."""
    total = int(lens.sum())
    if total == 0:
        return torch.zeros(0, dtype=torch.long)
    first = torch.cumsum(lens, 0) - lens
    return torch.repeat_interleave(starts - first, lens) + torch.arange(total)


def _record_name(t, i: int) -> str:
    prov = getattr(t, 'provenance', None)
    rid = getattr(prov, 'rollout_id', '') if prov is not None else ''
    return f'trajectory {i} (rollout_id {rid!r})' if rid else f'trajectory {i}'


def _checked(trajs, max_tokens) -> list[int]:
    """Each record's length after the collate checks, or the first problem as a ValueError naming the record."""
    lens = []
    for i, t in enumerate(trajs):
        n = t.ids.shape[0] if t.ids.dim() == 1 else -1
        if not (0 < n <= max_tokens and t.action_mask.shape == (n - 1,) and t.sample_logp.shape == (n - 1,)
                and t.turn is not None and t.turn.shape == (n,) and (t.owner is None or len(t.owner) == n)):
            _refuse(t, i, max_tokens)
        lens.append(n)
    return lens


def _refuse(t, i, max_tokens):
    """The error of a record that failed the plain-shape test above (the slow, precise checks)."""
    try:
        t.check_shapes()
    except ValueError as e:
        raise ValueError(f'collate_packed: {_record_name(t, i)}: {e}') from None
    if t.turn is None:
        raise ValueError(f'collate_packed: {_record_name(t, i)} has no turn field; build it with '
                         'Trajectory.from_tokens')
    if len(t.ids) > max_tokens:
        raise ValueError(f'collate_packed: {_record_name(t, i)} has {len(t.ids)} tokens > max_tokens={max_tokens}; '
                         'a record is never split across rows: raise max_tokens or cap the episode length')
    raise ValueError(f'collate_packed: {_record_name(t, i)}: fields must be 1-D tensors aligned as in '
                     'Trajectory (ids [T], action_mask and sample_logp [T-1], turn [T])')


def collate_packed(trajs: list[Trajectory], max_tokens: int, pad_id: int = 0) -> PackedBatch:
    """Pack trajectories into rows of at most ``max_tokens`` tokens by first-fit decreasing.

    Args:
        trajs: S trajectories (fields aligned as in :class:`~agentrl.record.Trajectory`, with ``turn``).
        max_tokens: row capacity in tokens; every record must fit (records are never split).
        pad_id: id written after each row's last record (``tok.pad_id``).

    Returns:
        :class:`PackedBatch` (shapes there). Within a row, records sit in :func:`pack_order`
        placement order; ``index`` maps each segment back to ``trajs``.
        On every segment the ``[R, N-1]`` fields hold the record's own ``action_mask``,
        ``sample_logp`` and ``turn[1:]`` in columns ``offset .. offset + len - 2``; the column
        ``offset + len - 1`` (which would predict the next record's first token) is not a target.

    Raises:
        ValueError: an empty list, ``max_tokens < 2``, a malformed record (as :func:`~agentrl.batching.collate`,
            naming it), or a record longer than ``max_tokens`` (named by position and rollout_id).

    Example: 8 records of 76, 40, 40, 30, 30, 20, 10, 10 tokens, max_tokens=128 -> ids (3, 126) (rows of
    76+40+10, 40+30+30+20, 10 tokens), cu_seqlens [0, 76, 116, 126, 166, 196, 226, 246, 256].
    """
    if len(trajs) == 0:
        raise ValueError('collate_packed([]): no trajectories; pass at least one Trajectory')
    if max_tokens < 2:
        raise ValueError(f'collate_packed: max_tokens must be >= 2, got {max_tokens}')
    n_tok = _checked(trajs, max_tokens)
    rows = pack_order(n_tok, max_tokens)
    seg = [i for r in rows for i in r]                                           # row-major segment order
    lens = torch.tensor(n_tok, dtype=torch.long)[torch.tensor(seg, dtype=torch.long)]
    row = torch.repeat_interleave(torch.arange(len(rows)), torch.tensor([len(r) for r in rows]))
    fill = torch.zeros(len(rows), dtype=torch.long).index_add_(0, row, lens)
    offset = torch.cumsum(lens, 0) - lens - (torch.cumsum(fill, 0) - fill)[row]
    R, N = len(rows), int(fill.max())
    valid = torch.arange(N) < fill[:, None]                                     # [R, N]: rows fill from column 0
    start = torch.zeros(R, N, dtype=torch.long).index_put_((row, offset), offset)
    pos = torch.where(valid, torch.arange(N) - start.cummax(dim=1).values, 0)   # 0, 1, ... per record; 0 on padding
    target = valid[:, 1:] & (pos[:, 1:] != 0)          # column j predicts a real token that does not start a record
    ts = [trajs[i] for i in seg]

    def fill_(parts, where, value, dtype):             # the records in segment order fill the slots row-major
        return torch.full(where.shape, value, dtype=dtype).masked_scatter_(where, torch.cat(parts).to(dtype))

    seq = lens.to(torch.int32)
    return PackedBatch(
        ids=fill_([t.ids for t in ts], valid, pad_id, torch.long),
        position_ids=pos,
        attention_mask=valid.float(),
        action_mask=fill_([t.action_mask for t in ts], target, 0.0, torch.float32),
        sample_logp=fill_([t.sample_logp for t in ts], target, 0.0, torch.float32),
        turn_ids=fill_([t.turn[1:] for t in ts], target, -1, torch.long),
        seq_lens=seq,
        cu_seqlens=torch.cat([torch.zeros(1, dtype=torch.int32), torch.cumsum(seq, 0, dtype=torch.int32)]),
        rewards=torch.tensor([float(t.reward) for t in ts], dtype=torch.float32),
        index=torch.tensor(seg, dtype=torch.long), row=row, offset=offset)


def unpack_rows(values: torch.Tensor, packed: PackedBatch) -> list[torch.Tensor]:
    """Per-record slices of a packed ``[R, N]`` or ``[R, N-1]`` tensor, in the order of the original list.

    Args:
        values: ``[R, N, ...]`` (token fields) or ``[R, N-1, ...]`` (prediction fields, e.g. log-probs
            from a packed scorer).
        packed: the :class:`PackedBatch` the values were computed on.

    Returns:
        S tensors: record i's ``[T_i, ...]`` (token fields) or ``[T_i - 1, ...]`` (prediction fields).

    Raises:
        ValueError: ``values`` has neither N nor N-1 columns, or not R rows.
    """
    R, N = packed.ids.shape
    if values.dim() < 2 or values.shape[0] != R or values.shape[1] not in (N, N - 1):
        raise ValueError(f'unpack_rows: values {tuple(values.shape)} must be [R={R}, N={N}] or [R, N-1]')
    cut = 0 if values.shape[1] == N else 1
    out: list = [None] * len(packed.index)
    for r, o, n, i in zip(packed.row.tolist(), packed.offset.tolist(), packed.seq_lens.tolist(), packed.index.tolist()):
        out[i] = values[r, o:o + n - cut]
    return out


def document_mask(position_ids: torch.Tensor) -> torch.Tensor:
    """Causal attention restricted to each packed record: ``[R, 1, N, N]`` bool, True = may attend.

    A new segment starts wherever ``position_ids`` is 0 (the layout of :func:`collate_packed`).

    Args:
        position_ids: ``[R, N]`` int64.

    Returns:
        ``[R, 1, N, N]`` bool: query i attends key j iff ``j <= i`` and both are in the same segment.
    """
    seg = torch.cumsum((position_ids == 0).long(), dim=1)
    N = position_ids.shape[1]
    causal = torch.ones(N, N, dtype=torch.bool, device=position_ids.device).tril()
    return ((seg[:, :, None] == seg[:, None, :]) & causal)[:, None]


def balance_micro_batches(lengths, n_micro: int) -> list[list[int]]:
    """Split items into ``n_micro`` micro-batches of nearly equal total tokens.

    Args:
        lengths: token count of each item (records, or packed rows' fill, ``attention_mask.sum(1)``).
        n_micro: number of micro-batches, 1 <= n_micro <= number of items.

    Returns:
        ``n_micro`` sorted lists of item positions; every item is in exactly one. Items are placed
        longest first, each into the micro-batch with the fewest tokens so far (ties: the lowest
        index), so the largest minus the smallest total is at most the longest item.

    Raises:
        ValueError: ``n_micro`` outside ``[1, len(lengths)]``.

    Source: verl's ``RayPPOTrainer._balance_batch`` idea (``verl/trainer/ppo/ray_trainer.py``:
    partitions of equal token sums so no rank or micro-batch waits on a long one); here the
    greedy longest-processing-time rule (Graham 1969) rather than verl's Karmarkar-Karp.
    """
    lens = np.asarray(lengths, dtype=np.int64).reshape(-1)
    if not 1 <= n_micro <= len(lens):
        raise ValueError(f'balance_micro_batches: n_micro must be in [1, {len(lens)}] (the number of items), '
                         f'got {n_micro}')
    sums = np.zeros(n_micro, dtype=np.int64)
    out: list[list[int]] = [[] for _ in range(n_micro)]
    for i in np.lexsort((np.arange(len(lens)), -lens)).tolist():
        j = int(np.argmin(sums))
        out[j].append(i)
        sums[j] += lens[i]
    return [sorted(b) for b in out]
