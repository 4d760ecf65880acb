"""L5: the show job: find one record of a file (or a template audit), decode and draw it as a strip.

:func:`load_record` reads a Parquet file or shard folder with :func:`agentrl.store.iter_batches`
(or a template audit JSON), picks the record ``--episode`` names among ``--policy``'s and counts
the repeats (:class:`agentrl.checks.Deduper`); :func:`draw` decodes it and builds the
:class:`~agentrl.viz.Strip`; :func:`write_shown` writes the html, svg or terminal text.
``agentrl show`` prints. Errors are ``ValueError`` naming the flag and the fix, or the refused
row's :class:`~agentrl.checks.RecordError`.
"""
from __future__ import annotations

import os
from dataclasses import dataclass

from ..io import atomic_write
from .report import duplicates_note

__all__ = ['FORMATS', 'ShowOptions', 'Shown', 'load_record', 'find', 'draw', 'write_shown', 'refusal_marks', 'default_out']

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
        """The output format: ``--format``, else from the ``--out`` suffix (html, svg), else term.

        Raises:
            ValueError: an unknown ``--format``, or an ``--out`` suffix of an image format.
        """
        if self.format:
            if self.format not in FORMATS:
                raise ValueError(f'--format {self.format!r} is not known; choose term, html or svg')
            return self.format
        ext = os.path.splitext(self.out or '')[1].lower().lstrip('.')
        if ext in ('png', 'jpg', 'jpeg', 'pdf'):
            raise ValueError(f'--out {self.out!r}: agentrl show writes html, svg or terminal text, not {ext}; '
                             'use a .html or .svg name (and screenshot the html in a browser)')
        return ext if ext in ('html', 'svg') else 'term'

    def validate(self) -> None:
        """Check the options before anything is read.

        Raises:
            ValueError: naming the bad flag (or PATH) and the fix.
        """
        if not os.path.exists(self.path):
            raise ValueError(f'{self.path!r} does not exist; pass a trajectories.parquet written by '
                             '`agentrl rollout --out DIR` (or a template audit .json)')
        if self.episode < 0:
            raise ValueError(f'--episode must be >= 0, got {self.episode}')
        if self.fold < 0:
            raise ValueError(f'--fold must be >= 0 (0 = never fold), got {self.fold}')
        if self.width is not None and self.width < 20:
            raise ValueError(f'--width must be >= 20 columns, got {self.width}')
        self.resolve_format()


def _policy(t) -> str:
    return t.provenance.policy if t.provenance is not None else ''


def _from_store(opts: ShowOptions):
    """``(record or None, records matched, repeats among them)`` of a Parquet file or folder, read once."""
    from .. import store
    from ..checks import Deduper, RecordError
    seen, chosen, dedupe = 0, None, Deduper()
    try:
        for batch in store.iter_batches(opts.path, batch_size=256):
            for t in batch:
                if opts.policy and _policy(t) != opts.policy:
                    continue
                if seen == opts.episode:
                    chosen = t
                seen += 1
                dedupe.see(t)
    except RecordError:                 # a refused row: its message names the file, row and field
        raise
    except ValueError as e:             # the store's messages name the file already: not twice
        msg = str(e)
        raise ValueError(msg if msg.startswith(("'", '"')) or str(opts.path) in msg else f'{opts.path}: {msg}') from None
    return chosen, seen, dedupe.repeats


