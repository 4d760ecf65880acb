"""L4: multi-turn chat episodes with a Hugging Face model; the environment is whatever ``respond`` is.

Each episode is a :class:`~agentrl.templates.ChatRecorder`: the sampler continues the
recorder's prompt ids, the sampled ids go into the record as they are, and the environment's
answer (a :class:`~agentrl.engines.episode.Reply`) comes back as a tool (or user) message through
the template-derived bridge. Text exists only at the boundary: the decoded turn is handed to
``respond``, never encoded again. No gym here: the BugFix adapter is :mod:`agentrl.engines.bugfix`
(driven by :func:`agentrl.engines.hf.bugfix_rollouts`).
"""
from __future__ import annotations

import time
from typing import Callable

import torch

from ...model import fill_holes
from ...record import Provenance, StopReason
from ...sampling import PenaltyContext
from ...templates.chat import common_prefix
from ..episode import EpisodeState, Reply
from .models import model_id as _model_id
from .profile import TurnProfile
from .sampler import HFSampler, SampledTurn

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
      ``batch_size``), so each turn prefills the whole conversation again.

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
    gens, max_context = _check_args(sampler, recorders, seeds, max_turns, max_context, batch_size)
    eps = _Episodes(recorders, respond, max_turns, on_done)
    calls0 = sampler.forward_calls
    rows = (reuse_cache and sampler.cache and type(sampler).sample is HFSampler.sample
            and sampler.supports_row_cache())
    if rows:
        _RowDriver(sampler, eps, gens, max_context, min(batch_size, max(n, 1))).run()
    else:
        _drive_turns(sampler, eps, gens, max_turns, max_context, batch_size)
    mid = _model_id(sampler.model)
    out = []
    for i, (rec, st) in enumerate(zip(recorders, eps.state)):
        prov = provenance(i) if provenance is not None else Provenance(
            policy='hf', sampling=sampler.spec, model=mid, seed=None if seeds is None else int(seeds[i]))
        out.append(rec.finish(reward=st.reward, info=st.final_info(), provenance=prov))
    if profile is not None:
        profile.update(eps.prof.result('cross_turn_cache' if rows else 'per_turn', time.perf_counter() - t_start,
                                       out, sampler.forward_calls - calls0))
    return out


def _check_args(sampler, recorders, seeds, max_turns, max_context, batch_size):
    """Refuse bad arguments of :func:`run_chat_episodes`; return ``(generators, max_context)``."""
    n = len(recorders)
    if max_turns < 1:
        raise ValueError(f'run_chat_episodes: max_turns must be >= 1, got {max_turns}')
    if seeds is not None and len(seeds) != n:
        raise ValueError(f'run_chat_episodes: {len(seeds)} seeds for {n} episodes; pass one per episode')
    if batch_size < 1:
        raise ValueError(f'run_chat_episodes: batch_size must be >= 1, got {batch_size}')
    gens = [None] * n if seeds is None else [torch.Generator().manual_seed(int(s)) for s in seeds]
    if max_context is None:
        max_context = getattr(getattr(sampler.model, 'config', None), 'max_position_embeddings', None) or 1 << 30
    for i, rec in enumerate(recorders):
        if len(rec.prompt_ids) >= max_context:
            raise ValueError(f'run_chat_episodes: episode {i} opens with {len(rec.prompt_ids)} prompt tokens, no '
                             f'room for a turn within max_context={max_context}; shorten the prompt or raise it')
    return gens, max_context


class _Episodes:
    """The episodes of one :func:`run_chat_episodes` call: recorders, books, answers, time split."""

    def __init__(self, recorders, respond, max_turns, on_done):
        self.recorders, self.respond, self.max_turns, self.on_done = recorders, respond, max_turns, on_done
        self.state = [EpisodeState() for _ in recorders]
        self.prof = TurnProfile()

    def end(self, i: int, reward: float, info=None, stop: StopReason | None = None) -> None:
        """End episode ``i`` (the driver stopped it, or its reply said done)."""
        self.state[i].end(reward, info, stop)
        if self.on_done is not None:
            self.on_done(i)

    def after_turn(self, i: int, k: int, t) -> bool:
        """Record turn k of episode i and its answer; True when the episode goes on."""
        rec, st, prof = self.recorders[i], self.state[i], self.prof
        t0 = time.perf_counter()
        text = rec.add_turn(t.ids, t.logp)
        t1 = time.perf_counter()
        st.add_turn(k, len(t.ids), t.truncated)
        reply = self.respond(i, t, text)
        t2 = time.perf_counter()
        prof.add(k, 'template_s', t1 - t0)
        prof.add(k, 'gym_s', t2 - t1)
        goes_on = st.apply(reply, k, self.max_turns, episode=i, caller='run_chat_episodes')
        if not goes_on:
            if self.on_done is not None:
                self.on_done(i)
            return False
        rec.add_messages(reply.messages)
        prof.add(k, 'template_s', time.perf_counter() - t2)
        return True


def _drive_turns(sampler, eps, gens, max_turns, max_context, batch_size):
    """The per-turn path: each round samples every live episode's whole prompt again."""
    recorders, state, prof = eps.recorders, eps.state, eps.prof
    live = list(range(len(recorders)))
    for turn in range(max_turns):
        room = {i: max_context - len(recorders[i].prompt_ids) for i in live}
        for i in live:
            if room[i] < 1:
                eps.end(i, 0.0, None, StopReason.TRUNCATED)
        live = [i for i in live if not state[i].done]
        for start in range(0, len(live), batch_size):
            chunk = live[start:start + batch_size]
            before = dict(sampler.stats)
            turns = sampler.sample([recorders[i].prompt_ids for i in chunk], [gens[i] for i in chunk],
                                   max_new_tokens=[min(sampler.max_new_tokens, room[i]) for i in chunk])
            for key in ('prefill_tokens', 'prefill_s', 'decode_tokens', 'decode_s', 'sample_s'):
                prof.add(turn, key, sampler.stats[key] - before[key])
            prof.decode_steps += sampler.stats['decode_steps'] - before['decode_steps']
            for i, t in zip(chunk, turns):
                eps.after_turn(i, turn, t)
        live = [i for i in live if not state[i].done]
        if not live:
            break


