"""L4: the HF backend's :class:`~agentrl.engines.driver.TurnBatch` es: how an :class:`HFSampler` samples many episodes.

* :class:`RowBatch` (the cross-turn cache): each episode keeps its own row of one KV cache for its
  whole life. A submitted turn feeds only the tokens the row does not hold yet (the bridge and the
  generation prompt); where the template rewrote history the row is cut back to the common prefix
  and refilled. Episodes join as rows free up and leave when they end (continuous batching): every
  decode step feeds one token to every live row, whatever turn it is in.
* :class:`RoundBatch` (per turn): each collect samples every queued prompt whole through
  :meth:`HFSampler.sample`, in chunks of ``batch_size``.

Both draw each episode's tokens from its own generator, seeded once by the episode's seed and
continued across its turns. Source: docs/design.md#hf-engine.
"""
from __future__ import annotations

import time

import torch

from ...model import fill_holes
from ...sampling import PenaltyContext
from ...templates.chat import common_prefix
from ..episode import SampledTurn

__all__ = ['RowBatch', 'RoundBatch']


def _generator(seed):
    return None if seed is None else torch.Generator().manual_seed(int(seed))


class RowBatch:
    """One cache row per live episode (see the module docstring).

    Row ``r`` belongs to episode ``episode[r]``; the other row lists say what it holds (``held``:
    the ids whose keys and values it has), what the next decode step feeds it (``feed``), its turn
    index, the :class:`SampledTurn` being sampled, the turn's budget and prompt (the penalty context).

    Args:
        sampler: an :class:`HFSampler` that :meth:`~HFSampler.supports_row_cache`.
        max_rows: at most this many episodes at once. profile: optional per-turn time split
            (``add(turn, key, value)``, ``decode_steps``).
    """
    ROW_FIELDS = ('episode', 'held', 'feed', 'turn_of', 'current', 'budget', 'prompt_of')
    #: :meth:`submit` refuses ``request.images`` by name (a cache row holds no pixels).
    handles_images = True

    def __init__(self, sampler, max_rows: int, profile=None):
        self.sampler, self.max_rows, self.prof = sampler, int(max_rows), profile
        self.cache = sampler.new_row_cache(self.max_rows)
        self.penalized = sampler.spec.penalized
        self.gens: dict = {}
        self.queue: list = []
        self.ended: list = []
        for name in self.ROW_FIELDS:
            setattr(self, name, [])

    def _rows(self):
        return [getattr(self, name) for name in self.ROW_FIELDS]

    def _add(self, k: int, key: str, value) -> None:
        if self.prof is not None:
            self.prof.add(k, key, value)

    def submit(self, episode: int, turn: int, request) -> None:
        """Bring the episode's row up to ``request.prompt_ids`` now, or queue it until a row frees up.

        Raises:
            ValueError: a request with images (a cache row holds no pixels: give the sampler its model's
                ``image_processor``, which samples through :class:`RoundBatch`).
        """
        if request.images:
            raise ValueError(f'episode {episode} brings images but the sampler has no image_processor; pass '
                             'HFSampler(..., image_processor=load_image_processor(model_dir))')
        if episode not in self.gens:
            self.gens[episode] = _generator(request.seed)
        if episode in self.episode:
            self.start_turn(self.episode.index(episode), turn, request)
        else:
            self.queue.append((episode, turn, request))

    def release(self, episode: int) -> None:
        """The episode ended: its row leaves at the next :meth:`collect`."""
        if episode in self.episode:
            self.ended.append(self.episode.index(episode))

    def collect(self) -> list:
        """Rows that ended leave, queued episodes join, then decode steps until a turn finishes."""
        if self.ended:
            self.compact(sorted(self.ended))
            self.ended = []
        while self.queue and len(self.episode) < self.max_rows:
            episode, turn, request = self.queue.pop(0)
            r = len(self.episode)
            for lst, value in zip(self._rows(), (episode, [], 0, 0, None, 0, None)):
                lst.append(value)
            self.cache.lengths[r] = 0
            self.start_turn(r, turn, request)
        while self.episode:
            done = self.step()
            if done:
                return done
        return []

    def start_turn(self, r: int, k: int, request) -> None:
        """Bring row r up to the prompt of turn k."""
        prompt = request.prompt_ids
        have = self.held[r]
        c = min(common_prefix(have, prompt), len(prompt) - 1)
        if c < len(have):                                  # the template rewrote history: refill from c
            self._add(k, 'rebuilt_tokens', len(have) - c)
        self.cache.lengths[r] = c
        todo = prompt[c:-1]                                 # the last prompt id goes in the next decode step
        if todo:
            t0 = time.perf_counter()
            self.sampler.prefill_row(self.cache, r, todo)
            self._add(k, 'prefill_s', time.perf_counter() - t0)
            self._add(k, 'prefill_tokens', len(todo))
        del have[c:]
        have += todo
        self.feed[r] = prompt[-1]
        self.turn_of[r] = k
        self.current[r] = SampledTurn(prompt_len=len(prompt))
        self.budget[r] = int(request.max_new_tokens)
        self.prompt_of[r] = prompt if self.penalized else None

    def step(self) -> list:
        """One decode step for every live row: ``[(episode, turn, SampledTurn)]`` of the turns it finished."""
        sampler, clock = self.sampler, time.perf_counter
        n = len(self.episode)
        t0 = clock()
        logits = sampler.decode_rows(self.cache, self.feed)
        t1 = clock()
        ctx = PenaltyContext.of(self.prompt_of, [t.ids for t in self.current]) if self.penalized else None
        ids, logp = sampler.choose(logits, [self.gens[i] for i in self.episode], context=ctx,
                                   turns=[t.ids for t in self.current])
        ids, logp = ids.tolist(), logp.tolist()
        t2 = clock()
        if self.prof is not None:
            self.prof.decode_steps += 1
            for k in self.turn_of:
                self.prof.add(k, 'decode_tokens', 1)
                self.prof.add(k, 'decode_s', (t1 - t0) / n)
                self.prof.add(k, 'sample_s', (t2 - t1) / n)
        done, stop_ids = [], sampler.stop_ids
        for r in range(n):
            self.held[r].append(self.feed[r])
            t = self.current[r]
            t.ids.append(ids[r])
            t.logp.append(logp[r])
            if ids[r] in stop_ids or len(t.ids) >= self.budget[r]:
                t.truncated = ids[r] not in stop_ids
                sampler.tokens_generated += len(t.ids)
                done.append((self.episode[r], self.turn_of[r], t))
            else:
                self.feed[r] = ids[r]
        return done

    def compact(self, ended: list) -> None:
        """Episodes leave: the last rows fill the holes (:func:`~agentrl.model.fill_holes`)."""
        order = fill_holes(len(self.episode), ended)
        for dst, src in enumerate(order):
            if dst != src:
                self.cache.move_row(src, dst)
        for lst in self._rows():
            lst[:] = [lst[src] for src in order]


