"""L3: replay each sampled token under the declared sampler and compare with the stored log-prob.

The log-prob modes (:data:`agentrl.record.LOGP_MODES`) are docs/design.md#sampling's. A stored
log-prob is never rescaled: moving between modes needs the logits (:func:`convert_logp` raises without them). The
arithmetic is :mod:`agentrl.sampling`'s, the very code that sampled.

The one replay, :func:`replay_records`, runs over a *scorer*: any callable
``score(ids [B, T] int64, attention_mask [B, T] int64, rows) -> logits`` (see :class:`Scorer`),
so TinyAgent checkpoints and Hugging Face models replay the same way
(:func:`agentrl.engines.scorer.load_scorer`). Records with per-turn ``turn_contexts`` are scored turn by turn
(docs/design.md#replay).

The per-token kinds (``match`` ... ``non_finite``) and the sampler-fit search are
:mod:`agentrl.checks.classify`; the gates :func:`require_sampled` / :func:`require_trainable` are
:mod:`agentrl.checks.gate` (both re-exported here).

Source: the book's replay rule ("Reconstruct one probability before aggregating": raw
``[0.50, 0.30, 0.15, 0.05]``, top-k 2 -> token A 0.625, ratio 1; full vocabulary 0.50 -> 0.8).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from .._lazy import lazy_module

torch = lazy_module('torch')

from ..batching import pad_rows
from ..record import SamplingSpec, Trajectory, turn_records, turn_spans
from ..sampling import PenaltyContext
from .classify import (FIT_BUDGET, MIN_FIT_TOKENS, TOKEN_KINDS, KIND_CODE, fit_verified, classify_tokens,  # noqa: F401
                       convert_logp, fit_sampler, replay_logp, support_mask)
from .constrained import constrained_logits, forced_positions, undeclared_constraint
from .errors import ReplayUnsupportedError
from .gate import require_sampled, require_trainable  # noqa: F401 - re-exported
from .identity import record_key

__all__ = ['TOKEN_KINDS', 'MIN_FIT_TOKENS', 'FIT_BUDGET', 'support_mask', 'replay_logp', 'convert_logp', 'require_sampled',
           'require_trainable', 'classify_tokens', 'fit_sampler', 'RatioStats', 'RecordReplay', 'ReplayReport',
           'replay_record', 'Scorer', 'score_sequences', 'replay_records', 'replay_check', 'mask_shift']


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
        detail: for ``sampler_mismatch``, the fitted parameter (``'temperature=0.7'``); for
            ``mask_shift``, what :func:`mask_shift` found; for a ``support_mismatch`` an undeclared
            grammar explains, that cause; else ''.
        forced: trained tokens whose declared grammar allowed only them (log-prob 0, no policy gradient).
    """
    key: str
    kind: str
    stats: RatioStats
    token_kinds: dict
    rows: torch.Tensor = field(repr=False)
    log_ratio: torch.Tensor = field(repr=False)
    kinds: torch.Tensor = field(repr=False)
    detail: str = ''
    forced: int = 0

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
        shifted = [r for r in self.records if r.kind == 'mask_shift']
        if shifted:
            lines.append(f'mask_shift: {len(shifted)} records, e.g. {shifted[0].key}: {shifted[0].detail}')
        if self.forced:
            lines.append(f'forced tokens (grammar support of one token, no policy gradient): {self.forced}')
        return '\n'.join(lines)

    @property
    def forced(self) -> int:
        """Trained tokens whose declared grammar allowed only them, over every record."""
        return sum(r.forced for r in self.records)


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
        detail = mask_shift(rows, kinds != KIND_CODE['match'], stored)
        if detail:
            kinds[kinds != KIND_CODE['match']] = KIND_CODE['mask_shift']
        # one sampler parameter that explains every unexplained token outranks per-token support guesses
        # (with a large vocabulary almost any shift of the normaliser matches *some* sorted prefix)
        unexplained = (kinds == KIND_CODE['policy_change']) | (kinds == KIND_CODE['support_mismatch'])
        pc = unexplained.nonzero().flatten()
        if not detail and len(pc) >= MIN_FIT_TOKENS and (budget is None or budget['fits'] > 0):
            if context is None and history is not None:
                context = history()
            # fit on the unexplained tokens; the fitted sampler must also keep every matched token matched
            check = (kinds == KIND_CODE['match']).nonzero().flatten()
            fitted = fit_verified(x, targets, stored.double(), spec, tol, context, pc, check)
            if fitted:
                detail = fitted
                kinds[pc] = KIND_CODE['sampler_mismatch']
            elif budget is not None:
                budget['fits'] -= 1
        cause = '' if detail else undeclared_constraint(spec, log_ratio, unexplained, stored.double())
        if cause:                                     # no sampler fits: a grammar mask left out of the declaration
            detail = cause
            kinds[pc] = KIND_CODE['support_mismatch']
    counts = {TOKEN_KINDS[k]: int((kinds == k).sum()) for k in range(len(TOKEN_KINDS)) if bool((kinds == k).any())}
    worst = TOKEN_KINDS[int(kinds.max())] if len(kinds) else 'match'
    return RecordReplay(key=key, kind=worst, stats=RatioStats.of(log_ratio), token_kinds=counts, rows=rows.cpu(),
                        log_ratio=log_ratio.cpu(), kinds=kinds.cpu(), detail=detail)


