"""The ownership strip model every view draws: one cell per token, grouped into segments.

A :class:`Strip` is built once from a record (:func:`build_strip`) and rendered by the HTML,
SVG and terminal views, so the three pictures always agree on text, owner, mask and folds.

Alignment is docs/design.md#shift (book chapter 5.6): cell ``i`` (token ``ids[i]``) shows ``action_mask[i-1]`` and
``sample_logp[i-1]``; cell 0 is never predicted and has neither. The mask drawn under a cell is
the record's *stored* mask, not one recomputed from the owner, so a mask bug is visible: a cell
whose stored mask disagrees with its owner is flagged ``mask_mismatch``.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field

from ..images import has_images, parse_images, run_folder, thumbnail_url
from ..io import read_json
from ..record import OWNER, OWNER_NAMES, Provenance, Trajectory
from .decoders import Decoder, decoder_for, hf_decoder, id_decoder, word_decoder  # noqa: F401 - re-exported

__all__ = ['Cell', 'Segment', 'Strip', 'build_strip', 'decoder_for', 'word_decoder', 'hf_decoder',
           'id_decoder', 'display_text', 'DEFAULT_FOLD', 'FOLDABLE']

#: Runs of one owner longer than this many tokens are folded (collapsible) by default.
DEFAULT_FOLD = 40
#: Owners whose long runs fold: tool observations and template preambles (book Figure 5.1).
FOLDABLE = ('tool', 'template')


@dataclass(frozen=True)
class Cell:
    """One token of the strip.

    Attributes:
        pos: position in ``ids`` (0-based).
        id: token id.
        text: the token's text as decoded (may hold spaces and newlines; see :func:`display_text`).
        owner: owner name (``template``, ``prompt``, ``policy``, ``tool`` or ``?<code>``).
        turn: turn index (-1 for the prompt).
        mask: stored ``action_mask[pos-1]`` as 0/1, or None for position 0 (never predicted).
        logp: stored ``sample_logp[pos-1]`` in nats, or None for position 0.
        mark: highlight reason (``'drift'``, ``'refused: MaskOnNonPolicyError'`` ...) or ''.
    """
    pos: int
    id: int
    text: str
    owner: str
    turn: int
    mask: int | None
    logp: float | None
    mark: str = ''

    @property
    def mask_mismatch(self) -> bool:
        """True when the stored mask disagrees with the owner (mask 1 off policy, or 0 on it)."""
        return self.mask is not None and self.mask != int(self.owner == 'policy')


@dataclass(frozen=True)
class Segment:
    """A maximal run of cells with one owner and one turn: ``cells[start:stop]``.

    Attributes:
        owner, turn: shared by every cell of the run.
        start, stop: cell range (positions), ``stop`` exclusive.
        folded: True when the run is drawn collapsed by default (long tool or template run).
        turn_start: True when this run opens a new turn (a turn boundary is drawn before it).
        image: for an image's run of placeholder ids (drawn as one cell, never as its tokens):
            ``{'index', 'digest', 'grid', 'length', 'thumb'}`` with ``thumb`` a small ``data:image/png;base64,...``
            URL ('' when the run folder lacks the image or it cannot be made small); None for other runs.
    """
    owner: str
    turn: int
    start: int
    stop: int
    folded: bool = False
    turn_start: bool = False
    image: dict | None = None

    def __len__(self) -> int:
        return self.stop - self.start


@dataclass
class Strip:
    """Everything a view needs to draw one record.

    Attributes:
        cells: ``[T]`` :class:`Cell`.
        segments: the runs of ``cells`` in order (they tile ``0..T``).
        title: one-line description (policy, task, reward ...).
        meta: key facts shown in headers (``T``, ``actions``, ``reward``, ``stop`` ...).
        decoded: how token text was obtained (``'word tokenizer'``, ``'hf: <name>'``, ``'ids'``).
    """
    cells: list
    segments: list
    title: str = ''
    meta: dict = field(default_factory=dict)
    decoded: str = ''

    @property
    def n_policy(self) -> int:
        """Number of policy-owned cells."""
        return sum(c.owner == 'policy' for c in self.cells)

    @property
    def mask_sum(self) -> int:
        """Sum of the stored action mask."""
        return sum(c.mask or 0 for c in self.cells)


# ----------------------------------------------------------------------------- token text

#: Unicode bidirectional formatting characters (UAX #9): they reorder how a line is displayed.
_BIDI = frozenset('\u200e\u200f\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069')


def display_text(text: str) -> str:
    """Make a token's text printable on one line with no blanks.

    Newlines become ``⏎``, tabs ``⇥``, spaces ``·``, other control characters (C0, DEL, C1)
    ``\\xNN`` and bidirectional overrides ``\\uNNNN``; an
    empty token becomes ``∅``. Word-tokenizer specials stay as they are, except ``<nl>`` -> ``⏎``.

    Example: ``display_text(' clamp')`` is ``'·clamp'``; ``display_text('\\n')`` is ``'⏎'``.
    """
    if text == '<nl>':
        return '⏎'
    if text == '':
        return '∅'
    out = []
    for ch in text:
        if ch == '\n':
            out.append('⏎')
        elif ch == '\t':
            out.append('⇥')
        elif ch == ' ':
            out.append('·')
        elif ord(ch) < 32 or 127 <= ord(ch) < 160:      # C0, DEL and C1 controls (C1 0x9b starts an escape)
            out.append(f'\\x{ord(ch):02x}')
        elif ch in _BIDI:
            out.append(f'\\u{ord(ch):04x}')
        else:
            out.append(ch)
    return ''.join(out)


# ----------------------------------------------------------------------------- strip

def _owner_name(code: int) -> str:
    return OWNER_NAMES[code] if 0 <= code < len(OWNER_NAMES) else f'?{code}'


def _marks(traj: Trajectory, marks: dict | None) -> dict:
    """Positions to highlight: explicit ``marks`` plus drift spans / refusals stored in ``info``."""
    out = {}
    info = traj.info or {}
    for start, stop in info.get('drift_spans') or []:
        for p in range(int(start), int(stop)):
            out[p] = 'drift'
    for p in info.get('refused_positions') or []:
        out[int(p)] = 'refused'
    out.update({int(k): str(v) for k, v in (marks or {}).items()})
    return out


def _title(traj: Trajectory) -> str:
    info = traj.info or {}
    prov = traj.provenance
    model = os.path.basename(prov.model) if prov and os.path.isabs(prov.model or '') else (prov.model if prov else '')
    bits = [prov.policy if prov and prov.policy else None, info.get('task'),
            model if model and prov.policy in ('model', 'hf') else None]
    return ' · '.join(str(b) for b in bits if b) or 'trajectory'


def _image_runs(traj: Trajectory, run, T: int) -> dict:
    """``{start: image dict}`` of the record's well-formed image runs inside ``ids`` (docs/design.md#images)."""
    if not has_images(traj.info):
        return {}
    try:
        refs = parse_images(traj.info['images'])
    except ValueError:                # the check words it; the strip draws the tokens
        return {}
    out, end = {}, 0
    for i, ref in sorted(enumerate(refs), key=lambda x: x[1].start):
        if ref.length and ref.start >= end and ref.start + ref.length <= T:
            out[ref.start] = {'index': i, 'digest': ref.digest, 'grid': list(ref.grid), 'length': ref.length,
                              'thumb': thumbnail_url(run, ref.digest) if run is not None else ''}
            end = ref.start + ref.length
    return out


