"""L0: images in the record: their digests, the run's image folder, and a record's ``info['images']`` list.

An image is named by its digest, ``'sha256:' + hex sha256`` of its bytes as received (PNG or JPEG), and
stored once per run at ``RUN/images/<hex>.<ext>`` (written atomically, before the shard that references
it). A record lists its images in ``info['images']``; each entry says where its run of placeholder ids
sits in ``ids`` (``start``, ``length``), the processor's patch grid ``[t, h, w]``, who supplied it
(``owner``: ``'prompt'`` or ``'tool'``) and the processor settings it was cut with. A record without
images has no ``'images'`` key, so its bytes and digest are those it always had.

The grid of an image is plain arithmetic on its size and the processor settings (:func:`vision_grid`), so no
tensor library is needed here; Pillow is imported only to read an image's size (:func:`image_size`).
Source: docs/design.md#images.
"""
from __future__ import annotations

import base64
import binascii
import hashlib
import math
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Mapping

from . import io

__all__ = ['IMAGES_DIR', 'IMAGE_TOKEN_IDS', 'IMAGE_OWNERS', 'ImageRef', 'image_digest', 'image_format',
           'ImageEntryError', 'run_folder', 'images_folder', 'image_path', 'store_image', 'store_images', 'load_image',
           'verify_image', 'parse_images', 'image_token_id', 'record_images', 'has_images', 'referenced_digests',
           'persist_images', 'thumbnail_url', 'THUMB_MAX_BYTES', 'ImageFolder', 'IMAGE_TYPES', 'PROCESSOR_KEYS',
           'decode_image_url', 'encode_image_url', 'image_size', 'vision_grid', 'placeholder_count']

#: The folder of a run that holds its images, one file per digest.
IMAGES_DIR = 'images'
#: The placeholder id of each image processor class agentrl knows (Qwen2-VL, Qwen2.5-VL and Qwen3-VL all use
#: ``<|image_pad|>``, id 151655 of the Qwen vocabulary: tokenizer.json of /work/shared/tokenizers/qwen3).
IMAGE_TOKEN_IDS = {'Qwen2VLImageProcessor': 151655, 'Qwen2VLImageProcessorFast': 151655,
                   'Qwen2VLImageProcessorPil': 151655}
#: Who may supply an image: the prompt (a user message) or a tool result.
IMAGE_OWNERS = ('prompt', 'tool')
#: Image formats accepted in a ``data:`` URL, by MIME type, and the file extension each is stored with.
IMAGE_TYPES = {'image/png': 'png', 'image/jpeg': 'jpg', 'image/jpg': 'jpg'}
#: Processor settings an :class:`ImageRef` records (what the placeholder count depends on, and the pixels).
PROCESSOR_KEYS = ('class', 'patch_size', 'merge_size', 'temporal_patch_size', 'min_pixels', 'max_pixels',
                  'image_mean', 'image_std')
_MAGIC = ((b'\x89PNG\r\n\x1a\n', 'png'), (b'\xff\xd8\xff', 'jpg'))
_DIGEST_RE = re.compile(r'^sha256:([0-9a-f]{64})$')
_SHARD_RE = re.compile(r'^part-\d{6,}\.parquet$')
_KEYS = ('digest', 'start', 'length', 'grid', 'owner', 'processor')
_PROCESSOR_INTS = ('patch_size', 'merge_size', 'temporal_patch_size', 'min_pixels', 'max_pixels')


def image_digest(data: bytes) -> str:
    """``'sha256:' + hex sha256`` of ``data`` (the image's bytes as received). Raises nothing."""
    return 'sha256:' + hashlib.sha256(data).hexdigest()


def image_format(data: bytes) -> str:
    """The file extension of an image's bytes: ``'png'`` or ``'jpg'``, read from its first bytes.

    Raises:
        ValueError: neither PNG nor JPEG (fix: send PNG or JPEG bytes).
    """
    for magic, ext in _MAGIC:
        if data[:len(magic)] == magic:
            return ext
    raise ValueError(f'image bytes start with {bytes(data[:8])!r}, neither PNG nor JPEG; send the image as PNG or JPEG')


