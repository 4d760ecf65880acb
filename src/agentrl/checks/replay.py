"""L3: replay each sampled token under the declared sampler and compare with the stored log-prob.

Two log-prob modes (:data:`agentrl.record.LOGP_MODES`): ``processed`` is the log-prob under the
distribution actually sampled from (penalties, temperature, then top-k / top-p / min-p support,
renormalised); ``raw`` is ``log_softmax`` of the unmodified logits. A stored log-prob is never
rescaled: moving between modes needs the logits (:func:`convert_logp` raises without them). The
arithmetic is :mod:`agentrl.sampling`'s, the very code that sampled.

The one replay, :func:`replay_records`, runs over a *scorer*: any callable
``score(ids [B, T] int64, attention_mask [B, T] int64, rows) -> logits`` (see :class:`Scorer`),
so TinyAgent checkpoints and Hugging Face models replay the same way
(:func:`agentrl.engines.scorer.load_scorer`). Records with per-turn ``turn_contexts`` (templates
that are not prefix-stable) are scored turn by turn, each turn in the context it was sampled in.

A mismatch is classified per token, in this order:

* ``match``: replayed and stored agree within ``tol`` (nats);
* ``logp_mode_mismatch``: the stored value is the *other* mode's log-prob (e.g. raw stored while
  ``processed`` is declared);
* ``support_mismatch``: the stored value is the token's probability renormalised over some other
  truncated support (a top-k / top-p / min-p prefix of the sorted distribution) than the declared
  one; the weights did not move;
* ``sampler_mismatch``: one other value of a single sampler parameter (temperature, repetition,
  presence or frequency penalty) reproduces every mismatched token of the scored sequence (at
  least :data:`MIN_FIT_TOKENS` of them): the records were sampled under another sampler than
  they declare, the model did not change;
* ``policy_change``: none of the above; the model that replays is not the one that sampled;
* ``non_finite``: the replayed or stored log-prob is NaN or infinite (a broken model or record):
  always a failure, never a pass.

Source: the book's replay rule ("Reconstruct one probability before aggregating": raw
``[0.50, 0.30, 0.15, 0.05]``, top-k 2 -> token A 0.625, ratio 1; full vocabulary 0.50 -> 0.8).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

import torch

from ..record import LOGP_MODES, SamplingSpec, Trajectory, turn_records, turn_spans
from ..sampling import PenaltyContext, apply_penalties, processed_logp, stored_logp, support_mask
from .errors import (LogpConversionError, MissingProvenanceError, ReplayUnsupportedError, SamplerMismatchError,
                     ScriptedRecordError)
from .identity import record_key

__all__ = ['TOKEN_KINDS', 'MIN_FIT_TOKENS', 'FIT_BUDGET', 'support_mask', 'replay_logp', 'convert_logp', 'require_sampled',
           'require_trainable', 'classify_tokens', 'fit_sampler', 'RatioStats', 'RecordReplay', 'ReplayReport',
           'replay_record', 'Scorer', 'replay_records', 'replay_check']

#: Token classifications, from benign to severe.
TOKEN_KINDS = ('match', 'logp_mode_mismatch', 'support_mismatch', 'sampler_mismatch', 'policy_change', 'non_finite')
#: Fewest mismatched tokens for a ``sampler_mismatch`` verdict: one parameter fits any single
#: token, so a fit is evidence only when it explains several.
MIN_FIT_TOKENS = 3
#: Failed sampler fits after which one :func:`replay_records` call stops trying (the remaining
#: unexplained sequences are reported as ``policy_change``).
FIT_BUDGET = 8
_KIND = {k: i for i, k in enumerate(TOKEN_KINDS)}


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
            :func:`support_mask`, renormalised (-inf for a token outside the support). Temperature
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
        to_mode: ``'raw'`` or ``'processed'``.
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


def require_sampled(record: Trajectory) -> SamplingSpec:
    """The record's sampling spec; refuse records that must not enter an importance ratio.

    Call it before any ratio ``exp(new_logp - sample_logp)``.

    Returns:
        The record's :class:`~agentrl.record.SamplingSpec`.

    Raises:
        ScriptedRecordError: ``provenance.logp_placeholder`` is True (a scripted policy; its
            log-probs are placeholders). Fix: use such records for supervised targets only, or
            re-sample them with a model.
        MissingProvenanceError: no provenance or no sampling spec. Fix: record the SamplingSpec.
    """
    prov = record.provenance
    if prov is None:
        raise MissingProvenanceError('is missing; a ratio needs the sampler the log-probs came from',
                                     field='provenance', fix='attach a Provenance with its SamplingSpec')
    if prov.logp_placeholder:
        raise ScriptedRecordError(
            f'is True (policy {prov.policy!r}): sample_logp holds placeholders, not sampling log-probs, so '
            'the record cannot enter an importance ratio', field='provenance.logp_placeholder',
            fix='use scripted records for supervised targets only, or sample the episode with a model')
    if prov.sampling is None:
        raise MissingProvenanceError('is None; a ratio needs the sampler the log-probs came from',
                                     field='provenance.sampling', fix='record the SamplingSpec at sampling time')
    return prov.sampling


def require_trainable(records, temperature: float | None = None) -> SamplingSpec:
    """The one sampler of a training batch; refuse records a trainer cannot score exactly.

    The trainer recomputes each action token's log-prob under the records' *processed*
    distribution (:func:`agentrl.sampling.token_logp`: temperature, then top-k / top-p / min-p,
    renormalised), so every record of the batch must be sampled (:func:`require_sampled`) under
    one and the same spec, with a temperature > 0, ``logp_mode='processed'`` and no penalty.

    Args:
        records: the records of one step.
        temperature: when given, the temperature the caller expects (refused when it differs).

    Returns:
        the batch's :class:`~agentrl.record.SamplingSpec`.

    Raises:
        ScriptedRecordError, MissingProvenanceError: see :func:`require_sampled`.
        SamplerMismatchError: records of one batch with different specs; a spec at another
            temperature than ``temperature``; greedy, ``raw`` or penalised specs (no density
            the trainer reproduces). The message names the record and the fix.
        ValueError: no records.
    """
    records = list(records)
    if not records:
        raise ValueError('require_trainable: no records')
    first = None
    for i, rec in enumerate(records):
        spec = require_sampled(rec)
        key = f'record {i} ({record_key(rec)})'
        if spec.temperature <= 0:
            raise SamplerMismatchError(f'of {key} is greedy (temperature 0): it has no density to ratio against',
                                       field='provenance.sampling.temperature',
                                       fix='sample GRPO records at a temperature > 0')
        if spec.logp_mode != 'processed':
            raise SamplerMismatchError(f'of {key} is {spec.logp_mode!r}: the trainer ratios against the processed '
                                       'distribution the tokens were drawn from', field='provenance.sampling.logp_mode',
                                       fix="sample with logp_mode='processed'")
        if spec.penalized:
            raise SamplerMismatchError(f'of {key} has penalties ({spec}), which the trainer does not replay',
                                       field='provenance.sampling', fix='train on records sampled without '
                                       'repetition/presence/frequency penalties (checks.replay replays them)')
        if temperature is not None and abs(spec.temperature - temperature) > 1e-9:
            raise SamplerMismatchError(f'of {key} is {spec.temperature} but the ratio is computed at temperature '
                                       f'{temperature}', field='provenance.sampling.temperature',
                                       fix=f'pass temperature={spec.temperature} (or None: the records\' own)')
        if first is None:
            first = spec
        elif spec != first:
            raise SamplerMismatchError(f'of {key} is {spec} but record 0 has {first}: one step ratios against one '
                                       'sampler', field='provenance.sampling',
                                       fix='train records of one sampler per step')
    return first


def _mode_and_support(x, ids, stored, spec, context, tol):
    """Per-token masks: the stored value is the other mode's / another truncated support's."""
    other = replace(spec, logp_mode='raw' if spec.logp_mode == 'processed' else 'processed')
    mode = (replay_logp(x, ids, other, context) - stored).abs() <= tol
    # support: stored == log q_tok - log(mass of a sorted prefix containing the token)
    scaled = processed_logp(x, replace(spec, top_k=0, top_p=1.0, min_p=0.0), context) if spec.temperature > 0 \
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
    kind = torch.full_like(ids, _KIND['policy_change'])
    match = (log_ratio.abs() <= tol) | (replayed == stored)
    if not bool(match.all()):
        mode, support = _mode_and_support(x, ids, stored, spec, context, tol)
        kind[support] = _KIND['support_mismatch']
        kind[mode] = _KIND['logp_mode_mismatch']
    kind[match] = _KIND['match']
    # NaN or +inf anywhere (a -inf replay is a token outside the declared support: ratio 0, not broken)
    bad = (torch.isnan(replayed) | (replayed == math.inf) | ~torch.isfinite(stored)
           | torch.isnan(x).any(-1) | (x == math.inf).any(-1))
    kind[bad] = _KIND['non_finite']
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


def _fit(x, ids, stored, spec, tol, context, fit_rows, check_rows) -> str:
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
    return _fit(logits.double(), torch.as_tensor(ids).long(), torch.as_tensor(stored).double(), spec, tol, context,
                rows, rows[:0]) or None


@dataclass
class RatioStats:
    """Statistics of importance ratios ``exp(replayed - stored)`` over a set of tokens.

    Attributes:
        n: number of tokens. mean, min, max: of the ratio (NaN when n == 0).
        max_abs_dev: ``max |ratio - 1|``: NaN when n == 0, ``inf`` when any ratio is NaN or
            infinite (a non-finite ratio is never within a tolerance).
    """
    n: int
    mean: float
    min: float
    max: float
    max_abs_dev: float

    @classmethod
    def of(cls, log_ratio: torch.Tensor) -> 'RatioStats':
        """Stats of ``exp(log_ratio)`` (``[N]`` float)."""
        if log_ratio.numel() == 0:
            nan = float('nan')
            return cls(0, nan, nan, nan, nan)
        r = log_ratio.double().exp()
        dev = float((r - 1).abs().max()) if bool(torch.isfinite(r).all()) else math.inf
        return cls(int(r.numel()), float(r.mean()), float(r.min()), float(r.max()), dev)


@dataclass
class RecordReplay:
    """Replay of one record (or of one turn of a record scored in its own context).

    Attributes:
        key: the record's identity ``'group/rollout#attempt'`` (or its index as a string), with
            ``' turn k'`` appended for a turn of a record with ``turn_contexts``.
        kind: the record's worst token kind (``'match'`` when nothing mismatched).
        stats: :class:`RatioStats` over its trained tokens.
        token_kinds: ``{kind: count}``.
        rows: ``[N]`` int64 prediction rows replayed (positions of ``action_mask`` == 1).
        log_ratio: ``[N]`` float64 ``replayed - stored``.
        kinds: ``[N]`` int64 index into :data:`TOKEN_KINDS`.
        detail: for ``sampler_mismatch``, the fitted parameter (``'temperature=0.7'``); else ''.
    """
    key: str
    kind: str
    stats: RatioStats
    token_kinds: dict
    rows: torch.Tensor = field(repr=False)
    log_ratio: torch.Tensor = field(repr=False)
    kinds: torch.Tensor = field(repr=False)
    detail: str = ''

    @property
    def ok(self) -> bool:
        """True when every token matched."""
        return self.kind == 'match'


@dataclass
class ReplayReport:
    """Ratio statistics per record and per token kind.

    Attributes:
        records: one :class:`RecordReplay` per record, in input order.
        overall: :class:`RatioStats` over every replayed token.
        by_kind: ``{token kind: RatioStats}`` for the kinds that occurred.
        record_kinds: ``{record kind: count}``.
    """
    records: list
    overall: RatioStats
    by_kind: dict
    record_kinds: dict

    @classmethod
    def of(cls, records: list) -> 'ReplayReport':
        """Aggregate :class:`RecordReplay` results (e.g. from several calls) into one report."""
        lr = torch.cat([r.log_ratio for r in records]) if records else torch.zeros(0, dtype=torch.float64)
        kinds = torch.cat([r.kinds for r in records]) if records else torch.zeros(0, dtype=torch.long)
        by_kind = {TOKEN_KINDS[k]: RatioStats.of(lr[kinds == k]) for k in range(len(TOKEN_KINDS))
                   if bool((kinds == k).any())}
        record_kinds: dict = {}
        for r in records:
            record_kinds[r.kind] = record_kinds.get(r.kind, 0) + 1
        return cls(records=list(records), overall=RatioStats.of(lr), by_kind=by_kind, record_kinds=record_kinds)

    @property
    def ok(self) -> bool:
        """True when every replayed token matched (a non-finite ratio never does)."""
        return all(r.kind == 'match' for r in self.records)

    def table(self) -> str:
        """A plain-text table of the per-kind statistics (the ``agentrl check`` output)."""
        lines = [f'{"token kind":<20} {"tokens":>8} {"ratio mean":>12} {"min":>10} {"max":>10} {"max|r-1|":>10}']
        rows = [('all', self.overall)] + list(self.by_kind.items())
        for name, s in rows:
            lines.append(f'{name:<20} {s.n:>8} {s.mean:>12.6f} {s.min:>10.6f} {s.max:>10.6f} {s.max_abs_dev:>10.2e}')
        lines.append('records: ' + ', '.join(f'{k} {v}' for k, v in self.record_kinds.items()))
        return '\n'.join(lines)


def _judge(key, rows, logits, targets, stored, spec, tol, context, history=None, budget=None) -> RecordReplay:
    """Classify one scored sequence's tokens, fit a sampler to the unexplained ones, summarise.

    ``history`` (a zero-argument callable) builds the rows' :class:`PenaltyContext` when the
    declared spec has no penalty, so that a penalty left out of the declaration can be fitted.
    ``budget`` (``{'fits': n}``) caps the failed fits of one replay: once a few sequences fit no
    sampler, the rest are a policy change too, and a fit scores the whole vocabulary many times.
    """
    x = logits.double()
    log_ratio = replay_logp(x, targets, spec, context) - stored.double()
    detail = ''
    if bool((log_ratio.abs() <= tol).all()):          # all match: skip the (costly) classification
        kinds = torch.zeros(len(rows), dtype=torch.long)
    else:
        log_ratio, kinds = classify_tokens(x, targets, stored, spec, tol, context)
        # one sampler parameter that explains every unexplained token outranks per-token support guesses
        # (with a large vocabulary almost any shift of the normaliser matches *some* sorted prefix)
        pc = ((kinds == _KIND['policy_change']) | (kinds == _KIND['support_mismatch'])).nonzero().flatten()
        if len(pc) >= MIN_FIT_TOKENS and (budget is None or budget['fits'] > 0):
            if context is None and history is not None:
                context = history()
            # fit on the unexplained tokens; the fitted sampler must also keep every matched token matched
            check = (kinds == _KIND['match']).nonzero().flatten()
            fitted = _fit(x, targets, stored.double(), spec, tol, context, pc, check)
            if fitted:
                detail = fitted
                kinds[pc] = _KIND['sampler_mismatch']
            elif budget is not None:
                budget['fits'] -= 1
    counts = {TOKEN_KINDS[k]: int((kinds == k).sum()) for k in range(len(TOKEN_KINDS)) if bool((kinds == k).any())}
    worst = TOKEN_KINDS[int(kinds.max())] if len(kinds) else 'match'
    return RecordReplay(key=key, kind=worst, stats=RatioStats.of(log_ratio), token_kinds=counts, rows=rows.cpu(),
                        log_ratio=log_ratio.cpu(), kinds=kinds.cpu(), detail=detail)


def _turn_starts(record: Trajectory, positions: torch.Tensor) -> torch.Tensor:
    """For each token position, the first policy position of its turn (:func:`agentrl.record.turn_spans`)."""
    start = {k: s for k, s, _ in turn_spans(record)}
    turn = record.turn
    return torch.tensor([start[int(turn[p])] for p in positions.tolist()], dtype=torch.long)


def _penalty_context(ids: torch.Tensor, positions: torch.Tensor, starts: torch.Tensor, prompts=None):
    """:class:`PenaltyContext` of tokens at ``positions`` of ``ids``: context ``ids[:start]`` (or
    ``prompts[i]``), output ``ids[start:position]``."""
    ctxs = [ids[:s] if prompts is None else prompts[i] for i, s in enumerate(starts.tolist())]
    outs = [ids[s:p] for s, p in zip(starts.tolist(), positions.tolist())]
    return PenaltyContext.of(ctxs, outs)


def replay_record(record: Trajectory, logits: torch.Tensor, *, tol: float = 1e-4, key: str | None = None) -> RecordReplay:
    """Replay one record from precomputed logits over its own ids.

    Args:
        record: a sampled record (see :func:`require_sampled`), ``T`` tokens; penalties are
            replayed against each turn's context ``ids[:start]`` (records with ``turn_contexts``
            go through :func:`replay_records`).
        logits: ``[T-1, V]`` (or ``[T, V]``; the last row is ignored): row j predicts ``ids[j+1]``.
        tol: see :func:`classify_tokens`.
        key: label for the report (default: the record's identity).

    Returns:
        :class:`RecordReplay` over the positions with ``action_mask`` 1.

    Raises:
        ScriptedRecordError, MissingProvenanceError: see :func:`require_sampled`.
        ValueError: fewer than ``T-1`` logits rows.
    """
    spec = require_sampled(record)
    T = len(record.ids)
    if logits.shape[0] < T - 1:
        raise ValueError(f'replay_record: {logits.shape[0]} logits rows for a record of {T} tokens; pass '
                         'the model output over the whole sequence (row j predicts ids[j+1])')
    ids = torch.as_tensor(record.ids)
    rows = (torch.as_tensor(record.action_mask) > 0).nonzero().flatten()
    context = None
    if spec.penalized:
        context = _penalty_context(ids, rows + 1, _turn_starts(record.owner, record.turn, rows + 1))
    history = lambda: _penalty_context(ids, rows + 1, _turn_starts(record, rows + 1))  # noqa: E731
    if spec.penalized:
        context = history()
    return _judge(record_key(record) if key is None else key, rows, logits[rows], ids[rows + 1],
                  torch.as_tensor(record.sample_logp)[rows], spec, tol, context,
                  history if record.owner is not None and record.turn is not None else None)


class Scorer:
    """A model as the replay sees it: logits at chosen prediction rows of a right-padded batch.

    Args:
        fn: ``fn(ids [B, T] int64, attention_mask [B, T] int64, rows) -> list`` where ``rows`` is
            B int64 tensors (``rows[b]`` the positions j whose logits predict ``ids[b, j+1]``) and
            the result is B float tensors ``[len(rows[b]), V]``.
        name: what to call the model in reports (a file or folder name).
        pad_id: the id written into padding (masked by ``attention_mask``).
        max_len: longest sequence the model takes (None: no limit).

    Use :meth:`of_model` for any ``ids [B, T] -> logits [B, T, V]`` callable (TinyAgent), or
    :func:`agentrl.engines.scorer.load_scorer` for a checkpoint file or Hugging Face folder.
    """

    def __init__(self, fn, name: str = '', pad_id: int = 0, max_len: int | None = None):
        self.fn, self.name, self.pad_id, self.max_len = fn, name, int(pad_id), max_len

    def __call__(self, ids: torch.Tensor, attention_mask: torch.Tensor, rows: list) -> list:
        return self.fn(ids, attention_mask, rows)

    @classmethod
    def of_model(cls, model, name: str = '', pad_id: int = 0) -> 'Scorer':
        """Wrap ``model(ids [B, T]) -> logits [B, T, V]`` (or an object with ``.logits``), run
        without gradients on the model's device. Right padding is harmless under causal
        attention, so the mask is not passed."""
        device = None
        if isinstance(model, torch.nn.Module):
            p = next(model.parameters(), None)
            device = None if p is None else p.device

        @torch.no_grad()
        def fn(ids, attention_mask, rows):
            out = model(ids.to(device) if device is not None else ids)
            out = getattr(out, 'logits', out)
            if isinstance(out, (tuple, list)):
                out = out[0]
            return [out[b, r.to(out.device)].float().cpu() for b, r in enumerate(rows)]

        return cls(fn, name or type(model).__name__, pad_id, getattr(model, 'max_len', None))


@dataclass
class _Unit:
    """One scored sequence: a whole record, or one turn in its own sampling context."""
    key: str
    ids: torch.Tensor          # [L]
    rows: torch.Tensor         # [n] prediction rows within ids
    out_rows: torch.Tensor     # [n] the record's own prediction rows (reported)
    stored: torch.Tensor       # [n]
    spec: SamplingSpec
    history: object            # () -> PenaltyContext of the rows (None when owner/turn are missing)

    def context(self):
        return self.history() if self.spec.penalized else None


def _units(n: int, rec: Trajectory) -> list:
    """The scored sequences of one record: itself, or one per turn with ``turn_contexts``."""
    spec = require_sampled(rec)
    key = record_key(rec) if rec.provenance is not None and (rec.provenance.group_id or rec.provenance.rollout_id) \
        else str(n)
    ids = torch.as_tensor(rec.ids, dtype=torch.long)
    rows = (torch.as_tensor(rec.action_mask) > 0).nonzero().flatten()
    if rec.owner is None or rec.turn is None:
        if spec.penalized or rec.turn_contexts is not None:
            raise ReplayUnsupportedError('is missing, so the turns (their contexts, the ids penalties depend on) '
                                         'cannot be found', field='owner' if rec.owner is None else 'turn',
                                         fix='build records with Trajectory.from_tokens or TokenLog')
        return [_Unit(key, ids, rows, rows, torch.as_tensor(rec.sample_logp)[rows], spec, None)]
    if rec.turn_contexts is None:
        history = lambda: _penalty_context(ids, rows + 1, _turn_starts(rec, rows + 1))  # noqa: E731
        return [_Unit(key, ids, rows, rows, torch.as_tensor(rec.sample_logp)[rows], spec, history)]
    try:
        parts = turn_records(rec)
    except ValueError as e:
        raise ReplayUnsupportedError(f'is inconsistent with the record ({e})', field='turn_contexts',
                                     fix='store one (start, context_ids) per turn, start = the turn\'s first '
                                         'policy token') from None
    out = []
    for part, (k, s, e) in zip(parts, turn_spans(rec)):
        ctx_len = len(part.ids) - (e - s)
        prows = (part.action_mask > 0).nonzero().flatten()
        history = (lambda part=part, prows=prows, c=ctx_len:
                   _penalty_context(part.ids, prows + 1, torch.full_like(prows, c)))
        out.append(_Unit(f'{key} turn {k}', part.ids, prows, prows + s - ctx_len, part.sample_logp[prows], spec,
                         history))
    return out


def replay_records(records, scorer, *, tol: float = 1e-4, batch_size: int = 8) -> ReplayReport:
    """Replay every record's trained tokens with a scorer under each record's declared sampler.

    Records are right-padded in batches of ``batch_size`` and scored in one call per batch; the
    logits at each action row are replayed under the record's own
    :class:`~agentrl.record.SamplingSpec` (penalties against each turn's context and the turn's
    ids so far). A record with ``turn_contexts`` is scored turn by turn, each turn after the
    context it was sampled in (one report entry per turn, key ``'... turn k'``). For the model
    that sampled the records every ratio is 1 within float error (the step-0 proof).

    Args:
        records: sampled :class:`~agentrl.record.Trajectory` records.
        scorer: a :class:`Scorer` (or any callable with its signature).
        tol: agreement tolerance in nats (default 1e-4).
        batch_size: sequences per scorer call.

    Returns:
        :class:`ReplayReport`; ``report.ok`` when every token matched, a non-finite ratio is
        the ``non_finite`` kind and ``max_abs_dev = inf``.

    Raises:
        ScriptedRecordError, MissingProvenanceError: a record that must not enter a ratio
            (:func:`require_sampled`).
        ReplayUnsupportedError: inconsistent ``turn_contexts``; a record the scorer cannot take
            (longer than its context, ids outside its vocabulary). Fix: replay with the model (and
            tokenizer) that sampled the records.
    """
    units = [u for n, rec in enumerate(records) for u in _units(n, rec)]
    max_len = getattr(scorer, 'max_len', None)
    pad = getattr(scorer, 'pad_id', 0)
    reps, budget = [], {'fits': FIT_BUDGET}
    for start in range(0, len(units), batch_size):
        chunk = units[start:start + batch_size]
        L = max(len(u.ids) for u in chunk)
        if max_len is not None and L > max_len:
            u = max(chunk, key=lambda u: len(u.ids))
            raise ReplayUnsupportedError(f'has {len(u.ids)} tokens to score but the model takes at most {max_len}',
                                         field='ids', fix='replay with the model that sampled the record')
        ids = torch.full((len(chunk), L), pad, dtype=torch.long)
        mask = torch.zeros((len(chunk), L), dtype=torch.long)
        for b, u in enumerate(chunk):
            ids[b, :len(u.ids)] = u.ids
            mask[b, :len(u.ids)] = 1
        try:
            logits = scorer(ids, mask, [u.rows for u in chunk])
        except (ValueError, IndexError, RuntimeError) as e:   # ids outside the vocabulary, too long
            raise ReplayUnsupportedError(f'cannot be scored by the model ({type(e).__name__}: {e})', field='ids',
                                         fix='replay with the model (and tokenizer) that sampled the record') from e
        for u, lg in zip(chunk, logits):
            reps.append(_judge(u.key, u.out_rows, lg, u.ids[u.rows + 1], u.stored, u.spec, tol, u.context(),
                               u.history, budget))
    return ReplayReport.of(reps)


def replay_check(records, model, *, tol: float = 1e-4, batch_size: int = 1) -> ReplayReport:
    """Replay every record's trained tokens with ``model`` under each record's declared sampler.

    For an unchanged model every ratio ``exp(replayed - stored)`` is 1 (within float error);
    mismatches are classified by cause (module docstring). Stored log-probs are never rescaled.
    Records with per-turn ``turn_contexts`` are scored turn by turn (:func:`replay_records`).

    Args:
        records: iterable of sampled :class:`~agentrl.record.Trajectory`.
        model: a :class:`Scorer` (e.g. :func:`agentrl.engines.scorer.load_scorer`), or
            ``ids [B, T] -> logits [B, T, V]`` (a TinyAgent, or any such callable), run without
            gradients on the model's device.
        tol: see :func:`classify_tokens`.
        batch_size: records per scorer call (default 1: no padding).

    Returns:
        :class:`ReplayReport`.

    Raises:
        ScriptedRecordError: a record with ``provenance.logp_placeholder`` (scripted); such a
            record never enters an importance ratio. Fix: filter them out first.
        MissingProvenanceError: a record without a sampling spec.
        ReplayUnsupportedError: a record the model cannot take (e.g. longer than its context),
            or inconsistent ``turn_contexts``.
    """
    scorer = model if isinstance(model, Scorer) else Scorer.of_model(model)
    return replay_records(list(records), scorer, tol=tol, batch_size=batch_size)
