"""L5: run the gateway app with uvicorn on 127.0.0.1 (or --host), in the foreground or in a thread.

The socket is bound first (port 0: a free port), so the bound address is known before serving:
it is printed as the first line of output and written to ``RUN/serve.json``.
"""
from __future__ import annotations

import json
import os
import socket
import threading
from pathlib import Path

from ..io import atomic_write
from .app import create_app

__all__ = ['bind', 'Server', 'write_serve_json']


def bind(host: str = '127.0.0.1', port: int = 0) -> socket.socket:
    """A listening TCP socket on ``(host, port)`` (port 0: a free one).

    Raises:
        OSError: the address is in use or cannot be bound (names it).
    """
    # proto=IPPROTO_TCP: asyncio turns TCP_NODELAY on only for sockets that say so; without it a
    # kept-alive client (the openai SDK, aiohttp) waits ~40 ms (Nagle + delayed ACK) on every response
    sock = socket.socket(socket.AF_INET6 if ':' in host else socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as e:
        sock.close()
        raise OSError(e.errno, f'cannot listen on {host}:{port} ({e.strerror}); choose another --port '
                               '(0 picks a free one)') from None
    sock.listen(128)
    sock.set_inheritable(True)
    return sock


def write_serve_json(out, host: str, port: int, gateway, admin_token: str = '') -> Path:
    """``RUN/serve.json`` (mode 0600: it holds the admin token): host, port, url, pid, model, engine, limits, timeout.

    ``engine``: ``policy``, ``concurrency``, and for vLLM the ``servers`` and the probed ``logp_mode``.
    """
    up = gateway.upstream
    engine = {'policy': getattr(up, 'policy', 'hf'), 'concurrency': getattr(up, 'concurrency', 1)}
    for k in ('urls', 'logp_mode'):
        if getattr(up, k, None) is not None:
            engine['servers' if k == 'urls' else k] = getattr(up, k)
    info = {'admin_token': admin_token, 'host': host, 'port': port, 'url': f'http://{host}:{port}',
            'sessions_url': f'http://{host}:{port}/sessions', 'pid': os.getpid(), 'model': up.model_name,
            'engine': engine, 'limits': gateway.limits.to_dict(), 'session_timeout': gateway.session_timeout}
    path = atomic_write(Path(out) / 'serve.json', json.dumps(info, indent=2) + '\n')
    os.chmod(path, 0o600)
    return path


class Server:
    """A uvicorn server for a :class:`~agentrl.gateway.service.Gateway` on a bound socket.

    Args:
        gateway: the gateway. host, port: where to listen (port 0: a free port).
        stream_interval, pause_wait: see :func:`~agentrl.gateway.app.create_app`.

    Attributes:
        host, port, url (``http://host:port``), admin_token (the ``/admin/*`` bearer token, also in
        ``RUN/serve.json``).

    Example:
        >>> srv = Server(gw).start()          # in a thread (tests); srv.run() in the foreground
        >>> ...; srv.stop()
    """

    def __init__(self, gateway, host: str = '127.0.0.1', port: int = 0, *, stream_interval: float = 0.0,
                 pause_wait: float = 30.0, log_level: str = 'warning'):
        import secrets

        import uvicorn
        self.gateway = gateway
        self.sock = bind(host, port)
        self.host, self.port = host, self.sock.getsockname()[1]
        self.url = f'http://{host}:{self.port}'
        self.admin_token = secrets.token_urlsafe(24)
        app = create_app(gateway, public_url=self.url, stream_interval=stream_interval, admin_token=self.admin_token,
                         pause_wait=pause_wait)
        self.server = uvicorn.Server(uvicorn.Config(app, log_level=log_level, lifespan='on', access_log=False,
                                                    timeout_graceful_shutdown=5))
        self._thread = None
        write_serve_json(gateway.out, host, self.port, gateway, self.admin_token)

    def run(self) -> None:
        """Serve in this thread until interrupted (SIGINT/SIGTERM stop uvicorn gracefully)."""
        try:
            self.server.run(sockets=[self.sock])
        finally:
            self.close()

    def start(self) -> 'Server':
        """Serve in a daemon thread; returns once the server accepts connections."""
        self._thread = threading.Thread(target=self.server.run, kwargs={'sockets': [self.sock]}, daemon=True,
                                        name='agentrl-serve')
        self._thread.start()
        while not self.server.started:
            if not self._thread.is_alive():
                raise RuntimeError('the gateway server thread stopped while starting')
            threading.Event().wait(0.02)
        return self

    def stop(self) -> None:
        """Stop serving and close the gateway (journal, worker)."""
        self.server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout=10)
        self.close()

    def close(self) -> None:
        self.sock.close()
        self.gateway.engine_pool.shutdown(wait=True)
        self.gateway.pool.shutdown(wait=True)
        self.gateway.journal.close()
