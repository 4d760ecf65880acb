"""L5: jobs, the work behind each command: plan, run, store, summarise.

- :mod:`agentrl.jobs.plan`: :class:`RolloutOptions`, :class:`EpisodeJob`, :func:`plan_episodes`,
  :func:`plan_chunks`, the run manifest and resume.
- :mod:`agentrl.jobs.runner`: run one chunk of episodes (scripted, TinyAgent or Hugging Face policy).
- :mod:`agentrl.jobs.rollout`: the one rollout job, in this process or on Ray actors.
- :mod:`agentrl.jobs.check`: :class:`CheckReport`, validation + replay + tallies behind ``agentrl check``.

A command of :mod:`agentrl.cli` parses its flags into an options dataclass, calls a job and prints
what it returns; the job never reads ``argv`` and never prints tables.
"""
