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

Modules: :mod:`~agentrl.store.schema` (the columns, the digest column, records -> table),
:mod:`~agentrl.store.rows` (table -> records, validated), :mod:`~agentrl.store.read` (files,
:func:`scan`, readers) and :mod:`~agentrl.store.write` (atomic files, :class:`ShardWriter`).
"""
from ..io import atomic_path  # noqa: F401 - the writers' reference (tests patch agentrl.io.atomic_path)
from .read import StoredRow, data_files, iter_batches, read_trajectories, scan
from .rows import from_table
from .schema import SCHEMA, SCHEMA_VERSION, content_digest, to_table
from .write import ShardWriter, stored_identities, write_trajectories

__all__ = ['SCHEMA_VERSION', 'SCHEMA', 'write_trajectories', 'read_trajectories', 'iter_batches', 'scan',
           'StoredRow', 'data_files', 'ShardWriter', 'stored_identities', 'to_table', 'from_table', 'content_digest']