def _hex(digest: str) -> str:
    m = _DIGEST_RE.match(digest) if isinstance(digest, str) else None
    if m is None:
        raise ValueError(f"image digest {digest!r} is not 'sha256:' followed by 64 lower-case hex digits; "
                         'name images by agentrl.images.image_digest(bytes)')
    return m.group(1)


def run_folder(path: str | os.PathLike) -> Path:
    """The run folder a trajectory path belongs to: the folder whose ``images/`` holds its images.

    ``RUN`` (a folder with ``run.json``, ``trajectories/`` or ``images/``) is itself; a shard folder
    ``RUN/trajectories`` or any folder of shards gives its parent; a shard file ``D/part-NNNNNN.parquet`` gives ``D``'s parent;
    any other file (``RUN/trajectories.parquet``) gives its folder. Raises nothing (the path need not exist).
    """
    p = Path(path)
    if p.is_dir():
        own = (p / 'run.json').is_file() or (p / 'trajectories').is_dir() or (p / IMAGES_DIR).is_dir()
        return p if own else p.parent
    if _SHARD_RE.match(p.name):
        return p.parent.parent
    return p.parent


def images_folder(path: str | os.PathLike) -> Path:
    """``run_folder(path) / 'images'``: where the images of the records at ``path`` are stored. Raises nothing."""
    return run_folder(path) / IMAGES_DIR


def image_path(run: str | os.PathLike, digest: str) -> Path | None:
    """The stored file of ``digest`` in the run folder ``run`` (``RUN/images/<hex>.png`` or ``.jpg``), or None.

    Raises:
        ValueError: ``digest`` is not ``'sha256:<64 hex>'``.
    """
    hx = _hex(digest)
    for _, ext in _MAGIC:
        f = Path(run) / IMAGES_DIR / f'{hx}.{ext}'
        if f.is_file():
            return f
    return None


def store_image(run: str | os.PathLike, data: bytes, *, digest: str | None = None,
                fsync: bool = True) -> tuple[str, bool]:
    """Store an image's bytes in the run folder ``run`` once: ``RUN/images/<hex>.<ext>``, written atomically.

    Args:
        run: the run folder (created with its ``images/`` when missing).
        data: the image's bytes as received (PNG or JPEG).
        digest: the name the caller gave the image; refused when it is not the digest of ``data``.
        fsync: flush the file and the folder (default True).

    Returns:
        ``(digest, written)``: written is False when the run already held the image (nothing is written).

    Raises:
        ValueError: ``data`` is neither PNG nor JPEG, or ``digest`` does not name ``data`` (naming both digests).
    """
    ext = image_format(data)
    got = image_digest(data)
    if digest is not None and digest != got:
        raise ValueError(f'images[{digest!r}]: the bytes given hash to {got!r}; key each image by '
                         'agentrl.images.image_digest of its bytes')
    if image_path(run, got) is not None:
        return got, False
    folder = Path(run) / IMAGES_DIR
    folder.mkdir(parents=True, exist_ok=True)
    try:
        io.atomic_write(folder / f'{got[len("sha256:"):]}.{ext}', data, fsync=fsync, overwrite=False)
    except FileExistsError:          # another writer stored the same bytes first
        return got, False
    return got, True


def store_images(run: str | os.PathLike, images: Mapping[str, bytes] | None, *, fsync: bool = True) -> int:
    """Store every ``digest -> bytes`` of ``images`` in the run folder ``run`` (:func:`store_image`).

    Returns:
        how many files were written (images the run already held are not written again).

    Raises:
        ValueError: as :func:`store_image` (a key that is not its bytes' digest, bytes neither PNG nor JPEG).
    """
    return sum(store_image(run, data, digest=d, fsync=fsync)[1] for d, data in (images or {}).items())