def mask_shift(rows: torch.Tensor, bad: torch.Tensor, stored: torch.Tensor) -> str:
    """Name a one-token shift of the mask against the ids, or ''.

    Args:
        rows: ``[N]`` int64 trained prediction rows (ascending). bad: ``[N]`` bool, the rows whose
            replay mismatched. stored: ``[N]`` stored log-probs of those rows.

    Returns:
        ``'mask shifted one token early: ...'`` (or ``late``) when the mismatched rows are all the
        first (or all the last) row of a run of trained rows and each stores exactly 0.0, the
        log-prob of a token that was never sampled; else ''. Such a record was not sampled by
        another model: its mask was moved one token (a ``[T]`` own-index mask taken as ``[T-1]``).
    """
    if not bool(bad.any()) or not bool((stored[bad] == 0).all()):
        return ''
    r = rows.tolist()
    starts = {i for i in range(len(r)) if i == 0 or r[i] != r[i - 1] + 1}
    ends = {i for i in range(len(r)) if i == len(r) - 1 or r[i + 1] != r[i] + 1}
    hit = set(bad.nonzero().flatten().tolist())
    for where, side, fix in ((starts, 'early', 'starts one token before'), (ends, 'late', 'ends one token after')):
        if hit <= where:
            return (f'mask shifted one token {side}: {len(hit)} trained rows (first ids[{r[min(hit)] + 1}]) store '
                    f'log-prob 0.0, a token never sampled; the mask {fix} each turn (a [T] mask read as [T-1] or '
                    'the reverse), not a policy change')
    return ''


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


def replay_record(record: Trajectory, logits: torch.Tensor, *, tol: float = 1e-4, key: str | None = None,
                  tokenizer=None) -> RecordReplay:
    """Replay one record from precomputed logits over its own ids.

    Args:
        record: a sampled record (see :func:`require_sampled`), ``T`` tokens; penalties are
            replayed against each turn's context ``ids[:start]`` (records with ``turn_contexts``
            go through :func:`replay_records`).
        logits: ``[T-1, V]`` (or ``[T, V]``; the last row is ignored): row j predicts ``ids[j+1]``.
        tol: see :func:`classify_tokens`.
        key: label for the report (default: the record's identity).
        tokenizer: the ids' tokenizer, for a record whose spec declares a grammar constraint.

    Returns:
        :class:`RecordReplay` over the positions with ``action_mask`` 1.

    Raises:
        ScriptedRecordError, MissingProvenanceError: see :func:`require_sampled`.
        ValueError: fewer than ``T-1`` logits rows.
        ConstrainedSupportError: see :func:`agentrl.checks.constrained.constrained_logits`.
    """
    spec = require_sampled(record)
    T = len(record.ids)
    if logits.shape[0] < T - 1:
        raise ValueError(f'replay_record: {logits.shape[0]} logits rows for a record of {T} tokens; pass '
                         'the model output over the whole sequence (row j predicts ids[j+1])')
    ids = torch.as_tensor(record.ids)
    rows = (torch.as_tensor(record.action_mask) > 0).nonzero().flatten()
    context = None
    history = lambda: _penalty_context(ids, rows + 1, _turn_starts(record, rows + 1))  # noqa: E731
    if spec.penalized:
        context = history()
    key = record_key(record) if key is None else key
    lg, support = logits[rows], None
    if spec.constraint is not None:
        lg, support = constrained_logits(spec, ids, rows, _turn_starts(record, rows + 1), lg, tokenizer, key)
    rep = _judge(key, rows, lg, ids[rows + 1], torch.as_tensor(record.sample_logp)[rows], spec, tol, context,
                 history if record.owner is not None and record.turn is not None else None)
    rep.forced = int(forced_positions(support).sum())
    return rep


