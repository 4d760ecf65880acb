"""L4: the vLLM backend's rollout kit: what ``agentrl rollout --engine vllm`` asks of it (docs/design.md#engines).

The rollout job knows a server backend only through its registry entry's ``rollout`` loader
(:attr:`agentrl.engines.factory.Backend.rollout`), which returns this module: check that a local
server can start (:func:`check_local`), start one (:func:`start`), connect running ones
(:func:`connect`), probe their log-prob mode once (:func:`probe`), the spec the records declare
(:func:`record_spec`), the episodes themselves (:func:`episodes`, the one driver over
:class:`~agentrl.engines.vllm.VLLMBatch`) and the error a dead server raises (:class:`ServerDied`).
Source: docs/vllm.md.
"""
from __future__ import annotations

import os

from .client import checked_spec as record_spec
from .errors import ServerDied
from .episodes import check_logp_mode as probe, vllm_rollouts as episodes
from .server import VLLMError, VLLMServer, VLLMServerOptions, check_head_dim, connect, default_python

__all__ = ['check_local', 'start', 'connect', 'probe', 'record_spec', 'episodes', 'ServerDied']


def check_local(model, python=None) -> None:
    """Refuse, before anything runs, a local server that cannot start: a head size vLLM CPU cannot run, no venv.

    Args:
        model: the model folder (``--model``). python: the vLLM venv's python (None: :func:`default_python`).

    Raises:
        ValueError: one line naming the flag and the fix.
    """
    try:
        check_head_dim(model)      # the head size vLLM CPU cannot run, and the fix
    except VLLMError as e:
        raise ValueError(f'--model {model!r}: {e}') from None
    py = python or str(default_python())
    if not os.path.isfile(py):
        raise ValueError(f'--engine vllm without --server starts a local server with {py!r}, which does not '
                         'exist; build .venv-vllm (docs/vllm.md#install), pass --vllm-python PATH, or '
                         '--server URL of a running server')


def start(model, *, cpus: str | None = None, python=None, name: str | None = None) -> VLLMServer:
    """A local :class:`VLLMServer` for ``model`` (a context manager; ``url`` once started).

    Args:
        model: the model folder. cpus: ``taskset -c`` cores (None: not pinned). python: the vLLM venv's
            python (None: the default). name: ``--served-model-name`` (None: the folder's name).

    Raises:
        As :class:`VLLMServer`.
    """
    return VLLMServer(model, VLLMServerOptions(cpus=cpus, name=name), python=python)
