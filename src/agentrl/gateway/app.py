"""L5: the gateway's HTTP routes (Starlette): sessions, chat completions (JSON or SSE), finish.

Routes:

* ``POST /sessions`` (optional JSON ``{"group_id", "rollout_id", "task"}``) -> 201
  ``{"token", "base_url", "session"}``; hand ``base_url`` and any API key to the harness.
* ``POST /s/{token}/v1/chat/completions``: the OpenAI chat-completions call (JSON, or SSE with
  ``stream: true``); ``GET /s/{token}/v1/models`` lists the served model.
* ``POST /s/{token}/v1/messages`` and ``.../messages/count_tokens``: the Anthropic Messages dialect
  (:mod:`agentrl.gateway.anthropic`); ``POST /s/{token}/v1/responses``: the OpenAI Responses dialect
  (:mod:`agentrl.gateway.responses`); each dialect of :data:`DIALECTS` at its own paths.
* ``GET /sessions/{token}``: the session's state. ``POST /sessions/{token}/finish`` with
  ``{"reward": R, "info": {...}}`` commits its records.
* ``GET /health``.
* ``POST /admin/pause`` (returns once every dispatched call is done; new calls are held, then 429 +
  ``Retry-After``), ``POST /admin/resume``, ``POST /admin/policy`` ``{"version"}`` (stamped on
  every call dispatched after it), ``GET /admin/state``: with ``Authorization: Bearer ADMIN_TOKEN``
  (``RUN/serve.json``).

Every error is OpenAI-style JSON (``{"error": {"message", "type", "param", "code"}}``). State
changes are serial: the short ones (planning and completing a call, opening a session) run on the
event loop itself while the state thread is idle, and behind it otherwise; the long ones (finishing
a session, reaping idle ones: they store records) run on the state thread, and so does planning a call
whose body is over :data:`INLINE_BYTES` (its render). A request body is parsed and validated in a
worker thread (it changes no state), so a long one holds no other client. Engine calls run in the
engine threads. One call of a session is served at a time (a per-session lock); calls of different
sessions sample concurrently.

Source: docs/gateway.md#endpoints; the OpenAI chat-completions API (chunks, ``[DONE]``).
"""
from __future__ import annotations

import asyncio
import json
import logging
import math
import time

from .anthropic import ANTHROPIC
from .inputs import flag_problem
from .parse import message_deltas
from .protocol import GatewayError, body_digest, error_body, load_body, parse_request
from .responses import RESPONSES
from .stream import ReplyStream

__all__ = ['create_app', 'DIALECTS', 'unserved', 'mask_token', 'INLINE_BYTES']

#: The dialects served besides chat completions (:class:`~agentrl.gateway.dialects.Dialect` instances).
DIALECTS: tuple = (ANTHROPIC, RESPONSES)

#: Bodies up to this size are planned on the event loop (no thread hand-off); a larger one's plan (its
#: render) runs on the state thread, so a long history never holds the loop (docs/design.md#bounds).
INLINE_BYTES = 1 << 16

_LOG = logging.getLogger('agentrl.gateway')

#: The API dialect of a session route's tail (after ``/s/TOKEN/v1/``), named in the 404 of one not served.
_API_NAMES = {'chat/completions': 'OpenAI chat completions', 'completions': 'OpenAI completions (legacy)',
              'embeddings': 'OpenAI embeddings', 'responses': 'OpenAI Responses', 'messages': 'Anthropic messages',
              'models': 'OpenAI models', 'moderations': 'OpenAI moderations', 'audio': 'OpenAI audio',
              'images': 'OpenAI images', 'files': 'OpenAI files', 'batches': 'OpenAI batches'}


def mask_token(text: str, path: str) -> str:
    """``text`` with the capability token of a session ``path`` (``/s/TOKEN/...``, ``/sessions/TOKEN...``)
    replaced by ``TOKEN``: an error message never echoes a session's token."""
    parts = path.split('/')
    if len(parts) > 2 and parts[1] in ('s', 'sessions') and parts[2]:
        masked = '/'.join(parts[:2] + ['TOKEN'] + parts[3:])
        text = text.replace(path, masked)
        if len(parts[2]) >= 8:                # a shorter one is no session's token (and would mask other words)
            text = text.replace(parts[2], 'TOKEN')
    return text


