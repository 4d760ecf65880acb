"""L3: per-policy summary statistics of a set of trajectories (the rollout table, report.html)."""
from __future__ import annotations

from collections import Counter

import torch

from .record import OWNER, Trajectory

__all__ = ['context_lengths', 'policy_summary']


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


def policy_summary(trajs: list[Trajectory], unk_id: int | None = None) -> dict:
    """Summarise one policy's episodes.

    Args:
        trajs: the policy's trajectories (at least one).
        unk_id: the tokenizer's ``<unk>`` id, to count unknown observation tokens (prompt- and
            tool-owned; a policy may sample ``<unk>`` itself) (None: not counted).

    Returns:
        dict with ``episodes``, ``mean_reward``, ``stops`` (stop reason -> count),
        ``truncation_rate``, ``length_mean``, ``length_max``, ``action_tokens_mean``,
        ``unknown_obs_tokens``, ``first_context_lengths`` (:func:`context_lengths` of the first
        episode), ``prompt_length`` of the first episode.

    Raises:
        ValueError: ``trajs`` is empty.
    """
    if not trajs:
        raise ValueError('policy_summary: no trajectories; pass at least one')
    lengths = torch.tensor([len(t.ids) for t in trajs], dtype=torch.float64)
    stops = Counter(str(t.info.get('stop', 'unknown')) for t in trajs)
    first = trajs[0]
    return {
        'episodes': len(trajs),
        'mean_reward': sum(float(t.reward) for t in trajs) / len(trajs),
        'stops': dict(sorted(stops.items())),
        'truncation_rate': stops.get('truncated', 0) / len(trajs),
        'length_mean': float(lengths.mean()),
        'length_max': int(lengths.max()),
        'action_tokens_mean': sum(float(t.action_mask.sum()) for t in trajs) / len(trajs),
        'unknown_obs_tokens': None if unk_id is None else sum(_unknown_obs(t, unk_id) for t in trajs),
        'prompt_length': int((first.turn == -1).sum()),
        'first_context_lengths': context_lengths(first),
    }
