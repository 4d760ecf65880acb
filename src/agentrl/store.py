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

Source: issue 4 (record integrity), item 6.

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
digest                  string              :func:`agentrl.checks.record_digest` of the row
======================  ==================  ===============================================
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
from .checks.identity import dedupe, record_digest
from .io import atomic_path
from .record import Provenance, SamplingSpec, Trajectory

__all__ = ['SCHEMA_VERSION', 'SCHEMA', 'write_trajectories', 'read_trajectories', 'iter_batches',
           'data_files', 'ShardWriter', 'stored_identities', 'to_table', 'from_table']

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
    a = torch.as_tensor(t).detach().to('cpu').reshape(-1)
    if a.dtype.is_floating_point and not np.issubdtype(dtype, np.floating):
        if not bool(torch.all(a == a.round())):
            raise ValueError(f'store: record {i} field {name} holds non-integer values; {name} must hold '
                             'integers (build records with Trajectory.from_tokens)')
    a = a.numpy()
    if np.issubdtype(dtype, np.integer):
        lo, hi = np.iinfo(dtype).min, np.iinfo(dtype).max
        if a.size and (a.min() < lo or a.max() > hi):
            raise ValueError(f'store: record {i} field {name} has values outside [{lo}, {hi}], the range '
                             f'its column stores; check the record (ids must be token ids)')
    return a.astype(dtype, copy=False)


