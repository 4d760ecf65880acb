"""Static SVG figure of a strip (book Figures 5.1 and 5.2), deterministic byte for byte.

Cells are laid out left to right and wrapped into rows of at most ``width`` pixels; a token is
never split across rows. Owner styles follow the book: policy cells blue, tool spans solid
outline, prompt dotted outline, template unboxed. The stored action mask is drawn as a rule under
the cells (thick blue where 1), turn boundaries as a tick with the turn number, and a folded run
(the tool-schema preamble, a long observation) as one dashed box labelled with its size.

Each token is one ``<rect class="cell o-OWNER">`` (so a figure of ``T`` unfolded tokens has ``T``
cells) with a ``<title>`` tooltip. Layout uses a fixed monospace advance (0.6 em), so output
depends only on the record, never on installed fonts.
"""
from __future__ import annotations

from html import escape

from .strip import Strip, display_text

__all__ = ['to_svg', 'STYLE']

FONT = 11                  # px
ADV = 0.6 * FONT           # monospace advance per character, px
PAD_X = 3.0                # text padding inside a cell
GAP = 3.0                  # horizontal gap between cells
CELL_H = 17.0
MAX_CHARS = 14             # longer token texts are shortened with an ellipsis
TOP_BAND = 12.0            # room above a row for turn labels
RULE_GAP = 3.0             # cell bottom -> mask rule
ROW_GAP = 14.0
LEFT = 34.0                # gutter with the row's first position

COLORS = {'policy': ('#dbe8fb', '#1f5fbf', '#0b3d91'), 'tool': ('#ffffff', '#333333', '#222222'),
          'prompt': ('#ffffff', '#666666', '#222222'), 'template': ('none', 'none', '#8a8a8a')}

STYLE = ('text{font-family:"DejaVu Sans Mono",Menlo,Consolas,monospace;font-size:%gpx}'
         '.lbl{font-family:"DejaVu Sans",Helvetica,Arial,sans-serif;font-size:10px;fill:#666}'
         '.ttl{font-family:"DejaVu Sans",Helvetica,Arial,sans-serif;font-size:12px;fill:#222}'
         '.o-policy{fill:#dbe8fb;stroke:#1f5fbf;stroke-width:1.2}'
         '.o-tool{fill:#fff;stroke:#333;stroke-width:1}'
         '.o-prompt{fill:#fff;stroke:#666;stroke-width:1;stroke-dasharray:1.5 1.5}'
         '.o-template{fill:none;stroke:none}'
         '.marked{stroke:#d62728;stroke-width:2}'
         '.t-policy{fill:#0b3d91}.t-tool,.t-prompt{fill:#222}.t-template{fill:#8a8a8a}'
         '.fold{fill:#f7f7f7;stroke:#999;stroke-width:1;stroke-dasharray:4 2}'
         '.m1{stroke:#1f5fbf;stroke-width:3}.m0{stroke:#c8c8c8;stroke-width:1}.mx{stroke:#d62728;stroke-width:3}'
         '.turn{stroke:#888;stroke-width:1}') % FONT


def short_number(x: float) -> str:
    """Fixed, short number formatting (deterministic)."""
    s = f'{x:.1f}'
    return s[:-2] if s.endswith('.0') else s


def _short(text: str) -> str:
    t = display_text(text)
    return t if len(t) <= MAX_CHARS else t[:MAX_CHARS - 1] + '\u2026'


def _items(strip: Strip):
    """Layout units: ('cell', Cell, turn_start) or ('fold', Segment, turn_start)."""
    for seg in strip.segments:
        if seg.folded or seg.image:          # an image's placeholder run: one box, as a folded run
            yield 'fold', seg, seg.turn_start
        else:
            for k, c in enumerate(strip.cells[seg.start:seg.stop]):
                yield 'cell', c, seg.turn_start and k == 0


def _width(kind: str, obj) -> float:
    if kind == 'cell':
        return max(len(_short(obj.text)), 1) * ADV + 2 * PAD_X
    return len(_fold_label(obj)) * ADV + 2 * PAD_X


def _fold_label(seg) -> str:
    if seg.image:
        return f'image {seg.image["index"]} \u00d7 {len(seg)}'
    return f'{seg.owner} \u00d7 {len(seg)} (folded)'


