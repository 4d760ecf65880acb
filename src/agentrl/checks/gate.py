"""L3: the gates before an importance ratio: may a record (or a training batch) enter one at all.

:func:`require_sampled` refuses scripted records and records without their sampler;
:func:`require_trainable` also refuses a batch a trainer cannot score exactly (greedy, raw,
penalised, or mixed samplers). Each refusal is a :class:`~agentrl.checks.errors.RecordError`
naming the field and the fix.

Source: docs/design.md#replay.
"""
from __future__ import annotations

from ..record import SamplingSpec, Trajectory
from .errors import MissingProvenanceError, SamplerMismatchError, ScriptedRecordError
from .identity import record_key

__all__ = ['require_sampled', 'require_trainable']


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
