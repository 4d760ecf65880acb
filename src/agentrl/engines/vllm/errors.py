"""L4: the vLLM engine's two error types, below every module that raises them (no import circle).

:class:`VLLMError` is any one-line failure of a server (cannot start, not ready, a refused request,
an answer that breaks the token contract); :class:`ServerDied` is the one a run can resume from
(docs/vllm.md#a-server-that-dies-mid-run). Both are the engine contract's errors
(:class:`~agentrl.engines.contract.EngineError`; a dead server is an
:class:`~agentrl.engines.contract.EngineDied`). :mod:`.server` and :mod:`.client` re-export both.
"""
from __future__ import annotations

from ..contract import EngineDied, EngineError

__all__ = ['VLLMError', 'ServerDied']


class VLLMError(EngineError):
    """A vLLM server that cannot start, is not ready, or died: one line naming the server, the cause and the fix."""


class ServerDied(VLLMError, EngineDied):
    """A server stopped answering (connection refused / reset, or its engine died: HTTP 500) mid-run.

    Attributes:
        url: the server(s). detail: what was seen (``'ConnectError: ...'``, ``'HTTP 500: ...'``).
        finished: episode index -> record of every episode that had ended (filled by the episode runner).
    """

    def __init__(self, url: str, detail: str, message: str | None = None):
        super().__init__(message or f'vllm server {url} died mid-run ({detail}); finished episodes are kept; fix: '
                         'see the server log, restart it and rerun with --resume')
        self.url, self.detail = url, detail
        self.finished: dict = {}
