"""L4: chat episodes sampled by vLLM servers, many at once over async HTTP, recorded like ``--engine hf``.

Each episode is a :class:`~agentrl.templates.ChatRecorder` (same template, bridges and record
layout as :func:`agentrl.engines.hf.run_chat_episodes`); each turn is one ``/v1/completions``
request whose prompt is the recorder's ``prompt_ids``; the answer's ``token_ids`` and log-probs go
into ``add_turn`` verbatim; the decoded text goes to ``respond(i, turn, text) -> Reply``. Every
episode stays on one server (sticky routing: ``seed % len(endpoints)``), and turn ``k`` sends
``seed = turn_seed(episode seed, k)``, so reruns give the same records across restarts.
Source: docs/vllm.md, docs/design.md#hf-engine.
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from dataclasses import dataclass
from typing import Callable

from ...record import Provenance, SamplingSpec
from ...templates.vision import vision_facts
from ..contract import RequestRefused
from ..driver import drive_episodes
from ..episode import SampledTurn
from .client import (Completion, ServerDied, checked_spec, complete, probe_logp_mode, request_body, session,
                     turn_seed)
from .errors import VLLMError
from .server import Endpoint

__all__ = ['VLLMTurn', 'VLLMBatch', 'vllm_rollouts', 'run_vllm_episodes', 'checked_spec',
           'route', 'check_logp_mode']

@dataclass
class VLLMTurn(SampledTurn):
    """A :class:`~agentrl.engines.episode.SampledTurn` sampled by a server, with what the server said.

    Attributes (besides ``ids``, ``logp``, ``truncated``, ``prompt_len``):
        finish_reason: ``'stop'`` or ``'length'``. stop_reason: the stop id, or None.
        url: the server. seed: the request seed. raw: the response body bytes.
    """
    finish_reason: str = ''
    stop_reason: object = None
    url: str = ''
    seed: int | None = None
    raw: bytes = b''


def route(seed: int, n_servers: int) -> int:
    """The server index of an episode: ``seed % n_servers`` (sticky: every turn goes to the same server)."""
    return int(seed) % n_servers


async def _check_modes(http, endpoints, prompt) -> str:
    modes = {}
    for ep in endpoints:
        modes[ep.url] = await probe_logp_mode(http, ep.url, ep.model, prompt)
    if len(set(modes.values())) != 1:
        raise VLLMError(f'vllm servers return different log-prob modes {modes}; fix: start every server with the '
                        'same --logprobs-mode')
    return next(iter(modes.values()))


class VLLMBatch:
    """The vLLM :class:`~agentrl.engines.driver.TurnBatch`: every submitted turn is one request in flight.

    The requests run on an event loop in a thread of their own (one HTTP session, at most
    ``concurrency`` in flight); :meth:`collect` waits for the first to finish. An episode stays on
    ``endpoints[route(seed)]``; turn ``k`` sends ``seed = turn_seed(episode seed, k)``.

    A request with ``images`` goes to ``/inference/v1/generate`` with the images' bytes
    (:func:`~agentrl.engines.vllm.client.complete` with ``vision``; docs/vllm.md#images).

    Args:
        endpoints: the servers. concurrency: requests in flight at once.
        responses: optional list; gets ``(i, turn, body, raw bytes)`` for every answer.
        placeholder_id: the image placeholder id of the episodes' template
            (:func:`~agentrl.templates.vision.vision_facts`); None: a request with images loses its episode
            (RequestRefused naming the fix).
    """
    handles_images = True          # a turn's images go to /inference/v1/generate with its ids (docs/vllm.md#images)

    def __init__(self, endpoints, concurrency: int = 64, responses: list | None = None,
                 placeholder_id: int | None = None):
        self.endpoints, self.responses, self.placeholder_id = list(endpoints), responses, placeholder_id
        self.limit = max(1, int(concurrency))
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True, name='agentrl-vllm-turns')
        self.thread.start()
        self.http = self._wait(self._open())
        self.pending: dict = {}

    async def _open(self):
        self.gate = asyncio.Semaphore(self.limit)
        return await session(limit=self.limit).__aenter__()

    def _wait(self, coro):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result()

    def endpoint(self, seed: int) -> Endpoint:
        """The server of an episode (sticky)."""
        return self.endpoints[route(seed, len(self.endpoints))]

    async def _one(self, url: str, body: dict, images) -> Completion:
        vision = None
        if images:
            if self.placeholder_id is None:
                raise RequestRefused(f'VLLMBatch: a turn brings {len(images)} images and the batch has no '
                                     'placeholder_id; pass VLLMBatch(..., placeholder_id=vision_facts(template)'
                                     '.placeholder_id)')
            vision = (list(images), int(self.placeholder_id))
        async with self.gate:
            try:
                return await complete(self.http, url, body, vision)
            except ValueError as e:
                raise RequestRefused(f'VLLMBatch: {e}') from None

    def submit(self, episode: int, turn: int, request) -> None:
        """Send the turn's request (:func:`~agentrl.engines.vllm.request_body`; with ``request.images`` its
        :func:`~agentrl.engines.vllm.client.generate_body`) now."""
        ep = self.endpoint(request.seed)
        s = turn_seed(request.seed, turn)
        body = request_body(ep.model, request.prompt_ids, request.spec, max_tokens=request.max_new_tokens,
                            stop_ids=request.stop_ids, seed=s)
        fut = asyncio.run_coroutine_threadsafe(self._one(ep.url, body, request.images), self.loop)
        self.pending[fut] = (episode, turn, body, len(request.prompt_ids), request.stop_ids, s)

    def release(self, episode: int) -> None:
        """Nothing held between turns."""

    def collect(self) -> list:
        """Wait for the first answers: ``[(episode, turn, VLLMTurn or the error that lost the episode)]``."""
        if not self.pending:
            return []
        done, _ = concurrent.futures.wait(list(self.pending), return_when=concurrent.futures.FIRST_COMPLETED)
        out = []
        for fut in sorted(done, key=lambda f: self.pending[f][:2]):
            i, k, body, prompt_len, stop_ids, s = self.pending.pop(fut)
            try:
                c = fut.result()
                if self.responses is not None:
                    self.responses.append((i, k, body, c.raw))
                out.append((i, k, _turn(c, prompt_len, stop_ids, s)))
            except Exception as e:  # noqa: BLE001 - the episode's error; the driver keeps the others going
                out.append((i, k, e))
        return out

    def close(self) -> None:
        """Close the HTTP session and stop the loop's thread."""
        for fut in list(self.pending):
            fut.cancel()
        self._wait(self.http.aclose())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=10)
        self.loop.close()


