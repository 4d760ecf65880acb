"""L4: reading trajectory files: which files, streaming rows (bad rows kept as problems), records.

:func:`scan` is the reader behind ``agentrl check`` (every row reported, bad or not);
:func:`iter_batches` and :func:`read_trajectories` stop at the first row that cannot be trusted.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Iterator

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from ..checks.errors import RecordError
from ..io import env_bound
from ..record import Trajectory
from .rows import decode_rows
from .schema import check_schema

__all__ = ['data_files', 'StoredRow', 'scan', 'read_trajectories', 'iter_batches', 'MAX_ROW_GROUP_BYTES',
           'MAX_CELL_BYTES']

#: Default of ``AGENTRL_MAX_ROW_GROUP_BYTES``: decoded bytes one row group may hold (docs/design.md#bounds).
MAX_ROW_GROUP_BYTES = 1 << 30
#: Default of ``AGENTRL_MAX_CELL_BYTES``: decoded bytes one cell (one row's value of one column) may hold: 8 Mi
#: int64 tokens, far past any context window (docs/design.md#bounds).
MAX_CELL_BYTES = 64 << 20
#: Decoded bytes per value of the fixed-width Parquet types (Arrow holds a boolean in one bit; counted as a byte).
_WIDTH = {'BOOLEAN': 1, 'INT32': 4, 'INT64': 8, 'INT96': 12, 'FLOAT': 4, 'DOUBLE': 8}


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


def open_parquet(f, read_dictionary=None) -> pq.ParquetFile:
    """Open ``f`` as Parquet, or raise ValueError naming the file and the fix."""
    try:
        os.fsdecode(f).encode('utf-8')
    except UnicodeEncodeError:            # pyarrow takes UTF-8 paths only
        raise ValueError(f'{os.fsdecode(f)!r}: the file name is not valid UTF-8; rename it (shards are named '
                         'part-NNNNNN.parquet) or move it out of the folder') from None
    try:
        return pq.ParquetFile(f, read_dictionary=read_dictionary)
    except UnicodeDecodeError as e:       # a damaged footer: a column name or metadata key that is not UTF-8
        raise ValueError(f'{str(f)!r} is damaged: its Parquet metadata is not UTF-8 (byte 0x{e.object[e.start]:02x} '
                         'in a column name or key); re-run the rollout that wrote it, or remove the file') from None
    except (pa.ArrowException, OSError) as e:
        if isinstance(e, FileNotFoundError):
            raise
        why = str(e).splitlines()[0][:120] if str(e) else type(e).__name__
        if _starts_as_parquet(f):         # PAR1 at the start, no footer: a shard cut short (or damaged)
            raise ValueError(f'{str(f)!r} is truncated or damaged: a Parquet file whose footer cannot be read '
                             f'({why.split(". ")[0].rstrip(".")}); {_damaged_fix(f)}') from None
        raise ValueError(f'{str(f)!r} is not a Parquet file ({why}); '
                         'pass the trajectories.parquet written by `agentrl rollout` or a folder of its shards') from None


def _starts_as_parquet(f) -> bool:
    """Whether the file ``f`` begins with Parquet's magic bytes ``PAR1``."""
    try:
        with open(f, 'rb') as fh:
            return fh.read(4) == b'PAR1'
    except OSError:
        return False


def _damaged_fix(f) -> str:
    """The fix for a damaged Parquet file: a run's shard is rerun by ``--resume``; another file is written again."""
    p = Path(os.fsdecode(f))
    run = p.parent.parent
    if p.parent.name == 'trajectories' and (run / 'run.json').is_file():
        return f'move it aside and run `agentrl rollout --resume {run}` to rerun its episodes'
    return 'write it again (rerun the command that wrote it) or remove it'


