"""agentrl: token-exact trajectories for agent reinforcement learning.

``import agentrl as arl`` gives the book's public names (``arl.Trajectory``, ``arl.collate``,
``arl.rollout_batch``, ``arl.BugFixEnv`` ...). Submodules load lazily on first use, so
``agentrl.gym`` works without torch and the book's saved blocks (``import agentrl as arl`` at
the top of a module) never hit a circular import.
"""
from ._lazy import lazy_exports
from ._version import __version__

# public name -> submodule that defines it
_EXPORTS = {
    # L0 record
    'OWNER': 'record', 'OWNER_NAMES': 'record', 'Trajectory': 'record', 'Batch': 'record',
    'Provenance': 'record', 'SamplingSpec': 'record',
    # L1 gym (chapter 4)
    'Task': 'gym', 'make_tasks': 'gym', 'BugFixEnv': 'gym', 'TOOL_SCHEMAS': 'gym', 'CODING_TOOLS': 'gym',
    'CLAMP_ISSUE': 'gym', 'CLAMP_BUGGY': 'gym', 'compact_source': 'gym', 'run_tests': 'gym',
    'format_results': 'gym', 'TestResult': 'gym', 'EDIT_OPS': 'gym', 'MESSAGES': 'gym', 'ALL_CALLS': 'gym',
    'scripted_policy': 'gym',
    # L1 tokenizer and model (chapters 3, 5)
    'SPECIALS': 'tokenizer', 'Tokenizer': 'tokenizer', 'build_tokenizer': 'gym.vocab',
    'TinyAgent': 'model', 'sequence_log_probs': 'model', 'sample_next': 'model', 'KVCache': 'kv_cache',
    'save_checkpoint': 'checkpoint', 'load_checkpoint': 'checkpoint',
    # L2 rollout and collate (chapter 5)
    'MAX_CALL_TOKENS': 'rollouts', 'Episode': 'rollouts', 'make_trajectory': 'rollouts',
    'scripted_rollout': 'rollouts', 'generate_call': 'rollouts', 'rollout': 'rollouts',
    'rollout_batch': 'rollouts', 'RolloutBatchOptions': 'rollouts', 'supports_kv_cache': 'rollouts',
    'pad_rows': 'batching', 'collate': 'batching',
    'collate_packed': 'packing', 'balance_micro_batches': 'packing',
    # L2 chat templates (Hugging Face tokenizers; transformers loaded lazily)
    'ChatTemplate': 'templates', 'ChatRecorder': 'templates', 'label_owners': 'templates',
    'audit_prefix_stability': 'templates', 'audit_thinking': 'templates', 'audit_drift': 'templates',
    'audit_template': 'templates', 'template_fingerprint': 'templates', 'turn_records': 'record',
    # L3 checks (record integrity)
    'action_targets': 'checks', 'validate': 'checks', 'find_problems': 'checks', 'RecordError': 'checks',
    'replay_logp': 'checks', 'replay_check': 'checks', 'new_attempt': 'checks', 'is_resend': 'checks',
    # L4 storage
    'write_trajectories': 'store', 'read_trajectories': 'store', 'iter_batches': 'store', 'ShardWriter': 'store',
}

__all__ = sorted(_EXPORTS) + ['__version__']


#: subpackages and modules reachable as ``arl.<name>`` without an explicit import
_SUBMODULES = {'record', 'tokenizer', 'gym', 'model', 'kv_cache', 'checkpoint', 'rollouts', 'batching', 'templates', 'checks', 'stats',
               'store', 'viz', 'train', 'engines', 'jobs', 'cli'}


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, submodules=_SUBMODULES)
