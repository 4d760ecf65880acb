"""L4: load the model that replays records, whichever engine sampled them.

:func:`load_scorer` turns a TinyAgent checkpoint file (``model.pt``) or a Hugging Face model
folder (``config.json`` + weights, e.g. from ``agentrl make-test-model``) into a
:class:`~agentrl.checks.replay.Scorer`, the one thing :func:`agentrl.checks.replay_records` needs. So
``agentrl check RUN --model M`` replays TinyAgent and HF-engine records with the same code and
prints the same ratio table.
"""
from __future__ import annotations

import os
from pathlib import Path

import torch

from ..checkpoint import load_checkpoint
from ..checks.replay import Scorer
from .hf.models import is_vision_model, load_model, score_rows, scoring_head
from .packed import scored_logits, segments_attention

__all__ = ['load_scorer', 'hf_scorer', 'tiny_scorer']


def tiny_scorer(model, name: str = '') -> Scorer:
    """A :class:`~agentrl.checks.replay.Scorer` over a TinyAgent (or any ``ids -> logits`` module).

    Scoring runs in eval mode (dropout off, as at sampling) and restores the module's mode
    (:meth:`~agentrl.checks.replay.Scorer.of_model`).

    Args:
        model: ids ``[B, T]`` -> logits ``[B, T, V]``.
        name: what reports call it.

    Returns:
        :class:`~agentrl.checks.replay.Scorer` with ``max_len`` the model's context length.
    """
    return Scorer.of_model(model, name=name)


def hf_scorer(model, name: str = '', image_processor=None) -> Scorer:
    """A :class:`~agentrl.checks.replay.Scorer` over a transformers causal LM.

    One plain forward pass per right-padded batch (:func:`agentrl.engines.hf.score_rows`: only
    the requested rows go through the output head), or per packed batch (``Scorer.packed``: records
    end to end, each attending only to itself, :mod:`agentrl.engines.packed`), in eval mode (attention and hidden dropout
    off, as at sampling; the module's mode is restored).

    Args:
        model: a transformers causal LM.
        name: what reports call it (default: its config's name).
        image_processor: a vision-language model's image processor: the scorer then also has
            ``vision(ids [L], images, rows [n]) -> [n, V]`` for records with ``info['images']`` (one forward pass
            with the images' pixels and 3-D positions, :func:`agentrl.engines.hf.vlm.vision_logits`), reading
            each image's bytes from its ``image_data`` mapping (digest -> bytes: a dict, or the run's
            :class:`~agentrl.images.ImageFolder`, which ``agentrl check RUN --model M`` sets).

    Returns:
        :class:`~agentrl.checks.replay.Scorer`; ``pad_id`` the config's ``pad_token_id`` (else 0),
        ``max_len`` its ``max_position_embeddings`` (when set).
    """
    cfg = getattr(model, 'config', None)

    def fn(ids, attention_mask, rows):
        was = model.training
        model.eval()
        try:
            return score_rows(model, ids, attention_mask, rows)
        finally:
            model.train(was)

    @torch.no_grad()
    def packed(ids, position_ids, r, j):
        was = model.training
        model.eval()
        try:
            return _packed_rows(model, ids, position_ids, r, j)
        finally:
            model.train(was)

    pad = getattr(cfg, 'pad_token_id', None)
    name = name or os.path.basename(str(getattr(cfg, '_name_or_path', '') or '').rstrip('/')) or type(model).__name__
    text_cfg = cfg.get_text_config() if hasattr(cfg, 'get_text_config') else cfg
    scorer = Scorer(fn, name, 0 if pad is None else int(pad), getattr(text_cfg, 'max_position_embeddings', None),
                    packed if image_processor is None else None)
    if image_processor is not None:
        scorer.image_data = {}
        scorer.vision = _vision_scorer(model, image_processor, lambda: scorer.image_data)
    return scorer


