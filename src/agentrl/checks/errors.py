"""L3: one exception type per reason a record is refused.

Every refusal subclasses :class:`RecordError` (itself a ``ValueError``), carries the field,
the position and the fix as attributes, and says all three in its message, so a consumer can
count refusals by kind (``type(err).__name__``) and a person can act on one without reading code.

Source: docs/design.md#integrity: "each refusal is its own error type with a message
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
    'UnclosedTurnError', 'ControlTokenInContentError',
    'TokenIdError', 'NonFiniteRewardError', 'DigestMismatchError', 'DuplicateRecordError', 'MalformedRowError',
    'NotReplayableError',
    'SamplerMismatchError', 'MissingGroupError', 'GroupSizeError', 'ConstrainedSupportError',
    'CallSpanError', 'ImageRunError', 'MissingImageError', 'ImageInLossError',
]


class RecordError(ValueError):
    """A record refused by an acceptance check.

    Args:
        what: what is wrong, in words.
        field: the record field at fault (``'action_mask'``, ``'provenance.tokenizer'`` ...).
        position: index into that field, or None when the whole field is at fault.
        fix: what to change so the record is accepted.
        count: how many positions share the fault (the message names the first).
        source: where the record was read from (``"'f.parquet' row 3"``), or None; it prefixes
            the message.

    Attributes:
        field, position, fix, count, source: as given; ``kind`` is the class name.
        exit_code: 1, the ``agentrl`` exit code when a command stops on a refused record.
    """
    exit_code = 1

    def __init__(self, what: str, *, field: str, position: int | None = None, fix: str = '',
                 count: int = 1, source: str | None = None):
        self.field, self.position, self.fix, self.count, self.source = field, position, fix, count, source
        self.what = what
        super().__init__(self._message())

    def _message(self) -> str:
        where = self.field if self.position is None else f'{self.field}[{self.position}]'
        more = f' (and {self.count - 1} more position{"s" if self.count > 2 else ""})' if self.count > 1 else ''
        msg = f'{where}: {self.what}{more}'
        if self.fix:
            msg += f'. Fix: {self.fix}'
        return msg if self.source is None else f'{self.source}: {msg}'

    def at(self, source: str) -> 'RecordError':
        """This refusal located at ``source`` (e.g. ``"'d/part-000000.parquet' row 3"``); returns self."""
        self.source = source
        self.args = (self._message(),)
        return self

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


class SamplerMismatchError(RecordError):
    """A record's sampler is not the one the ratio is computed under (another temperature or spec
    in the same batch, greedy, ``raw`` log-probs, penalties the trainer does not replay)."""


class MissingGroupError(RecordError):
    """A record without ``provenance.group_id`` where group-relative advantages need it."""


class GroupSizeError(RecordError):
    """A group holds another number of records than the declared group size."""


class UnclosedTurnError(RecordError):
    """A chat policy turn is followed by neither the template's end-of-turn id nor the end of the record.

    The engine stopped at another stop id (e.g. Qwen3's second EOS ``<|endoftext|>``) and the writer
    dropped the end-of-turn the template writes after every assistant turn.
    """


class ControlTokenInContentError(RecordError):
    """A control (added-token) id is owned by a tool, user or system message: its text became a control token."""


# Refusals of the interop exporters and importers (agentrl.interop). Appended as one block.
__all__ += ['MaskAlignmentError', 'LogProbLengthError', 'GroupOrderError', 'SupportMismatchError',
            'MissingTokenIdsError', 'TurnContextError']


class MaskAlignmentError(LengthMismatchError):
    """A mask of length ``T-1`` (aligned to ``ids[1:]``) handed where a full-length ``[T]`` mask at
    own index is expected, or the reverse: every label would silently move by one token."""


class LogProbLengthError(LengthMismatchError):
    """Per-token log-probs and the token ids they belong to differ in length."""


class GroupOrderError(RecordError):
    """The rows of a group are not contiguous (or groups differ in size) for a trainer that groups
    rows by position (TRL ``num_generations``, slime / OpenRLHF ``n_samples_per_prompt``)."""


class SupportMismatchError(RecordError):
    """Log-probs drawn under top-k / top-p / min-p (or raw at temperature != 1) exported to a trainer
    that recomputes ``log_softmax(logits / T)`` over the full vocabulary: the step-0 ratio is not 1."""


class MissingTokenIdsError(RecordError):
    """An imported server response carries no token ids (re-encoding its text is the drift agentrl
    exists to catch)."""


class TurnContextError(RecordError):
    """A record with per-turn contexts (a template that is not prefix-stable) exported as one sequence: the
    trainer would score each turn in a context it was not sampled in."""


class ConstrainedSupportError(RecordError):
    """The record's declared grammar constraint cannot be rebuilt (unknown backend or version, a text that does not
    compile, no tokenizer) or rejects the record's own ids: its allowed-token support is unknown, so it never enters
    an importance ratio (docs/grammar.md)."""


class CallSpanError(RecordError):
    """A stored tool-call status (``info['turn_calls']``) is unknown, or its token span is outside the ids, over
    tokens the policy did not sample, or over another turn (:mod:`agentrl.checks.calls`)."""


class ImageRunError(RecordError):
    """A record's ``info['images']`` disagrees with its ids: an entry malformed, a placeholder run whose length is
    not its grid's ``t*h*w // merge_size**2``, a run over ids that are not the placeholder, a placeholder id outside
    every run, overlapping runs, or placeholder ids not owned by whoever supplied the image
    (:mod:`agentrl.checks.images`; docs/design.md#images)."""


class MissingImageError(RecordError):
    """An image a record names is not in its run's ``images/`` folder, or the stored bytes do not hash to its digest
    (:mod:`agentrl.checks.images`; docs/design.md#images)."""


class ImageInLossError(RecordError):
    """Image placeholder ids in the loss: policy-owned, or ``action_mask`` 1 on a position that predicts one
    (:mod:`agentrl.checks.images`; docs/design.md#images)."""
