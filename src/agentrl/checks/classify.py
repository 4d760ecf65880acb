"""L3: per-token classification of a replay mismatch, and the search for the sampler that explains it.

:func:`replay_logp` recomputes a token's log-prob under a declared sampler (the arithmetic is
:mod:`agentrl.sampling`'s, the very code that sampled); :func:`convert_logp` moves a stored log-prob
between the modes (:data:`agentrl.record.LOGP_MODES`; never by rescaling: it needs the logits).

A mismatch is classified per token, in this order:

* ``match``: replayed and stored agree within ``tol`` (nats);
* ``logp_mode_mismatch``: the stored value is another mode's log-prob (e.g. raw stored while
  ``processed`` is declared, or SGLang's ``scaled`` values declared ``raw``);
* ``support_mismatch``: the stored value is the token's probability renormalised over some other
  truncated support (a top-k / top-p / min-p prefix of the sorted distribution) than the declared
  one; the weights did not move;
* ``sampler_mismatch``: one other value of a single sampler parameter (temperature, repetition,
  presence or frequency penalty) reproduces every mismatched token of the scored sequence (at
  least :data:`MIN_FIT_TOKENS` of them): the records were sampled under another sampler than
  they declare, the model did not change;
* ``mask_shift``: the only mismatches are the first (or the last) trained token of policy turns,
  each with a stored log-prob of exactly 0.0 (a token never sampled): the mask was moved one
  token against the ids (a ``[T]`` mask read as ``[T-1]`` or the reverse), not the model
  (:func:`agentrl.checks.replay.mask_shift`);
* ``policy_change``: none of the above; the model that replays is not the one that sampled;
* ``non_finite``: the replayed or stored log-prob is NaN or infinite (a broken model or record):
  always a failure, never a pass.

Source: the book's replay rule ("Reconstruct one probability before aggregating": raw
``[0.50, 0.30, 0.15, 0.05]``, top-k 2 -> token A 0.625, ratio 1; full vocabulary 0.50 -> 0.8).
"""
from __future__ import annotations

import math
from dataclasses import replace

from .._lazy import lazy_module

torch = lazy_module('torch')

from ..record import LOGP_MODES, SamplingSpec
from ..sampling import PenaltyContext, apply_penalties, processed_logp, stored_logp, support_mask, untruncated
from .errors import LogpConversionError

__all__ = ['TOKEN_KINDS', 'MIN_FIT_TOKENS', 'FIT_BUDGET', 'support_mask', 'replay_logp', 'convert_logp',
           'classify_tokens', 'fit_sampler']

#: Token classifications, from benign to severe.
TOKEN_KINDS = ('match', 'logp_mode_mismatch', 'support_mismatch', 'sampler_mismatch', 'mask_shift', 'policy_change',
               'non_finite')
#: Fewest mismatched tokens for a ``sampler_mismatch`` verdict: one parameter fits any single
#: token, so a fit is evidence only when it explains several.
MIN_FIT_TOKENS = 3
#: Failed sampler fits after which one :func:`replay_records` call stops trying (the remaining
#: unexplained sequences are reported as ``policy_change``).
FIT_BUDGET = 8
#: Token kind -> its small-integer code (index in :data:`TOKEN_KINDS`).
KIND_CODE = {k: i for i, k in enumerate(TOKEN_KINDS)}


def _effective_temperature(spec: SamplingSpec) -> float:
    # temperature 0 is greedy; its stored log-prob is the argmax's at temperature 1 (record.py)
    return spec.temperature if spec.temperature > 0 else 1.0


def replay_logp(logits: torch.Tensor, ids: torch.Tensor, spec: SamplingSpec,
                context: PenaltyContext | None = None) -> torch.Tensor:
    """Recompute each sampled token's log-prob under the declared sampler.

    Args:
        logits: ``[N, V]`` (or ``[V]`` for one token) logits of the rows that predict ``ids``.
        ids: ``[N]`` int64 sampled token ids (or a scalar with ``[V]`` logits).
        spec: the declared sampler; ``logp_mode='raw'`` gives ``log_softmax(logits)[ids]``,
            ``'processed'`` the log-prob after penalties, temperature and the support of
            :func:`support_mask`, renormalised (-inf for a token outside the support), ``'scaled'`` the same
            without the support. Temperature
            0 (greedy) gives the temperature-1 log-prob, as :func:`agentrl.sampling.sample` stores.
        context: the rows' :class:`~agentrl.sampling.PenaltyContext` (only with penalties).

    Returns:
        ``[N]`` float64 nats (a 0-d tensor for a single token).

    Raises:
        ValueError: ``logits`` and ``ids`` disagree in their number of rows (fix: one logits row
            per sampled id, the row that predicts it); penalties without ``context``.

    Example:
        >>> replay_logp(torch.tensor([2., 1., 0.]), torch.tensor(0), SamplingSpec(temperature=0.5))
        tensor(-0.1429, dtype=torch.float64)
    """
    single = logits.dim() == 1
    x = logits.reshape(-1, logits.shape[-1])
    ids = torch.as_tensor(ids, dtype=torch.long).reshape(-1).to(x.device)
    if len(ids) != len(x):
        raise ValueError(f'replay_logp: {len(x)} logits rows for {len(ids)} ids; pass the row that predicts '
                         'each sampled id (row j scores ids[j+1] of the sequence)')
    out = stored_logp(x, ids, spec, context)
    return out[0] if single else out


