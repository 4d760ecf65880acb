"""L4: the vLLM backend of the engine contract: one ``/v1/completions`` request on token ids per call.

:class:`VLLMEngine` implements :class:`~agentrl.engines.contract.Engine` over one or more
running vLLM servers (``agentrl serve --server URL[,URL...]``, or the one ``--engine vllm``
starts). Every call is :func:`agentrl.engines.vllm.request_body`: the prompt as token ids, every
sampling field explicit, ``seed`` = the call's seed, ``stop_token_ids`` = the template's stop ids
(``ignore_eos``), ``return_token_ids`` and the sampled token's log-prob. The answer's
``token_ids`` and ``logprobs.token_logprobs`` are the turn as they are (docs/vllm.md#token-api).
A session is sticky: all calls with one ``TurnRequest.key`` go to one server (:meth:`VLLMEngine.route`).

A ``stream: true`` call is the same body streamed (:func:`stream_ids`): ``on_token`` gets the ids
so far after each SSE chunk, and the turn is the unstreamed one bit for bit (docs/gateway.md#streaming).
A call whose ``TurnRequest.images`` is set goes to ``/inference/v1/generate`` with the images' bytes, streamed or
not (:func:`~agentrl.engines.vllm.client.generate_body`; docs/vllm.md#images).

Requests are blocking (:mod:`agentrl.engines.vllm.http`, the package's one HTTP client) so that a caller
runs many of them at once from its own threads (:attr:`VLLMEngine.concurrency`); the log-prob mode is
probed once per server at start (:func:`agentrl.engines.vllm.probe_logp_mode`) and declared on every record.

Source: docs/gateway.md#engines; docs/vllm.md.
"""
from __future__ import annotations

import hashlib

from ...record import SamplingSpec
from ..contract import RequestRefused, TurnRequest, TurnResult, check_request
from ..fingerprint import model_name
from .client import (checked_spec, generate_body, parse_completion, parse_stream, request_body, stream_body,
                     turn_path)
from .errors import ServerDied, VLLMError
from .http import post, stream_lines

__all__ = ['VLLMEngine', 'complete_ids', 'stream_ids']


def _answer(c) -> dict:
    return {'ids': c.ids, 'logp': c.logp, 'finish_reason': c.finish_reason, 'stop_reason': c.stop_reason}


def _sent(body: dict, vision: tuple | None) -> dict:
    """``body``, or its ``/inference/v1/generate`` form for a prompt with images (a mismatch is RequestRefused)."""
    if vision is None:
        return body
    try:
        return generate_body(body, *vision)
    except ValueError as e:
        raise RequestRefused(f'VLLMEngine.sample: {e}') from None


def complete_ids(url: str, body: dict, timeout: float = 600.0, vision: tuple | None = None) -> dict:
    """POST one ``/v1/completions`` body (blocking) and check its answer.

    Args:
        url: the server's base URL (``http://host:port``). body: from
            :func:`~agentrl.engines.vllm.request_body` (``prompt`` a list of ids).
        vision: ``(images, placeholder_id)`` of a prompt with images: the body goes to
            ``/inference/v1/generate`` instead (:func:`~agentrl.engines.vllm.client.generate_body`).

    Returns:
        ``{'ids': [n] int, 'logp': [n] float nats, 'finish_reason', 'stop_reason'}``.

    Raises:
        ServerDied: connection refused/reset or HTTP >= 500 (an engine that died answers 500).
        VLLMError: HTTP 4xx (e.g. a prompt over ``--max-model-len``; the server's message is kept),
            or an answer without ``token_ids`` / one log-prob per token, or whose
            ``prompt_token_ids`` differ from the prompt sent (with images: names the image vLLM expands
            to another count, and both counts).
        RequestRefused: images that do not match the prompt's placeholder runs.
    """
    sent = _sent(body, vision)
    raw = post(url, turn_path(sent), sent, timeout=timeout)
    return _answer(parse_completion(url, raw, body['prompt'], vision))


def stream_ids(url: str, body: dict, on_token, timeout: float = 600.0, vision: tuple | None = None) -> dict:
    """POST ``body`` streamed (:func:`~agentrl.engines.vllm.client.stream_body`), calling ``on_token`` as chunks arrive.

    Blocking: the SSE lines are read from the socket as the server sends them (one chunk per engine
    step), and ``on_token(ids so far)`` (``[k]`` ints) is called after each chunk that added tokens.

    Returns:
        as :func:`complete_ids`: the same ids and log-probs (floats bit for bit) as the unstreamed
        request with the same seed (docs/gateway.md#streaming).

    Raises:
        ServerDied: as :func:`complete_ids`, and a connection lost mid-stream, an error event of code
            >= 500, a body that ends without ``[DONE]`` or a ``finish_reason``.
        VLLMError: HTTP 4xx (the server's message kept); as
            :func:`~agentrl.engines.vllm.client.parse_stream` (a bad chunk, ``[DONE]`` before a finish_reason).
        RequestRefused: as :func:`complete_ids`.
    """
    sent = _sent(stream_body(body), vision)
    with stream_lines(url, turn_path(sent), sent, timeout=timeout) as lines:
        c = parse_stream(url, lines, body['prompt'], on_token, vision)
    return _answer(c)


