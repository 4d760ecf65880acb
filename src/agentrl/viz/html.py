"""Interactive HTML view of a strip: one self-contained file, no network.

Every token is a ``<span class="tok o-OWNER">`` cell (so ``document.querySelectorAll('.tok')``
counts ``T``, less each image's placeholder run, which is one ``<span class="tok img">`` cell with its thumbnail
and ``data-n`` tokens), coloured and outlined by owner; the stored action mask is a rule under each cell;
turn boundaries are marked; long tool observations and template preambles are collapsible; a
hover (or keyboard focus) tooltip shows text, id, position, owner, turn, mask and sample
log-prob. CSS and JS are inline and a Content-Security-Policy forbids any fetch.
"""
from __future__ import annotations

from html import escape

from .strip import Strip, display_text

__all__ = ['CSS', 'JS', 'CSP', 'strip_fragment', 'legend_fragment', 'page', 'to_html']

#: Forbids every network fetch: only inline style/script and data: images are allowed.
CSP = "default-src 'none'; style-src 'unsafe-inline'; script-src 'unsafe-inline'; img-src data:"

CSS = """
:root{--policy:#1f5fbf;--policy-bg:#dbe8fb;--tool:#333;--prompt:#666;--tmpl:#8a8a8a;--mark:#d62728}
*{box-sizing:border-box}
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,"DejaVu Sans",sans-serif;color:#222;
 margin:24px;max-width:1200px}
h1{font-size:20px;margin:0 0 4px} h2{font-size:16px;margin:28px 0 8px}
.meta{color:#555;margin:0 0 12px} .meta b{color:#222;font-weight:600}
.notice{background:#fff4e5;border-left:4px solid #e08a00;padding:6px 10px;margin:0 0 12px}
.legend{display:flex;flex-wrap:wrap;gap:14px;align-items:center;margin:8px 0 14px;font-size:13px;color:#444}
.legend .tok{pointer-events:none}
.strip{font:12px/1 "DejaVu Sans Mono",Menlo,Consolas,monospace;display:flex;flex-wrap:wrap;
 align-items:flex-start;gap:10px 3px;padding:10px 4px 8px;border-top:1px solid #eee}
.tok{position:relative;display:inline-block;padding:3px 4px;border:1px solid transparent;border-radius:2px;
 white-space:pre;margin-bottom:6px;cursor:default;min-width:12px;text-align:center}
.tok::after{content:"";position:absolute;left:-2px;right:-2px;bottom:-7px;height:1px;background:#c8c8c8}
.tok.m1::after{height:3px;bottom:-8px;background:var(--policy)}
.tok.m-none::after{display:none}
.tok.mx::after{height:3px;bottom:-8px;background:var(--mark)}
.o-policy{background:var(--policy-bg);border-color:var(--policy);color:#0b3d91}
.o-tool{background:#fff;border-color:var(--tool)}
.o-prompt{background:#fff;border:1px dotted var(--prompt)}
.o-template{color:var(--tmpl)}
.tok.marked{box-shadow:0 0 0 2px var(--mark)}
.tok:hover,.tok:focus{outline:2px solid #f0a202;outline-offset:1px;z-index:2}
.turn{align-self:stretch;border-left:2px solid #999;padding:0 2px 0 3px;color:#777;font:10px/1 system-ui,sans-serif;
 margin-left:4px}
.tg{display:inline-flex;gap:3px;align-items:flex-start}
.fold{display:inline-flex;flex-wrap:wrap;gap:10px 3px;align-items:flex-start}
.fold>button,.fold-demo{font:11px/1 system-ui,sans-serif;border:1px dashed #999;background:#f7f7f7;border-radius:3px;
 padding:4px 6px;cursor:pointer;color:#444}
.fold.collapsed>.tok{display:none}
.tok.img{display:inline-flex;gap:4px;align-items:center;white-space:normal;font:11px/1.2 system-ui,sans-serif}
.tok.img img{max-width:96px;max-height:96px;display:block}
#tip{position:fixed;z-index:10;pointer-events:none;background:#111;color:#eee;font:12px/1.4 "DejaVu Sans Mono",
 Menlo,Consolas,monospace;padding:6px 8px;border-radius:4px;max-width:420px;white-space:pre-wrap}
#tip[hidden]{display:none}
table.stats{border-collapse:collapse;font-size:13px} table.stats td,table.stats th{padding:3px 10px;
 border-bottom:1px solid #eee;text-align:right} table.stats th{background:#fafafa}
table.stats td:first-child,table.stats th:first-child{text-align:left}
.plots{display:flex;flex-wrap:wrap;gap:18px} .plot{border:1px solid #eee;padding:6px}
.plot h3{font-size:13px;margin:0 0 4px;font-weight:600}
footer{margin-top:30px;color:#888;font-size:12px}
"""