def run_vllm_episodes(endpoints, recorders: list, respond: Callable, *, seeds, spec: SamplingSpec,
                      max_new_tokens: int = 256, max_turns: int = 6, model_name: str = '',
                      concurrency: int = 64, on_done: Callable | None = None, responses: list | None = None,
                      logp_mode: str | None = None) -> list:
    """Drive chat episodes on vLLM servers concurrently: :func:`~agentrl.engines.driver.drive_episodes` on a :class:`VLLMBatch`.

    Args:
        endpoints: :class:`~agentrl.engines.vllm.Endpoint` s (``connect`` or ``VLLMServer.endpoint``).
        recorders: one fresh :class:`~agentrl.templates.ChatRecorder` per episode (stop ids and
            tokenizer from its template).
        respond: ``respond(i, turn, text) -> Reply`` (as :func:`agentrl.engines.hf.run_chat_episodes`;
            ``turn`` is a :class:`VLLMTurn`); calls of one episode come in turn order.
        seeds: one int per episode (``Provenance.seed``; request seeds :func:`~agentrl.engines.vllm.turn_seed`).
        spec: the sampler; sent field by field; the record declares :func:`checked_spec` of it.
        max_new_tokens: turn budget; a turn's ``max_tokens`` is ``min(max_new_tokens, max_model_len - len(prompt))``.
        max_turns: turn limit (then the episode stops ``truncated``, reward 0, as the hf engine).
        model_name: ``Provenance.model`` (default the served model name).
        concurrency: at most this many requests in flight over all servers.
        on_done: ``on_done(i, record)`` as each episode ends (stream it; it is kept if a server dies later).
        responses: optional list; gets ``(i, turn, body, raw bytes)`` for every request (tests, audits).
        logp_mode: skip the probe and declare this mode (only for a mode already checked on these servers).

    Returns:
        One :class:`~agentrl.record.Trajectory` per episode, in order; ``provenance.policy='vllm'``;
        ``info`` as the hf engine's (``actions``, ``truncated_turns``, ``turn_tokens``, ``template``)
        plus ``vllm``: ``{'server', 'turn_seeds', 'finish_reasons', 'logp_mode'}``.

    Raises:
        ValueError: ``seeds`` of another length, ``max_turns < 1``, no endpoint, a reply without
            messages for a running episode.
        ServerDied: a server stopped answering; ``err.finished`` maps episode index -> record of
            every episode that had ended (on any server).
        VLLMError: a refused request (names the server and the message); the probe's errors.
    """
    n = len(recorders)
    if len(seeds) != n:
        raise ValueError(f'run_vllm_episodes: {len(seeds)} seeds for {n} episodes; pass one per episode')
    if max_turns < 1 or not endpoints:
        raise ValueError(f'run_vllm_episodes: need max_turns >= 1 (got {max_turns}) and at least one server')
    seeds = [int(s) for s in seeds]
    if logp_mode is None and recorders:
        logp_mode = check_logp_mode(endpoints, recorders[0].prompt_ids)
    declared = checked_spec(spec, logp_mode or spec.logp_mode)
    facts = vision_facts(recorders[0].template) if recorders else None
    batch = VLLMBatch(endpoints, concurrency, responses, None if facts is None else facts.placeholder_id)
    ep = lambda i: batch.endpoint(seeds[i])  # noqa: E731

    def vllm_info(i, turns) -> dict:
        return {'vllm': {'server': ep(i).url, 'turn_seeds': [t.seed for t in turns],
                         'finish_reasons': [t.finish_reason for t in turns], 'logp_mode': declared.logp_mode}}
    try:
        return drive_episodes(batch, recorders, respond, seeds=seeds, spec=spec,
                              max_turns=max_turns, max_new_tokens=max_new_tokens,
                              max_context=lambda i: ep(i).max_model_len or 1 << 30,
                              provenance=lambda i: Provenance(policy='vllm', sampling=declared,
                                                              model=model_name or ep(i).model, seed=seeds[i]),
                              extra_info=vllm_info, on_done=on_done, caller='run_vllm_episodes')
    except ServerDied as e:
        urls = sorted({x.url for x in e.lost})
        err = ServerDied(', '.join(urls), f'{len(e.lost)} of {n} episodes lost; {e.lost[0].detail}')
        err.finished = e.finished
        raise err from None
    finally:
        batch.close()