class RoundBatch:
    """Each collect samples every queued turn's whole prompt (:meth:`HFSampler.sample`, chunks of ``batch_size``).

    Args:
        sampler: an :class:`HFSampler` (or a subclass with its own ``sample``).
        batch_size: prompts per sampler call. profile: as :class:`RowBatch`.
    A request's ``images`` (a vision-language episode's) go to :meth:`HFSampler.sample` with its prompt.
    """
    #: a request's ``images`` go to the sampler with its prompt (which refuses them without an image processor).
    handles_images = True

    def __init__(self, sampler, batch_size: int, profile=None):
        self.sampler, self.batch_size, self.prof = sampler, int(batch_size), profile
        self.gens: dict = {}
        self.queue: list = []

    def submit(self, episode: int, turn: int, request) -> None:
        """Queue the turn for the next :meth:`collect`."""
        if episode not in self.gens:
            self.gens[episode] = _generator(request.seed)
        self.queue.append((episode, turn, request))

    def release(self, episode: int) -> None:
        """Nothing held between turns."""

    def collect(self) -> list:
        """Sample every queued turn: ``[(episode, turn, SampledTurn)]`` in queue order."""
        queue, self.queue = self.queue, []
        sampler, out = self.sampler, []
        for start in range(0, len(queue), self.batch_size):
            chunk = queue[start:start + self.batch_size]
            before = dict(sampler.stats)
            images = [req.images for _, _, req in chunk]
            extra = {'images': images} if any(images) else {}     # a vision model: each prompt with its images
            turns = sampler.sample([list(req.prompt_ids) for _, _, req in chunk], [self.gens[i] for i, _, _ in chunk],
                                   max_new_tokens=[int(req.max_new_tokens) for _, _, req in chunk], **extra)
            if self.prof is not None:
                k = chunk[0][1]
                for key in ('prefill_tokens', 'prefill_s', 'decode_tokens', 'decode_s', 'sample_s'):
                    self.prof.add(k, key, sampler.stats[key] - before[key])
                self.prof.decode_steps += sampler.stats['decode_steps'] - before['decode_steps']
            out += [(i, k, t) for (i, k, _), t in zip(chunk, turns)]
        return out
