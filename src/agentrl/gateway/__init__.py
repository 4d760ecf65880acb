"""L5: ``agentrl serve``, an OpenAI-compatible gateway that records harness traffic token-exactly.

A harness (any OpenAI chat client) talks to a session's base URL; each call is served
token-in/token-out from the session's recorded ids plus a template bridge, journalled durably
before its response is sent, and each branch leaf of a finished session becomes one
:class:`~agentrl.record.Trajectory` in ``RUN/trajectories`` (checked by ``agentrl check RUN``).

The engine behind it is any :class:`~agentrl.engines.contract.Engine`
(:func:`agentrl.engines.factory.open_engine`); the gateway holds no engine code.

Source: docs/gateway.md.
"""
from .conformance import ConformanceError, conformance
from .journal import Journal, read_journal
from .limits import Limits
from .parse import message_deltas, normalize_assistant, parse_reply
from .stream import ReplyStream
from .protocol import ChatRequest, GatewayError, parse_request
from .service import Gateway, session_id
from .sessions import FORK_CATEGORIES, Branch, Session, Turn

__all__ = ['Gateway', 'Limits',
           'Journal', 'read_journal', 'ChatRequest', 'GatewayError', 'parse_request', 'parse_reply', 'message_deltas',
           'ReplyStream', 'normalize_assistant', 'Session', 'Branch', 'Turn', 'FORK_CATEGORIES', 'session_id',
           'conformance', 'ConformanceError', 'create_app', 'Server']


def __getattr__(name):          # the HTTP parts import starlette/uvicorn (the `serve` extra) only when used
    if name == 'create_app':
        from .app import create_app
        return create_app
    if name == 'Server':
        from .server import Server
        return Server
    raise AttributeError(f'module {__name__!r} has no attribute {name!r}')