def _footer_bytes(rg, bound: int) -> tuple[int, str, set]:
    """``(decoded bytes, largest column, string columns a dictionary may expand)`` of row group metadata ``rg``.

    Fixed-width values count ``num_values x width`` (exact: dictionary and run-length encoding do not
    hide them); strings count their uncompressed pages, and a dictionary-encoded string column whose
    values could exceed ``bound`` (``num_values x`` its stored bytes) is listed for dictionary reading.
    """
    total, top, expand = 0, ('', -1), set()
    for k in range(rg.num_columns):
        c = rg.column(k)
        w = _WIDTH.get(c.physical_type)
        n = c.num_values * w if w else c.total_uncompressed_size
        if w is None and c.has_dictionary_page and c.num_values * c.total_uncompressed_size > bound:
            expand.add(c.path_in_schema.split('.')[0])
        total += n
        top = max(top, (c.path_in_schema.split('.')[0], n), key=lambda t: t[1])
    return total, top[0], expand


def _too_big(f: str, i: int, rows: int, size: int, column: str, bound: int) -> ValueError:
    return ValueError(f'{f!r} row group {i} ({rows} rows) decodes to {size} bytes (column {column!r} the most), over '
                      f'the bound of {bound} bytes per row group (AGENTRL_MAX_ROW_GROUP_BYTES): a compression bomb or '
                      'a damaged file; remove it, or raise AGENTRL_MAX_ROW_GROUP_BYTES if you trust it')


def _open_bounded(f: str, bound: int, pf: pq.ParquetFile) -> pq.ParquetFile:
    """``pf`` (opened from ``f``) checked: a row group whose footer is over ``bound`` is refused; a file with
    strings a dictionary could expand past it is opened again, reading those as dictionaries."""
    md, expand = pf.metadata, set()
    for i in range(md.num_row_groups):
        size, column, more = _footer_bytes(md.row_group(i), bound)
        if size > bound:
            raise _too_big(f, i, md.row_group(i).num_rows, size, column, bound)
        expand |= more
    return open_parquet(f, sorted(expand)) if expand else pf


def _decoded(rb: pa.RecordBatch, used: int, bound: int, where) -> tuple[pa.RecordBatch, int]:
    """``rb`` with its dictionary columns decoded, and ``used`` plus their decoded bytes (refused over ``bound``)."""
    cols, changed = list(rb.columns), False
    for k, col in enumerate(cols):
        if pa.types.is_dictionary(col.type):
            changed = True
            used += pc.sum(pc.take(pc.binary_length(col.dictionary), col.indices)).as_py() or 0
            if used > bound:
                raise _too_big(*where, used, rb.schema.names[k], bound)
            cols[k] = col.dictionary_decode()
    if not changed:
        return rb, used
    return pa.RecordBatch.from_arrays(cols, names=rb.schema.names).replace_schema_metadata(rb.schema.metadata), used


def _cell_bytes(col) -> pa.Array | None:
    """Decoded bytes of each cell of column ``col`` (list of fixed-width values, or string), or None (scalars)."""
    if pa.types.is_list(col.type) or pa.types.is_large_list(col.type):
        width = col.type.value_type.byte_width if pa.types.is_primitive(col.type.value_type) else 8
        return pc.multiply(pc.list_value_length(col).cast(pa.int64()), width)
    if pa.types.is_string(col.type) or pa.types.is_binary(col.type) or pa.types.is_large_string(col.type):
        return pc.binary_length(col).cast(pa.int64())
    return None


def _check_cells(rb: pa.RecordBatch, first: int, cell: int, f: str, group: int) -> None:
    """Refuse a cell of ``rb`` (rows ``first``.. of the file, in row group ``group``) over ``cell`` bytes."""
    for k, col in enumerate(rb.columns):
        sizes = _cell_bytes(col)
        top = pc.max(sizes).as_py() if sizes is not None and len(sizes) else None
        if top is not None and top > cell:
            row = first + pc.index(sizes, top).as_py()
            raise _cell_too_big(f'{f!r} row {row} (row group {group})', rb.schema.names[k],
                                f'{top} bytes in one cell', cell)


