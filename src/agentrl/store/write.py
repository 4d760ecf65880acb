"""L4: writing trajectory files atomically: one file, or numbered shards that store each record once.

Every file is written under a hidden temporary name (:func:`agentrl.io.atomic_path`), flushed, then
renamed into place; :class:`ShardWriter` drops resends (:func:`agentrl.checks.dedupe`).

Source: docs/design.md#integrity.
"""
from __future__ import annotations

import os
import re
from collections import ChainMap
from pathlib import Path
from typing import Iterable, Mapping

import pyarrow as pa
import pyarrow.parquet as pq

from .. import io
from ..images import persist_images, run_folder
from ..checks.identity import dedupe
from ..record import Trajectory
from .read import open_parquet, data_files
from .schema import check_schema, content_digest, to_table

__all__ = ['write_trajectories', 'stored_identities', 'ShardWriter']

_SHARD_RE = re.compile(r'^part-(\d{6,})\.parquet$')
_TEMP_RE = re.compile(r'^\..+\.tmp-(\d+)-[0-9a-f]+$')


#: Decoded bytes a written row group aims at, far under the readers' bound (docs/design.md#bounds).
_ROW_GROUP_TARGET = 64 << 20


def _write_temp(table: pa.Table, tmp: Path, fsync: bool) -> None:
    """Write the Parquet bytes of ``table`` to the temporary path ``tmp`` (flushed by the caller).

    Row groups hold about :data:`_ROW_GROUP_TARGET` decoded bytes each, so readers stay far within
    ``AGENTRL_MAX_ROW_GROUP_BYTES`` however many rows the file holds.
    """
    rows = max(1, table.num_rows * _ROW_GROUP_TARGET // max(1, table.nbytes))
    pq.write_table(table, tmp, compression='zstd', row_group_size=min(rows, 1 << 20))


def _write_table(table: pa.Table, final: Path, fsync: bool, overwrite: bool) -> None:
    """Write ``table`` to ``final`` through :func:`agentrl.io.atomic_path` (hidden temp file, then rename)."""
    with io.atomic_path(final, fsync=fsync, overwrite=overwrite) as tmp:
        _write_temp(table, tmp, fsync)


def write_trajectories(path: str | os.PathLike, trajs: Iterable[Trajectory], *, fsync: bool = True,
                       images: Mapping[str, bytes] | None = None) -> Path:
    """Write records to one Parquet file, atomically.

    The table is written to a hidden temporary file in the same folder, flushed, and renamed
    over ``path``: readers see the old file or the new one, never a half-written one.

    Args:
        path: target file (``.parquet`` recommended); parent folders are created.
        trajs: the records (see :func:`to_table` for the layout).
        fsync: flush the file and folder to disk before returning (default True).
        images: ``digest -> bytes`` of the images the records list in ``info['images']``, stored first in
            the file's run folder (``RUN/images/``, :func:`agentrl.images.persist_images`).

    Returns:
        The written path.

    Raises:
        ValueError: ``path`` is a folder (fix: use :class:`ShardWriter` for folders), a record
            cannot be stored (see :func:`to_table`), or it lists an image neither given nor stored.

    Source: docs/design.md#integrity.
    """
    final = Path(path)
    if final.is_dir():
        raise ValueError(f'write_trajectories: {str(final)!r} is a folder; pass a file path, or use '
                         'ShardWriter to append shards to a folder')
    final.parent.mkdir(parents=True, exist_ok=True)
    trajs = list(trajs)
    table = to_table(trajs)
    persist_images(run_folder(final), trajs, images, fsync=fsync)      # the images before the file that names them
    _write_table(table, final, fsync, overwrite=True)
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
        pf = open_parquet(f)
        check_schema(pf.schema_arrow, f)
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
            if m and int(m.group(1)) != os.getpid() and not io.pid_alive(int(m.group(1))):
                f.unlink(missing_ok=True)

    def _remember(self, f: Path) -> None:
        pf = open_parquet(f)
        check_schema(pf.schema_arrow, str(f))
        cols = [c for c in ('group_id', 'rollout_id', 'attempt', 'digest') if c in pf.schema_arrow.names]
        t = pf.read(columns=cols).to_pydict()
        n = pf.metadata.num_rows
        g, r, a, d = (t.get(c, [None] * n) for c in ('group_id', 'rollout_id', 'attempt', 'digest'))
        for gi, ri, ai, di in zip(g, r, a, d):
            key = ('id', gi or '', ri or '', int(ai)) if ai is not None and (gi or ri) else ('digest', di)
            self._seen[key] = content_digest(di)

    def write(self, trajs: Iterable[Trajectory], images: Mapping[str, bytes] | None = None) -> Path | None:
        """Store the new records of ``trajs`` as one shard.

        Args:
            trajs: records; resends of stored records are skipped.
            images: ``digest -> bytes`` of the images the records list in ``info['images']``; each is stored
                once in the run folder (``RUN/images/``, the parent of a shard folder), before the shard
                (:func:`agentrl.images.persist_images`), so a shard never names an image the run lacks.

        Returns:
            Path of the new shard, or None when every record was a resend (nothing written).

        Raises:
            IdentityConflictError: a record reuses a stored identity with different content.
            ValueError: a record cannot be stored (see :func:`to_table`), or it lists an image neither given
                in ``images`` nor stored (naming the record and the digest).
        """
        new: dict = {}
        kept, n_resent = dedupe(trajs, seen=ChainMap(new, self._seen))
        if not kept:
            self.n_resent += n_resent
            return None
        table = to_table(kept, digests=list(new.values()))   # dedupe stored each kept record's digest in `new`
        persist_images(run_folder(self.directory), kept, images, fsync=self.fsync)   # images before their shard
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
