"""L4: durable Parquet storage of trajectories (pyarrow).

One row per episode. Token fields are list columns, provenance is flat columns, and the file's
Parquet metadata carries ``agentrl.schema_version``. Files are readable by pyarrow alone and by
``datasets.load_dataset('parquet', data_files=...)``; reading back through :func:`read_trajectories`
is exact (ids, owners, turns, masks, float32 log-probs bit for bit, float64 rewards).

Durability follows docs/design.md#storage (files written atomically, temporary files hidden from every
reader); :class:`ShardWriter` appends numbered shards and keeps retries and resends apart as
docs/design.md#integrity says.

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
