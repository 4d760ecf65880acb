"""L5: jobs, the work behind each command: plan, resume, run, store, summarise, check, report, show.

- :mod:`agentrl.jobs.plan`: :class:`RolloutOptions`, :class:`EpisodeJob`, :func:`plan_episodes`,
  :func:`plan_chunks`.
- :mod:`agentrl.jobs.resume`: the run manifest and the resume rules (what ``--resume`` keeps and refuses).
- :mod:`agentrl.jobs.runner`: run chunks of episodes (scripted, TinyAgent or Hugging Face policy) to shards.
- :mod:`agentrl.jobs.rollout`: the one rollout job as ``prepare -> run -> summarise``, in this process or on Ray.
- :mod:`agentrl.jobs.check`: :class:`CheckReport`, validation + replay + tallies behind ``agentrl check``.
- :mod:`agentrl.jobs.report`: ``agentrl report``'s page; :mod:`agentrl.jobs.show`: ``agentrl show``'s record and strip.

A command of :mod:`agentrl.cli` parses its flags into an options dataclass, calls a job and prints
what it returns; the job never reads ``argv`` and never prints tables.
"""
