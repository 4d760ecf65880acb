"""L1: the ragged key/value cache of :class:`agentrl.model.TinyAgent` and its index plan.

:class:`KVCache` holds the keys and values of a batch of rows of different lengths;
:func:`fill_holes` is the row order after rows leave (shared with the rollout drivers);
:class:`Plan` is where one :meth:`TinyAgent.extend` call writes and what it attends to.
"""
from __future__ import annotations

import torch

__all__ = ['KVCache', 'fill_holes']


class KVCache:
    """Incremental key/value cache of a :class:`~agentrl.model.TinyAgent` for a batch of ragged rows.

    Row ``b`` holds the keys and values of its first ``lengths[b]`` tokens; rows may differ in
    length (episodes at different points) and rows can be dropped (:meth:`drop` in place,
    :meth:`keep` with a compacting copy) when their episodes end. Memory grows with the longest
    row: the position axis is extended as rows grow (:meth:`reserve`: by at least 1.25x, in
    multiples of ``chunk`` positions; never preallocated at ``max_len``, since attention reads
    every allocated position) and trimmed by :meth:`keep`. About ``n_layers * 2 * d_model * 4`` bytes per
    position and row (1 KB for the default TinyAgent). Build one with :meth:`TinyAgent.new_cache`;
    fill it with :meth:`TinyAgent.extend`.

    Args:
        n_layers: blocks of the model. batch: rows B (>= 0). n_heads, head_dim: H and Dh.
        max_len: the model's context length. dtype, device: of the key and value tensors.
        chunk: positions the capacity is rounded up to (>= 1).

    Attributes:
        k, v: one ``[B, H, S, Dh]`` float tensor per block (``S`` = capacity >= longest row).
        lengths: ``[B]`` int64, tokens held per row.
        max_len: the model's context length (capacity never exceeds it).
        tokens: free slot for single-row users to remember which ids the cache holds
            (:func:`agentrl.rollouts.generate_call` uses it to check a cache matches its prefix).

    Raises:
        ValueError: ``batch < 0`` or ``chunk < 1``.
    """

    def __init__(self, n_layers: int, batch: int, n_heads: int, head_dim: int, max_len: int,
                 dtype=torch.float32, device=None, chunk: int = 16):
        if batch < 0 or chunk < 1:
            raise ValueError(f'KVCache needs batch >= 0 and chunk >= 1, got {batch}, {chunk}')
        self.max_len, self.chunk = max_len, chunk
        self.k = [torch.zeros(batch, n_heads, 0, head_dim, dtype=dtype, device=device) for _ in range(n_layers)]
        self.v = [torch.zeros(batch, n_heads, 0, head_dim, dtype=dtype, device=device) for _ in range(n_layers)]
        self.lengths = torch.zeros(batch, dtype=torch.long, device=device)
        self.tokens = None

    @property
    def batch_size(self) -> int:
        """Number of rows B."""
        return self.lengths.shape[0]

    @property
    def capacity(self) -> int:
        """Allocated positions S per row (>= the longest row, <= ``max_len``)."""
        return self.k[0].shape[2] if self.k else 0

    def nbytes(self) -> int:
        """Bytes held by the key and value tensors."""
        return sum(t.numel() * t.element_size() for t in self.k + self.v)

    def reserve(self, need: int) -> None:
        """Grow the position axis to hold ``need`` positions.

        The new capacity is ``need`` or 1.25x the old capacity, whichever is larger, rounded up to
        ``chunk`` and capped at ``max_len``: at most about 1.25x the longest row plus a chunk, and
        the copies made by growing add up to O(longest row) per row.
        """
        cap = self.capacity
        if need <= cap:
            return
        new = min(self.max_len, -(-max(need, cap + cap // 4) // self.chunk) * self.chunk)
        for kv in (self.k, self.v):             # one tensor at a time: peak = cache + one tensor
            for i, t in enumerate(kv):
                grown = t.new_empty(t.shape[0], t.shape[1], new, t.shape[3])
                grown[:, :, :cap].copy_(t)
                grown[:, :, cap:].zero_()       # never-written slots must be finite (masked, weight 0)
                kv[i] = grown

    def keep(self, rows, extra: int = 0) -> None:
        """Keep only ``rows`` (in the given order), then append ``extra`` empty rows; trim capacity.

        Used when episodes leave the batch (their rows are dropped) and others join (empty rows
        at the end). One copy of the kept part of the cache; capacity shrinks to the longest kept
        row rounded up to ``chunk``.

        Args:
            rows: list or ``[R]`` int64 tensor of row indices in ``[0, B)``.
            extra: number of empty rows (length 0) to append.

        Raises:
            IndexError: a row index outside ``[0, B)``.
        """
        rows = torch.as_tensor(rows, dtype=torch.long, device=self.lengths.device)
        lengths = self.lengths[rows]
        longest = int(lengths.max()) if len(rows) else 0
        cap = min(self.capacity, -(-longest // self.chunk) * self.chunk)

        def pick(t):
            used = t[:, :, :cap]
            if not extra:
                return used.index_select(0, rows)
            out = t.new_empty(len(rows) + extra, *used.shape[1:])
            torch.index_select(used, 0, rows, out=out[:len(rows)])     # one copy, straight into place
            out[len(rows):].zero_()
            return out
        for kv in (self.k, self.v):             # one tensor at a time: peak = cache + one tensor
            for i, t in enumerate(kv):
                kv[i] = pick(t)
        self.lengths = torch.cat([lengths, lengths.new_zeros(extra)]) if extra else lengths

    def drop(self, dead) -> list[int]:
        """Drop the ``dead`` rows (ended episodes) in place, copying only the rows that move.

        The last kept rows move into the holes (:func:`fill_holes`) and the row axis is narrowed
        (a view: the memory is reused, and released at the next :meth:`reserve` or :meth:`keep`);
        unlike :meth:`keep`, no copy of the whole cache and the capacity is not trimmed.

        Args:
            dead: row indices in ``[0, B)`` (any order, no repeats).

        Returns:
            ``order``: new row ``r`` holds what old row ``order[r]`` held.

        Raises:
            IndexError: a row index outside ``[0, B)``. ValueError: a repeated index.
        """
        dead = list(dead)
        B = self.batch_size
        if len(set(dead)) != len(dead):
            raise ValueError(f'KVCache.drop: repeated row indices in {dead}')
        if any(not 0 <= d < B for d in dead):
            raise IndexError(f'KVCache.drop: row index out of range [0, {B}) in {dead}')
        order = fill_holes(B, dead)
        n = len(order)
        moves = [(r, o) for r, o in enumerate(order) if r != o]
        if moves:
            dst = torch.tensor([m[0] for m in moves], device=self.lengths.device)
            src = torch.tensor([m[1] for m in moves], device=self.lengths.device)
            for kv in (self.k, self.v):
                for t in kv:
                    t.index_copy_(0, dst, t.index_select(0, src))
            self.lengths[dst] = self.lengths[src]
        for kv in (self.k, self.v):
            for i, t in enumerate(kv):
                kv[i] = t[:n]
        self.lengths = self.lengths[:n]
        return order


def fill_holes(n: int, dead) -> list[int]:
    """Row order after dropping ``dead`` rows of ``n`` by moving the last kept rows into the holes.

    Returns ``order``: new row ``r`` is old row ``order[r]``; rows before the first hole keep their
    place, so only ``len(dead)`` rows move (what :meth:`KVCache.drop` copies). Rollout drivers
    reorder their live episodes with the same rule, so every path samples rows in one order.
    """
    dead = set(dead)
    n_keep = n - len(dead)
    order = list(range(n_keep))
    tail = [r for r in range(n_keep, n) if r not in dead]
    for hole, r in zip((d for d in sorted(dead) if d < n_keep), tail):
        order[hole] = r
    return order


class Plan:
    """Index plan of one :meth:`TinyAgent.extend` call, shared by every block.

    The ``N`` packed new tokens are the last new token of each of the B rows, then the other new
    tokens (an observation being prefilled) in row order.

    Attributes:
        positions: ``[N]`` int64 position of each packed new token.
        token_ids: ``[N]`` int64 id of each packed new token.
        slots: ``[N * H]`` int64 rows of the flattened ``[B * H * S, Dh]`` cache its keys and values go to.
        last_mask: additive ``[B, 1, 1, S]`` mask of the last-token queries (``-inf`` past each row's end).
        extra_rows: ``[Q]`` int64 cache rows that have other new tokens, or None for every row (Q = B).
        extra_query_row, extra_query_offset: ``[N - B]`` int64, each other token's query row in
            ``[0, Q)`` and its offset in ``[0, extra_width)``.
        extra_width: padded count of other new tokens per query row (``t - 1``).
        extra_mask: additive ``[Q, 1, extra_width, S]`` causal mask of the other new tokens.
    """
    __slots__ = ('positions', 'token_ids', 'slots', 'last_mask', 'extra_rows', 'extra_query_row',
                 'extra_query_offset', 'extra_width', 'extra_mask')

    @classmethod
    def build(cls, cache: KVCache, ids: torch.Tensor, n_new: torch.Tensor | None, ends: torch.Tensor,
              n_heads: int, dtype: torch.dtype) -> 'Plan':
        """The plan of appending ``ids[b, :n_new[b]]`` to each row ``b`` of ``cache`` (already reserved).

        Args:
            cache: the :class:`KVCache` with B rows and capacity S >= ``ends.max()``.
            ids: ``[B, t]`` int64 new tokens, right-padded. n_new: ``[B]`` int64 in ``[1, t]``, or None (all t).
            ends: ``[B]`` int64 row lengths after the call. n_heads: H. dtype: of the masks.
        """
        B, t, dev = cache.batch_size, ids.shape[1], ids.device
        lengths, S = cache.lengths, cache.capacity
        keys = torch.arange(S, device=dev)
        plan = cls()
        inf = torch.tensor(float('-inf'), dtype=dtype, device=dev)
        plan.last_mask = torch.where(keys >= ends[:, None, None, None], inf, 0.0)            # [B, 1, 1, S]
        plan.extra_rows = None
        rows = torch.arange(B, device=dev)
        last_ids = ids[:, t - 1] if n_new is None else ids[rows, n_new - 1]
        if t == 1:
            cache_row, plan.positions, plan.token_ids = rows, lengths, last_ids
        else:
            n = torch.full((B,), t, device=dev) if n_new is None else n_new
            extra = torch.arange(t - 1, device=dev) < (n - 1)[:, None]                # [B, t-1]
            extra_row, extra_offset = extra.nonzero(as_tuple=True)                   # [N - B] each
            has = extra[:, 0]
            if int(has.sum()) * 2 > B:          # most rows: attend over the whole cache, no copy
                plan.extra_query_row, query_lengths = extra_row, lengths
            else:                               # a few rows: gather their cache rows
                plan.extra_rows = has.nonzero().squeeze(1)
                plan.extra_query_row = (has.long().cumsum(0) - 1)[extra_row]
                query_lengths = lengths[plan.extra_rows]
            plan.extra_query_offset, plan.extra_width = extra_offset, t - 1
            query_pos = query_lengths[:, None] + torch.arange(t - 1, device=dev)          # [Q, t-1]
            plan.extra_mask = torch.where(keys > query_pos[:, None, :, None], inf, 0.0)   # [Q, 1, t-1, S]
            cache_row = torch.cat([rows, extra_row])
            plan.positions = torch.cat([ends - 1, lengths[extra_row] + extra_offset])
            plan.token_ids = torch.cat([last_ids, ids[extra_row, extra_offset]])
        heads = torch.arange(n_heads, device=dev)
        plan.slots = ((cache_row[:, None] * n_heads + heads) * S + plan.positions[:, None]).view(-1)
        return plan
