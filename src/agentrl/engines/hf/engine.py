"""L4: the HF backend of the engine contract, in this process (``agentrl serve --engine hf``).

:class:`HFEngine` samples each :class:`~agentrl.engines.contract.TurnRequest` with an
:class:`~agentrl.engines.hf.HFSampler` (one per spec and stop ids) and a fresh generator seeded
with the request's seed, streaming through the sampler's ``on_token`` hook. Calls are synchronous
and not thread-safe (``concurrency`` 1). Source: docs/design.md#engines.
"""
from __future__ import annotations

import json
import time

from ...record import SamplingSpec
from ..contract import TurnRequest, TurnResult, check_request
from ..fingerprint import model_name
from .models import is_vision_model, load_model
from .sampler import HFSampler

__all__ = ['HFEngine', 'MAX_SAMPLERS']

#: Samplers kept per (spec, stop ids), the most recently used (a client choosing a new temperature per call
#: must not grow the engine for ever; docs/design.md#bounds).
MAX_SAMPLERS = 16


class HFEngine:
    """A Hugging Face causal LM in this process.

    Args:
        model_dir: a ``save_pretrained`` folder with its tokenizer (``agentrl make-test-model OUT``).
        device: default ``cuda`` when available, else CPU (fp32 parameters). A vision-language folder
            (:func:`~agentrl.engines.hf.models.is_vision_model`) also loads its image processor, and a
            request's ``images`` are sampled with their pixels (:mod:`agentrl.engines.hf.vlm`).
        max_new_tokens: the default turn budget.

    Attributes: as :class:`~agentrl.engines.contract.Engine`; ``model`` (the loaded LM);
    ``concurrency`` 1, ``policy`` ``'hf'``, ``streams`` True.

    Raises:
        ImportError: without the ``hf`` extra. FileNotFoundError / ValueError: as :func:`load_model`.
    """

    concurrency = 1
    policy = 'hf'
    streams = True
    logp_mode = None

    def __init__(self, model_dir, *, device=None, max_new_tokens: int = 256):
        import torch
        if device is None:
            device = 'cuda' if torch.cuda.is_available() else 'cpu'
        self.model, self.tokenizer = load_model(model_dir, device=device)
        self.image_processor = None
        if is_vision_model(model_dir):                  # a vision-language model: requests may bring images
            from .vlm import load_image_processor
            self.image_processor = load_image_processor(model_dir)
        self.model_name = model_name(model_dir)
        cfg = getattr(self.model, 'config', None)
        cfg = cfg.get_text_config() if hasattr(cfg, 'get_text_config') else cfg
        self.max_context = int(getattr(cfg, 'max_position_embeddings', None) or 1 << 30)
        self.max_new_tokens = int(max_new_tokens)
        self.samplers: dict = {}

    def record_spec(self, spec: SamplingSpec) -> SamplingSpec:
        """``spec`` unchanged: the HF sampler stores the log-probs its spec declares."""
        return spec

    def sampler(self, spec: SamplingSpec, stop_ids) -> HFSampler:
        """The :class:`HFSampler` of ``(spec, stop_ids)``, made on first use (with the tokenizer, which a
        ``spec.constraint`` compiles against); the last :data:`MAX_SAMPLERS` used are kept."""
        key = (json.dumps(spec.to_dict(), sort_keys=True), tuple(sorted(stop_ids)))
        sampler = self.samplers.pop(key, None)
        if sampler is None:
            pad = getattr(self.tokenizer, 'pad_token_id', None)
            sampler = HFSampler(self.model, stop_ids, spec, max_new_tokens=self.max_new_tokens, pad_id=pad,
                                tokenizer=self.tokenizer, image_processor=self.image_processor)
        self.samplers[key] = sampler                      # last in order: the most recently used
        while len(self.samplers) > MAX_SAMPLERS:
            del self.samplers[next(iter(self.samplers))]
        return sampler

    def sample(self, request: TurnRequest, teacher=None) -> TurnResult:
        """One turn from :meth:`HFSampler.sample` with its own generator seeded by ``request.seed``.

        Args:
            request: the turn. teacher: optional ``[n]`` ids to score instead of sampling (tests
                force a reply this way; the log-probs are the model's).

        Raises:
            RequestRefused: an empty prompt. BudgetExceeded: a budget below 1.
        """
        import torch
        check_request(request, 'HFEngine.sample', images=self.image_processor is not None)
        sampler = self.sampler(request.spec, request.stop_ids)
        gen = torch.Generator().manual_seed(int(request.seed))
        cb = request.on_token
        t0 = time.time()
        extra = {'images': [request.images]} if request.images else {}
        t = sampler.sample([list(request.prompt_ids)], [gen], max_new_tokens=int(request.max_new_tokens),
                           teacher=None if teacher is None else [list(teacher)],
                           on_token=None if cb is None else (lambda _b, ids: cb(ids)), **extra)[0]
        return TurnResult(ids=list(t.ids), logp=[float(x) for x in t.logp], truncated=bool(t.truncated),
                          seed=int(request.seed), span=(t0, time.time()))

    def close(self) -> None:
        """Nothing to release (the model is freed with the engine)."""