def _vision_scorer(model, processor, source):
    """``vision(ids, images, rows)`` of :func:`hf_scorer`: the images whose placeholder ids the ids hold, with
    their bytes from the mapping ``source()`` returns (the scorer's ``image_data`` at call time)."""
    from types import SimpleNamespace

    from .hf.vlm import image_token_id, pixel_inputs, processor_settings, vision_logits
    settings = processor_settings(processor)

    def vision(ids, images, rows):
        data = source()
        n = int((torch.as_tensor(ids) == image_token_id(model)).sum())
        used, total = [], 0
        for q, d in enumerate(images):      # a turn's context holds the images before it
            if total >= n:
                break
            diff = {k: v for k, v in (d.get('processor') or {}).items() if settings.get(k) != v}
            if diff:
                raise ValueError(f"image {q} ({d['digest']}) was sized with processor settings {diff}, the model's "
                                 f'processor has {({k: settings.get(k) for k in diff})}; replay with the model folder '
                                 'that sampled it')
            try:
                blob = data[d['digest']]
            except KeyError as e:
                why = f' ({e.args[0]})' if e.args and e.args[0] != d['digest'] else ''
                raise KeyError(f"the bytes of image {d['digest']} are not in the scorer's image_data{why}") from None
            used.append(SimpleNamespace(digest=d['digest'], data=blob, length=int(d['length'])))
            total += int(d['length'])
        was = model.training
        model.eval()
        try:
            return vision_logits(model, ids, pixel_inputs(processor, used) if used else None, rows)
        finally:
            model.train(was)
    return vision


def _packed_rows(model, ids, position_ids, r, j) -> torch.Tensor:
    """``[K, V]`` float32 CPU logits at (row ``r``, column ``j``) of packed rows: per-record attention
    (:data:`agentrl.engines.packed.SEGMENT_ATTENTION`), or transformers' packed block mask when a record is
    longer than the model's sliding window or attention logits are soft-capped; only the K rows go through the output head."""
    from contextlib import nullcontext

    dev = next(model.parameters()).device
    window = getattr(model.config, 'sliding_window', None)
    longest = int(position_ids.max()) + 1 if position_ids.numel() else 0
    per_record = (window is None or longest <= window) and not getattr(model.config, 'attn_logit_softcapping', None)
    with segments_attention(model, position_ids) if per_record else nullcontext():
        logits = scored_logits(model, scoring_head(model), ids.to(dev), position_ids.to(dev), r.to(dev), j.to(dev))
    return logits.float().cpu()


def load_scorer(path, *, device: str | torch.device | None = None, dtype: torch.dtype = torch.float32) -> Scorer:
    """Load the model at ``path`` as a replay scorer.

    Args:
        path: a TinyAgent checkpoint file (``model.pt`` from ``agentrl rollout`` / ``train``,
            :func:`agentrl.checkpoint.load_checkpoint`), or a Hugging Face model folder holding
            ``config.json`` (:func:`agentrl.engines.hf.load_model`; needs the ``hf`` extra).
        device: where to run the model (default CPU).
        dtype: parameter dtype (default float32: the step-0 check's tolerances are stated in fp32).

    Returns:
        :class:`~agentrl.checks.replay.Scorer` named after the file or folder (its base name,
        never the absolute path).

    Raises:
        FileNotFoundError: nothing at ``path``, or a folder without ``config.json`` (pass the
            ``model.pt`` file or a folder written by ``save_pretrained``).
        ValueError: a file that is not a TinyAgent checkpoint, or a folder that holds no causal
            LM (from the loaders, naming the path).
        ImportError: a Hugging Face folder without the ``hf`` extra.

    Example:
        >>> report = checks.replay_records(records, load_scorer('run/model.pt'))
    """
    p = Path(path)
    if p.is_dir():
        if not (p / 'config.json').is_file():
            raise FileNotFoundError(f'--model {str(p)!r} is a folder without config.json; pass a TinyAgent '
                                    'model.pt file or a Hugging Face folder written by save_pretrained')
        model, tok = load_model(p, device=device, dtype=dtype)
        proc = None
        if is_vision_model(p):
            from .hf.vlm import load_image_processor
            proc = load_image_processor(p)
        scorer = hf_scorer(model, name=p.resolve().name, image_processor=proc)
        scorer.tokenizer = tok             # grammar-constrained records compile their constraint against it
        return scorer
    if not p.exists():
        raise FileNotFoundError(f'--model {str(p)!r} not found; pass a TinyAgent model.pt file or a Hugging Face '
                                'model folder')
    model = load_checkpoint(str(p))
    if device is not None:
        model.to(device)
    if dtype != torch.float32:
        model.to(dtype)
    return tiny_scorer(model, name=p.name)
