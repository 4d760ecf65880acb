"""A hand-written SVG line plot of reward over GRPO steps (no plotting dependency)."""
from __future__ import annotations

from html import escape

__all__ = ['reward_plot_svg']

_W, _H, _L, _R, _T, _B = 640, 360, 56, 170, 36, 44     # size and margins in px


def reward_plot_svg(evals: list[dict], grpo_rows: list[dict], path: str, title: str = '') -> str:
    """Write reward curves (train / held-out evaluation, GRPO samples, hardcode rate) as SVG.

    Args:
        evals: evaluation records with ``step``, ``train_reward``, ``heldout_reward``
            (step 0 = after SFT).
        grpo_rows: GRPO step records with ``step``, ``reward`` (training reward of the sampled
            groups) and ``hardcode_rate``.
        path: output file (``.svg``).
        title: plot title.

    Returns:
        the SVG text (also written to ``path``). y axis is reward in [0, 1], x axis GRPO step.
    """
    steps = [e['step'] for e in evals] + [r['step'] for r in grpo_rows]
    x_max = max(steps + [1])
    pw, ph = _W - _L - _R, _H - _T - _B

    def xy(x, y):
        return _L + pw * x / x_max, _T + ph * (1 - max(0.0, min(1.0, y)))

    series = [
        ('held-out reward', '#d62728', [(e['step'], e['heldout_reward']) for e in evals], ''),
        ('train reward', '#1f77b4', [(e['step'], e['train_reward']) for e in evals], ''),
        ('GRPO sample reward', '#7fb3d5', [(r['step'], r['reward']) for r in grpo_rows], '4 3'),
        ('hardcode rate', '#555555', [(r['step'], r['hardcode_rate']) for r in grpo_rows], '1 3'),
    ]
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{_W}" height="{_H}" '
           f'font-family="sans-serif" font-size="12">',
           f'<rect width="{_W}" height="{_H}" fill="white"/>',
           f'<text x="{_L}" y="20" font-size="14">{escape(title)}</text>']
    for i in range(6):                                       # y grid and labels
        y = i / 5
        _, py = xy(0, y)
        out.append(f'<line x1="{_L}" y1="{py:.1f}" x2="{_L + pw}" y2="{py:.1f}" stroke="#e5e5e5"/>')
        out.append(f'<text x="{_L - 8}" y="{py + 4:.1f}" text-anchor="end">{y:.1f}</text>')
    n_ticks = min(x_max, 8)
    for i in range(n_ticks + 1):                             # x ticks
        x = round(x_max * i / n_ticks)
        px, _ = xy(x, 0)
        out.append(f'<text x="{px:.1f}" y="{_T + ph + 16}" text-anchor="middle">{x}</text>')
    out.append(f'<rect x="{_L}" y="{_T}" width="{pw}" height="{ph}" fill="none" stroke="#333"/>')
    out.append(f'<text x="{_L + pw / 2}" y="{_H - 8}" text-anchor="middle">GRPO step (0 = after SFT)</text>')
    out.append(f'<text x="14" y="{_T + ph / 2}" transform="rotate(-90 14 {_T + ph / 2})" '
               f'text-anchor="middle">reward</text>')
    for k, (name, color, pts, dash) in enumerate(series):
        if pts:
            coords = ' '.join(f'{px:.1f},{py:.1f}' for px, py in (xy(x, y) for x, y in pts))
            dash_attr = f' stroke-dasharray="{dash}"' if dash else ''
            out.append(f'<polyline points="{coords}" fill="none" stroke="{color}" stroke-width="2"{dash_attr}/>')
            if not dash:
                out += [f'<circle cx="{px:.1f}" cy="{py:.1f}" r="3" fill="{color}"/>'
                        for px, py in (xy(x, y) for x, y in pts)]
        ly = _T + 14 + 20 * k
        out.append(f'<line x1="{_L + pw + 12}" y1="{ly - 4}" x2="{_L + pw + 36}" y2="{ly - 4}" stroke="{color}" '
                   f'stroke-width="2"{" stroke-dasharray=" + chr(34) + dash + chr(34) if dash else ""}/>')
        out.append(f'<text x="{_L + pw + 42}" y="{ly}">{escape(name)}</text>')
    out.append('</svg>')
    svg = '\n'.join(out) + '\n'
    with open(path, 'w') as f:
        f.write(svg)
    return svg