class Scorer:
    """A model as the replay sees it: logits at chosen prediction rows of a right-padded batch.

    Args:
        fn: ``fn(ids [B, T] int64, attention_mask [B, T] int64, rows) -> list`` where ``rows`` is
            B int64 tensors (``rows[b]`` the positions j whose logits predict ``ids[b, j+1]``) and
            the result is B float tensors ``[len(rows[b]), V]``.
        name: what to call the model in reports (a file or folder name).
        pad_id: the id written into padding (masked by ``attention_mask``).
        max_len: longest sequence the model takes (None: no limit).
        packed: optional ``packed(ids [R, N] int64, position_ids [R, N] int64, r [K], j [K]) -> [K, V]``
            float32 logits of packed rows (records end to end, positions restarting at 0, each record
            attending only to itself) at the K (row, column) pairs; None: the scorer only takes padded
            batches. :func:`score_sequences` prefers it.

    Use :meth:`of_model` for any ``ids [B, T] -> logits [B, T, V]`` callable (TinyAgent), or
    :func:`agentrl.engines.scorer.load_scorer` for a checkpoint file or Hugging Face folder.
    """

    def __init__(self, fn, name: str = '', pad_id: int = 0, max_len: int | None = None, packed=None):
        self.fn, self.name, self.pad_id, self.max_len = fn, name, int(pad_id), max_len
        self.packed = packed

    def __call__(self, ids: torch.Tensor, attention_mask: torch.Tensor, rows: list) -> list:
        return self.fn(ids, attention_mask, rows)

    @classmethod
    def of_model(cls, model, name: str = '', pad_id: int = 0) -> 'Scorer':
        """Wrap ``model(ids [B, T]) -> logits [B, T, V]`` (or an object with ``.logits``), run
        without gradients on the model's device, in eval mode (dropout off, as at sampling; a
        module's mode is restored after). Right padding is harmless under causal attention, so
        the mask is not passed. A :class:`~agentrl.model.TinyAgent` also scores packed rows
        (``forward(ids, position_ids=...)``)."""
        device = None
        module = model if isinstance(model, torch.nn.Module) else None
        if module is not None:
            p = next(module.parameters(), None)
            device = None if p is None else p.device

        @torch.no_grad()
        def fn(ids, attention_mask, rows):
            was = module is not None and module.training
            if was:
                module.eval()
            try:
                out = model(ids.to(device) if device is not None else ids)
            finally:
                if was:
                    module.train()
            out = getattr(out, 'logits', out)
            if isinstance(out, (tuple, list)):
                out = out[0]
            return [out[b, r.to(out.device)].float().cpu() for b, r in enumerate(rows)]

        packed = None
        from ..model import TinyAgent                    # imports torch: not at CLI start-up
        if isinstance(model, TinyAgent):                 # masks attention by record from position_ids

            @torch.no_grad()
            def packed(ids, position_ids, r, j):
                was = model.training
                model.eval()
                try:
                    out = model(ids.to(device), position_ids=position_ids.to(device))
                finally:
                    model.train(was)
                return out[r.to(out.device), j.to(out.device)].float().cpu()

        return cls(fn, name or type(model).__name__, pad_id, getattr(model, 'max_len', None), packed)


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
    starts: object = None      # () -> [n] each row's turn start (the grammar's; None when owner/turn are missing)
    images: list = None        # the record's info['images'] (scored with its pixels: Scorer.vision)

    def context(self):
        return self.history() if self.spec.penalized else None


def _units(n: int, rec: Trajectory) -> list:
    """The scored sequences of one record: itself, or one per turn with ``turn_contexts``."""
    out = _record_units(n, rec)
    images = rec.info.get('images') if isinstance(rec.info, dict) else None
    for u in out:
        u.images = images or None
    return out


def _record_units(n: int, rec: Trajectory) -> list:
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
        return [_Unit(key, ids, rows, rows, torch.as_tensor(rec.sample_logp)[rows], spec, history,
                      lambda: _turn_starts(rec, rows + 1))]
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
                         history, lambda prows=prows, c=ctx_len: torch.full_like(prows, c)))
    return out