def verify_image(run: str | os.PathLike, digest: str) -> str | None:
    """Why the stored file of ``digest`` cannot be used, or None when its bytes hash to ``digest``.

    Reads the file in 1 MiB blocks (memory does not grow with the image). Returns one of
    ``'is not in RUN/images'`` or ``"hashes to 'sha256:...'"``, worded for a refusal.

    Raises:
        ValueError: ``digest`` is not ``'sha256:<64 hex>'``.
    """
    f = image_path(run, digest)
    if f is None:
        return f'is not in {str(Path(run) / IMAGES_DIR)!r}'
    h = hashlib.sha256()
    with open(f, 'rb') as fh:
        for block in iter(lambda: fh.read(1 << 20), b''):
            h.update(block)
    got = 'sha256:' + h.hexdigest()
    return None if got == digest else f'is stored as {f.name!r}, whose bytes hash to {got!r}'


def load_image(run: str | os.PathLike, digest: str) -> bytes:
    """The bytes of the image ``digest`` stored in the run folder ``run``, verified against the digest.

    Raises:
        FileNotFoundError: the run does not hold it (fix: store it with the records that reference it).
        ValueError: the stored bytes do not hash to ``digest`` (the file was changed after it was written),
            or ``digest`` is malformed.
    """
    f = image_path(run, digest)
    if f is None:
        raise FileNotFoundError(f'image {digest!r} is not in {str(Path(run) / IMAGES_DIR)!r}; store it with the '
                                'records that reference it (ShardWriter.write(records, images=...))')
    data = f.read_bytes()
    if image_digest(data) != digest:
        raise ValueError(f'{str(f)!r}: its bytes hash to {image_digest(data)!r}, not {digest!r}; the file was '
                         'changed after it was written: restore it from the run that recorded it')
    return data


@dataclass(frozen=True)
class ImageRef:
    """One entry of ``info['images']``.

    Attributes:
        digest: ``'sha256:<hex>'`` of the image's bytes.
        start: index in ``ids`` of the first placeholder id of the image's run.
        length: number of placeholder ids; ``t * h * w // merge_size ** 2``.
        grid: ``(t, h, w)``, the processor's patch grid (temporal, height, width patches).
        owner: ``'prompt'`` or ``'tool'`` (who supplied the image; owns its placeholder ids).
        processor: ``{'class', 'patch_size', 'merge_size', 'temporal_patch_size', 'min_pixels', 'max_pixels',
            'image_mean', 'image_std'}`` as given.
    """
    digest: str
    start: int
    length: int
    grid: tuple
    owner: str
    processor: dict

    @property
    def merge_size(self) -> int:
        """The processor's spatial merge size (patches per placeholder side)."""
        return int(self.processor['merge_size'])

    @property
    def expected_length(self) -> int:
        """``t * h * w // merge_size ** 2``: the placeholder ids the grid needs."""
        t, h, w = self.grid
        return t * h * w // self.merge_size ** 2

    def to_dict(self) -> dict:
        """The stored form (the ``info['images']`` entry)."""
        return {'digest': self.digest, 'start': self.start, 'length': self.length, 'grid': list(self.grid),
                'owner': self.owner, 'processor': dict(self.processor)}

    @classmethod
    def from_dict(cls, d) -> 'ImageRef':
        """The inverse of :meth:`to_dict`.

        Raises:
            ImageEntryError: a missing key or a wrong type (names ``info.images.KEY``).
        """
        return parse_images([d])[0]


def _int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


class ImageEntryError(ValueError):
    """A malformed ``info['images']`` entry. Attributes: index (the entry, or None for the whole list), key
    (the key at fault, '' for the entry), what (in words); the message is ``info.images[i].KEY WHAT``."""

    def __init__(self, index: int | None, key: str, what: str):
        self.index, self.key, self.what = index, key, what
        where = 'info.images' + ('' if index is None else f'[{index}]') + (f'.{key}' if key else '')
        super().__init__(f'{where} {what}')