def to_svg(strip: Strip, width: int = 960, title: bool = True, legend: bool = True) -> str:
    """Render a strip as a standalone SVG document (string).

    Args:
        strip: from :func:`~agentrl.viz.build_strip`.
        width: figure width in px; rows wrap at this width.
        title: draw the strip's title and facts above the cells.
        legend: draw the owner legend below.

    Returns:
        SVG text; identical input gives identical bytes.
    """
    inner = width - LEFT - 6
    rows, row, x = [], [], 0.0
    for kind, obj, ts in _items(strip):
        w = _width(kind, obj)
        if row and x + w > inner:
            rows.append(row)
            row, x = [], 0.0
        row.append((kind, obj, ts, x, w))
        x += w + GAP
    if row:
        rows.append(row)

    out = []
    y = 6.0
    if title:
        facts = ' \u00b7 '.join(f'{k} {v:.3g}' if isinstance(v, float) else f'{k} {v}'
                                for k, v in strip.meta.items() if k in ('T', 'actions', 'reward', 'stop'))
        out.append(f'<text class="ttl" x="{short_number(LEFT)}" y="{short_number(y + 11)}">{escape(strip.title)}'
                   f'<tspan class="lbl" dx="10">{escape(facts)}</tspan></text>')
        y += 20
    for row in rows:
        top = y + TOP_BAND
        first = row[0][1]
        first_pos = first.pos if row[0][0] == 'cell' else first.start
        out.append(f'<text class="lbl" x="{short_number(LEFT - 4)}" y="{short_number(top + 12)}" text-anchor="end">{first_pos}</text>')
        rule_y = top + CELL_H + RULE_GAP + 1.5
        for kind, obj, ts, x0, w in row:
            x = LEFT + x0
            if ts:
                tx = x - GAP / 2
                turn = obj.turn
                out.append(f'<line class="turn" x1="{short_number(tx)}" y1="{short_number(top - 9)}" x2="{short_number(tx)}" '
                           f'y2="{short_number(rule_y + 2)}"/><text class="lbl" x="{short_number(tx + 2)}" y="{short_number(top - 2)}">'
                           f't{turn}</text>')
            if kind == 'cell':
                c = obj
                cls = f'cell o-{c.owner}' + (' marked' if c.mark else '')
                tip = (f'pos {c.pos} \u00b7 id {c.id} \u00b7 {c.owner} \u00b7 turn {c.turn} \u00b7 mask '
                       f'{"-" if c.mask is None else c.mask} \u00b7 logp '
                       f'{"-" if c.logp is None else format(c.logp, ".4f")}'
                       + (f' \u00b7 {c.mark}' if c.mark else '') + f'\n{c.text!r}')
                out.append(f'<g><title>{escape(tip)}</title><rect class="{cls}" x="{short_number(x)}" y="{short_number(top)}" '
                           f'width="{short_number(w)}" height="{short_number(CELL_H)}" rx="1.5"/>'
                           f'<text class="t-{c.owner}" x="{short_number(x + w / 2)}" y="{short_number(top + 12)}" '
                           f'text-anchor="middle">{escape(_short(c.text))}</text></g>')
                if c.mask is not None:
                    mcls = 'mx' if c.mask_mismatch else f'm{c.mask}'
                    out.append(f'<line class="{mcls}" x1="{short_number(x - GAP / 2)}" y1="{short_number(rule_y)}" '
                               f'x2="{short_number(x + w + GAP / 2)}" y2="{short_number(rule_y)}"/>')
            else:
                seg = obj
                out.append(f'<g><title>{escape(f"{len(seg)} {seg.owner} tokens, positions {seg.start}-{seg.stop - 1}")}'
                           f'</title><rect class="fold" x="{short_number(x)}" y="{short_number(top)}" width="{short_number(w)}" '
                           f'height="{short_number(CELL_H)}" rx="1.5"/><text class="t-{seg.owner}" x="{short_number(x + w / 2)}" '
                           f'y="{short_number(top + 12)}" text-anchor="middle">{escape(_fold_label(seg))}</text></g>')
                out.append(f'<line class="m0" x1="{short_number(x - GAP / 2)}" y1="{short_number(rule_y)}" '
                           f'x2="{short_number(x + w + GAP / 2)}" y2="{short_number(rule_y)}"/>')
        y = rule_y + ROW_GAP
    if legend:
        lx, ly = LEFT, y + 4
        for owner, label in (('template', 'template'), ('prompt', 'prompt'), ('policy', 'policy'),
                             ('tool', 'tool')):
            out.append(f'<rect class="o-{owner} key" x="{short_number(lx)}" y="{short_number(ly)}" width="22" height="13" rx="1.5"/>'
                       f'<text class="t-{owner}" x="{short_number(lx + 11)}" y="{short_number(ly + 10)}" text-anchor="middle">'
                       f'ab</text><text class="lbl" x="{short_number(lx + 27)}" y="{short_number(ly + 10)}">{label}</text>')
            lx += 27 + len(label) * 6 + 16
        out.append(f'<line class="m1 key" x1="{short_number(lx)}" y1="{short_number(ly + 7)}" x2="{short_number(lx + 22)}" y2="{short_number(ly + 7)}"/>'
                   f'<text class="lbl" x="{short_number(lx + 27)}" y="{short_number(ly + 10)}">action mask = 1</text>')
        lx += 27 + 15 * 6 + 16
        out.append(f'<line class="turn key" x1="{short_number(lx + 2)}" y1="{short_number(ly)}" x2="{short_number(lx + 2)}" y2="{short_number(ly + 13)}"/>'
                   f'<text class="lbl" x="{short_number(lx + 6)}" y="{short_number(ly + 10)}">turn boundary</text>')
        y = ly + 13 + 8
    height = y + 2
    return ('<?xml version="1.0" encoding="UTF-8"?>\n'
            f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{short_number(height)}" '
            f'viewBox="0 0 {width} {short_number(height)}" role="img" aria-label="{escape(strip.title)}: token ownership '
            f'strip, {len(strip.cells)} tokens, {strip.n_policy} policy">\n'
            f'<style>{STYLE}</style>\n<rect width="100%" height="100%" fill="#fff"/>\n'
            + '\n'.join(out) + '\n</svg>\n')
