"""L4: durable Parquet storage of trajectories (pyarrow).

One row per episode. Token fields are list columns, provenance is flat columns, and the file's
Parquet metadata carries ``agentrl.schema_version``. Files are readable by pyarrow alone and by
``datasets.load_dataset('parquet', data_files=...)``; reading back through :func:`read_trajectories`
is exact (ids, owners, turns, masks, float32 log-probs bit for bit, float64 rewards).

Durability: every file is written under a hidden temporary name in the same folder (a name that
starts with ``.`` and does not end in ``.parquet``, so no reader or glob sees it), flushed to disk,
then renamed into place. A process killed mid-write leaves at most a hidden temporary file; every
shard that was visible before stays readable. :class:`ShardWriter` appends numbered shards and
stores a resent record once (identity ``(group_id, rollout_id, attempt)``), while a retry (a new
attempt) is a new row.

Source: docs/design.md#integrity.

Columns (schema version 1):

======================  ==================  ===============================================
column                  type                meaning
======================  ==================  ===============================================
ids                     list<int32>         token ids ``[T]``
owner                   list<int8>          owner codes ``[T]`` (null when the record had none)
turn                    list<int32>         turn index ``[T]`` (null when the record had none)
action_mask             list<int8>          0/1 aligned to ``ids[1:]`` ``[T-1]``
sample_logp             list<float32>       sampling log-prob aligned to ``ids[1:]`` ``[T-1]``
reward                  float64             episode reward
task                    string              ``info['task']`` (null when absent)
policy                  string              ``provenance.policy``
info                    string              JSON of ``info``
tokenizer, template     string              fingerprints
sampling                string              JSON of the :class:`~agentrl.record.SamplingSpec`
model                   string              model or checkpoint id
logp_placeholder        bool                True: ``sample_logp`` is a placeholder
group_id, rollout_id    string              identity
attempt                 int32               identity (null: the record had no provenance)
seed                    int64               episode seed (nullable)
agentrl_version         string              library version that built the record
turn_contexts           string              JSON ``[[start, [ids...]], ...]`` or null
digest                  string              ``v2:<content>:<row>`` (see below)
======================  ==================  ===============================================

The ``digest`` of a row written by this version is ``'v2:' + content + ':' + row``: ``content`` is
:func:`agentrl.checks.record_digest` (ids, owner, turn, action_mask, sample_logp, reward; what
deduplication compares) and ``row`` is sha256 (32 hex digits) of ``content`` and the sorted-key
JSON of every other stored column (provenance, ``task``, ``info``, ``turn_contexts``) as stored, so
an edit of any cell is a :class:`~agentrl.checks.errors.DigestMismatchError`. Files written before
digest version 2 store the bare 32-digit content digest; such a row is verified with that rule.
"""
from __future__ import annotations

import json
import os
import re
from collections import ChainMap
from pathlib import Path
from typing import Iterable, Iterator

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch

from ._version import __version__
from .checks.errors import DigestMismatchError, MalformedRowError, RecordError
from .checks.identity import dedupe, record_digest
from .io import atomic_path, pid_alive
from .record import Provenance, SamplingSpec, Trajectory

__all__ = ['SCHEMA_VERSION', 'SCHEMA', 'write_trajectories', 'read_trajectories', 'iter_batches', 'scan',
           'StoredRow', 'data_files', 'ShardWriter', 'stored_identities', 'to_table', 'from_table', 'content_digest']

#: Version of the row layout below; stored in each file's metadata as ``agentrl.schema_version``.
SCHEMA_VERSION = 1
_META_VERSION = b'agentrl.schema_version'

_TOKEN_COLUMNS = [  # name, arrow value type, numpy dtype on disk, torch dtype in the record
    ('ids', pa.int32(), np.int32, torch.long),
    ('owner', pa.int8(), np.int8, torch.long),
    ('turn', pa.int32(), np.int32, torch.long),
    ('action_mask', pa.int8(), np.int8, torch.float32),
    ('sample_logp', pa.float32(), np.float32, torch.float32),
]
_STRING_PROV = ('tokenizer', 'template', 'model', 'group_id', 'rollout_id', 'agentrl_version')
#: Stored columns covered by the row part of a version-2 digest (everything but tokens, reward, digest).
_ROW_DIGEST_COLUMNS = ('task', 'policy', 'info', 'tokenizer', 'template', 'sampling', 'model', 'logp_placeholder',
                       'group_id', 'rollout_id', 'attempt', 'seed', 'agentrl_version', 'turn_contexts')
_DIGEST_V2 = 'v2:'

