"""L5: run one chunk of planned episodes: a scripted, TinyAgent or Hugging Face policy.

The same :class:`EpisodeRunner` runs in this process (``--workers 0``) and inside every Ray
actor (:mod:`agentrl.engines.ray`), so a chunk gives the same records wherever it runs: every
episode samples from its own ``torch.Generator`` seeded with its
:func:`~agentrl.sampling.episode_seed`, and a chunk is one batch.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Sequence

from .plan import EpisodeJob, RolloutOptions

__all__ = ['RunSpec', 'EpisodeRunner', 'RunnerFactory']


@dataclass(frozen=True)
class RunSpec:
    """What every runner needs besides the TinyAgent weights (small; sent to each actor).

    The run's own options, not a restatement of them: the runner reads ``max_turns``,
    ``reward_tests``, ``batch``, ``engine``, ``model`` (the ``hf`` folder), ``max_new_tokens``,
    ``profile`` and the sampler (:meth:`~agentrl.jobs.plan.RolloutOptions.sampling_spec`) there.

    Attributes:
        options: the run's :class:`~agentrl.jobs.plan.RolloutOptions` (default: the defaults).
        model_id: ``provenance.model`` of model records: the model's name and fingerprint
            (``model.pt@1a2b3c4d5e6f``), never a local path.
        threads: torch intra-op threads while a chunk runs (1: reproducible, one core per worker).
    """
    options: RolloutOptions = field(default_factory=RolloutOptions)
    model_id: str = ''
    threads: int = 1

    @property
    def sampling(self):
        """The model policy's :class:`~agentrl.record.SamplingSpec` (either engine)."""
        return self.options.sampling_spec()


@contextlib.contextmanager
def _threads(n: int):
    import torch
    before = torch.get_num_threads()
    if n > 0:
        torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


class EpisodeRunner:
    """Runs chunks of episodes in one process (a Ray actor, or the driver with ``workers=0``).

    Args:
        spec: the :class:`RunSpec`.
        weights: ``{'config': TinyAgent.config(), 'state_dict': ...}`` of the TinyAgent policy,
            or None (no TinyAgent episodes; the ``hf`` engine loads ``spec.options.model`` instead,
            once, at its first model chunk).

    Raises:
        ValueError: :meth:`run` gets a model episode but the runner has no model, or an
            unknown task or policy. Fix: plan with :func:`~agentrl.jobs.plan.plan_episodes`.
    """

    def __init__(self, spec: RunSpec, weights: dict | None = None):
        from .. import gym
        self.spec = spec
        self.tasks = {t.name: t for t in gym.make_tasks('all')}
        self.tok = gym.bugfix_tokenizer()
        self.model = None
        self._hf = None
        self.profiles: list = []            # the hf engine's time split per chunk (options.profile)
        if weights is not None:
            from ..model import TinyAgent
            self.model = TinyAgent(**weights['config'])
            self.model.load_state_dict(weights['state_dict'])
            self.model.eval()

    def _env(self):
        from .. import gym
        return gym.BugFixEnv(max_turns=self.spec.options.max_turns, reward_tests=self.spec.options.reward_tests)

    def _task(self, name: str):
        try:
            return self.tasks[name]
        except KeyError:
            raise ValueError(f'EpisodeRunner: unknown task {name!r}; plan with task names of '
                             'agentrl.gym.make_tasks') from None

    def _hf_model(self):
        """The ``hf`` engine's (model, template), loaded once per runner."""
        if self._hf is None:
            import torch

            from ..engines.hf import load_model
            from ..gym import TOOL_SCHEMAS
            from ..templates import ChatTemplate
            device = 'cuda' if torch.cuda.is_available() else 'cpu'
            model, tok = load_model(self.spec.options.model, device=device)
            self._hf = (model, ChatTemplate(tok, tools=TOOL_SCHEMAS))
        return self._hf

    def run(self, jobs: Sequence[EpisodeJob]) -> list:
        """Run one chunk and return its records, in chunk order, with their identities set.

        TinyAgent episodes run together through ``rollout_batch`` (each with its own generator
        seeded by ``job.seed``); ``hf`` episodes together through
        :func:`~agentrl.engines.hf.bugfix_rollouts` (seeds ``job.seed``); scripted ones one by
        one, each policy object seeded by ``job.seed``.

        Args:
            jobs: the chunk (all of one policy).

        Returns:
            list of :class:`~agentrl.record.Trajectory` with ``provenance.group_id``,
            ``rollout_id``, ``attempt`` and ``seed`` from the jobs.

        Raises:
            ValueError: see the class.
        """
        jobs = list(jobs)
        if not jobs:
            return []
        policies = {j.policy for j in jobs}
        if len(policies) != 1:
            raise ValueError(f'EpisodeRunner.run: one policy per chunk, got {sorted(policies)}; '
                             'cut chunks with plan_chunks')
        with _threads(self.spec.threads):
            recs = self._run(jobs[0].policy, jobs)
        for rec, job in zip(recs, jobs):
            p = rec.provenance
            p.group_id, p.rollout_id, p.attempt, p.seed = job.group_id, job.rollout_id, job.attempt, job.seed
            if job.policy == 'model':
                p.model = self.spec.model_id
        return recs

    def _run(self, policy: str, jobs: list) -> list:
        import torch

        from .. import gym, rollouts
        opts = self.spec.options
        tasks = [self._task(j.task) for j in jobs]
        kw = dict(max_turns=opts.max_turns)
        if policy != 'model':
            return [rollouts.scripted_rollout(gym.scripted_policy(policy, seed=j.seed), self._env(), t,
                                              self.tok, **kw) for j, t in zip(jobs, tasks)]
        if opts.engine == 'hf':
            from ..engines.hf import bugfix_rollouts
            model, template = self._hf_model()
            prof = {} if opts.profile else None
            recs = bugfix_rollouts(model, template.tokenizer, tasks, spec=self.spec.sampling,
                                   max_new_tokens=opts.max_new_tokens, reward_tests=opts.reward_tests,
                                   seeds=[j.seed for j in jobs], batch_size=len(jobs), template=template,
                                   model_name=self.spec.model_id, profile=prof, **kw)
            if prof:
                self.profiles.append(prof)
            return recs
        if self.model is None:
            raise ValueError('EpisodeRunner.run: a model episode but no weights; pass the weights '
                             'of the model policy')
        gens = [torch.Generator().manual_seed(j.seed) for j in jobs]
        kw['spec'] = self.spec.sampling
        if opts.batch:
            return rollouts.rollout_batch(self.model, [self._env() for _ in jobs], tasks, self.tok,
                                          generators=gens, **kw)
        return [rollouts.rollout(self.model, self._env(), t, self.tok, generator=g, **kw)
                for t, g in zip(tasks, gens)]


@dataclass(frozen=True)
class RunnerFactory:
    """A picklable recipe for an :class:`EpisodeRunner` (what the actor pool builds in each actor).

    Attributes:
        spec: the :class:`RunSpec`. weights: the TinyAgent weights or None.
    """
    spec: RunSpec
    weights: dict | None = None

    def __call__(self) -> EpisodeRunner:
        return EpisodeRunner(self.spec, self.weights)
