"""L3: one exception type per reason a record is refused.

Every refusal subclasses :class:`RecordError` (itself a ``ValueError``), carries the field,
the position and the fix as attributes, and says all three in its message, so a consumer can
count refusals by kind (``type(err).__name__``) and a person can act on one without reading code.

Source: issue 4 (record integrity), item 4: "each refusal is its own error type with a message
naming the field, the position and the fix".
"""
from __future__ import annotations

__all__ = [
    'RecordError', 'MissingProvenanceError', 'MissingFieldError', 'LengthMismatchError',
    'UnknownOwnerError', 'PolicyFirstTokenError', 'MaskValueError', 'MaskOnNonPolicyError',
    'MaskMissingOnPolicyError', 'PaddingMaskedError', 'EndOfTurnNotTrainedError',
    'MissingLogProbError', 'NaNLogProbError', 'InfiniteLogProbError', 'PositiveLogProbError',
    'FingerprintMismatchError', 'TokenizerMismatchError', 'TemplateMismatchError',
    'ScriptedRecordError', 'LogpConversionError', 'ReplayUnsupportedError', 'IdentityConflictError',
    'TokenIdError', 'NonFiniteRewardError', 'DigestMismatchError', 'DuplicateRecordError', 'MalformedRowError',
    'NotReplayableError',
]


class RecordError(ValueError):
    """A record refused by an acceptance check.

    Args:
        what: what is wrong, in words.
        field: the record field at fault (``'action_mask'``, ``'provenance.tokenizer'`` ...).
        position: index into that field, or None when the whole field is at fault.
        fix: what to change so the record is accepted.
        count: how many positions share the fault (the message names the first).

    Attributes:
        field, position, fix, count: as given; ``kind`` is the class name.
    """

    def __init__(self, what: str, *, field: str, position: int | None = None, fix: str = '',
                 count: int = 1):
        self.field, self.position, self.fix, self.count = field, position, fix, count
        where = field if position is None else f'{field}[{position}]'
        more = f' (and {count - 1} more position{"s" if count > 2 else ""})' if count > 1 else ''
        msg = f'{where}: {what}{more}'
        if fix:
            msg += f'. Fix: {fix}'
        super().__init__(msg)

    @property
    def kind(self) -> str:
        """The refusal kind: the exception class name."""
        return type(self).__name__


class MissingProvenanceError(RecordError):
    """The record has no provenance, or a sampled record has no sampling spec."""


class MissingFieldError(RecordError):
    """A per-token field needed for the check (``owner``, ``action_mask``) is None."""


class LengthMismatchError(RecordError):
    """Per-token fields disagree in length (``ids``/``owner``/``turn`` [T]; masks [T-1])."""


class UnknownOwnerError(RecordError):
    """An owner code is not one of :data:`agentrl.record.OWNER`."""


class PolicyFirstTokenError(RecordError):
    """``owner[0]`` is policy: no position precedes the first token to score it."""


class MaskValueError(RecordError):
    """An ``action_mask`` entry is neither 0 nor 1."""


class MaskOnNonPolicyError(RecordError):
    """``action_mask[j]`` is 1 but ``ids[j+1]`` is not policy-owned (trains on context)."""


class MaskMissingOnPolicyError(RecordError):
    """``action_mask[j]`` is 0 but ``ids[j+1]`` was sampled by the policy (drops an action)."""


class PaddingMaskedError(RecordError):
    """A trailing padding position has ``action_mask`` 1."""


class EndOfTurnNotTrainedError(RecordError):
    """An end-of-turn token right after a policy token has ``action_mask`` 0."""


class MissingLogProbError(RecordError):
    """``sample_logp`` is absent on a record with generated positions."""


class NaNLogProbError(RecordError):
    """A generated position's ``sample_logp`` is NaN (a missing value read back as NaN)."""


class InfiniteLogProbError(RecordError):
    """A generated position's ``sample_logp`` is +-inf (a token outside the sampled support)."""


class PositiveLogProbError(RecordError):
    """A generated position's ``sample_logp`` is > 0 (a probability above 1: not a log-prob)."""


class FingerprintMismatchError(RecordError):
    """A fingerprint in the provenance differs from the expected one."""


class TokenizerMismatchError(FingerprintMismatchError):
    """``provenance.tokenizer`` differs from the expected tokenizer fingerprint."""


class TemplateMismatchError(FingerprintMismatchError):
    """``provenance.template`` differs from the expected template fingerprint."""


class ScriptedRecordError(RecordError):
    """A record whose ``sample_logp`` is a placeholder entered an importance-ratio computation."""


class LogpConversionError(RecordError):
    """A stored log-prob was asked to change mode (raw <-> processed) without the logits."""


class ReplayUnsupportedError(RecordError):
    """The record cannot be replayed by :func:`agentrl.checks.replay_check` (see message)."""


class IdentityConflictError(RecordError):
    """Two records share an identity (group, rollout, attempt) but differ in content."""


class TokenIdError(RecordError):
    """An id is negative, or outside the expected vocabulary ``[0, V)``."""


class NonFiniteRewardError(RecordError):
    """``reward`` is NaN, +-inf or not a number."""


class DigestMismatchError(RecordError):
    """A stored row's content no longer matches the digest written with it (edited after writing)."""


class DuplicateRecordError(RecordError):
    """A record is stored twice (a resend: same identity and content); a reader would train on it twice."""


class MalformedRowError(RecordError):
    """A stored row cannot be converted to a record (a null, a wrong type, bad JSON); names file and row."""


class NotReplayableError(RecordError):
    """A sampled record cannot be replayed under the given model (ids outside its vocabulary, too long, ...)."""