class VLLMEngine:
    """Running vLLM servers as an engine (``agentrl serve --server URL[,URL...] --model DIR``).

    Args:
        urls: the servers' base URLs (each checked with one real completion: :func:`agentrl.engines.vllm.connect`).
        model_dir: the served model's folder (its tokenizer; the records' ``name@fingerprint`` and
            ``agentrl check --model`` use it).
        max_new_tokens: the default turn budget. concurrency: requests in flight at once, all servers
            together (the gateway's engine threads). timeout: seconds one request may take.

    Attributes:
        tokenizer, model_name, max_context (the smallest ``max_model_len``), max_new_tokens,
        concurrency, policy (``'vllm'``), urls, logp_mode (probed: ``'processed'`` or ``'raw'``).

    Raises:
        ValueError / VLLMError: as :func:`~agentrl.engines.vllm.connect` (no URL, a server not ready);
            VLLMError: servers in different log-prob modes, or in a logits mode.
    """
    policy = 'vllm'
    streams = True

    def __init__(self, urls, model_dir, *, max_new_tokens: int = 256, concurrency: int = 64, timeout: float = 600.0):
        from ...templates.loading import load_tokenizer
        from .server import connect
        self.endpoints = connect(list(urls))
        self.urls = [ep.url for ep in self.endpoints]
        self.tokenizer = load_tokenizer(str(model_dir))
        self.model_name = model_name(model_dir)
        lens = [ep.max_model_len for ep in self.endpoints if ep.max_model_len]
        self.max_context = int(min(lens)) if lens else 1 << 30
        self.max_new_tokens, self.concurrency, self.timeout = int(max_new_tokens), int(concurrency), float(timeout)
        self._placeholder = None
        self.logp_mode = self._probe()

    def _probe(self) -> str:
        import asyncio

        from ...templates import ChatRecorder, ChatTemplate
        from .client import probe_logp_mode, session
        ids = ChatRecorder(ChatTemplate(self.tokenizer), [{'role': 'user', 'content': 'Say hello.'}],
                           history='sampled').prompt_ids

        async def go():
            async with session(limit=4) as http:
                return {ep.url: await probe_logp_mode(http, ep.url, ep.model, ids) for ep in self.endpoints}
        modes = asyncio.run(go())
        if len(set(modes.values())) != 1:
            raise VLLMError(f'vllm servers return different log-prob modes {modes}; fix: start every server with the '
                            'same --logprobs-mode')
        return next(iter(modes.values()))

    def placeholder_id(self) -> int:
        """The served model's image placeholder id (its template's, :func:`~agentrl.templates.vision.vision_facts`).

        Raises:
            RequestRefused: a model folder without an image processor (``preprocessor_config.json``).
        """
        if self._placeholder is None:
            from ...templates import ChatTemplate
            from ...templates.vision import vision_facts
            facts = vision_facts(ChatTemplate(self.tokenizer))
            if facts is None:
                raise RequestRefused('VLLMEngine.sample: the request brings images and the model folder has no '
                                     'image processor (preprocessor_config.json); serve a vision-language model')
            self._placeholder = facts.placeholder_id
        return self._placeholder

    def route(self, session: str) -> str:
        """The server of a session (sticky): ``urls[sha256(session) % len(urls)]``, the same after a restart."""
        h = int(hashlib.sha256(str(session).encode()).hexdigest()[:15], 16)
        return self.urls[h % len(self.urls)]

    def record_spec(self, spec: SamplingSpec) -> SamplingSpec:
        """``spec`` as the records declare it (:func:`~agentrl.engines.vllm.client.checked_spec` with the probed
        log-prob mode)."""
        return checked_spec(spec, self.logp_mode)

    def body(self, prompt_ids, spec: SamplingSpec, max_new_tokens: int, seed: int, stop_ids, server: str) -> dict:
        """The ``/v1/completions`` body of one call (:func:`~agentrl.engines.vllm.request_body`)."""
        model = next(ep.model for ep in self.endpoints if ep.url == server)
        return request_body(model, prompt_ids, spec, max_tokens=max_new_tokens, stop_ids=stop_ids, seed=seed)

    def sample(self, request: TurnRequest) -> TurnResult:
        """One turn from the server of ``request.key`` (:meth:`route`; the first without a key); thread-safe.

        With ``request.on_token`` the request is streamed (:func:`stream_ids`) and it is called with
        the turn's ids so far (``[k]`` ints) as each chunk arrives; the result is the same. With
        ``request.images`` it goes to ``/inference/v1/generate`` with the images (:meth:`placeholder_id`).

        Raises:
            ServerDied (an EngineDied), VLLMError: as :func:`complete_ids` / :func:`stream_ids`; VLLMError
                also for an empty turn or ``finish_reason`` ``stop`` without a stop id last.
            RequestRefused / BudgetExceeded: an empty prompt, a budget below 1; images that do not match the
                prompt's placeholder runs, or images to a text-only model.
        """
        check_request(request, 'VLLMEngine.sample', images=True)
        url = self.urls[0] if request.key is None else self.route(request.key)
        stop_ids, seed, on_token = request.stop_ids, request.seed, request.on_token
        body = self.body(request.prompt_ids, request.spec, request.max_new_tokens, seed, stop_ids, url)
        vision = (list(request.images), self.placeholder_id()) if request.images else None
        c = complete_ids(url, body, self.timeout, vision) if on_token is None else \
            stream_ids(url, body, on_token, self.timeout, vision)
        ids = c['ids']
        if not ids:
            raise VLLMError(f'vllm server {url}: a turn of no tokens (finish_reason {c["finish_reason"]!r})')
        stopped = ids[-1] in stop_ids
        if c['finish_reason'] not in ('stop', 'length') or (c['finish_reason'] == 'stop' and not stopped):
            raise VLLMError(f'vllm server {url}: finish_reason {c["finish_reason"]!r} with last id {ids[-1]} '
                            f'(stop ids {sorted(stop_ids)}); fix: a server that honours stop_token_ids / ignore_eos')
        return TurnResult(ids=ids, logp=c['logp'], truncated=not stopped, seed=int(seed), server=url)

    def close(self) -> None:
        """Nothing to release (every request opens its own connection)."""
