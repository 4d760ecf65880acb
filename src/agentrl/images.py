"""L0: images in a record: their digest, their data-URL parts, their size and their placeholder count.

An image is named by ``digest`` (``'sha256:'`` + the hex sha256 of its PNG/JPEG bytes as received) and
described in a record by an :class:`ImageSpan` (``info['images']``): the run of placeholder ids it
stands for in ``ids``, its patch grid, who supplied it and the processor settings that sized it.
The grid is plain arithmetic on the image size and the processor settings (:func:`vision_grid`), so no
tensor library is needed here; Pillow is imported only to read an image's size.
"""
from __future__ import annotations

import base64
import binascii
import hashlib
import math
from dataclasses import asdict, dataclass, field

__all__ = ['ImageSpan', 'ImageFolder', 'IMAGE_OWNERS', 'IMAGE_TYPES', 'PROCESSOR_KEYS', 'image_digest',
           'decode_image_url', 'image_size', 'vision_grid', 'placeholder_count', 'run_images_dir']

#: Who may supply an image: the task (user messages) or an environment (tool results).
IMAGE_OWNERS = ('prompt', 'tool')
#: Image formats accepted in a ``data:`` URL, by MIME type, and the file extension each is stored with.
IMAGE_TYPES = {'image/png': 'png', 'image/jpeg': 'jpg', 'image/jpg': 'jpg'}
#: Processor settings an :class:`ImageSpan` records (what the placeholder count depends on, and the pixels).
PROCESSOR_KEYS = ('class', 'patch_size', 'merge_size', 'temporal_patch_size', 'min_pixels', 'max_pixels',
                  'image_mean', 'image_std')


@dataclass
class ImageSpan:
    """One image of a record (an entry of ``info['images']``).

    Attributes:
        digest: ``'sha256:<64 hex>'`` of the image's bytes as received.
        start, length: the run ``ids[start:start + length]`` of placeholder ids (Qwen ``<|image_pad|>``)
            the image stands for; ``length == t * h * w // merge_size ** 2``.
        grid: ``[t, h, w]`` patches (the processor's ``image_grid_thw``).
        owner: ``'prompt'`` (a user message) or ``'tool'`` (a tool result): the owner of its placeholder ids.
        processor: the processor settings (:data:`PROCESSOR_KEYS`).

    Source: docs/design.md#images (placeholders are the supplier's, never in the action mask).
    """
    digest: str
    start: int
    length: int
    grid: list
    owner: str
    processor: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        """The JSON-able dict stored in ``info['images']``."""
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> 'ImageSpan':
        """The inverse of :meth:`to_dict`.

        Raises:
            ValueError: a missing key (named) or an owner outside :data:`IMAGE_OWNERS`.
        """
        missing = [k for k in ('digest', 'start', 'length', 'grid', 'owner') if k not in d]
        if missing:
            raise ValueError(f"info['images'] entry lacks {missing}; each needs digest, start, length, grid, owner")
        if d['owner'] not in IMAGE_OWNERS:
            raise ValueError(f"info['images'] entry owner {d['owner']!r}; use one of {IMAGE_OWNERS}")
        return cls(str(d['digest']), int(d['start']), int(d['length']), [int(x) for x in d['grid']], d['owner'],
                   dict(d.get('processor') or {}))


class ImageFolder:
    """A run's stored images (``RUN/images/<hex>.<ext>``) as a read-only mapping digest -> bytes.

    Each read checks the bytes against the digest that names them.

    Raises (on ``folder[digest]``):
        KeyError: no file for that digest (names the folder). ValueError: the file's bytes hash to another
            digest (edited after writing).
    """

    def __init__(self, folder):
        from pathlib import Path
        self.folder = Path(folder)

    def _path(self, digest: str):
        hexd = str(digest).removeprefix('sha256:')
        for ext in sorted(set(IMAGE_TYPES.values())):
            p = self.folder / f'{hexd}.{ext}'
            if p.is_file():
                return p
        return None

    def __contains__(self, digest) -> bool:
        return self._path(digest) is not None

    def __getitem__(self, digest: str) -> bytes:
        p = self._path(digest)
        if p is None:
            raise KeyError(f'no image {digest} in {str(self.folder)!r} (RUN/images/<hex>.png or .jpg)')
        data = p.read_bytes()
        if image_digest(data) != digest:
            raise ValueError(f'{p} hashes to {image_digest(data)}, not {digest}: the stored image was changed')
        return data


def run_images_dir(path):
    """The ``images/`` folder of the run a trajectory path belongs to (``PATH/images``, else beside ``PATH``), or None."""
    from pathlib import Path
    p = Path(path)
    for cand in (p / 'images', p.parent / 'images'):
        if cand.is_dir():
            return cand
    return None