def load_record(opts: ShowOptions):
    """The record to draw.

    Returns:
        ``(record, count, n_duplicates)``: the chosen :class:`~agentrl.record.Trajectory`, how many
        records matched (``policy``) and how many of those repeat an earlier record's identity
        (:class:`agentrl.checks.Deduper`).

    Raises:
        ValueError: no records (of ``policy``), ``episode`` out of range, a file that is not a
            trajectory file. RecordError: a refused row.
    """
    from ..checks import Deduper
    if opts.path.lower().endswith('.json'):
        from ..viz import load_audit
        records = [t for t in load_audit(opts.path) if not opts.policy or _policy(t) == opts.policy]
    else:
        chosen, count, n_dup = _from_store(opts)
        if chosen is not None:
            return chosen, count, n_dup
        records = [None] * count
    if not records:
        what = f'no records of policy {opts.policy!r}' if opts.policy else 'no records'
        raise ValueError(f'{opts.path} has {what}; check --policy, or write records with `agentrl rollout`')
    if opts.episode >= len(records):
        raise ValueError(f'--episode {opts.episode} is out of range: {opts.path} has {len(records)} record'
                         f'{"s" if len(records) != 1 else ""}'
                         + (f' of policy {opts.policy}' if opts.policy else '')
                         + f'; pass --episode 0..{len(records) - 1}')
    dedupe = Deduper()
    dedupe.unique(records)                           # an audit file's records
    return records[opts.episode], len(records), dedupe.repeats


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


@dataclass
class Shown:
    """One record found and decoded for drawing (:func:`load_record` + :func:`agentrl.viz.decoder_for`).

    Attributes:
        record: the Trajectory. count: records matched. duplicates: repeats among them.
        decoder: the token decoder (``viz.id_decoder`` when no tokenizer was found).
        missing_tokenizer: the record's tokenizer fingerprint when none with it was found ('' otherwise).
    """
    record: object
    count: int
    duplicates: int
    decoder: object
    missing_tokenizer: str = ''

    def label(self, opts: ShowOptions) -> str:
        """``'episode N [of POLICY] (COUNT in file[; duplicates note])'``."""
        dup = f'; {duplicates_note(self.duplicates, opts.path)}' if self.duplicates else ''
        return f'episode {opts.episode}' + (f' of {opts.policy}' if opts.policy else '') + f' ({self.count} in file{dup})'


def find(opts: ShowOptions) -> Shown:
    """The record of ``opts`` and its decoder.

    Raises:
        ValueError: as :func:`load_record`; ``--tokenizer ...`` that does not load or is not the records' one.
    """
    from .. import viz
    traj, count, n_dup = load_record(opts)
    try:
        decoder = viz.decoder_for(traj, opts.tokenizer)
    except ValueError as e:          # a tokenizer that does not load, or not the records' one
        raise ValueError(f'--{e}') from None
    fp = traj.provenance.tokenizer if traj.provenance is not None else ''
    return Shown(traj, count, n_dup, decoder, fp if decoder is viz.id_decoder and fp else '')


def draw(opts: ShowOptions, shown: Shown):
    """The :class:`~agentrl.viz.Strip` of the shown record (folded runs, refusal marks)."""
    from .. import viz
    images = None if opts.path.endswith('.json') else opts.path       # thumbnails from the run's images/
    return viz.build_strip(shown.record, shown.decoder, fold=opts.fold, marks=refusal_marks(shown.record),
                           images=images)


def write_shown(opts: ShowOptions, fmt: str, strip, header: str) -> str | None:
    """Write the strip as ``fmt`` to ``--out`` (or its default); return the path, None for stdout (``-``).

    ``term`` to a file is the coloured text at ``--width`` (default 80) columns.

    Raises:
        ValueError: ``--out`` is a folder.
    """
    from .. import viz
    if fmt == 'term':
        import io

        from rich.console import Console
        if os.path.isdir(opts.out):
            raise ValueError(f'--out {opts.out!r} is a folder; pass a file name such as '
                             f'{os.path.join(opts.out, "show.txt")!r}')
        buf = io.StringIO()
        viz.print_strip(strip, Console(file=buf, force_terminal=True, width=opts.width or 80),
                        width=opts.width or 80, header=header)
        atomic_write(opts.out, buf.getvalue())
        return opts.out
    text = viz.to_html(strip, episode=opts.episode) if fmt == 'html' else viz.to_svg(strip)
    out = opts.out or default_out(opts, fmt)
    if out == '-':
        import sys
        sys.stdout.write(text)
        return None
    if os.path.isdir(out):
        raise ValueError(f'--out {out!r} is a folder; pass a file name such as {os.path.join(out, "show." + fmt)!r}')
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    atomic_write(out, text)
    return out