JS = """
(function(){
  var tip=document.getElementById('tip');
  function show(e){
    var c=e.target.closest?e.target.closest('.tok'):null; if(!c||!c.dataset.i){return;}
    var d=c.dataset, lines=[
      'text   '+JSON.stringify(d.x),
      'id     '+d.id+'   pos '+d.i,
      'owner  '+d.o+'   turn '+d.t,
      'mask   '+d.m+'   logp '+d.lp];
    if(d.k){lines.push('mark   '+d.k);}
    tip.textContent=lines.join('\\n'); tip.hidden=false;
    var r=c.getBoundingClientRect(), x=Math.min(r.left, window.innerWidth-430);
    tip.style.left=Math.max(4,x)+'px'; tip.style.top=(r.bottom+12)+'px';
  }
  function hide(){tip.hidden=true;}
  document.addEventListener('mouseover',show); document.addEventListener('focusin',show);
  document.addEventListener('mouseout',function(e){if(e.target.closest&&e.target.closest('.tok')){hide();}});
  document.addEventListener('focusout',hide);
  document.addEventListener('click',function(e){
    var b=e.target.closest?e.target.closest('.strip .fold>button'):null; if(!b){return;}
    var f=b.parentNode, folded=f.classList.toggle('collapsed');
    b.textContent=(folded?'\\u25b8 ':'\\u25be ')+b.dataset.label;
    b.setAttribute('aria-expanded', String(!folded));
  });
})();
"""

_LEGEND = [('template', 'template (unboxed)'), ('prompt', 'prompt (dotted)'), ('policy', 'policy (blue)'),
           ('tool', 'tool (solid)')]


def _fmt_logp(x) -> str:
    return '-' if x is None else f'{x:.4f}'


def _cell(c) -> str:
    cls = ['tok', f'o-{c.owner}']
    cls.append('m-none' if c.mask is None else f'm{c.mask}')
    if c.mask_mismatch:
        cls.append('mx')
    if c.mark:
        cls.append('marked')
    attrs = (f' data-i="{c.pos}" data-id="{c.id}" data-o="{escape(c.owner)}" data-t="{c.turn}"'
             f' data-m="{"-" if c.mask is None else c.mask}" data-lp="{_fmt_logp(c.logp)}"'
             f' data-x="{escape(c.text, quote=True)}"')
    if c.mark or c.mask_mismatch:
        why = c.mark or ('mask 1 on a non-policy token' if c.mask else 'mask 0 on a policy token')
        attrs += f' data-k="{escape(why, quote=True)}"'
    return f'<span class="{" ".join(cls)}" tabindex="0"{attrs}>{escape(display_text(c.text))}</span>'


def _image_cell(strip: Strip, seg) -> str:
    """One cell for an image's run of placeholder ids: its thumbnail (an inline ``data:`` URL) and what it stands for."""
    im = seg.image
    first = strip.cells[seg.start]
    masked = sum(c.mask or 0 for c in strip.cells[seg.start:seg.stop])
    cls = f'tok img o-{seg.owner} ' + ('mx' if masked else 'm0')
    label = f'image {im["index"]} · {len(seg)} tokens (pos {seg.start}–{seg.stop - 1})'
    tip = f'{im["digest"]} grid {im["grid"]}'
    attrs = (f' data-i="{seg.start}" data-id="{first.id}" data-o="{escape(seg.owner)}" data-t="{seg.turn}"'
             f' data-m="{masked}" data-lp="-" data-x="{escape(tip, quote=True)}" data-image="{im["index"]}"'
             f' data-digest="{escape(im["digest"])}" data-n="{len(seg)}"')
    if masked:
        attrs += f' data-k="{escape(f"mask 1 on {masked} placeholder tokens", quote=True)}"'
    thumb = f'<img src="{im["thumb"]}" alt="image {im["index"]}">' if im['thumb'] else ''
    return f'<span class="{cls}" tabindex="0"{attrs}>{thumb}<span>{escape(label)}</span></span>'


