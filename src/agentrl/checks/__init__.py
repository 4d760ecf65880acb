"""L3: record integrity checks: targets, acceptance, replay under the declared sampler, identity.

Small pure audits over :class:`agentrl.record.Trajectory` (imports ``record`` only; the replay
takes any model as a callable). Each refusal is its own :class:`RecordError` subclass whose
message names the field, the position and the fix.

* :func:`action_targets`: which prediction row scores which generated token.
* :func:`validate` / :func:`find_problems` (module :mod:`agentrl.checks.acceptance`): the
  acceptance validator, an ordered tuple of named rules (:data:`RULES`).
* :func:`replay_records` (over a :class:`Scorer`), :func:`replay_check`: recompute log-probs under
  the declared sampler (per-turn contexts included) and classify mismatches (log-prob mode,
  support, sampler, policy change, non-finite; :mod:`agentrl.checks.classify`);
  :func:`require_sampled`, :func:`require_trainable` (:mod:`agentrl.checks.gate`): may a record
  enter an importance ratio.
* :func:`new_attempt`, :func:`is_resend`, :func:`dedupe`: retry vs resend identity.
* :func:`staleness_report`, :func:`require_fresh` (:mod:`agentrl.checks.staleness`): policy-version staleness.

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
                     TemplateMismatchError, TokenIdError, TokenizerMismatchError, UnknownOwnerError,
                     SamplerMismatchError, MissingGroupError, GroupSizeError, ConstrainedSupportError,
                     UnclosedTurnError, ControlTokenInContentError)
from .classify import (FIT_BUDGET, MIN_FIT_TOKENS, TOKEN_KINDS, classify_tokens, convert_logp, fit_sampler, replay_logp,
                       support_mask)
from .gate import require_sampled, require_trainable
from .identity import (dedupe, dedupe_key, digest_arrays, episode_key, has_identity, identity, is_resend, new_attempt,
                       record_digest, record_key)
from .replay import (RatioStats, RecordReplay, ReplayReport, Scorer, replay_check, replay_record, replay_records,
                     score_sequences)
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
    'MalformedRowError', 'NotReplayableError', 'SamplerMismatchError', 'MissingGroupError', 'GroupSizeError',
    'ConstrainedSupportError',
    'UnclosedTurnError', 'ControlTokenInContentError',
    # identity
    'identity', 'has_identity', 'record_key', 'episode_key', 'record_digest', 'digest_arrays', 'new_attempt', 'is_resend',
    'dedupe', 'dedupe_key',
    # replay
    'TOKEN_KINDS', 'MIN_FIT_TOKENS', 'FIT_BUDGET', 'support_mask', 'replay_logp', 'convert_logp', 'require_sampled',
    'require_trainable', 'classify_tokens', 'fit_sampler', 'RatioStats', 'RecordReplay', 'ReplayReport',
    'replay_record', 'Scorer', 'score_sequences', 'replay_records', 'replay_check',
    # targets
    'action_targets',
]

# the one dedupe loop (appended: checks/identity.py's Deduper)
from .identity import Deduper  # noqa: E402

__all__.append('Deduper')

# policy-version staleness: agentrl.checks.staleness
from .staleness import (StalenessReport, StaleVersionError, record_staleness, record_versions,  # noqa: E402
                        require_fresh, require_one_version, sampled_by, staleness_report)

__all__ += ['StaleVersionError', 'StalenessReport', 'record_versions', 'record_staleness', 'sampled_by',
            'staleness_report', 'require_fresh', 'require_one_version']
