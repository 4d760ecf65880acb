"""``agentrl show``: draw one record's tokens by owner, with the action mask beneath.

Formats: ``term`` (coloured tokens in the terminal, the default), ``html`` (one self-contained
interactive file) and ``svg`` (a static figure for a paper). Reads a Parquet file or folder of
records (``agentrl rollout``) or a template audit (JSON with per-token ``ids`` and ``owner``).
Parse the flags, run :mod:`agentrl.jobs.show`, print.
"""
from __future__ import annotations

import sys
import time

from ..io import printable
from ..jobs import show
from ..jobs.show import FORMATS, ShowOptions, default_out, load_record, refusal_marks  # noqa: F401 - their old home
from .options import from_args


def register(sub) -> None:
    """Add this subcommand's parser (every flag documented) to ``sub`` and set ``func=run``."""
    p = sub.add_parser('show', help='draw one record: token cells by owner, action mask beneath',
                       description='Draw one record as a strip of token cells coloured and outlined by owner '
                                   '(template, prompt, policy, tool), with the stored action mask as a rule '
                                   'under the cells and turn boundaries marked. term prints to the terminal; '
                                   'html writes one self-contained interactive page (hover a cell for its '
                                   'text, id, position, owner, turn, mask, log-prob); svg writes a static figure.')
    p.add_argument('path', help='trajectories Parquet file or folder (agentrl rollout), or a template audit .json')
    p.add_argument('--episode', '-e', type=int, default=0, help='record index, 0-based (default: 0)')
    p.add_argument('--format', '-f', choices=FORMATS, default=None,
                   help='term, html or svg (default: from --out suffix, else term)')
    p.add_argument('--out', '-o', default=None,
                   help='output file, - for stdout (default: stdout for term, else <stem>-ep<N>.<format>)')
    p.add_argument('--policy', default=None, help='only records of this policy (e.g. oracle)')
    p.add_argument('--fold', type=int, default=40,
                   help='fold tool/template runs longer than this many tokens; 0 = never (default: 40)')
    p.add_argument('--width', type=int, default=None, help='terminal columns for term (default: terminal width)')
    p.add_argument('--tokenizer', default=None,
                   help='decode token text with this tokenizer (HF folder or model id, offline); refused when '
                        "its fingerprint is not the record's; default: the tokenizer with the record's "
                        'fingerprint ($AGENTRL_TOKENIZERS, ../shared/tokenizers, the hub), else ids and a note')
    p.set_defaults(func=run)


def run(args) -> int:
    """Run the subcommand for parsed ``args``; return the exit code (errors raise, printed as one line)."""
    from rich.console import Console
    from rich.markup import escape

    from .. import viz
    opts = from_args(ShowOptions, args)
    opts.validate()
    fmt = opts.resolve_format()
    err = Console(stderr=True)
    t0 = time.time()
    with err.status(f'reading {escape(opts.path)}', spinner='dots'):
        shown = show.find(opts)
    if shown.missing_tokenizer:
        print(printable(f"note: no tokenizer with the record's fingerprint {shown.missing_tokenizer} was found "
                        '($AGENTRL_TOKENIZERS, ../shared/tokenizers, the hub); showing ids: pass --tokenizer DIR (the '
                        'tokenizer the records were sampled with) for token text'), file=sys.stderr)
    with err.status('drawing', spinner='dots'):
        strip = show.draw(opts, shown)
    label = shown.label(opts)
    if fmt == 'term' and (not opts.out or opts.out == '-'):
        console = Console()
        viz.print_strip(strip, console, width=opts.width or min(console.width, 120), header=f'{label}: {strip.title}')
        return 0
    out = show.write_shown(opts, fmt, strip, f'{label}: {strip.title}')
    if out is None:                         # written to stdout
        return 0
    folded = sum(s.folded for s in strip.segments)
    Console().print(printable(f'wrote {out}: {label}, {len(strip.cells)} tokens, {strip.n_policy} policy, mask sum '
                              f'{strip.mask_sum}' + (f', {folded} folded runs' if folded else '')
                              + f' ({time.time() - t0:.1f} s)'), highlight=False, markup=False, soft_wrap=True)
    return 0