def build_strip(traj: Trajectory, decoder: Decoder | None = None, *, fold: int = DEFAULT_FOLD,
                marks: dict | None = None, title: str | None = None, images=None) -> Strip:
    """Build the strip of one record.

    Args:
        traj: a :class:`~agentrl.record.Trajectory` with ``owner`` and ``turn`` ``[T]``.
        decoder: ``ids -> [T]`` token texts; default :func:`decoder_for`.
        fold: runs of a :data:`FOLDABLE` owner longer than this fold; 0 never folds.
        marks: extra highlights, position -> reason (drift spans, refused positions). Spans in
            ``info['drift_spans']`` (``[[start, stop], ...]``) and ``info['refused_positions']``
            are added automatically.
        title: header line; default from provenance and ``info['task']``.
        images: the run folder (or any trajectory path of the run) whose ``images/`` hold the record's
            images, for the thumbnails; None: image runs are drawn without one. Each image's run of
            placeholder ids (``info['images']``) is its own :class:`Segment` with ``image`` set.

    Returns:
        :class:`Strip` with ``T`` cells.

    Raises:
        ValueError: the record has no ``owner`` (fix: build it with ``Trajectory.from_tokens``)
            or its fields disagree in length.
    """
    if traj.owner is None:
        raise ValueError('record has no owner array, so ownership cannot be drawn; build records with '
                         'Trajectory.from_tokens (or a rollout), which records the owner of every token')
    traj.check_shapes()
    decoder = decoder or decoder_for(traj)
    ids = [int(i) for i in traj.ids.tolist()]
    texts = list(decoder(ids))
    if len(texts) != len(ids):
        raise ValueError(f'decoder returned {len(texts)} texts for {len(ids)} ids; it must return one per id')
    owner = [_owner_name(int(o)) for o in traj.owner.tolist()]
    turn = [int(t) for t in traj.turn.tolist()] if traj.turn is not None else [-1] * len(ids)
    mask = [int(round(float(m))) for m in traj.action_mask.tolist()]
    logp = [float(x) for x in traj.sample_logp.tolist()]
    hl = _marks(traj, marks)
    cells = [Cell(pos=i, id=ids[i], text=str(texts[i]), owner=owner[i], turn=turn[i],
                  mask=None if i == 0 else mask[i - 1], logp=None if i == 0 else logp[i - 1],
                  mark=hl.get(i, '')) for i in range(len(ids))]
    runs = _image_runs(traj, None if images is None else run_folder(images), len(ids))
    cuts = {p for s0, im in runs.items() for p in (s0, s0 + im['length'])}
    segments, start = [], 0
    for i in range(1, len(cells) + 1):
        if i == len(cells) or (owner[i], turn[i]) != (owner[start], turn[start]) or i in cuts:
            n = i - start
            im = runs.get(start) if runs.get(start, {}).get('length') == n else None
            segments.append(Segment(owner=owner[start], turn=turn[start], start=start, stop=i,
                                    folded=im is None and bool(fold) and owner[start] in FOLDABLE and n > fold,
                                    turn_start=start > 0 and turn[start] != turn[start - 1] and turn[start] >= 0,
                                    image=im))
            start = i
    info = traj.info or {}
    meta = {'T': len(ids), 'actions': sum(mask), 'policy cells': sum(o == 'policy' for o in owner),
            'reward': float(traj.reward), 'stop': info.get('stop'), 'turns': max(turn) + 1 if turn else 0}
    if traj.provenance is not None:
        meta['policy'] = traj.provenance.policy
        if traj.provenance.model:
            meta['model'] = traj.provenance.model
        if traj.provenance.logp_placeholder:           # a gym script has none; an import was sampled without them
            from ..gym.policies import POLICY_KINDS
            meta['logp'] = ('placeholder (scripted)' if traj.provenance.policy in POLICY_KINDS
                            else 'none (no sampling log-probs)')
        if traj.provenance.rollout_id:
            meta['rollout'] = f'{traj.provenance.rollout_id}#{traj.provenance.attempt}'
    if info.get('task'):
        meta['task'] = info['task']
    return Strip(cells=cells, segments=segments, title=_title(traj) if title is None else title,
                 meta={k: v for k, v in meta.items() if v not in (None, '')},
                 decoded=getattr(decoder, 'name', 'custom'))