def convert_logp(sample_logp: torch.Tensor, spec: SamplingSpec, to_mode: str, *, logits=None, ids=None,
                 context: PenaltyContext | None = None):
    """Express stored log-probs in another mode, by replaying the logits; never by rescaling.

    Args:
        sample_logp: ``[N]`` stored log-probs, in ``spec.logp_mode``.
        spec: the sampler they were stored under.
        to_mode: one of :data:`agentrl.record.LOGP_MODES`.
        logits: ``[N, V]`` the rows that predicted the tokens (required unless the mode is unchanged).
        ids: ``[N]`` the sampled ids (required with ``logits``).
        context: the rows' :class:`~agentrl.sampling.PenaltyContext` (only with penalties).

    Returns:
        ``[N]`` float32: a copy when the mode is unchanged, else the replayed log-probs.

    Raises:
        LogpConversionError: the mode changes and ``logits`` is None; the truncation support and
            its normaliser cannot be recovered from a stored number. Fix: replay the model and pass
            its logits (or use :func:`replay_logp`).
        ValueError: ``to_mode`` is not a log-prob mode.
    """
    if to_mode not in LOGP_MODES:
        raise ValueError(f'convert_logp: to_mode must be one of {LOGP_MODES}, got {to_mode!r}')
    stored = torch.as_tensor(sample_logp, dtype=torch.float32)
    if to_mode == spec.logp_mode:
        return stored.clone()
    if logits is None or ids is None:
        raise LogpConversionError(
            f'holds {spec.logp_mode} log-probs; turning them into {to_mode} needs the logits, because the '
            'temperature, truncation support and normaliser cannot be recovered from a stored number',
            field='sample_logp', fix='replay the model and call convert_logp(..., logits=..., ids=...) '
            'or replay_logp(logits, ids, spec)')
    return replay_logp(logits, ids, replace(spec, logp_mode=to_mode), context).float()


def _mode_and_support(x, ids, stored, spec, context, tol):
    """Per-token masks: the stored value is another mode's / another truncated support's."""
    mode = torch.zeros_like(stored, dtype=torch.bool)
    for m in LOGP_MODES:
        if m != spec.logp_mode and (m != 'scaled' or spec.truncated):     # untruncated, scaled is processed
            mode |= (replay_logp(x, ids, replace(spec, logp_mode=m), context) - stored).abs() <= tol
    # support: stored == log q_tok - log(mass of a sorted prefix containing the token)
    scaled = processed_logp(x, untruncated(spec), context) if spec.temperature > 0 \
        else torch.log_softmax(x.double(), dim=-1)
    tok_lp = scaled.gather(-1, ids[:, None])
    srt = scaled.sort(dim=-1, descending=True).values
    prefix_mass = torch.logcumsumexp(srt, dim=-1)
    rank = (scaled > tok_lp).sum(-1, keepdim=True)
    gap = (tok_lp - prefix_mass - stored[:, None]).abs()
    gap = gap.masked_fill(torch.arange(x.shape[-1], device=x.device)[None] < rank, math.inf)
    return mode, gap.min(-1).values <= tol


