"""L4: engines that drive real models and scale-out backends; each is imported lazily.

- :mod:`agentrl.engines.contract`: the turn-level engine contract (``TurnRequest``, ``TurnResult``,
  ``Engine``, the error types); :mod:`agentrl.engines.factory`: the registry that picks a backend by
  name (docs/design.md#engines).
- :mod:`agentrl.engines.episode`: the engine-agnostic episode parts (``Reply``, ``EpisodeState``) and
  :mod:`agentrl.engines.driver`: the one episode driver over a ``TurnBatch``; torch-free.
- :mod:`agentrl.engines.hf`: token-in/token-out rollouts with a local Hugging Face causal LM
  (extra ``pip install agentrl[hf]``).
- :mod:`agentrl.engines.ray`: a pool of Ray actors that runs chunks of episodes, replaces dead
  actors and re-runs their chunks as new attempts (extra ``pip install agentrl[ray]``); the
  rollout job on top of it is :mod:`agentrl.jobs.rollout`.
"""