def image_digest(data: bytes) -> str:
    """``'sha256:'`` + the hex sha256 of ``data`` (the bytes as received, never re-encoded)."""
    return 'sha256:' + hashlib.sha256(data).hexdigest()


def decode_image_url(url, where: str = 'image_url') -> tuple[bytes, str]:
    """The bytes and file extension of a ``data:image/png;base64,...`` (or ``image/jpeg``) URL.

    Raises:
        ValueError: an ``http(s)`` URL (agentrl does not fetch images: send the bytes as a data URL), another
            scheme, a MIME type outside :data:`IMAGE_TYPES`, a data URL that is not base64, or bad base64;
            each names ``where``.

    Source: the OpenAI chat format's ``image_url`` part (``{"url": "data:image/png;base64,..."}``).
    """
    if not isinstance(url, str):
        raise ValueError(f'{where}["url"] must be a string data URL, got {type(url).__name__}')
    if url.startswith(('http://', 'https://')):
        raise ValueError(f'{where}["url"] is an http(s) URL: agentrl does not fetch images (the record must hold '
                         'the bytes the model saw); send the image as data:image/png;base64,...')
    if not url.startswith('data:'):
        raise ValueError(f'{where}["url"] is not a data: URL; send the image as data:image/png;base64,...')
    head, sep, payload = url[5:].partition(',')
    mime, _, enc = head.partition(';')
    if not sep or enc != 'base64':
        raise ValueError(f'{where}["url"] is a data URL without ";base64,"; send data:image/png;base64,...')
    if mime.lower() not in IMAGE_TYPES:
        raise ValueError(f'{where}["url"] has MIME type {mime!r}; send one of {sorted(set(IMAGE_TYPES))}')
    try:
        data = base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError) as e:
        raise ValueError(f'{where}["url"] holds bad base64 ({e}); encode the image bytes with base64') from e
    return data, IMAGE_TYPES[mime.lower()]


def image_size(data: bytes, where: str = 'image') -> tuple[int, int]:
    """``(width, height)`` in pixels of PNG/JPEG ``data`` (Pillow reads the header only).

    Raises:
        ImportError: Pillow is not installed (``pip install pillow``).
        ValueError: ``data`` is not an image Pillow can read (names ``where``).
    """
    import io
    try:
        from PIL import Image, UnidentifiedImageError
    except ImportError as e:  # pragma: no cover - depends on the install
        raise ImportError('images need Pillow: pip install pillow') from e
    try:
        with Image.open(io.BytesIO(data)) as im:
            return int(im.size[0]), int(im.size[1])
    except (UnidentifiedImageError, OSError) as e:
        raise ValueError(f'{where} is not a PNG or JPEG image Pillow can read ({e})') from e


def vision_grid(width: int, height: int, settings: dict) -> list:
    """``[t, h, w]`` patches a Qwen2-VL-style processor makes of a ``width x height`` image.

    The image is resized so that both sides are multiples of ``patch_size * merge_size``, the area lies within
    ``[min_pixels, max_pixels]`` and the aspect ratio is kept as closely as possible (rounding to the
    nearest multiple; scaling down with floor and up with ceil when the area is out of range); then
    ``h = height' / patch_size``, ``w = width' / patch_size`` and ``t = 1`` (one still image fills one
    temporal patch).

    Args:
        width, height: pixels (>= 1). settings: ``patch_size``, ``merge_size``, ``min_pixels``, ``max_pixels``.

    Raises:
        ValueError: an aspect ratio over 200 (the processor refuses it too), or a missing setting.

    Source: transformers ``smart_resize`` of ``Qwen2VLImageProcessor`` (checked against the processor in
    tests/test_images_model.py).
    """
    try:
        patch, merge = int(settings['patch_size']), int(settings['merge_size'])
        lo, hi = int(settings['min_pixels']), int(settings['max_pixels'])
    except KeyError as e:
        raise ValueError(f'image processor settings lack {e.args[0]!r}; give patch_size, merge_size, min_pixels, '
                         'max_pixels') from e
    if max(width, height) / min(width, height) > 200:
        raise ValueError(f'a {width}x{height} image has an aspect ratio over 200, which the processor refuses')
    f = patch * merge
    h, w = round(height / f) * f, round(width / f) * f
    if h * w > hi:
        beta = math.sqrt(height * width / hi)
        h, w = max(f, math.floor(height / beta / f) * f), max(f, math.floor(width / beta / f) * f)
    elif h * w < lo:
        beta = math.sqrt(lo / (height * width))
        h, w = math.ceil(height * beta / f) * f, math.ceil(width * beta / f) * f
    return [1, h // patch, w // patch]


def placeholder_count(grid, merge_size: int) -> int:
    """Placeholder ids an image of ``grid`` ``[t, h, w]`` stands for: ``t * h * w // merge_size ** 2``."""
    t, h, w = (int(x) for x in grid)
    return t * h * w // (int(merge_size) ** 2)
