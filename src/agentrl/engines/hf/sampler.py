"""L4: sample one assistant turn per episode from prompt **ids** with a Hugging Face causal LM.

Token-in/token-out: prompts are token ids (never text); the sampler returns the ids it drew and
each one's log-prob under the declared :class:`~agentrl.record.SamplingSpec`. Prompts of a batch
are left-padded; ``position_ids`` count real tokens only and padding is masked, so a padded row
computes the same log-probs as the prompt alone (to fp32 rounding). One KV cache per call;
rows leave it as they finish.

Across turns, :meth:`HFSampler.new_row_cache` gives a cache with one row per episode (a
transformers ``Cache`` whose layers keep ``[rows, kv_heads, capacity, head_dim]`` buffers, each
row with its own length, no padding): :meth:`HFSampler.prefill_row` feeds one row a bridge or a
prompt, :meth:`HFSampler.decode_rows` feeds every live row one token at its own position, and
the 4-D additive attention masks are built here and passed as ``attention_mask``, which
transformers' ``create_causal_mask`` returns as given (a prepared 4-D mask).
:func:`agentrl.engines.hf.run_chat_episodes` drives it.

Sampling is per-episode reproducible: each episode may bring its own ``torch.Generator``, which
supplies exactly one uniform number per sampled token (the draw of docs/design.md#sampling), so an episode
consumes the same random numbers whether it is sampled alone or in a batch, and draws the same
ids unless a draw lands within fp32 rounding of a CDF boundary (the batched logits differ from
the single-row ones by ~1e-7; with a peaked distribution this is rare, with the near-uniform
distribution of a random test model it happens for a few tokens per thousand, and then an
adjacent token is drawn). The log-probs of the same ids agree to ~1e-6 either way.
"""
from __future__ import annotations

import time

import torch

from ...batching import pad_rows
from ...constraints import mask_logits
from ...record import SamplingSpec
from ...sampling import PenaltyContext, Scratch, choose
from ...templates.chat import require_hf
from ..episode import SampledTurn  # noqa: F401 - its home is engines.episode (torch-free)
from .models import forward_kwargs
from .vlm import pixel_inputs, rope_positions

__all__ = ['SampledTurn', 'HFSampler', 'STAT_KEYS']

