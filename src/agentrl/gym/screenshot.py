"""A gym observation drawn as a picture: text in, PNG bytes out (the BugFix screenshot mode).

The text is drawn black on white with Pillow's built-in bitmap font (``ImageFont.load_default_imagefont``:
fixed 6 x 11 px cells, no font file, no anti-aliasing), one line per text line, so the same text gives the
same pixels and, PNG being lossless with no metadata written, the same bytes and digest on every run.
Both sides are multiples of ``factor`` (a Qwen2-VL processor's ``patch_size * merge_size``, 28 px) and the
area lies within the processor's pixel bounds, so the processor keeps the image at its size
(:func:`agentrl.images.vision_grid` is the identity on it). Source: docs/design.md#images.
"""
from __future__ import annotations

import io

__all__ = ['SCREENSHOT_MAX_SIDE', 'CELL', 'MARGIN', 'screenshot_size', 'render_screenshot']

#: The largest side of a screenshot in pixels (16 merged patches of 28 px).
SCREENSHOT_MAX_SIDE = 448
#: ``(width, height)`` of one character cell of the font, in pixels (11 px glyphs, 1 px between lines).
CELL = (6, 12)
#: Blank pixels around the text.
MARGIN = 4


def _lines(text: str, columns: int) -> list[str]:
    """``text``'s lines with tabs as 4 spaces, each cut into pieces of at most ``columns`` characters."""
    out = []
    for line in str(text).expandtabs(4).split('\n'):
        out += [line[i:i + columns] for i in range(0, len(line), columns)] or ['']
    return out


def screenshot_size(text: str, *, max_pixels: int, min_pixels: int = 0, factor: int = 28,
                    max_side: int = SCREENSHOT_MAX_SIDE) -> tuple[int, int, list[str]]:
    """The picture's ``(width, height)`` in pixels and the lines it shows.

    The width fits the longest line (lines longer than ``max_side`` allows wrap); the height fits every
    line, cut to what ``max_pixels`` and ``max_side`` leave (the lines below the cut are not shown). Both
    sides are rounded up to multiples of ``factor``, at least ``2 * factor``, then the height grows until
    the area reaches ``min_pixels``.

    Args:
        text: the observation. max_pixels, min_pixels: the processor's area bounds in pixels.
        factor: side multiple in pixels (``patch_size * merge_size``). max_side: the largest side.

    Raises:
        ValueError: bounds that leave no room for a ``2 * factor`` square (names them).
    """
    lo_side = 2 * factor
    max_side = max_side // factor * factor
    if max_side < lo_side or max_pixels < lo_side * lo_side or min_pixels > max_side * max_side:
        raise ValueError(f'screenshot: max_side {max_side}, pixel bounds [{min_pixels}, {max_pixels}] leave no room '
                         f'for a {lo_side}x{lo_side} picture; use a processor with max_pixels >= {lo_side * lo_side}')
    cw, ch = CELL
    lines = _lines(text, (max_side - 2 * MARGIN) // cw)

    def up(px: int) -> int:
        return min(max_side, max(lo_side, -(-px // factor) * factor))

    width = up(2 * MARGIN + cw * max(len(s) for s in lines))
    height = up(2 * MARGIN + ch * len(lines))
    room = max_pixels // width // factor * factor           # the tallest height max_pixels allows at this width
    while room < lo_side:                                    # a narrower picture (lines cut at its edge)
        width -= factor
        room = max_pixels // width // factor * factor
    height = min(height, room)
    while width * height < min_pixels:
        height += factor
    shown = max(1, (height - 2 * MARGIN) // ch)
    return width, height, lines[:shown]


def render_screenshot(text: str, *, max_pixels: int, min_pixels: int = 0, factor: int = 28,
                      max_side: int = SCREENSHOT_MAX_SIDE) -> bytes:
    """PNG bytes of ``text`` drawn in the fixed bitmap font (sized by :func:`screenshot_size`).

    Returns:
        an 8-bit grayscale PNG, ``width x height`` pixels, both multiples of ``factor``; equal bytes for
        equal text and arguments.

    Raises:
        ImportError: Pillow is not installed (``pip install pillow``). ValueError: as :func:`screenshot_size`.
    """
    try:
        from PIL import Image, ImageDraw, ImageFont
    except ImportError as e:  # pragma: no cover - depends on the install
        raise ImportError('screenshots need Pillow: pip install pillow') from e
    width, height, lines = screenshot_size(text, max_pixels=max_pixels, min_pixels=min_pixels, factor=factor,
                                           max_side=max_side)
    font = ImageFont.load_default_imagefont()
    im = Image.new('L', (width, height), 255)
    draw = ImageDraw.Draw(im)
    for k, line in enumerate(lines):
        draw.text((MARGIN, MARGIN + k * CELL[1]), line, fill=0, font=font)
    buf = io.BytesIO()
    im.save(buf, format='PNG', optimize=False, compress_level=9)
    return buf.getvalue()
