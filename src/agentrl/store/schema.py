"""L4: the trajectory file format: its Arrow schema, the digest column, and records -> table.

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
policy_version          string              JSON of ``provenance.policy_version`` (int or str), or null
turn_policy_versions    string              JSON list of ``provenance.turn_policy_versions``, or null
digest                  string              ``v2:<content>:<row>`` (see below)
======================  ==================  ===============================================

The ``digest`` column follows docs/design.md#integrity: ``content`` is :func:`agentrl.checks.record_digest`
and ``row`` is sha256 (32 hex digits) of ``content`` and the sorted-key JSON of every other stored column as
stored (:func:`row_digest`); a cell edited after writing is a :class:`~agentrl.checks.errors.DigestMismatchError`.
"""
from __future__ import annotations

import hashlib
import json
from typing import Iterable

import numpy as np
import pyarrow as pa
from .._lazy import lazy_module

torch = lazy_module('torch')

from .._version import __version__
from ..checks.identity import record_digest
from ..record import Trajectory

__all__ = ['SCHEMA_VERSION', 'SCHEMA', 'to_table', 'content_digest']

#: Version of the row layout below; stored in each file's metadata as ``agentrl.schema_version``.
SCHEMA_VERSION = 1
_META_VERSION = b'agentrl.schema_version'

#: The per-token columns, in order.
TOKEN_COLUMNS = [  # name, arrow value type, numpy dtype on disk, numpy dtype of the record's tensor
    ('ids', pa.int32(), np.int32, np.int64),
    ('owner', pa.int8(), np.int8, np.int64),
    ('turn', pa.int32(), np.int32, np.int64),
    ('action_mask', pa.int8(), np.int8, np.float32),
    ('sample_logp', pa.float32(), np.float32, np.float32),
]
_STRING_PROV = ('tokenizer', 'template', 'model', 'group_id', 'rollout_id', 'agentrl_version')
#: Stored columns covered by the row part of a version-2 digest (everything but tokens, reward, digest).
_ROW_DIGEST_COLUMNS = ('task', 'policy', 'info', 'tokenizer', 'template', 'sampling', 'model', 'logp_placeholder',
                       'group_id', 'rollout_id', 'attempt', 'seed', 'agentrl_version', 'turn_contexts')
#: Columns added later: in the row digest only when not null (older rows keep their digests).
OPTIONAL_DIGEST_COLUMNS = ('policy_version', 'turn_policy_versions')
#: Prefix of a version-2 stored digest (:func:`row_digest`).
DIGEST_V2 = 'v2:'
#: Every column in the row digest, the optional ones last.
DIGESTED_COLUMNS = _ROW_DIGEST_COLUMNS + OPTIONAL_DIGEST_COLUMNS

#: The Arrow schema of a trajectory file (metadata includes the schema version).
SCHEMA = pa.schema(
    [pa.field(name, pa.list_(pa.field('item', t, nullable=False))) for name, t, _, _ in TOKEN_COLUMNS]
    + [pa.field('reward', pa.float64()), pa.field('task', pa.string()), pa.field('policy', pa.string()),
       pa.field('info', pa.string()), pa.field('tokenizer', pa.string()), pa.field('template', pa.string()),
       pa.field('sampling', pa.string()), pa.field('model', pa.string()),
       pa.field('logp_placeholder', pa.bool_()), pa.field('group_id', pa.string()),
       pa.field('rollout_id', pa.string()), pa.field('attempt', pa.int32()), pa.field('seed', pa.int64()),
       pa.field('agentrl_version', pa.string()), pa.field('turn_contexts', pa.string()),
       pa.field('policy_version', pa.string()), pa.field('turn_policy_versions', pa.string()),
       pa.field('digest', pa.string())],
    metadata={_META_VERSION: str(SCHEMA_VERSION).encode(), b'agentrl.kind': b'trajectories',
              b'agentrl.version': __version__.encode()})


def row_digest(content: str, stored: dict) -> str:
    """Version-2 stored digest: ``'v2:' + content + ':' + sha256(content, sorted-key JSON of ``stored``)[:32]``.

    ``stored`` maps each :data:`_ROW_DIGEST_COLUMNS` (and :data:`OPTIONAL_DIGEST_COLUMNS`) name to its stored
    cell value (str, int, bool or None).
    """
    cells = {c: stored.get(c) for c in _ROW_DIGEST_COLUMNS}
    cells.update({c: stored[c] for c in OPTIONAL_DIGEST_COLUMNS if stored.get(c) is not None})
    payload = json.dumps(cells, sort_keys=True, separators=(',', ':'))
    row = hashlib.sha256(f'agentrl-row-v2\0{content}\0{payload}'.encode()).hexdigest()[:32]
    return f'{DIGEST_V2}{content}:{row}'


def content_digest(stored: str | None) -> str | None:
    """The content part (:func:`agentrl.checks.record_digest`, 32 hex digits) of a stored ``digest``.

    A version-2 digest ``'v2:<content>:<row>'`` gives ``<content>``; an older bare digest (or None) is
    returned as is. Raises nothing.
    """
    if isinstance(stored, str) and stored.startswith(DIGEST_V2):
        return stored[len(DIGEST_V2):].split(':', 1)[0]
    return stored


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
        for name, _, dtype, _ in TOKEN_COLUMNS:
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
        cols['policy_version'].append(None if p is None or p.policy_version is None else json.dumps(p.policy_version))
        cols['turn_policy_versions'].append(None if p is None or p.turn_policy_versions is None
                                            else json.dumps(p.turn_policy_versions))
        cols['digest'].append(row_digest(digests[i], {c: cols[c][i] for c in DIGESTED_COLUMNS}))
    np_types = {name: dtype for name, _, dtype, _ in TOKEN_COLUMNS}
    arrays = []
    for f in SCHEMA:
        if f.name in np_types:
            arrays.append(_list_array(cols[f.name], f.type.value_type, np_types[f.name], f.name))
        else:
            arrays.append(pa.array(cols[f.name], type=f.type))
    return pa.Table.from_arrays(arrays, schema=SCHEMA)


# ----------------------------------------------------------------------------- schema checks

def check_schema(schema: pa.Schema, where: str) -> None:
    """Refuse an Arrow schema that is not a trajectory file's this agentrl reads.

    Args:
        schema: the file's Arrow schema (with its Parquet metadata). where: the file, for the message.

    Raises:
        ValueError: no or an unreadable schema version, a version newer than :data:`SCHEMA_VERSION`, a
            missing core column or a column of the wrong type (one line naming the file and the fix).
    """
    meta = schema.metadata or {}
    if _META_VERSION not in meta:
        raise ValueError(f'{where} is not an agentrl trajectory file (no {_META_VERSION.decode()} in its '
                         'Parquet metadata); write it with agentrl.store.write_trajectories or ShardWriter')
    try:
        version = int(meta[_META_VERSION])
    except ValueError:
        raise ValueError(f'{where} has an unreadable schema version {meta[_META_VERSION][:20]!r}; it is not a '
                         'trajectory file written by agentrl') from None
    if version < 1:
        raise ValueError(f'{where} has schema version {version}; versions start at 1, so it was not written by '
                         'agentrl (rewrite it with agentrl.store.write_trajectories)')
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
