"""``agentrl show``: draw one record's tokens by owner, with the action mask beneath.

Formats: ``term`` (coloured tokens in the terminal, the default), ``html`` (one self-contained
interactive file) and ``svg`` (a static figure for a paper). Reads a Parquet file or folder of
records (``agentrl rollout``) or a template audit (JSON with per-token ``ids`` and ``owner``).
"""
from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass

from .options import UserError

FORMATS = ('term', 'html', 'svg')


@dataclass
class ShowOptions:
    """Options of ``agentrl show`` (one field per flag).

    Attributes:
        path: a trajectories Parquet file or shard folder, or a template audit ``.json``.
        episode: index of the record to draw (0-based; among ``policy``'s records when set).
        format: ``term``, ``html`` or ``svg``; None infers it from ``out``'s suffix (else term).
        out: output file; ``-`` is stdout. Default: stdout for term, else
            ``<input stem>-ep<N>.<format>`` in the current folder.
        policy: draw only records of this policy (``provenance.policy``).
        fold: fold tool/template runs longer than this many tokens (0 = never).
        width: terminal columns for ``term`` (default: the terminal's, at most 120).
        tokenizer: token text from this tokenizer (a Hugging Face folder or model id found
            offline; refused when its fingerprint is not the record's); default: chosen from the
            record's provenance (:func:`agentrl.viz.decoder_for`), else ids with a note on stderr.
    """
    path: str
    episode: int = 0
    format: str | None = None
    out: str | None = None
    policy: str | None = None
    fold: int = 40
    width: int | None = None
    tokenizer: str | None = None

    def resolve_format(self) -> str:
        """The output format: ``--format``, else from the ``--out`` suffix (html, svg), else term."""
        if self.format:
            if self.format not in FORMATS:
                raise UserError(f'--format {self.format!r} is not known; choose term, html or svg')
            return self.format
        ext = os.path.splitext(self.out or '')[1].lower().lstrip('.')
        if ext in ('png', 'jpg', 'jpeg', 'pdf'):
            raise UserError(f'--out {self.out!r}: agentrl show writes html, svg or terminal text, not {ext}; '
                            'use a .html or .svg name (and screenshot the html in a browser)')
        return ext if ext in ('html', 'svg') else 'term'

    def validate(self) -> None:
        """Raise :class:`~agentrl.cli.options.UserError` naming the bad flag and the fix."""
        if not os.path.exists(self.path):
            raise UserError(f'{self.path!r} does not exist; pass a trajectories.parquet written by '
                            '`agentrl rollout --out DIR` (or a template audit .json)')
        if self.episode < 0:
            raise UserError(f'--episode must be >= 0, got {self.episode}')
        if self.fold < 0:
            raise UserError(f'--fold must be >= 0 (0 = never fold), got {self.fold}')
        if self.width is not None and self.width < 20:
            raise UserError(f'--width must be >= 20 columns, got {self.width}')
        self.resolve_format()


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


def options_from_args(args) -> ShowOptions:
    """Build the options dataclass from the parsed ``args``."""
    return ShowOptions(path=args.path, episode=args.episode, format=args.format, out=args.out, policy=args.policy,
                       fold=args.fold, width=args.width, tokenizer=args.tokenizer)


def _policy(t) -> str:
    return t.provenance.policy if t.provenance is not None else ''


def load_record(opts: ShowOptions):
    """Return ``(record, count, n_duplicates)``: the chosen record, how many records matched and how many
    of those repeat an earlier record's identity (:func:`agentrl.cli.report.unique_records`)."""
    from .report import unique_records
    if opts.path.lower().endswith('.json'):
        from ..viz import load_audit
        records = load_audit(opts.path)
    else:
        from .. import store
        try:
            batches = store.iter_batches(opts.path, batch_size=256)
            records, seen, chosen, keys, n_dup = [], 0, None, set(), 0
            for batch in batches:
                for t in batch:
                    if opts.policy and _policy(t) != opts.policy:
                        continue
                    if seen == opts.episode:
                        chosen = t
                    seen += 1
                    key = _key(t)
                    n_dup += key in keys
                    keys.add(key)
            if chosen is not None:
                return chosen, seen, n_dup
            records = [None] * seen
        except ValueError as e:
            if getattr(e, 'exit_code', None) == 1:  # a refused row: its message names the file, row and field
                raise
            raise UserError(f'{opts.path}: {e}') from None
    if opts.policy and opts.path.lower().endswith('.json'):
        records = [t for t in records if _policy(t) == opts.policy]
    if not records:
        what = f'no records of policy {opts.policy!r}' if opts.policy else 'no records'
        raise UserError(f'{opts.path} has {what}; check --policy, or write records with `agentrl rollout`')
    if opts.episode >= len(records):
        raise UserError(f'--episode {opts.episode} is out of range: {opts.path} has {len(records)} record'
                        f'{"s" if len(records) != 1 else ""}'
                        + (f' of policy {opts.policy}' if opts.policy else '')
                        + f'; pass --episode 0..{len(records) - 1}')
    return records[opts.episode], len(records), unique_records(records)[1]      # an audit file's records


