"""L4: the pixels of a record's images for a Hugging Face vision-language model (Qwen2-VL family).

Token-in/token-out with images: the ids already hold each image's run of placeholder ids (the template
layer expanded them, :mod:`agentrl.templates.vision`); here the model's own image processor turns the
image bytes into ``pixel_values`` and ``image_grid_thw``, the processor's placeholder count is checked
against the run in the ids (the conformance check), and the 3-D rotary positions are computed from the
ids and grids by the model's own ``get_rope_index``. Sampling (:meth:`HFSampler.sample` with ``images``)
and replay (:func:`vision_logits`) feed the same pixels and positions, so a record replays to ratio 1.
"""
from __future__ import annotations

import io

import torch

from ...images import PROCESSOR_KEYS, image_digest, placeholder_count
from ...templates.chat import require_hf

__all__ = ['load_image_processor', 'processor_settings', 'pixel_inputs', 'rope_positions', 'vision_logits',
           'image_token_id']


def load_image_processor(model_dir):
    """The image processor saved in ``model_dir`` (``preprocessor_config.json``), offline.

    transformers picks its PIL/numpy class where torchvision is not installed (the Qwen2-VL processor then
    needs Pillow only).

    Raises:
        ImportError: without the ``hf`` extra. FileNotFoundError: no ``preprocessor_config.json`` in
            ``model_dir`` (not a vision-language model folder).
    """
    from pathlib import Path
    transformers = require_hf('load_image_processor')
    if not (Path(model_dir) / 'preprocessor_config.json').is_file():
        raise FileNotFoundError(f'{str(model_dir)!r} has no preprocessor_config.json: it is not a vision-language '
                                'model folder (`agentrl make-test-model --vision OUT` builds one)')
    return transformers.AutoImageProcessor.from_pretrained(str(model_dir), local_files_only=True)


def processor_settings(processor) -> dict:
    """The settings of ``processor`` an :class:`~agentrl.images.ImageRef` records (:data:`~agentrl.images.PROCESSOR_KEYS`)."""
    size = getattr(processor, 'size', None)
    get = (lambda k: size.get(k)) if isinstance(size, dict) else (lambda k: getattr(size, k, None))
    out = {'class': getattr(processor, 'image_processor_type', None) or type(processor).__name__,
           'min_pixels': getattr(processor, 'min_pixels', None) or get('shortest_edge'),
           'max_pixels': getattr(processor, 'max_pixels', None) or get('longest_edge')}
    for k in PROCESSOR_KEYS:
        if k not in out:
            v = getattr(processor, k, None)
            out[k] = list(v) if isinstance(v, (tuple, list)) else v
    return out


def image_token_id(model) -> int:
    """The model's image placeholder id (``config.image_token_id``).

    Raises:
        ValueError: the model's config names none (not a Qwen2-VL-style model).
    """
    i = getattr(model.config, 'image_token_id', None)
    if i is None:
        raise ValueError(f'{type(model).__name__} has no config.image_token_id: it is not a vision-language model '
                         'agentrl can feed images to')
    return int(i)


def pixel_inputs(processor, images) -> dict:
    """``pixel_values`` and ``image_grid_thw`` of images, checked against their placeholder counts.

    Args:
        processor: the model's image processor (:func:`load_image_processor`).
        images: objects with ``digest``, ``data`` (the bytes as received) and ``length`` (the image's run of
            placeholder ids in the record), in placeholder order:
            :class:`~agentrl.templates.vision.PendingImage`, or :class:`~agentrl.images.ImageRef` with
            ``data`` added.

    Returns:
        ``{'pixel_values': [N, C * temporal * patch * patch] float32, 'image_grid_thw': [n_images, 3] int64}``.

    Raises:
        ValueError: bytes whose digest is not the image's, or an image whose processor grid gives another
            placeholder count than its run (names the image and both counts): the template layer and the
            processor disagree, and the model would misplace its features.

    Source: the Qwen2-VL image processor (``image_grid_thw``; ``t * h * w / merge_size ** 2`` placeholders).
    """
    from PIL import Image
    pics = []
    for q, img in enumerate(images):
        if image_digest(img.data) != img.digest:
            raise ValueError(f'image {q}: its bytes hash to {image_digest(img.data)}, not {img.digest}; pass the '
                             'bytes the record names')
        with Image.open(io.BytesIO(img.data)) as im:
            pics.append(im.convert('RGB'))
    out = processor(images=pics, return_tensors='pt')
    grid = out['image_grid_thw'].long()
    merge = int(getattr(processor, 'merge_size', 1) or 1)
    for q, (img, g) in enumerate(zip(images, grid.tolist())):
        n = placeholder_count(g, merge)
        if n != int(img.length):
            raise ValueError(f'image {q} ({img.digest}): the record holds {img.length} placeholder ids, the '
                             f'processor computes {n} (grid {g}, merge {merge}); the template layer and the '
                             'processor settings disagree')
    return {'pixel_values': out['pixel_values'].float(), 'image_grid_thw': grid}


def rope_positions(model, ids: torch.Tensor, grid: torch.Tensor | None) -> tuple[torch.Tensor, int]:
    """The 3-D rotary positions of one sequence and the offset of the positions after it.

    Args:
        model: a Qwen2-VL-style model (``model.model.get_rope_index``). ids: ``[1, T]`` int64.
        grid: ``[n_images, 3]`` ``image_grid_thw`` (None: no image, text positions).

    Returns:
        ``(position_ids [3, 1, T] int64, delta)``: token ``T + k`` (decoded later) sits at ``T + k + delta`` on
        all three axes.

    Source: transformers ``Qwen2_5_VLModel.get_rope_index``.
    """
    T = ids.shape[1]
    if grid is None or not len(grid):
        return torch.arange(T, device=ids.device).view(1, 1, T).expand(3, 1, T), 0
    mm = (ids == image_token_id(model)).int()
    pos, delta = model.model.get_rope_index(ids, mm, image_grid_thw=grid.to(ids.device))
    return pos, int(delta.reshape(-1)[0])


@torch.no_grad()
def vision_logits(model, ids, inputs: dict | None, rows) -> torch.Tensor:
    """Logits at chosen prediction rows of one sequence with its images, from one forward pass.

    Args:
        model: a Qwen2-VL-style model. ids: ``[T]`` token ids. inputs: :func:`pixel_inputs` of the
            sequence's images (None: none). rows: ``[K]`` positions j whose logits predict ``ids[j + 1]``.

    Returns:
        ``[K, V]`` float32 CPU logits.
    """
    dev = next(model.parameters()).device
    ids = torch.as_tensor(ids, dtype=torch.long, device=dev).view(1, -1)
    grid = None if inputs is None else inputs['image_grid_thw']
    pos, _ = rope_positions(model, ids, grid)
    kwargs = {'input_ids': ids, 'position_ids': pos.to(dev)}
    if inputs is not None:
        kwargs.update(pixel_values=inputs['pixel_values'].to(dev), image_grid_thw=grid.to(dev))
    logits = model(**kwargs).logits[0]
    return logits[torch.as_tensor(rows, dtype=torch.long, device=dev)].float().cpu()
