"""SFT warm start: masked next-token NLL on oracle demonstrations (book chapter 6).

An untrained TinyAgent earns reward 0 on every episode, so every GRPO advantage is zero
(book chapter 5.7). The warm start imitates the scripted oracle's calls: the loss is
docs/design.md#training's masked NLL (``action_mask == 1``). Scripted records carry a placeholder ``sample_logp``; SFT
does not read it (it is not an importance-weighted loss), so they are valid demonstrations.
"""
from __future__ import annotations

import torch

from ..record import Batch, Trajectory
from ..sampling import token_logp

__all__ = ['oracle_demos', 'scripted_demos', 'masked_nll', 'sft_loss', 'sft_step']


def oracle_demos(tasks, tok, max_turns: int = 6, reward_tests: str = 'hidden') -> list[Trajectory]:
    """One scripted oracle demonstration per task (read, edit the fix, test, submit).

    Args:
        tasks: BugFix tasks (``make_tasks('train')`` for the warm start).
        tok: the word-level tokenizer.
        max_turns: turn budget of the env and the rollout.
        reward_tests: ``'hidden'`` or ``'public'``; the oracle earns 1.0 with either.

    Returns:
        list of Trajectory, one per task, in task order; ``provenance.logp_placeholder`` is
        True (their ``sample_logp`` must never enter an importance ratio).

    Source: book chapter 5.6 (``scripted_rollout``), docs/design.md#training.
    """
    return scripted_demos('oracle', tasks, tok, max_turns, reward_tests)


def scripted_demos(kind: str, tasks, tok, max_turns: int = 6, reward_tests: str = 'hidden') -> list[Trajectory]:
    """One scripted demonstration per task by the scripted policy ``kind`` (seed 0).

    Args:
        kind: ``'oracle'``, ``'hacker'``, ``'blind'`` or ``'random'`` (``gym.scripted_policy``).
        tasks, tok, max_turns, reward_tests: as in :func:`oracle_demos`.

    Returns:
        list of Trajectory in task order, each with ``provenance.logp_placeholder`` True.
    """
    from .. import gym
    from ..rollouts import scripted_rollout
    policy = gym.scripted_policy(kind)
    return [scripted_rollout(policy, gym.BugFixEnv(max_turns=max_turns, reward_tests=reward_tests), task, tok,
                             max_turns=max_turns) for task in tasks]


def masked_nll(logits: torch.Tensor, targets: torch.Tensor, action_mask: torch.Tensor) -> torch.Tensor:
    """Mean negative log-likelihood of the policy-owned targets.

    Args:
        logits: ``[B, T-1, V]`` float logits at the predicting positions (``model(ids)[:, :-1]``).
        targets: ``[B, T-1]`` int64 predicted tokens (``ids[:, 1:]``).
        action_mask: ``[B, T-1]`` float32, 1.0 where the target was written by the policy.

    Returns:
        scalar float32: ``-sum(mask * log p(target)) / sum(mask)`` in nats per action token.
        Targets where ``action_mask == 0`` have no effect on the value or the gradient (the
        mask multiplies their log-probs by exactly 0).

    Raises:
        ValueError: shapes disagree, or the mask selects no token (nothing to imitate: were the
            records built with ``Trajectory.from_tokens`` from policy-owned calls?).

    Source: book chapter 6 (SFT on ``action_mask`` positions); the per-token mean is the usual
    language-model loss (every demonstrated call token weighs the same).
    """
    if logits.shape[:2] != targets.shape or targets.shape != action_mask.shape:
        raise ValueError(f'masked_nll: logits {tuple(logits.shape)}, targets {tuple(targets.shape)} and '
                         f'action_mask {tuple(action_mask.shape)} must agree on [B, T-1]')
    n = action_mask.sum()
    if n <= 0:
        raise ValueError('masked_nll: action_mask selects no token; SFT needs policy-owned tokens '
                         '(owner == policy) in the demonstrations')
    logp = token_logp(logits, torch.nn.functional.pad(targets, (1, 0)))    # the one gather; column j = targets[:, j]
    return -(logp * action_mask).sum() / n


def sft_loss(model, batch: Batch, packed=None) -> tuple[torch.Tensor, dict]:
    """SFT loss of a collated batch and its metrics.

    Args:
        model: TinyAgent (ids ``[B, T]`` -> logits ``[B, T, V]``).
        batch: :class:`~agentrl.record.Batch` from :func:`~agentrl.batching.collate`.
        packed: the same records as a :class:`~agentrl.packing.PackedBatch` (row order of ``batch``):
            the logits come from one packed forward (:func:`agentrl.train.packed.packed_step_logits`),
            equal to the padded ones to fp32 rounding.

    Returns:
        ``(loss, metrics)``: scalar loss (see :func:`masked_nll`) with its graph; metrics
        ``{'loss', 'token_acc', 'action_tokens'}`` as floats, where ``token_acc`` is the
        fraction of action tokens whose argmax prediction equals the demonstration.

    Raises:
        ValueError: see :func:`masked_nll`.
    """
    if packed is None:
        logits = model(batch.ids)[:, :-1]
    else:
        from .packed import packed_step_logits
        logits = packed_step_logits(model, packed, batch.ids.shape[0], batch.ids.shape[1] - 1)
    targets = batch.ids[:, 1:]
    loss = masked_nll(logits, targets, batch.action_mask)
    with torch.no_grad():
        mask = batch.action_mask
        acc = float(((logits.argmax(-1) == targets).float() * mask).sum() / mask.sum())
    return loss, {'loss': float(loss.detach()), 'token_acc': acc, 'action_tokens': int(batch.action_mask.sum())}


def sft_step(model, optimizer, batch: Batch, max_grad_norm: float = 1.0, packed=None) -> dict:
    """One optimiser step of SFT on ``batch``.

    Args:
        model: the policy (put in train mode by this call).
        optimizer: a torch optimiser over ``model``'s parameters.
        batch: collated demonstrations.
        max_grad_norm: global gradient-norm clip (<= 0 disables).
        packed: as in :func:`sft_loss`.

    Returns:
        the metrics of :func:`sft_loss` plus ``grad_norm`` (before clipping).
    """
    model.train()
    loss, metrics = sft_loss(model, batch, packed)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm if max_grad_norm > 0 else float('inf'))
    optimizer.step()
    metrics['grad_norm'] = float(norm)
    return metrics
