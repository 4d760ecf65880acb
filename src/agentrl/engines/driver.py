"""L4: the one episode driver: chat episodes over any engine's :class:`TurnBatch`, recorded the same way.

Each episode is a :class:`~agentrl.templates.ChatRecorder`. The driver hands every pending turn to
the engine's batch at once (:meth:`TurnBatch.submit`), takes the turns that finished
(:meth:`TurnBatch.collect`), records each (``add_turn``: the ids and log-probs as they are), hands
the decoded text to ``respond(i, turn, text) -> Reply``, keeps the episode's books
(:class:`~agentrl.engines.episode.EpisodeState`) and bridges the answer back (``add_messages``),
until every episode ended. How a batch samples is its own business: the HF batches keep one KV
cache row per episode (continuous batching) or sample rounds of whole prompts; the vLLM batch keeps
many requests in flight. TinyAgent's batched loop (:func:`agentrl.rollouts.rollout_batch`) is its
own fast path.

Torch-free. Source: docs/design.md#engines; book chapter 5.6-5.8 (truncation gives reward 0 and is
recorded).
"""
from __future__ import annotations

import time
from typing import Callable, Protocol

from .contract import EngineDied, TurnRequest, check_request
from ..record import StopReason
from .episode import EpisodeState

__all__ = ['TurnBatch', 'drive_episodes']


class TurnBatch(Protocol):
    """An engine's way to sample the turns of many episodes at once.

    ``request.seed`` of :meth:`submit` is the episode's seed: the batch derives each turn's draw from
    it (HF: one generator per episode across its turns; vLLM: :func:`~agentrl.engines.vllm.turn_seed`).

    A batch that sets ``handles_images = True`` takes ``request.images`` itself (feeds them to its model with
    their prompt, or refuses them by name); to any other batch the driver refuses a request with images
    (:func:`~agentrl.engines.contract.check_request`), so placeholder ids never reach a model without their
    pixels (docs/design.md#images).
    """

    handles_images: bool

    def submit(self, episode: int, turn: int, request: TurnRequest) -> None:
        """Queue turn ``turn`` of ``episode`` (its previous turn was collected)."""
        ...

    def collect(self) -> list:
        """Sample until at least one queued turn finished: ``[(episode, turn, result)]`` (``[]``: none queued).

        ``result`` is the sampled turn (``ids``, ``logp``, ``truncated``), or the exception that lost
        that one episode (e.g. :class:`~agentrl.engines.contract.EngineDied`); an error of the whole
        batch is raised.
        """
        ...

    def release(self, episode: int) -> None:
        """The episode ended: free what it holds."""
        ...


def drive_episodes(batch: TurnBatch, recorders: list, respond: Callable, *, seeds, spec, max_turns: int,
                   max_new_tokens: int, max_context, provenance: Callable, extra_info: Callable | None = None,
                   on_done: Callable | None = None, profile=None, caller: str = 'drive_episodes') -> list:
    """Run chat episodes to their ends on ``batch``; their records, in order.

    Args:
        batch: the engine's :class:`TurnBatch`.
        recorders: one fresh :class:`~agentrl.templates.ChatRecorder` per episode (stop ids from its template).
        respond: ``respond(i, turn, text) -> Reply`` (the collected turn and its decoded text without
            its end-of-turn token; it must not encode ``text`` again); calls of one episode come in turn order.
        seeds: one int (or None: the engine's global generator) per episode; ``TurnRequest.seed`` of its turns.
        spec: the :class:`~agentrl.record.SamplingSpec` sent with every turn.
        max_turns: turn limit; an episode still running after it stops ``truncated``, reward 0.
        max_new_tokens: a turn's budget is ``min(max_new_tokens, max_context - len(prompt))``; an
            episode without room for one token stops ``truncated``, reward 0.
        max_context: int, or ``max_context(i)`` per episode (e.g. its server's ``max_model_len``).
        provenance: ``provenance(i) -> Provenance`` of episode ``i``'s record.
        extra_info: optional ``extra_info(i, turns) -> dict`` appended to the record's ``info``
            (``turns``: the episode's collected turns).
        on_done: optional ``on_done(i, record)`` as each episode ends (stream it).
        profile: optional accumulator with ``add(turn, key, seconds)`` (``template_s``, ``gym_s``).
        caller: the name errors start with.

    Returns:
        One :class:`~agentrl.record.Trajectory` per episode, in order; ``info`` as
        :meth:`EpisodeState.final_info` plus ``extra_info``.

    Raises:
        ValueError: a reply without messages for an episode that goes on; as ``ChatRecorder``.
        RequestRefused: a turn with images for a batch without ``handles_images`` (:class:`TurnBatch`).
        EngineDied: episodes were lost (the first such error, by episode); ``err.lost`` lists every
            such error and ``err.finished`` maps episode index -> record of every episode that had ended.
        Any other error of a turn (the first, by episode) after the other episodes ended.
    """
    n = len(recorders)
    state = [EpisodeState() for _ in range(n)]
    turns: list = [[] for _ in range(n)]
    records: dict = {}
    errors: dict = {}
    limit = max_context if callable(max_context) else (lambda i: max_context)
    clock = time.perf_counter

    def finish(i: int) -> None:
        st = state[i]
        info = st.final_info()
        if extra_info is not None:
            info.update(extra_info(i, turns[i]))
        records[i] = recorders[i].finish(reward=st.reward, info=info, provenance=provenance(i))
        batch.release(i)
        if on_done is not None:
            on_done(i, records[i])

    def submit(i: int, k: int) -> None:
        prompt = recorders[i].prompt_ids
        room = limit(i) - len(prompt)
        if room < 1:
            state[i].end(0.0, None, StopReason.TRUNCATED)
            finish(i)
            return
        images = getattr(recorders[i], 'images', None) or None          # a vision episode's images so far
        request = TurnRequest(prompt, spec, min(max_new_tokens, room), seeds[i], recorders[i].template.stop_ids,
                              images=images)
        if images and not getattr(batch, 'handles_images', False):
            check_request(request, caller, images=False)                 # refused in one line: no pixels there
        batch.submit(i, k, request)

    for i in range(n):
        submit(i, 0)
    while True:
        done = batch.collect()
        if not done:
            break
        for i, k, t in done:
            if isinstance(t, BaseException):
                errors[i] = t
                batch.release(i)
                continue
            rec, st = recorders[i], state[i]
            t0 = clock()
            text = rec.add_turn(t.ids, t.logp)
            t1 = clock()
            st.add_turn(k, len(t.ids), t.truncated)
            turns[i].append(t)
            reply = respond(i, t, text)
            t2 = clock()
            if profile is not None:
                profile.add(k, 'template_s', t1 - t0)
                profile.add(k, 'gym_s', t2 - t1)
            if not st.apply(reply, k, max_turns, episode=i, caller=caller):
                finish(i)
                continue
            rec.add_messages(reply.messages)
            if profile is not None:
                profile.add(k, 'template_s', clock() - t2)
            submit(i, k + 1)
    if errors:
        ordered = [errors[i] for i in sorted(errors)]
        others = [e for e in ordered if not isinstance(e, EngineDied)]
        if others:
            raise others[0]
        err = ordered[0]
        err.lost, err.finished = ordered, dict(sorted(records.items()))
        raise err
    return [records[i] for i in range(n)]
