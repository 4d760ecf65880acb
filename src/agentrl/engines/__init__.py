"""L4: engines that drive real models and scale-out backends; each is imported lazily.

- :mod:`agentrl.engines.episode`: the engine-agnostic episode parts (``Reply``, ``EpisodeState``);
  torch-free.
- :mod:`agentrl.engines.bugfix`: the BugFix gym behind function calling for any engine
  (``BugFixAdapter``, ``parse_tool_calls``, ``gym_call``, ``bugfix_opening``); torch-free.
- :mod:`agentrl.engines.hf`: token-in/token-out rollouts with a local Hugging Face causal LM
  (extra ``pip install agentrl[hf]``).
- :mod:`agentrl.engines.ray`: a pool of Ray actors that runs chunks of episodes, replaces dead
  actors and re-runs their chunks as new attempts (extra ``pip install agentrl[ray]``); the
  rollout job on top of it is :mod:`agentrl.jobs.rollout`.
"""
