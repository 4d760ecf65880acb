"""L5: the engine behind the gateway, token-in/token-out: prompt ids in, sampled ids and log-probs out.

:class:`Upstream` is the protocol; :class:`HFUpstream` runs a Hugging Face model in this process
through :class:`agentrl.engines.hf.HFSampler` (one sampler per :class:`~agentrl.record.SamplingSpec`;
calls are synchronous and not thread-safe: ``concurrency`` 1, the gateway makes them from one engine
thread). :class:`agentrl.gateway.engine_proc.HFProcessUpstream` runs the same sampler in a child
process (the gateway's threads never wait for the engine's GIL). :class:`agentrl.gateway.vllm.VLLMUpstream`
is the same protocol over vLLM servers.

An upstream with ``streams = True`` takes ``on_token(ids)`` in :meth:`Upstream.sample`: called after
each sampled token with the turn's ids so far (in the engine thread), so the gateway streams deltas
as the model writes them (docs/gateway.md#streaming).
"""
from __future__ import annotations

import json
import time
from pathlib import Path

from dataclasses import dataclass, field
from typing import Protocol

from ..record import SamplingSpec

__all__ = ['Sample', 'Upstream', 'HFUpstream']


@dataclass
class Sample:
    """One sampled turn. ``ids`` ``[n]`` int (the stop id last when it stopped on one), ``logp`` ``[n]``
    float nats under the spec, ``truncated``: cut at the budget (no stop id); ``seed``: the draw's seed;
    ``server``: the engine server that sampled it (None in process); ``span``: ``(start, end)`` epoch
    seconds of the engine's own work (None when the engine does not say)."""
    ids: list = field(default_factory=list)
    logp: list = field(default_factory=list)
    truncated: bool = False
    seed: int | None = None
    server: str | None = None
    span: tuple | None = None


class Upstream(Protocol):
    """What the gateway needs from an engine.

    Attributes:
        tokenizer: the Hugging Face tokenizer the engine's ids belong to.
        model_name: ``Provenance.model`` of the records (e.g. ``'name@fingerprint'``).
        max_context: the context limit in tokens.
        max_new_tokens: the default turn budget.
        concurrency: how many ``sample`` calls may run at once (engine threads; 1: not thread-safe).
        policy: ``Provenance.policy`` of the records (``'hf'``, ``'vllm'``).

    Optional: ``route(session_id) -> server`` (sticky routing; ``sample`` then gets ``server=``),
    ``record_spec(spec) -> SamplingSpec`` (the spec the records declare, e.g. a probed log-prob mode),
    and ``streams = True`` (``sample`` then takes ``on_token``: called with the turn's ids so far after
    each sampled token).
    """
    tokenizer: object
    model_name: str
    max_context: int
    max_new_tokens: int
    concurrency: int
    policy: str

    def sample(self, prompt_ids: list, spec: SamplingSpec, max_new_tokens: int, seed: int,
               stop_ids: frozenset) -> Sample:
        """Sample one turn after ``prompt_ids`` (``[L]`` ints) with ``spec``; at most ``max_new_tokens``."""
        ...


class HFUpstream:
    """A Hugging Face causal LM in this process (what ``agentrl serve --engine hf --model DIR`` runs).

    Args:
        model_dir: a ``save_pretrained`` folder with its tokenizer (``agentrl make-test-model OUT``).
        device: default ``cuda`` when available, else CPU (fp32 parameters).
        max_new_tokens: the default turn budget.

    Attributes: ``concurrency`` 1 (HF sampling is not thread-safe), ``policy`` ``'hf'``.

    Raises:
        ImportError: without the ``hf`` extra. FileNotFoundError / ValueError: as
            :func:`agentrl.engines.hf.load_model`.
    """

    concurrency = 1
    policy = 'hf'
    streams = True

    def __init__(self, model_dir, *, device=None, max_new_tokens: int = 256):
        import torch

        from ..engines.hf import load_model
        from ..jobs.rollout import model_fingerprint
        if device is None:
            device = 'cuda' if torch.cuda.is_available() else 'cpu'
        self.model, self.tokenizer = load_model(model_dir, device=device)
        self.model_name = f'{Path(model_dir).resolve().name}@{model_fingerprint(model_dir)}'
        cfg = getattr(self.model, 'config', None)
        self.max_context = int(getattr(cfg, 'max_position_embeddings', None) or 1 << 30)
        self.max_new_tokens = int(max_new_tokens)
        self._samplers: dict = {}

    def sample(self, prompt_ids, spec: SamplingSpec, max_new_tokens: int, seed: int, stop_ids,
               on_token=None) -> Sample:
        """One turn from :meth:`agentrl.engines.hf.HFSampler.sample` with its own seeded generator.

        ``on_token(ids)``: called after each sampled token with the turn's ids so far (``[k]`` ints).

        Raises:
            ValueError: as ``HFSampler.sample`` (an empty prompt, a budget below 1).
        """
        import torch
        key = (json.dumps(spec.to_dict(), sort_keys=True), tuple(sorted(stop_ids)))
        sampler = self._samplers.get(key)
        if sampler is None:
            pad = getattr(self.tokenizer, 'pad_token_id', None)
            sampler = self._samplers[key] = _sampler_class()(self.model, stop_ids, spec,
                                                             max_new_tokens=self.max_new_tokens, pad_id=pad)
        gen = torch.Generator().manual_seed(int(seed))
        t0 = time.time()
        sampler.on_token = on_token
        try:
            t = sampler.sample([list(prompt_ids)], [gen], max_new_tokens=int(max_new_tokens))[0]
        finally:
            sampler.on_token = None
        return Sample(ids=list(t.ids), logp=[float(x) for x in t.logp], truncated=bool(t.truncated), seed=int(seed),
                      span=(t0, time.time()))


_SAMPLER = []


def _sampler_class():
    """``HFSampler`` that calls ``self.on_token(ids so far)`` after each token of a one-row batch."""
    if not _SAMPLER:
        from ..engines.hf import HFSampler

        class StreamingSampler(HFSampler):
            on_token = None

            def _record(self, out, rows, step, ids, logp, budgets):
                go = super()._record(out, rows, step, ids, logp, budgets)
                if self.on_token is not None and len(out) == 1:
                    self.on_token(list(out[0].ids))
                return go
        _SAMPLER.append(StreamingSampler)
    return _SAMPLER[0]