def unserved(method: str, path: str, routes) -> str:
    """The 404 / 405 message of a request no route serves: for a session route ``/s/TOKEN/v1/...``, the API
    dialect it belongs to and the session routes that are served; the token is masked (:func:`mask_token`).

    Args:
        method: the HTTP method. path: the request path. routes: the app's routes (``path``, ``methods``).

    Returns:
        One line, e.g. ``POST /s/TOKEN/v1/embeddings: the OpenAI embeddings API is not served by this
        gateway; it serves POST /s/TOKEN/v1/chat/completions, GET /s/TOKEN/v1/models (see docs/gateway.md)``.
    """
    parts = path.split('/')
    shown = mask_token(f'{method} {path}', path)
    if len(parts) < 4 or parts[1] != 's' or parts[3] != 'v1':
        return f'{shown}: no such route (see docs/gateway.md)'
    tail = '/'.join(parts[4:]).strip('/')
    served = [f'{m} {r.path.replace("{token}", "TOKEN")}' for r in routes
              if getattr(r, 'path', '').startswith('/s/{token}/v1/') and '/v1/v1/' not in r.path   # not the aliases
              for m in sorted(set(getattr(r, 'methods', None) or ()) - {'HEAD'})]
    known = next((_API_NAMES[k] for k in sorted(_API_NAMES, key=len, reverse=True)
                  if tail == k or tail.startswith(k + '/')), None)
    what = f'the {known} API' if known else f'the route v1/{tail}' if tail else 'the bare v1 route'
    how = 'is not served by this gateway' if not any(s.endswith(f'/v1/{tail}') for s in served) \
        else f'is not served with {method}'
    return f'{shown}: {what} {how}; it serves {", ".join(served)} (see docs/gateway.md)'


def _json(obj, status: int = 200):
    from starlette.responses import Response
    return Response(json.dumps(obj, ensure_ascii=False), status_code=status, media_type='application/json')


def _error(e: GatewayError, headers: dict | None = None, dialect=None):
    r = _json(e.body() if dialect is None else dialect.error(e), e.status)
    r.headers.update(headers or {})
    return r


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
        chunks = self.chunks if hasattr(self.chunks, '__aiter__') else _aiter(self.chunks)
        try:
            await asyncio.sleep(0)
            headers = [(b'content-type', self.media_type.encode()), (b'cache-control', b'no-cache')]
            if gone.is_set():
                pass
            elif self.media_type == 'application/json':         # one JSON body, sized: no chunked framing
                body = b''.join(self.chunks)
                await send({'type': 'http.response.start', 'status': 200,
                            'headers': headers + [(b'content-length', str(len(body)).encode())]})
                await send({'type': 'http.response.body', 'body': body, 'more_body': False})
                ok = not gone.is_set()
            else:
                await send({'type': 'http.response.start', 'status': 200, 'headers': headers})
                async for c in chunks:
                    if gone.is_set():
                        break
                    await send({'type': 'http.response.body', 'body': c, 'more_body': True})
                    await asyncio.sleep(self.interval)
                else:
                    await send({'type': 'http.response.body', 'body': b'', 'more_body': False})
                    ok = not gone.is_set()
        finally:
            task.cancel()
            if hasattr(chunks, 'aclose'):
                await chunks.aclose()
            await self.on_done(ok)


async def _aiter(items):
    for x in items:
        yield x


def _event(obj) -> bytes:
    return f'data: {json.dumps(obj, ensure_ascii=False)}\n\n'.encode()