#: Counters of :attr:`HFSampler.stats` (``_s``: wall seconds).
STAT_KEYS = ('prefill_tokens', 'prefill_s', 'decode_tokens', 'decode_steps', 'decode_s', 'sample_s')


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
        tokenizer: the Hugging Face tokenizer of the ids; required when ``spec.constraint`` is set (the
            grammar's allowed tokens mask the logits of every step of a turn from the grammar's start: the first
            token, or after the reasoning close mark with ``constraint.start_after``; docs/grammar.md).
        image_processor: a vision-language model's image processor
            (:func:`agentrl.engines.hf.vlm.load_image_processor`); required to pass ``images`` to :meth:`sample`.

    Attributes:
        model, stop_ids, spec, max_new_tokens, pad_id, cache.
        forward_calls, tokens_generated: counters over the sampler's life.
        stats: :data:`STAT_KEYS` counters over the sampler's life: tokens fed in prompt forward
            passes and their seconds, tokens fed in decode steps (one per row and step), decode
            steps and their seconds, seconds spent choosing tokens.
        scratch: the :class:`~agentrl.sampling.Scratch` buffers :meth:`choose` reuses across steps.
        grammar: the compiled :class:`~agentrl.constraints.Grammar` (None until a constrained step;
            ``grammar.forced`` counts single-token supports).

    Raises:
        ValueError: ``max_new_tokens < 1``; a constraint without ``tokenizer``.

    Example:
        >>> sampler = HFSampler(model, template.stop_ids, SamplingSpec(temperature=0.7, top_p=0.9))
        >>> turn = sampler.sample([prompt_ids], [torch.Generator().manual_seed(0)])[0]
        >>> turn.ids[-1] in template.stop_ids or turn.truncated
        True

    Source: book chapter 5.4 (token-in/token-out) and 5.8 (stop tokens are
    sampled and kept).
    """

    def __init__(self, model, stop_ids=(), spec: SamplingSpec | None = None, *, max_new_tokens: int = 256,
                 pad_id: int | None = None, cache: bool = True, tokenizer=None, image_processor=None):
        if max_new_tokens < 1:
            raise ValueError(f'HFSampler: max_new_tokens must be >= 1, got {max_new_tokens}')
        if spec is not None and spec.constraint is not None and tokenizer is None:
            raise ValueError('HFSampler: the spec has a grammar constraint; pass tokenizer= (the tokenizer of the '
                             'ids, which the grammar compiles against)')
        self.tokenizer, self.grammar = tokenizer, None
        self.image_processor = image_processor
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
        self.stats = dict.fromkeys(STAT_KEYS, 0)
        self.scratch = Scratch()        # [2, rows, V] float64 sampling buffers (sampling.choose)
        self._on_token = None           # sample()'s streaming hook while a call runs

    # ------------------------------------------------------------------ model calls
    @property
    def device(self) -> torch.device:
        """The device of the model's parameters."""
        p = next(self.model.parameters(), None)
        return p.device if p is not None else torch.device('cpu')

    def _new_cache(self):
        DynamicCache = require_hf('HFSampler').DynamicCache
        try:
            return DynamicCache(config=self.model.config)
        except TypeError:  # pragma: no cover - transformers < 4.56
            return DynamicCache()

    def _last_logits(self, ids, mask, pos, cache=None) -> torch.Tensor:
        """``[B, V]`` logits of the last position of each row (float32; float64 for an fp64 model)."""
        kwargs = {'input_ids': ids, 'attention_mask': mask, 'position_ids': pos, 'use_cache': cache is not None}
        if cache is not None:
            if self._kw['cache'] is None:
                raise ValueError('HFSampler: the model takes no KV cache argument; use cache=False')
            kwargs[self._kw['cache']] = cache
        if self._kw['keep']:
            kwargs[self._kw['keep']] = 1
        self.forward_calls += 1
        out = self.model(**kwargs)
        logits = out.logits[:, -1]
        return logits if logits.dtype == torch.float64 else logits.float()

    # ------------------------------------------------------------------ sampling
    def _choose(self, logits, rows, step, generators, teacher, prompts, out):
        """Pick the next token for each live row: ``(ids [n] int64, logp [n] float64)``.

        With penalties, row ``r``'s context is its prompt and its output the turn's ids so far
        (:class:`~agentrl.sampling.PenaltyContext`), as transformers and vLLM define them.
        """
        ctx = PenaltyContext.of([prompts[r] for r in rows], [out[r].ids for r in rows]) if self.spec.penalized else None
        forced = None if teacher is None else [teacher[r][step] for r in rows]
        return self.choose(logits, None if generators is None else [generators[r] for r in rows], forced, ctx,
                           turns=[out[r].ids for r in rows])

    @property
    def _buffers(self):
        """The ``[2, rows, V]`` float64 storage of :attr:`scratch` (None before the first use)."""
        return self.scratch.tensor

    @_buffers.setter
    def _buffers(self, value) -> None:
        self.scratch = Scratch()
        self.scratch.tensor = value

    @torch.no_grad()
    def choose(self, logits: torch.Tensor, generators=None, forced=None, context: PenaltyContext | None = None,
               turns=None):
        """Pick one token per row from next-token logits, with its log-prob under the spec.

        Args:
            logits: ``[n, V]`` float next-token logits (fp32, or fp64 for an fp64 model).
            generators: None (torch's global RNG) or n ``torch.Generator`` (entries may be None);
                each row takes exactly one uniform number from its own generator.
            forced: optional n ids to score instead of drawing (teacher forcing).
            context: the rows' :class:`~agentrl.sampling.PenaltyContext` (the turn's prompt and
                its ids so far) when the spec has penalties.
            turns: n id lists, each row's turn so far; required with ``spec.constraint``, whose allowed
                tokens (:meth:`agentrl.constraints.Grammar.next_bitmask`) mask the logits first (in place).

        Returns:
            ``(ids [n] int64, logp [n] float64)``: :func:`agentrl.sampling.choose` in float64, in
            the sampler's reused :attr:`scratch` buffers.

        Raises:
            ValueError: a constraint without ``turns``; ``GrammarRejection`` (a ValueError) when a
                teacher-forced id leaves the grammar.
        """
        if self.spec.constraint is not None:
            if turns is None:
                raise ValueError('HFSampler.choose: the spec has a grammar constraint; pass turns= (each row\'s ids '
                                 'sampled so far in its turn)')
            if self.grammar is None or self.grammar.vocab_size != logits.shape[-1]:
                from ...constraints import Grammar
                self.grammar = Grammar(self.spec.constraint, self.tokenizer, logits.shape[-1])
            logits = mask_logits(logits, self.grammar.next_bitmask(turns))     # in place: the step's own logits
        u = None
        if forced is None and self.spec.temperature > 0:
            u = torch.stack([torch.rand((), dtype=torch.float64, generator=g) if g is not None
                             else torch.rand((), dtype=torch.float64)
                             for g in (generators if generators is not None else [None] * logits.shape[0])])
        return choose(logits, self.spec, u, context=context, buffers=self.scratch, forced=forced)

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
    def sample(self, prompts, generators=None, *, max_new_tokens=None, teacher=None, on_token=None,
               images=None) -> list:
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
            on_token: optional ``on_token(b, ids)`` called after each sampled token of prompt ``b`` with
                that turn's ids so far (``[k]`` ints, a copy): the streaming hook.
            images: optional B lists (or None), the images of each prompt in placeholder order
                (:attr:`agentrl.templates.ChatRecorder.images`: ``digest``, ``data``, ``length``); a batch with
                any image is sampled one prompt at a time with the pixels and 3-D positions of its images
                (:mod:`agentrl.engines.hf.vlm`), the same inputs replay feeds.

        Returns:
            B :class:`SampledTurn`, in prompt order.

        Raises:
            ValueError: an empty prompt, a budget below 1, or ``generators`` / ``teacher`` /
                budgets / ``images`` of another length than ``prompts``; ``images`` without the sampler's
                ``image_processor``; an image whose placeholder run is not the processor's count.

        Source: book chapter 5.4 (prompt ids in; sampled ids and processed log-probs out).
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
        if images is not None and len(images) != len(prompts):
            raise ValueError(f'sample: {len(images)} image lists for {len(prompts)} prompts; pass one per prompt')
        if images is not None and any(images) and self.image_processor is None:
            raise ValueError('sample: images given but the sampler has no image_processor; pass '
                             'HFSampler(..., image_processor=load_image_processor(model_dir))')
        self._on_token = on_token
        try:
            if images is not None and any(images):
                self._sample_vision(prompts, budgets, generators, teacher, out, images)
            elif self.cache:
                self._sample_cached(prompts, budgets, generators, teacher, out)
            else:
                self._sample_recompute(prompts, budgets, generators, teacher, out)
        finally:
            self._on_token = None
        for t in out:
            t.truncated = not (t.ids and t.ids[-1] in self.stop_ids)
            self.tokens_generated += len(t.ids)
        return out

    def _left_pad(self, rows):
        """Left-pad id lists: ``(ids [B, L], attention_mask [B, L], position_ids [B, L])`` on the model's device."""
        ids = pad_rows(rows, None, self.pad_id, side='left', dtype=torch.long)
        mask = pad_rows([[1] * len(r) for r in rows], ids.shape[1], 0, side='left', dtype=torch.long)
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
        if self._on_token is not None:
            for r in rows:
                self._on_token(r, list(out[r].ids))
        return go

    def _tick(self, key: str, t0: float, tokens: int = 0) -> float:
        """Add the seconds since ``t0`` to ``stats[key + '_s']`` (and ``tokens``); return the time now."""
        now = time.perf_counter()
        st = self.stats
        st[key + '_s'] += now - t0
        if key == 'prefill':
            st['prefill_tokens'] += tokens
        elif key == 'decode':
            st['decode_tokens'] += tokens
            st['decode_steps'] += 1
        return now

    def _sample_cached(self, prompts, budgets, generators, teacher, out):
        t0 = time.perf_counter()
        ids, mask, pos = self._left_pad(prompts)
        cache = self._new_cache()
        logits = self._last_logits(ids, mask, pos, cache)
        t0 = self._tick('prefill', t0, sum(len(p) for p in prompts))
        rows = list(range(len(prompts)))
        lengths = torch.tensor([len(p) for p in prompts], dtype=torch.long, device=mask.device)
        step = 0
        while True:
            nxt, logp = self._choose(logits, rows, step, generators, teacher, prompts, out)
            t0 = self._tick('sample', t0)
            go = self._record(out, rows, step, nxt, logp, budgets)
            if not any(go):
                return
            if not all(go):
                keep = torch.tensor([i for i, g in enumerate(go) if g], dtype=torch.long, device=mask.device)
                cache.batch_select_indices(keep)
                mask, lengths, nxt = mask[keep], lengths[keep], nxt[keep]
                rows = [r for r, g in zip(rows, go) if g]
            t0 = time.perf_counter()
            mask = torch.cat([mask, torch.ones_like(mask[:, :1])], dim=1)
            logits = self._last_logits(nxt[:, None].to(mask.device), mask, lengths[:, None], cache)
            t0 = self._tick('decode', t0, len(rows))
            lengths = lengths + 1
            step += 1

    def _sample_vision(self, prompts, budgets, generators, teacher, out, images):
        """One prompt at a time: prefill with its images' pixels and 3-D positions, then one token per step."""
        dev = self.device
        for b, prompt in enumerate(prompts):
            t0 = time.perf_counter()
            ids = torch.tensor([prompt], dtype=torch.long, device=dev)
            inputs = pixel_inputs(self.image_processor, images[b]) if images[b] else None
            grid = None if inputs is None else inputs['image_grid_thw']
            pos, delta = rope_positions(self.model, ids, grid)
            cache = self._new_cache()
            kwargs = {'input_ids': ids, 'position_ids': pos, 'use_cache': True, self._kw['cache']: cache}
            if inputs is not None:
                kwargs.update(pixel_values=inputs['pixel_values'].to(dev), image_grid_thw=grid.to(dev))
            if self._kw['keep']:
                kwargs[self._kw['keep']] = 1
            self.forward_calls += 1
            logits = self.model(**kwargs).logits[:, -1]
            t0 = self._tick('prefill', t0, len(prompt))
            step = 0
            while True:
                logits = logits if logits.dtype == torch.float64 else logits.float()
                nxt, logp = self._choose(logits, [b], step, generators, teacher, prompts, out)
                t0 = self._tick('sample', t0)
                if not self._record(out, [b], step, nxt, logp, budgets)[0]:
                    break
                t0 = time.perf_counter()
                at = torch.full((3, 1, 1), len(prompt) + step + delta, dtype=torch.long, device=dev)
                kwargs = {'input_ids': nxt.view(1, 1).to(dev), 'position_ids': at, 'use_cache': True,
                          self._kw['cache']: cache}
                self.forward_calls += 1
                logits = self.model(**kwargs).logits[:, -1]
                t0 = self._tick('decode', t0, 1)
                step += 1

    def _sample_recompute(self, prompts, budgets, generators, teacher, out):
        rows = list(range(len(prompts)))
        step = 0
        while rows:
            t0 = time.perf_counter()
            ids, mask, pos = self._left_pad([prompts[r] + out[r].ids for r in rows])
            logits = self._last_logits(ids, mask, pos)
            t0 = self._tick('prefill', t0, int(mask.sum()))
            nxt, logp = self._choose(logits, rows, step, generators, teacher, prompts, out)
            self._tick('sample', t0)
            go = self._record(out, rows, step, nxt, logp, budgets)
            rows = [r for r, g in zip(rows, go) if g]
            step += 1

    # ------------------------------------------------------------------ cross-turn cache (one row per episode)
    def supports_row_cache(self) -> bool:
        """Whether the model can run on a :class:`RowCache` (a cache keyword, full attention in every layer)."""
        return (self._kw['cache'] is not None and _layer_types(self.model) == {'full_attention'}
                and self.image_processor is None)

    def new_row_cache(self, max_rows: int):
        """An empty ``RowCache`` for up to ``max_rows`` episodes at once (see :meth:`prefill_row`)."""
        from .row_cache import RowCache
        return RowCache(_n_layers(self.model), max_rows)

    def _mask_dtype(self):
        p = next(self.model.parameters(), None)
        return p.dtype if p is not None and p.is_floating_point() else torch.float32

    def _base_model(self):
        """The model without its LM head when it takes the same cache keyword (prefill needs no logits)."""
        if not hasattr(self, '_base'):
            base = getattr(self.model, getattr(self.model, 'base_model_prefix', '') or '_', None)
            ok = base is not None and base is not self.model and forward_kwargs(base)['cache'] == self._kw['cache']
            self._base = base if ok else None
        return self._base

    @torch.no_grad()
    def prefill_row(self, cache, row: int, ids, logits: bool = False):
        """Feed ``ids`` to one row of a ``RowCache`` after its ``cache.lengths[row]`` held tokens.

        The new tokens get positions ``lengths[row] ...`` and attend to the row's held tokens and
        causally to each other; the row's length grows by ``len(ids)``. To shorten a row first
        (the template rewrote history), lower ``cache.lengths[row]``.

        Args:
            cache: from :meth:`new_row_cache`. row: the row (``< cache.max_rows``).
            ids: ``[t]`` token ids, ``t >= 1``.
            logits: return the next-token logits after the last id (else the LM head is skipped
                where the model exposes its base model).

        Returns:
            ``[V]`` float logits (float64 for an fp64 model) or None.

        Raises:
            ValueError: empty ``ids``.

        Source: transformers' ``create_causal_mask`` (a 4-D ``attention_mask`` is used as given,
        instead of a causal mask built from a 2-D one).
        """
        ids = [int(i) for i in ids]
        if not ids:
            raise ValueError('prefill_row: ids is empty; feed at least one token')
        s, t = cache.lengths[row], len(ids)
        cache.reserve(s + t)
        cache.plan_rows, cache.plan_n, cache.plan_span, cache.plan_start, cache.plan_index = row, 1, s + t, s, None
        dev, dtype = self.device, self._mask_dtype()
        q = torch.arange(s, s + t, device=dev)
        mask = torch.zeros((1, 1, t, s + t), dtype=dtype, device=dev)
        mask.masked_fill_(torch.arange(s + t, device=dev)[None, :] > q[:, None], torch.finfo(dtype).min)
        kwargs = {'input_ids': torch.tensor([ids], dtype=torch.long, device=dev),
                  'attention_mask': mask, 'position_ids': q[None], 'use_cache': True,
                  self._kw['cache']: cache}
        base = None if logits else self._base_model()
        self.forward_calls += 1
        t0 = time.perf_counter()
        if base is not None:
            base(**kwargs)
            out = None
        else:
            if self._kw['keep']:
                kwargs[self._kw['keep']] = 1
            out = self.model(**kwargs).logits[0, -1]
            out = out if out.dtype == torch.float64 else out.float()
        cache.lengths[row] = s + t
        self._tick('prefill', t0, t)
        return out if logits else None

    @torch.no_grad()
    def decode_rows(self, cache, ids) -> torch.Tensor:
        """Feed one token to each of rows ``[0, n)`` of a ``RowCache``, each at its own length.

        Args:
            cache: from :meth:`new_row_cache`. ids: ``[n]`` token ids, one per row.

        Returns:
            ``[n, V]`` next-token logits (float32; float64 for an fp64 model).

        Source: one query per row over its own keys (a ``[n, 1, 1, S]`` mask); the same
        arithmetic as a single-row forward pass to fp rounding.
        """
        n = len(ids)
        lengths = cache.lengths[:n]
        span = max(lengths) + 1
        cache.reserve(span)
        dev, dtype = self.device, self._mask_dtype()
        cols = torch.tensor(lengths, dtype=torch.long, device=dev)
        cache.plan_rows, cache.plan_n, cache.plan_span, cache.plan_start = 0, n, span, None
        cache.plan_index = (torch.arange(n, device=dev), cols)
        mask = torch.zeros((n, 1, 1, span), dtype=dtype, device=dev)
        mask.masked_fill_((torch.arange(span, device=dev)[None, :] > cols[:, None])[:, None, None], torch.finfo(dtype).min)
        kwargs = {'input_ids': torch.as_tensor(ids, dtype=torch.long, device=dev)[:, None],
                  'attention_mask': mask, 'position_ids': cols[:, None],
                  'use_cache': True, self._kw['cache']: cache}
        if self._kw['keep']:
            kwargs[self._kw['keep']] = 1
        self.forward_calls += 1
        t0 = time.perf_counter()
        out = self.model(**kwargs).logits[:, -1]
        self._tick('decode', t0, n)
        for r in range(n):
            cache.lengths[r] += 1
        return out if out.dtype == torch.float64 else out.float()

def _n_layers(model) -> int:
    cfg = getattr(model, 'config', None)
    cfg = cfg.get_text_config() if hasattr(cfg, 'get_text_config') else cfg
    n = getattr(cfg, 'num_hidden_layers', None)
    if not n:
        raise ValueError('HFSampler: the model config has no num_hidden_layers; use the per-turn path '
                         '(run_chat_episodes(..., reuse_cache=False))')
    return int(n)


def _layer_types(model) -> set:
    cfg = getattr(model, 'config', None)
    cfg = cfg.get_text_config() if hasattr(cfg, 'get_text_config') else cfg
    return set(getattr(cfg, 'layer_types', None) or ['full_attention'])
