"""L3: replay each sampled token under the declared sampler and compare with the stored log-prob.

Two log-prob modes (:data:`agentrl.record.LOGP_MODES`): ``processed`` is the log-prob under the
distribution actually sampled from (temperature, then top-k / top-p / min-p support, renormalised);
``raw`` is ``log_softmax`` of the unmodified logits. A stored log-prob is never rescaled: moving
between modes needs the logits (:func:`convert_logp` raises without them).

A mismatch is classified per token, in this order:

* ``match``: replayed and stored agree within ``tol`` (nats);
* ``logp_mode_mismatch``: the stored value is the *other* mode's log-prob (e.g. raw stored while
  ``processed`` is declared);
* ``support_mismatch``: the stored value is the token's probability renormalised over some other
  truncated support (a top-k / top-p / min-p prefix of the sorted distribution) than the declared
  one; the weights did not move;
* ``policy_change``: none of the above; the model that replays is not the one that sampled.

Source: issue 4, item 3; lesson 004 ("Reconstruct one probability before aggregating": raw
``[0.50, 0.30, 0.15, 0.05]``, top-k 2 -> token A 0.625, ratio 1; full vocabulary 0.50 -> 0.8).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

import torch

from ..record import LOGP_MODES, SamplingSpec, Trajectory
from .errors import LogpConversionError, MissingProvenanceError, ReplayUnsupportedError, ScriptedRecordError
from .identity import record_key

__all__ = ['TOKEN_KINDS', 'support_mask', 'replay_logp', 'convert_logp', 'require_sampled', 'classify_tokens',
           'RatioStats', 'RecordReplay', 'ReplayReport', 'replay_record', 'replay_check']

#: Token classifications, from benign to severe.
TOKEN_KINDS = ('match', 'logp_mode_mismatch', 'support_mismatch', 'policy_change')


def _effective_temperature(spec: SamplingSpec) -> float:
    # temperature 0 is greedy; its stored log-prob is the argmax's at temperature 1 (record.py)
    return spec.temperature if spec.temperature > 0 else 1.0


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
        ``[N, V]`` bool, True where the token is in the support (the argmax always is).

    Source: issue 4, item 3 (temperature, then top-k / top-p / min-p, renormalised); the order of
    Hugging Face ``generate``'s logits warpers.
    """
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


def replay_logp(logits: torch.Tensor, ids: torch.Tensor, spec: SamplingSpec) -> torch.Tensor:
    """Recompute each sampled token's log-prob under the declared sampler.

    Args:
        logits: ``[N, V]`` (or ``[V]`` for one token) logits of the rows that predict ``ids``.
        ids: ``[N]`` int64 sampled token ids (or a scalar with ``[V]`` logits).
        spec: the declared sampler; ``logp_mode='raw'`` gives ``log_softmax(logits)[ids]``,
            ``'processed'`` gives the log-prob after temperature and the support of
            :func:`support_mask`, renormalised (-inf for a token outside the support). Temperature
            0 (greedy) gives the temperature-1 log-prob, as :func:`agentrl.model.sample_next` stores.

    Returns:
        ``[N]`` float64 nats (a 0-d tensor for a single token).

    Raises:
        ValueError: ``logits`` and ``ids`` disagree in their number of rows (fix: one logits row
            per sampled id, the row that predicts it).

    Example:
        >>> replay_logp(torch.tensor([2., 1., 0.]), torch.tensor(0), SamplingSpec(temperature=0.5))
        tensor(-0.1429, dtype=torch.float64)

    Source: issue 4, item 3 (logits [2, 1, 0], T = 0.5, token 0 -> -0.1429).
    """
    single = logits.dim() == 1
    x = logits.reshape(-1, logits.shape[-1]).double()
    ids = torch.as_tensor(ids, dtype=torch.long).reshape(-1).to(x.device)
    if len(ids) != len(x):
        raise ValueError(f'replay_logp: {len(x)} logits rows for {len(ids)} ids; pass the row that predicts '
                         'each sampled id (row j scores ids[j+1] of the sequence)')
    if spec.logp_mode == 'raw' or spec.temperature <= 0:
        lp = torch.log_softmax(x, dim=-1)
    else:
        lp = torch.log_softmax(x / spec.temperature, dim=-1)
        lp = _renorm(lp, support_mask(lp, spec))
    out = lp.gather(-1, ids[:, None]).squeeze(-1)
    return out[0] if single else out


