"""L1: the one sampler: seeds, processed log-probs, the draw, the one per-step chooser and the token log-prob gather.

Every engine (TinyAgent, Hugging Face) and every replay (checks, trainer) uses this module, so a
record's ``sample_logp`` and its replay come from the same arithmetic.

The episode seed rule (docs/design.md#seeds) lives here too: :func:`episode_seed`.
"""
from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass, replace

from ._lazy import lazy_module

torch = lazy_module('torch')   # imported on first use (agentrl check runs without torch)

from .record import SamplingSpec

__all__ = ['episode_seed', 'support_mask', 'PenaltyContext', 'apply_penalties', 'processed_logp', 'stored_logp',
           'untruncated', 'draw', 'uniforms', 'Scratch', 'choose', 'sample', 'token_logp']

_SEED_DOMAIN = b'agentrl/episode-seed/v1'


def episode_seed(run_seed: int, group_id: str, rollout_id: str) -> int:
    """The sampling seed of one episode, from the run seed and the episode's identity.

    The rule is docs/design.md#seeds: blake2b (8 bytes, top bit cleared), not Python's ``hash()``, so the same
    on every machine, process and Python version.

    Args:
        run_seed: the run's ``--seed``.
        group_id: the episode's group (``'{seed}/{policy}/{task}'`` for ``agentrl rollout``).
        rollout_id: the episode's rollout id.

    Returns:
        int in ``[0, 2**63)`` (fits the store's int64 ``seed`` column and ``torch.Generator``).

    Example:
        >>> episode_seed(0, '0/model/clamp', '0/model/clamp/0') == episode_seed(0, '0/model/clamp', '0/model/clamp/0')
        True
    """
    h = hashlib.blake2b(digest_size=8, person=b'agentrl-seed')
    for part in (_SEED_DOMAIN, str(int(run_seed)).encode(), group_id.encode(), rollout_id.encode()):
        h.update(len(part).to_bytes(8, 'big'))
        h.update(part)
    return int.from_bytes(h.digest(), 'big') >> 1


# ---------------------------------------------------------------------------------------------
# the processed distribution: penalties, temperature, truncation


