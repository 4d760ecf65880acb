"""L5: the model-free check by columns: clean rows counted in bulk, every other row checked by the reference.

:func:`rows_to_check` replaces :func:`agentrl.store.scan` as the row source of
:func:`agentrl.jobs.check.run_check` when no model is given. Per record batch it decodes the token
lists as flat numpy arrays, verifies every stored digest (the one rule of
:func:`agentrl.checks.identity.digest_arrays` and :func:`agentrl.store.schema._row_digest`), and runs
the acceptance rules over the columns (:func:`agentrl.checks.columnar.screen`). A row that is
accepted and new to the :class:`~agentrl.checks.Deduper` is tallied into the report here, without
building a record (so without torch); every other row (malformed, edited, refused, repeated, or of a
kind the columns do not cover: chat-template info, ``turn_contexts``, imported context drift) is
yielded as the :class:`agentrl.store.StoredRow` that :func:`agentrl.store.scan` gives, and
``run_check`` checks it with the per-record rules. Same verdicts and messages, same order.

``AGENTRL_CHECK_PER_RECORD=1`` in the environment selects the per-record path (the benchmark's
"before"). Source: docs/design.md#integrity.
"""
from __future__ import annotations

import json
import os
from types import SimpleNamespace
from typing import Iterator

import numpy as np
import pyarrow as pa

from ..checks.columnar import TokenColumns, covers, screen
from ..checks.errors import RecordError
from ..checks.identity import DIGEST_FIELDS, Deduper, digest_arrays
from ..stats import is_truncated
from ..store.read import StoredRow, _record_batches
from ..store.rows import _json_cell, _rows, _sampling
from ..store.schema import _DIGEST_V2, _DIGESTED, _row_digest

__all__ = ['PER_RECORD_ENV', 'columnar_enabled', 'rows_to_check']

#: set to 1 to check record by record (the reference path; the benchmark's "before")
PER_RECORD_ENV = 'AGENTRL_CHECK_PER_RECORD'
_LISTS = ('ids', 'owner', 'turn', 'action_mask', 'sample_logp')
_HASH_DTYPE = {field: dtype for _, field, dtype in DIGEST_FIELDS}


def columnar_enabled(opts) -> bool:
    """Whether ``opts`` (:class:`~agentrl.jobs.check.CheckOptions`) can be checked by columns: no model,
    no staleness flags, every acceptance rule covered (:func:`agentrl.checks.columnar.covers`), and
    :data:`PER_RECORD_ENV` unset."""
    return (opts.model is None and opts.current_version is None and covers()
            and os.environ.get(PER_RECORD_ENV, '') in ('', '0'))


def _lists(rb: pa.RecordBatch):
    """``{name: (offsets [B+1] from 0, flat values, row valid [B] or None)}`` of the token lists, or None when
    the batch cannot be read by columns (a missing ``owner``, a null list other than ``turn``, a null item,
    lengths that disagree)."""
    out = {}
    for name in _LISTS:
        if name not in rb.schema.names:
            if name == 'turn':
                continue
            return None
        col = rb.column(name)
        if not (pa.types.is_list(col.type) or pa.types.is_large_list(col.type)) or (col.null_count and name != 'turn'):
            return None
        offs = col.offsets.to_numpy().astype(np.int64)
        values = col.flatten()
        if values.null_count:
            return None
        valid = col.is_valid().to_numpy(zero_copy_only=False) if col.null_count else None
        out[name] = (offs - offs[0], values.to_numpy(zero_copy_only=False), valid)
    T = np.diff(out['ids'][0])
    turn_T = np.diff(out['turn'][0]) if 'turn' in out else T
    turn_ok = turn_T == T if out.get('turn', (0, 0, None))[2] is None else (turn_T == T) | ~out['turn'][2]
    if (T < 1).any() or (np.diff(out['owner'][0]) != T).any() or not turn_ok.all():
        return None
    if (np.diff(out['action_mask'][0]) != T - 1).any() or (np.diff(out['sample_logp'][0]) != T - 1).any():
        return None
    return out