def _score_padded(seqs: list, rows: list, scorer, batch_size: int, pad: int) -> list:
    """Logits at ``rows[i]`` of each sequence: right-padded batches of ``batch_size`` sequences."""
    out = []
    for start in range(0, len(seqs), batch_size):
        chunk = seqs[start:start + batch_size]
        L = max(len(x) for x in chunk)
        ids = pad_rows([x.long() for x in chunk], L, pad)
        mask = pad_rows([torch.ones(len(x), dtype=torch.long) for x in chunk], L, 0)
        out.extend(scorer(ids, mask, rows[start:start + batch_size]))
    return out


def _score_packed(seqs: list, rows: list, scorer, batch_size: int, pad: int) -> list:
    """Logits at ``rows[i]`` of each sequence: sequences laid end to end by first-fit decreasing into rows as
    wide as the longest (:func:`agentrl.packing.pack_order`), ``batch_size`` rows per ``scorer.packed`` call."""
    lens = [len(x) for x in seqs]
    from ..packing import pack_order                     # imports torch: not at CLI start-up
    bins = pack_order(lens, max(lens))
    out: list = [None] * len(seqs)
    for start in range(0, len(bins), batch_size):
        group = bins[start:start + batch_size]
        N = max(sum(lens[i] for i in b) for b in group)
        ids = torch.full((len(group), N), pad, dtype=torch.long)
        pos = torch.zeros((len(group), N), dtype=torch.long)      # 0 on padding: each pad is a segment of its own
        rr, jj, order = [], [], []
        for ri, b in enumerate(group):
            off = 0
            for i in b:
                ids[ri, off:off + lens[i]] = seqs[i]
                pos[ri, off:off + lens[i]] = torch.arange(lens[i])
                rr.append(torch.full((len(rows[i]),), ri, dtype=torch.long))
                jj.append(rows[i].long() + off)
                order.append(i)
                off += lens[i]
        logits = scorer.packed(ids, pos, torch.cat(rr), torch.cat(jj))
        for i, lg in zip(order, torch.split(logits, [len(rows[i]) for i in order])):
            out[i] = lg
    return out


def score_sequences(seqs: list, rows: list, scorer, *, batch_size: int = 8, packed: bool = True) -> list:
    """Logits at chosen prediction rows of each sequence, from packed rows or right-padded batches.

    Args:
        seqs: S int64 tensors ``[L_i]`` (token ids).
        rows: S int64 tensors; ``rows[i]`` are the positions j of ``seqs[i]`` whose logits predict ``seqs[i][j+1]``.
        scorer: a :class:`Scorer` (or a callable with its signature).
        batch_size: padded: sequences per scorer call; packed: rows per call (each as wide as the longest sequence).
        packed: score packed rows through ``scorer.packed`` (default; each record attends only to itself, so
            the logits equal the padded path's within fp32 rounding, 1e-5 tested in tests/test_replay_packed.py);
            False, or a scorer without ``packed``: right-padded batches (``scorer(ids, mask, rows)``).

    Returns:
        S float32 tensors ``[len(rows[i]), V]``, in input order.

    Raises:
        ReplayUnsupportedError: the scorer raised ValueError, IndexError or RuntimeError (ids outside its
            vocabulary, a sequence too long); fix: score with the model (and tokenizer) that sampled them.
    """
    if not seqs:
        return []
    pad = getattr(scorer, 'pad_id', 0)
    fn = _score_packed if packed and getattr(scorer, 'packed', None) is not None else _score_padded
    try:
        return fn(seqs, rows, scorer, batch_size, pad)
    except (ValueError, IndexError, RuntimeError) as e:   # ids outside the vocabulary, too long
        raise ReplayUnsupportedError(f'cannot be scored by the model ({type(e).__name__}: {e})', field='ids',
                                     fix='replay with the model (and tokenizer) that sampled the record') from e


def _score_images(u: _Unit, scorer) -> torch.Tensor:
    """``[n, V]`` logits of a unit whose record holds images, from ``scorer.vision(ids, images, rows)``."""
    fn = getattr(scorer, 'vision', None)
    if fn is None:
        raise ReplayUnsupportedError(f'({u.key}) holds images and the scorer takes none', field="info['images']",
                                     fix='replay with the vision-language model folder that sampled it')
    try:
        return fn(u.ids, u.images, u.rows)
    except (ValueError, KeyError, RuntimeError) as e:
        raise ReplayUnsupportedError(f'({u.key}) cannot be scored with its images ({type(e).__name__}: {e})',
                                     field="info['images']", fix='give the scorer the image bytes the record '
                                     'names (the run\'s images/ folder) and the model that sampled it') from e