def _renorm(logp: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    logp = logp.masked_fill(~keep, -math.inf)
    return logp - torch.logsumexp(logp, dim=-1, keepdim=True)


def support_mask(logp: torch.Tensor, spec: SamplingSpec) -> torch.Tensor:
    """The tokens the declared sampler can draw, given temperature-scaled log-probs.

    Applied in order, each on the distribution renormalised over what the previous step kept:
    top-k (keep tokens whose log-prob is at least the k-th largest, ties kept), top-p (keep the
    most likely tokens until their mass reaches ``top_p``, including the token that crosses it),
    min-p (keep tokens with probability >= ``min_p`` times the largest).

    Args:
        logp: ``[N, V]`` float log-probs after temperature.
        spec: the declared :class:`~agentrl.record.SamplingSpec`.

    Returns:
        ``[N, V]`` bool, True where the token is in the support (the argmax always is). Computed
        without gradients.

    Example:
        >>> lp = torch.tensor([[0.50, 0.30, 0.15, 0.05]]).log()
        >>> support_mask(lp, SamplingSpec(top_p=0.75)).tolist()
        [[True, True, False, False]]

    Source: the order of Hugging Face ``generate``'s logits warpers (temperature, top-k, top-p,
    min-p), each renormalised.
    """
    logp = logp.detach()
    keep = torch.ones_like(logp, dtype=torch.bool)
    V = logp.shape[-1]
    if 0 < spec.top_k < V:
        kth = logp.topk(spec.top_k, dim=-1).values[..., -1:]
        keep &= logp >= kth
    if spec.top_p < 1.0:
        cur = _renorm(logp, keep)
        srt, order = cur.sort(dim=-1, descending=True)
        before = srt.exp().cumsum(-1) - srt.exp()          # mass strictly before each sorted token
        keep_sorted = (before < spec.top_p) & torch.isfinite(srt)
        keep &= torch.zeros_like(keep).scatter(-1, order, keep_sorted)
    if spec.min_p > 0.0:
        cur = _renorm(logp, keep)
        keep &= cur >= cur.max(dim=-1, keepdim=True).values + math.log(spec.min_p)
    return keep


@dataclass(frozen=True)
class PenaltyContext:
    """What the penalties of N sampled positions depend on, in sparse (COO) form.

    Entry ``e`` says: at row ``row[e]``, token ``token[e]`` occurs ``count[e]`` times among the
    turn's tokens sampled before that position, and ``in_context[e]`` says whether it occurs
    in the ids the turn was sampled after. Built with :meth:`of`.

    Attributes:
        row, token, count: ``[E]`` int64. in_context: ``[E]`` bool.
    """
    row: torch.Tensor
    token: torch.Tensor
    count: torch.Tensor
    in_context: torch.Tensor

    @classmethod
    def of(cls, contexts, outputs) -> 'PenaltyContext':
        """From per-row id sequences.

        Args:
            contexts: N sequences of ids (list of int or 1-D tensors): what row n's turn was
                sampled after (the prompt of the turn).
            outputs: N sequences: the turn's ids sampled before row n's token.

        Returns:
            :class:`PenaltyContext`.

        Raises:
            ValueError: ``contexts`` and ``outputs`` differ in length.
        """
        if len(contexts) != len(outputs):
            raise ValueError(f'PenaltyContext.of: {len(contexts)} contexts for {len(outputs)} outputs; '
                             'pass one (context, output) pair per sampled position')
        rows, toks, counts, inctx = [], [], [], []
        for n, (c, o) in enumerate(zip(contexts, outputs)):
            c = torch.as_tensor(c, dtype=torch.long).reshape(-1)
            o = torch.as_tensor(o, dtype=torch.long).reshape(-1)
            t, inv = torch.cat([c, o]).unique(return_inverse=True)
            cnt = torch.zeros(len(t), dtype=torch.long).index_add_(0, inv[len(c):], torch.ones(len(o), dtype=torch.long))
            ic = torch.zeros(len(t), dtype=torch.bool)
            ic[inv[:len(c)]] = True
            rows.append(torch.full((len(t),), n, dtype=torch.long))
            toks.append(t)
            counts.append(cnt)
            inctx.append(ic)
        cat = (lambda xs, dt: torch.cat(xs) if xs else torch.zeros(0, dtype=dt))  # noqa: E731
        return cls(cat(rows, torch.long), cat(toks, torch.long), cat(counts, torch.long), cat(inctx, torch.bool))


def apply_penalties(logits: torch.Tensor, spec: SamplingSpec, context: PenaltyContext | None) -> torch.Tensor:
    """Repetition, presence and frequency penalties on raw logits (before temperature).

    For each entry of ``context`` (a token already seen by row n): the repetition penalty ``r``
    divides a positive logit and multiplies a non-positive one when the token occurs in the
    turn's context or output so far; then ``frequency_penalty * count`` and
    ``presence_penalty * (count > 0)`` are subtracted (output tokens only).

    Args:
        logits: ``[N, V]`` float logits (any float dtype; the result is float64).
        spec: the sampler (:attr:`~agentrl.record.SamplingSpec.penalized` False returns the
            logits as float64 unchanged).
        context: the :class:`PenaltyContext` of the N rows (required when penalties are on).

    Returns:
        ``[N, V]`` float64 penalised logits (differentiable in ``logits``).

    Raises:
        ValueError: penalties are on and ``context`` is None (fix: pass what each position was
            sampled after, see :meth:`PenaltyContext.of`).

    Source: transformers ``RepetitionPenaltyLogitsProcessor`` (``torch.where(score < 0, score *
    penalty, score / penalty)`` on the gathered scores of ``input_ids``, a processor that runs
    before the temperature warper); vLLM ``model_executor/layers/utils.apply_penalties``
    (repetition on ``prompt_mask | output_mask``, ``logits > 0`` divided, the rest multiplied;
    then ``logits -= frequency_penalties * output_bin_counts`` and ``logits -=
    presence_penalties * output_mask``, called before temperature by its sampler).
    """
    x = logits.double()
    if not spec.penalized:
        return x
    if context is None:
        raise ValueError('apply_penalties: the spec has penalties but no PenaltyContext was given; pass the ids '
                         'each position was sampled after (PenaltyContext.of(contexts, outputs))')
    if not len(context.row):
        return x
    idx = (context.row.to(x.device), context.token.to(x.device))
    v = x[idx]
    if spec.repetition_penalty != 1.0:
        seen = context.in_context.to(x.device) | (context.count.to(x.device) > 0)
        r = spec.repetition_penalty
        v = torch.where(seen, torch.where(v > 0, v / r, v * r), v)
    cnt = context.count.to(x.device).double()
    if spec.frequency_penalty:
        v = v - spec.frequency_penalty * cnt
    if spec.presence_penalty:
        v = v - spec.presence_penalty * (cnt > 0).double()
    return x.index_put(idx, v)


def processed_logp(logits: torch.Tensor, spec: SamplingSpec, context: PenaltyContext | None = None) -> torch.Tensor:
    """Log-probs of the distribution a sampler with ``spec`` draws from.

    In order: penalties (:func:`apply_penalties`), temperature, then the top-k / top-p / min-p
    support (:func:`support_mask`), renormalised. Temperature 0 (greedy) gives the temperature-1
    log-softmax of the penalised logits (its argmax is drawn; :class:`~agentrl.record.SamplingSpec`).

    Args:
        logits: ``[N, V]`` float logits of the positions to sample.
        spec: the sampler (``logp_mode`` is not used here: this is the drawn distribution).
        context: the rows' :class:`PenaltyContext` (needed only when ``spec.penalized``).

    Returns:
        ``[N, V]`` float64 log-probs, ``-inf`` outside the support; differentiable in ``logits``.

    Example:
        >>> processed_logp(torch.tensor([[2., 1., 0.]]), SamplingSpec(temperature=0.5))[0, 0]
        tensor(-0.1429, dtype=torch.float64)

    Raises:
        ValueError: see :func:`apply_penalties`.
    """
    x = apply_penalties(logits, spec, context)
    if spec.temperature <= 0 or spec.temperature == 1.0:
        lp = torch.log_softmax(x, dim=-1)
    else:
        lp = torch.log_softmax(x / spec.temperature, dim=-1)
    if spec.temperature <= 0 or not spec.truncated or (spec.top_k >= lp.shape[-1] and spec.top_p >= 1.0
                                                       and spec.min_p <= 0.0):
        return lp                      # no truncation: the support is the whole vocabulary
    return _renorm(lp, support_mask(lp, spec))


def stored_logp(logits: torch.Tensor, ids: torch.Tensor, spec: SamplingSpec,
                context: PenaltyContext | None = None) -> torch.Tensor:
    """The log-prob a sampler with ``spec`` stores for the tokens ``ids``.

    ``logp_mode='processed'``: :func:`processed_logp` at ``ids``; ``'raw'``: the log-softmax of
    the unmodified logits (before penalties and temperature) at ``ids``; ``'scaled'``: :func:`processed_logp`
    of the spec without its truncation (penalties and temperature only). Greedy specs store the
    processed temperature-1 value in every mode.

    Args:
        logits: ``[N, V]`` logits of the rows that predict ``ids``.
        ids: ``[N]`` int64.
        spec: the declared sampler. context: as :func:`processed_logp`.

    Returns:
        ``[N]`` float64 nats.

    Raises:
        ValueError: ``logits`` and ``ids`` disagree in rows (fix: one logits row per id, the row
            that predicts it), or see :func:`apply_penalties`.
    """
    ids = torch.as_tensor(ids, dtype=torch.long).reshape(-1).to(logits.device)
    if logits.dim() != 2 or len(ids) != logits.shape[0]:
        raise ValueError(f'stored_logp: {logits.shape[0] if logits.dim() else 0} logits rows for {len(ids)} ids; '
                         'pass the row that predicts each sampled id (row j scores ids[j+1] of the sequence)')
    if spec.logp_mode == 'raw' and spec.temperature > 0:
        lp = torch.log_softmax(logits.double(), dim=-1)
    else:
        lp = processed_logp(logits, untruncated(spec) if spec.logp_mode == 'scaled' else spec, context)
    return lp.gather(-1, ids[:, None]).squeeze(-1)


def untruncated(spec: SamplingSpec) -> SamplingSpec:
    """``spec`` without top-k / top-p / min-p (the distribution whose log-probs ``logp_mode='scaled'`` stores)."""
    if not spec.truncated:
        return spec
    return replace(spec, top_k=0, top_p=1.0, min_p=0.0)


# ---------------------------------------------------------------------------------------------
# the draw


def draw(weights: torch.Tensor, u: torch.Tensor, *, caller: str = 'draw', inplace: bool = False) -> torch.Tensor:
    """Invert each row's CDF at ``u``: the token ``i`` with ``cdf[i-1] <= u * total < cdf[i]``.

    Args:
        weights: ``[N, V]`` non-negative weights (probabilities; rows need not sum to 1).
        u: ``[N]`` or ``[N, 1]`` float64 uniforms in ``[0, 1)``, one per row.
        caller: the public name that raises (for the message).
        inplace: accumulate the CDF in ``weights``' own storage (``weights`` must be a contiguous
            float64 tensor; its values are overwritten) instead of a new ``[N, V]`` float64 tensor.
            The same arithmetic, so the same ids; it saves one large allocation per call (the
            HF sampler's reused buffer, :class:`agentrl.engines.hf.sampler.HFSampler`).

    Returns:
        ``[N]`` int64 ids; a token of weight 0 is never returned. The CDF is accumulated in
        float64, so a token of weight 1e-9 after a mass of 0.999 keeps its own interval (in
        float32 it would round away). Source: inverse transform sampling; one uniform per token
        keeps an episode's random stream independent of the batch it is sampled in.

    Raises:
        ValueError: a row whose weights do not sum to a finite positive number (NaN or inf
            logits, or every logit -inf): there is no distribution to sample from. This is the
            one edge-case policy of every engine (never a silent clamp).
    """
    if inplace:
        if weights.dtype != torch.float64 or not weights.is_contiguous():
            raise ValueError(f'{caller}: inplace=True needs contiguous float64 weights, got {weights.dtype}')
        cdf = weights.cumsum_(-1)
    else:
        cdf = torch.cumsum(weights, dim=-1, dtype=torch.float64)
    total = cdf[:, -1:].contiguous()
    if not bool(torch.isfinite(total.log()).all()):            # log: 0 -> -inf, NaN and inf stay
        rows = (~((total > 0) & (total < float('inf')))).squeeze(1).nonzero().squeeze(1).tolist()
        raise ValueError(f'{caller}: rows {rows[:5]} have no distribution to sample from (NaN or inf '
                         'logits, or all -inf); check the model output before sampling')
    if u.dim() != 2 or u.dtype != torch.float64:
        u = u.reshape(-1, 1).to(cdf)
    ids = torch.searchsorted(cdf, u * total, right=True)
    # u * total can round up to total: fall back to the last token of positive weight
    last = torch.searchsorted(cdf, total, right=False)
    return torch.minimum(ids, last).squeeze(-1)


def uniforms(n: int, generator=None, generators=None, device=None) -> torch.Tensor:
    """``[n, 1]`` float64 uniforms: ``n`` from one generator, or one from each of ``generators``.

    Raises:
        ValueError: both given, or ``generators`` not ``n`` long.
    """
    if generators is None:
        return torch.rand(n, 1, generator=generator, dtype=torch.float64, device=device)
    if generator is not None or len(generators) != n:
        raise ValueError(f'uniforms: pass generator or one generator per row ({n}), '
                         f'got generator={generator!r} and {len(generators)} generators')
    return torch.cat([torch.rand(1, 1, generator=g, dtype=torch.float64, device=device) for g in generators])


class Scratch:
    """Two ``[rows, V]`` float64 buffers kept across :func:`choose` calls (its temperature-only path).

    At 32 rows of Qwen3's 151,669 entries each buffer is 39 MiB, above glibc's largest mmap
    threshold (32 MiB): allocating them every step maps and faults fresh pages each time
    (bench/RESULTS.md, "HF engine: cross-turn KV cache"). The buffers grow to the most rows seen
    and are reallocated for another vocabulary or device.

    Attributes:
        tensor: the ``[2, rows, V]`` float64 storage, or None before the first use.
    """

    def __init__(self):
        self.tensor = None

    def views(self, logits: torch.Tensor):
        """``(x, lp)``: two ``[n, V]`` float64 views for ``[n, V]`` logits."""
        n, V = logits.shape
        buf = self.tensor
        if buf is None or buf.shape[1] < n or buf.shape[2] != V or buf.device != logits.device:
            with torch.inference_mode(False):    # a normal tensor, writable in and out of inference mode
                buf = self.tensor = torch.empty((2, n, V), dtype=torch.float64, device=logits.device)
        return buf[0, :n], buf[1, :n]


def _processed64(logits, spec, context, buffers):
    """``(processed log-probs [n, V] float64, spare [n, V] float64 buffer or None)``.

    Specs without penalties or truncation are computed in ``buffers`` (when given) with the same
    operations as :func:`processed_logp` (``double``, ``/ T``, ``log_softmax``) written with
    ``out=``, so the values are bit-identical; other specs allocate through :func:`processed_logp`.
    """
    if buffers is None or spec.penalized or (spec.temperature > 0 and spec.truncated):
        return processed_logp(logits, spec, context), None
    x, lp = buffers.views(logits)
    x.copy_(logits)
    if spec.temperature > 0 and spec.temperature != 1.0:
        x.div_(spec.temperature)
    torch.log_softmax(x, dim=-1, out=lp)
    return lp, x


def _fast32(spec: SamplingSpec) -> bool:
    return not spec.penalized and (spec.temperature <= 0 or (not spec.truncated and spec.logp_mode == 'processed'))


def choose(logits: torch.Tensor, spec: SamplingSpec, uniforms, *, context: PenaltyContext | None = None,
           buffers: Scratch | None = None, forced=None, dtype: torch.dtype | None = None, caller: str = 'draw'):
    """The one per-step token chooser: one token per row and the log-prob the record stores.

    Greedy (temperature 0) takes the argmax of the processed log-probs (no uniform used); every
    other spec inverts each row's CDF at its uniform (:func:`draw`); ``forced`` scores given ids
    (teacher forcing). The stored log-prob is the processed one, the raw ``log_softmax`` of the
    unmodified logits with ``spec.logp_mode == 'raw'``, or the untruncated one with ``'scaled'`` (greedy stores the
    processed one).

    Args:
        logits: ``[n, V]`` float next-token logits.
        spec: the declared sampler.
        uniforms: ``[n]`` or ``[n, 1]`` float64 in ``[0, 1)``, one per row (None when greedy or forced).
        context: the rows' :class:`PenaltyContext` when ``spec.penalized``.
        buffers: a :class:`Scratch` to compute temperature-only specs in (the HF engine's hot path;
            bit-identical to the allocating path).
        forced: optional ``[n]`` ids to score instead of drawing.
        dtype: ``torch.float64`` (or None, the default): every value in float64, equal to :func:`processed_logp`
            / :func:`stored_logp`. ``torch.float32``: greedy and temperature-only ``processed``
            specs without penalties take the float32 path of :func:`sample` (``softmax(logits / T)``,
            ``log(probs[id])``: the TinyAgent records); other specs are computed in float64.
        caller: the public name that raises (for messages).

    Returns:
        ``(ids [n] int64, logp [n])``: ``logp`` float64, or float32 on the float32 path.

    Raises:
        ValueError: a row with no distribution (:func:`draw`); penalties without ``context``.

    Source: docs/design.md#sampling (the draw), so a row draws the same id whichever batch it is in.
    """
    if dtype == torch.float32 and _fast32(spec):
        x = logits.float()
        if spec.temperature <= 0:
            lp = torch.log_softmax(x, dim=-1)
            ids = lp.argmax(dim=-1) if forced is None else torch.as_tensor(forced, dtype=torch.long, device=lp.device)
            return ids, lp.gather(-1, ids[:, None]).squeeze(-1)
        probs = torch.softmax(x if spec.temperature == 1 else x / spec.temperature, dim=-1)  # x/1 == x
        ids = draw(probs, uniforms, caller=caller) if forced is None else \
            torch.as_tensor(forced, dtype=torch.long, device=probs.device)
        return ids, probs.gather(-1, ids[:, None]).squeeze(-1).log()
    lp, spare = _processed64(logits, spec, context, buffers)
    if forced is not None:
        ids = torch.as_tensor(forced, dtype=torch.long, device=lp.device)
    elif spec.temperature <= 0:
        ids = lp.argmax(dim=-1)
    else:
        weights = lp.exp() if spare is None else torch.exp(lp, out=spare)
        ids = draw(weights, uniforms, caller=caller, inplace=True)
    if spec.logp_mode == 'raw' and spec.temperature > 0:
        if spare is None:
            lp = torch.log_softmax(logits.double(), dim=-1)
        else:                      # the processed values are no longer needed: reuse both buffers
            torch.log_softmax(spare.copy_(logits), dim=-1, out=lp)
    elif spec.logp_mode == 'scaled' and spec.temperature > 0 and spec.truncated:
        lp = processed_logp(logits, untruncated(spec), context)
    return ids, lp.gather(-1, ids[:, None]).squeeze(-1)


def sample(logits: torch.Tensor, spec: SamplingSpec | None = None, *, generator=None, generators=None,
           context: PenaltyContext | None = None, caller: str = 'sample'):
    """Draw one token per row under ``spec`` and return the log-prob the record stores.

    Args:
        logits: ``[B, V]`` float logits of the last position.
        spec: the sampler (default ``SamplingSpec()``: temperature 1, full vocabulary).
        generator: optional ``torch.Generator`` (one ``[B]`` uniform draw).
        generators: instead, one generator per row; row ``b`` draws its uniform from
            ``generators[b]``, exactly as ``sample(logits[b:b+1], spec, generator=generators[b])``.
        context: the rows' :class:`PenaltyContext` when ``spec.penalized``.
        caller: the public name that raises (for messages).

    Returns:
        ``(ids [B] int64, logp [B] float32)``: :func:`choose` with ``dtype=torch.float32``.
        Temperature-only specs (no truncation, no penalty, ``processed``) take the float32 path:
        ``probs = softmax(logits / T)``, ``logp = log(probs[ids])`` (equal to ``log_softmax`` to
        about 1e-7); every other spec draws from :func:`processed_logp` (float64) and returns
        :func:`stored_logp` as float32. Greedy (temperature 0): the argmax of the penalised
        logits, its temperature-1 log-prob, no random number drawn.

    Raises:
        ValueError: logits not 2-D; ``generator`` and ``generators`` both given, or not one per
            row; a row with no distribution (:func:`draw`); penalties without ``context``.

    Example:
        >>> ids, lp = sample(torch.tensor([[0., 5.]]), SamplingSpec(top_k=1))
        >>> ids.tolist(), lp.tolist()
        ([1], [0.0])
    """
    spec = spec if spec is not None else _DEFAULT
    if logits.dim() != 2:
        raise ValueError(f'{caller} expects logits [B, V], got shape {tuple(logits.shape)}')
    B = logits.shape[0]
    if generators is not None and (generator is not None or len(generators) != B):
        raise ValueError(f'{caller}: pass generator or one generator per row ({B}), '
                         f'got generator={generator!r} and {len(generators)} generators')
    u = None if spec.temperature <= 0 else uniforms(B, generator, generators, logits.device)
    ids, lp = choose(logits, spec, u, context=context, dtype=torch.float32, caller=caller)
    return ids, lp.float()


# ---------------------------------------------------------------------------------------------
# the token log-prob gather


def token_logp(logits_or_model, ids: torch.Tensor, spec: SamplingSpec | None = None, *, temperature: float | None = None,
               entropy: bool = False):
    """Log-prob of each predicted token ``ids[:, 1:]`` given its prefix, under a sampler.

    The one gather behind :func:`agentrl.model.sequence_log_probs` (temperature 1, the book's),
    the trainer's :func:`agentrl.train.grpo.token_log_probs` (the records' sampler) and the SFT
    loss :func:`agentrl.train.sft.masked_nll`.

    Args:
        logits_or_model: a callable ``ids [B, T] -> logits [B, T, V]`` (TinyAgent, any module),
            or logits already computed: ``[B, T, V]`` (the last position is dropped) or
            ``[B, T-1, V]``.
        ids: ``[B, T]`` int64.
        spec: the sampler whose *processed* distribution scores the tokens (temperature, then
            top-k / top-p / min-p support, renormalised; a token outside the support gets
            ``-inf``). None: plain ``log_softmax`` at ``temperature`` (default 1). Specs with
            penalties need each position's history: use :func:`processed_logp` with a
            :class:`PenaltyContext` instead.
        temperature: instead of ``spec``, a temperature > 0 (no truncation).
        entropy: also return the entropy of each position's distribution (no gradient).

    Returns:
        ``logp [B, T-1]`` float32 nats (column j scores ``ids[:, j+1]``; carries gradients when
        called with grad enabled), or ``(logp, entropy [B, T-1] float32)`` when ``entropy``.

    Raises:
        ValueError: a temperature <= 0 (greedy records have no density to score), both ``spec``
            and ``temperature``, a spec with penalties, or logits whose shape disagrees with ids.

    Source: book chapter 3.4 (``sequence_log_probs``).
    """
    if spec is not None and temperature is not None:
        raise ValueError('token_logp: pass spec or temperature, not both')
    if spec is None:
        spec = _DEFAULT if temperature is None or temperature == 1.0 else SamplingSpec(temperature=temperature)
    if not spec.temperature > 0:
        raise ValueError(f'token_logp: temperature must be > 0, got {spec.temperature} (greedy records have no '
                         'density to score)')
    if spec.penalized:
        raise ValueError('token_logp: the spec has penalties, which depend on each turn\'s history; score with '
                         'processed_logp(logits, spec, PenaltyContext.of(...)) (checks.replay does)')
    if isinstance(logits_or_model, torch.Tensor):
        logits = logits_or_model
        if logits.dim() != 3 or logits.shape[0] != ids.shape[0] or logits.shape[1] not in (ids.shape[1], ids.shape[1] - 1):
            raise ValueError(f'token_logp: logits {tuple(logits.shape)} do not match ids {tuple(ids.shape)}; pass '
                             '[B, T, V] or [B, T-1, V]')
        logits = logits[:, :ids.shape[1] - 1]
    else:
        logits = logits_or_model(ids)[:, :-1]
    logits = logits.float()
    T = spec.temperature
    lp_all = torch.log_softmax(logits if T == 1.0 else logits / T, dim=-1)
    if spec.truncated:
        lp_all = _renorm(lp_all, support_mask(lp_all, spec))
    logp = lp_all.gather(-1, ids[:, 1:, None]).squeeze(-1)
    if not entropy:
        return logp
    with torch.no_grad():                       # a metric, never part of a loss
        p = lp_all.exp()
        ent = -(p * lp_all.masked_fill(p == 0, 0.0)).sum(-1)
    return logp, ent


_DEFAULT = SamplingSpec()