class _Cells:
    """The non-token cells of a batch, decoded once per distinct value (sampling, versions)."""

    def __init__(self, rb: pa.RecordBatch):
        names = set(rb.schema.names)
        self.py = {n: rb.column(n).to_pylist() for n in names if n not in _LISTS}
        self.n = rb.num_rows
        self._cache: dict = {}

    def get(self, name: str, i: int):
        col = self.py.get(name)
        return None if col is None else col[i]

    def parsed(self, name: str, raw, parse):
        """``parse(raw)`` cached; None when it raises a RecordError (the reference words it)."""
        key = (name, raw)
        if key not in self._cache:
            try:
                self._cache[key] = (parse(raw),)
            except RecordError:
                self._cache[key] = None
        return self._cache[key]


def _versions(raw_pv, raw_tpv, cells: _Cells):
    """``(policy_version, turn_policy_versions)`` as the reference's Provenance holds them, or None when
    the reference would refuse or reject them."""
    pv = cells.parsed('policy_version', raw_pv, lambda r: _json_cell(lambda n, i: r, 'policy_version', 0))
    tpv = cells.parsed('turn_policy_versions', raw_tpv,
                       lambda r: _json_cell(lambda n, i: r, 'turn_policy_versions', 0))
    if pv is None or tpv is None:
        return None
    pv, tpv = pv[0], tpv[0]
    ok = lambda v: v is None or (not isinstance(v, bool) and isinstance(v, (int, str)))  # noqa: E731
    if not ok(pv) or not (tpv is None or (isinstance(tpv, list) and all(ok(v) for v in tpv))):
        return None
    return pv, tpv


def _decode(cells: _Cells, i: int, toks: dict, hashed: dict):
    """Row ``i``'s facts for the columns (a SimpleNamespace), or None when the reference must see it."""
    get = cells.get
    reward = get('reward', i)
    attempt = get('attempt', i)
    if reward is None or isinstance(reward, bool) or not isinstance(reward, (int, float)) or attempt is None:
        return None
    if get('turn_contexts', i) is not None:
        return None
    sampling = cells.parsed('sampling', get('sampling', i), _sampling)
    versions = _versions(get('policy_version', i), get('turn_policy_versions', i), cells)
    stored = get('digest', i)
    if sampling is None or versions is None or not isinstance(stored, str):
        return None
    try:
        info = json.loads(get('info', i)) if get('info', i) is not None else {}
    except (TypeError, ValueError):
        return None
    if not isinstance(info, dict) or 'template' in info or 'import' in info:
        return None
    arrays = {name: None if valid is not None and not valid[i] else hashed[name][offs[i]:offs[i + 1]]
              for name, (offs, _, valid) in toks.items()}
    content = digest_arrays(arrays, float(reward))
    want = _row_digest(content, {c: get(c, i) for c in _DIGESTED}) if stored.startswith(_DIGEST_V2) else content
    if want != stored:
        return None
    placeholder = bool(get('logp_placeholder', i))
    return SimpleNamespace(info=info, content=content, reward=float(reward), versions=versions, placeholder=placeholder,
                           declared=sampling[0] is not None or placeholder,
                           provenance=SimpleNamespace(group_id=get('group_id', i) or '', attempt=int(attempt),
                                                      rollout_id=get('rollout_id', i) or '',
                                                      tokenizer=get('tokenizer', i) or '',
                                                      template=get('template', i) or '',
                                                      policy=get('policy', i) or ''))


def _accepted(toks: dict, facts: list, expected_for) -> np.ndarray:
    """``[B]`` bool: decoded rows every acceptance rule accepts (one :func:`screen` per distinct expectation)."""
    B = len(facts)
    ends = toks['ids'][0][1:]
    T = np.diff(toks['ids'][0])
    prov = np.array([f is not None for f in facts])
    f0 = SimpleNamespace(declared=False, reward=0.0, provenance=SimpleNamespace(tokenizer='', template=''))
    fs = [f if f is not None else f0 for f in facts]
    cols = TokenColumns(
        starts=ends - T, ends=ends, ids=toks['ids'][1].astype(np.int64), owner=toks['owner'][1].astype(np.int64),
        mask=toks['action_mask'][1].astype(np.float32).astype(np.float64),     # the reference's dtypes
        logp=toks['sample_logp'][1].astype(np.float32).astype(np.float64),
        reward=np.array([f.reward for f in fs], dtype=np.float64), prov=prov, declared=np.array([f.declared for f in fs]),
        tokenizer=np.array([f.provenance.tokenizer for f in fs], dtype=object),
        template=np.array([f.provenance.template for f in fs], dtype=object))
    ok = np.zeros(B, dtype=bool)
    groups: dict = {}
    for i, f in enumerate(facts):
        if f is not None:
            groups.setdefault(f.provenance.tokenizer, []).append(i)
    for tokenizer, rows in groups.items():
        verdict = screen(cols, expected_for(facts[rows[0]].provenance))
        ok[rows] = verdict[rows]
    return ok


