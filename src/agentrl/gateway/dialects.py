"""L5: the wire dialects the gateway serves besides chat completions, over one branch model.

A dialect turns its request body into a chat-completions body (:meth:`Dialect.to_chat`), which the
gateway validates (:func:`~agentrl.gateway.protocol.parse_request`) and serves like any chat call: the
same messages, matched against the same branches, journalled and recorded the same way (the call's
``dialect`` is recorded with it). The chat-completions response is then written back in the
dialect's shape (:meth:`Dialect.reply`, :meth:`Dialect.events` for a stream) and every refusal in its
error shape (:meth:`Dialect.error`).

A dialect module defines one subclass and one instance of it; the app lists the instances it serves
(:mod:`agentrl.gateway.app`) and serves each at its :attr:`Dialect.paths` under the session prefix
``/s/{token}``.

Source: docs/gateway.md#dialects.
"""
from __future__ import annotations

import json

from .protocol import GatewayError, error_body

__all__ = ['Dialect', 'sse_event']


def sse_event(data: dict, event: str | None = None) -> bytes:
    """One server-sent event: ``event: NAME`` (when given) and ``data: JSON``, then a blank line (UTF-8)."""
    head = f'event: {event}\n' if event else ''
    return f'{head}data: {json.dumps(data, ensure_ascii=False)}\n\n'.encode()


class Dialect:
    """One wire dialect: its routes, its request translation, its replies and its errors.

    Attributes:
        name: recorded with every call served in it (``'chat'`` is chat completions itself).
        paths: route paths under ``/s/{token}`` (Starlette syntax), each served with POST.
        retry_header: the request header whose integer value marks an SDK retry (0 or absent: none).
    """
    name = ''
    paths: tuple = ()
    retry_header = 'x-stainless-retry-count'

    def to_chat(self, body: dict, session) -> dict:
        """The chat-completions body of a request in this dialect.

        Args:
            body: the decoded JSON object of the request. session: the
                :class:`~agentrl.gateway.sessions.Session` it is sent to (read only: a dialect resolves
                the opaque ids it handed out, such as a thinking signature, against its calls).

        Raises:
            GatewayError: 400 naming the dialect's field that cannot be honoured.
        """
        raise NotImplementedError

    def reply(self, response: dict, body: dict) -> dict:
        """The dialect's JSON reply of a chat-completions ``response`` to the request ``body``."""
        raise NotImplementedError

    def events(self, response: dict, body: dict) -> list:
        """The dialect's server-sent events (bytes, in order) of a completed ``response`` (``stream: true``)."""
        raise NotImplementedError

    def error(self, e: GatewayError) -> dict:
        """The dialect's error JSON of ``e`` (its status stays the HTTP status). Default: OpenAI's shape."""
        return error_body(e.message, e.type, e.param, e.code)
