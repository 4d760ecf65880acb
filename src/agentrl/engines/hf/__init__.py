"""L4: token-in/token-out rollouts with a local Hugging Face causal LM (extra ``pip install agentrl[hf]``).

- :class:`HFSampler`: one assistant turn per episode from prompt **ids**, batched with left
  padding, correct ``position_ids`` and a KV cache; sampled ids plus their log-probs under the
  declared :class:`~agentrl.record.SamplingSpec` (``processed`` mode); stops as docs/design.md#stops says.
- :func:`run_chat_episodes`: multi-turn episodes recorded with :class:`~agentrl.templates.ChatRecorder`,
  answered by any ``respond`` (no gym in it); each episode keeps its KV cache row across turns
  (continuous batching); ``profile=`` gives the time split (:mod:`.profile`).
- :class:`HFEngine`, :class:`HFProcessEngine`: the turn-level engine contract (:mod:`agentrl.engines.contract`)
  in this process and in a child process. The BugFix gym's glue lives above the engines, in
  :mod:`agentrl.jobs.bugfix`.
- :func:`score_rows`: logits at chosen rows from one plain forward pass (the scorer that
  :func:`agentrl.engines.scorer.hf_scorer` hands to :func:`agentrl.checks.replay_records`, the step-0
  proof).
- :func:`drift_experiment`, :func:`drift_rate`: retokenization drift (chapter 5.4).
- :func:`make_test_model`, :func:`load_model`: a small random Qwen3 with the real tokenizer.

torch is imported here; transformers only inside the functions that need it, with an error
naming the extra.

Source: docs/design.md#hf-engine; book chapter 5.2-5.4 and 5.8.
"""
from ...templates.chat import require_hf as require_transformers  # noqa: F401 (cli/drift.py's name; use templates' require_hf)
from ..episode import EpisodeState, Reply
from .drift import DRIFT_PROMPT, DriftExperiment, DriftRate, DriftSample, drift_experiment, drift_rate
from .episodes import run_chat_episodes
from .models import default_tokenizer_dir, load_model, make_test_model, model_id, pad_token_id, score_rows
from .profile import PROFILE_KEYS, format_profile, merge_profiles
from .sampler import HFSampler, SampledTurn

__all__ = ['HFSampler', 'SampledTurn',
           'Reply', 'EpisodeState', 'run_chat_episodes', 'format_profile', 'merge_profiles', 'PROFILE_KEYS',
           'score_rows',
           'drift_experiment', 'DriftExperiment', 'DriftSample', 'drift_rate', 'DriftRate', 'DRIFT_PROMPT',
           'make_test_model', 'load_model', 'default_tokenizer_dir', 'model_id', 'pad_token_id', 'require_transformers']
