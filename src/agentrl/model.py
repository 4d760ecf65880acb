"""L1: TinyAgent, a small causal transformer, and the two functions every rollout needs.

Source: book chapter 3 (the book's TinyAgent): d_model 64,
learned positions, causal attention, 256-position default context, fp32 throughout.
The ragged cache is :mod:`agentrl.kv_cache`; checkpoints are :mod:`agentrl.checkpoint`.
"""
from __future__ import annotations

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from .kv_cache import KVCache, Plan, fill_holes
from .record import SamplingSpec
from .sampling import sample, token_logp

__all__ = ['TinyAgent', 'KVCache', 'fill_holes', 'sequence_log_probs', 'sample_next', 'segment_pieces',
           'segment_attention']

def segment_pieces(position_ids: torch.Tensor) -> list[list[tuple[int, int, bool]]]:
    """Cut packed rows into the spans that attend (records) and the spans that do not, from their positions.

    Args:
        position_ids: ``[R, N]`` int64, restarting at 0 at each record (:func:`agentrl.packing.collate_packed`);
            column 0 always starts a segment.

    Returns:
        per row, ``(start, end, attend)`` pieces covering ``0..N`` in order: ``attend`` True for a
        segment of >= 2 tokens (causal attention inside it), False for a run of 1-token segments
        (padding, 1-token records), whose attention output is their own value vector exactly.
    """
    starts = (position_ids.detach().cpu() == 0).numpy()
    starts[:, :1] = True
    N = starts.shape[1]
    out = []
    for row in starts:
        s = np.flatnonzero(row)
        e = np.append(s[1:], N)
        keep = (e - s) >= 2
        pieces, cur = [], 0
        for a, b in zip(s[keep].tolist(), e[keep].tolist()):
            if a > cur:
                pieces.append((cur, a, False))
            pieces.append((a, b, True))
            cur = b
        if cur < N:
            pieces.append((cur, N, False))
        out.append(pieces)
    return out