#: The Arrow schema of a trajectory file (metadata includes the schema version).
SCHEMA = pa.schema(
    [pa.field(name, pa.list_(pa.field('item', t, nullable=False))) for name, t, _, _ in _TOKEN_COLUMNS]
    + [pa.field('reward', pa.float64()), pa.field('task', pa.string()), pa.field('policy', pa.string()),
       pa.field('info', pa.string()), pa.field('tokenizer', pa.string()), pa.field('template', pa.string()),
       pa.field('sampling', pa.string()), pa.field('model', pa.string()),
       pa.field('logp_placeholder', pa.bool_()), pa.field('group_id', pa.string()),
       pa.field('rollout_id', pa.string()), pa.field('attempt', pa.int32()), pa.field('seed', pa.int64()),
       pa.field('agentrl_version', pa.string()), pa.field('turn_contexts', pa.string()),
       pa.field('digest', pa.string())],
    metadata={_META_VERSION: str(SCHEMA_VERSION).encode(), b'agentrl.kind': b'trajectories',
              b'agentrl.version': __version__.encode()})

_SHARD_RE = re.compile(r'^part-(\d{6,})\.parquet$')
_TEMP_RE = re.compile(r'^\..+\.tmp-(\d+)-[0-9a-f]+$')


# ----------------------------------------------------------------------------- records -> table

def _np(t, dtype, name: str, i: int) -> np.ndarray:
    """One record's field as a flat numpy array; integer columns keep int64 here and are
    range-checked once per column in :func:`_list_array` (one pass over all records)."""
    a = torch.as_tensor(t).detach().to('cpu').reshape(-1)
    if a.dtype.is_floating_point and not np.issubdtype(dtype, np.floating):
        if name != 'action_mask' and not bool(torch.all(a == a.round())):   # action_mask: checked 0/1 already
            raise ValueError(f'store: record {i} field {name} holds non-integer values; {name} must hold '
                             'integers (build records with Trajectory.from_tokens)')
        return a.numpy().astype(dtype)
    return a.numpy()