def classify_tokens(logits: torch.Tensor, ids: torch.Tensor, stored: torch.Tensor, spec: SamplingSpec,
                    tol: float = 1e-4, context: PenaltyContext | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Replay tokens and classify each mismatch (see the module docstring for the kinds).

    Per-token kinds only: ``sampler_mismatch`` needs several tokens at once (:func:`fit_sampler`,
    applied by :func:`replay_record` and :func:`replay_records`).

    Args:
        logits: ``[N, V]`` rows predicting the sampled ids.
        ids: ``[N]`` int64 sampled ids.
        stored: ``[N]`` stored log-probs (nats).
        spec: declared sampler.
        tol: agreement tolerance on ``|replayed - stored|`` in nats (default 1e-4).
        context: the rows' :class:`~agentrl.sampling.PenaltyContext` (only with penalties).

    Returns:
        ``(log_ratio [N] float64, kind [N] int64)``: ``log_ratio = replayed - stored`` under the
        declared spec (ratio ``exp(log_ratio)``), ``kind`` an index into :data:`TOKEN_KINDS`.

    Example:
        logits ``[2, 1, 0]`` at T = 0.5, token 0: stored -0.1429 is a ``match``, stored -0.4076
        (the raw log-softmax) a ``logp_mode_mismatch`` with ratio 1.303.
    """
    x = logits.reshape(-1, logits.shape[-1]).double()
    ids = torch.as_tensor(ids, dtype=torch.long).reshape(-1).to(x.device)
    stored = torch.as_tensor(stored).double().reshape(-1).to(x.device)
    replayed = replay_logp(x, ids, spec, context)
    log_ratio = replayed - stored
    kind = torch.full_like(ids, KIND_CODE['policy_change'])
    match = (log_ratio.abs() <= tol) | (replayed == stored)
    if not bool(match.all()):
        mode, support = _mode_and_support(x, ids, stored, spec, context, tol)
        kind[support] = KIND_CODE['support_mismatch']
        kind[mode] = KIND_CODE['logp_mode_mismatch']
    kind[match] = KIND_CODE['match']
    # NaN or +inf anywhere (a -inf replay is a token outside the declared support: ratio 0, not broken)
    bad = (torch.isnan(replayed) | (replayed == math.inf) | ~torch.isfinite(stored)
           | torch.isnan(x).any(-1) | (x == math.inf).any(-1))
    kind[bad] = KIND_CODE['non_finite']
    return log_ratio, kind


def _fit_one(f, lo: float, hi: float, stored: torch.Tensor, tol: float):
    """Grid then golden-section search of one parameter: ``(value, max residual)`` or None."""
    grid = torch.linspace(lo, hi, 17, dtype=torch.float64).tolist()
    errs = []
    for v in grid:
        r = f(v)
        errs.append(float((r - stored).abs().max()) if bool(torch.isfinite(r).all()) else math.inf)
    i = min(range(len(grid)), key=errs.__getitem__)
    a, b = grid[max(i - 1, 0)], grid[min(i + 1, len(grid) - 1)]
    g = (math.sqrt(5) - 1) / 2
    c, d = b - g * (b - a), a + g * (b - a)
    err = lambda v: float((f(v) - stored).abs().max())  # noqa: E731
    fc, fd = err(c), err(d)
    for _ in range(36):
        if min(fc, fd) <= tol / 16:
            break
        if fc < fd:
            b, d, fd = d, c, fc
            c = b - g * (b - a)
            fc = err(c)
        else:
            a, c, fc = c, d, fd
            d = a + g * (b - a)
            fd = err(d)
    v = c if fc < fd else d
    e = min(fc, fd)
    return (v, e) if e <= tol else None


def _sub_context(context: PenaltyContext | None, rows: torch.Tensor, n: int) -> PenaltyContext | None:
    """The entries of ``context`` for ``rows`` (of ``n``), renumbered 0 .. len(rows) - 1."""
    if context is None:
        return None
    keep = torch.isin(context.row, rows)
    remap = torch.full((n,), -1, dtype=torch.long)
    remap[rows] = torch.arange(len(rows))
    return PenaltyContext(remap[context.row[keep]], context.token[keep], context.count[keep], context.in_context[keep])


def _search_fn(x, ids, spec, context, name, make):
    """``v -> [n] log-probs of ids`` under ``make(v)``, cheap enough for a one-parameter search.

    Without truncation a penalty moves only the logits of seen tokens, so the log-normaliser of
    the unseen ones is computed once and each evaluation touches only the seen entries; a
    temperature search runs the softmax in float32 (the verification afterwards is float64).
    With truncation every evaluation is the full :func:`replay_logp`.
    """
    if spec.truncated:
        return lambda v: replay_logp(x, ids, make(v), context)
    if name == 'temperature':
        base = apply_penalties(x, spec, context).float() if spec.penalized else x.float()
        return lambda v: torch.log_softmax(base / v, dim=-1).gather(-1, ids[:, None]).squeeze(-1).double()
    T = spec.temperature if spec.temperature > 0 else 1.0
    xs = x.double()
    parts = []
    for n in range(len(ids)):
        sel = context.row == n
        tok, cnt, inctx = context.token[sel], context.count[sel], context.in_context[sel]
        unseen = torch.ones(xs.shape[1], dtype=torch.bool)
        unseen[tok] = False
        lse_unseen = torch.logsumexp(xs[n, unseen] / T, dim=0)
        hit = (tok == ids[n]).nonzero().flatten()
        parts.append((xs[n, tok], cnt, inctx, lse_unseen, int(hit[0]) if len(hit) else -1, xs[n, ids[n]] / T))

    def f(v):
        sp = make(v)
        out = []
        for raw, cnt, inctx, lse_unseen, hit, z_tok in parts:
            z = raw
            if sp.repetition_penalty != 1.0:
                seen = inctx | (cnt > 0)
                z = torch.where(seen, torch.where(z > 0, z / sp.repetition_penalty, z * sp.repetition_penalty), z)
            z = (z - sp.frequency_penalty * cnt.double() - sp.presence_penalty * (cnt > 0).double()) / T
            lse = torch.logaddexp(lse_unseen, torch.logsumexp(z, dim=0)) if len(z) else lse_unseen
            out.append((z[hit] if hit >= 0 else z_tok) - lse)
        return torch.stack(out)
    return f


def fit_verified(x, ids, stored, spec, tol, context, fit_rows, check_rows) -> str:
    """:func:`fit_sampler` on ``fit_rows``, verified on ``fit_rows`` and ``check_rows``; '' when nothing fits."""
    n = len(ids)
    if len(fit_rows) < MIN_FIT_TOKENS or not bool(torch.isfinite(stored[fit_rows]).all()):
        return ''
    # search on the 4 rows the declared sampler misses most (few rows keep it cheap, the most-missed
    # rows keep it informative), then verify on every row in float64
    if len(fit_rows) > 4:
        miss = (replay_logp(x[fit_rows], ids[fit_rows], spec, _sub_context(context, fit_rows, n) if spec.penalized
                            else None) - stored[fit_rows]).abs()
        pick = fit_rows[miss.nan_to_num(0.0).topk(4).indices]
    else:
        pick = fit_rows
    every = torch.cat([fit_rows, check_rows])
    tries = [('temperature', 0.05, 5.0)]
    if context is not None:
        tries += [('repetition_penalty', 0.2, 5.0), ('presence_penalty', -2.0, 2.0), ('frequency_penalty', -2.0, 2.0)]
    base = spec if spec.temperature > 0 else replace(spec, temperature=1.0)
    sub, full = _sub_context(context, pick, n), _sub_context(context, every, n)
    for name, lo, hi in tries:
        def make(v, name=name):
            kw = {name: v}
            if name in ('presence_penalty', 'frequency_penalty'):
                kw['penalty_semantics'] = 'vllm'
            return replace(base, **kw)
        try:
            got = _fit_one(_search_fn(x[pick], ids[pick], base, sub, name, make), lo, hi, stored[pick], tol)
            if got is None:
                continue
            if bool(((replay_logp(x[every], ids[every], make(got[0]), full) - stored[every]).abs() <= tol).all()):
                return f'{name}={got[0]:.4g}'
        except ValueError:
            continue
    return ''


def fit_sampler(logits: torch.Tensor, ids: torch.Tensor, stored: torch.Tensor, spec: SamplingSpec,
                tol: float = 1e-4, context: PenaltyContext | None = None) -> str | None:
    """Find one other sampler parameter that reproduces every given stored log-prob, if any.

    Tries, one at a time with the other fields as declared: the temperature (0.05 .. 5), the
    repetition penalty (0.2 .. 5), the presence and frequency penalties (-2 .. 2, vLLM
    semantics); the penalties only with ``context``. :func:`replay_records` uses it on the tokens
    that matched nothing else, so that log-probs relabelled with another sampler read as a
    sampler mismatch, not a policy change.

    Args:
        logits: ``[N, V]`` rows predicting ``ids``; ids, stored: ``[N]``.
        spec: the declared sampler. tol: max residual in nats, over all N tokens.
        context: the rows' :class:`~agentrl.sampling.PenaltyContext` (what each token was
            sampled after), needed for the penalty fits.

    Returns:
        ``'temperature=0.7'``-style text naming the fitted value, or None when nothing fits or
        fewer than :data:`MIN_FIT_TOKENS` tokens are given (one parameter fits any one token).

    Example:
        tokens sampled at temperature 0.7 but declared at 1.0 give ``'temperature=0.7'``.
    """
    rows = torch.arange(len(ids))
    return fit_verified(logits.double(), torch.as_tensor(ids).long(), torch.as_tensor(stored).double(), spec, tol, context,
                rows, rows[:0]) or None
