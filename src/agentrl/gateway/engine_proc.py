"""L5: the HF engine in a child process (``agentrl serve --engine hf --engine-process``).

:class:`HFProcessUpstream` is :class:`~agentrl.gateway.engine.HFUpstream` run in a spawned child
process that the gateway talks to over a pipe: the gateway keeps the tokenizer (templates,
bridges, parsing) and the child holds the model and samples. The HF sampling loop is Python that
holds its interpreter's GIL between forward passes; in the gateway's own process it delays the
event loop and the state thread (bench/RESULTS.md, "Recording gateway"). In a child it does not.

Per call the parent sends ``(prompt ids, spec, budget, seed, stop ids, stream)`` and gets one
``('tok', id)`` message per sampled token when streaming, then ``('done', ids, logp, truncated,
start, end)`` (the child's own engine span, epoch seconds) or ``('error', kind, message)``. The
child samples one call at a time (``concurrency`` 1), the same ids and log-probs as in process for
the same seed (the same sampler, model and generator). The child exits when the pipe closes (the
gateway stopped or was killed).

Source: docs/gateway.md#engines.
"""
from __future__ import annotations

import threading
from array import array
from pathlib import Path

from ..record import SamplingSpec
from .engine import Sample

__all__ = ['HFProcessUpstream']


def _child(conn, model_dir: str, device, max_new_tokens: int, threads: int | None) -> None:
    """The child's loop: load the model, answer ``ready``, then sample each request it receives."""
    import torch
    if threads:
        torch.set_num_threads(int(threads))
    from .engine import HFUpstream
    try:
        up = HFUpstream(model_dir, device=device, max_new_tokens=max_new_tokens)
    except Exception as e:  # noqa: BLE001 - reported to the parent, which raises it
        conn.send(('error', type(e).__name__, str(e)))
        return
    conn.send(('ready', up.max_context))
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
            s = up.sample(prompt.tolist(), SamplingSpec.from_dict(spec), budget, seed, frozenset(stops), on_token=send)
        except Exception as e:  # noqa: BLE001 - one bad call is that call's error, the child keeps serving
            conn.send(('error', type(e).__name__, str(e)))
            continue
        conn.send(('done', s.ids, s.logp, s.truncated, s.span[0], s.span[1]))


def _died(pid, e):
    from ..engines.vllm.client import ServerDied
    return ServerDied(f'pid {pid}', type(e).__name__, f'the HF engine process (pid {pid}) stopped '
                      f'({type(e).__name__}); restart agentrl serve (open sessions resume from the journal)')


class HFProcessUpstream:
    """A Hugging Face causal LM sampled in a child process (``--engine hf --engine-process``).

    Args:
        model_dir: a ``save_pretrained`` folder with its tokenizer (``agentrl make-test-model OUT``).
        device: the child's torch device (default ``cuda`` when available, else CPU).
        max_new_tokens: the default turn budget.
        threads: ``torch.set_num_threads`` in the child (None: torch's default).
        start_timeout: seconds to wait for the child to load the model.

    Attributes: ``tokenizer`` (loaded here), ``model_name``, ``max_context`` (the child's model
    config), ``concurrency`` 1, ``policy`` ``'hf'``, ``streams`` True, ``pid`` (the child's).

    Raises:
        ValueError / FileNotFoundError: the child could not load the model (its message).
        RuntimeError: the child did not answer within ``start_timeout``.
    """

    concurrency = 1
    policy = 'hf'
    streams = True

    def __init__(self, model_dir, *, device=None, max_new_tokens: int = 256, threads: int | None = None,
                 start_timeout: float = 300.0):
        import multiprocessing as mp

        from transformers import AutoTokenizer

        from ..jobs.rollout import model_fingerprint
        self.model_dir = str(Path(model_dir))
        self.tokenizer = AutoTokenizer.from_pretrained(self.model_dir)
        self.model_name = f'{Path(model_dir).resolve().name}@{model_fingerprint(model_dir)}'
        self.max_new_tokens = int(max_new_tokens)
        ctx = mp.get_context('spawn')
        self._conn, child = ctx.Pipe()
        self._proc = ctx.Process(target=_child, args=(child, self.model_dir, device, self.max_new_tokens, threads),
                                 daemon=True, name='agentrl-hf-engine')
        self._proc.start()
        child.close()
        self.pid = self._proc.pid
        self._lock = threading.Lock()
        if not self._conn.poll(start_timeout):
            self.close()
            raise RuntimeError(f'the HF engine process (pid {self.pid}) did not load {self.model_dir} within '
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

    def sample(self, prompt_ids, spec: SamplingSpec, max_new_tokens: int, seed: int, stop_ids,
               on_token=None) -> Sample:
        """One turn sampled in the child (as :meth:`HFUpstream.sample`); ``on_token`` as there.

        Raises:
            ValueError: the child's sampler refused the call (an empty prompt, a budget below 1).
            ServerDied: the child process stopped (the gateway answers 503).
        """
        with self._lock:
            try:
                self._conn.send((array('q', prompt_ids), spec.to_dict(), int(max_new_tokens), int(seed),
                                 sorted(int(i) for i in stop_ids), on_token is not None))   # array: C-speed pickling
            except (BrokenPipeError, OSError) as e:
                raise _died(self.pid, e) from None
            ids = []
            while True:
                msg = self._recv()
                if msg[0] == 'tok':
                    ids.append(msg[1])
                    on_token(list(ids))
                elif msg[0] == 'error':
                    raise ValueError(f'HF engine process: {msg[1]}: {msg[2]}')
                else:
                    _, ids, logp, truncated, t0, t1 = msg
                    return Sample(ids=list(ids), logp=list(logp), truncated=bool(truncated), seed=int(seed),
                                  span=(t0, t1))

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