def segment_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, pieces, scale: float | None = None,
                      dropout: float = 0.0) -> torch.Tensor:
    """Causal attention inside each packed record (varlen), one causal sdpa call per segment.

    Args:
        q: ``[R, H, N, Dh]``; k, v: ``[R, Hkv, N, Dh]`` with ``H`` a multiple of ``Hkv`` (GQA).
        pieces: :func:`segment_pieces` of the rows' position ids.
        scale: softmax scale (None: ``Dh ** -0.5``). dropout: attention dropout probability.

    Returns:
        ``[R, H, N, Dh]``, equal to dense sdpa with the block-diagonal causal mask of
        :func:`agentrl.packing.document_mask` to fp32 rounding, at the cost of ``sum(len_i ** 2)``
        instead of ``N ** 2`` per row and with sdpa's ``is_causal`` fast path. Differentiable.
    """
    rep = q.shape[1] // k.shape[1]
    rows = []
    for r, row in enumerate(pieces):
        parts = [F.scaled_dot_product_attention(q[r:r + 1, :, a:b], k[r:r + 1, :, a:b], v[r:r + 1, :, a:b],
                                                dropout_p=dropout, is_causal=True, scale=scale, enable_gqa=rep > 1)
                 if attend else v[r:r + 1, :, a:b].repeat_interleave(rep, 1) for a, b, attend in row]
        rows.append(parts[0] if len(parts) == 1 else torch.cat(parts, 2))
    return torch.cat(rows)


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

    def attend(self, x, past=None, mask=None, pieces=None):
        """x [B, t, D]; past = (k, v) [B, H, s, Dh] or None; mask [B, 1, t, t] bool or None; pieces
        (:func:`segment_pieces`, packed rows) or None -> (out [B, t, D], (k, v) incl. x)."""
        B, t, D = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(B, t, 3, self.n_heads, D // self.n_heads).permute(2, 0, 3, 1, 4)
        if past is not None:
            k, v = torch.cat([past[0], k], dim=2), torch.cat([past[1], v], dim=2)
        if pieces is not None:
            y = segment_attention(q, k, v, pieces)
        elif mask is not None:
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        elif past is None or t > 1:
            s = k.shape[2] - t                      # cached positions before the new ones
            mask = torch.ones(t, s + t, dtype=torch.bool, device=x.device).tril(s)
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        else:
            y = F.scaled_dot_product_attention(q, k, v)
        return self.proj(y.transpose(1, 2).reshape(B, t, D)), (k, v)

    def forward(self, x, past=None, mask=None, pieces=None):
        a, kv = self.attend(x, past, mask, pieces)
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
        H, B, Dh = self.n_heads, K.shape[0], D // self.n_heads
        h = F.layer_norm(x, (D,), self.ln1.weight, self.ln1.bias, self.ln1.eps)
        q, k, v = F.linear(h, self.qkv.weight, self.qkv.bias).view(N, 3, H, Dh).unbind(1)   # [N, H, Dh]
        K.view(-1, Dh).index_copy_(0, plan.slots, k.reshape(N * H, Dh))    # one row copy per head
        V.view(-1, Dh).index_copy_(0, plan.slots, v.reshape(N * H, Dh))
        # one query per row (the last new token): a batched matrix-vector product over the cache
        scores = torch.matmul((q[:B] * self.scale)[:, :, None], K.transpose(-1, -2))      # [B, H, 1, S]
        scores.add_(plan.last_mask)
        y = torch.matmul(torch.softmax(scores, dim=-1), V).view(B, D)
        if N > B:             # the other new tokens of rows that got several: padded causal block
            rows = plan.extra_rows
            Ks, Vs = (K, V) if rows is None else (K.index_select(0, rows), V.index_select(0, rows))
            qrow, qoff = plan.extra_query_row, plan.extra_query_offset
            qp = q.new_zeros(Ks.shape[0], plan.extra_width, H, Dh)
            qp[qrow, qoff] = q[B:] * self.scale
            scores = torch.matmul(qp.transpose(1, 2), Ks.transpose(-1, -2)).add_(plan.extra_mask)  # [Q, H, t-1, S]
            ye = torch.matmul(torch.softmax(scores, dim=-1), Vs)                                     # [Q, H, t-1, Dh]
            y = torch.cat([y, ye.transpose(1, 2)[qrow, qoff].reshape(N - B, D)])
        return F.linear(y, self.proj.weight, self.proj.bias)

    def mlp_cached(self, x):
        """``ln2`` then the MLP of ``x [N, D]`` with functional calls (same arithmetic as ``self.mlp``)."""
        fc1, fc2 = self.mlp[0], self.mlp[2]
        h = F.layer_norm(x, (x.shape[-1],), self.ln2.weight, self.ln2.bias, self.ln2.eps)
        return F.linear(F.gelu(F.linear(h, fc1.weight, fc1.bias)), fc2.weight, fc2.bias)


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
        """Logits of packed rows: per-record positions, causal attention inside each record (segment_attention)."""
        if past is not None or position_ids.shape != ids.shape:
            raise ValueError(f'TinyAgent: position_ids {tuple(position_ids.shape)} must match ids {tuple(ids.shape)} '
                             'and cannot be combined with past')
        top = int(position_ids.max()) if position_ids.numel() else 0
        if top >= self.max_len:
            raise ValueError(f'sequence length {top + 1} exceeds TinyAgent.max_len={self.max_len}; '
                             'build the model with a larger max_len or cap the episode length')
        x = self.tok_emb(ids) + self.pos_emb(position_ids)
        pieces = segment_pieces(position_ids)          # the records of agentrl.packing.document_mask
        for block in self.blocks:
            x, _ = block(x, None, pieces=pieces)
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
        t = ids.shape[1]
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
        plan = Plan.build(cache, ids, n_new, ends, self.blocks[0].n_heads, self.head.weight.dtype)
        x = F.embedding(plan.token_ids, self.tok_emb.weight) + F.embedding(plan.positions, self.pos_emb.weight)
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

    Sampling is docs/design.md#sampling's draw (:func:`agentrl.sampling.draw`, ``torch.rand(B)`` from
    ``generator``). It samples the
    same categorical distribution as ``torch.multinomial`` (which draws one exponential per
    vocabulary entry, V times as many random numbers: at ``[256, 316]`` it took 1.9 ms against
    0.25 ms here); a token of probability 0 is never drawn.

    Raises:
        ValueError: logits not 2-D; both ``generator`` and ``generators``, or ``generators`` not
            one per row; a row with no distribution (NaN or inf logits, or all -inf).
    """
    spec = SamplingSpec(temperature=max(float(temperature), 0.0))
    return sample(logits, spec, generator=generator, generators=generators, caller='sample_next')