def _turn(c: Completion, prompt_len: int, stop_ids, seed) -> VLLMTurn:
    """The server's answer as a turn; refuses one that contradicts its finish_reason."""
    if not c.ids:
        raise VLLMError(f'vllm server {c.url}: a turn of no tokens (finish_reason {c.finish_reason!r}); '
                        'fix: max_tokens >= 1')
    stopped = c.ids[-1] in stop_ids
    if c.finish_reason == 'stop' and not stopped:
        raise VLLMError(f'vllm server {c.url}: finish_reason "stop" but the last id {c.ids[-1]} is no stop id '
                        f'{sorted(stop_ids)}; fix: a server that honours stop_token_ids / ignore_eos')
    if c.finish_reason not in ('stop', 'length'):
        raise VLLMError(f'vllm server {c.url}: finish_reason {c.finish_reason!r}; expected "stop" or "length"')
    return VLLMTurn(ids=c.ids, logp=c.logp, truncated=c.finish_reason == 'length' and not stopped,
                    prompt_len=prompt_len, finish_reason=c.finish_reason, stop_reason=c.stop_reason, url=c.url,
                    seed=seed, raw=c.raw)


def check_logp_mode(endpoints, prompt_ids) -> str:
    """Probe every server once (:func:`~agentrl.engines.vllm.probe_logp_mode`) and return the mode they share.

    The rollout job calls it once at start-up and passes the result as ``logp_mode=`` to every
    chunk, so chunks do not probe again.

    Args:
        endpoints: the servers. prompt_ids: ``[L]`` ids to probe with (e.g. the first episode's opening).

    Returns:
        ``'processed'`` or ``'raw'``.

    Raises:
        VLLMError: a server in a logits mode, servers in different modes, or a server that does not answer.
    """
    async def go():
        async with session(limit=4) as http:
            return await _check_modes(http, endpoints, prompt_ids)
    return asyncio.run(go())


def vllm_rollouts(endpoints, recorders: list, respond: Callable, *, seeds, spec: SamplingSpec | None = None,
                  **kw) -> list:
    """:func:`run_vllm_episodes` with a default spec; same arguments, returns and errors.

    """
    return run_vllm_episodes(endpoints, recorders, respond, seeds=seeds,
                             spec=spec if spec is not None else SamplingSpec(), **kw)
