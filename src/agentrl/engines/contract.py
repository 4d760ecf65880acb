"""L4: the turn-level engine contract: prompt ids in, sampled ids, their log-probs and the stop reason out.

Every backend (HF in process, HF in a child process, vLLM servers) implements :class:`Engine`; the
gateway, the rollout job and tests ask only this contract, and :mod:`agentrl.engines.factory` is the
one place that picks a backend by name (docs/design.md#engines). The engine knows token ids only:
templates, bridges and reply parsing stay with the caller.

Torch-free and standard library only.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Protocol

from ..record import SamplingSpec

__all__ = ['TurnRequest', 'TurnResult', 'Engine', 'EngineError', 'EngineUnreachable', 'EngineDied',
           'BudgetExceeded', 'RequestRefused', 'STOPPED', 'CUT', 'check_request']

#: :attr:`TurnResult.stop_reason` of a turn that ended on one of its stop ids (the id is its last).
STOPPED = 'stop'
#: :attr:`TurnResult.stop_reason` of a turn cut at its token budget (no stop id in it).
CUT = 'length'


class EngineError(RuntimeError):
    """Base of every engine failure: one line naming the engine, the cause and the fix."""


class EngineUnreachable(EngineError):
    """The engine could not be reached or did not start (a server not ready, a child that never answered)."""


class EngineDied(EngineError):
    """The engine stopped answering mid-run (a connection reset, a dead child process, HTTP 500)."""


class BudgetExceeded(EngineError, ValueError):
    """A turn with no room: a token budget below 1, or a prompt at or over the engine's context."""


class RequestRefused(EngineError, ValueError):
    """The engine refused one request (an empty prompt, a server's HTTP 4xx); the engine itself goes on."""


@dataclass(frozen=True)
class TurnRequest:
    """One turn to sample.

    Attributes:
        prompt_ids: ``[L]`` int token ids, ``L >= 1`` (the episode so far, ending in its generation prompt).
        spec: the :class:`~agentrl.record.SamplingSpec`, its ``constraint`` included.
        max_new_tokens: the turn's token budget (``>= 1``).
        seed: the draw's seed (HF: a fresh ``torch.Generator``; vLLM: the request's ``seed``).
        stop_ids: the ids that end the turn (the template's); sampled and kept.
        on_token: optional ``on_token(ids so far)`` (``[k]`` ints), called after each sampled token
            (or each streamed chunk) when the engine :attr:`Engine.streams`.
        key: optional routing key (a session id): every request with the same key goes to the same
            server of a multi-server engine.
        images: the images of ``prompt_ids`` in placeholder order (``ChatRecorder.images``: ``digest``, ``data``,
            ``length``), for a vision-language model (docs/design.md#images); None without images.
    """
    prompt_ids: list | tuple
    spec: SamplingSpec
    max_new_tokens: int
    seed: int
    stop_ids: frozenset = frozenset()
    on_token: Callable | None = field(default=None, compare=False)
    key: str | None = None
    images: list | None = field(default=None, compare=False)


@dataclass
class TurnResult:
    """One sampled turn.

    Attributes:
        ids: ``[n]`` int sampled ids (the stop id last when the turn stopped on one; docs/design.md#stops).
        logp: ``[n]`` float log-probs in nats under the (declared) spec.
        truncated: the turn was cut at its budget (no stop id); :attr:`stop_reason` says it in words.
        seed: the draw's seed.
        server: the server that sampled it (None in process).
        span: ``(start, end)`` epoch seconds of the engine's own work (None when the engine does not say).
    """
    ids: list = field(default_factory=list)
    logp: list = field(default_factory=list)
    truncated: bool = False
    seed: int | None = None
    server: str | None = None
    span: tuple | None = None

    @property
    def stop_reason(self) -> str:
        """:data:`STOPPED` (ended on a stop id) or :data:`CUT` (cut at the budget)."""
        return CUT if self.truncated else STOPPED


class Engine(Protocol):
    """What a caller needs from an engine.

    Attributes:
        tokenizer: the Hugging Face tokenizer the engine's ids belong to.
        model_name: ``Provenance.model`` of the records (``'name@fingerprint'``).
        max_context: the context limit in tokens.
        max_new_tokens: the default turn budget.
        concurrency: how many :meth:`sample` calls may run at once (1: not thread-safe).
        policy: ``Provenance.policy`` of the records (``'hf'``, ``'vllm'``).
        streams: :meth:`sample` calls ``request.on_token`` as tokens arrive.
        logp_mode: the log-prob mode the engine returns (None: the request spec's).

    Episodes run on :func:`agentrl.engines.driver.drive_episodes` over the backend's
    :class:`~agentrl.engines.driver.TurnBatch` (many turns at once): HF's ``RowBatch`` / ``RoundBatch``
    over its sampler, vLLM's ``VLLMBatch`` over its servers.
    """
    tokenizer: object
    model_name: str
    max_context: int
    max_new_tokens: int
    concurrency: int
    policy: str
    streams: bool

    def record_spec(self, spec: SamplingSpec) -> SamplingSpec:
        """``spec`` as the records declare it (e.g. a server's probed log-prob mode)."""
        ...

    def sample(self, request: TurnRequest) -> TurnResult:
        """Sample one turn.

        Raises:
            EngineDied: the engine stopped answering. RequestRefused: the request was refused.
            BudgetExceeded: no room for a token.
        """
        ...

    def close(self) -> None:
        """Release the engine (a child process, HTTP connections); idempotent."""
        ...


def check_request(request: TurnRequest, engine: str, images: bool = False) -> None:
    """Refuse a request no backend can sample: an empty prompt or a budget below 1; images where ``images`` is False.

    Raises:
        RequestRefused: an empty ``prompt_ids``; ``request.images`` to an engine that does not feed images (the
            prompt's placeholder ids would reach the model without their pixels). BudgetExceeded:
            ``max_new_tokens < 1``.
    """
    if request.images and not images:
        raise RequestRefused(f'{engine}: the request brings {len(request.images)} images and this engine does not '
                             'feed images to its model; sample vision episodes with the in-process HF engine or the '
                             'vllm engine on a vision-language model folder (docs/design.md#images)')
    if not len(request.prompt_ids):
        raise RequestRefused(f'{engine}: prompt_ids is empty; pass the ids the template renders')
    if int(request.max_new_tokens) < 1:
        raise BudgetExceeded(f'{engine}: a token budget of {request.max_new_tokens}; every turn needs at least one '
                             'token (stop the episode as truncated before sampling)')

