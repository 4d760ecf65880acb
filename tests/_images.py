"""Small images for the image tests, made here: PNG bytes from the standard library (zlib), and with PIL when
it is installed (the interop venv has it; the main venv may not)."""
from __future__ import annotations

import struct
import zlib


def _chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack('>I', len(data)) + kind + data + struct.pack('>I', zlib.crc32(kind + data) & 0xffffffff)


def png(width: int, height: int, seed: int = 0, level: int = 6) -> bytes:
    """An RGB PNG of ``width x height`` pixels whose content depends on ``seed`` (distinct seeds, distinct bytes):
    horizontal bands with a seeded diagonal stripe, the kind of flat areas a screenshot has."""
    rows = []
    for y in range(height):
        base = bytes(((x * 7 + y * 3 + seed * 31) & 0xff) for x in range(min(width, 256))) * (width // 256 + 1)
        row = bytearray(base[:width * 1]) * 3
        row = bytearray(row[:width * 3])
        s = (seed * 17 + y) % width
        row[3 * s:3 * s + 3] = bytes(((seed >> 16) & 0xff, (seed >> 8) & 0xff, seed & 0xff))
        rows.append(b'\x00' + bytes(row))
    ihdr = struct.pack('>IIBBBBB', width, height, 8, 2, 0, 0, 0)
    return (b'\x89PNG\r\n\x1a\n' + _chunk(b'IHDR', ihdr) + _chunk(b'IDAT', zlib.compress(b''.join(rows), level))
            + _chunk(b'IEND', b''))