def strip_fragment(strip: Strip, episode: int | None = None) -> str:
    """The ``<div class="strip">`` of one record (cells, turn marks, folds), without page chrome."""
    out = [f'<div class="strip" data-tokens="{len(strip.cells)}" data-policy="{strip.n_policy}"'
           f' data-mask-sum="{strip.mask_sum}"' + ('' if episode is None else f' data-episode="{episode}"') + '>']
    for seg in strip.segments:
        cells = [_image_cell(strip, seg)] if seg.image else [_cell(c) for c in strip.cells[seg.start:seg.stop]]
        if seg.folded:
            label = f'{seg.owner} \u00b7 {len(seg)} tokens (pos {seg.start}\u2013{seg.stop - 1})'
            cells = [f'<span class="fold collapsed" data-owner="{seg.owner}" data-n="{len(seg)}">'
                     f'<button type="button" aria-expanded="false" data-label="{escape(label)}">'
                     f'\u25b8 {escape(label)}</button>{"".join(cells)}</span>']
        if seg.turn_start:   # the mark and the turn's first cell wrap together
            cells[0] = (f'<span class="tg"><span class="turn" title="turn {seg.turn} starts at position '
                        f'{seg.start}">turn {seg.turn}</span>{cells[0]}</span>')
        out.append(''.join(cells))
    out.append('</div>')
    return ''.join(out)


def legend_fragment() -> str:
    """Owner swatches plus the mask rule, as used above every strip."""
    items = [f'<span><span class="tok key o-{o} m-none">tok</span> {escape(label)}</span>' for o, label in _LEGEND]
    items.append('<span><span class="tok key o-policy m1">tok</span> action mask 1 (rule below the cell)</span>')
    items.append('<span><span class="turn">turn k</span> turn boundary</span>')
    items.append('<span><span class="fold-demo">\u25b8 N tokens</span> folded run: click to expand</span>')
    return '<div class="legend">' + ''.join(items) + '</div>'


def page(title: str, body: str) -> str:
    """A complete self-contained HTML document around ``body`` (inline CSS/JS, CSP, tooltip)."""
    return ('<!doctype html>\n<html lang="en"><head><meta charset="utf-8">'
            f'<meta http-equiv="Content-Security-Policy" content="{CSP}">'
            '<meta name="viewport" content="width=device-width,initial-scale=1">'
            f'<title>{escape(title)}</title><style>{CSS}</style></head>\n<body>\n{body}\n'
            f'<div id="tip" hidden></div>\n<script>{JS}</script>\n</body></html>\n')


def _meta_line(strip: Strip) -> str:
    bits = []
    for k, v in strip.meta.items():
        v = f'{v:.3f}' if isinstance(v, float) else v
        bits.append(f'{escape(str(k))} <b>{escape(str(v))}</b>')
    bits.append(f'text <b>{escape(strip.decoded)}</b>')
    return '<p class="meta">' + ' &middot; '.join(bits) + '</p>'


def to_html(strip: Strip, episode: int | None = None, heading: str | None = None) -> str:
    """Render one strip as a complete HTML page (string).

    Args:
        strip: from :func:`~agentrl.viz.build_strip`.
        episode: index shown in the heading and stored on the strip element.
        heading: page heading; default ``episode N: <strip.title>``.
    """
    head = heading or (f'episode {episode}: {strip.title}' if episode is not None else strip.title)
    body = (f'<h1>{escape(head)}</h1>{_meta_line(strip)}{legend_fragment()}'
            f'{strip_fragment(strip, episode)}'
            '<footer>Hover or focus a cell for its token text, id, position, owner, turn, mask and sample '
            'log-prob. The rule under each cell is the stored action mask (aligned to ids[1:]); red means '
            'it disagrees with the owner.</footer>')
    return page(head, body)
