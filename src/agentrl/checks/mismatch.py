"""L3: engine-vs-trainer mismatch of replayed tokens (|Δ log-p|, a per-token KL estimate, shares over
thresholds) and the context drift of imported chat-endpoint records (:func:`context_drift`).

For tokens sampled by the engine ``q`` (stored ``sample_logp`` = log q(x)) and scored again by the
trainer ``p`` (the replay), ``Δ = log p(x) - log q(x)`` (the replay's ``log_ratio``) and
``r = exp(Δ)``. KL(q || p) = E_q[-Δ] is estimated per token with Schulman's k3 =
``(r - 1) - log r`` (unbiased, never negative, low variance when p and q are close) and k1 = ``-Δ``
(unbiased, can be negative). Source: J. Schulman, "Approximating KL Divergence" (2020),
http://joschu.net/blog/kl-approx.html.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from .._lazy import lazy_module

torch = lazy_module('torch')

__all__ = ['LogpMismatch', 'THRESHOLDS', 'TurnDrift', 'context_drift']

#: |Δ log-p| thresholds (nats) whose token shares are reported.
THRESHOLDS = (1e-3, 1e-1)


@dataclass
class LogpMismatch:
    """Mismatch statistics over ``n`` replayed tokens (NaN when ``n == 0``).

    Attributes:
        n: tokens. max_abs, mean_abs: max and mean ``|Δ|`` (nats).
        kl_k3, kl_k1: mean per-token estimates of KL(engine || trainer) in nats (k3, k1 of the module doc).
        over: ``{threshold: share of tokens with |Δ| > threshold}`` for :data:`THRESHOLDS`.
    """
    n: int
    max_abs: float
    mean_abs: float
    kl_k3: float
    kl_k1: float
    over: dict

    @classmethod
    def of(cls, log_ratio: torch.Tensor) -> 'LogpMismatch':
        """From ``[N]`` float ``Δ = replayed - stored``; a non-finite Δ makes max and means non-finite."""
        d = log_ratio.double().flatten()
        if d.numel() == 0:
            nan = math.nan
            return cls(0, nan, nan, nan, nan, {t: nan for t in THRESHOLDS})
        a = d.abs()
        k3 = torch.expm1(d) - d
        return cls(int(d.numel()), float(a.max()), float(a.mean()), float(k3.mean()), float((-d).mean()),
                   {t: float((a > t).double().mean()) for t in THRESHOLDS})

    def line(self) -> str:
        """One report line, e.g. ``|Δ log-p| max 2.1e-06 mean 1.5e-07; KL k3 1.2e-13 ...``."""
        over = ', '.join(f'{100 * s:.2f}% over {t:g}' for t, s in self.over.items())
        return (f'|Δ log-p| max {self.max_abs:.2e} mean {self.mean_abs:.2e} nats; KL(sampler||trainer) per token: '
                f'k3 {self.kl_k3:.2e}, k1 {self.kl_k1:.2e} (Schulman 2020); tokens {over}')


@dataclass
class TurnDrift:
    """The first token where a server's prompt for a turn differs from the record (imported chat logs).

    Attributes:
        turn: the turn (0-based). position: index into the record's ids (and the server's prompt).
        record_id: ``ids[position]`` of the record (None: the record's context ends there).
        server_id: the server prompt's id there (None: the server's prompt ends there).
    """
    turn: int
    position: int
    record_id: int | None
    server_id: int | None

    def __str__(self) -> str:
        return (f'turn {self.turn}: token {self.position} is {self.record_id} in the record, {self.server_id} in the '
                "server's prompt")


def context_drift(record) -> list:
    """The turns of an imported record whose server prompt differs from the record's ids before the turn.

    A chat-endpoint server (vLLM ``/v1/chat/completions``) re-renders the history from text, so a
    re-encoded assistant turn can differ from the ids it sampled; :func:`agentrl.interop.from_openai`
    lists such turns in ``info['import']['context_drift']`` and keeps the server's ids as the
    turn's ``turn_contexts`` entry. Source: docs/vllm.md (the chat endpoint re-renders history).

    Returns:
        one :class:`TurnDrift` per drifted turn, in turn order (empty for other records).
    """
    turns = ((record.info or {}).get('import') or {}).get('context_drift') or []
    if not turns or record.turn_contexts is None:
        return []
    ids = record.ids.tolist()
    out = []
    for k in turns:
        start, ctx = record.turn_contexts[k]
        mine, theirs = ids[:int(start)], [int(x) for x in ctx]
        j = next((i for i, (a, b) in enumerate(zip(mine, theirs)) if a != b), min(len(mine), len(theirs)))
        out.append(TurnDrift(int(k), j, mine[j] if j < len(mine) else None, theirs[j] if j < len(theirs) else None))
    return out
