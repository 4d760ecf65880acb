"""Small images for the image tests, made here with the standard library (zlib): the main venv has no Pillow.
The interop tests (tests/interop/test_images.py) read these PNGs back with Pillow. Also the check of a record's
image runs that the gateway image tests share (:func:`check_images`)."""
from __future__ import annotations

import struct
import zlib


def _chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack('>I', len(data)) + kind + data + struct.pack('>I', zlib.crc32(kind + data) & 0xffffffff)


def png(width: int, height: int, seed: int = 0, level: int = 6) -> bytes:
    """An RGB PNG of ``width x height`` pixels whose content depends on ``seed`` (distinct seeds, distinct bytes):
    a gradient with a seeded pixel on each row."""
    rows = []
    for y in range(height):
        row = bytearray(((x * 7 + y * 3 + seed * 31 + c * 85) & 0xff) for x in range(width) for c in range(3))
        s = (seed * 17 + y) % width
        row[3 * s:3 * s + 3] = bytes(((seed >> 16) & 0xff, (seed >> 8) & 0xff, seed & 0xff))
        rows.append(b'\x00' + bytes(row))
    ihdr = struct.pack('>IIBBBBB', width, height, 8, 2, 0, 0, 0)
    return (b'\x89PNG\r\n\x1a\n' + _chunk(b'IHDR', ihdr) + _chunk(b'IDAT', zlib.compress(b''.join(rows), level))
            + _chunk(b'IEND', b''))


#: Qwen's ``<|image_pad|>``, ``<|vision_start|>`` and ``<|vision_end|>`` ids (the qwen3 tokenizer's).
PAD, VS, VE = 151655, 151652, 151653


def check_images(t, shots: list, owners: list) -> None:
    """The record's images are the given image bytes, each run of placeholders owned by its supplier, delimiters
    around, none in the loss."""
    from agentrl.images import image_digest
    from agentrl.record import OWNER
    imgs = t.info['images']
    assert [d['digest'] for d in imgs] == [image_digest(s) for s in shots]
    assert [d['owner'] for d in imgs] == owners
    ids, owner = t.ids.tolist(), t.owner.tolist()
    for d in imgs:
        s, n = d['start'], d['length']
        assert n == d['grid'][0] * d['grid'][1] * d['grid'][2] // 4
        assert ids[s - 1:s + n + 1] == [VS] + [PAD] * n + [VE]
        assert owner[s:s + n] == [OWNER[d['owner']]] * n
        assert not t.action_mask[s - 1:s + n].any()