def _tail(base: dict, response: dict, include_usage: bool) -> list:
    """The finish chunk (``finish_reason``, ``logprobs``, ``token_ids``), the usage chunk and ``[DONE]``."""
    choice = response['choices'][0]
    last = {'index': 0, 'delta': {}, 'logprobs': choice['logprobs'], 'finish_reason': choice['finish_reason']}
    if 'token_ids' in choice:
        last['token_ids'] = choice['token_ids']
    out = [dict(base, choices=[last], **({'prompt_token_ids': response['prompt_token_ids']}
                                         if 'prompt_token_ids' in response else {}))]
    if include_usage:
        out.append(dict(base, choices=[], usage=response['usage']))
    return [_event(c) for c in out] + [b'data: [DONE]\n\n']


def _delta_events(base: dict, deltas: list) -> list:
    return [_event(dict(base, choices=[{'index': 0, 'delta': d, 'logprobs': None, 'finish_reason': None}]))
            for d in deltas]


def _sse(response: dict, include_usage: bool) -> list:
    """The SSE events of a completed response: deltas of its message, a finish chunk, usage, ``[DONE]``."""
    base = {'id': response['id'], 'object': 'chat.completion.chunk', 'created': response['created'],
            'model': response['model']}
    return _delta_events(base, message_deltas(response['choices'][0]['message'])) + \
        _tail(base, response, include_usage)


