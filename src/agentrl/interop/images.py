"""L4: records with images in the exports: the refusal of trainers without an image path, the images of a row,
and Qwen-VL's 3-D rope positions for verl.

verl and TRL take images beside the token ids (:mod:`agentrl.interop.verl`, :mod:`agentrl.interop.trl`); every other
exporter refuses a record whose info lists images (:func:`refuse_images`): its placeholder ids would train as
text with no pixels behind them. The images of a row are loaded from the run folder (or a ``digest -> bytes``
mapping) and verified against their digests (:func:`row_images`).

Source: docs/design.md#images; the layouts of verl 0.9.1 (``agent_loop.py`` ``_compute_multi_modal_inputs``,
``_compute_position_ids``) and TRL 1.16 (``GRPOTrainer``: the ``images`` column, ``image_grid_thw``, ``num_images``).
"""
from __future__ import annotations

from io import BytesIO
from collections.abc import Mapping

import torch

from ..checks.identity import record_key
from ..images import ImageRef, has_images, image_digest, load_image, parse_images, run_folder

__all__ = ['IMAGE_FORMS', 'refuse_images', 'row_images', 'image_grids', 'mrope_positions']

#: How exported images are given: ``'bytes'`` (the PNG/JPEG bytes as received: what a ``.pt`` file stores) or
#: ``'pil'`` (``PIL.Image.Image`` in RGB, what the trainers' processors take in memory; needs Pillow).
IMAGE_FORMS = ('bytes', 'pil')


def _key(rec, i: int) -> str:
    return f'record {i} ({record_key(rec)})' if rec.provenance is not None else f'record {i}'


def refuse_images(records, caller: str, target: str) -> None:
    """Refuse the first record whose info lists images: ``target`` has no image input in its batch.

    Raises:
        ValueError: one line naming ``caller``, the record, the trainer and the reason (fix: export to verl or
            trl, or leave the records with images out).
    """
    for i, rec in enumerate(records):
        if has_images(rec.info):
            n = len(rec.info['images']) if isinstance(rec.info['images'], list) else 0
            raise ValueError(f'{caller}: {_key(rec, i)} has {n} image(s) (info.images); {target} has no image input '
                             'in its batch, so their placeholder ids would train as text with no pixels behind '
                             'them. Fix: export to verl or trl, or leave the records with images out')


def _refs(rec, end: int) -> list[ImageRef]:
    """The record's images whose placeholder runs lie in ``ids[:end]`` (a trimmed trailing observation drops its own)."""
    return [r for r in parse_images((rec.info or {}).get('images')) if r.start + r.length <= end]


def _bytes_of(ref: ImageRef, images, caller: str, key: str) -> bytes:
    if isinstance(images, Mapping):
        data = images.get(ref.digest)
        if data is None:
            raise ValueError(f'{caller}: {key} image {ref.digest} is not in images=; pass the run folder or every '
                             'digest the records name')
        if image_digest(data) != ref.digest:
            raise ValueError(f'{caller}: images[{ref.digest!r}] hashes to {image_digest(data)!r}; key each image by '
                             'agentrl.images.image_digest of its bytes')
        return data
    return load_image(run_folder(images), ref.digest)


def _pil(data: bytes):
    try:
        from PIL import Image
    except ImportError as e:
        raise ImportError(f"image_form='pil' needs Pillow ({e}); pip install pillow, or export image_form='bytes'") from e
    with Image.open(BytesIO(data)) as im:
        return im.convert('RGB')


def row_images(records, ends: list, images, caller: str, form: str = 'bytes') -> list:
    """Per record, the images of its row (those whose runs lie in ``ids[:ends[i]]``), in ``info['images']`` order.

    Args:
        records: the exported records. ends: per record, one past its last exported token.
        images: the run folder (any trajectory path of the run: :func:`agentrl.images.run_folder`) or a
            ``digest -> bytes`` mapping; None only when no record lists images.
        caller: the exporter's name for messages. form: one of :data:`IMAGE_FORMS`.

    Returns:
        list (one per record) of lists of bytes or PIL images; ``[]`` for a record without images.

    Raises:
        ValueError: an unknown ``form``; records with images and ``images`` None (fix: pass images=RUN); a
            malformed ``info['images']``; an image missing from the mapping or hashing to another digest.
        FileNotFoundError: an image missing from the run folder. ImportError: ``'pil'`` without Pillow.
    """
    if form not in IMAGE_FORMS:
        raise ValueError(f'{caller}: image_form={form!r}; use one of {IMAGE_FORMS}')
    out = []
    for i, (rec, end) in enumerate(zip(records, ends)):
        if not has_images(rec.info):
            out.append([])
            continue
        if images is None:
            raise ValueError(f'{caller}: {_key(rec, i)} lists images (info.images) but no images= was given; pass the '
                             'run folder the records were read from (or a digest -> bytes mapping)')
        got = [_bytes_of(ref, images, caller, _key(rec, i)) for ref in _refs(rec, end)]
        out.append([_pil(b) for b in got] if form == 'pil' else got)
    return out


def image_grids(rec, end: int) -> torch.Tensor:
    """``[n, 3]`` int64 ``image_grid_thw`` of the record's images in ``ids[:end]`` (``[0, 3]`` without images)."""
    refs = _refs(rec, end) if has_images(rec.info) else []
    return torch.tensor([list(r.grid) for r in refs], dtype=torch.long).reshape(-1, 3)


def mrope_positions(rec, end: int) -> torch.Tensor:
    """``[3, end]`` int64 rope positions (temporal, height, width) of ``ids[:end]``, the Qwen2-VL rule for images.

    Text tokens take one position in all three rows, counting on from the last; an image's run of
    ``t * (h/m) * (w/m)`` placeholder ids (``m`` = merge size) takes ``base + (t_i, h_i, w_i)`` over its merged
    grid, with ``base`` the position the next text token would have taken, and the text after it goes on at
    ``base + max(h/m, w/m)`` (transformers 5.10 ``Qwen2VLModel.get_rope_index``, which verl 0.9.1 calls; for an
    image, ``t`` = 1, that is one past the image's largest position). A record without images gets
    ``arange(end)`` in every row.

    Raises:
        ValueError: a malformed ``info['images']`` (the check refuses such records first).
    """
    pos = torch.empty(3, end, dtype=torch.long)
    nxt, cur = 0, 0
    for ref in sorted(_refs(rec, end) if has_images(rec.info) else [], key=lambda r: r.start):
        n = ref.start - cur
        pos[:, cur:ref.start] = torch.arange(nxt, nxt + n)
        nxt += n
        t, h, w = ref.grid[0], ref.grid[1] // ref.merge_size, ref.grid[2] // ref.merge_size
        grid = torch.stack(torch.meshgrid(torch.arange(t), torch.arange(h), torch.arange(w), indexing='ij'))
        pos[:, ref.start:ref.start + ref.length] = grid.reshape(3, -1) + nxt
        nxt += max(h, w)
        cur = ref.start + ref.length
    pos[:, cur:end] = torch.arange(nxt, nxt + end - cur)
    return pos