def _list_array(rows: list, value_type: pa.DataType, np_dtype) -> pa.Array:
    lengths = np.fromiter((0 if r is None else len(r) for r in rows), dtype=np.int64, count=len(rows))
    offsets = np.zeros(len(rows) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    if offsets[-1] > np.iinfo(np.int32).max:
        raise ValueError('store: more than 2**31 tokens in one file; write fewer records per shard')
    present = [r for r in rows if r is not None]
    values = (np.concatenate(present) if present else np.zeros(0)).astype(np_dtype, copy=False)
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
        digests: precomputed :func:`agentrl.checks.record_digest` per record (computed if None).

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
        cols['digest'].append(digests[i])
    np_types = {name: dtype for name, _, dtype, _ in _TOKEN_COLUMNS}
    arrays = []
    for f in SCHEMA:
        if f.name in np_types:
            arrays.append(_list_array(cols[f.name], f.type.value_type, np_types[f.name]))
        else:
            arrays.append(pa.array(cols[f.name], type=f.type))
    return pa.Table.from_arrays(arrays, schema=SCHEMA)


# ----------------------------------------------------------------------------- table -> records

def _check_schema(schema: pa.Schema, where: str) -> None:
    meta = schema.metadata or {}
    if _META_VERSION not in meta:
        raise ValueError(f'{where} is not an agentrl trajectory file (no {_META_VERSION.decode()} in its '
                         'Parquet metadata); write it with agentrl.store.write_trajectories or ShardWriter')
    version = int(meta[_META_VERSION])
    if version > SCHEMA_VERSION:
        raise ValueError(f'{where} has schema version {version}, newer than this agentrl reads '
                         f'({SCHEMA_VERSION}); upgrade agentrl')
    missing = [n for n in ('ids', 'action_mask', 'sample_logp', 'reward') if n not in schema.names]
    if missing:
        raise ValueError(f'{where} lacks the columns {missing}; it is not a complete trajectory file')


def _lists(col: pa.Array):
    return (col.offsets.to_numpy(), col.values.to_numpy(zero_copy_only=False),
            col.is_valid().to_numpy(zero_copy_only=False))


def from_table(table: pa.Table | pa.RecordBatch) -> list[Trajectory]:
    """Convert rows of a trajectory table (or record batch) back to :class:`Trajectory` objects.

    Args:
        table: rows with :data:`SCHEMA` columns (extra columns are ignored; ``owner``, ``turn``
            and the provenance columns may be absent).

    Returns:
        list of Trajectory: ``ids``/``owner``/``turn`` int64, ``action_mask``/``sample_logp``
        float32 (bit-exact), ``reward`` float, ``info`` dict, ``provenance`` (None when the row's
        ``attempt`` is null), ``turn_contexts`` as ``[(start, ids int64 tensor)]`` or None.
    """
    batches = table.to_batches() if isinstance(table, pa.Table) else [table]
    out: list[Trajectory] = []
    for rb in batches:
        n = rb.num_rows
        names = rb.schema.names
        toks = {}
        for name, _, _, tdt in _TOKEN_COLUMNS:
            if name in names:
                toks[name] = (_lists(rb.column(name)), tdt)
        py = {name: rb.column(name).to_pylist() for name in names
              if name not in toks}
        get = lambda name, i: py[name][i] if name in py else None  # noqa: E731
        for i in range(n):
            fields = {}
            for name, ((offs, vals, valid), tdt) in toks.items():
                if not valid[i]:
                    fields[name] = None
                    continue
                fields[name] = torch.from_numpy(vals[offs[i]:offs[i + 1]].astype(_tdt_np(tdt)))
            prov = None
            if get('attempt', i) is not None:
                s = get('sampling', i)
                prov = Provenance(
                    policy=get('policy', i) or '', tokenizer=get('tokenizer', i) or '',
                    template=get('template', i) or '',
                    sampling=None if s is None else SamplingSpec.from_dict(json.loads(s)),
                    model=get('model', i) or '', logp_placeholder=bool(get('logp_placeholder', i)),
                    group_id=get('group_id', i) or '', rollout_id=get('rollout_id', i) or '',
                    attempt=int(get('attempt', i)), seed=get('seed', i),
                    agentrl_version=get('agentrl_version', i) or '')
            tc = get('turn_contexts', i)
            if tc is not None:
                tc = [(int(s), torch.tensor(c, dtype=torch.long)) for s, c in json.loads(tc)]
            info = get('info', i)
            out.append(Trajectory(ids=fields['ids'], action_mask=fields['action_mask'],
                                  sample_logp=fields['sample_logp'], reward=float(get('reward', i)),
                                  info={} if info is None else json.loads(info), owner=fields.get('owner'),
                                  turn=fields.get('turn'), provenance=prov, turn_contexts=tc))
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
        return pq.ParquetFile(f)
    except (pa.ArrowInvalid, OSError) as e:
        if isinstance(e, FileNotFoundError):
            raise
        raise ValueError(f'{str(f)!r} is not a Parquet file ({str(e).splitlines()[0][:120]}); pass the '
                         'trajectories.parquet written by `agentrl rollout` or a folder of its shards') from None


def read_trajectories(path: str | os.PathLike) -> list[Trajectory]:
    """Read every record of a trajectory file or dataset folder.

    Args:
        path: a file written by :func:`write_trajectories` or a folder of shards.

    Returns:
        list of Trajectory, in file order then row order (exact round trip of what was written).

    Raises:
        FileNotFoundError: nothing at ``path``.
        ValueError: a file without ``agentrl.schema_version`` metadata, or with a newer version
            (fix: upgrade agentrl).

    Source: issue 4, item 6.
    """
    out: list[Trajectory] = []
    for f in data_files(path):
        table = _parquet(f).read()
        _check_schema(table.schema, f)
        out.extend(from_table(table))
    return out


def iter_batches(path: str | os.PathLike, batch_size: int = 64) -> Iterator[list[Trajectory]]:
    """Stream records in lists of ``batch_size`` without loading the dataset into memory.

    Args:
        path: a trajectory file or folder of shards.
        batch_size: records per yielded list (> 0); the last list may be shorter. Batches span
            shard boundaries.

    Yields:
        list of Trajectory, in the order :func:`read_trajectories` returns them.

    Raises:
        ValueError: ``batch_size`` < 1, or a file that is not a trajectory file.
        FileNotFoundError: nothing at ``path``.
    """
    if batch_size < 1:
        raise ValueError(f'iter_batches: batch_size must be >= 1, got {batch_size}')
    buf: list[Trajectory] = []
    for f in data_files(path):
        pf = _parquet(f)
        _check_schema(pf.schema_arrow, f)
        for rb in pf.iter_batches(batch_size=batch_size):
            buf.extend(from_table(rb))
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

    Source: issue 4, item 6.
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


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


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

    Source: issue 4, items 5 and 6; lesson 004 (retries and resends).
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
            if m and int(m.group(1)) != os.getpid() and not _pid_alive(int(m.group(1))):
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
            self._seen[key] = di

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