def _entry_problem(e) -> tuple[str, str] | None:
    """``(key, what)`` of the first malformed key of one ``info['images']`` entry, or None."""
    if not isinstance(e, dict):
        return '', f'is a {type(e).__name__}, not a dict with keys {list(_KEYS)}'
    missing = [k for k in _KEYS if k not in e]
    if missing:
        return missing[0], 'is missing'
    try:
        _hex(e['digest'])
    except ValueError:
        return 'digest', f"is {e['digest']!r}, not 'sha256:' followed by 64 lower-case hex digits"
    for k in ('start', 'length'):
        if not (_int(e[k]) and e[k] >= 0):
            return k, f'is {e[k]!r}, not an int >= 0'
    g = e['grid']
    if not (isinstance(g, list) and len(g) == 3 and all(_int(x) and x >= 1 for x in g)):
        return 'grid', f'is {g!r}, not [t, h, w] of ints >= 1'
    if e['owner'] not in IMAGE_OWNERS:
        return 'owner', f'is {e["owner"]!r}, not one of {list(IMAGE_OWNERS)} (who supplied the image)'
    p = e['processor']
    if not isinstance(p, dict) or not isinstance(p.get('class'), str):
        return 'processor', "is not a dict with the processor's 'class' name"
    for k in _PROCESSOR_INTS:
        if not (_int(p.get(k)) and p[k] >= 1):
            return f'processor.{k}', f'is {p.get(k)!r}, not an int >= 1'
    for k in ('image_mean', 'image_std'):
        if not (isinstance(p.get(k), list) and all(isinstance(x, (int, float)) for x in p[k])):
            return f'processor.{k}', f'is {p.get(k)!r}, not a list of numbers'
    return None


def parse_images(value) -> list[ImageRef]:
    """The :class:`ImageRef` list of an ``info['images']`` value (None or absent: no images).

    Raises:
        ImageEntryError: (a ValueError) ``value`` is not a list, or an entry lacks a key or holds a wrong type;
            the message names ``info.images[i].KEY`` and the expected form.
    """
    if value is None:
        return []
    if not isinstance(value, list):
        raise ImageEntryError(None, '', f'is a {type(value).__name__}, not a list of image entries')
    out = []
    for i, e in enumerate(value):
        bad = _entry_problem(e)
        if bad is not None:
            raise ImageEntryError(i, *bad)
        out.append(ImageRef(e['digest'], e['start'], e['length'], tuple(e['grid']), e['owner'], dict(e['processor'])))
    return out


def has_images(info) -> bool:
    """True when a record's ``info`` lists images (an ``'images'`` key). Raises nothing."""
    return isinstance(info, dict) and 'images' in info


def image_token_id(ref: ImageRef, override: int | None = None) -> int:
    """The placeholder id of ``ref``'s processor: ``override`` when given, else :data:`IMAGE_TOKEN_IDS`.

    Raises:
        ValueError: the processor class is not in :data:`IMAGE_TOKEN_IDS` and no override is given (fix: pass
            the model's image placeholder id, ``agentrl check --image-token-id ID``).
    """
    if override is not None:
        return int(override)
    cls = ref.processor.get('class')
    if cls not in IMAGE_TOKEN_IDS:
        raise ValueError(f'processor.class {cls!r} has no known image placeholder id (known: '
                         f'{sorted(IMAGE_TOKEN_IDS)}); pass the model\'s placeholder id with --image-token-id ID')
    return IMAGE_TOKEN_IDS[cls]


def record_images(record, run: str | os.PathLike) -> list[bytes]:
    """The bytes of each image of ``record`` (``info['images']`` order), loaded from the run folder and verified.

    Args:
        record: a :class:`~agentrl.record.Trajectory` (anything with ``info``).
        run: its run folder, or any trajectory path of the run (:func:`run_folder`).

    Returns:
        list of bytes, empty for a record without images.

    Raises:
        ValueError, FileNotFoundError: a malformed ``info['images']`` (:func:`parse_images`), or an image
            missing or changed (:func:`load_image`).
    """
    folder = run_folder(run)
    return [load_image(folder, ref.digest) for ref in parse_images((record.info or {}).get('images'))]


def referenced_digests(records: Iterable) -> list[str]:
    """The distinct image digests the records' ``info['images']`` name, in first-seen order (malformed entries
    skipped: the check words them). Raises nothing."""
    seen: dict = {}
    for r in records:
        imgs = (getattr(r, 'info', None) or {}).get('images')
        for e in imgs if isinstance(imgs, list) else ():
            if isinstance(e, dict) and isinstance(e.get('digest'), str):
                seen.setdefault(e['digest'], None)
    return list(seen)



