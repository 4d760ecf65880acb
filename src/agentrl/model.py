"""L1: TinyAgent, a small causal transformer, and the two functions every rollout needs.

Source: book chapter 3 (the book's TinyAgent): d_model 64,
learned positions, causal attention, 256-position default context, fp32 throughout.
"""
from __future__ import annotations

import os

import torch
import torch.nn as nn
import torch.nn.functional as F

from .record import SamplingSpec
from .sampling import draw, sample, token_logp

__all__ = ['TinyAgent', 'KVCache', 'fill_holes', 'locate', 'sequence_log_probs', 'sample_next', 'save_checkpoint',
           'load_checkpoint']


class _Block(nn.Module):
    """Pre-LayerNorm transformer block: causal self-attention and a GELU MLP."""

    def __init__(self, d_model: int, n_heads: int):
        super().__init__()
        self.n_heads = n_heads
        self.scale = (d_model // n_heads) ** -0.5
        self.ln1 = nn.LayerNorm(d_model)
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.proj = nn.Linear(d_model, d_model)
        self.ln2 = nn.LayerNorm(d_model)
        self.mlp = nn.Sequential(nn.Linear(d_model, 4 * d_model), nn.GELU(), nn.Linear(4 * d_model, d_model))

    def attend(self, x, past=None, mask=None):
        """x [B, t, D]; past = (k, v) [B, H, s, Dh] or None; mask [B, 1, t, t] bool (packed rows) or None
        -> (out [B, t, D], (k, v) incl. x)."""
        B, t, D = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(B, t, 3, self.n_heads, D // self.n_heads).permute(2, 0, 3, 1, 4)
        if past is not None:
            k, v = torch.cat([past[0], k], dim=2), torch.cat([past[1], v], dim=2)
        if mask is not None:
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        elif past is None or t > 1:
            s = k.shape[2] - t                      # cached positions before the new ones
            mask = torch.ones(t, s + t, dtype=torch.bool, device=x.device).tril(s)
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        else:
            y = F.scaled_dot_product_attention(q, k, v)
        return self.proj(y.transpose(1, 2).reshape(B, t, D)), (k, v)

    def forward(self, x, past=None, mask=None):
        a, kv = self.attend(x, past, mask)
        x = x + a
        return x + self.mlp(self.ln2(x)), kv

    def attend_cached(self, x, K, V, plan):
        """Attention of packed new tokens against a ragged cache, writing their keys in place.

        x ``[N, D]``: the last new token of each of the B rows, then the other new tokens;
        K, V ``[B, H, S, Dh]`` this block's cache (contiguous); ``plan`` from
        :meth:`TinyAgent.extend`. Returns ``[N, D]``. Functional calls on the block's own weights
        (the same arithmetic as :meth:`attend`, without nn.Module call overhead: a decode step is
        a few dozen tiny ops).
        """
        N, D = x.shape
        H, B, S, Dh = self.n_heads, K.shape[0], K.shape[2], D // self.n_heads
        h = F.layer_norm(x, (D,), self.ln1.weight, self.ln1.bias, self.ln1.eps)
        q, k, v = F.linear(h, self.qkv.weight, self.qkv.bias).view(N, 3, H, Dh).unbind(1)   # [N, H, Dh]
        K.view(-1, Dh).index_copy_(0, plan.slot, k.reshape(N * H, Dh))    # one row copy per head
        V.view(-1, Dh).index_copy_(0, plan.slot, v.reshape(N * H, Dh))
        # one query per row (the last new token): a batched matrix-vector product over the cache
        scores = torch.matmul((q[:B] * self.scale)[:, :, None], K.transpose(-1, -2)).add_(plan.mask)  # [B, H, 1, S]
        y = torch.matmul(torch.softmax(scores, dim=-1), V).view(B, D)
        if N > B:             # the other new tokens of rows that got several: padded causal block
            Ks, Vs = (K, V) if plan.sel is None else (K.index_select(0, plan.sel), V.index_select(0, plan.sel))
            Q, te = Ks.shape[0], plan.te
            qp = q.new_zeros(Q, te, H, Dh)
            qp[plan.qr, plan.qj] = q[B:] * self.scale
            scores = torch.matmul(qp.transpose(1, 2), Ks.transpose(-1, -2)).add_(plan.emask)   # [Q, H, te, S]
            ye = torch.matmul(torch.softmax(scores, dim=-1), Vs)                                # [Q, H, te, Dh]
            y = torch.cat([y, ye.transpose(1, 2)[plan.qr, plan.qj].reshape(N - B, D)])
        return F.linear(y, self.proj.weight, self.proj.bias)

    def mlp_cached(self, x):
        """``ln2`` then the MLP of ``x [N, D]`` with functional calls (same arithmetic as ``self.mlp``)."""
        fc1, fc2 = self.mlp[0], self.mlp[2]
        h = F.layer_norm(x, (x.shape[-1],), self.ln2.weight, self.ln2.bias, self.ln2.eps)
        return F.linear(F.gelu(F.linear(h, fc1.weight, fc1.bias)), fc2.weight, fc2.bias)


class KVCache:
    """Incremental key/value cache of a :class:`TinyAgent` for a batch of ragged rows.

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


class _Plan:
    """Index plan of one :meth:`TinyAgent.extend` call, shared by every block.

    pos: position of each packed new token; slot: ``[N * H]`` rows of the flattened
    ``[B * H * S, Dh]`` cache its keys and values go to; mask: additive ``[B, 1, 1, S]`` mask of
    the last-token queries; for the other new tokens: sel (the rows that have them, or None for every row), qr,
    qj (each token's query row and offset), te (padded count), emask (additive ``[Q, 1, te, S]``
    causal mask).
    """
    __slots__ = ('pos', 'slot', 'mask', 'sel', 'qr', 'qj', 'te', 'emask')


class TinyAgent(nn.Module):
    """A causal decoder over a word-level vocabulary: ids ``[B, T]`` -> logits ``[B, T, V]``.

    Args:
        vocab_size: V, number of token ids (316 for the BugFix gym).
        max_len: context length in positions (default 256). Longer inputs raise.
        d_model: width (64). n_layers: blocks (2). n_heads: attention heads (4).

    Architecture: token embedding (V x 64) + learned position embedding (max_len x 64),
    2 pre-LN blocks with 4-head causal attention and a 64->256->64 GELU MLP, final LayerNorm,
    untied head 64 -> V. Weights N(0, 0.02), biases 0, no dropout; about 0.11 M parameters.
    At initialisation the next-token distribution is close to uniform. Right padding never
    changes real positions (causal attention).

    Source: book chapter 3 (the book's TinyAgent).
    """

    def __init__(self, vocab_size: int, max_len: int = 256, d_model: int = 64, n_layers: int = 2,
                 n_heads: int = 4):
        super().__init__()
        if vocab_size < 1 or max_len < 2:
            raise ValueError(f'TinyAgent needs vocab_size >= 1 and max_len >= 2, got {vocab_size}, {max_len}')
        self.vocab_size, self.max_len, self.d_model = vocab_size, max_len, d_model
        self.tok_emb = nn.Embedding(vocab_size, d_model)
        self.pos_emb = nn.Embedding(max_len, d_model)
        self.blocks = nn.ModuleList(_Block(d_model, n_heads) for _ in range(n_layers))
        self.ln_f = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, vocab_size)
        for m in self.modules():
            if isinstance(m, (nn.Linear, nn.Embedding)):
                nn.init.normal_(m.weight, std=0.02)
            if isinstance(m, nn.Linear):
                nn.init.zeros_(m.bias)

    def config(self) -> dict:
        """Constructor arguments, enough to rebuild the model (used by checkpoints)."""
        return dict(vocab_size=self.vocab_size, max_len=self.max_len, d_model=self.d_model,
                    n_layers=len(self.blocks), n_heads=self.blocks[0].n_heads)

    def forward(self, ids: torch.Tensor, past=None, start: int = 0, position_ids: torch.Tensor | None = None):
        """Logits of the next token at every position.

        Args:
            ids: ``[B, T]`` int64 token ids (right padding is harmless).
            past: optional KV cache from a previous call (list of (k, v) per block); when given,
                ``ids`` are the new tokens at positions ``start .. start+T-1`` and the call
                returns ``(logits, new_past)``.
            start: absolute position of ``ids[:, 0]`` (only with ``past``).
            position_ids: ``[B, T]`` int64 for packed rows (:func:`agentrl.packing.collate_packed`):
                a record starts wherever it is 0, and attention stays inside each record
                (the mask of :func:`agentrl.packing.document_mask`), so each record scores as if alone.
                Not with ``past``.

        Returns:
            ``[B, T, V]`` float32 logits (and the updated cache when ``past`` is not None).

        Raises:
            ValueError: ``ids`` is not 2-D, ``start + T > max_len`` or a position id >= ``max_len``
                (the fix: a model with a larger ``max_len`` or a shorter episode), ``position_ids``
                of another shape than ``ids`` or together with ``past``.
        """
        if ids.dim() != 2:
            raise ValueError(f'TinyAgent expects ids of shape [B, T], got {tuple(ids.shape)}')
        T = ids.shape[1]
        if position_ids is not None:
            return self._forward_packed(ids, position_ids, past)
        if start + T > self.max_len:
            raise ValueError(f'sequence length {start + T} exceeds TinyAgent.max_len={self.max_len}; '
                             'build the model with a larger max_len or cap the episode length')
        x = self.tok_emb(ids) + self.pos_emb(torch.arange(start, start + T, device=ids.device))
        new_past = []
        for i, block in enumerate(self.blocks):
            x, kv = block(x, None if past is None else past[i])
            new_past.append(kv)
        logits = self.head(self.ln_f(x))
        return logits if past is None else (logits, new_past)

    def _forward_packed(self, ids, position_ids, past):
        """Logits of packed rows: per-record positions, attention masked to each record."""
        if past is not None or position_ids.shape != ids.shape:
            raise ValueError(f'TinyAgent: position_ids {tuple(position_ids.shape)} must match ids {tuple(ids.shape)} '
                             'and cannot be combined with past')
        top = int(position_ids.max()) if position_ids.numel() else 0
        if top >= self.max_len:
            raise ValueError(f'sequence length {top + 1} exceeds TinyAgent.max_len={self.max_len}; '
                             'build the model with a larger max_len or cap the episode length')
        x = self.tok_emb(ids) + self.pos_emb(position_ids)
        seg = torch.cumsum((position_ids == 0).long(), dim=1)         # as agentrl.packing.document_mask
        causal = torch.ones(ids.shape[1], ids.shape[1], dtype=torch.bool, device=ids.device).tril()
        mask = ((seg[:, :, None] == seg[:, None, :]) & causal)[:, None]
        for block in self.blocks:
            x, _ = block(x, None, mask)
        return self.head(self.ln_f(x))

    def new_cache(self, batch: int, chunk: int = 16) -> KVCache:
        """An empty :class:`KVCache` for ``batch`` rows (part of the cache interface of rollouts).

        Args:
            batch: number of rows B.
            chunk: the capacity is rounded up to a multiple of this many positions.

        Returns:
            :class:`KVCache` with B rows of length 0, in the model's dtype and device.
        """
        p = self.head.weight
        return KVCache(len(self.blocks), batch, self.blocks[0].n_heads, self.d_model // self.blocks[0].n_heads,
                       self.max_len, dtype=p.dtype, device=p.device, chunk=chunk)

    def extend(self, cache: KVCache, ids: torch.Tensor, n_new: torch.Tensor | None = None) -> torch.Tensor:
        """Append new tokens to every row of ``cache`` and return the logits after each row's last one.

        Row ``b`` gets the tokens ``ids[b, :n_new[b]]`` at positions ``cache.lengths[b] ...``; the
        rest of the row is padding and is ignored. The keys and values are written into the cache
        (which grows as needed) and ``cache.lengths`` advances by ``n_new``. The result equals
        ``self(full_ids)[b, lengths[b] + n_new[b] - 1]`` for each row's full sequence to fp32
        rounding (about 1e-6), which is what rollouts sample from. Internally the last new token
        of each row is one query per row (a batched matrix-vector product over the cache) and the
        other new tokens (an observation being prefilled) form a padded causal block over only
        the rows that have them. This and :meth:`new_cache` are the cache interface rollouts
        detect (:func:`agentrl.rollouts.supports_kv_cache`).

        Args:
            cache: a :class:`KVCache` from :meth:`new_cache` with B rows.
            ids: ``[B, t]`` int64 new tokens, right-padded.
            n_new: ``[B]`` int64 real new tokens per row, each in ``[1, t]``; None means all ``t``.

        Returns:
            ``[B, V]`` float32 logits of the next token of every row.

        Raises:
            ValueError: ``ids`` not 2-D or its rows disagree with the cache; ``n_new`` outside
                ``[1, t]``; or a row would exceed ``max_len`` (build the model with a larger
                ``max_len`` or cap the episode length).
        """
        B = cache.batch_size
        if ids.dim() != 2 or ids.shape[0] != B:
            raise ValueError(f'TinyAgent.extend expects ids [B, t] with B = {B} cache rows, got {tuple(ids.shape)}')
        t, dev = ids.shape[1], ids.device
        lengths = cache.lengths
        if n_new is not None and t > 1:
            lo, hi = (int(v) for v in torch.aminmax(n_new)) if B else (1, t)
            if lo < 1 or hi > t:
                raise ValueError(f'TinyAgent.extend: n_new must be in [1, {t}] for every row, got {lo}..{hi}')
        else:
            n_new = None
        ends = lengths + (t if n_new is None else n_new)
        need = int(ends.max()) if B else 0
        if need > self.max_len:
            raise ValueError(f'sequence length {need} exceeds TinyAgent.max_len={self.max_len}; '
                             'build the model with a larger max_len or cap the episode length')
        cache.reserve(need)
        S, H, dtype = cache.capacity, self.blocks[0].n_heads, self.head.weight.dtype
        keys = torch.arange(S, device=dev)
        plan = _Plan()
        inf = torch.tensor(float('-inf'), dtype=dtype, device=dev)
        plan.mask = torch.where(keys >= ends[:, None, None, None], inf, 0.0)              # [B, 1, 1, S]
        rows = torch.arange(B, device=dev)
        last_ids = ids[:, t - 1] if n_new is None else ids[rows, n_new - 1]
        if t == 1:
            crow, plan.pos, tok_ids = rows, lengths, last_ids
        else:
            n = torch.full((B,), t, device=dev) if n_new is None else n_new
            extra = torch.arange(t - 1, device=dev) < (n - 1)[:, None]                # [B, t-1]
            er, ej = extra.nonzero(as_tuple=True)                                # [Ne] each
            has = extra[:, 0]
            if int(has.sum()) * 2 > B:          # most rows: attend over the whole cache, no copy
                plan.sel, plan.qr, qlen = None, er, lengths
            else:                               # a few rows: gather their cache rows
                plan.sel = has.nonzero().squeeze(1)
                plan.qr, qlen = (has.long().cumsum(0) - 1)[er], lengths[plan.sel]
            plan.qj, plan.te = ej, t - 1
            qpos = qlen[:, None] + torch.arange(t - 1, device=dev)                  # [Q, te]
            plan.emask = torch.where(keys > qpos[:, None, :, None], inf, 0.0)       # [Q, 1, te, S]
            crow = torch.cat([rows, er])
            plan.pos = torch.cat([ends - 1, lengths[er] + ej])
            tok_ids = torch.cat([last_ids, ids[er, ej]])
        plan.slot = ((crow[:, None] * H + torch.arange(H, device=dev)) * S + plan.pos[:, None]).view(-1)
        x = F.embedding(tok_ids, self.tok_emb.weight) + F.embedding(plan.pos, self.pos_emb.weight)   # [N, D]
        for i, block in enumerate(self.blocks):
            x = x + block.attend_cached(x, cache.k[i], cache.v[i], plan)
            x = x + block.mlp_cached(x)
        cache.lengths = ends
        ln = self.ln_f
        return F.linear(F.layer_norm(x[:B], (self.d_model,), ln.weight, ln.bias, ln.eps), self.head.weight,
                        self.head.bias)


def sequence_log_probs(model: nn.Module, ids: torch.Tensor) -> torch.Tensor:
    """Log-probability of each predicted token ``ids[:, 1:]`` given its prefix (temperature 1).

    Args:
        model: maps ids ``[B, T]`` to logits ``[B, T, V]``.
        ids: ``[B, T]`` int64.

    Returns:
        ``[B, T-1]`` float32 nats; column j scores token j+1 (the convention of ``action_mask``
        and ``sample_logp``). Works with and without gradients. Source: book chapter 3.4; the
        gather is :func:`agentrl.sampling.token_logp`.
    """
    return token_logp(model, ids)


def sample_next(logits: torch.Tensor, temperature: float = 1.0, generator: torch.Generator | None = None,
                generators=None):
    """Sample one token per row at a temperature (the book's name for :func:`agentrl.sampling.sample`).

    Args:
        logits: ``[B, V]`` float logits of the last position.
        temperature: softmax temperature > 0; ``<= 0`` means greedy (argmax), whose returned
            log-prob is that of the argmax at temperature 1.
        generator: optional ``torch.Generator`` for reproducible draws.
        generators: instead of ``generator``, one ``torch.Generator`` per row: row ``b`` draws its
            uniform from ``generators[b]``, exactly as ``sample_next(logits[b:b+1], T, generators[b])``
            would (one batched sampling for rows that keep their own random streams).

    Returns:
        ``(ids [B] int64, logp [B] float32)`` with ``logp = log(softmax(logits / T)[ids])`` (equal
        to ``log_softmax`` to about 1e-7), the log-prob a trainer recomputes with
        :func:`sequence_log_probs` at T = 1.

    Sampling is by inversion: one uniform draw per row (``torch.rand(B)`` from ``generator``)
    located in the row's cumulative distribution (:func:`agentrl.sampling.draw`). It samples the
    same categorical distribution as ``torch.multinomial`` (which draws one exponential per
    vocabulary entry, V times as many random numbers: at ``[256, 316]`` it took 1.9 ms against
    0.25 ms here); a token of probability 0 is never drawn.

    Raises:
        ValueError: logits not 2-D; both ``generator`` and ``generators``, or ``generators`` not
            one per row; a row with no distribution (NaN or inf logits, or all -inf).
    """
    spec = SamplingSpec(temperature=max(float(temperature), 0.0))
    return sample(logits, spec, generator=generator, generators=generators, caller='sample_next')


def locate(probs: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """Invert each row's CDF at ``u`` (the book's name for :func:`agentrl.sampling.draw`).

    Args:
        probs: ``[B, V]`` non-negative weights (rows need not sum to 1; at least one > 0).
        u: ``[B, 1]`` float64 uniforms in ``[0, 1)``.

    Returns:
        ``[B]`` int64 ids; a token of weight 0 is never returned (float64 CDF).

    Raises:
        ValueError: a row whose weights do not sum to a finite positive number.
    """
    return draw(probs, u, caller='sample_next')


def save_checkpoint(model: TinyAgent, path: str) -> None:
    """Save weights and config to ``path`` through :func:`agentrl.io.atomic_path` (never a half-written file).

    Raises:
        OSError: the write failed (full disk, read-only folder); no temporary file is left.
    """
    from .io import atomic_path
    with atomic_path(path) as tmp:
        torch.save({'config': model.config(), 'state_dict': model.state_dict()}, tmp)


#: Bounds on a checkpoint's config, checked before anything is allocated (TinyAgent is a toy:
#: the defaults are V=316, max_len=256, d_model=64, 2 layers, 4 heads, about 0.11 M parameters).
CHECKPOINT_BOUNDS = {'vocab_size': (1, 1 << 20), 'max_len': (2, 1 << 16), 'd_model': (1, 4096),
                     'n_layers': (1, 64), 'n_heads': (1, 256)}
#: Most parameters a checkpoint may declare (2**27 float32 = 512 MiB).
MAX_CHECKPOINT_PARAMS = 1 << 27


def _param_count(cfg: dict) -> int:
    """Parameters of ``TinyAgent(**cfg)`` without building it (embeddings, blocks, final norm, head)."""
    V, L, d, n = cfg['vocab_size'], cfg['max_len'], cfg['d_model'], cfg['n_layers']
    block = 2 * 2 * d + (3 * d * d + 3 * d) + (d * d + d) + (4 * d * d + 4 * d) + (4 * d * d + d)
    return V * d + L * d + n * block + 2 * d + (d * V + V)


def checkpoint_config(cfg, where: str = 'checkpoint') -> dict:
    """Validate and bound a TinyAgent config before anything is allocated.

    Args:
        cfg: the checkpoint's ``config`` dict (keys of :meth:`TinyAgent.config`; ``max_len``,
            ``d_model``, ``n_layers`` and ``n_heads`` default to the constructor's).
        where: how to name the checkpoint in errors (its path).

    Returns:
        the config as a dict of ints, every value within :data:`CHECKPOINT_BOUNDS`.

    Raises:
        ValueError: not a dict, an unknown key, a value that is not an int or out of bounds,
            ``d_model`` not divisible by ``n_heads``, or more than :data:`MAX_CHECKPOINT_PARAMS`
            parameters. Fix: save the model with :func:`save_checkpoint`.
    """
    fix = 'save the model with agentrl.model.save_checkpoint'
    if not isinstance(cfg, dict):
        raise ValueError(f'{where}: config is a {type(cfg).__name__}, not a dict; {fix}')
    unknown = sorted(map(str, set(cfg) - set(CHECKPOINT_BOUNDS)))
    if unknown:
        raise ValueError(f'{where}: config has unknown keys {unknown[:5]} (known: {", ".join(CHECKPOINT_BOUNDS)}); '
                         f'{fix}')
    defaults = {'max_len': 256, 'd_model': 64, 'n_layers': 2, 'n_heads': 4}
    if 'vocab_size' not in cfg:
        raise ValueError(f'{where}: config has no vocab_size; {fix}')
    out = {}
    for key, (lo, hi) in CHECKPOINT_BOUNDS.items():
        v = cfg.get(key, defaults.get(key))
        if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
            raise ValueError(f'{where}: config {key} is {v!r}, not an int in [{lo}, {hi}]; {fix}')
        out[key] = v
    if out['d_model'] % out['n_heads']:
        raise ValueError(f'{where}: config d_model {out["d_model"]} is not divisible by n_heads {out["n_heads"]}; '
                         f'{fix}')
    n = _param_count(out)
    if n > MAX_CHECKPOINT_PARAMS:
        raise ValueError(f'{where}: config asks for {n:,} parameters ({4 * n / 2**30:.1f} GiB), more than the '
                         f'{MAX_CHECKPOINT_PARAMS:,} a TinyAgent checkpoint may hold; {fix}')
    return out


def load_checkpoint(path: str) -> TinyAgent:
    """Load a TinyAgent saved by :func:`save_checkpoint`, or a plain dict of ``state_dict``,
    ``vocab_size`` and (optional, default 256) ``max_len``.

    The file is read with ``torch.load(weights_only=True)`` (no code runs); the config is
    validated and bounded (:func:`checkpoint_config`), and every weight's name and shape is
    compared with the config, before the model is allocated.

    Raises:
        FileNotFoundError: no file at ``path``.
        ValueError: the file is not an agentrl TinyAgent checkpoint, its config is malformed or
            out of bounds, or its weights do not fit the config (one line naming the file).
    """
    if not os.path.exists(path):
        raise FileNotFoundError(f'checkpoint {path!r} not found; pass the model.pt written by `agentrl train`')
    try:
        state = torch.load(path, map_location='cpu', weights_only=True)
    except Exception as e:   # not a torch file at all (text, truncated, another pickle)
        raise ValueError(f'{path!r} is not an agentrl TinyAgent checkpoint (torch.load failed: '
                         f'{type(e).__name__}); pass model.pt from `agentrl train` or `agentrl rollout`') from None
    if isinstance(state, dict) and 'config' in state and 'state_dict' in state:
        cfg = checkpoint_config(state['config'], repr(path))
    elif isinstance(state, dict) and 'state_dict' in state and 'vocab_size' in state:
        cfg = checkpoint_config({'vocab_size': state['vocab_size'], 'max_len': state.get('max_len', 256)}, repr(path))
    else:
        raise ValueError(f'{path!r} is not an agentrl TinyAgent checkpoint (expected keys config and state_dict, '
                         'or state_dict, vocab_size and max_len)')
    weights = state['state_dict']
    if not isinstance(weights, dict) or not all(torch.is_tensor(v) for v in weights.values()):
        raise ValueError(f'{path!r}: state_dict is not a dict of tensors; save the model with '
                         'agentrl.model.save_checkpoint')
    with torch.device('meta'):
        want = {k: tuple(v.shape) for k, v in TinyAgent(**cfg).state_dict().items()}
    missing = sorted(set(want) - set(weights))
    extra = sorted(map(str, set(weights) - set(want)))
    if missing or extra:
        raise ValueError(f'{path!r}: state_dict does not fit the config {cfg} (missing {missing[:3]}, '
                         f'unexpected {extra[:3]}); save the model with agentrl.model.save_checkpoint')
    for k, shape in want.items():
        if tuple(weights[k].shape) != shape:
            raise ValueError(f'{path!r}: weight {k} has shape {list(weights[k].shape)}, but the config {cfg} '
                             f'needs {list(shape)}; save the model with agentrl.model.save_checkpoint')
    model = TinyAgent(**cfg)
    model.load_state_dict(weights)
    return model.eval()