def _tally(rep, T: int, trained: int, f) -> None:
    """What :func:`agentrl.jobs.check._tally` and ``_versions`` count for an accepted record."""
    rep.n += 1
    rep.lengths.append(T)
    rep.trained.append(trained)
    rep.stops[str(f.info.get('stop'))] += 1
    rep.truncated += is_truncated(f)
    rep.policies[f.provenance.policy] += 1
    rep.scripted += f.placeholder
    pv, tpv = f.versions
    vs = tuple(dict.fromkeys(v for v in (tpv if tpv is not None else [pv]) if v is not None))
    rep.versions[('..'.join(str(v) for v in (vs[0], vs[-1])) if len(vs) > 1 else str(vs[0])) if vs
                 else '(none)'] += 1
    rep.spanning += len(vs) > 1


def _reference(rb: pa.RecordBatch, f: str, first: int, i: int) -> list:
    """Row ``i`` of ``rb`` as :func:`agentrl.store.scan` gives it (decoded by the per-record reader)."""
    ((n, rec, digest),) = _rows(rb.slice(i, 1), repr(f), first + i, True)
    bad = isinstance(rec, RecordError)
    return [StoredRow(f, n, None if bad else rec, rec if bad else None, digest)]


def _batch(rb, f: str, first: int, rep, seen: Deduper, expected_for) -> Iterator[list]:
    toks = _lists(rb)
    if toks is None:                              # a batch the columns cannot align: all by the reference
        for i in range(rb.num_rows):
            yield _reference(rb, f, first, i)
        return
    T = np.diff(toks['ids'][0])
    hashed = {name: np.ascontiguousarray(vals.astype(_HASH_DTYPE[name])) for name, (_, vals, _) in toks.items()}
    cells = _Cells(rb)
    facts = [_decode(cells, i, toks, hashed) for i in range(rb.num_rows)]
    ok = _accepted(toks, facts, expected_for)
    trained = np.bincount(np.repeat(np.arange(len(T)), T - 1), weights=hashed['action_mask'], minlength=len(T))
    for i, fa in enumerate(facts):
        if ok[i] and seen.see(fa, where=(f, first + i), digest=fa.content)[0] == Deduper.NEW:
            _tally(rep, int(T[i]), int(trained[i]), fa)
        else:
            yield _reference(rb, f, first, i)


def rows_to_check(opts, rep, seen: Deduper, expected_for) -> Iterator[list]:
    """The rows of ``opts.path`` that :func:`agentrl.jobs.check.run_check` must check itself.

    Accepted new rows are counted into ``rep`` (:class:`~agentrl.jobs.check.CheckReport`: ``n``,
    lengths, trained tokens, stops, truncation, policies, scripted, versions) and registered in
    ``seen``; every other row is yielded, in file and row order, as a one-row list of
    :class:`agentrl.store.StoredRow`; an empty list follows each record batch (for the progress).

    Args:
        opts: :class:`~agentrl.jobs.check.CheckOptions` (``path``, ``batch_size``).
        rep: the report being filled. seen: the check's :class:`~agentrl.checks.Deduper` (compact).
        expected_for: ``provenance -> Expected`` (``provenance.tokenizer`` is the only field read).

    Raises:
        FileNotFoundError, ValueError: as :func:`agentrl.store.scan`.
    """
    for f, first, rb in _record_batches(opts.path, opts.batch_size):
        yield from _batch(rb, f, first, rep, seen, expected_for)
        yield []
