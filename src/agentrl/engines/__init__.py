"""L4: engines that drive real models and scale-out backends; each is imported lazily.

- :mod:`agentrl.engines.hf`: token-in/token-out rollouts with a local Hugging Face causal LM
  (extra ``pip install agentrl[hf]``).
- :mod:`agentrl.engines.ray_rollout`: ``agentrl rollout --workers N``: rollouts on Ray actors,
  streamed to shards, with per-episode seeds, lost-worker retries and ``--resume``
  (extra ``pip install agentrl[ray]``).
"""
