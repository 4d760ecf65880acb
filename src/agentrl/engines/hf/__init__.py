"""L4: token-in/token-out rollouts with a local Hugging Face causal LM (extra ``pip install agentrl[hf]``).

- :class:`HFSampler`: one assistant turn per episode from prompt **ids**, batched with left
  padding, correct ``position_ids`` and a KV cache; sampled ids plus their log-probs under the
  declared :class:`~agentrl.record.SamplingSpec` (``processed`` mode); stops at the template's
  end-of-turn token (kept) or at ``max_new_tokens`` (the turn is marked truncated).
- :func:`run_chat_episodes`, :func:`bugfix_rollouts`: multi-turn episodes recorded with
  :class:`~agentrl.templates.ChatRecorder`; the BugFix gym through real function calling; each
  episode keeps its KV cache row across turns (continuous batching); ``profile=`` gives the time split.
- :func:`score_rows`: logits at chosen rows from one plain forward pass (the scorer that
  :func:`agentrl.engines.scorer.hf_scorer` hands to :func:`agentrl.checks.replay_records`, the step-0
  proof).
- :func:`drift_experiment`, :func:`drift_rate`: retokenization drift (chapter 5.4).
- :func:`make_test_model`, :func:`load_model`: a small random Qwen3 with the real tokenizer.

torch is imported here; transformers only inside the functions that need it, with an error
naming the extra.

Source: docs/design.md#hf-engine; book chapter 5.2-5.4 and 5.8.
"""
from .drift import DRIFT_PROMPT, DriftExperiment, DriftRate, DriftSample, drift_experiment, drift_rate
from .episodes import (PROFILE_KEYS, Reply, bugfix_job, bugfix_opening, bugfix_rollouts, format_profile,
                       gym_call, merge_profiles, parse_tool_calls, run_chat_episodes)
from .models import default_tokenizer_dir, load_model, make_test_model, model_id, require_transformers, score_rows
from .sampler import HFSampler, SampledTurn, draw, processed_log_probs

__all__ = ['HFSampler', 'SampledTurn', 'processed_log_probs', 'draw',
           'Reply', 'run_chat_episodes', 'format_profile', 'merge_profiles', 'PROFILE_KEYS', 'bugfix_rollouts', 'bugfix_job',
           'bugfix_opening', 'parse_tool_calls', 'gym_call',
           'score_rows',
           'drift_experiment', 'DriftExperiment', 'DriftSample', 'drift_rate', 'DriftRate', 'DRIFT_PROMPT',
           'make_test_model', 'load_model', 'default_tokenizer_dir', 'model_id', 'require_transformers']
