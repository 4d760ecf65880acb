"""L5: what the check job found (:class:`CheckReport`): counts, refusals, replay results, and the printed report.

Filled by :func:`agentrl.jobs.check.run_check` (and merged across Ray workers by
:mod:`agentrl.jobs.check_workers`); ``agentrl check`` prints :meth:`CheckReport.format` and exits
with :attr:`CheckReport.code`. Source: docs/design.md#integrity and docs/design.md#replay.
"""
from __future__ import annotations

import math
from array import array
from collections import Counter
from dataclasses import dataclass, field

from ..batching import pad_rows
from ..io import printable

__all__ = ['SAMPLER_DEFECTS', 'CheckReport']

#: replay kinds that mean the record's declared sampler is wrong (a defect of the record)
SAMPLER_DEFECTS = ('logp_mode_mismatch', 'support_mismatch', 'sampler_mismatch')


def format_stats(values) -> str:
    """``'min A  mean B  max C'`` of ``values`` (numbers; the mean with one decimal), or ``'n/a'`` when empty."""
    if not values:
        return 'n/a'
    return f'min {min(values)}  mean {sum(values) / len(values):.1f}  max {max(values)}'


@dataclass
class CheckReport:
    """What :func:`run_check` found.

    Attributes:
        path, model, max_ratio_dev: as checked.
        n: rows read. refused: rows refused (any reason). scripted: placeholder records of agentrl's
        policies. no_logp: placeholder records of any other source (imported without sampling log-probs,
        e.g. a server called without ``logprobs``); with a model they fail the check (RL needs them).
        kinds: ``Counter`` of refusal kinds (error class names). examples: first messages.
        lengths, trained: tokens per record and trained tokens per record (``array('i')``, one per decoded record).
        policies, stops: ``Counter`` of ``provenance.policy`` and the stop reason (:func:`agentrl.jobs.check._stop_reason`:
            ``info['stop']``; an imported record's finish reason as its server or trainer named it).
        truncated: records truncated (as :func:`agentrl.train.grpo.is_overlong`: ``stop == 'truncated'``, a
            turn cut at its token budget, or a turn cut at ``max_tokens``: ``info['template']['unterminated_turns']``).
        replays: :class:`agentrl.checks.RecordReplay` per replayed record.
        replay_skipped: ``Counter`` of why records were not replayed (scripted only).
        sampler_defects: replays whose declared sampler does not reproduce the stored log-probs.
        mismatch: engine-vs-trainer |Δ log-p| and KL estimates of the replay (:class:`~agentrl.checks.mismatch.LogpMismatch`).
        drift: ``(record key, [TurnDrift])`` of imported records whose server prompt differs from the
            record (:func:`agentrl.checks.mismatch.context_drift`); reported, not refused (the replay
            scores those turns in the server's context).
        dtype, tol: the replay's dtype and tolerance.
        calls: ``Counter`` of the stored tool-call statuses (``info['turn_calls']``, :mod:`agentrl.checks.calls`);
            call_records: records that store them (records written before the field count in neither).
        versions: ``Counter`` of ``provenance.policy_version`` (``'(none)'`` when unstamped). spanning:
            records whose turns span several versions. staleness: ``Counter`` of steps behind
            ``--current-version`` (``'not a step'`` for a fingerprint version).
    """
    path: str
    model: str | None = None
    max_ratio_dev: float = 1e-3
    examples_max: int = 5
    n: int = 0
    refused: int = 0
    scripted: int = 0
    no_logp: int = 0
    truncated: int = 0
    kinds: Counter = field(default_factory=Counter)
    examples: list = field(default_factory=list)
    lengths: array = field(default_factory=lambda: array('i'))       # compact: 4 bytes a record
    trained: array = field(default_factory=lambda: array('i'))
    policies: Counter = field(default_factory=Counter)
    stops: Counter = field(default_factory=Counter)
    replays: list = field(default_factory=list)
    replay_skipped: Counter = field(default_factory=Counter)
    dtype: str = 'float32'
    tol: float = 1e-4
    correction: str | None = None
    drift: list = field(default_factory=list)
    versions: Counter = field(default_factory=Counter)
    forced: list = field(default_factory=list)          # per grammar-constrained record: its forced trained tokens
    spanning: int = 0
    staleness: Counter = field(default_factory=Counter)
    unchecked: Counter = field(default_factory=Counter)     # importer's note -> records (checks.consistency)
    calls: Counter = field(default_factory=Counter)         # tool-call status -> calls (checks.calls)
    call_records: int = 0

    def refuse(self, key: str, problems: list) -> None:
        """Count one refused row with its problems (RecordError list)."""
        self.refused += 1
        self.kinds.update(p.kind for p in problems)
        for p in problems:
            if len(self.examples) < self.examples_max:
                msg = str(p)          # a row's own problem already names it ("'FILE' row N: field: ..."): once
                msg = msg[len(key) + 2:] if msg.startswith(f'{key}: ') else msg
                self.examples.append(f'{key}: {p.kind}: {msg}')

    @property
    def replay(self):
        """The :class:`agentrl.checks.ReplayReport` of the replayed records (None without a model)."""
        if self.model is None:
            return None
        from ..checks import ReplayReport
        return ReplayReport.of(self.replays)

    @property
    def mismatch(self):
        """:class:`agentrl.checks.mismatch.LogpMismatch` of every replayed token (None without a model)."""
        if self.model is None:
            return None
        import torch

        from ..checks.mismatch import LogpMismatch
        lr = [r.log_ratio for r in self.replays]
        return LogpMismatch.of(torch.cat(lr) if lr else torch.zeros(0, dtype=torch.float64))

    @property
    def weights(self) -> dict | None:
        """``Correction.metrics`` of :attr:`correction` over the replayed tokens (one row per replay unit; None
        without a model or a mode)."""
        if self.model is None or self.correction is None or not self.replays:
            return None
        import torch

        from ..correction import off_policy_correction
        lr = pad_rows([r.log_ratio.float() for r in self.replays], None, 0.0)
        mask = pad_rows([torch.ones(len(r.log_ratio)) for r in self.replays], None, 0.0)
        return off_policy_correction(lr, lr.new_zeros(lr.shape), mask, self.correction).metrics

    @property
    def sampler_defects(self) -> list:
        return [r for r in self.replays if r.kind in SAMPLER_DEFECTS]

    def reasons(self) -> list[str]:
        """Why the check fails (empty when it passes)."""
        out = [f'{self.refused} of {self.n} records refused'] if self.refused else []
        if self.n == 0:
            out.append('no records')
        rep = self.replay
        if rep is not None and self.no_logp:
            out.append(f'{self.no_logp} records have no sampling log-probs (the replay and RL trainers need them)')
        if rep is not None:
            if self.sampler_defects:
                out.append(f'{len(self.sampler_defects)} records not reproduced by their declared sampler')
            dev = rep.overall.max_abs_dev
            if rep.overall.n and not math.isfinite(dev):
                out.append(f'non-finite replay ratios (max |ratio - 1| is {dev}; the model gives NaN or inf '
                           'log-probs)')
            elif self.dtype != 'float32':             # a low-precision replay passes only within the user's --tol
                worst = self.mismatch.max_abs
                if rep.overall.n and not worst <= self.tol:
                    out.append(f'{self.dtype} replay: max |Δ log-p| {worst:.2e} > --tol {self.tol}')
            elif rep.overall.n and dev > self.max_ratio_dev:
                out.append(f'replay ratio off by {dev:.2e}')
        return out

    @property
    def code(self) -> int:
        """Exit code: 0 when every record passed, 1 otherwise."""
        return 1 if self.reasons() else 0

    @property
    def ok(self) -> bool:
        return self.code == 0

    def format(self) -> str:
        """The report as printed by ``agentrl check`` (data from the records is made printable)."""
        p = printable
        n = self.n
        no_logp = f', no sampling log-probs {self.no_logp}' if self.no_logp else ''
        lines = [f'records          {n}  (refused {self.refused}, scripted {self.scripted}{no_logp})',
                 'policies         ' + ('  '.join(f'{p(k)} {v}' for k, v in sorted(self.policies.items())) or 'none'),
                 f'length (tokens)  {format_stats(self.lengths)}',
                 f'trained tokens   {format_stats(self.trained)}',
                 'stops            ' + ('  '.join(f'{p(k)} {v}' for k, v in sorted(self.stops.items())) or 'none'),
                 f'truncation rate  {self.truncated / n:.3f}  (episodes stopped truncated or with a turn cut at its budget)' if n else 'truncation rate  n/a']
        if self.call_records:
            from ..checks.calls import calls_line
            n = self.call_records
            lines.append(f'tool calls       {calls_line(self.calls)}  (stored in {n} record{"s" if n != 1 else ""})')
        if self.no_logp:
            lines.append(f'sampling logps   none in {self.no_logp} records: their source stored none (a server called '
                         'without logprobs); fine for SFT, but RL trainers and the replay need them: sample again '
                         'with log-probs (vLLM chat: "logprobs": true; SGLang: "return_logprob": true)')
        if self.forced:
            lines.append(f'forced tokens    {sum(self.forced)} in {len(self.forced)} grammar-constrained records '
                         '(support of one token, no policy gradient; --mask-forced leaves them out of the loss)')
        if self.versions and set(self.versions) != {'(none)'}:
            lines.append('policy versions  ' + '  '.join(f'{p(k)} {v}' for k, v in self.versions.most_common(8))
                         + (f'  ({len(self.versions)} versions)' if len(self.versions) > 8 else '')
                         + (f'; {self.spanning} records span several versions' if self.spanning else ''))
        if self.staleness:
            lines.append('staleness        ' + '  '.join(f'{k} steps {v}' if isinstance(k, int) else f'{k} {v}'
                                                         for k, v in sorted(self.staleness.items(),
                                                                            key=lambda kv: (isinstance(kv[0], str), str(kv[0]).zfill(12)))))
        if self.drift:
            turns = sum(len(d) for _, d in self.drift)
            lines.append(f'context drift    {len(self.drift)} records ({turns} turns): the server re-rendered the '
                         "history from text, so a turn's prompt differs from the record's ids")
            lines += [f'  e.g. {p(k)} {d[0]}' for k, d in self.drift[:self.examples_max]]
        lines += [f'not checked      {c} records: {p(note)}' for note, c in self.unchecked.most_common()]
        if self.kinds:
            lines.append('refusals by kind:')
            lines += [f'  {kind:<28} {c}' for kind, c in self.kinds.most_common()]
            lines += [f'  e.g. {p(e)}' for e in self.examples]
        else:
            lines.append('refusals by kind: none')
        if n == 0:
            lines.append(f'no records in {p(self.path)}; pass a trajectories .parquet file or its shard folder '
                         '(OUT/trajectories.parquet or OUT/trajectories/)')
        rep = self.replay
        if rep is not None:
            lines.append(f'replay under the declared sampler (model {p(self.model)}, {self.dtype}, '
                         f'{len(self.replays)} records):')
            lines += ['  ' + line for line in rep.table().splitlines()]
            if rep.overall.n:
                lines.append('  engine vs trainer: ' + self.mismatch.line())
            w = self.weights if rep.overall.n else None
            if w is not None:
                lines.append(f'  would-be {self.correction} weights: mean {w["corr_weight_mean"]:.4f}  min '
                             f'{w["corr_weight_min"]:.4f}  max {w["corr_weight_max"]:.4f}  clipped '
                             f'{w["corr_clipped_frac"]:.2%}  masked {w["corr_masked_frac"]:.2%} of tokens '
                             f'({w["corr_masked_records"]} units)')
            lines += [f'  not replayed: {c} {why}' for why, c in self.replay_skipped.items()]
            for r in self.sampler_defects[:self.examples_max]:
                lines.append(f'  e.g. {p(r.key)}: {r.kind} (ratio mean {r.stats.mean:.4f}); the declared sampler does '
                             'not reproduce the stored log-probs')
            dev = rep.overall.max_abs_dev
            if rep.overall.n and not math.isfinite(dev):
                lines.append(f'  max |ratio - 1| = {dev} is not finite: the model gives NaN or inf log-probs '
                             '(a diverged or damaged checkpoint)')
            elif rep.overall.n and dev > self.max_ratio_dev and self.dtype == 'float32':
                lines.append(f'  max |ratio - 1| = {dev:.2e} exceeds --max-ratio-dev {self.max_ratio_dev} (stored '
                             'sample_logp is not what this model gives; pass --max-ratio-dev inf to only report)')
        reasons = self.reasons()
        lines.append('result: ' + ('OK' if not reasons else f"FAILED ({'; '.join(reasons)})"))
        return '\n'.join(lines)
