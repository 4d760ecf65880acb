"""L3: episode statistics: one :class:`PolicySummary` for the rollout table, the report, training and checks.

A summary is built from records once (:meth:`PolicySummary.of`) or a chunk at a time
(:class:`SummaryBuilder`, what a streamed rollout uses: memory bounded by the chunk). One set of
key spellings: ``mean_reward``, ``length_mean``, ``action_tokens_mean``, ``truncation_rate``.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import asdict, dataclass, field

from .record import OWNER, StopReason, Trajectory

__all__ = ['StopReason', 'context_lengths', 'PolicySummary', 'SummaryBuilder', 'policy_summary',
           'episode_metrics', 'is_truncated', 'source_stop_reason']


def context_lengths(traj: Trajectory) -> list[int]:
    """Context length after each turn: ``1 + last position of turn k`` for k = 0, 1, ...

    Source: book chapter 5.8 (oracle clamp: prompt 7, then ``[35, 42, 73, 76]``).
    """
    turns = traj.turn
    n = int(turns.max()) + 1 if len(turns) else 0
    return [int((turns == k).nonzero().max()) + 1 for k in range(n) if bool((turns == k).any())]


def _unknown_obs(traj: Trajectory, unk_id: int) -> int:
    observed = (traj.owner == OWNER['prompt']) | (traj.owner == OWNER['tool'])
    return int(((traj.ids == unk_id) & observed).sum())


def is_truncated(traj: Trajectory) -> bool:
    """Whether an episode was truncated: it stopped ``truncated`` (TinyAgent: the next call would
    not fit the context) or a turn was cut at its token budget (Hugging Face engine:
    ``info['truncated_turns']`` not empty, e.g. ``--max-new-tokens`` reached without an end-of-turn token).

    The truncation rate (rollout table, ``summary.json``, ``agentrl check``, the report) is the
    fraction of episodes for which this holds: of episodes, not of turns.
    """
    info = traj.info or {}
    gateway = info.get('gateway')
    return (info.get('stop') == StopReason.TRUNCATED.value or bool(info.get('truncated_turns'))
            or (isinstance(gateway, dict) and bool(gateway.get('truncated_turns'))))


def source_stop_reason(info) -> str | None:
    """The stop reason of a record that did not come from the gym, in its source's words, or None.

    ``'finish_reason X'``: the server's last ``finish_reason`` of an imported record
    (``info['import']['finish']``) or of a gateway record's last turn (``info['gateway']['finish_reasons']``,
    OpenAI's ``stop`` / ``length`` / ``tool_calls``). None when the record names none (the caller then
    falls back to ``info['stop']``). The one rule of ``agentrl check`` and ``agentrl report``.
    """
    info = info if isinstance(info, dict) else {}
    meta = info.get('import')
    if isinstance(meta, dict) and meta.get('finish') is not None:
        return f"finish_reason {meta['finish']}"
    gateway = info.get('gateway')
    reasons = gateway.get('finish_reasons') if isinstance(gateway, dict) else None
    if isinstance(reasons, list) and reasons:
        return f'finish_reason {reasons[-1]}'
    return None


@dataclass
class PolicySummary:
    """Statistics of one policy's episodes.

    Attributes:
        episodes: number of episodes.
        mean_reward: mean episode reward.
        stops: stop reason -> count (:class:`StopReason` values), sorted by reason.
        truncation_rate: fraction of episodes that were truncated (:func:`is_truncated`: stopped
            ``truncated``, or a turn cut at its token budget).
        length_mean, length_max: tokens per episode (``len(ids)``).
        action_tokens_mean: mean policy-owned (trained) tokens per episode.
        unknown_obs_tokens: ``<unk>`` tokens in prompt and tool spans (None: not counted).
        prompt_length: prompt tokens of the first episode (``turn == -1``).
        first_context_lengths: :func:`context_lengths` of the first episode.

    Reads like the dict it replaces: ``s['mean_reward']`` works.
    """
    episodes: int
    mean_reward: float
    stops: dict = field(default_factory=dict)
    truncation_rate: float = 0.0
    length_mean: float = 0.0
    length_max: int = 0
    action_tokens_mean: float = 0.0
    unknown_obs_tokens: int | None = None
    prompt_length: int = 0
    first_context_lengths: list = field(default_factory=list)

    @classmethod
    def of(cls, trajs: list[Trajectory], unk_id: int | None = None) -> 'PolicySummary':
        """Summarise ``trajs`` (at least one; the first is the example episode).

        Args:
            trajs: the policy's records.
            unk_id: the tokenizer's ``<unk>`` id, to count unknown observation tokens (prompt-
                and tool-owned; a policy may sample ``<unk>`` itself) (None: not counted).

        Raises:
            ValueError: ``trajs`` is empty.
        """
        if not trajs:
            raise ValueError('PolicySummary.of: no trajectories; pass at least one')
        b = SummaryBuilder(unk_id)
        b.add(trajs)
        return b.summary()

    def to_dict(self) -> dict:
        """Plain dict (JSON-ready), keys as the attributes."""
        return asdict(self)

    def metrics(self) -> dict:
        """The per-step training metrics: ``reward``, ``truncation_rate``, ``length``, ``action_tokens``."""
        return {'reward': self.mean_reward, 'truncation_rate': self.truncation_rate, 'length': self.length_mean,
                'action_tokens': self.action_tokens_mean}

    def __getitem__(self, key: str):
        return getattr(self, key)


class SummaryBuilder:
    """Accumulate a :class:`PolicySummary` chunk by chunk (memory: a few counters).

    Args:
        unk_id: as :meth:`PolicySummary.of`.

    The example episode (prompt length, context lengths) is the one added with the smallest
    ``order`` (default: the first added), so a resumed run names the same episode.
    """

    def __init__(self, unk_id: int | None = None):
        self.unk_id = unk_id
        self.n = 0
        self.reward = 0.0
        self.length = 0
        self.length_max = 0
        self.action = 0.0
        self.unknown = 0
        self.stops: Counter = Counter()
        self.truncated = 0
        self._first = None      # (order, prompt_length, context lengths)

    def add(self, trajs, order=None) -> None:
        """Add records; ``order[i]`` ranks record ``i`` for the choice of the example episode."""
        for i, t in enumerate(trajs):
            rank = self.n if order is None else order[i]
            self.n += 1
            self.reward += float(t.reward)
            n = len(t.ids)
            self.length += n
            self.length_max = max(self.length_max, n)
            self.action += float(t.action_mask.sum())
            if self.unk_id is not None:
                self.unknown += _unknown_obs(t, self.unk_id)
            self.stops[str((t.info or {}).get('stop', StopReason.UNKNOWN))] += 1
            self.truncated += is_truncated(t)
            if self._first is None or rank < self._first[0]:
                self._first = (rank, int((t.turn == -1).sum()), context_lengths(t))

    def summary(self) -> PolicySummary:
        """The summary so far.

        Raises:
            ValueError: nothing was added.
        """
        if not self.n:
            raise ValueError('SummaryBuilder.summary: no trajectories were added')
        return PolicySummary(episodes=self.n, mean_reward=self.reward / self.n, stops=dict(sorted(self.stops.items())),
                             truncation_rate=self.truncated / self.n,
                             length_mean=self.length / self.n, length_max=self.length_max,
                             action_tokens_mean=self.action / self.n,
                             unknown_obs_tokens=None if self.unk_id is None else self.unknown,
                             prompt_length=self._first[1], first_context_lengths=self._first[2])


def policy_summary(trajs: list[Trajectory], unk_id: int | None = None) -> dict:
    """:meth:`PolicySummary.of` as a plain dict (the layout of ``summary.json``).

    Raises:
        ValueError: ``trajs`` is empty.
    """
    if not trajs:
        raise ValueError('policy_summary: no trajectories; pass at least one')
    return PolicySummary.of(trajs, unk_id).to_dict()


def episode_metrics(trajs: list[Trajectory]) -> dict:
    """Per-step episode metrics of sampled records (:meth:`PolicySummary.metrics`).

    Returns:
        dict of floats: ``reward`` (mean), ``truncation_rate`` (fraction of episodes truncated,
        :func:`is_truncated`), ``length`` (mean tokens per episode),
        ``action_tokens`` (mean policy tokens per episode).

    Raises:
        ValueError: no records.
    """
    if not trajs:
        raise ValueError('episode_metrics: no records')
    return PolicySummary.of(trajs).metrics()
