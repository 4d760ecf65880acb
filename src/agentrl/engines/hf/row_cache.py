"""L4: the cross-turn KV cache of the HF engine: one row per episode, each with its own length.

:class:`RowCache` is a transformers ``Cache`` whose :class:`RowLayer` layers keep ``[rows,
kv_heads, capacity, head_dim]`` buffers; :class:`~agentrl.engines.hf.HFSampler` plans each forward
call (``plan_*`` attributes) and builds the attention masks. Importing this module imports
transformers (the sampler imports it on first use: :meth:`HFSampler.new_row_cache`).

Source: transformers ``Cache`` / ``CacheLayerMixin`` (the layer ``update`` protocol); the row
layout of :class:`agentrl.model.KVCache`.
"""
from __future__ import annotations

from ...templates.chat import require_hf

require_hf('RowCache')

from transformers.cache_utils import Cache, CacheLayerMixin  # noqa: E402

__all__ = ['RowCache', 'RowLayer']


class RowLayer(CacheLayerMixin):
    """One layer's keys and values: ``[R, H_kv, S, D]`` buffers, row ``r`` real in ``[:lengths[r]]``."""

    def __init__(self, owner):
        super().__init__()
        self.owner = owner

    def lazy_initialization(self, key_states, value_states):
        o = self.owner
        shape = (o.max_rows, key_states.shape[1], o.capacity, key_states.shape[3])
        self.keys = key_states.new_zeros(shape)
        self.values = value_states.new_zeros(shape)
        self.device = key_states.device
        self.is_initialized = True

    def _fit(self, capacity: int) -> None:
        if self.keys.shape[2] >= capacity:
            return
        for name in ('keys', 'values'):
            old = getattr(self, name)
            new = old.new_zeros(old.shape[:2] + (capacity,) + old.shape[3:])
            new[:, :, :old.shape[2]] = old
            setattr(self, name, new)

    def update(self, key_states, value_states, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        o = self.owner
        self._fit(o.capacity)
        r0, n, span = o.plan_rows, o.plan_n, o.plan_span
        if o.plan_start is not None:            # one row, t new tokens from column plan_start
            s, t = o.plan_start, key_states.shape[2]
            self.keys[r0, :, s:s + t] = key_states[0]
            self.values[r0, :, s:s + t] = value_states[0]
        else:                                   # n rows [r0, r0 + n), one token each at its own column
            rows, cols = o.plan_index
            self.keys[rows, :, cols] = key_states[:, :, 0]
            self.values[rows, :, cols] = value_states[:, :, 0]
        return self.keys[r0:r0 + n, :, :span], self.values[r0:r0 + n, :, :span]

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.owner.plan_span, 0

    def get_seq_length(self) -> int:
        return self.owner.plan_span

    def get_max_length(self) -> int:
        return -1

    def get_max_cache_shape(self) -> int:     # the same question under transformers < 5.11
        return -1

    def move_row(self, src: int, dst: int, n: int) -> None:
        if self.is_initialized and n:
            self.keys[dst, :, :n] = self.keys[src, :, :n]
            self.values[dst, :, :n] = self.values[src, :, :n]


class RowCache(Cache):
    """A KV cache of up to ``max_rows`` episodes, each row with its own length (no padding).

    Row ``r`` holds the keys and values of its first ``lengths[r]`` tokens at columns
    ``[0, lengths[r])``; a row is shortened by lowering its length (the template rewrote
    history) and re-filled from there. Forward calls either feed one row several tokens
    (:meth:`HFSampler.prefill_row`) or rows ``[0, n)`` one token each at their own column
    (:meth:`HFSampler.decode_rows`); the attention mask (built by the sampler) hides every
    column at or beyond a row's length. Capacity grows by 1.25x in chunks of 64 columns
    (one copy), never shrinks.

    Source: transformers ``Cache`` / ``CacheLayerMixin`` (the layer ``update`` protocol);
    the row layout of :class:`agentrl.model.KVCache`.
    """

    def __init__(self, n_layers: int, max_rows: int, chunk: int = 64):
        self.max_rows = int(max_rows)
        self.chunk = int(chunk)
        self.capacity = self.chunk
        self.lengths = [0] * self.max_rows
        self.plan_rows = self.plan_n = self.plan_span = 0
        self.plan_start = None
        self.plan_index = None
        super().__init__(layers=[RowLayer(self) for _ in range(n_layers)])

    def reserve(self, columns: int) -> None:
        """Make room for ``columns`` positions per row (grows by >= 1.25x, in chunks)."""
        if columns > self.capacity:
            want = max(columns, int(self.capacity * 1.25))
            self.capacity = -(-want // self.chunk) * self.chunk

    def move_row(self, src: int, dst: int) -> None:
        """Copy row ``src`` (its ``lengths[src]`` columns) into row ``dst``."""
        n = self.lengths[src]
        for layer in self.layers:
            layer.move_row(src, dst, n)
        self.lengths[dst] = n
