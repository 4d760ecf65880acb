"""L4: the package's one HTTP client (httpx2): every request agentrl sends to a vLLM server goes through here.

Blocking calls (the gateway's engine threads, the readiness probe) share one ``httpx2.Client``;
the episode runner's async turns use an ``httpx2.AsyncClient`` from :func:`async_client`. Both
open one connection per request (no keep-alive: uvicorn closes an idle kept-alive connection after
5 s, and a client that reuses it reads a reset), ignore proxy variables (the servers are
addressed directly) and send the body bytes of ``json.dumps(body)``.

What the answers mean is decided once (docs/vllm.md#a-server-that-dies-mid-run): a connection
refused / reset / timed out or HTTP >= 500 is :class:`~.errors.ServerDied`, another status than 200
is :class:`~.errors.VLLMError` with the server's text. httpx2 is imported on first use (the
``vllm`` and ``serve`` extras carry it), so this module imports only the standard library.
"""
from __future__ import annotations

import contextlib
import json
import threading
from collections.abc import Iterator

from .errors import ServerDied, VLLMError

__all__ = ['HEADERS', 'async_client', 'shared_client', 'check_status', 'send', 'post', 'apost', 'stream_lines',
           'split_lines']

#: the request headers of every POST (the body is ``json.dumps(body)``, as the server parses it).
HEADERS = {'Content-Type': 'application/json'}
_SHARED = {}
_LOCK = threading.Lock()


def _httpx():
    """The httpx2 module, or ImportError naming the extra that installs it."""
    try:
        import httpx2
    except ImportError:  # pragma: no cover - httpx2 comes with the vllm and serve extras
        raise ImportError('the vllm engine needs httpx2: pip install "agentrl[vllm]"') from None
    return httpx2


def async_client(limit: int = 256):
    """An ``httpx2.AsyncClient`` for an episode runner's turns.

    Args:
        limit: connections open at once (requests past it wait for one, without a time limit).

    Returns:
        The client (``async with`` it); no read or total timeout (long turns on slow CPUs), 30 s to connect.
    """
    httpx = _httpx()
    return httpx.AsyncClient(timeout=httpx.Timeout(None, connect=30.0), trust_env=False,
                             limits=httpx.Limits(max_connections=int(limit), max_keepalive_connections=0))


def shared_client():
    """The process's blocking ``httpx2.Client`` (made on first use; thread-safe; no connection limit).

    Each call passes its own timeout, so one client serves every caller.
    """
    with _LOCK:
        if 'client' not in _SHARED:
            httpx = _httpx()
            _SHARED['client'] = httpx.Client(trust_env=False, limits=httpx.Limits(max_connections=None,
                                                                                   max_keepalive_connections=0))
        return _SHARED['client']


def check_status(url: str, path: str, status: int, raw: bytes) -> bytes:
    """``raw`` when ``status`` is 200, else the one-line error of that status.

    Args:
        url: the server's base URL (named in errors). path: the request path (``/v1/completions``).
        status: the HTTP status. raw: the response body (its first 400 bytes go into the error).

    Returns:
        ``raw``.

    Raises:
        ServerDied: ``status >= 500`` (an engine that died answers 500).
        VLLMError: another status (e.g. 400 for a prompt over ``--max-model-len``; the server's text kept).
    """
    if status == 200:
        return raw
    text = raw[:400].decode(errors='replace')
    if status >= 500:
        raise ServerDied(url, f'HTTP {status}: {text}')
    raise VLLMError(f'vllm server {url}: {path} answered HTTP {status}: {text}; fix: see the message')


def _died(url: str, e: Exception, where: str = '') -> ServerDied:
    return ServerDied(url, f'{type(e).__name__}{where}: {e}')


def send(url: str, path: str, body: dict | None = None, *, timeout: float, http=None) -> tuple[int, bytes]:
    """One blocking request, unchecked: GET ``url + path`` (``body`` None) or POST ``body`` as JSON.

    Args:
        url: the server's base URL. path: e.g. ``/v1/models``. timeout: seconds for the connect and
            for each read. http: a ``httpx2.Client`` (default :func:`shared_client`).

    Returns:
        ``(status, body bytes)``.

    Raises:
        ServerDied: the connection was refused, reset or timed out (``detail`` names the httpx2 error).
    """
    httpx = _httpx()
    http = http or shared_client()
    try:
        if body is None:
            r = http.get(url + path, timeout=timeout)
        else:
            r = http.post(url + path, content=json.dumps(body).encode(), headers=HEADERS, timeout=timeout)
    except httpx.TransportError as e:
        raise _died(url, e) from None
    return r.status_code, r.content


def post(url: str, path: str, body: dict, *, timeout: float, http=None) -> bytes:
    """POST ``body`` (blocking) and return the answer's bytes (HTTP 200).

    Raises:
        ServerDied, VLLMError: as :func:`send` and :func:`check_status`.
    """
    return check_status(url, path, *send(url, path, body, timeout=timeout, http=http))


async def apost(http, url: str, path: str, body: dict) -> bytes:
    """POST ``body`` on ``http`` (an :func:`async_client`) and return the answer's bytes (HTTP 200).

    Raises:
        ServerDied, VLLMError: as :func:`send` and :func:`check_status`.
    """
    httpx = _httpx()
    try:
        r = await http.post(url + path, content=json.dumps(body).encode(), headers=HEADERS)
    except httpx.TransportError as e:
        raise _died(url, e) from None
    return check_status(url, path, r.status_code, r.content)


@contextlib.contextmanager
def stream_lines(url: str, path: str, body: dict, *, timeout: float, http=None) -> Iterator[Iterator[bytes]]:
    """POST ``body`` (blocking) and read the answer line by line as the server sends it.

    Args:
        url, path, timeout, http: as :func:`send` (``timeout``: also the longest wait between two chunks).

    Yields:
        An iterator of the body's ``bytes`` lines, each with its ``b'\\n'`` (as :func:`split_lines`).

    Raises:
        ServerDied, VLLMError: as :func:`post` for the status line; ServerDied also for a connection
            lost or timed out mid-body (``detail`` ``'ReadError mid-stream: ...'``).
    """
    httpx = _httpx()
    http = http or shared_client()
    try:
        with http.stream('POST', url + path, content=json.dumps(body).encode(), headers=HEADERS,
                         timeout=timeout) as r:
            if r.status_code != 200:
                check_status(url, path, r.status_code, r.read())
            yield _body_lines(url, r.iter_bytes(), httpx.TransportError)
    except httpx.TransportError as e:
        raise _died(url, e) from None


def _body_lines(url: str, chunks, transport_error) -> Iterator[bytes]:
    """:func:`split_lines` of a response body whose reads may fail: a failure is ServerDied ``... mid-stream``."""
    try:
        yield from split_lines(chunks)
    except transport_error as e:
        raise _died(url, e, ' mid-stream') from None


def split_lines(chunks) -> Iterator[bytes]:
    """``bytes`` chunks as lines, each ending in ``b'\\n'`` (the last one may not), whatever the chunk borders.

    Example:
        >>> list(split_lines([b'data: 1\\n\\nda', b'ta: 2\\n', b'\\nend']))
        [b'data: 1\\n', b'\\n', b'data: 2\\n', b'\\n', b'end']
    """
    pending = b''
    for chunk in chunks:
        pending += chunk
        start = 0
        while (end := pending.find(b'\n', start)) >= 0:
            yield pending[start:end + 1]
            start = end + 1
        pending = pending[start:]
    if pending:
        yield pending