def _key(t):
    from ..checks import has_identity, identity, record_digest
    return ('id', *identity(t)) if has_identity(t) else ('digest', record_digest(t))


def refusal_marks(traj) -> dict:
    """The position of the first refusal of :func:`agentrl.checks.validate`, to mark in the strip.

    A refusal's ``position`` indexes its ``field``; fields aligned to ``ids[1:]`` are shifted to
    the token they describe. Returns position -> ``'refused: <Kind>'``; empty when the record
    passes or its refusal names no position.
    """
    from ..checks import validate
    marks = {}
    try:
        validate(traj)
    except ValueError as e:           # a RecordError: field, position, fix
        pos = getattr(e, 'position', None)
        field = str(getattr(e, 'field', ''))
        if isinstance(pos, int):
            shift = 1 if field.split('.')[0] in ('action_mask', 'sample_logp', 'turn_ids') else 0
            marks[pos + shift] = f'refused: {type(e).__name__}'
    except Exception:  # noqa: BLE001 - marks are decoration; a record the checks cannot read draws unmarked
        pass
    return marks


def default_out(opts: ShowOptions, fmt: str) -> str:
    """Default output path for html/svg: ``<input stem>-ep<N>.<format>`` in the current folder."""
    stem = os.path.splitext(os.path.basename(os.path.normpath(opts.path)))[0] or 'record'
    return f'{stem}-ep{opts.episode}.{fmt}'


def run(args) -> int:
    """Run the subcommand for parsed ``args``; return the exit code (errors raise ``UserError``, one line)."""
    from rich.console import Console
    from rich.markup import escape

    from .. import viz
    opts = options_from_args(args)
    opts.validate()
    fmt = opts.resolve_format()
    err = Console(stderr=True)
    t0 = time.time()
    with err.status(f'reading {escape(opts.path)}', spinner='dots'):
        traj, count, n_dup = load_record(opts)
        try:
            decoder = viz.decoder_for(traj, opts.tokenizer)
        except ValueError as e:          # a tokenizer that does not load, or not the records' one
            raise UserError(f'--{e}') from None
    fp = traj.provenance.tokenizer if traj.provenance is not None else ''
    if decoder is viz.id_decoder and fp:
        from ..io import printable
        print(printable(f"note: no tokenizer with the record's fingerprint {fp} was found ($AGENTRL_TOKENIZERS, "
                        '../shared/tokenizers, the hub); showing ids: pass --tokenizer DIR (the tokenizer the '
                        'records were sampled with) for token text'), file=sys.stderr)
    with err.status('drawing', spinner='dots'):
        strip = viz.build_strip(traj, decoder, fold=opts.fold, marks=refusal_marks(traj))
    from .report import duplicates_note
    dup = f'; {duplicates_note(n_dup, opts.path)}' if n_dup else ''
    label = f'episode {opts.episode}' + (f' of {opts.policy}' if opts.policy else '') + f' ({count} in file{dup})'
    if fmt == 'term':
        if opts.out and opts.out != '-':
            import io

            from ..io import atomic_write
            if os.path.isdir(opts.out):
                raise UserError(f'--out {opts.out!r} is a folder; pass a file name such as '
                                f'{os.path.join(opts.out, "show.txt")!r}')
            buf = io.StringIO()
            console = Console(file=buf, force_terminal=True, width=opts.width or 80)
            viz.print_strip(strip, console, width=opts.width or 80, header=f'{label}: {strip.title}')
            atomic_write(opts.out, buf.getvalue())
        else:
            console = Console()
            viz.print_strip(strip, console, width=opts.width or min(console.width, 120),
                            header=f'{label}: {strip.title}')
            return 0
    else:
        text = viz.to_html(strip, episode=opts.episode) if fmt == 'html' else viz.to_svg(strip)
        out = opts.out or default_out(opts, fmt)
        if out == '-':
            sys.stdout.write(text)
            return 0
        if os.path.isdir(out):
            raise UserError(f'--out {out!r} is a folder; pass a file name such as {os.path.join(out, "show." + fmt)!r}')
        from ..io import atomic_write
        os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
        atomic_write(out, text)
    out = opts.out if fmt == 'term' else out
    folded = sum(s.folded for s in strip.segments)
    from ..io import printable
    Console().print(printable(f'wrote {out}: {label}, {len(strip.cells)} tokens, {strip.n_policy} policy, mask sum '
                              f'{strip.mask_sum}' + (f', {folded} folded runs' if folded else '')
                              + f' ({time.time() - t0:.1f} s)'), highlight=False, markup=False, soft_wrap=True)
    return 0
