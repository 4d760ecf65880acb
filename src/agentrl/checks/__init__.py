"""L3: record integrity checks: targets, acceptance, replay under the declared sampler, identity.

Small pure audits over :class:`agentrl.record.Trajectory` (imports ``record`` only; the replay
takes any model as a callable). Each refusal is its own :class:`RecordError` subclass whose
message names the field, the position and the fix.

* :func:`action_targets`: which prediction row scores which generated token.
* :func:`validate` / :func:`find_problems` (module :mod:`agentrl.checks.acceptance`): the
  acceptance validator, an ordered tuple of named rules (:data:`RULES`).
* :func:`replay_logp`, :func:`replay_check`: recompute log-probs under the declared sampler and
  classify mismatches (log-prob mode, support, policy change).
* :func:`new_attempt`, :func:`is_resend`, :func:`dedupe`: retry vs resend identity.

The exports are listed explicitly: no submodule name is rebound (``agentrl.checks.acceptance``
is the module, ``agentrl.checks.validate`` the function).
"""
from .acceptance import POSITIVE_LOGP_TOL, RULES, Expected, Facts, Rule, find_problems, validate
from .errors import (DigestMismatchError, DuplicateRecordError, EndOfTurnNotTrainedError, FingerprintMismatchError,
                     IdentityConflictError, InfiniteLogProbError, LengthMismatchError, LogpConversionError,
                     MalformedRowError, MaskMissingOnPolicyError, MaskOnNonPolicyError, MaskValueError,
                     MissingFieldError, MissingLogProbError, MissingProvenanceError, NaNLogProbError,
                     NonFiniteRewardError, NotReplayableError, PaddingMaskedError, PolicyFirstTokenError,
                     PositiveLogProbError, RecordError, ReplayUnsupportedError, ScriptedRecordError,
                     TemplateMismatchError, TokenIdError, TokenizerMismatchError, UnknownOwnerError)
from .identity import dedupe, has_identity, identity, is_resend, new_attempt, record_digest, record_key
from .replay import (TOKEN_KINDS, RatioStats, RecordReplay, ReplayReport, classify_tokens, convert_logp,
                     replay_check, replay_logp, replay_record, require_sampled, support_mask)
from .targets import action_targets

__all__ = [
    # acceptance
    'Expected', 'Facts', 'Rule', 'RULES', 'validate', 'find_problems', 'POSITIVE_LOGP_TOL',
    # errors
    'RecordError', 'MissingProvenanceError', 'MissingFieldError', 'LengthMismatchError', 'UnknownOwnerError',
    'PolicyFirstTokenError', 'MaskValueError', 'MaskOnNonPolicyError', 'MaskMissingOnPolicyError',
    'PaddingMaskedError', 'EndOfTurnNotTrainedError', 'MissingLogProbError', 'NaNLogProbError',
    'InfiniteLogProbError', 'PositiveLogProbError', 'FingerprintMismatchError', 'TokenizerMismatchError',
    'TemplateMismatchError', 'ScriptedRecordError', 'LogpConversionError', 'ReplayUnsupportedError',
    'IdentityConflictError', 'TokenIdError', 'NonFiniteRewardError', 'DigestMismatchError', 'DuplicateRecordError',
    'MalformedRowError', 'NotReplayableError',
    # identity
    'identity', 'has_identity', 'record_key', 'record_digest', 'new_attempt', 'is_resend', 'dedupe',
    # replay
    'TOKEN_KINDS', 'support_mask', 'replay_logp', 'convert_logp', 'require_sampled', 'classify_tokens',
    'RatioStats', 'RecordReplay', 'ReplayReport', 'replay_record', 'replay_check',
    # targets
    'action_targets',
]