class _Routes:
    """The route handlers over one gateway (see the module docstring for the routes)."""

    def __init__(self, gateway, public_url: str, stream_interval: float, admin_token: str | None,
                 pause_wait: float):
        self.gw, self.public_url, self.stream_interval = gateway, public_url, stream_interval
        self.admin_token, self.pause_wait = admin_token, pause_wait
        self.running = None                      # asyncio.Event: set while not paused (made in the loop)
        self.idle = None                         # asyncio.Event: set while no call is dispatched
        self.dispatched = 0
        self.locks: dict = {}                    # session id -> asyncio.Lock (one call of a session at a time)
        self.queued = 0                          # state-thread jobs submitted and not yet resumed (loop's count)

    async def work(self, fn, *args, inline: bool = True):
        """Run a change of state, serially with every other: on this loop when ``inline`` and the state thread
        has nothing queued or running (no thread hand-off: a call's planning and completion cost no
        wake-ups, bench/RESULTS.md), else on the state thread, in order behind what it holds."""
        if inline and self.queued == 0:
            return fn(*args)
        self.queued += 1
        try:
            return await asyncio.get_running_loop().run_in_executor(self.gw.pool, fn, *args)
        finally:
            self.queued -= 1

    async def serve_call(self, s, req, digest: str, retry: int, hook=None, inline: bool = True) -> tuple:
        """Prepare (state), sample (engine thread), complete (state): ``(response, index, replayed)``.

        ``hook(pending) -> on_token``: called once the call is planned to sample; its ``on_token``
        goes to the engine (streaming). ``inline``: the plan may run on the loop (a small body).
        """
        async with self.locks.setdefault(s.sid, asyncio.Lock()):
            await self.wait_running()            # no await between this check and the dispatch count below
            self.dispatched += 1
            self.idle.clear()
            try:
                p = await self.work(self.gw.prepare, s, req, digest, retry, inline=inline)
                if p.replay is not None:
                    return p.replay
                try:
                    on_token = hook(p) if hook is not None else None
                    sample = await asyncio.get_running_loop().run_in_executor(self.gw.engine_pool, self.gw.sample, p,
                                                                              on_token)
                except BaseException:
                    await self.work(self.gw.drop, p)
                    raise
                return await self.work(self.gw.complete, p, sample)
            finally:
                self.dispatched -= 1
                if self.dispatched == 0:
                    self.idle.set()

    async def delivery(self, s, index: int, ok: bool, replayed: bool) -> None:
        """Journal how a call's response went: ``delivered`` once every byte was handed to the connection
        (a replay too: it may deliver a call whose first response was lost), else ``undelivered``."""
        if ok:
            await self.work(self.gw.delivered, s, index)
        elif not replayed:
            await self.work(self.gw.undelivered, s, index)

    @staticmethod
    async def body_of(request, limit: int) -> bytes:
        size = request.headers.get('content-length')
        if size is not None and size.isascii() and size.isdigit() and int(size) > limit:
            raise GatewayError(413, f'request body is {size} bytes, over the limit of {limit}; send a shorter '
                                    'history', code='body_too_large')
        raw = b''
        async for chunk in request.stream():
            raw += chunk
            if len(raw) > limit:
                raise GatewayError(413, f'request body is over the limit of {limit} bytes; send a shorter history',
                                   code='body_too_large')
        return raw

    @staticmethod
    def json_body(raw: bytes, hint: str):
        return load_body(raw, hint)

    async def new_session(self, request):
        try:
            ident = self.json_body(await self.body_of(request, 1 << 16), 'a JSON object')
            token, s = await self.work(self.gw.open_session, ident)
        except GatewayError as e:
            return _error(e)
        base = self.public_url or f'{request.url.scheme}://{request.url.netloc}'
        return _json({'token': token, 'base_url': f'{base}/s/{token}/v1', 'session': s.sid}, 201)

    async def get_session(self, request):
        try:
            return _json(self.gw.describe(request.path_params['token']))
        except GatewayError as e:
            return _error(e)

    async def finish(self, request):
        try:
            s = self.gw.session(request.path_params['token'])
            body = self.json_body(await self.body_of(request, 1 << 20), '{"reward": R, "info": {}}')
            reward, info = (body.get('reward', 0.0), body.get('info', {})) if isinstance(body, dict) else (None, None)
            if not _finite(reward):
                raise GatewayError(400, f'reward must be a finite number, got {json.dumps(reward)[:60]}',
                                   param='reward')
            if not isinstance(info, dict):
                raise GatewayError(400, f'info must be a JSON object, got {type(info).__name__}', param='info')
            return _json(await self.work(self.gw.finish, s, float(reward), info, inline=False))
        except GatewayError as e:
            return _error(e)

    async def models(self, request):
        try:
            self.gw.session(request.path_params['token'])
        except GatewayError as e:
            return _error(e)
        return _json({'object': 'list', 'data': [{'id': self.gw.upstream.model_name, 'object': 'model',
                                                  'owned_by': 'agentrl'}]})

    async def wait_running(self) -> None:
        """Hold a call while the gateway is paused, up to ``pause_wait`` s; then 429 with Retry-After."""
        if self.running.is_set():
            return
        try:
            await asyncio.wait_for(self.running.wait(), self.pause_wait)
        except asyncio.TimeoutError:
            raise GatewayError(429, f'the gateway is paused (a weight sync); retry in a moment (held '
                                    f'{self.pause_wait:g} s)', type='rate_limit_error', code='paused') from None

    async def chat(self, request):
        try:
            s = self.gw.session(request.path_params['token'])
        except GatewayError as e:
            return _error(e)
        lim = self.gw.limits
        if lim.max_concurrent and s.in_flight >= lim.max_concurrent:
            return _error(GatewayError(429, f'the session already has {s.in_flight} requests in flight (limit '
                                            f'{lim.max_concurrent}); wait for them', type='rate_limit_error',
                                       code='max_concurrent'))
        s.in_flight += 1
        try:
            raw = await self.body_of(request, lim.max_body_bytes)
            # parsed and validated in a worker thread: a long body holds no other client (checked is only read)
            req, body = await asyncio.to_thread(parse_request, raw, lim.max_body_bytes, s.checked)
            if isinstance(body.get('messages'), list):
                s.checked = (body['messages'], req.messages)      # the next call checks only its new messages
            args = (s, req, body_digest(raw, body), _retry_count(request.headers.get('x-stainless-retry-count')))
            if req.stream:
                return await self.stream(*args, inline=len(raw) <= INLINE_BYTES)
            response, index, replayed = await self.serve_call(*args, inline=len(raw) <= INLINE_BYTES)
        except GatewayError as e:
            s.in_flight -= 1
            return _error(e, {'Retry-After': '1'} if e.code == 'paused' else None)
        except BaseException:
            s.in_flight -= 1
            raise

        async def done(ok: bool):
            s.in_flight -= 1
            await self.delivery(s, index, ok, replayed)
        return _Tracked([json.dumps(response, ensure_ascii=False).encode()], 'application/json', done)

    async def stream(self, s, req, digest: str, retry: int, inline: bool = True):
        """A ``stream: true`` call: SSE deltas as the engine samples (an engine that ``streams``), the finish chunk
        once the call is journalled; a call refused before its first token is an error JSON, a replay the whole
        message at once."""
        loop, queue, hold = asyncio.get_running_loop(), asyncio.Queue(), {}

        def hook(p):
            family = self.gw.family.for_tools(req.tools)      # values typed by the request's tool schemas
            hold['stream'] = st = ReplyStream(p.template, family, p.think, self.gw.parses_calls(req),
                                              f'{s.sid}/{len(s.calls)}', req.stop)
            hold['base'] = {'id': f'chatcmpl-{s.sid[:12]}-{len(s.calls)}', 'object': 'chat.completion.chunk',
                            'created': int(time.time()), 'model': self.gw.upstream.model_name}

            def on_token(ids):
                d = st.feed(ids)
                if d:
                    loop.call_soon_threadsafe(queue.put_nowait, d)
            return on_token

        task = asyncio.ensure_future(self.serve_call(s, req, digest, retry, hook, inline))
        first = asyncio.ensure_future(queue.get())
        await asyncio.wait({task, first}, return_when=asyncio.FIRST_COMPLETED)
        if task.done():                          # refused, replayed, or sampled before a first delta: whole
            first.cancel()
            response, index, replayed = task.result()     # a GatewayError goes to chat's handler

            async def done(ok: bool):
                s.in_flight -= 1
                await self.delivery(s, index, ok, replayed)
            return _Tracked(_sse(response, req.include_usage), 'text/event-stream', done, self.stream_interval)

        async def events():
            base = hold['base']
            yield b''.join(_delta_events(base, [{'role': 'assistant', 'content': ''}] + first.result()))
            while True:
                nxt = asyncio.ensure_future(queue.get())
                await asyncio.wait({task, nxt}, return_when=asyncio.FIRST_COMPLETED)
                if not nxt.done():
                    nxt.cancel()
                    break
                yield b''.join(_delta_events(base, nxt.result()))
            while not queue.empty():
                yield b''.join(_delta_events(base, queue.get_nowait()))
            try:
                response, _, _ = task.result()
            except GatewayError as e:
                yield _event(e.body()) + b'data: [DONE]\n\n'
                return
            for c in _delta_events(base, hold['stream'].finish(response['choices'][0]['message'])):
                yield c
            for c in _tail(base, response, req.include_usage):
                yield c

        async def done(ok: bool):
            try:
                try:
                    _, index, replayed = await task          # a dropped client: the call still completes
                except GatewayError:
                    return
                await self.delivery(s, index, ok, replayed)
            finally:
                s.in_flight -= 1
        return _Tracked(events(), 'text/event-stream', done, self.stream_interval)

    async def dialect_call(self, request, dialect):
        """A sampling call in another wire dialect (:mod:`agentrl.gateway.dialects`): its body becomes a
        chat-completions body, served by :meth:`serve_call` like a chat call (the same branches, the same
        journal), and the response goes back in the dialect's shape, as one JSON body or, with
        ``stream: true``, as the dialect's events once the call is journalled. Errors are in its shape."""
        try:
            s = self.gw.session(request.path_params['token'])
        except GatewayError as e:
            return _error(e, dialect=dialect)
        lim = self.gw.limits
        if lim.max_concurrent and s.in_flight >= lim.max_concurrent:
            return _error(GatewayError(429, f'the session already has {s.in_flight} requests in flight (limit '
                                            f'{lim.max_concurrent}); wait for them', type='rate_limit_error',
                                       code='max_concurrent'), dialect=dialect)
        s.in_flight += 1
        try:
            raw = await self.body_of(request, lim.max_body_bytes)

            def translate():                  # in a worker thread: a long body holds no other client
                body = self.json_body(raw, 'a JSON object')
                if not isinstance(body, dict):
                    raise GatewayError(400, f'request body must be a JSON object, got {type(body).__name__}')
                bad_flag = flag_problem(body, 'stream')      # "stream": "false" would be served unstreamed
                if bad_flag:
                    raise GatewayError(400, bad_flag[1], param=bad_flag[0])
                req, _ = parse_request(json.dumps(dialect.to_chat(body, s)).encode(), 1 << 62)
                req.dialect = dialect.name
                return body, req
            body, req = await asyncio.to_thread(translate)
            response, index, replayed = await self.serve_call(s, req, body_digest(raw),
                                                              _retry_count(request.headers.get(dialect.retry_header)),
                                                              inline=len(raw) <= INLINE_BYTES)
        except GatewayError as e:
            s.in_flight -= 1
            return _error(e, {'Retry-After': '1'} if e.code == 'paused' else None, dialect)
        except BaseException:
            s.in_flight -= 1
            raise

        async def done(ok: bool):
            s.in_flight -= 1
            await self.delivery(s, index, ok, replayed)
        if body.get('stream') is True:
            return _Tracked(dialect.events(response, body), 'text/event-stream', done, self.stream_interval)
        return _Tracked([json.dumps(dialect.reply(response, body), ensure_ascii=False).encode()], 'application/json',
                        done)

    async def count_tokens(self, request, dialect):
        """A dialect's token count (``dialect.count_paths``): the prompt length a call of the request would be
        planned with now (:meth:`~agentrl.gateway.service.Gateway.count_prompt`; nothing is sampled or written)."""
        try:
            s = self.gw.session(request.path_params['token'])
            body = self.json_body(await self.body_of(request, self.gw.limits.max_body_bytes), 'a JSON object')
            if not isinstance(body, dict):
                raise GatewayError(400, f'request body must be a JSON object, got {type(body).__name__}')
            req, _ = parse_request(json.dumps(dialect.to_chat(body, s)).encode(), 1 << 62)
            async with self.locks.setdefault(s.sid, asyncio.Lock()):     # not between a call's plan and commit
                n = await self.work(self.gw.count_prompt, s, req)
        except GatewayError as e:
            return _error(e, dialect=dialect)
        return _json(dialect.counted(n))

    async def health(self, request):
        return _json({'ok': True, 'sessions': len(self.gw.sessions) + len(self.gw.closed),
                      'paused': not self.running.is_set()})

    # ------------------------------------------------------------------ admin
    def _admin(self, request) -> None:
        import hmac
        got = request.headers.get('authorization', '').encode('utf-8', 'surrogateescape')   # bytes: any header
        if not self.admin_token or not hmac.compare_digest(got, f'Bearer {self.admin_token}'.encode()):
            raise GatewayError(401, 'admin routes need "Authorization: Bearer ADMIN_TOKEN" (from RUN/serve.json)',
                               type='authentication_error', code='admin_token')

    async def pause(self, request):
        """Stop dispatching new calls; returns once the calls already dispatched are done."""
        try:
            self._admin(request)
        except GatewayError as e:
            return _error(e)
        self.running.clear()
        await self.idle.wait()                  # every dispatched call has been journalled (or refused)
        return _json(self.admin_state())

    async def resume(self, request):
        try:
            self._admin(request)
        except GatewayError as e:
            return _error(e)
        self.running.set()
        return _json(self.admin_state())

    async def policy(self, request):
        """Set the policy version stamped on calls dispatched from now on (journalled)."""
        try:
            self._admin(request)
            body = self.json_body(await self.body_of(request, 1 << 12), '{"version": "..."}')
            v = body.get('version') if isinstance(body, dict) else None
            if not isinstance(v, str) or not v:
                raise GatewayError(400, f'version must be a non-empty string, got {v!r}', param='version')
            await self.work(self.gw.set_policy_version, v)
        except GatewayError as e:
            return _error(e)
        return _json(self.admin_state())

    async def state(self, request):
        try:
            self._admin(request)
        except GatewayError as e:
            return _error(e)
        return _json(self.admin_state())

    def admin_state(self) -> dict:
        return {'paused': not self.running.is_set(), 'policy_version': self.gw.policy_version,
                'in_flight': sum(s.in_flight for s in self.gw.sessions.values()),
                'open_sessions': sum(s.state == 'open' for s in self.gw.sessions.values())}

    async def reaper(self):
        while True:
            await asyncio.sleep(max(0.2, min(5.0, self.gw.session_timeout / 4)))
            await self.work(self.gw.reap, inline=False)