def persist_images(run: str | os.PathLike, records: Iterable, images: Mapping[str, bytes] | None, *,
                   fsync: bool = True) -> int:
    """Store ``images`` in the run folder, then make sure every image the records name is stored.

    The writers call it before the shard (or file) that names the images, so a committed record never
    names an image its run lacks (docs/design.md#storage).

    Args:
        run: the run folder. records: the records about to be written. images: ``digest -> bytes`` (or None).
        fsync: as :func:`store_image`.

    Returns:
        how many image files were written.

    Raises:
        ValueError: as :func:`store_images`; or a record names an image that is neither in ``images`` nor
            in ``RUN/images`` (naming the record, the entry and the digest).
    """
    written = store_images(run, images, fsync=fsync)
    records = list(records)
    for d in referenced_digests(records):
        if (images is None or d not in images) and _DIGEST_RE.match(d) and image_path(run, d) is None:
            i, k = next((i, k) for i, r in enumerate(records)
                        for k, e in enumerate((r.info or {}).get('images') or ()) if isinstance(e, dict)
                        and e.get('digest') == d)
            raise ValueError(f'record {i} info.images[{k}].digest {d!r} is neither in images= nor stored in '
                             f'{str(Path(run) / IMAGES_DIR)!r}; pass its bytes: write(records, images={{digest: bytes}})')
    return written


#: The largest thumbnail a page embeds, in bytes of PNG (its ``data:`` URL is a third longer).
THUMB_MAX_BYTES = 16 << 10


def thumbnail_url(run: str | os.PathLike, digest: str, max_side: int = 96) -> str:
    """A small ``data:image/png;base64,...`` (or ``image/jpeg``) URL of a stored image, for pages that fetch nothing.

    With Pillow installed the image is scaled to at most ``max_side`` pixels a side and written as PNG; without
    it the stored bytes are used as they are when they are at most :data:`THUMB_MAX_BYTES`. Returns ``''`` when
    the run lacks the image, its bytes do not match ``digest``, or no thumbnail under the bound can be made.
    Raises nothing.
    """
    import base64
    try:
        data = load_image(run, digest)
    except (OSError, ValueError):
        return ''
    try:
        from PIL import Image
    except ImportError:
        Image = None
    if Image is not None:
        from io import BytesIO
        try:
            with Image.open(BytesIO(data)) as im:
                im = im.convert('RGB')
                im.thumbnail((max_side, max_side))
                buf = BytesIO()
                im.save(buf, format='PNG', optimize=True)
            data = buf.getvalue()
        except (OSError, ValueError):
            return ''
    if len(data) > THUMB_MAX_BYTES:
        return ''
    mime = 'png' if image_format(data) == 'png' else 'jpeg'
    return f'data:image/{mime};base64,' + base64.b64encode(data).decode('ascii')


class ImageFolder:
    """A run's stored images (``RUN/images/<hex>.<ext>``; ``run`` as :func:`run_folder` takes it) as a read-only
    mapping digest -> bytes (:func:`load_image`).

    Each read checks the bytes against the digest that names them.

    Raises (on ``folder[digest]``):
        KeyError: no file for that digest (names the folder). ValueError: the file's bytes hash to another
            digest (edited after writing).
    """

    def __init__(self, run):
        self.run = run_folder(run)

    def __contains__(self, digest) -> bool:
        return image_path(self.run, digest) is not None

    def __getitem__(self, digest: str) -> bytes:
        try:
            return load_image(self.run, digest)
        except FileNotFoundError as e:
            raise KeyError(str(e)) from None


def encode_image_url(data: bytes) -> str:
    """``data:image/png;base64,...`` (or ``image/jpeg``) of an image's bytes as they are: the inverse of
    :func:`decode_image_url`.

    Raises:
        ValueError: bytes that are neither PNG nor JPEG (:func:`image_format`).
    """
    mime = 'image/png' if image_format(data) == 'png' else 'image/jpeg'
    return f'data:{mime};base64,' + base64.b64encode(data).decode('ascii')


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
