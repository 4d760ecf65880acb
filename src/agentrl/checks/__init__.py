"""L3: record integrity checks: targets, acceptance, replay under the declared sampler, identity.

Small pure audits over :class:`agentrl.record.Trajectory` (imports ``record`` only; the replay
takes any model as a callable). Each refusal is its own :class:`RecordError` subclass whose
message names the field, the position and the fix.

* :func:`action_targets`: which prediction row scores which generated token (lesson 004).
* :func:`validate` / :func:`find_problems`: the acceptance validator (issue 4, item 4).
* :func:`replay_logp`, :func:`replay_check`: recompute log-probs under the declared sampler and
  classify mismatches (log-prob mode, support, policy change) (issue 4, item 3).
* :func:`new_attempt`, :func:`is_resend`, :func:`dedupe`: retry vs resend identity (item 5).

Source: issue 4 (record integrity); lesson 004 ("Preserve the sampled-token record across turns").
"""
from .errors import *  # noqa: F401,F403
from .errors import __all__ as _errors
from .identity import *  # noqa: F401,F403
from .identity import __all__ as _identity
from .replay import *  # noqa: F401,F403
from .replay import __all__ as _replay
from .targets import action_targets
from .validate import *  # noqa: F401,F403
from .validate import __all__ as _validate

__all__ = ['action_targets', *_errors, *_identity, *_replay, *_validate]
