"""Small hand-made SVG charts for the run report (no plotting library, no network).

Each function returns one standalone ``<svg>`` element as a string; output is deterministic.
"""
from __future__ import annotations

import math
from html import escape

from .svg import short_number

__all__ = ['PALETTE', 'hbars', 'stacked_bars', 'histograms', 'lines', 'reward_curves']

#: Categorical colours (colour-blind safe order, Okabe-Ito-like).
PALETTE = ['#0072b2', '#e69f00', '#009e73', '#cc79a7', '#56b4e9', '#d55e00', '#f0e442', '#999999']
_FONT = 'font-family="DejaVu Sans,Helvetica,Arial,sans-serif"'


def _num(v: float) -> str:
    if isinstance(v, int) or float(v).is_integer():
        return str(int(v))
    return f'{v:.3g}' if abs(v) < 1000 else f'{v:.0f}'


def _svg(w: float, h: float, body: list, label: str) -> str:
    return (f'<svg xmlns="http://www.w3.org/2000/svg" width="{short_number(w)}" height="{short_number(h)}" viewBox="0 0 {short_number(w)} {short_number(h)}" '
            f'role="img" aria-label="{escape(label)}" {_FONT} font-size="11">' + ''.join(body) + '</svg>')


def _nice_max(v: float) -> float:
    if v <= 0:
        return 1.0
    e = 10 ** math.floor(math.log10(v))
    for m in (1, 2, 2.5, 5, 10):
        if m * e >= v:
            return m * e
    return 10 * e


def hbars(rows: list, label: str, xmax: float | None = None, width: int = 360, fmt=_num) -> str:
    """Horizontal bars: ``rows`` is ``[(name, value, colour)]``."""
    left, bar_h, gap = 70, 16, 6
    xmax = xmax or _nice_max(max([v for _, v, _ in rows] + [0]))
    span = width - left - 50
    h = 8 + len(rows) * (bar_h + gap) + 18
    body = []
    for k, (name, v, col) in enumerate(rows):
        y = 8 + k * (bar_h + gap)
        w = max(0.0, span * v / xmax)
        body.append(f'<text x="{left - 6}" y="{short_number(y + 12)}" text-anchor="end">{escape(str(name))}</text>'
                    f'<rect x="{left}" y="{short_number(y)}" width="{short_number(w)}" height="{bar_h}" fill="{col}"/>'
                    f'<text x="{short_number(left + w + 4)}" y="{short_number(y + 12)}" fill="#333">{escape(fmt(v))}</text>')
    yb = 8 + len(rows) * (bar_h + gap)
    body.append(f'<line x1="{left}" y1="{short_number(yb)}" x2="{left + span}" y2="{short_number(yb)}" stroke="#999"/>'
                f'<text x="{left}" y="{short_number(yb + 13)}" fill="#666">0</text>'
                f'<text x="{left + span}" y="{short_number(yb + 13)}" fill="#666" text-anchor="end">{escape(fmt(xmax))}</text>')
    return _svg(width, h, body, label)


