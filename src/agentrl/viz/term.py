"""Terminal view of a strip with ``rich``: coloured tokens, the mask rule under them, 80 columns.

Tokens are packed greedily into lines of at most ``width`` columns and never broken across
lines (a single token wider than a line is shortened with an ellipsis). Under every token line
a rule line marks the stored action mask: ``━`` (blue) under mask-1 tokens, ``─`` (dim) under
mask-0 tokens, red ``━`` where the mask disagrees with the owner. A ``│k`` unit marks the start
of turn k; a folded run prints as one ``[… N tool tokens]`` unit, an image's run of placeholder ids as one
``[image K · N prompt tokens · sha256:…]`` unit. Each line starts with the
position of its first token.
"""
from __future__ import annotations

from rich.cells import cell_len
from rich.text import Text

from ..io import printable
from .strip import Strip, display_text

__all__ = ['term_lines', 'print_strip', 'OWNER_STYLE', 'printable']

OWNER_STYLE = {'policy': 'bold white on blue', 'tool': 'black on grey85', 'prompt': 'underline green',
               'template': 'grey50'}
GUTTER = 6       # '  123 ' : position of the line's first token


def _fit(text: str, room: int) -> str:
    if cell_len(text) <= room:
        return text
    out = ''
    for ch in text:
        if cell_len(out + ch) > room - 1:
            break
        out += ch
    return out + '\u2026'


def _units(strip: Strip, room: int):
    """Groups of layout units; a line never breaks inside a group (a turn mark sticks to its token).

    A unit is ``(text, style, rule_text, rule_style, pos)``.
    """
    pending = []
    for seg in strip.segments:
        if seg.turn_start:
            t = f'\u2502{seg.turn}'
            pending.append((t, 'bold magenta', ' ' * cell_len(t), '', seg.start))
        if seg.image:
            masked = any(c.mask for c in strip.cells[seg.start:seg.stop])
            t = _fit(f'[image {seg.image["index"]} \u00b7 {len(seg)} {seg.owner} tokens \u00b7 '
                     f'{seg.image["digest"][:19]}\u2026]', room - 8)
            yield pending + [(t, OWNER_STYLE.get(seg.owner, '') + ' italic', ('\u2501' if masked else '\u2500') * cell_len(t),
                              'bold red' if masked else 'grey50', seg.start)]
            pending = []
            continue
        if seg.folded:
            t = _fit(f'[\u2026 {len(seg)} {seg.owner} tokens]', room - 8)
            yield pending + [(t, OWNER_STYLE.get(seg.owner, '') + ' italic', '\u2500' * cell_len(t), 'grey50',
                              seg.start)]
            pending = []
            continue
        for c in strip.cells[seg.start:seg.stop]:
            t = _fit(display_text(c.text), room - 8)
            n = cell_len(t)
            if c.mask is None:
                rule, rs = ' ' * n, ''
            elif c.mask_mismatch:
                rule, rs = '\u2501' * n, 'bold red'
            elif c.mask:
                rule, rs = '\u2501' * n, 'bold blue'
            else:
                rule, rs = '\u2500' * n, 'grey50'
            style = OWNER_STYLE.get(c.owner, 'red')
            if c.mark:
                style += ' reverse'
            yield pending + [(t, style, rule, rs, c.pos)]
            pending = []


def term_lines(strip: Strip, width: int = 80) -> list:
    """Lay the strip out as rich ``Text`` lines (token line, rule line, token line, ...).

    Args:
        strip: from :func:`~agentrl.viz.build_strip`.
        width: terminal columns (>= 20); no line is wider.

    Returns:
        list of ``rich.text.Text``, alternately tokens and mask rule.
    """
    width = max(int(width), 20)
    room = width - GUTTER
    lines, cur = [], []

    def flush():
        if not cur:
            return
        top, bottom = Text(f'{cur[0][4]:>{GUTTER - 1}} ', style='grey50'), Text(' ' * GUTTER)
        for k, (t, s, r, rs, _) in enumerate(cur):
            if k:
                top.append(' ')
                bottom.append(' ')
            top.append(t, style=s)
            bottom.append(r, style=rs)
        top.rstrip()
        bottom.rstrip()
        lines.extend([top, bottom])

    used = 0
    for group in _units(strip, room):
        n = sum(cell_len(u[0]) for u in group) + len(group) - 1
        if cur and used + 1 + n > room:
            flush()
            cur, used = [], 0
        used += (1 if cur else 0) + n
        cur.extend(group)
    flush()
    return lines


def print_strip(strip: Strip, console, width: int | None = None, header: str | None = None) -> None:
    """Print a header, the legend and the strip to a rich ``Console`` within ``width`` columns.

    Text from the record (header, title, facts, token texts) is passed through
    :func:`agentrl.io.printable` / :func:`~agentrl.viz.display_text`: escape and control
    characters in data never reach the terminal.
    """
    width = width or min(console.width, 120)
    head = Text(printable(header or strip.title), style='bold')
    facts = printable(' \u00b7 '.join(f'{k} {v:.3g}' if isinstance(v, float) else f'{k} {v}'
                                       for k, v in strip.meta.items() if k in ('T', 'actions', 'reward', 'stop', 'turns')))
    console.print(head, Text(' ' + facts, style='grey50'), sep='', width=width, overflow='fold')
    legend = Text()
    for owner in ('template', 'prompt', 'policy', 'tool'):
        legend.append(owner, style=OWNER_STYLE[owner])
        legend.append('  ')
    legend.append('\u2501', style='bold blue')
    legend.append(' mask 1  ')
    legend.append('\u2502k', style='bold magenta')
    legend.append(' turn k')
    console.print(legend, width=width, overflow='fold')
    for line in term_lines(strip, width):
        console.print(line, width=width, no_wrap=True, overflow='ignore', crop=False, soft_wrap=False)