def convert_logp(sample_logp: torch.Tensor, spec: SamplingSpec, to_mode: str, *, logits=None, ids=None):
    """Express stored log-probs in another mode, by replaying the logits; never by rescaling.

    Args:
        sample_logp: ``[N]`` stored log-probs, in ``spec.logp_mode``.
        spec: the sampler they were stored under.
        to_mode: ``'raw'`` or ``'processed'``.
        logits: ``[N, V]`` the rows that predicted the tokens (required unless the mode is unchanged).
        ids: ``[N]`` the sampled ids (required with ``logits``).

    Returns:
        ``[N]`` float32: a copy when the mode is unchanged, else the replayed log-probs.

    Raises:
        LogpConversionError: the mode changes and ``logits`` is None; the truncation support and
            its normaliser cannot be recovered from a stored number. Fix: replay the model and pass
            its logits (or use :func:`replay_logp`).
        ValueError: ``to_mode`` is not a log-prob mode.

    Source: issue 4, item 3 ("converting raw to processed without logits raises").
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
    return replay_logp(logits, ids, replace(spec, logp_mode=to_mode)).float()


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


def classify_tokens(logits: torch.Tensor, ids: torch.Tensor, stored: torch.Tensor, spec: SamplingSpec,
                    tol: float = 1e-4) -> tuple[torch.Tensor, torch.Tensor]:
    """Replay tokens and classify each mismatch (see the module docstring for the kinds).

    Args:
        logits: ``[N, V]`` rows predicting the sampled ids.
        ids: ``[N]`` int64 sampled ids.
        stored: ``[N]`` stored log-probs (nats).
        spec: declared sampler.
        tol: agreement tolerance on ``|replayed - stored|`` in nats (default 1e-4).

    Returns:
        ``(log_ratio [N] float64, kind [N] int64)``: ``log_ratio = replayed - stored`` under the
        declared spec (ratio ``exp(log_ratio)``), ``kind`` an index into :data:`TOKEN_KINDS`.

    Source: issue 4, item 3 (log-prob-mode mismatch ratio ~1.303; support mismatch 0.8 is not a
    policy change).
    """
    x = logits.reshape(-1, logits.shape[-1]).double()
    ids = torch.as_tensor(ids, dtype=torch.long).reshape(-1).to(x.device)
    stored = torch.as_tensor(stored).double().reshape(-1).to(x.device)
    replayed = replay_logp(x, ids, spec)
    log_ratio = replayed - stored
    kind = torch.full_like(ids, TOKEN_KINDS.index('policy_change'))
    match = (log_ratio.abs() <= tol) | (replayed == stored)
    other = replace(spec, logp_mode='raw' if spec.logp_mode == 'processed' else 'processed')
    mode = (replay_logp(x, ids, other) - stored).abs() <= tol
    # support: stored == log q_tok - log(mass of a sorted prefix containing the token)
    lq = torch.log_softmax(x / _effective_temperature(spec), dim=-1)
    lq_tok = lq.gather(-1, ids[:, None])
    srt = lq.sort(dim=-1, descending=True).values
    lcs = torch.logcumsumexp(srt, dim=-1)
    rank = (lq > lq_tok).sum(-1, keepdim=True)
    cand = (lq_tok - lcs - stored[:, None]).abs()
    cand = cand.masked_fill(torch.arange(x.shape[-1], device=x.device)[None] < rank, math.inf)
    support = cand.min(-1).values <= tol
    kind[support] = TOKEN_KINDS.index('support_mismatch')
    kind[mode] = TOKEN_KINDS.index('logp_mode_mismatch')
    kind[match] = TOKEN_KINDS.index('match')
    return log_ratio, kind


@dataclass
class RatioStats:
    """Statistics of importance ratios ``exp(replayed - stored)`` over a set of tokens.

    Attributes:
        n: number of tokens. mean, min, max: of the ratio (NaN when n == 0).
        max_abs_dev: ``max |ratio - 1|`` (NaN when n == 0).
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
        return cls(int(r.numel()), float(r.mean()), float(r.min()), float(r.max()), float((r - 1).abs().max()))