def replay_records(records, scorer, *, tol: float = 1e-4, batch_size: int = 8, packed: bool = True,
                   tokenizer=None) -> ReplayReport:
    """Replay every record's trained tokens with a scorer under each record's declared sampler.

    Records are scored by :func:`score_sequences`: packed end to end (default, when the scorer has a
    packed path) or right-padded, ``batch_size`` rows per call; the logits at each action row are
    replayed under the record's own
    :class:`~agentrl.record.SamplingSpec` (penalties against each turn's context and the turn's
    ids so far). A record with ``turn_contexts`` is scored turn by turn (docs/design.md#replay; one
    report entry per turn, key ``'... turn k'``). A record with ``info['images']`` is scored alone with
    its images' pixels through ``scorer.vision(ids [L], images, rows [n]) -> [n, V]``
    (:func:`agentrl.engines.scorer.hf_scorer` of a vision-language model).

    Args:
        records: sampled :class:`~agentrl.record.Trajectory` records.
        scorer: a :class:`Scorer` (or any callable with its signature).
        tol: agreement tolerance in nats (default 1e-4).
        batch_size: rows per scorer call.
        packed: score packed rows (default); False: right-padded batches (the same numbers within fp32
            rounding; the reference path).
        tokenizer: the ids' tokenizer, for records that declare a grammar constraint (default the scorer's
            ``tokenizer`` attribute; :func:`agentrl.engines.scorer.load_scorer` sets it for a model folder).
            Their logits are masked by :func:`agentrl.checks.constrained.constrained_logits` first.

    Returns:
        :class:`ReplayReport`; ``report.ok`` when every token matched, a non-finite ratio is
        the ``non_finite`` kind and ``max_abs_dev = inf``.

    Raises:
        ScriptedRecordError, MissingProvenanceError: a record that must not enter a ratio
            (:func:`require_sampled`).
        ReplayUnsupportedError: inconsistent ``turn_contexts``; a record the scorer cannot take
            (longer than its context, ids outside its vocabulary). Fix: replay with the model (and
            tokenizer) that sampled the records.
        ConstrainedSupportError: a declared constraint that cannot be rebuilt or rejects a record's own id.
    """
    units = [u for n, rec in enumerate(records) for u in _units(n, rec)]
    tokenizer = tokenizer if tokenizer is not None else getattr(scorer, 'tokenizer', None)
    max_len = getattr(scorer, 'max_len', None)
    for u in units:
        if max_len is not None and len(u.ids) > max_len:
            raise ReplayUnsupportedError(f'has {len(u.ids)} tokens to score but the model takes at most {max_len}',
                                         field='ids', fix='replay with the model that sampled the record')
    plain = [u for u in units if not u.images]
    scored = iter(score_sequences([u.ids for u in plain], [u.rows for u in plain], scorer, batch_size=batch_size,
                                  packed=packed))
    logits = [_score_images(u, scorer) if u.images else next(scored) for u in units]
    reps, budget = [], {'fits': FIT_BUDGET}
    for u, lg in zip(units, logits):
        support = None
        if u.spec.constraint is not None:         # the grammar hook: mask the logits first
            lg, support = constrained_logits(u.spec, u.ids, u.rows, u.starts and u.starts(), lg, tokenizer,
                                             u.key)
        reps.append(_judge(u.key, u.out_rows, lg, u.ids[u.rows + 1], u.stored, u.spec, tol, u.context(),
                           u.history, budget))
        reps[-1].forced = int(forced_positions(support).sum())
    return ReplayReport.of(reps)


def replay_check(records, model, *, tol: float = 1e-4, batch_size: int = 1, packed: bool = True) -> ReplayReport:
    """Replay every record's trained tokens with ``model`` under each record's declared sampler.

    The step-0 ratio and the classes of a mismatch are docs/design.md#replay's (the classes in detail:
    :mod:`agentrl.checks.classify`); records with ``turn_contexts`` go turn by turn (:func:`replay_records`).

    Args:
        records: iterable of sampled :class:`~agentrl.record.Trajectory`.
        model: a :class:`Scorer` (e.g. :func:`agentrl.engines.scorer.load_scorer`), or
            ``ids [B, T] -> logits [B, T, V]`` (a TinyAgent, or any such callable), run without
            gradients on the model's device.
        tol: see :func:`classify_tokens`.
        batch_size: records per scorer call (default 1: no padding).
        packed: see :func:`replay_records`.

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
    return replay_records(list(records), scorer, tol=tol, batch_size=batch_size, packed=packed)
