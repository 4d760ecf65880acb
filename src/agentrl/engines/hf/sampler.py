"""L4: sample one assistant turn per episode from prompt **ids** with a Hugging Face causal LM.

Token-in/token-out: prompts are token ids (never text); the sampler returns the ids it drew and
each one's log-prob under the declared :class:`~agentrl.record.SamplingSpec`. Prompts of a batch
are left-padded; ``position_ids`` count real tokens only and padding is masked, so a padded row
computes the same log-probs as the prompt alone (to fp32 rounding). One KV cache per call;
rows leave it as they finish.

Sampling is per-episode reproducible: each episode may bring its own ``torch.Generator``, which
supplies exactly one uniform number per sampled token (inverse-CDF sampling), so an episode
consumes the same random numbers whether it is sampled alone or in a batch, and draws the same
ids unless a draw lands within fp32 rounding of a CDF boundary (the batched logits differ from
the single-row ones by ~1e-7; with a peaked distribution this is rare, with the near-uniform
distribution of a random test model it happens for a few tokens per thousand, and then an
adjacent token is drawn). The log-probs of the same ids agree to ~1e-6 either way.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from ...record import SamplingSpec
from ...sampling import PenaltyContext, processed_logp
from ...sampling import draw as _draw
from .models import forward_kwargs, require_transformers

__all__ = ['SampledTurn', 'HFSampler', 'processed_log_probs', 'draw']


@dataclass
class SampledTurn:
    """One sampled assistant turn.

    Attributes:
        ids: sampled token ids, in order; the end-of-turn token is the last one when the turn
            stopped on it (it was sampled, so it is policy-owned and kept).
        logp: ``len(ids)`` float sampling log-probs (nats) under the sampler's spec
            (``processed`` mode: after temperature and truncation, renormalised).
        truncated: True when the turn was cut at its token budget (``max_new_tokens`` or the
            context limit): then ``ids`` holds no end-of-turn token.
        prompt_len: number of prompt ids the turn was sampled after.

    Source: book chapter 5.8 ("Problem: stop-token handling": keep the sampled stop token; a turn
    cut at the limit stays unterminated).
    """
    ids: list = field(default_factory=list)
    logp: list = field(default_factory=list)
    truncated: bool = False
    prompt_len: int = 0


def processed_log_probs(logits: torch.Tensor, spec: SamplingSpec, context: PenaltyContext | None = None) -> torch.Tensor:
    """Log-probs of the distribution the sampler draws from: :func:`agentrl.sampling.processed_logp`.

    Args:
        logits: ``[N, V]`` float logits of the positions to sample.
        spec: the sampler (penalties, temperature, then top-k / top-p / min-p, renormalised).
        context: the rows' :class:`~agentrl.sampling.PenaltyContext` when ``spec`` has penalties.

    Returns:
        ``[N, V]`` float64 log-probs; ``-inf`` outside the support.
    """
    return processed_logp(logits, spec, context)


def draw(logp: torch.Tensor, uniforms: torch.Tensor) -> torch.Tensor:
    """Inverse-CDF sampling from log-probs: :func:`agentrl.sampling.draw` on ``exp(logp)``.

    Args:
        logp: ``[N, V]`` float64 log-probs (``-inf`` allowed).
        uniforms: ``[N]`` float64 in ``[0, 1)``.

    Returns:
        ``[N]`` int64 (a token of probability 0 is never returned).

    Raises:
        ValueError: a row with no distribution (NaN, inf, or every entry -inf).
    """
    return _draw(logp.exp(), uniforms, caller='draw')


class HFSampler:
    """Sample assistant turns from a Hugging Face causal LM, token-in/token-out.

    Args:
        model: a transformers causal LM (``model(input_ids, attention_mask, position_ids, ...)
            .logits``), in eval mode, on any device.
        stop_ids: end-of-turn token ids (``ChatTemplate.stop_ids``; Qwen3: ``{151645}``
            ``<|im_end|>``); an empty set samples until the budget.
        spec: the declared :class:`~agentrl.record.SamplingSpec` (temperature, top_k, top_p,
            min_p, ``logp_mode``, repetition / presence / frequency penalties, which act on the
            turn's prompt and the ids sampled so far). The draw is always from the processed
            distribution; the stored log-prob follows ``spec.logp_mode``.
        max_new_tokens: default token budget of a turn.
        pad_id: id written into padding (masked; default the model config's ``pad_token_id``, else 0).
        cache: True (default): one prefill and one token per step with a KV cache; False: the
            reference path that recomputes the whole left-padded batch every step.

    Attributes:
        model, stop_ids, spec, max_new_tokens, pad_id, cache.
        forward_calls, tokens_generated: counters over the sampler's life.

    Raises:
        ValueError: ``max_new_tokens < 1``.

    Example:
        >>> sampler = HFSampler(model, template.stop_ids, SamplingSpec(temperature=0.7, top_p=0.9))
        >>> turn = sampler.sample([prompt_ids], [torch.Generator().manual_seed(0)])[0]
        >>> turn.ids[-1] in template.stop_ids or turn.truncated
        True

    Source: issue 5, item 1; book chapter 5.4 (token-in/token-out) and 5.8 (stop tokens are
    sampled and kept).
    """

    def __init__(self, model, stop_ids=(), spec: SamplingSpec | None = None, *, max_new_tokens: int = 256,
                 pad_id: int | None = None, cache: bool = True):
        if max_new_tokens < 1:
            raise ValueError(f'HFSampler: max_new_tokens must be >= 1, got {max_new_tokens}')
        self.model = model
        self.stop_ids = frozenset(int(i) for i in stop_ids)
        self.spec = spec if spec is not None else SamplingSpec()
        self.max_new_tokens = int(max_new_tokens)
        if pad_id is None:
            pad_id = getattr(getattr(model, 'config', None), 'pad_token_id', None)
        self.pad_id = int(pad_id) if pad_id is not None else 0
        self.cache = bool(cache)
        self._kw = forward_kwargs(model)
        self.forward_calls = 0
        self.tokens_generated = 0

    # ------------------------------------------------------------------ model calls
    @property
    def device(self) -> torch.device:
        """The device of the model's parameters."""
        p = next(self.model.parameters(), None)
        return p.device if p is not None else torch.device('cpu')

    def _new_cache(self):
        DynamicCache = require_transformers('HFSampler').DynamicCache
        try:
            return DynamicCache(config=self.model.config)
        except TypeError:  # pragma: no cover - transformers < 4.56
            return DynamicCache()

    def _last_logits(self, ids, mask, pos, cache=None) -> torch.Tensor:
        """``[B, V]`` float32 logits of the last position of each row."""
        kwargs = {'input_ids': ids, 'attention_mask': mask, 'position_ids': pos, 'use_cache': cache is not None}
        if cache is not None:
            if self._kw['cache'] is None:
                raise ValueError('HFSampler: the model takes no KV cache argument; use cache=False')
            kwargs[self._kw['cache']] = cache
        if self._kw['keep']:
            kwargs[self._kw['keep']] = 1
        self.forward_calls += 1
        out = self.model(**kwargs)
        return out.logits[:, -1].float()

    # ------------------------------------------------------------------ sampling
    def _choose(self, logits, rows, step, generators, teacher, prompts, out):
        """Pick the next token for each live row: ``(ids [n] int64, logp [n] float64)``.

        With penalties, row ``r``'s context is its prompt and its output the turn's ids so far
        (:class:`~agentrl.sampling.PenaltyContext`), as transformers and vLLM define them.
        """
        ctx = PenaltyContext.of([prompts[r] for r in rows], [out[r].ids for r in rows]) if self.spec.penalized else None
        lp = processed_log_probs(logits, self.spec, ctx)
        if teacher is not None:
            ids = torch.tensor([teacher[r][step] for r in rows], dtype=torch.long, device=lp.device)
        elif self.spec.temperature <= 0:
            ids = lp.argmax(dim=-1)
        else:
            u = torch.stack([torch.rand((), dtype=torch.float64, generator=generators[r]) if generators
                             and generators[r] is not None else torch.rand((), dtype=torch.float64) for r in rows])
            ids = draw(lp, u)
        if self.spec.logp_mode == 'raw' and self.spec.temperature > 0:
            lp = torch.log_softmax(logits.double(), dim=-1)
        return ids, lp.gather(-1, ids[:, None]).squeeze(-1)

    def _budgets(self, prompts, max_new_tokens, teacher):
        n = len(prompts)
        if max_new_tokens is None:
            budgets = [self.max_new_tokens] * n
        elif isinstance(max_new_tokens, int):
            budgets = [max_new_tokens] * n
        else:
            budgets = [int(b) for b in max_new_tokens]
            if len(budgets) != n:
                raise ValueError(f'sample: {len(budgets)} budgets for {n} prompts; pass one max_new_tokens per prompt')
        if teacher is not None:
            if len(teacher) != n:
                raise ValueError(f'sample: {len(teacher)} teacher rows for {n} prompts; pass one per prompt')
            budgets = [min(b, len(t)) for b, t in zip(budgets, teacher)]
        for i, b in enumerate(budgets):
            if b < 1:
                raise ValueError(f'sample: prompt {i} has a token budget of {b}; every turn needs at least one '
                                 'token (the episode is out of context: stop it as truncated before sampling)')
        return budgets

    @torch.no_grad()
    def sample(self, prompts, generators=None, *, max_new_tokens=None, teacher=None) -> list:
        """Sample one turn for each prompt (a batch of episodes).

        Args:
            prompts: B prompt id lists (``ChatRecorder.prompt_ids``), each non-empty.
            generators: None (torch's global RNG) or B ``torch.Generator`` objects (CPU), one per
                episode; each supplies one uniform number per sampled token.
            max_new_tokens: int or B ints, the token budget of each turn (default the
                sampler's); a turn that reaches it without an end-of-turn token is truncated.
            teacher: optional B id lists to score instead of sampling (teacher forcing through
                the same path: the returned log-probs are those of these ids; a row stops at an
                end-of-turn id or at the end of its list).

        Returns:
            B :class:`SampledTurn`, in prompt order.

        Raises:
            ValueError: an empty prompt, a budget below 1, or ``generators`` / ``teacher`` /
                budgets of another length than ``prompts``.

        Source: issue 5, item 1 (prompt ids in; sampled ids and processed log-probs out).
        """
        prompts = [p.tolist() if hasattr(p, 'tolist') else [int(i) for i in p] for p in prompts]
        if not prompts:
            return []
        for i, p in enumerate(prompts):
            if not p:
                raise ValueError(f'sample: prompt {i} is empty; pass the ids the template renders')
        if generators is not None and len(generators) != len(prompts):
            raise ValueError(f'sample: {len(generators)} generators for {len(prompts)} prompts; pass one per episode')
        budgets = self._budgets(prompts, max_new_tokens, teacher)
        out = [SampledTurn(prompt_len=len(p)) for p in prompts]
        if self.cache:
            self._sample_cached(prompts, budgets, generators, teacher, out)
        else:
            self._sample_recompute(prompts, budgets, generators, teacher, out)
        for t in out:
            t.truncated = not (t.ids and t.ids[-1] in self.stop_ids)
            self.tokens_generated += len(t.ids)
        return out

    def _left_pad(self, rows):
        """Left-pad id lists: ``(ids [B, L], attention_mask [B, L], position_ids [B, L])`` on the model's device."""
        L = max(len(r) for r in rows)
        ids = torch.full((len(rows), L), self.pad_id, dtype=torch.long)
        mask = torch.zeros((len(rows), L), dtype=torch.long)
        for b, r in enumerate(rows):
            ids[b, L - len(r):] = torch.tensor(r, dtype=torch.long)
            mask[b, L - len(r):] = 1
        pos = (mask.cumsum(-1) - 1).clamp(min=0)
        dev = self.device
        return ids.to(dev), mask.to(dev), pos.to(dev)

    def _record(self, out, rows, step, ids, logp, budgets):
        """Append the chosen tokens; return the mask of rows that go on."""
        ids_l, lp_l = ids.tolist(), logp.tolist()
        go = []
        for r, i, lp in zip(rows, ids_l, lp_l):
            out[r].ids.append(i)
            out[r].logp.append(lp)
            go.append(i not in self.stop_ids and step + 1 < budgets[r])
        return go

    def _sample_cached(self, prompts, budgets, generators, teacher, out):
        ids, mask, pos = self._left_pad(prompts)
        cache = self._new_cache()
        logits = self._last_logits(ids, mask, pos, cache)
        rows = list(range(len(prompts)))
        lengths = torch.tensor([len(p) for p in prompts], dtype=torch.long, device=mask.device)
        step = 0
        while True:
            nxt, logp = self._choose(logits, rows, step, generators, teacher, prompts, out)
            go = self._record(out, rows, step, nxt, logp, budgets)
            if not any(go):
                return
            if not all(go):
                keep = torch.tensor([i for i, g in enumerate(go) if g], dtype=torch.long, device=mask.device)
                cache.batch_select_indices(keep)
                mask, lengths, nxt = mask[keep], lengths[keep], nxt[keep]
                rows = [r for r, g in zip(rows, go) if g]
            mask = torch.cat([mask, torch.ones_like(mask[:, :1])], dim=1)
            logits = self._last_logits(nxt[:, None].to(mask.device), mask, lengths[:, None], cache)
            lengths = lengths + 1
            step += 1

    def _sample_recompute(self, prompts, budgets, generators, teacher, out):
        rows = list(range(len(prompts)))
        step = 0
        while rows:
            ids, mask, pos = self._left_pad([prompts[r] + out[r].ids for r in rows])
            logits = self._last_logits(ids, mask, pos)
            nxt, logp = self._choose(logits, rows, step, generators, teacher, prompts, out)
            go = self._record(out, rows, step, nxt, logp, budgets)
            rows = [r for r, g in zip(rows, go) if g]
            step += 1