def _cell_too_big(where: str, column: str, size: str, cell: int) -> ValueError:
    return ValueError(f'{where}: column {column!r} decodes to {size}, over the bound of {cell} bytes per cell '
                      '(AGENTRL_MAX_CELL_BYTES): a compression bomb or a damaged file; remove it, or raise '
                      'AGENTRL_MAX_CELL_BYTES if you trust it')


def _footer_cells(f: str, group: int, rg, cell: int) -> None:
    """Refuse row group ``rg`` from its footer when a fixed-width column's mean cell (exact: ``num_values x
    width`` over the rows) is already over ``cell`` bytes; strings are counted as they decode."""
    rows = max(rg.num_rows, 1)
    for k in range(rg.num_columns):
        c = rg.column(k)
        n = c.num_values * _WIDTH.get(c.physical_type, 0)
        if n // rows > cell:
            raise _cell_too_big(f'{f!r} row group {group} ({rg.num_rows} rows)', c.path_in_schema.split('.')[0],
                                f'{n // rows} bytes per cell on average (its footer)', cell)


def _batches(pf: pq.ParquetFile, f: str, batch_size: int, bound: int | None = None,
             cell: int | None = None) -> Iterator[pa.RecordBatch]:
    """Record batches of ``pf``, row group by row group; a damaged file becomes a one-line ValueError naming it.

    Raises:
        ValueError: a row group decodes to more than ``bound`` bytes (default ``AGENTRL_MAX_ROW_GROUP_BYTES``),
            or one cell to more than ``cell`` bytes (default ``AGENTRL_MAX_CELL_BYTES``), before it is
            converted to Python values (docs/design.md#bounds).
        MemoryError: a row group within the bound that this process has no memory for (names it).
    """
    bound = env_bound('AGENTRL_MAX_ROW_GROUP_BYTES', MAX_ROW_GROUP_BYTES) if bound is None else bound
    cell = env_bound('AGENTRL_MAX_CELL_BYTES', MAX_CELL_BYTES) if cell is None else cell
    md, i, first = pf.metadata, 0, 0
    try:
        for i in range(md.num_row_groups):
            rg = md.row_group(i)
            _footer_cells(f, i, rg, cell)
            used, where = _footer_bytes(rg, bound)[0], (f, i, rg.num_rows)
            for rb in pf.iter_batches(batch_size=batch_size, row_groups=[i]):
                rb, used = _decoded(rb, used, bound, where)
                _check_cells(rb, first, cell, f, i)
                first += rb.num_rows
                yield rb
    except UnicodeDecodeError as e:
        raise ValueError(f'{f!r} is damaged: its Parquet metadata is not UTF-8 (byte 0x{e.object[e.start]:02x} '
                         'in a column name or key); re-run the rollout that wrote it, or remove the file') from None
    except MemoryError:         # ArrowMemoryError too: within the bound, but not within this process's memory
        raise out_of_memory_error(f, group=i) from None
    except (pa.ArrowException, OSError) as e:
        raise ValueError(f'{f!r} is damaged and cannot be read ({" ".join(str(e).split())[:120]}); re-run the '
                         'rollout that wrote it, or remove the file') from None


def out_of_memory_error(f: str, *, group: int | None = None, row: int = 0) -> MemoryError:
    """The one-line MemoryError of a row group (``group``, or the one holding ``row``) of ``f`` that is within
    ``AGENTRL_MAX_ROW_GROUP_BYTES`` but does not fit in this process's memory, decoded or converted."""
    bound = env_bound('AGENTRL_MAX_ROW_GROUP_BYTES', MAX_ROW_GROUP_BYTES)
    try:
        md = pq.ParquetFile(f).metadata                  # the footer only: small
        g, start = (group, 0) if group is not None else (0, 0)
        while group is None and g < md.num_row_groups - 1 and start + md.row_group(g).num_rows <= row:
            start += md.row_group(g).num_rows
            g += 1
        rg = md.row_group(g)
        where = f'row group {g} ({rg.num_rows} rows, {_footer_bytes(rg, bound)[0]} bytes decoded by its footer)'
    except Exception:              # noqa: BLE001 - the footer read itself failed: name the row group alone
        where = f'row group {group}' if group is not None else f'the row group holding row {row}'
    return MemoryError(f'out of memory: {f!r} {where} does not fit in the memory this process may use; raise its '
                       f'memory limit, or lower AGENTRL_MAX_ROW_GROUP_BYTES (now {bound}) to refuse such files')


