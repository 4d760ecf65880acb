"""L5: ``agentrl check --workers N``: the check of a shard folder split across Ray workers, same report.

:func:`check_on_workers` gives each of N Ray tasks a contiguous run of the folder's shards; a task runs
:func:`agentrl.jobs.check.run_check` on each of its shards and returns the shard's
:class:`~agentrl.jobs.check.CheckReport` with the dedupe keys of its rows. The driver merges the reports
in shard order (counts summed, counters and lists in order, refusal examples cut at ``--examples``), which
is the in-process report as long as no record repeats one of an earlier shard (the only way one shard's
verdicts depend on another). When a key does repeat across shards (a resend or an identity conflict
between shards), the whole check runs again in this process, so the repeats are worded as in process.

Ray runs locally on 127.0.0.1 (:func:`agentrl.engines.ray.connect`) and is stopped at the end.
Source: docs/design.md#integrity (identity and resends).
"""
from __future__ import annotations

import dataclasses
from array import array
from collections import Counter
from hashlib import blake2b
from typing import Callable

import numpy as np

from ..engines.ray import connect, require_ray
from .check_report import CheckReport

__all__ = ['check_on_workers', 'merge_reports', 'row_keys']

#: CheckReport fields that are settings of the check, not tallies (taken from the options, never merged)
_SETTINGS = frozenset({'path', 'model', 'max_ratio_dev', 'examples_max', 'dtype', 'tol', 'correction'})


def row_keys(path: str) -> np.ndarray:
    """``[rows]`` uint64: a stable 64-bit hash of each row's dedupe key (``(group, rollout, attempt)``, or the
    content digest of an anonymous row, as :func:`agentrl.checks.dedupe_key`), from the columns alone.

    Every key a :class:`~agentrl.checks.Deduper` could register for the file is among them (a row it refuses
    may add one more), so an empty intersection between shards means no cross-shard repeat.
    """
    import pyarrow.parquet as pq

    from ..store.schema import content_digest
    pf = pq.ParquetFile(path)
    names = [n for n in ('group_id', 'rollout_id', 'attempt', 'digest') if n in pf.schema_arrow.names]
    out = []
    for rb in pf.iter_batches(batch_size=65536, columns=names):
        cols = {n: rb.column(n).to_pylist() for n in names}
        none = [None] * rb.num_rows
        for g, r, a, d in zip(cols.get('group_id', none), cols.get('rollout_id', none), cols.get('attempt', none),
                              cols.get('digest', none)):
            key = f'id\0{g or ""}\0{r or ""}\0{int(a)}' if a is not None and (g or r) else f'digest\0{content_digest(d)}'
            out.append(int.from_bytes(blake2b(key.encode(), digest_size=8).digest(), 'little'))
    return np.array(out, dtype=np.uint64)


def _check_files(opts, files: list, run_check: Callable) -> list:
    """``[(CheckReport, keys) or (exception, None)]`` of each file (runs in a Ray task)."""
    out = []
    for f in files:
        try:
            out.append((run_check(dataclasses.replace(opts, path=f, workers=0)), row_keys(f)))
        except Exception as e:                     # re-raised by the driver, in shard order
            out.append((e, None))
            break
    return out


def merge_reports(reports: list, into) -> None:
    """Add ``reports`` (CheckReport, in shard order) to ``into``: numbers summed, counters and lists extended."""
    for rep in reports:
        for f in dataclasses.fields(rep):
            if f.name in _SETTINGS:
                continue
            mine, theirs = getattr(into, f.name), getattr(rep, f.name)
            if isinstance(mine, Counter):
                mine.update(theirs)
            elif isinstance(mine, (list, array)):
                mine.extend(theirs)
            elif isinstance(mine, (int, float)) and not isinstance(mine, bool):
                setattr(into, f.name, mine + theirs)
    del into.examples[into.examples_max:]


def check_on_workers(opts, run_check: Callable, progress=None):
    """The :class:`~agentrl.jobs.check.CheckReport` of ``opts`` (``opts.workers`` >= 1) computed on Ray workers.

    Args:
        opts: the :class:`~agentrl.jobs.check.CheckOptions`.
        run_check: the in-process check, ``(opts with workers=0, progress) -> CheckReport``
            (:func:`agentrl.jobs.check.run_check`, which passes itself: this module stays below it).
        progress: called with the number of rows checked, as in :func:`~agentrl.jobs.check.run_check`.

    Returns:
        the report that :func:`agentrl.jobs.check.run_check` gives in process (see the module docstring).

    Raises:
        ImportError: Ray is not installed (``pip install 'agentrl[ray]'``). FileNotFoundError, ValueError:
            as :func:`~agentrl.jobs.check.run_check`, for the first shard (in order) that raises.
    """
    from .. import store
    files = store.data_files(opts.path)
    if len(files) < 2:
        return run_check(dataclasses.replace(opts, workers=0), progress)
    ray = require_ray()
    n = min(opts.workers, len(files))
    started = connect(ray, None, n, None)
    try:
        task = ray.remote(num_cpus=1)(_check_files)
        groups = [list(g) for g in np.array_split(np.array(files, dtype=object), n) if len(g)]
        results = [r for part in ray.get([task.remote(opts, g, run_check) for g in groups]) for r in part]
    finally:
        if started:
            ray.shutdown()
    seen = np.zeros(0, dtype=np.uint64)
    for rep, keys in results:
        if keys is None:
            raise rep
        if np.isin(keys, seen).any():              # a record repeats one of an earlier shard: word it in process
            return run_check(dataclasses.replace(opts, workers=0), progress)
        seen = np.union1d(seen, keys)
    rep = CheckReport(path=opts.path, model=opts.model, max_ratio_dev=opts.max_ratio_dev, examples_max=opts.examples,
                      correction=opts.correction, dtype=opts.dtype, tol=opts.tol)
    merge_reports([r for r, _ in results], rep)
    if progress is not None:
        progress(rep.n)
    return rep
