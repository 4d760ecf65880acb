"""L4: multi-turn chat episodes with a Hugging Face model on the one driver (:func:`agentrl.engines.driver.drive_episodes`).

Each episode is a :class:`~agentrl.templates.ChatRecorder`: the sampler continues the
recorder's prompt ids, the sampled ids go into the record as they are, and the environment's
answer (a :class:`~agentrl.engines.episode.Reply`) comes back as a tool (or user) message through
the template-derived bridge. Text exists only at the boundary: the decoded turn is handed to
``respond``, never encoded again. No gym here: the BugFix adapter is :mod:`agentrl.jobs.bugfix`.
"""
from __future__ import annotations

import time
from typing import Callable

from ...record import Provenance
from ..driver import drive_episodes
from ..episode import Reply
from .batch import RoundBatch, RowBatch
from .models import model_id as _model_id
from .profile import Profile
from .sampler import HFSampler

__all__ = ['Reply', 'run_chat_episodes']


def run_chat_episodes(sampler: HFSampler, recorders: list, respond: Callable, *, seeds=None,
                      max_turns: int = 6, max_context: int | None = None, batch_size: int = 32,
                      provenance: Callable | None = None, on_done: Callable | None = None,
                      reuse_cache: bool = True, profile: dict | None = None) -> list:
    """Drive chat episodes: sample a turn, record it, answer it, bridge the answer, until each ends.

    Two paths give the same records (same seeds: the same ids, log-probs equal to fp rounding):

    * ``reuse_cache=True`` (default, when the sampler supports it): each episode keeps its own
      row of one KV cache for its whole life. After a turn only the tokens the cache does not
      hold yet are fed (the last sampled id, the bridge: tool result and next generation
      prompt); where the template rewrote history (``recorder.prompt_ids`` is not an extension
      of what the row holds, e.g. Qwen3 without thinking drops the empty think block of earlier
      turns) the row is cut back to the common prefix and refilled from there. Episodes join
      the running batch as rows free up and leave it when they end (continuous batching): every
      decode step feeds one token to every live row, whatever turn it is in.
    * ``reuse_cache=False``, or a sampler subclass that overrides ``sample``: each round feeds
      every live episode's ``recorder.prompt_ids`` to ``sampler.sample`` (in chunks of
      ``batch_size``), so each turn prefills the whole conversation again. A sampler with an
      ``image_processor`` (a vision-language model) always takes this path, each prompt with its
      recorder's images (``ChatRecorder.images``, in the turn's ``TurnRequest.images``).

    Either way the sampled ids and log-probs go into the recorder verbatim (``add_turn``), the
    decoded text goes to ``respond``, and its messages come back through ``add_messages``.

    Args:
        sampler: an :class:`~agentrl.engines.hf.HFSampler` (its spec is recorded).
        recorders: one fresh :class:`~agentrl.templates.ChatRecorder` per episode.
        respond: ``respond(i, turn, text) -> Reply`` for episode ``i``, the
            :class:`~agentrl.engines.hf.SampledTurn` and its decoded text (end-of-turn token
            stripped); it must not re-encode ``text``. Calls for one episode come in turn order;
            calls of different episodes interleave differently on the two paths.
        seeds: one int per episode (its own ``torch.Generator``; stored as ``Provenance.seed``);
            None uses torch's global RNG (then the two paths draw differently).
        max_turns: turn limit; an episode still running after it stops as ``truncated``, reward 0.
        max_context: context limit in tokens (default the model's ``max_position_embeddings``);
            a turn's budget is ``min(max_new_tokens, max_context - len(prompt))``, and an episode
            with no room for one token stops as ``truncated``, reward 0.
        batch_size: at most this many episodes sampled at once (rows of the cache).
        provenance: ``provenance(i) -> Provenance`` for episode ``i`` (default: policy ``'hf'``,
            the sampler's spec, the model id, the seed); the recorder adds the template and
            tokenizer fingerprints.
        on_done: optional callback ``on_done(i)`` when episode ``i`` ends (progress bars).
        reuse_cache: keep each episode's KV cache across turns (see above).
        profile: optional dict, filled with the time split: ``path`` (``'cross_turn_cache'`` or
            ``'per_turn'``), ``wall_s``, ``episodes``, ``turns`` (one dict per turn index with
            :data:`PROFILE_KEYS`: prompt tokens fed in prompt forward passes and their seconds,
            cached positions dropped and fed again because the template rewrote history, decode
            tokens (one per live row and step) and
            their share of the decode forward seconds, sampling seconds, recorder (template and
            bridges) seconds, ``respond`` (gym) seconds) and ``totals`` (the same summed, plus
            ``forward_s``, ``other_s``, ``decode_steps``, ``forward_calls``, ``record_tokens``).
            :func:`format_profile` prints it.

    Returns:
        One :class:`~agentrl.record.Trajectory` per episode, in order. ``info`` holds the final
        info of the reply that ended it, plus ``actions`` (each turn's ``Reply.action``),
        ``truncated_turns`` (turns cut at their budget: no end-of-turn token in their span),
        ``turn_tokens`` (sampled tokens per turn) and the recorder's ``template`` report.

    Raises:
        ValueError: ``max_turns < 1``; ``seeds`` of another length than ``recorders``; an opening
            prompt that leaves no room for a turn within ``max_context``; a reply without messages
            for an episode that goes on; as ``ChatRecorder`` and
            ``HFSampler.sample`` (e.g. a sampled id outside the tokenizer's vocabulary).

    Source: book chapter 5.6-5.8 (truncation gives reward 0 and is recorded); continuous
    batching with one cache row per episode as :func:`agentrl.rollouts.rollout_batch` does for
    TinyAgent.
    """
    t_start = time.perf_counter()
    n = len(recorders)
    max_context = _check_args(sampler, recorders, seeds, max_turns, max_context, batch_size)
    prof = Profile()
    calls0 = sampler.forward_calls
    rows = (reuse_cache and sampler.cache and type(sampler).sample is HFSampler.sample
            and sampler.supports_row_cache())
    batch = RowBatch(sampler, min(batch_size, max(n, 1)), prof) if rows else RoundBatch(sampler, batch_size, prof)
    mid = _model_id(sampler.model)
    if provenance is None:
        provenance = lambda i: Provenance(policy='hf', sampling=sampler.spec, model=mid,  # noqa: E731
                                          seed=None if seeds is None else int(seeds[i]))
    out = drive_episodes(batch, recorders, respond, seeds=[None] * n if seeds is None else list(seeds),
                         spec=sampler.spec, max_turns=max_turns, max_new_tokens=sampler.max_new_tokens,
                         max_context=max_context, provenance=provenance,
                         on_done=None if on_done is None else (lambda i, _rec: on_done(i)), profile=prof,
                         caller='run_chat_episodes')
    if profile is not None:
        profile.update(prof.result('cross_turn_cache' if rows else 'per_turn', time.perf_counter() - t_start,
                                   out, sampler.forward_calls - calls0))
    return out


def _check_args(sampler, recorders, seeds, max_turns, max_context, batch_size) -> int:
    """Refuse bad arguments of :func:`run_chat_episodes`; return ``max_context``."""
    n = len(recorders)
    if max_turns < 1:
        raise ValueError(f'run_chat_episodes: max_turns must be >= 1, got {max_turns}')
    if seeds is not None and len(seeds) != n:
        raise ValueError(f'run_chat_episodes: {len(seeds)} seeds for {n} episodes; pass one per episode')
    if batch_size < 1:
        raise ValueError(f'run_chat_episodes: batch_size must be >= 1, got {batch_size}')
    if max_context is None:
        max_context = getattr(getattr(sampler.model, 'config', None), 'max_position_embeddings', None) or 1 << 30
    for i, rec in enumerate(recorders):
        if len(rec.prompt_ids) >= max_context:
            raise ValueError(f'run_chat_episodes: episode {i} opens with {len(rec.prompt_ids)} prompt tokens, no '
                             f'room for a turn within max_context={max_context}; shorten the prompt or raise it')
    return max_context
