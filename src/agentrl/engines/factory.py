"""L4: the engine registry: the one place that knows engines by name (docs/design.md#engines).

Each :class:`Backend` entry declares the facts the rollout job and ``agentrl serve`` act on (does it
need a model folder, does it sample on servers, which policy its records name, ...), and where its
:class:`~agentrl.engines.contract.Engine` lives, as a loader function that imports its module on first use
(so this module and ``agentrl --help`` stay free of torch, and the import stays in the graph that
``tests/test_layers.py`` reads). Callers ask :func:`backend` for the facts
and :func:`open_engine` / :func:`start_server` for the objects; no other module tests an engine's name.

Standard library only.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Callable

__all__ = ['Backend', 'BACKENDS', 'ENGINES', 'Names', 'backend', 'open_engine', 'start_server', 'rollout_kit']


@dataclass(frozen=True)
class Backend:
    """What one engine is and needs.

    Attributes:
        name: the ``--engine`` value.
        policy: ``Provenance.policy`` of its model records.
        model_dir: it loads ``--model DIR`` (a ``save_pretrained`` folder); False: the run's TinyAgent weights.
        servers: it samples on model servers (``--server URL``, or one it starts: :func:`start_server`).
        chat: its episodes go through a chat template on the model's own tokenizer (the records carry
            that tokenizer's and template's fingerprints; token ids outside the gym's vocabulary).
        model_only: it samples only ``--policy model``.
        grammar: it honours ``--tool-choice`` / ``--response-format`` (docs/grammar.md).
        engine: a loader returning its :class:`~agentrl.engines.contract.Engine` class (None: no turn-level
            engine; TinyAgent's batched loop is its own fast path).
        child: a loader returning the same engine's child-process class (None: none).
        server: a loader returning the function that starts a local server (a context manager with ``url``,
            ``pid``).
        rollout: a server backend's loader returning its rollout kit, what ``agentrl rollout`` calls
            (docs/design.md#engines): ``check_local(model, python)``, ``start(model, *, cpus, python, name)``,
            ``connect(urls) -> endpoints``, ``probe(endpoints, prompt_ids) -> logp_mode``,
            ``record_spec(spec, logp_mode)`` and ``episodes(endpoints, recorders, respond, *, seeds, spec,
            max_new_tokens, max_turns, model_name, concurrency, on_done, responses, logp_mode)``, which
            runs the driver over the backend's ``TurnBatch``, and ``ServerDied(url, detail, message)``,
            the :class:`~agentrl.engines.contract.EngineDied` its episodes raise (with ``url``,
            ``detail`` and ``finished``: episode index -> record of every episode that had ended).
    """
    name: str
    policy: str
    model_dir: bool = True
    servers: bool = False
    chat: bool = True
    model_only: bool = True
    grammar: bool = True
    engine: Callable[[], type] | None = None
    child: Callable[[], type] | None = None
    server: Callable[[], Callable] | None = None
    rollout: Callable[[], object] | None = None


def _hf_engine():
    from .hf.engine import HFEngine
    return HFEngine


def _hf_child():
    from .hf.process import HFProcessEngine
    return HFProcessEngine


def _vllm_engine():
    from .vllm.engine import VLLMEngine
    return VLLMEngine


def _vllm_server():
    from .vllm.server import local_server
    return local_server


def _vllm_rollout():
    from .vllm import rollout
    return rollout


#: The backends by name; a new one is one entry here plus its module (docs/design.md#engines).
BACKENDS = {b.name: b for b in (
    Backend('tinyagent', policy='model', model_dir=False, chat=False, model_only=False, grammar=False),
    Backend('hf', policy='hf', engine=_hf_engine, child=_hf_child),
    Backend('vllm', policy='vllm', servers=True, engine=_vllm_engine, server=_vllm_server, rollout=_vllm_rollout),
)}


class Names(Sequence):
    """The registry's names whose entry passes ``test``, in registry order, read at each use.

    A live view, so an option's ``engines=`` (:mod:`agentrl.fields`) and the ``--engine`` choices
    follow every entry of :data:`BACKENDS`, one added later included; equal to the tuple of its names.

    Args:
        test: ``test(Backend) -> bool`` (default: every entry).
    """

    def __init__(self, test: Callable[[Backend], bool] = lambda b: True):
        self.test = test

    def _names(self) -> tuple:
        return tuple(n for n, b in BACKENDS.items() if self.test(b))

    def __getitem__(self, i):
        return self._names()[i]

    def __len__(self) -> int:
        return len(self._names())

    def __eq__(self, other) -> bool:
        return self._names() == (tuple(other) if isinstance(other, (Names, list, tuple)) else other)

    __hash__ = None

    def __repr__(self) -> str:
        return repr(self._names())


#: ``--engine`` choices, in registry order.
ENGINES = Names()


def backend(name: str) -> Backend:
    """The registry entry of ``name``.

    Raises:
        ValueError: an unknown name (lists the known ones).
    """
    try:
        return BACKENDS[name]
    except KeyError:
        raise ValueError(f'--engine {name!r} is not known; choose from {", ".join(ENGINES)}') from None


def open_engine(name: str, *, model, device=None, max_new_tokens: int = 256, process: bool = False, urls=(),
                concurrency: int = 64):
    """Open the :class:`~agentrl.engines.contract.Engine` of backend ``name``.

    Args:
        name: a registry name. model: the model folder.
        device: torch device of an in-process or child engine (default ``cuda`` when available).
        max_new_tokens: the default turn budget. process: run it in a child process.
        urls: the servers of a server backend. concurrency: requests in flight of a server backend.

    Returns:
        The engine (close it with ``close()``).

    Raises:
        ValueError: an unknown name; a backend without a turn-level engine; ``process`` for a backend
            without a child-process form (names the fix).
        As the backend's constructor.
    """
    b = backend(name)
    if b.engine is None:
        raise ValueError(f'--engine {name} has no turn-level engine (it runs its own batched loop); '
                         f'choose one of {", ".join(n for n, x in BACKENDS.items() if x.engine)}')
    if process and b.child is None:
        raise ValueError(f'--engine-process is for an in-process engine; --engine {name} is already another process')
    if b.servers:
        return b.engine()(list(urls), model, max_new_tokens=max_new_tokens, concurrency=concurrency)
    return (b.child if process else b.engine)()(model, device=device, max_new_tokens=max_new_tokens)


def start_server(name: str, model, *, cpus: str | None = None, python=None, log_path=None):
    """A local server of backend ``name`` for ``model`` (a context manager with ``url`` and ``pid``).

    Args:
        name: a registry name. model: the model folder. cpus: a ``taskset -c`` core list (None: no pinning).
        python: the server's Python (None: the backend's default). log_path: where its log goes.

    Raises:
        ValueError: a backend that starts no server.
    """
    b = backend(name)
    if b.server is None:
        raise ValueError(f'--engine {name} starts no server; drop --server')
    return b.server()(model, cpus=cpus, python=python, log_path=log_path)


def rollout_kit(name: str):
    """The rollout kit of server backend ``name`` (:attr:`Backend.rollout`).

    Raises:
        ValueError: an unknown name; a backend that samples on no servers.
    """
    b = backend(name)
    if b.rollout is None:
        raise ValueError(f'--engine {name} samples on no servers; drop --server')
    return b.rollout()