def _finite(v) -> bool:
    """A JSON number (not a boolean) that is finite as a float (a 400-digit integer is not)."""
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return False
    try:
        return math.isfinite(v)
    except OverflowError:
        return False


def _retry_count(header: str | None) -> int:
    """``x-stainless-retry-count`` as a count: a plain decimal of at most 9 ASCII digits, else 0 (not a retry)."""
    if header is None or not (header.isascii() and header.isdigit()) or len(header) > 9:
        return 0
    return int(header)


def create_app(gateway, *, public_url: str = '', stream_interval: float = 0.0, admin_token: str | None = None,
               pause_wait: float = 30.0):
    """The Starlette app serving ``gateway`` (:class:`~agentrl.gateway.service.Gateway`).

    Args:
        gateway: the state and worker.
        public_url: ``http://host:port`` the session base URLs start with (default: the request's).
        stream_interval: seconds between SSE chunks (0: as fast as the connection takes them).
        admin_token: the bearer token of ``/admin/*`` (None: admin routes refuse every request).
        pause_wait: seconds a call is held while paused before it gets 429 + ``Retry-After``.

    Returns:
        A ``starlette.applications.Starlette``; its lifespan reaps idle sessions every few seconds.
    """
    from contextlib import asynccontextmanager

    from starlette.applications import Starlette
    from starlette.routing import Route
    r = _Routes(gateway, public_url, stream_interval, admin_token, pause_wait)

    @asynccontextmanager
    async def lifespan(app):
        r.running, r.idle = asyncio.Event(), asyncio.Event()
        r.running.set()
        r.idle.set()
        task = asyncio.ensure_future(r.reaper())
        try:
            yield
        finally:
            task.cancel()

    async def not_found(request, exc):
        return _json(error_body(unserved(request.method, request.url.path, request.app.routes), 'not_found_error'),
                     getattr(exc, 'status_code', 404))

    async def internal(request, exc):
        where = mask_token(f'{request.method} {request.url.path}', request.url.path)
        _LOG.error('%s: internal error', where, exc_info=(type(exc), exc, exc.__traceback__))
        return _json(error_body(f'{where}: internal error; see the server log', 'server_error'), 500)

    def served(dialect):
        async def handler(request):
            return await r.dialect_call(request, dialect)
        return handler

    def counted(dialect):
        async def handler(request):
            return await r.count_tokens(request, dialect)
        return handler

    routes = [Route(f'/s/{{token}}{path}', served(d), methods=['POST']) for d in DIALECTS for path in d.paths]
    routes += [Route(f'/s/{{token}}{path}', counted(d), methods=['POST']) for d in DIALECTS
               for path in getattr(d, 'count_paths', ())]
    routes += [Route('/sessions', r.new_session, methods=['POST']),
              Route('/sessions/{token}', r.get_session, methods=['GET']),
              Route('/sessions/{token}/finish', r.finish, methods=['POST']),
              Route('/s/{token}/v1/chat/completions', r.chat, methods=['POST']),
              Route('/s/{token}/v1/models', r.models, methods=['GET']),
              Route('/health', r.health, methods=['GET']),
              Route('/admin/pause', r.pause, methods=['POST']), Route('/admin/resume', r.resume, methods=['POST']),
              Route('/admin/policy', r.policy, methods=['POST']), Route('/admin/state', r.state, methods=['GET'])]
    return Starlette(routes=routes, lifespan=lifespan,
                     exception_handlers={404: not_found, 405: not_found, Exception: internal})
