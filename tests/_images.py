"""Small images for the image tests, made here with the standard library (zlib): the main venv has no Pillow.
The interop tests (tests/interop/test_images.py) read these PNGs back with Pillow."""
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