_AUDIT_FIX = 'a template audit .json lists records {"ids": [int, ...], "owner": [name or code, ...], ...}'
_JSON_KINDS = {bool: 'true/false', int: 'a number', float: 'a number', str: 'a string', list: 'a list',
               dict: 'an object', type(None): 'null'}


def _kind(v) -> str:
    """What the JSON value ``v`` is, in JSON's words (``'a string'``, ``'an object'`` ...)."""
    return _JSON_KINDS.get(type(v), type(v).__name__)


def _audit_field(where: str, d: dict, key: str, n: tuple | None, ok, want: str, required: bool = False):
    """``d[key]`` checked to be a list (its length one of ``n`` when given) whose items pass ``ok``; None if absent."""
    if key not in d or d[key] is None:
        if required:
            raise ValueError(f'{where}: {key}: is missing; {_AUDIT_FIX}')
        return None
    v = d[key]
    if not isinstance(v, list):
        raise ValueError(f'{where}: {key}: is {_kind(v)}, not a list; give one {want} per token; {_AUDIT_FIX}')
    for j, x in enumerate(v):
        if not ok(x):
            raise ValueError(f'{where}: {key}[{j}]: is {x!r}, not a valid {want}; {_AUDIT_FIX}')
    if n is not None and len(v) not in n:
        raise ValueError(f'{where}: {key}: has {len(v)} entries, ids has {n[0]}; give one per token; {_AUDIT_FIX}')
    return v


