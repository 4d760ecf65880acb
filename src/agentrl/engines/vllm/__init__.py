"""L4: the vLLM engine: token-in/token-out rollouts against vLLM OpenAI-compatible servers (docs/vllm.md).

- :mod:`.server`: :class:`VLLMServer` (a local server from the vLLM venv), :func:`connect` (running ones).
- :mod:`.client`: one turn = one async ``/v1/completions`` request on token ids; :func:`turn_seed`.
- :mod:`.engine`: :class:`VLLMEngine`, the turn-level engine contract over running servers.
- :mod:`.episodes`: :func:`vllm_rollouts` (chat episodes over a ``ChatRecorder`` on the one driver).
- :mod:`.http`: the package's one HTTP client (httpx2); :mod:`.errors`: :class:`VLLMError`, :class:`ServerDied`.

``server`` and ``client`` import only the standard library; :mod:`.episodes` (torch, templates) is
imported on first use of its names.
"""
from .client import ServerDied, probe_logp_mode, request_body, turn_seed
from .server import (CPU_HEAD_DIMS, LOGPROBS_MODES, Endpoint, VLLMError, VLLMServer, VLLMServerOptions,
                     check_head_dim, connect, default_python, diagnose_log)

_LAZY = {'VLLMTurn', 'VLLMBatch', 'vllm_rollouts', 'run_vllm_episodes', 'checked_spec',
         'route', 'check_logp_mode'}

__all__ = ['CPU_HEAD_DIMS', 'LOGPROBS_MODES', 'Endpoint', 'VLLMError', 'VLLMServer', 'VLLMServerOptions', 'ServerDied',
           'check_head_dim',
           'connect', 'default_python', 'diagnose_log', 'probe_logp_mode', 'request_body', 'turn_seed',
           *sorted(_LAZY)]


def __getattr__(name):
    if name in _LAZY:
        from . import episodes
        return getattr(episodes, name)
    raise AttributeError(f'module {__name__!r} has no attribute {name!r}')
