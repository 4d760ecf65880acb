"""L4: the HF backend of the engine contract in a child process (``agentrl serve --engine hf --engine-process``).

:class:`HFProcessEngine` is :class:`~agentrl.engines.hf.engine.HFEngine` run in a spawned child
process that the caller talks to over a pipe: the caller keeps the tokenizer and the child holds
the model and samples. The HF sampling loop holds its interpreter's GIL between forward passes; in
a child it does not delay the caller's threads (bench/RESULTS.md, "Recording gateway").

Per call the parent sends ``(prompt ids, spec, budget, seed, stop ids, stream)`` and gets one
``('tok', id)`` message per sampled token when streaming, then ``('done', ids, logp, truncated,
start, end)`` (the child's own engine span, epoch seconds) or ``('error', kind, message)``. The
child samples one call at a time (``concurrency`` 1), the same ids and log-probs as in process for
the same seed. It exits when the pipe closes (the parent stopped or was killed).

Source: docs/gateway.md#engines.
"""
from __future__ import annotations

import threading
from array import array
from pathlib import Path

from ...record import SamplingSpec
from ..contract import EngineDied, EngineUnreachable, RequestRefused, TurnRequest, TurnResult, check_request
from ..fingerprint import model_name

__all__ = ['HFProcessEngine']


def serve_child(conn, model_dir: str, device, max_new_tokens: int, threads: int | None) -> None:
    """The child's loop: load the model, answer ``ready``, then sample each request it receives."""
    import torch
    if threads:
        torch.set_num_threads(int(threads))
    from .engine import HFEngine
    try:
        engine = HFEngine(model_dir, device=device, max_new_tokens=max_new_tokens)
    except Exception as e:  # noqa: BLE001 - reported to the parent, which raises it
        conn.send(('error', type(e).__name__, str(e)))
        return
    conn.send(('ready', engine.max_context))
    while True:
        try:
            msg = conn.recv()
        except (EOFError, OSError):
            return
        if msg is None:
            return
        prompt, spec, budget, seed, stops, stream = msg
        send = (lambda ids: conn.send(('tok', ids[-1]))) if stream else None
        try:
            s = engine.sample(TurnRequest(prompt.tolist(), SamplingSpec.from_dict(spec), budget, seed,
                                          frozenset(stops), on_token=send))
        except Exception as e:  # noqa: BLE001 - one bad call is that call's error, the child keeps serving
            conn.send(('error', type(e).__name__, str(e)))
            continue
        conn.send(('done', s.ids, s.logp, s.truncated, s.span[0], s.span[1]))


def _died(pid, e) -> EngineDied:
    return EngineDied(f'the HF engine process (pid {pid}) stopped ({type(e).__name__}); restart agentrl serve '
                      '(open sessions resume from the journal)')


class HFProcessEngine:
    """A Hugging Face causal LM sampled in a child process.

    Args:
        model_dir: a ``save_pretrained`` folder with its tokenizer (``agentrl make-test-model OUT``).
        device: the child's torch device (default ``cuda`` when available, else CPU).
        max_new_tokens: the default turn budget.
        threads: ``torch.set_num_threads`` in the child (None: torch's default).
        start_timeout: seconds to wait for the child to load the model.

    Attributes: as :class:`~agentrl.engines.contract.Engine` (``tokenizer`` loaded here,
    ``max_context`` from the child's model config); ``pid`` (the child's).

    Raises:
        ValueError / FileNotFoundError: the child could not load the model (its message).
        EngineUnreachable: the child did not answer within ``start_timeout``.
    """

    concurrency = 1
    policy = 'hf'
    streams = True
    logp_mode = None

    def __init__(self, model_dir, *, device=None, max_new_tokens: int = 256, threads: int | None = None,
                 start_timeout: float = 300.0):
        import multiprocessing as mp

        from ...templates.loading import load_tokenizer
        self.model_dir = str(Path(model_dir))
        self.tokenizer = load_tokenizer(self.model_dir)
        self.model_name = model_name(model_dir)
        self.max_new_tokens = int(max_new_tokens)
        ctx = mp.get_context('spawn')
        self._conn, child = ctx.Pipe()
        self._proc = ctx.Process(target=serve_child, args=(child, self.model_dir, device, self.max_new_tokens,
                                                           threads), daemon=True, name='agentrl-hf-engine')
        self._proc.start()
        child.close()
        self.pid = self._proc.pid
        self._lock = threading.Lock()
        if not self._conn.poll(start_timeout):
            self.close()
            raise EngineUnreachable(f'the HF engine process (pid {self.pid}) did not load {self.model_dir} within '
                                    f'{start_timeout:g} s')
        msg = self._recv()
        if msg[0] == 'error':
            self.close()
            raise ValueError(f'the HF engine process could not load {self.model_dir}: {msg[1]}: {msg[2]}')
        self.max_context = int(msg[1])

    def _recv(self):
        try:
            return self._conn.recv()
        except (EOFError, OSError) as e:
            raise _died(self.pid, e) from None

    def record_spec(self, spec: SamplingSpec) -> SamplingSpec:
        """``spec`` unchanged (as :meth:`HFEngine.record_spec`)."""
        return spec

    def sample(self, request: TurnRequest) -> TurnResult:
        """One turn sampled in the child (as :meth:`HFEngine.sample`).

        Raises:
            RequestRefused: the child's sampler refused the call (its message). BudgetExceeded: a budget below 1.
            EngineDied: the child process stopped (the gateway answers 503).
        """
        check_request(request, 'HFProcessEngine.sample')
        on_token = request.on_token
        with self._lock:
            try:
                self._conn.send((array('q', request.prompt_ids), request.spec.to_dict(), int(request.max_new_tokens),
                                 int(request.seed), sorted(int(i) for i in request.stop_ids), on_token is not None))
            except (BrokenPipeError, OSError) as e:
                raise _died(self.pid, e) from None
            ids = []
            while True:
                msg = self._recv()
                if msg[0] == 'tok':
                    ids.append(msg[1])
                    on_token(list(ids))
                elif msg[0] == 'error':
                    raise RequestRefused(f'HF engine process: {msg[1]}: {msg[2]}')
                else:
                    _, ids, logp, truncated, t0, t1 = msg
                    return TurnResult(ids=list(ids), logp=list(logp), truncated=bool(truncated),
                                      seed=int(request.seed), span=(t0, t1))

    def close(self) -> None:
        """Stop the child (it also exits by itself when this process dies and the pipe closes)."""
        try:
            self._conn.send(None)
        except (OSError, ValueError):
            pass
        self._proc.join(timeout=10)
        if self._proc.is_alive():
            self._proc.kill()
            self._proc.join(timeout=5)
        self._conn.close()