class _RowDriver:
    """The cross-turn path: one cache row per live episode, continuous batching (see run_chat_episodes).

    Row ``r`` of the cache belongs to episode ``episode[r]``; the other row lists say what the
    row holds (``held``: the ids whose keys and values it has), what the next decode step feeds
    it (``feed``), its turn index, the :class:`SampledTurn` being sampled, the turn's token
    budget and prompt (the penalty context).
    """
    ROW_FIELDS = ('episode', 'held', 'feed', 'turn_of', 'current', 'budget', 'prompt_of')

    def __init__(self, sampler, eps, gens, max_context, max_rows):
        self.sampler, self.eps, self.gens = sampler, eps, gens
        self.max_context, self.max_rows = max_context, max_rows
        self.cache = sampler.new_row_cache(max_rows)
        self.penalized = sampler.spec.penalized
        for name in self.ROW_FIELDS:
            setattr(self, name, [])

    def _rows(self):
        return [getattr(self, name) for name in self.ROW_FIELDS]

    def run(self) -> None:
        """Run every episode to its end: join as rows free up, one decode step for all live rows."""
        pending = list(range(len(self.eps.recorders)))[::-1]     # popped from the end: episode order
        while pending or self.episode:
            self.join(pending)
            if not self.episode:
                break
            ended = self.step()
            if ended:
                self.compact(ended)

    def join(self, pending: list) -> None:
        """Episodes join as rows free up (an episode with no room for its first turn leaves at once)."""
        while pending and len(self.episode) < self.max_rows:
            r = len(self.episode)
            for lst, value in zip(self._rows(), (pending.pop(), [], 0, 0, None, 0, None)):
                lst.append(value)
            self.cache.lengths[r] = 0
            if not self.start_turn(r, 0):
                for lst in self._rows():
                    lst.pop()

    def start_turn(self, r: int, k: int) -> bool:
        """Bring row r up to the prompt of turn k; False when the episode has no room left."""
        sampler, prof, i = self.sampler, self.eps.prof, self.episode[r]
        prompt = self.eps.recorders[i].prompt_ids
        room = self.max_context - len(prompt)
        if room < 1:
            self.eps.end(i, 0.0, None, StopReason.TRUNCATED)
            return False
        have = self.held[r]
        c = min(common_prefix(have, prompt), len(prompt) - 1)
        if c < len(have):                                  # the template rewrote history: refill from c
            prof.add(k, 'rebuilt_tokens', len(have) - c)
        self.cache.lengths[r] = c
        todo = prompt[c:-1]                                 # the last prompt id goes in the next decode step
        if todo:
            t0 = time.perf_counter()
            sampler.prefill_row(self.cache, r, todo)
            prof.add(k, 'prefill_s', time.perf_counter() - t0)
            prof.add(k, 'prefill_tokens', len(todo))
        del have[c:]
        have += todo
        self.feed[r] = prompt[-1]
        self.turn_of[r] = k
        self.current[r] = SampledTurn(prompt_len=len(prompt))
        self.budget[r] = min(sampler.max_new_tokens, room)
        self.prompt_of[r] = prompt if self.penalized else None
        return True

    def step(self) -> list:
        """One decode step for every live row; return the rows whose episodes ended."""
        sampler, prof, clock = self.sampler, self.eps.prof, time.perf_counter
        n = len(self.episode)
        t0 = clock()
        logits = sampler.decode_rows(self.cache, self.feed)
        t1 = clock()
        ctx = PenaltyContext.of(self.prompt_of, [t.ids for t in self.current]) if self.penalized else None
        ids, logp = sampler.choose(logits, [self.gens[i] for i in self.episode], context=ctx,
                                   turns=[t.ids for t in self.current])
        ids, logp = ids.tolist(), logp.tolist()
        t2 = clock()
        prof.decode_steps += 1
        for k in self.turn_of:
            prof.add(k, 'decode_tokens', 1)
            prof.add(k, 'decode_s', (t1 - t0) / n)
            prof.add(k, 'sample_s', (t2 - t1) / n)
        ended, stop_ids = [], sampler.stop_ids
        for r in range(n):
            self.held[r].append(self.feed[r])
            t = self.current[r]
            t.ids.append(ids[r])
            t.logp.append(logp[r])
            if ids[r] in stop_ids or len(t.ids) >= self.budget[r]:
                t.truncated = ids[r] not in stop_ids
                sampler.tokens_generated += len(t.ids)
                k = self.turn_of[r]
                if not (self.eps.after_turn(self.episode[r], k, t) and self.start_turn(r, k + 1)):
                    ended.append(r)
            else:
                self.feed[r] = ids[r]
        return ended

    def compact(self, ended: list) -> None:
        """Episodes leave: the last rows fill the holes (:func:`~agentrl.model.fill_holes`)."""
        order = fill_holes(len(self.episode), ended)
        for dst, src in enumerate(order):
            if dst != src:
                self.cache.move_row(src, dst)
        for lst in self._rows():
            lst[:] = [lst[src] for src in order]
