"""L4: table -> records: each stored row decoded, validated field by field, and its digest verified.

A row that cannot be trusted becomes a :class:`~agentrl.checks.errors.MalformedRowError` or
:class:`~agentrl.checks.errors.DigestMismatchError` naming the source, the row, the field and the
fix. The content digest is :func:`agentrl.checks.identity.digest_arrays` over the stored numpy
slices (no torch); the row part is :func:`agentrl.store.schema.row_digest`.

Source: docs/design.md#integrity.
"""
from __future__ import annotations

import json
from typing import Iterator

import numpy as np
import pyarrow as pa
from .._lazy import lazy_module

torch = lazy_module('torch')

from ..checks.errors import DigestMismatchError, MalformedRowError, RecordError
from ..checks.identity import digest_arrays
from ..record import Provenance, SamplingSpec, Trajectory
from .schema import DIGEST_V2, DIGESTED_COLUMNS, TOKEN_COLUMNS, row_digest

__all__ = ['from_table']

_SAMPLING_KEYS = frozenset(f for f in SamplingSpec.__dataclass_fields__)
_REQUIRED_LISTS = ('ids', 'action_mask', 'sample_logp')


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


def _bad(field: str, what: str, fix: str) -> MalformedRowError:
    return MalformedRowError(what, field=field, fix=fix)


def _json_field(raw, field: str, fix: str):
    try:
        return json.loads(raw)
    except (TypeError, ValueError) as e:
        raise _bad(field, f'is not valid JSON ({str(e)[:60]})', fix) from None


def decode_sampling(raw) -> SamplingSpec | None:
    """The :class:`~agentrl.record.SamplingSpec` of a row's ``sampling`` JSON cell (None when null).

    Raises:
        agentrl.checks.errors.MalformedRowError: the cell is not JSON, not an object, has unknown keys, or holds a
            spec that :class:`~agentrl.record.SamplingSpec` refuses (the message names the field and the fix).
    """
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


def _token_arrays(toks: dict, i: int) -> dict:
    """Row ``i``'s token lists as numpy arrays (int64 or float32; None for a null optional list)."""
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
    return arrays


def _provenance(get, i: int) -> Provenance | None:
    """Row ``i``'s provenance (None when its ``attempt`` is null)."""
    attempt = get('attempt', i)
    if attempt is None:
        return None
    seed = get('seed', i)
    return Provenance(policy=get('policy', i) or '', tokenizer=get('tokenizer', i) or '',
                      template=get('template', i) or '', sampling=decode_sampling(get('sampling', i)),
                      model=get('model', i) or '', logp_placeholder=bool(get('logp_placeholder', i)),
                      group_id=get('group_id', i) or '', rollout_id=get('rollout_id', i) or '',
                      attempt=int(attempt), seed=None if seed is None else int(seed),
                      agentrl_version=get('agentrl_version', i) or '',
                      policy_version=json_cell(get, 'policy_version', i),
                      turn_policy_versions=json_cell(get, 'turn_policy_versions', i))


def json_cell(get, name: str, i: int):
    """Row ``i``'s JSON cell ``name`` decoded (None when null or absent); MalformedRowError when it is not JSON
    (or, for ``turn_policy_versions``, not a list)."""
    cell, fix = get(name, i), 'rewrite the file from its records with agentrl.store.write_trajectories'
    v = None if cell is None else _json_field(cell, name, fix)
    if name == 'turn_policy_versions' and v is not None and not isinstance(v, list):
        raise _bad(name, f'is a JSON {type(v).__name__}, not a list of policy versions (one per turn)', fix)
    for x in (v if isinstance(v, list) else [v]):
        if x is not None and (isinstance(x, bool) or not isinstance(x, (int, str))):
            raise _bad(name, f'holds {x!r}; a policy version is an int step or a str fingerprint', fix)
    return v


def _verified_digest(arrays: dict, reward: float, get, i: int) -> str:
    """The content digest of row ``i``, after checking it (and a v2 row part) against the stored ``digest``."""
    stored = get('digest', i)
    if stored is None:
        raise MalformedRowError('is missing: every row agentrl writes carries the digest of its content, so a '
                                'row without one cannot be trusted', field='digest',
                                fix='re-run the rollout for this episode, or read with verify=False to inspect it')
    content = digest_arrays(arrays, reward)
    v2 = isinstance(stored, str) and stored.startswith(DIGEST_V2)
    want = row_digest(content, {c: get(c, i) for c in DIGESTED_COLUMNS}) if v2 else content
    if want != stored:
        what = ('ids, owner, turn, action_mask, sample_logp, reward, provenance, task, info, turn_contexts'
                if v2 else 'ids, owner, turn, action_mask, sample_logp, reward')
        raise DigestMismatchError(
            f'the stored digest {str(stored)[:12]}... does not match the row\'s content ({what}): the row was '
            'edited after writing', field='digest',
            fix='re-run the rollout for this episode; never edit a stored record in place')
    return content


def _row(toks: dict, get, i: int, verify: bool) -> tuple[Trajectory, str | None]:
    """Convert row ``i`` (validated field by field) -> ``(record, content digest or None without verify)``.

    Raises MalformedRowError / DigestMismatchError.
    """
    arrays = _token_arrays(toks, i)
    reward = get('reward', i)
    if reward is None or isinstance(reward, bool) or not isinstance(reward, (int, float)):
        raise _bad('reward', f'is {reward!r}, not a number',
                   'store the episode reward (a float); drop rows that were never scored')
    reward = float(reward)
    prov = _provenance(get, i)
    tc = _turn_contexts(get('turn_contexts', i), len(arrays['ids']))
    info = _info(get('info', i))
    digest = _verified_digest(arrays, reward, get, i) if verify else None
    fields = {name: None if a is None else torch.from_numpy(a) for name, a in arrays.items()}
    return Trajectory(ids=fields['ids'], action_mask=fields['action_mask'], sample_logp=fields['sample_logp'],
                      reward=reward, info=info, owner=fields.get('owner'), turn=fields.get('turn'),
                      provenance=prov, turn_contexts=tc), digest


def decode_rows(rb: pa.RecordBatch, source: str, first_row: int, verify: bool) -> Iterator:
    """``(row_number, Trajectory or RecordError, content digest or None)`` for each row of one record batch.

    The digest is the one the verification computed (None without ``verify`` or for a bad row), so a
    caller that needs it (``agentrl check``) does not hash the row again.
    """
    names = rb.schema.names
    toks = {}
    for name, _, _, tdt in TOKEN_COLUMNS:
        if name in names:
            toks[name] = (_lists(rb.column(name)), tdt)
    py = {name: rb.column(name).to_pylist() for name in names if name not in toks}
    get = lambda name, i: py[name][i] if name in py else None  # noqa: E731
    for i in range(rb.num_rows):
        where = f'{source} row {first_row + i}'
        try:
            rec, digest = _row(toks, get, i, verify)
        except RecordError as e:
            yield first_row + i, e.at(where), None
        else:
            yield first_row + i, rec, digest


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
        for _, rec, _ in decode_rows(rb, source, first_row, verify):
            if isinstance(rec, RecordError):
                raise rec
            out.append(rec)
        first_row += rb.num_rows
    return out


def _tdt_np(tdt):
    return tdt   # schema.TOKEN_COLUMNS names the record's numpy dtype (torch.from_numpy keeps it)