def load_audit(path: str) -> list:
    """Read a template audit (JSON) as trajectories: each entry needs ``ids`` and ``owner``.

    Accepts one object, a list of objects, or ``{"records": [...]}``; each object has ``ids``
    ``[T]`` (ints >= 0), ``owner`` ``[T]`` (names or codes), optional ``turn`` ``[T]`` (ints),
    ``sample_logp`` ``[T]`` or ``[T-1]`` (numbers), ``reward`` (number), ``info`` (object),
    ``model`` (tokenizer name) and ``drift_spans``.

    Raises:
        ValueError: one line naming the file, the entry and the field: the file is not UTF-8
            JSON, or an entry lacks ``ids``/``owner`` or has a field of the wrong type or length
            (e.g. ``'a.json' entry 0: owner[1]: is 'bogus', not an owner name or code ...``).
    """
    data = read_json(path, fix=_AUDIT_FIX)
    if isinstance(data, dict) and 'records' in data:
        data = data['records']
        if not isinstance(data, list):
            raise ValueError(f'{str(path)!r}: records: is {_kind(data)}, not a list; {_AUDIT_FIX}')
    elif not isinstance(data, list):
        data = [data]
    is_int = lambda x: isinstance(x, int) and not isinstance(x, bool)          # noqa: E731
    is_num = lambda x: isinstance(x, (int, float)) and not isinstance(x, bool)  # noqa: E731
    out = []
    for k, d in enumerate(data):
        where = f'{str(path)!r} entry {k}'
        if not isinstance(d, dict):
            raise ValueError(f'{where}: is {_kind(d)}, not an object with "ids" and "owner"; {_AUDIT_FIX}')
        ids = _audit_field(where, d, 'ids', None, lambda x: is_int(x) and x >= 0, 'token id (int >= 0)', True)
        n = len(ids)
        is_owner = lambda x: (isinstance(x, str) and x in OWNER) or (is_int(x) and x in OWNER.values())  # noqa: E731
        owner = _audit_field(where, d, 'owner', (n,), is_owner,
                             f'owner name or code ({", ".join(OWNER_NAMES)} or 0-{len(OWNER) - 1})', True)
        turn = _audit_field(where, d, 'turn', (n,), is_int, 'turn index (int)')
        lp = _audit_field(where, d, 'sample_logp', (n, n - 1), is_num, 'number')
        lp = [0.0] * n if lp is None else lp if len(lp) == n else [0.0] + lp
        reward = d.get('reward', 0.0)
        if not is_num(reward):
            raise ValueError(f'{where}: reward: is {reward!r}, not a number; {_AUDIT_FIX}')
        if not isinstance(d.get('info') or {}, dict):
            raise ValueError(f'{where}: info: is {_kind(d["info"])}, not an object; {_AUDIT_FIX}')
        info = dict(d.get('info') or {})
        for key in ('drift_spans', 'refused_positions', 'task', 'tokenizer'):
            if key in d:
                info[key] = d[key]
        prov = Provenance(policy=str(d.get('policy', 'template')), model=str(d.get('model', '')))
        try:
            out.append(Trajectory.from_tokens(ids, owner, turn or [-1] * n, lp, float(reward), info,
                                              provenance=prov))
        except ValueError as e:
            raise ValueError(f'{where}: {e}') from None
    return out