def _list_array(rows: list, value_type: pa.DataType, np_dtype, name: str = '') -> pa.Array:
    lengths = np.fromiter((0 if r is None else len(r) for r in rows), dtype=np.int64, count=len(rows))
    offsets = np.zeros(len(rows) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    if offsets[-1] > np.iinfo(np.int32).max:
        raise ValueError('store: more than 2**31 tokens in one file; write fewer records per shard')
    present = [r for r in rows if r is not None]
    values = np.concatenate(present) if present else np.zeros(0, dtype=np_dtype)
    if np.issubdtype(np_dtype, np.integer) and values.size and values.dtype != np_dtype:
        lo, hi = np.iinfo(np_dtype).min, np.iinfo(np_dtype).max
        if values.min() < lo or values.max() > hi:
            i = next(i for i, r in enumerate(rows) if r is not None and r.size and (r.min() < lo or r.max() > hi))
            raise ValueError(f'store: record {i} field {name} has values outside [{lo}, {hi}], the range '
                             f'its column stores; check the record (ids must be token ids)')
    values = values.astype(np_dtype, copy=False)
    nulls = np.fromiter((r is None for r in rows), dtype=bool, count=len(rows))
    mask = pa.array(nulls) if nulls.any() else None
    return pa.ListArray.from_arrays(pa.array(offsets.astype(np.int32)), pa.array(values, type=value_type),
                                    mask=mask).cast(pa.list_(pa.field('item', value_type, nullable=False)))


def _json(obj, what: str, i: int) -> str:
    try:
        return json.dumps(obj)
    except (TypeError, ValueError) as e:
        raise ValueError(f'store: record {i} {what} is not JSON-serialisable ({e}); keep info values to '
                         'str, int, float, bool, None, lists and dicts') from None


def to_table(trajs: Iterable[Trajectory], digests: list[str] | None = None) -> pa.Table:
    """Convert trajectories to one Arrow table with :data:`SCHEMA` (one row per episode).

    Args:
        trajs: records; ``ids [T]``, ``owner``/``turn`` ``[T]`` or None, ``action_mask`` and
            ``sample_logp`` ``[T-1]``.
        digests: precomputed :func:`agentrl.checks.record_digest` (content digest) per record
            (computed if None); the stored ``digest`` adds the row part (see the module docs).

    Returns:
        ``pyarrow.Table`` with the schema version in its metadata.

    Raises:
        ValueError: an ``action_mask`` entry not in {0, 1} (fix: masks are derived by
            ``Trajectory.from_tokens``), ids outside int32, owner codes outside int8, or an
            ``info`` that is not JSON-serialisable (fix: plain JSON values). Each names the record.
    """
    trajs = list(trajs)
    digests = [record_digest(t) for t in trajs] if digests is None else digests
    cols: dict[str, list] = {name: [] for name in SCHEMA.names}
    for i, t in enumerate(trajs):
        for name, _, dtype, _ in _TOKEN_COLUMNS:
            v = getattr(t, name)
            if v is None and name in ('ids', 'action_mask', 'sample_logp'):
                raise ValueError(f'store: record {i} has no {name}; every record needs ids, action_mask '
                                 'and sample_logp')
            if name == 'action_mask' and not bool(((v == 0) | (v == 1)).all()):
                raise ValueError(f'store: record {i} action_mask has values other than 0 and 1; masks are '
                                 '0/1 (build records with Trajectory.from_tokens)')
            cols[name].append(None if v is None else _np(v, dtype, name, i))
        info = t.info or {}
        p = t.provenance
        cols['reward'].append(float(t.reward))
        cols['task'].append(None if info.get('task') is None else str(info.get('task')))
        cols['info'].append(_json(info, 'info', i))
        cols['policy'].append(None if p is None else p.policy)
        for name in _STRING_PROV:
            cols[name].append(None if p is None else str(getattr(p, name)))
        cols['sampling'].append(None if p is None or p.sampling is None
                                else json.dumps(p.sampling.to_dict(), sort_keys=True))
        cols['logp_placeholder'].append(None if p is None else bool(p.logp_placeholder))
        cols['attempt'].append(None if p is None else int(p.attempt))
        cols['seed'].append(None if p is None or p.seed is None else int(p.seed))
        cols['turn_contexts'].append(None if t.turn_contexts is None else _json(
            [[int(s), torch.as_tensor(c).tolist()] for s, c in t.turn_contexts], 'turn_contexts', i))
        cols['digest'].append(_row_digest(digests[i], {c: cols[c][i] for c in _ROW_DIGEST_COLUMNS}))
    np_types = {name: dtype for name, _, dtype, _ in _TOKEN_COLUMNS}
    arrays = []
    for f in SCHEMA:
        if f.name in np_types:
            arrays.append(_list_array(cols[f.name], f.type.value_type, np_types[f.name], f.name))
        else:
            arrays.append(pa.array(cols[f.name], type=f.type))
    return pa.Table.from_arrays(arrays, schema=SCHEMA)


# ----------------------------------------------------------------------------- table -> records

def _check_schema(schema: pa.Schema, where: str) -> None:
    meta = schema.metadata or {}
    if _META_VERSION not in meta:
        raise ValueError(f'{where} is not an agentrl trajectory file (no {_META_VERSION.decode()} in its '
                         'Parquet metadata); write it with agentrl.store.write_trajectories or ShardWriter')
    try:
        version = int(meta[_META_VERSION])
    except ValueError:
        raise ValueError(f'{where} has an unreadable schema version {meta[_META_VERSION][:20]!r}; it is not a '
                         'trajectory file written by agentrl') from None
    if version > SCHEMA_VERSION:
        raise ValueError(f'{where} has schema version {version}, newer than this agentrl reads '
                         f'({SCHEMA_VERSION}); upgrade agentrl')
    missing = [n for n in ('ids', 'action_mask', 'sample_logp', 'reward') if n not in schema.names]
    if missing:
        raise ValueError(f'{where} lacks the columns {missing}; it is not a complete trajectory file')
    for f in schema:
        want = SCHEMA.field(f.name).type if f.name in SCHEMA.names else None
        if want is not None and not f.type.equals(want) and not _compatible(f.type, want):
            raise ValueError(f'{where} column {f.name!r} has type {f.type}, not {want}; it is not a trajectory '
                             'file written by agentrl (rewrite it with agentrl.store.write_trajectories)')


def _compatible(got: pa.DataType, want: pa.DataType) -> bool:
    """Same kind of values (lists of integers, floats, strings ...), whatever the width or item nullability.

    pyarrow concatenation, pandas and ``datasets`` round trips may widen integers or drop the
    items' non-null flag; values are range-checked when rows are converted.
    """
    if pa.types.is_list(got) or pa.types.is_large_list(got):
        return pa.types.is_list(want) and _compatible(got.value_type, want.value_type)
    kinds = (pa.types.is_integer, pa.types.is_floating, pa.types.is_boolean,
             lambda t: pa.types.is_string(t) or pa.types.is_large_string(t))
    return any(k(got) and k(want) for k in kinds) or pa.types.is_null(got)


def _lists(col: pa.Array):
    """``(offsets, values, row valid, item valid or None)`` of a list column, as numpy arrays.

    A column of Arrow type null (every row null) reads as a list column whose rows are all null.
    """
    if pa.types.is_null(col.type):
        n = len(col)
        return np.zeros(n + 1, dtype=np.int64), np.zeros(0), np.zeros(n, dtype=bool), None
    values = col.values
    item_valid = values.is_valid().to_numpy(zero_copy_only=False) if values.null_count else None
    return (col.offsets.to_numpy(), values.to_numpy(zero_copy_only=False),
            col.is_valid().to_numpy(zero_copy_only=False), item_valid)


_SAMPLING_KEYS = frozenset(f for f in SamplingSpec.__dataclass_fields__)
_REQUIRED_LISTS = ('ids', 'action_mask', 'sample_logp')
_DIGEST_DTYPES = (('ids', np.int64), ('owner', np.int64), ('turn', np.int64), ('mask', np.float32),
                  ('logp', np.float32))


def _digest_np(arrays: dict, reward: float) -> str:
    """:func:`agentrl.checks.record_digest` computed from the stored numpy slices (same bytes, no torch)."""
    import hashlib
    h = hashlib.sha256()
    for (name, dt), col in zip(_DIGEST_DTYPES, ('ids', 'owner', 'turn', 'action_mask', 'sample_logp')):
        h.update(name.encode())
        a = arrays.get(col)
        h.update(b'<none>' if a is None else (a if a.dtype == dt else a.astype(dt)).tobytes())
    h.update(b'reward')
    h.update(np.float64(reward).tobytes())
    return h.hexdigest()[:32]


def _row_digest(content: str, stored: dict) -> str:
    """Version-2 stored digest: ``'v2:' + content + ':' + sha256(content, sorted-key JSON of ``stored``)[:32]``.

    ``stored`` maps each :data:`_ROW_DIGEST_COLUMNS` name to its stored cell value (str, int, bool or None).
    """
    import hashlib
    payload = json.dumps({c: stored.get(c) for c in _ROW_DIGEST_COLUMNS}, sort_keys=True, separators=(',', ':'))
    row = hashlib.sha256(f'agentrl-row-v2\0{content}\0{payload}'.encode()).hexdigest()[:32]
    return f'{_DIGEST_V2}{content}:{row}'


def content_digest(stored: str | None) -> str | None:
    """The content part (:func:`agentrl.checks.record_digest`, 32 hex digits) of a stored ``digest``.

    A version-2 digest ``'v2:<content>:<row>'`` gives ``<content>``; an older bare digest (or None) is
    returned as is. Raises nothing.
    """
    if isinstance(stored, str) and stored.startswith(_DIGEST_V2):
        return stored[len(_DIGEST_V2):].split(':', 1)[0]
    return stored


def _bad(field: str, what: str, fix: str) -> MalformedRowError:
    return MalformedRowError(what, field=field, fix=fix)


def _json_field(raw, field: str, fix: str):
    try:
        return json.loads(raw)
    except (TypeError, ValueError) as e:
        raise _bad(field, f'is not valid JSON ({str(e)[:60]})', fix) from None


def _sampling(raw) -> SamplingSpec | None:
    if raw is None:
        return None
    fix = ('store SamplingSpec.to_dict() (keys ' + ', '.join(sorted(_SAMPLING_KEYS)) + '); rewrite the row with '
           'agentrl.store.write_trajectories')
    d = _json_field(raw, 'sampling', fix)
    if d is None:
        return None
    if not isinstance(d, dict):
        raise _bad('sampling', f'is a JSON {type(d).__name__}, not an object', fix)
    unknown = sorted(set(d) - _SAMPLING_KEYS)
    if unknown:
        raise _bad('sampling', f'has unknown keys {unknown[:5]}', fix)
    try:
        return SamplingSpec(**d)
    except (TypeError, ValueError) as e:
        raise _bad('sampling', ' '.join(str(e).split()), fix) from None


def _turn_contexts(raw, T: int):
    if raw is None:
        return None
    fix = 'store [[start, [ids...]], ...] with 0 < start <= T and integer ids (ChatRecorder does)'
    tc = _json_field(raw, 'turn_contexts', fix)
    if not isinstance(tc, list):
        raise _bad('turn_contexts', f'is a JSON {type(tc).__name__}, not a list', fix)
    out = []
    for k, item in enumerate(tc):
        ok = (isinstance(item, list) and len(item) == 2 and type(item[0]) is int and isinstance(item[1], list)
              and all(type(i) is int and 0 <= i < 2**63 for i in item[1]))
        if not ok or not 0 <= item[0] <= T:
            raise _bad('turn_contexts', f'entry {k} is not [start in [0, {T}], [integer ids...]]: '
                                        f'{json.dumps(item)[:60]}', fix)
        out.append((item[0], torch.tensor(item[1], dtype=torch.long)))
    return out


def _info(raw) -> dict:
    if raw is None:
        return {}
    fix = 'store a JSON object (the episode info dict); rewrite the row with agentrl.store.write_trajectories'
    d = _json_field(raw, 'info', fix)
    if not isinstance(d, dict):
        raise _bad('info', f'is a JSON {type(d).__name__}, not an object', fix)
    return d


def _row(toks: dict, get, i: int, verify: bool) -> Trajectory:
    """Convert row ``i`` (validated field by field); raise MalformedRowError / DigestMismatchError."""
    arrays = {}
    for name, ((offs, vals, valid, item_valid), tdt) in toks.items():
        if not valid[i]:
            if name in _REQUIRED_LISTS:
                raise _bad(name, 'is null; every record stores ids, action_mask and sample_logp',
                           'drop the row, or rewrite the file from its records with agentrl.store.write_trajectories')
            arrays[name] = None
            continue
        if item_valid is not None and not item_valid[offs[i]:offs[i + 1]].all():
            j = int(np.argmin(item_valid[offs[i]:offs[i + 1]]))
            raise MalformedRowError('is null; every entry of a token list is a number', field=name, position=j,
                                    fix='drop the row, or rewrite the file with agentrl.store.write_trajectories')
        arrays[name] = vals[offs[i]:offs[i + 1]].astype(_tdt_np(tdt))
    for name in _REQUIRED_LISTS:
        if name not in arrays:
            raise _bad(name, 'is missing', 'write the file with agentrl.store.write_trajectories')
    reward = get('reward', i)
    if reward is None or isinstance(reward, bool) or not isinstance(reward, (int, float)):
        raise _bad('reward', f'is {reward!r}, not a number',
                   'store the episode reward (a float); drop rows that were never scored')
    reward = float(reward)
    prov = None
    attempt = get('attempt', i)
    if attempt is not None:
        seed = get('seed', i)
        prov = Provenance(policy=get('policy', i) or '', tokenizer=get('tokenizer', i) or '',
                          template=get('template', i) or '', sampling=_sampling(get('sampling', i)),
                          model=get('model', i) or '', logp_placeholder=bool(get('logp_placeholder', i)),
                          group_id=get('group_id', i) or '', rollout_id=get('rollout_id', i) or '',
                          attempt=int(attempt), seed=None if seed is None else int(seed),
                          agentrl_version=get('agentrl_version', i) or '')
    T = len(arrays['ids'])
    tc = _turn_contexts(get('turn_contexts', i), T)
    info = _info(get('info', i))
    stored = get('digest', i)
    if verify and stored is None:
        raise MalformedRowError('is missing: every row agentrl writes carries the digest of its content, so a '
                                'row without one cannot be trusted', field='digest',
                                fix='re-run the rollout for this episode, or read with verify=False to inspect it')
    if verify:
        content = _digest_np(arrays, reward)
        v2 = isinstance(stored, str) and stored.startswith(_DIGEST_V2)
        want = _row_digest(content, {c: get(c, i) for c in _ROW_DIGEST_COLUMNS}) if v2 else content
        if want != stored:
            what = ('ids, owner, turn, action_mask, sample_logp, reward, provenance, task, info, turn_contexts'
                    if v2 else 'ids, owner, turn, action_mask, sample_logp, reward')
            raise DigestMismatchError(
                f'the stored digest {str(stored)[:12]}... does not match the row\'s content ({what}): the row was '
                'edited after writing', field='digest',
                fix='re-run the rollout for this episode; never edit a stored record in place')
    fields = {name: None if a is None else torch.from_numpy(a) for name, a in arrays.items()}
    return Trajectory(ids=fields['ids'], action_mask=fields['action_mask'], sample_logp=fields['sample_logp'],
                      reward=reward, info=info, owner=fields.get('owner'), turn=fields.get('turn'),
                      provenance=prov, turn_contexts=tc)


def _rows(rb: pa.RecordBatch, source: str, first_row: int, verify: bool) -> Iterator:
    """``(row_number, Trajectory or RecordError)`` for each row of one record batch."""
    names = rb.schema.names
    toks = {}
    for name, _, _, tdt in _TOKEN_COLUMNS:
        if name in names:
            toks[name] = (_lists(rb.column(name)), tdt)
    py = {name: rb.column(name).to_pylist() for name in names if name not in toks}
    get = lambda name, i: py[name][i] if name in py else None  # noqa: E731
    for i in range(rb.num_rows):
        where = f'{source} row {first_row + i}'
        try:
            yield first_row + i, _row(toks, get, i, verify)
        except RecordError as e:
            yield first_row + i, e.at(where)


def from_table(table: pa.Table | pa.RecordBatch, *, source: str = 'table', first_row: int = 0,
               verify: bool = True) -> list[Trajectory]:
    """Convert rows of a trajectory table (or record batch) back to :class:`Trajectory` objects.

    Every row is validated as it is converted: required token lists present, a numeric reward,
    ``info`` a JSON object, ``sampling`` a :class:`~agentrl.record.SamplingSpec` with known keys
    and ranges, ``turn_contexts`` well formed, and (``verify``) the stored ``digest`` equal to
    the row's content.

    Args:
        table: rows with :data:`SCHEMA` columns (extra columns are ignored; ``owner``, ``turn``
            and the provenance columns may be absent).
        source: how to name the rows in errors (e.g. the file path).
        first_row: row number of the table's first row within ``source``.
        verify: compare each row's stored digest with its content (default True).

    Returns:
        list of Trajectory: ``ids``/``owner``/``turn`` int64, ``action_mask``/``sample_logp``
        float32 (bit-exact), ``reward`` float, ``info`` dict, ``provenance`` (None when the row's
        ``attempt`` is null), ``turn_contexts`` as ``[(start, ids int64 tensor)]`` or None.

    Source: docs/design.md#integrity (a stored digest that no longer matches means an edit).

    Raises:
        MalformedRowError: a row that cannot be converted; the one-line message names the source,
            the row, the field and the fix (``'f.parquet' row 3: reward: is None, not a number``).
        DigestMismatchError: ``verify`` and a row whose content no longer matches its digest.
    """
    batches = table.to_batches() if isinstance(table, pa.Table) else [table]
    out: list[Trajectory] = []
    for rb in batches:
        for _, rec in _rows(rb, source, first_row, verify):
            if isinstance(rec, RecordError):
                raise rec
            out.append(rec)
        first_row += rb.num_rows
    return out


def _tdt_np(tdt: torch.dtype):
    return np.int64 if tdt == torch.long else np.float32


# ----------------------------------------------------------------------------- files

def data_files(path: str | os.PathLike) -> list[str]:
    """The Parquet files of a trajectory file or dataset folder, in order.

    Args:
        path: a ``.parquet`` file, or a folder of them (shards ``part-000000.parquet`` ...), or a
            run folder of ``agentrl rollout`` (its ``trajectories/`` shards are read). Hidden names
            (``.``, ``_``) such as in-progress temporary files are skipped.

    Returns:
        Sorted list of file paths (str); pass it to ``datasets.load_dataset('parquet',
        data_files=...)`` or ``pyarrow.parquet.read_table``.

    Raises:
        FileNotFoundError: nothing at ``path``. Fix: check the path.
    """
    p = Path(path)
    if p.is_dir():
        found = sorted(str(f) for f in p.iterdir()
                       if f.suffix == '.parquet' and not f.name.startswith(('.', '_')) and f.is_file())
        if not found and (p / 'trajectories').is_dir() and (p / 'run.json').is_file():
            return data_files(p / 'trajectories')          # a run folder: its shards
        return found
    if p.is_file():
        return [str(p)]
    raise FileNotFoundError(f'no trajectory file or folder at {str(p)!r}')


def _parquet(f) -> pq.ParquetFile:
    """Open ``f`` as Parquet, or raise ValueError naming the file and the fix."""
    try:
        os.fsdecode(f).encode('utf-8')
    except UnicodeEncodeError:            # pyarrow takes UTF-8 paths only
        raise ValueError(f'{os.fsdecode(f)!r}: the file name is not valid UTF-8; rename it (shards are named '
                         'part-NNNNNN.parquet) or move it out of the folder') from None
    try:
        return pq.ParquetFile(f)
    except UnicodeDecodeError as e:       # a damaged footer: a column name or metadata key that is not UTF-8
        raise ValueError(f'{str(f)!r} is damaged: its Parquet metadata is not UTF-8 (byte 0x{e.object[e.start]:02x} '
                         'in a column name or key); re-run the rollout that wrote it, or remove the file') from None
    except (pa.ArrowException, OSError) as e:
        if isinstance(e, FileNotFoundError):
            raise
        raise ValueError(f'{str(f)!r} is not a Parquet file ({str(e).splitlines()[0][:120] if str(e) else type(e).__name__}); '
                         'pass the trajectories.parquet written by `agentrl rollout` or a folder of its shards') from None


def _batches(pf: pq.ParquetFile, f: str, batch_size: int) -> Iterator[pa.RecordBatch]:
    """Record batches of ``pf``; a damaged file becomes a one-line ValueError naming it."""
    try:
        yield from pf.iter_batches(batch_size=batch_size)
    except UnicodeDecodeError as e:
        raise ValueError(f'{f!r} is damaged: its Parquet metadata is not UTF-8 (byte 0x{e.object[e.start]:02x} '
                         'in a column name or key); re-run the rollout that wrote it, or remove the file') from None
    except (pa.ArrowException, OSError) as e:
        raise ValueError(f'{f!r} is damaged and cannot be read ({" ".join(str(e).split())[:120]}); re-run the '
                         'rollout that wrote it, or remove the file') from None


class StoredRow:
    """One stored row as read: where it is, the record or why it could not be read.

    Attributes:
        file: the Parquet file (str). row: the row number within it (from 0).
        record: the :class:`~agentrl.record.Trajectory`, or None when the row is malformed.
        problem: the :class:`~agentrl.checks.RecordError` (MalformedRowError,
            DigestMismatchError) when the row could not be trusted, else None.
    """
    __slots__ = ('file', 'row', 'record', 'problem')

    def __init__(self, file: str, row: int, record, problem):
        self.file, self.row, self.record, self.problem = file, row, record, problem

    @property
    def source(self) -> str:
        """``"'FILE' row N"``, as error messages name the row."""
        return f'{self.file!r} row {self.row}'


def scan(path: str | os.PathLike, batch_size: int = 256, *, verify: bool = True) -> Iterator[list[StoredRow]]:
    """Stream every row of a trajectory file or folder, keeping malformed rows as problems.

    The reader behind ``agentrl check``: unlike :func:`iter_batches` it does not stop at a bad
    row, so every row can be reported.

    Args:
        path: a trajectory file or folder of shards.
        batch_size: rows per yielded list (> 0; lists do not span files).
        verify: compare stored digests with the rows' content (default True).

    Yields:
        list of :class:`StoredRow`, in file order then row order.

    Raises:
        FileNotFoundError: nothing at ``path``.
        ValueError: ``batch_size`` < 1; a file that is not a trajectory file, or is damaged.
    """
    if batch_size < 1:
        raise ValueError(f'batch_size must be >= 1, got {batch_size}')
    for f in data_files(path):
        pf = _parquet(f)
        _check_schema(pf.schema_arrow, repr(f))
        row = 0
        for rb in _batches(pf, f, batch_size):
            out = []
            for n, rec in _rows(rb, repr(f), row, verify):
                bad = isinstance(rec, RecordError)
                out.append(StoredRow(f, n, None if bad else rec, rec if bad else None))
            row += rb.num_rows
            yield out


def read_trajectories(path: str | os.PathLike, *, verify: bool = True) -> list[Trajectory]:
    """Read every record of a trajectory file or dataset folder.

    Args:
        path: a file written by :func:`write_trajectories` or a folder of shards.
        verify: compare each row's stored digest with its content (default True).

    Returns:
        list of Trajectory, in file order then row order (exact round trip of what was written).

    Raises:
        FileNotFoundError: nothing at ``path``.
        ValueError: a file without ``agentrl.schema_version`` metadata, or with a newer version
            (fix: upgrade agentrl), or damaged.
        MalformedRowError, DigestMismatchError: a row that cannot be trusted (see :func:`from_table`);
            the message names the file, the row and the field.
    """
    out: list[Trajectory] = []
    for batch in iter_batches(path, 4096, verify=verify):
        out.extend(batch)
    return out


def iter_batches(path: str | os.PathLike, batch_size: int = 64, *, verify: bool = True) -> Iterator[list[Trajectory]]:
    """Stream records in lists of ``batch_size`` without loading the dataset into memory.

    Args:
        path: a trajectory file or folder of shards.
        batch_size: records per yielded list (> 0); the last list may be shorter. Batches span
            shard boundaries.
        verify: compare each row's stored digest with its content (default True).

    Yields:
        list of Trajectory, in the order :func:`read_trajectories` returns them.

    Raises:
        ValueError: ``batch_size`` < 1, or a file that is not a trajectory file.
        FileNotFoundError: nothing at ``path``.
        MalformedRowError, DigestMismatchError: a row that cannot be trusted (see :func:`from_table`).
    """
    if batch_size < 1:
        raise ValueError(f'iter_batches: batch_size must be >= 1, got {batch_size}')
    buf: list[Trajectory] = []
    for rows in scan(path, batch_size, verify=verify):
        for r in rows:
            if r.problem is not None:
                raise r.problem
            buf.append(r.record)
        while len(buf) >= batch_size:
            yield buf[:batch_size]
            buf = buf[batch_size:]
    if buf:
        yield buf


def _write_temp(table: pa.Table, tmp: Path, fsync: bool) -> None:
    """Write the Parquet bytes of ``table`` to the temporary path ``tmp`` (flushed by the caller)."""
    pq.write_table(table, tmp, compression='zstd')


def _write_table(table: pa.Table, final: Path, fsync: bool, overwrite: bool) -> None:
    """Write ``table`` to ``final`` through :func:`agentrl.io.atomic_path` (hidden temp file, then rename)."""
    with atomic_path(final, fsync=fsync, overwrite=overwrite) as tmp:
        _write_temp(table, tmp, fsync)


def write_trajectories(path: str | os.PathLike, trajs: Iterable[Trajectory], *, fsync: bool = True) -> Path:
    """Write records to one Parquet file, atomically.

    The table is written to a hidden temporary file in the same folder, flushed, and renamed
    over ``path``: readers see the old file or the new one, never a half-written one.

    Args:
        path: target file (``.parquet`` recommended); parent folders are created.
        trajs: the records (see :func:`to_table` for the layout).
        fsync: flush the file and folder to disk before returning (default True).

    Returns:
        The written path.

    Raises:
        ValueError: ``path`` is a folder (fix: use :class:`ShardWriter` for folders), or a record
            cannot be stored (see :func:`to_table`).

    Source: docs/design.md#integrity.
    """
    final = Path(path)
    if final.is_dir():
        raise ValueError(f'write_trajectories: {str(final)!r} is a folder; pass a file path, or use '
                         'ShardWriter to append shards to a folder')
    final.parent.mkdir(parents=True, exist_ok=True)
    _write_table(to_table(trajs), final, fsync, overwrite=True)
    return final


def stored_identities(directory: str | os.PathLike) -> dict[tuple[str, str], int]:
    """The episodes a shard folder already holds: ``(group_id, rollout_id) -> highest attempt``.

    Reads only the identity columns. Hidden temporary files (shards a killed writer did not
    finish) are not read.

    Args:
        directory: a :class:`ShardWriter` folder; a missing folder holds nothing.

    Returns:
        dict, empty for a missing or empty folder.

    Raises:
        ValueError: a file in the folder is not an agentrl trajectory file.
    """
    if not Path(directory).is_dir():
        return {}
    out: dict[tuple[str, str], int] = {}
    for f in data_files(directory):
        pf = _parquet(f)
        _check_schema(pf.schema_arrow, f)
        t = pf.read(columns=['group_id', 'rollout_id', 'attempt']).to_pydict()
        for g, r, a in zip(t['group_id'], t['rollout_id'], t['attempt']):
            key = (g or '', r or '')
            out[key] = max(out.get(key, 0), int(a or 0))
    return out


class ShardWriter:
    """Append records to a dataset folder as numbered shards, storing each record once.

    Each :meth:`write` call makes one shard ``part-NNNNNN.parquet`` (written to a hidden temporary
    name, then renamed; an existing shard is never replaced). Opening a folder that already has
    shards continues the numbering and remembers what they hold, so a resend after a restart is
    still stored once. Temporary files left by killed writers (dead process ids) are removed.

    Identity rules (:func:`agentrl.checks.dedupe`): a record that repeats a stored identity
    ``(group_id, rollout_id, attempt)`` with the same content is a resend and is skipped; a
    retry has a new ``attempt`` and is a new row; a repeated identity with different content
    raises. Records without a group or rollout id are keyed by content (exact duplicates are
    skipped).

    Args:
        directory: the dataset folder (created if missing).
        fsync: flush each shard and the folder before :meth:`write` returns (default True).

    Attributes:
        directory: Path of the folder. shards: paths written by this writer.
        n_written: rows written by this writer. n_resent: resends skipped.

    Raises:
        ValueError: ``directory`` is a file (fix: pass a folder).
        IdentityConflictError: (from :meth:`write`) see above. Fix: give retries
            :func:`agentrl.checks.new_attempt`.

    Example:
        >>> with ShardWriter('out/trajs') as w:       # doctest: +SKIP
        ...     w.write(batch_0); w.write(batch_0)    # the second write stores nothing

    Source: docs/design.md#integrity.
    """

    def __init__(self, directory: str | os.PathLike, *, fsync: bool = True):
        self.directory = Path(directory)
        if self.directory.exists() and not self.directory.is_dir():
            raise ValueError(f'ShardWriter: {str(self.directory)!r} is a file; pass a folder')
        self.directory.mkdir(parents=True, exist_ok=True)
        self.fsync = fsync
        self.shards: list[Path] = []
        self.n_written = 0
        self.n_resent = 0
        self._seen: dict = {}
        self._remove_stale_temps()
        indices = []
        for f in self.directory.iterdir():
            m = _SHARD_RE.match(f.name)
            if m:
                indices.append(int(m.group(1)))
                self._remember(f)
        self._next = max(indices) + 1 if indices else 0

    def _remove_stale_temps(self) -> None:
        for f in self.directory.iterdir():
            m = _TEMP_RE.match(f.name)
            if m and int(m.group(1)) != os.getpid() and not pid_alive(int(m.group(1))):
                f.unlink(missing_ok=True)

    def _remember(self, f: Path) -> None:
        pf = _parquet(f)
        _check_schema(pf.schema_arrow, str(f))
        cols = [c for c in ('group_id', 'rollout_id', 'attempt', 'digest') if c in pf.schema_arrow.names]
        t = pf.read(columns=cols).to_pydict()
        n = pf.metadata.num_rows
        g, r, a, d = (t.get(c, [None] * n) for c in ('group_id', 'rollout_id', 'attempt', 'digest'))
        for gi, ri, ai, di in zip(g, r, a, d):
            key = ('id', gi or '', ri or '', int(ai)) if ai is not None and (gi or ri) else ('digest', di)
            self._seen[key] = content_digest(di)

    def write(self, trajs: Iterable[Trajectory]) -> Path | None:
        """Store the new records of ``trajs`` as one shard.

        Args:
            trajs: records; resends of stored records are skipped.

        Returns:
            Path of the new shard, or None when every record was a resend (nothing written).

        Raises:
            IdentityConflictError: a record reuses a stored identity with different content.
            ValueError: a record cannot be stored (see :func:`to_table`).
        """
        new: dict = {}
        kept, n_resent = dedupe(trajs, seen=ChainMap(new, self._seen))
        if not kept:
            self.n_resent += n_resent
            return None
        table = to_table(kept, digests=list(new.values()))   # dedupe stored each kept record's digest in `new`
        while True:
            final = self.directory / f'part-{self._next:06d}.parquet'
            try:
                _write_table(table, final, self.fsync, overwrite=False)
            except FileExistsError:  # another writer took this number: take the next one
                self._next += 1
                continue
            break
        self._next += 1
        self._seen.update(new)
        self.shards.append(final)
        self.n_written += len(kept)
        self.n_resent += n_resent
        return final

    def close(self) -> None:
        """Nothing is buffered between writes; provided for ``with`` blocks."""

    def __enter__(self) -> 'ShardWriter':
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return (f'ShardWriter({str(self.directory)!r}, next shard {self._next}, written {self.n_written}, '
                f'resends skipped {self.n_resent})')
