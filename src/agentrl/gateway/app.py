"""L5: the gateway's HTTP routes (Starlette): sessions, chat completions (JSON or SSE), finish.

Routes:

* ``POST /sessions`` (optional JSON ``{"group_id", "rollout_id", "task"}``) -> 201
  ``{"token", "base_url", "session"}``; hand ``base_url`` and any API key to the harness.
* ``POST /s/{token}/v1/chat/completions``: the OpenAI chat-completions call (JSON, or SSE with
  ``stream: true``); ``GET /s/{token}/v1/models`` lists the served model.
* ``GET /sessions/{token}``: the session's state. ``POST /sessions/{token}/finish`` with
  ``{"reward": R, "info": {...}}`` commits its records.
* ``GET /health``.

Every error is OpenAI-style JSON (``{"error": {"message", "type", "param", "code"}}``). State
changes run in the gateway's worker thread; the event loop only parses, awaits and sends.

Source: docs/gateway.md#endpoints; the OpenAI chat-completions API (chunks, ``[DONE]``).
"""
from __future__ import annotations

import asyncio
import json
import math

from .parse import message_deltas
from .protocol import GatewayError, body_digest, error_body, parse_request

__all__ = ['create_app']


def _json(obj, status: int = 200):
    from starlette.responses import Response
    return Response(json.dumps(obj, ensure_ascii=False), status_code=status, media_type='application/json')


def _error(e: GatewayError):
    return _json(e.body(), e.status)


class _Tracked:
    """An ASGI response that reports whether every byte was handed to a connection still open."""

    def __init__(self, chunks, media_type: str, on_done, interval: float = 0.0):
        self.chunks, self.media_type, self.on_done, self.interval = chunks, media_type, on_done, interval

    async def __call__(self, scope, receive, send):
        gone = asyncio.Event()

        async def listen():
            while True:
                m = await receive()
                if m['type'] == 'http.disconnect':
                    gone.set()
                    return

        task = asyncio.ensure_future(listen())
        ok = False
        try:
            await asyncio.sleep(0)
            if not gone.is_set():
                await send({'type': 'http.response.start', 'status': 200,
                            'headers': [(b'content-type', self.media_type.encode()), (b'cache-control', b'no-cache')]})
                for c in self.chunks:
                    if gone.is_set():
                        break
                    await send({'type': 'http.response.body', 'body': c, 'more_body': True})
                    await asyncio.sleep(self.interval)
                else:
                    await send({'type': 'http.response.body', 'body': b'', 'more_body': False})
                    ok = not gone.is_set()
        finally:
            task.cancel()
            await self.on_done(ok)


def _sse(response: dict, include_usage: bool) -> list:
    """The SSE events of a completed response: deltas of its message, a finish chunk, usage, ``[DONE]``."""
    choice = response['choices'][0]
    base = {'id': response['id'], 'object': 'chat.completion.chunk', 'created': response['created'],
            'model': response['model']}
    out = []
    for d in message_deltas(choice['message']):
        out.append(dict(base, choices=[{'index': 0, 'delta': d, 'logprobs': None, 'finish_reason': None}]))
    last = {'index': 0, 'delta': {}, 'logprobs': choice['logprobs'], 'finish_reason': choice['finish_reason']}
    if 'token_ids' in choice:
        last['token_ids'] = choice['token_ids']
    out.append(dict(base, choices=[last], **({'prompt_token_ids': response['prompt_token_ids']}
                                             if 'prompt_token_ids' in response else {})))
    if include_usage:
        out.append(dict(base, choices=[], usage=response['usage']))
    return [f'data: {json.dumps(c, ensure_ascii=False)}\n\n'.encode() for c in out] + [b'data: [DONE]\n\n']