def stacked_bars(rows: list, keys: list, label: str, width: int = 360) -> str:
    """100 % stacked bars: ``rows`` is ``[(name, {key: count})]``; ``keys`` fixes order and colour."""
    left, bar_h, gap = 70, 16, 6
    span = width - left - 10
    h = 8 + len(rows) * (bar_h + gap) + 8 + 16 * math.ceil(len(keys) / 3)
    body = []
    for k, (name, counts) in enumerate(rows):
        y = 8 + k * (bar_h + gap)
        total = sum(counts.values()) or 1
        x = float(left)
        body.append(f'<text x="{left - 6}" y="{short_number(y + 12)}" text-anchor="end">{escape(str(name))}</text>')
        for j, key in enumerate(keys):
            n = counts.get(key, 0)
            if not n:
                continue
            w = span * n / total
            body.append(f'<rect x="{short_number(x)}" y="{short_number(y)}" width="{short_number(w)}" height="{bar_h}" '
                        f'fill="{PALETTE[j % len(PALETTE)]}"><title>{escape(f"{name}: {key} {n}/{total}")}</title></rect>')
            if w > 22:
                body.append(f'<text x="{short_number(x + w / 2)}" y="{short_number(y + 12)}" text-anchor="middle" fill="#fff">{n}</text>')
            x += w
    ly = 8 + len(rows) * (bar_h + gap) + 6
    for j, key in enumerate(keys):
        lx = left + (j % 3) * ((span) / 3)
        yy = ly + 16 * (j // 3)
        body.append(f'<rect x="{short_number(lx)}" y="{short_number(yy)}" width="10" height="10" fill="{PALETTE[j % len(PALETTE)]}"/>'
                    f'<text x="{short_number(lx + 14)}" y="{short_number(yy + 9)}">{escape(str(key))}</text>')
    return _svg(width, h, body, label)


def histograms(series: list, label: str, xlabel: str, width: int = 360, bins: int = 20) -> str:
    """Small multiples, one histogram row per series; ``series`` is ``[(name, values, colour)]``.

    All rows share the bins (integer-aligned when the values are integers), so rows compare.
    """
    vals = [v for _, vs, _ in series for v in vs]
    lo, hi = (min(vals), max(vals)) if vals else (0, 1)
    integer = all(float(v).is_integer() for v in vals)
    if integer:
        step = max(1, math.ceil((hi - lo + 1) / bins))
        edges = [lo + k * step for k in range(math.ceil((hi - lo + 1) / step) + 1)]
    else:
        step = (hi - lo) / bins or 1.0
        edges = [lo + k * step for k in range(bins + 1)]
    nb = len(edges) - 1
    left, row_h, gap = 70, 34, 8
    span = width - left - 48
    h = 6 + len(series) * (row_h + gap) + 26
    body = []
    for k, (name, vs, col) in enumerate(series):
        counts = [0] * nb
        for v in vs:
            j = min(nb - 1, int((v - lo) // step)) if step else 0
            counts[j] += 1
        top = max(counts) or 1
        y0 = 6 + k * (row_h + gap)
        body.append(f'<text x="{left - 6}" y="{short_number(y0 + row_h / 2 + 4)}" text-anchor="end">{escape(str(name))}</text>'
                    f'<line x1="{left}" y1="{short_number(y0 + row_h)}" x2="{left + span}" y2="{short_number(y0 + row_h)}" stroke="#bbb"/>')
        bw = span / nb
        for j, n in enumerate(counts):
            if not n:
                continue
            bh = row_h * n / top
            rng = f'{_num(edges[j])}' if integer and step == 1 else f'[{_num(edges[j])}, {_num(edges[j + 1])})'
            body.append(f'<rect x="{short_number(left + j * bw + 0.5)}" y="{short_number(y0 + row_h - bh)}" width="{short_number(max(bw - 1, 0.5))}" '
                        f'height="{short_number(bh)}" fill="{col}"><title>{escape(f"{name}: {rng}: {n}")}</title></rect>')
        body.append(f'<text x="{short_number(left + span + 4)}" y="{short_number(y0 + 9)}" fill="#888">max {top}</text>')
    yb = 6 + len(series) * (row_h + gap)
    body.append(f'<text x="{left}" y="{short_number(yb + 8)}" fill="#666">{escape(_num(lo))}</text>'
                f'<text x="{left + span}" y="{short_number(yb + 8)}" fill="#666" text-anchor="end">{escape(_num(edges[-1]))}</text>'
                f'<text x="{short_number(left + span / 2)}" y="{short_number(yb + 20)}" fill="#444" text-anchor="middle">{escape(xlabel)}</text>')
    return _svg(width, h, body, label)


def lines(series: list, xlabels: list, label: str, ylabel: str, width: int = 560, height: int = 240, *,
          xlabel: str = 'turn (p = prompt)', ymax: float | None = None, connect: bool = False,
          title: str = '', tick_every: int = 1, legend_width: int = 110) -> str:
    """Line chart: ``series`` is ``[(name, [y or None per x], colour)]`` or ``(name, ys, colour, dash)``.

    Args:
        series: the lines; a ``None`` y leaves a gap (``connect=True``: the line runs over it);
            ``dash`` is an SVG ``stroke-dasharray`` (dashed lines get no point markers).
        xlabels: the label of each x position (evenly spaced).
        label: the chart's accessible name. ylabel, xlabel: axis titles.
        ymax: top of the y axis (default: a round number above the largest y).
        title: text above the plot. tick_every: label every this many x positions.
        legend_width: px right of the plot for the legend.

    Returns:
        One standalone ``<svg>`` element (deterministic text).
    """
    left, right, top, bottom = 48, legend_width, 10 + (18 if title else 0), 34
    pw, ph = width - left - right, height - top - bottom
    ys = [y for s in series for y in s[1] if y is not None]
    ymax = ymax if ymax is not None else _nice_max(max(ys) if ys else 1)
    nx = max(len(xlabels), 2)
    X = lambda i: left + pw * i / (nx - 1)        # noqa: E731
    Y = lambda v: top + ph * (1 - v / ymax)        # noqa: E731
    body = []
    for k in range(5):
        v = ymax * k / 4
        body.append(f'<line x1="{left}" y1="{short_number(Y(v))}" x2="{left + pw}" y2="{short_number(Y(v))}" stroke="#eee"/>'
                    f'<text x="{left - 5}" y="{short_number(Y(v) + 4)}" text-anchor="end" fill="#666">{_num(v)}</text>')
    if title:
        body.append(f'<text x="{left}" y="14" fill="#222" font-size="13">{escape(title)}</text>')
    for i, xl in enumerate(xlabels):
        if i % max(1, tick_every) == 0 or i == len(xlabels) - 1:
            body.append(f'<text x="{short_number(X(i))}" y="{short_number(top + ph + 14)}" text-anchor="middle" fill="#666">'
                        f'{escape(str(xl))}</text>')
    body.append(f'<text x="{short_number(left + pw / 2)}" y="{short_number(height - 4)}" text-anchor="middle" fill="#444">'
                f'{escape(xlabel)}</text><text x="12" y="{short_number(top + ph / 2)}" fill="#444" text-anchor="middle" '
                f'transform="rotate(-90 12 {short_number(top + ph / 2)})">{escape(ylabel)}</text>')
    for k, (name, pts, col, *rest) in enumerate(series):
        dash = rest[0] if rest else ''
        dash_attr = f' stroke-dasharray="{dash}"' if dash else ''
        seg, segs = [], []
        for i, y in enumerate(pts):
            if y is None:
                if seg and not connect:
                    segs.append(seg)
                    seg = []
            else:
                seg.append((X(i), Y(min(max(y, 0.0), ymax)), y, i))
        if seg:
            segs.append(seg)
        for s in segs:
            body.append(f'<polyline fill="none" stroke="{col}" stroke-width="2"{dash_attr} points="'
                        + ' '.join(f'{short_number(a)},{short_number(b)}' for a, b, _, _ in s) + '"/>')
            if not dash:
                for a, b, y, i in s:
                    body.append(f'<circle cx="{short_number(a)}" cy="{short_number(b)}" r="3" fill="{col}"><title>'
                                f'{escape(f"{name}, {xlabels[i]}: {y:.1f}")}</title></circle>')
        ly = top + 4 + 16 * k
        body.append(f'<line x1="{left + pw + 12}" y1="{short_number(ly + 5)}" x2="{left + pw + 30}" y2="{short_number(ly + 5)}" '
                    f'stroke="{col}" stroke-width="2"{dash_attr}/><text x="{left + pw + 34}" y="{short_number(ly + 9)}">'
                    f'{escape(str(name))}</text>')
    return _svg(width, height, body, label)


def reward_curves(evals: list, grpo_rows: list, title: str = '') -> str:
    """The reward plot of ``agentrl train``: train and held-out evaluation, GRPO samples, hardcode rate.

    Args:
        evals: evaluation rows with ``step``, ``train_reward``, ``heldout_reward`` (step 0 = after SFT).
        grpo_rows: GRPO step rows with ``step``, ``reward`` (the sampled groups) and ``hardcode_rate``.
        title: text above the plot.

    Returns:
        One ``<svg>`` element: x is the GRPO step, y the reward in [0, 1].
    """
    steps = sorted({e['step'] for e in evals} | {r['step'] for r in grpo_rows} | {0})
    at = {s: i for i, s in enumerate(steps)}

    def col(rows, key):
        ys = [None] * len(steps)
        for r in rows:
            ys[at[r['step']]] = r[key]
        return ys
    series = [('held-out reward', col(evals, 'heldout_reward'), '#d55e00'),
              ('train reward', col(evals, 'train_reward'), '#0072b2'),
              ('GRPO sample reward', col(grpo_rows, 'reward'), '#56b4e9', '4 3'),
              ('hardcode rate', col(grpo_rows, 'hardcode_rate'), '#555555', '1 3')]
    return lines(series, steps, 'reward over GRPO steps', 'reward', 640, 360, xlabel='GRPO step (0 = after SFT)',
                 ymax=1.0, connect=True, title=title, tick_every=max(1, len(steps) // 8),
                 legend_width=160)
