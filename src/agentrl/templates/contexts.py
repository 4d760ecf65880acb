"""L2: per-turn scoring contexts for templates that are not prefix-stable.

When a template rewrites history (Qwen3 drops earlier reasoning once a new user message
arrives; in non-thinking mode it drops the empty think block of every earlier turn), one forward
pass over the final sequence scores earlier turns in a context the model never saw. The fix is
to score each turn against the ids it was sampled after (chapter 5.8): ``Trajectory.turn_contexts``
holds them, and :func:`turn_records` turns one record into one small record per turn.
"""
from __future__ import annotations

import torch

from ..record import OWNER, Trajectory
from .chat import as_template, check_messages

__all__ = ['turn_records', 'sampling_contexts', 'turn_spans']


def turn_spans(traj: Trajectory) -> list:
    """``[(turn, start, end)]``: token range of each turn's policy tokens in ``traj.ids``.

    Raises:
        ValueError: ``traj.owner`` or ``traj.turn`` is None (build records with ``Trajectory.from_tokens``).

    Source: book chapter 5.6 (``turn`` is -1 for the prompt, k for turn k and its observation).
    """
    if traj.owner is None or traj.turn is None:
        raise ValueError('turn_spans: traj.owner and traj.turn are needed; build records with '
                         'Trajectory.from_tokens or ChatRecorder')
    pol = traj.owner == OWNER['policy']
    out = []
    for k in sorted(set(traj.turn[pol].tolist())):
        idx = torch.nonzero(pol & (traj.turn == k)).flatten()
        out.append((k, int(idx[0]), int(idx[-1]) + 1))
    return out


def turn_records(traj: Trajectory) -> list:
    """Split a record into one record per turn, each scored in the context it was sampled in.

    Record ``k`` is ``context_k + policy ids of turn k``: the context from
    ``traj.turn_contexts`` (or ``ids[:start_k]`` when it is None), every context token
    prompt-owned (not scored), the turn's tokens with their owners and sampling log-probs.
    Summed over turns, the scored tokens are exactly the policy tokens of ``traj``.

    Args:
        traj: a :class:`~agentrl.record.Trajectory` with ``owner`` and ``turn``.

    Returns:
        list of :class:`~agentrl.record.Trajectory`, one per turn (in turn order), built with
        ``Trajectory.from_tokens``; ``info['turn']`` is the turn index.

    Raises:
        ValueError: ``turn_contexts`` has another number of entries than the record has turns,
            or an entry whose start disagrees with the turn's first policy token.

    Source: book chapter 5.8 ("score turns against the context they were sampled in").
    """
    spans = turn_spans(traj)
    ctxs = traj.turn_contexts
    if ctxs is not None and len(ctxs) != len(spans):
        raise ValueError(f'traj.turn_contexts has {len(ctxs)} entries but the record has {len(spans)} turns '
                         'with policy tokens: give one (start, context_ids) per turn')
    logp = torch.cat([torch.zeros(1), traj.sample_logp.float()])  # aligned to ids
    out = []
    for n, (k, s, e) in enumerate(spans):
        if ctxs is None:
            ctx = traj.ids[:s]
        else:
            start, ctx = ctxs[n]
            if int(start) != s:
                raise ValueError(f'traj.turn_contexts[{n}] starts at {start} but turn {k} starts at token {s}')
            ctx = torch.as_tensor(ctx, dtype=torch.long)
        ids = torch.cat([ctx, traj.ids[s:e]])
        owner = [OWNER['prompt']] * len(ctx) + traj.owner[s:e].tolist()
        turn = [-1] * len(ctx) + [k] * (e - s)
        lp = [0.0] * len(ctx) + logp[s:e].tolist()
        out.append(Trajectory.from_tokens(ids, owner, turn, lp, traj.reward, {**traj.info, 'turn': k},
                                          provenance=traj.provenance))
    return out


def sampling_contexts(tokenizer, messages, *, tools=None, **options) -> list:
    """The template's sampling context before each assistant message of a conversation.

    For conversations that were not recorded token-in/token-out (logs, SFT data): context ``i``
    is ``render(messages[:i], add_generation_prompt=True)`` tokenized, what a chat API would
    have fed the model before turn ``i``.

    Args:
        tokenizer: a Hugging Face tokenizer or a :class:`~agentrl.templates.ChatTemplate`.
        messages: the conversation.
        tools, **options: template options (only with a tokenizer).

    Returns:
        ``[(i, ids [L_i] list of int)]`` for every assistant message ``i > 0``.

    Raises:
        ValueError: malformed messages.

    Source: book chapter 5.3 and 5.8.
    """
    template = as_template(tokenizer, tools=tools, **options)
    messages = check_messages(messages)
    return [(i, template.encode(template.render(messages[:i], True)))
            for i, m in enumerate(messages) if m['role'] == 'assistant' and i > 0]