def create_app(gateway, *, public_url: str = '', stream_interval: float = 0.0):
    """The Starlette app serving ``gateway`` (:class:`~agentrl.gateway.service.Gateway`).

    Args:
        gateway: the state and worker.
        public_url: ``http://host:port`` the session base URLs start with (default: the request's).
        stream_interval: seconds between SSE chunks (0: as fast as the connection takes them).

    Returns:
        A ``starlette.applications.Starlette``; its lifespan reaps idle sessions every few seconds.
    """
    from starlette.applications import Starlette
    from starlette.routing import Route

    async def work(fn, *args):
        return await asyncio.get_running_loop().run_in_executor(gateway.pool, fn, *args)

    async def body_of(request, limit: int) -> bytes:
        size = request.headers.get('content-length')
        if size is not None and size.isdigit() and int(size) > limit:
            raise GatewayError(413, f'request body is {size} bytes, over the limit of {limit}; send a shorter '
                                    'history', code='body_too_large')
        raw = b''
        async for chunk in request.stream():
            raw += chunk
            if len(raw) > limit:
                raise GatewayError(413, f'request body is over the limit of {limit} bytes; send a shorter history',
                                   code='body_too_large')
        return raw

    def base(request) -> str:
        return public_url or f'{request.url.scheme}://{request.url.netloc}'

    async def new_session(request):
        try:
            raw = await body_of(request, 1 << 16)
            try:
                ident = json.loads(raw) if raw.strip() else {}
            except ValueError as e:
                raise GatewayError(400, f'request body is not valid JSON ({e}); send a JSON object') from None
            token, s = await work(gateway.open_session, ident)
        except GatewayError as e:
            return _error(e)
        return _json({'token': token, 'base_url': f'{base(request)}/s/{token}/v1', 'session': s.sid}, 201)

    async def get_session(request):
        try:
            return _json(gateway.session(request.path_params['token']).describe())
        except GatewayError as e:
            return _error(e)

    async def finish(request):
        try:
            s = gateway.session(request.path_params['token'])
            raw = await body_of(request, 1 << 20)
            try:
                body = json.loads(raw) if raw.strip() else {}
            except ValueError as e:
                raise GatewayError(400, f'request body is not valid JSON ({e}); send {{"reward": R, "info": {{}}}}') \
                    from None
            reward, info = (body.get('reward', 0.0), body.get('info', {})) if isinstance(body, dict) else (None, None)
            if isinstance(reward, bool) or not isinstance(reward, (int, float)) or not math.isfinite(reward):
                raise GatewayError(400, f'reward must be a finite number, got {reward!r}', param='reward')
            if not isinstance(info, dict):
                raise GatewayError(400, f'info must be a JSON object, got {type(info).__name__}', param='info')
            return _json(await work(gateway.finish, s, float(reward), info))
        except GatewayError as e:
            return _error(e)

    async def models(request):
        try:
            gateway.session(request.path_params['token'])
        except GatewayError as e:
            return _error(e)
        return _json({'object': 'list', 'data': [{'id': gateway.upstream.model_name, 'object': 'model',
                                                  'owned_by': 'agentrl'}]})

    async def chat(request):
        try:
            s = gateway.session(request.path_params['token'])
        except GatewayError as e:
            return _error(e)
        lim = gateway.limits
        if lim.max_concurrent and s.in_flight >= lim.max_concurrent:
            return _error(GatewayError(429, f'the session already has {s.in_flight} requests in flight (limit '
                                            f'{lim.max_concurrent}); wait for them', type='rate_limit_error',
                                       code='max_concurrent'))
        s.in_flight += 1
        try:
            raw = await body_of(request, lim.max_body_bytes)
            req, _ = parse_request(raw, lim.max_body_bytes)
            retry = request.headers.get('x-stainless-retry-count', '0')
            retry = int(retry) if retry.isdigit() else 0
            response, index, replayed = await work(gateway.chat, s, req, body_digest(raw), retry)
        except GatewayError as e:
            s.in_flight -= 1
            return _error(e)
        except Exception:
            s.in_flight -= 1
            raise

        async def done(ok: bool):
            s.in_flight -= 1
            if not ok and not replayed:
                await work(gateway.undelivered, s, index)

        if req.stream:
            return _Tracked(_sse(response, req.include_usage), 'text/event-stream', done, stream_interval)
        return _Tracked([json.dumps(response, ensure_ascii=False).encode()], 'application/json', done)

    async def health(request):
        return _json({'ok': True, 'sessions': len(gateway.sessions)})

    async def not_found(request, exc):
        code = getattr(exc, 'status_code', 404)
        return _json(error_body(f'{request.method} {request.url.path}: no such route (see docs/gateway.md)',
                                'not_found_error'), code)

    async def internal(request, exc):
        return _json(error_body(f'internal error: {type(exc).__name__}: {exc}', 'server_error'), 500)

    async def reaper():
        while True:
            await asyncio.sleep(max(0.2, min(5.0, gateway.session_timeout / 4)))
            await work(gateway.reap)

    from contextlib import asynccontextmanager

    @asynccontextmanager
    async def lifespan(app):
        task = asyncio.ensure_future(reaper())
        try:
            yield
        finally:
            task.cancel()

    routes = [Route('/sessions', new_session, methods=['POST']),
              Route('/sessions/{token}', get_session, methods=['GET']),
              Route('/sessions/{token}/finish', finish, methods=['POST']),
              Route('/s/{token}/v1/chat/completions', chat, methods=['POST']),
              Route('/s/{token}/v1/models', models, methods=['GET']),
              Route('/health', health, methods=['GET'])]
    return Starlette(routes=routes, lifespan=lifespan,
                     exception_handlers={404: not_found, 405: not_found, Exception: internal})
