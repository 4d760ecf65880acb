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
import os
from dataclasses import dataclass
from typing import Callable

from ...gym import TOOL_SCHEMAS
from ...record import Provenance, SamplingSpec
from ...templates import ChatRecorder, ChatTemplate, load_tokenizer
from ..bugfix import BugFixAdapter
from ..episode import Reply, SampledTurn
from .engine import record_spec as checked_spec
from .client import Completion, ServerDied, complete, probe_logp_mode, request_body, session, turn_seed
from .server import Endpoint, VLLMError

__all__ = ['VLLMTurn', 'vllm_rollouts', 'run_vllm_episodes', 'bugfix_vllm_rollouts', 'bugfix_template', 'checked_spec',
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


async def run_vllm_episodes(endpoints, recorders: list, respond: Callable, *, seeds, spec: SamplingSpec,
                            max_new_tokens: int = 256, max_turns: int = 6, model_name: str = '',
                            concurrency: int = 64, on_done: Callable | None = None, responses: list | None = None,
                            logp_mode: str | None = None) -> list:
    """Drive chat episodes on vLLM servers concurrently (async): the coroutine behind :func:`vllm_rollouts`.

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
    gate = asyncio.Semaphore(max(1, int(concurrency)))
    finished: dict = {}
    async with session(limit=max(1, int(concurrency))) as http:
        if logp_mode is None and recorders:
            logp_mode = await _check_modes(http, endpoints, recorders[0].prompt_ids)
        declared = checked_spec(spec, logp_mode or spec.logp_mode)

        async def episode(i: int):
            ep = endpoints[route(seeds[i], len(endpoints))]
            rec = await _episode(http, gate, ep, recorders[i], lambda t, x: respond(i, t, x), seeds[i], spec,
                                 max_new_tokens, max_turns, declared, model_name or ep.model, responses, i)
            finished[i] = rec
            if on_done is not None:
                on_done(i, rec)
            return rec

        out = await asyncio.gather(*[episode(i) for i in range(n)], return_exceptions=True)
    errors = [e for e in out if isinstance(e, BaseException)]
    died = [e for e in errors if isinstance(e, ServerDied)]
    others = [e for e in errors if not isinstance(e, ServerDied)]
    if others:
        raise others[0]
    if died:
        urls = sorted({e.url for e in died})
        err = ServerDied(', '.join(urls), f'{len(died)} of {n} episodes lost; {died[0].detail}')
        err.finished = dict(sorted(finished.items()))
        raise err
    return out


async def _episode(http, gate, ep: Endpoint, rec: ChatRecorder, respond, seed, spec, max_new_tokens, max_turns,
                   declared, model_name, responses, i):
    """One episode on one server: turns until ``Reply.done``, ``max_turns`` or no room; its record."""
    stop_ids = rec.template.stop_ids
    limit = ep.max_model_len or 1 << 30
    st = {'actions': [], 'truncated_turns': [], 'turn_tokens': [], 'reward': 0.0, 'info': None}
    vinfo = {'server': ep.url, 'turn_seeds': [], 'finish_reasons': [], 'logp_mode': declared.logp_mode}
    for k in range(max_turns):
        prompt = rec.prompt_ids
        room = limit - len(prompt)
        if room < 1:
            st['info'] = dict(st['info'] or {}, stop='truncated')
            break
        s = turn_seed(seed, k)
        body = request_body(ep.model, prompt, spec, max_tokens=min(max_new_tokens, room), stop_ids=stop_ids, seed=s)
        async with gate:
            c: Completion = await complete(http, ep.url, body)
        if responses is not None:
            responses.append((i, k, body, c.raw))
        turn = _turn(c, len(prompt), stop_ids, s)
        text = rec.add_turn(turn.ids, turn.logp)
        vinfo['turn_seeds'].append(s)
        vinfo['finish_reasons'].append(c.finish_reason)
        st['turn_tokens'].append(len(turn.ids))
        if turn.truncated:
            st['truncated_turns'].append(k)
        reply: Reply = respond(turn, text)
        st['actions'].append(reply.action)
        if reply.done:
            st.update(reward=float(reply.reward), info=dict(reply.info or {}))
            break
        if k + 1 >= max_turns:
            st['info'] = dict(reply.info or {}, stop='truncated')
            break
        if not reply.messages:
            raise ValueError(f'run_vllm_episodes: respond returned no messages for running episode {i} (turn {k}); '
                             'answer each turn with a tool or user message, or done=True')
        rec.add_messages(reply.messages)
    prov = Provenance(policy='vllm', sampling=declared, model=model_name, seed=seed)
    info = dict(st['info'] or {}, actions=st['actions'], truncated_turns=st['truncated_turns'],
                turn_tokens=st['turn_tokens'], vllm=vinfo)
    return rec.finish(reward=st['reward'], info=info, provenance=prov)


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
    """Blocking :func:`run_vllm_episodes` (one ``asyncio.run``); same arguments, returns and errors.

    Raises:
        RuntimeError: called from a running event loop (await :func:`run_vllm_episodes` there).
    """
    return asyncio.run(run_vllm_episodes(endpoints, recorders, respond, seeds=seeds,
                                         spec=spec if spec is not None else SamplingSpec(), **kw))


def bugfix_vllm_rollouts(endpoints, template: ChatTemplate, tasks, *, seeds, spec: SamplingSpec | None = None,
                         max_new_tokens: int = 256, max_turns: int = 6, reward_tests: str = 'hidden',
                         model_name: str = '', **kw) -> list:
    """BugFix episodes on vLLM servers: the gym wiring of :func:`agentrl.engines.hf.bugfix_rollouts`, one function.

    Args:
        endpoints: the servers. template: a :class:`~agentrl.templates.ChatTemplate` with the
            gym's ``TOOL_SCHEMAS`` as tools (as the hf engine's runner builds it).
        tasks: one task per episode. seeds: one episode seed per task (``job.seed``).
        spec, max_new_tokens, max_turns, model_name, ``**kw``: as :func:`run_vllm_episodes`.
        reward_tests: ``'hidden'`` or ``'public'``.

    Returns:
        The records, with ``info['tool_calls']`` as the hf engine's.

    Raises:
        As :func:`run_vllm_episodes`; ValueError for ``seeds`` of another length than ``tasks``.
    """
    if len(seeds) != len(tasks):
        raise ValueError(f'bugfix_vllm_rollouts: {len(seeds)} seeds for {len(tasks)} tasks; pass one per task')
    adapter = BugFixAdapter(tasks, max_turns=max_turns, reward_tests=reward_tests)
    recorders = [ChatRecorder(template, messages) for messages in adapter.openings()]
    on_done = kw.pop('on_done', None)

    def done(i, rec):                      # finished as the others before it is streamed (or kept by ServerDied)
        adapter.finish_one(i, rec)
        if on_done is not None:
            on_done(i, rec)

    return vllm_rollouts(endpoints, recorders, adapter.respond, seeds=seeds, spec=spec, max_new_tokens=max_new_tokens,
                         max_turns=max_turns, model_name=model_name, on_done=done, **kw)


def bugfix_template(tokenizer, **options) -> ChatTemplate:
    """The BugFix chat template: a tokenizer (or its folder, e.g. the served model's) with the gym's ``TOOL_SCHEMAS``.

    The same template ``--engine hf`` builds (its fingerprint goes into the records).

    Raises:
        ImportError: without the ``hf`` extra. OSError: a folder without tokenizer files.
    """
    if isinstance(tokenizer, (str, os.PathLike)):
        tokenizer = load_tokenizer(str(tokenizer))
    return ChatTemplate(tokenizer, tools=TOOL_SCHEMAS, **options)