class StoredRow:
    """One stored row as read: where it is, the record or why it could not be read.

    Attributes:
        file: the Parquet file (str). row: the row number within it (from 0).
        record: the :class:`~agentrl.record.Trajectory`, or None when the row is malformed.
        problem: the :class:`~agentrl.checks.RecordError` (MalformedRowError,
            DigestMismatchError) when the row could not be trusted, else None.
        digest: the record's content digest (:func:`agentrl.checks.record_digest`, 32 hex digits)
            as computed when the row was verified; None when read with ``verify=False`` or bad.
    """
    __slots__ = ('file', 'row', 'record', 'problem', 'digest')

    def __init__(self, file: str, row: int, record, problem, digest: str | None = None):
        self.file, self.row, self.record, self.problem, self.digest = file, row, record, problem, digest

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
        ValueError: ``batch_size`` < 1; a file that is not a trajectory file, or is damaged; a row group
            that decodes to more than ``AGENTRL_MAX_ROW_GROUP_BYTES`` (docs/design.md#bounds), named by file and
            number, refused before it is read; a cell that decodes to more than ``AGENTRL_MAX_CELL_BYTES``,
            named by file, row, row group and column, refused before it is converted.
        MemoryError: a row group within the bound that does not fit in this process's memory (names it).
    """
    for f, row, rb in record_batches(path, batch_size):
        out = []
        try:
            for n, rec, digest in decode_rows(rb, repr(f), row, verify):
                bad = isinstance(rec, RecordError)
                out.append(StoredRow(f, n, None if bad else rec, rec if bad else None, digest))
        except MemoryError:        # converting the batch's cells to records: named as the reader names it
            raise out_of_memory_error(f, row=row) from None
        yield out


def record_batches(path, batch_size: int) -> Iterator[tuple[str, int, pa.RecordBatch]]:
    """``(file, first row, record batch)`` of every trajectory file of ``path``: the one read loop of
    :func:`scan` and of the columnar check (:mod:`agentrl.jobs.check_columnar`); raises as :func:`scan`."""
    if batch_size < 1:
        raise ValueError(f'batch_size must be >= 1, got {batch_size}')
    bound = env_bound('AGENTRL_MAX_ROW_GROUP_BYTES', MAX_ROW_GROUP_BYTES)
    cell = env_bound('AGENTRL_MAX_CELL_BYTES', MAX_CELL_BYTES)
    for f in data_files(path):
        pf = open_parquet(f)
        check_schema(pf.schema_arrow, repr(f))
        pf = _open_bounded(f, bound, pf)
        row = 0
        for rb in _batches(pf, f, batch_size, bound, cell):
            yield f, row, rb
            row += rb.num_rows


def read_trajectories(path: str | os.PathLike, *, verify: bool = True) -> list[Trajectory]:
    """Read every record of a trajectory file or dataset folder.

    Args:
        path: a file written by :func:`write_trajectories` or a folder of shards.
        verify: compare each row's stored digest with its content (default True).

    Returns:
        list of Trajectory, in file order then row order (exact round trip of what was written).

    Raises:
        FileNotFoundError: nothing at ``path``.
        ValueError: a file without ``agentrl.schema_version`` metadata, with a version below 1 or newer
            than this agentrl (fix: upgrade agentrl), or damaged.
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