@dataclass
class RecordReplay:
    """Replay of one record.

    Attributes:
        key: the record's identity ``'group/rollout#attempt'`` (or its index as a string).
        kind: the record's worst token kind (``'match'`` when nothing mismatched).
        stats: :class:`RatioStats` over its trained tokens.
        token_kinds: ``{kind: count}``.
        rows: ``[N]`` int64 prediction rows replayed (positions of ``action_mask`` == 1).
        log_ratio: ``[N]`` float64 ``replayed - stored``.
        kinds: ``[N]`` int64 index into :data:`TOKEN_KINDS`.
    """
    key: str
    kind: str
    stats: RatioStats
    token_kinds: dict
    rows: torch.Tensor = field(repr=False)
    log_ratio: torch.Tensor = field(repr=False)
    kinds: torch.Tensor = field(repr=False)


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
        kk = torch.cat([r.kinds for r in records]) if records else torch.zeros(0, dtype=torch.long)
        by_kind = {TOKEN_KINDS[k]: RatioStats.of(lr[kk == k]) for k in range(len(TOKEN_KINDS))
                   if bool((kk == k).any())}
        record_kinds: dict = {}
        for r in records:
            record_kinds[r.kind] = record_kinds.get(r.kind, 0) + 1
        return cls(records=list(records), overall=RatioStats.of(lr), by_kind=by_kind, record_kinds=record_kinds)

    @property
    def ok(self) -> bool:
        """True when every replayed token matched."""
        return all(r.kind == 'match' for r in self.records)

    def table(self) -> str:
        """A plain-text table of the per-kind statistics (the ``agentrl check`` output)."""
        lines = [f'{"token kind":<20} {"tokens":>8} {"ratio mean":>12} {"min":>10} {"max":>10} {"max|r-1|":>10}']
        rows = [('all', self.overall)] + list(self.by_kind.items())
        for name, s in rows:
            lines.append(f'{name:<20} {s.n:>8} {s.mean:>12.6f} {s.min:>10.6f} {s.max:>10.6f} {s.max_abs_dev:>10.2e}')
        lines.append('records: ' + ', '.join(f'{k} {v}' for k, v in self.record_kinds.items()))
        return '\n'.join(lines)


def replay_record(record: Trajectory, logits: torch.Tensor, *, tol: float = 1e-4, key: str | None = None) -> RecordReplay:
    """Replay one record from precomputed logits.

    Args:
        record: a sampled record (see :func:`require_sampled`), ``T`` tokens.
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
    rows = (torch.as_tensor(record.action_mask) > 0).nonzero().flatten()
    targets = torch.as_tensor(record.ids)[rows + 1]
    log_ratio, kinds = classify_tokens(logits[rows], targets, torch.as_tensor(record.sample_logp)[rows], spec, tol)
    counts = {TOKEN_KINDS[k]: int((kinds == k).sum()) for k in range(len(TOKEN_KINDS)) if bool((kinds == k).any())}
    worst = TOKEN_KINDS[int(kinds.max())] if len(kinds) else 'match'
    return RecordReplay(key=record_key(record) if key is None else key, kind=worst, stats=RatioStats.of(log_ratio), token_kinds=counts, rows=rows.cpu(),
                        log_ratio=log_ratio.cpu(), kinds=kinds.cpu())


def _model_logits(model, ids: torch.Tensor) -> torch.Tensor:
    device = None
    if isinstance(model, torch.nn.Module):
        p = next(model.parameters(), None)
        device = None if p is None else p.device
    x = ids[None].to(device) if device is not None else ids[None]
    with torch.no_grad():
        out = model(x)
    out = getattr(out, 'logits', out)
    if isinstance(out, (tuple, list)):
        out = out[0]
    return out[0].float()


def replay_check(records, model, *, tol: float = 1e-4) -> ReplayReport:
    """Replay every record's trained tokens with ``model`` under each record's declared sampler.

    For an unchanged model every ratio ``exp(replayed - stored)`` is 1 (within float error);
    mismatches are classified as log-prob-mode, support or policy change (module docstring).
    Stored log-probs are never rescaled.

    Args:
        records: iterable of sampled :class:`~agentrl.record.Trajectory`.
        model: ``ids [1, T] -> logits [1, T, V]`` (a TinyAgent, a Hugging Face causal LM, or any
            callable); run without gradients on the model's device.
        tol: see :func:`classify_tokens`.

    Returns:
        :class:`ReplayReport`.

    Raises:
        ScriptedRecordError: a record with ``provenance.logp_placeholder`` (scripted); such a
            record never enters an importance ratio. Fix: filter them out first.
        MissingProvenanceError: a record without a sampling spec.
        ReplayUnsupportedError: a record with per-turn ``turn_contexts`` (not replayed yet; fix:
            replay each turn's context yourself with :func:`replay_record`), or one the model
            cannot take (e.g. longer than its context).

    Source: issue 4, item 3.
    """
    reps = []
    for i, rec in enumerate(records):
        require_sampled(rec)
        if rec.turn_contexts is not None:
            raise ReplayUnsupportedError(
                'is set: the record is scored with per-turn contexts, which replay_check does not rebuild',
                field='turn_contexts', fix='replay each turn with replay_record(record, logits) on its context')
        try:
            logits = _model_logits(model, torch.as_tensor(rec.ids, dtype=torch.long))
        except (ValueError, IndexError, RuntimeError) as e:  # too long for the context, ids outside the vocabulary
            raise ReplayUnsupportedError(f'cannot be scored by the model ({type(e).__name__}: {e})', field='ids',
                                         fix='replay with the model (and tokenizer) that sampled the record') from e
        reps.append(replay_record(rec, logits, tol=tol))
    return ReplayReport.of(reps)
