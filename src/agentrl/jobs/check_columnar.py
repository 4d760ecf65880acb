"""L5: the model-free check by columns: clean rows counted in bulk, every other row checked by the reference.

:func:`rows_to_check` replaces :func:`agentrl.store.scan` as the row source of
:func:`agentrl.jobs.check.run_check` when no model is given. Per record batch it decodes the token
lists as flat numpy arrays, verifies every stored digest (the one rule of
:func:`agentrl.checks.identity.digest_arrays` and :func:`agentrl.store.schema.row_digest`), and runs
the acceptance rules over the columns (:func:`agentrl.checks.columnar.screen`). The rows before the
first that is not accepted or repeats a key (:meth:`agentrl.checks.Deduper.first_repeat`, numpy over
the batch's 64-bit keys) are registered at once (:meth:`~agentrl.checks.Deduper.add_new`: 24 bytes a
record) and tallied into the report here (``array('i')`` lengths), without building a record (so
without torch). From the first row that is not (malformed, edited, refused,
repeated, or of a kind the columns do not cover: chat-template info, stored call statuses, images, ``turn_contexts``, imported
context drift), the rest of its record batch is yielded as the :class:`agentrl.store.StoredRow` list
that :func:`agentrl.store.scan` gives, and ``run_check`` checks those rows with the per-record rules.
Same verdicts and messages, in the same order (tests/test_check_scale.py). The row-digest payload is
rebuilt column by column; a row it fails to verify goes to the reference, which words the verdict.

``AGENTRL_CHECK_PER_RECORD=1`` in the environment selects the per-record path (the benchmark's
"before"). Source: docs/design.md#integrity.
"""
from __future__ import annotations

import json
import os
from array import array
from hashlib import sha256
from json.encoder import encode_basestring_ascii
from types import SimpleNamespace
from typing import Iterator

import numpy as np
import pyarrow as pa

from ..checks.columnar import TokenColumns, covers, screen
from ..checks.errors import RecordError
from ..checks.identity import DIGEST_FIELDS, Deduper, digest64, key64
from ..stats import is_truncated
from ..store.read import StoredRow, out_of_memory_error, record_batches
from ..store.rows import json_cell, decode_rows, decode_sampling
from ..store.schema import DIGEST_V2, DIGESTED_COLUMNS, OPTIONAL_DIGEST_COLUMNS
from .plan import POLICIES

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


def _json_cells(values: list, typ: pa.DataType) -> list:
    """``json.dumps`` of each cell, as the row digest's payload writes it (strings by the C encoder)."""
    if pa.types.is_string(typ) or pa.types.is_large_string(typ):
        return ['null' if v is None else encode_basestring_ascii(v) for v in values]
    if pa.types.is_integer(typ):
        return ['null' if v is None else str(v) for v in values]
    if pa.types.is_boolean(typ):
        return ['null' if v is None else 'true' if v else 'false' for v in values]
    return [json.dumps(v) for v in values]


def _payloads(py: dict, types: dict, B: int) -> list:
    """Each row's row-digest payload: the sorted-key JSON of its :data:`DIGESTED_COLUMNS` cells, the optional
    columns only where not null (:func:`agentrl.store.schema.row_digest`, built column by column)."""
    parts = []
    for n, k in enumerate(sorted(DIGESTED_COLUMNS)):
        vals = py.get(k) or [None] * B
        pre = (',' if n else '{') + json.dumps(k) + ':'
        frags = _json_cells(vals, types.get(k, pa.null()))
        if k in OPTIONAL_DIGEST_COLUMNS:
            parts.append(['' if v is None else pre + f for v, f in zip(vals, frags)])
        else:
            parts.append([pre + f for f in frags])
    parts.append(['}'] * B)
    return [''.join(t) for t in zip(*parts)]


def _content_digests(toks: dict, hashed: dict, rewards: np.ndarray, rows) -> dict:
    """``{row: content digest}`` of ``rows``: :func:`agentrl.checks.identity.digest_arrays` over buffer slices."""
    fields = []
    for hname, name, dtype in DIGEST_FIELDS:
        if name not in toks:
            fields.append((hname.encode(), None, None, None, 0))
            continue
        offs, _, valid = toks[name]
        size = np.dtype(dtype).itemsize
        fields.append((hname.encode(), memoryview(hashed[name].tobytes()), offs.tolist(),
                       None if valid is None else valid.tolist(), size))
    rew = memoryview(rewards.astype(np.float64).tobytes())
    out = {}
    for i in rows:
        h = sha256()
        for hname, mv, offs, valid, size in fields:
            h.update(hname)
            if mv is None or (valid is not None and not valid[i]):
                h.update(b'<none>')
            else:
                h.update(mv[offs[i] * size:offs[i + 1] * size])
        h.update(b'reward')
        h.update(rew[i * 8:i * 8 + 8])
        out[i] = h.hexdigest()[:32]
    return out


def _parsed(cache: dict, raw, parse):
    """``(parse(raw),)`` cached by ``raw``; None when it raises (the reference words the refusal)."""
    if raw not in cache:
        try:
            cache[raw] = (parse(raw),)
        except (RecordError, ValueError, TypeError):
            cache[raw] = None
    return cache[raw]


def _versions(raw):
    """``(label, spans)`` of a row's ``(policy_version, turn_policy_versions)`` cells as the report counts
    them (:func:`agentrl.jobs.check._versions`); raises when the reference would refuse or reject them."""
    pv = json_cell(lambda n, i: raw[0], 'policy_version', 0)
    tpv = json_cell(lambda n, i: raw[1], 'turn_policy_versions', 0)
    ok = lambda v: v is None or (not isinstance(v, bool) and isinstance(v, (int, str)))  # noqa: E731
    if not ok(pv) or not (tpv is None or (isinstance(tpv, list) and all(ok(v) for v in tpv))):
        raise ValueError('not a policy version')
    vs = tuple(dict.fromkeys(v for v in (tpv if tpv is not None else [pv]) if v is not None))
    return ('..'.join(str(v) for v in (vs[0], vs[-1])) if len(vs) > 1 else str(vs[0])) if vs else '(none)', len(vs) > 1


def _decode(py: dict, B: int) -> list:
    """Per row: ``(info, sampling declared, versions)`` when every cell reads as the reference reads it, else None."""
    col = lambda n: py.get(n) or [None] * B  # noqa: E731
    samp, vers, out = {}, {}, []
    placeholder = col('logp_placeholder')
    for reward, attempt, tc, digest, sampling, pv, tpv, info, ph in zip(
            col('reward'), col('attempt'), col('turn_contexts'), col('digest'), col('sampling'),
            col('policy_version'), col('turn_policy_versions'), col('info'), placeholder):
        s = _parsed(samp, sampling, decode_sampling)
        v = _parsed(vers, (pv, tpv), _versions)
        if reward is None or attempt is None or tc is not None or not isinstance(digest, str) or s is None or v is None:
            out.append(None)
            continue
        try:
            d = json.loads(info) if info is not None else {}
        except (TypeError, ValueError):
            d = None
        ok = (isinstance(d, dict) and 'template' not in d and 'import' not in d and 'turn_calls' not in d
              and 'images' not in d)              # images: the reference runs the image gate
        out.append((d, s[0] is not None or bool(ph), v[0]) if ok else None)
    return out


def _verified(py: dict, types: dict, toks: dict, hashed: dict, facts: list, B: int) -> dict:
    """``{row: content digest}`` of the decoded rows whose stored digest matches their content."""
    rows = [i for i, f in enumerate(facts) if f is not None]
    rewards = np.array([0.0 if r is None else float(r) for r in py['reward']], dtype=np.float64)
    content = _content_digests(toks, hashed, rewards, rows)
    payloads = _payloads(py, types, B)
    stored = py['digest']
    out = {}
    for i in rows:
        c = content[i]
        if stored[i].startswith(DIGEST_V2):
            row = sha256(f'agentrl-row-v2\0{c}\0{payloads[i]}'.encode()).hexdigest()[:32]
            ok = stored[i] == f'{DIGEST_V2}{c}:{row}'
        else:
            ok = stored[i] == c
        if ok:
            out[i] = c
    return out


def _accepted(toks: dict, py: dict, rows: list, facts: list, expected_for) -> np.ndarray:
    """``[B]`` bool: rows of ``rows`` every acceptance rule accepts (one :func:`screen` per distinct tokenizer)."""
    B = len(facts)
    ends = toks['ids'][0][1:]
    tok = [t or '' for t in (py.get('tokenizer') or [None] * B)]
    cols = TokenColumns(
        starts=toks['ids'][0][:-1], ends=ends, ids=toks['ids'][1].astype(np.int64),
        owner=toks['owner'][1].astype(np.int64),
        mask=toks['action_mask'][1].astype(np.float32).astype(np.float64),     # the reference's dtypes
        logp=toks['sample_logp'][1].astype(np.float32).astype(np.float64),
        reward=np.array([np.nan if r is None else float(r) for r in py['reward']], dtype=np.float64),
        prov=np.array([a is not None for a in (py.get('attempt') or [None] * B)]),
        declared=np.array([f is not None and f[1] for f in facts]),
        tokenizer=np.array(tok, dtype=object),
        template=np.array([t or '' for t in (py.get('template') or [None] * B)], dtype=object))
    ok = np.zeros(B, dtype=bool)
    groups: dict = {}
    for i in rows:
        groups.setdefault(tok[i], []).append(i)
    for tokenizer, members in groups.items():
        verdict = screen(cols, expected_for(SimpleNamespace(tokenizer=tokenizer)))
        ok[members] = verdict[members]
    return ok


def _extend(values, new: np.ndarray) -> None:
    """Append ``new`` (int array) to a report list: an ``array('i')`` by its bytes, a list by its items."""
    if isinstance(values, array):
        values.frombytes(np.ascontiguousarray(new, dtype=np.dtype(values.typecode)).tobytes())
    else:
        values.extend(new.tolist())


def _flush(rep, n: int, T: np.ndarray, trained: np.ndarray, facts: list, py: dict) -> None:
    """Count accepted rows ``0..n-1`` as :func:`agentrl.jobs.check._tally` and ``_versions`` do, in row order."""
    if not n:
        return
    rep.n += n
    _extend(rep.lengths, T[:n])
    _extend(rep.trained, trained[:n].astype(np.int64))
    rep.stops.update(str(f[0].get('stop')) for f in facts[:n])
    rep.truncated += sum(is_truncated(SimpleNamespace(info=f[0])) for f in facts[:n])
    rep.policies.update(p or '' for p in (py.get('policy') or [None] * n)[:n])
    rep.scripted += sum(bool(p) for p in (py.get('logp_placeholder') or [None] * n)[:n])
    rep.versions.update(f[2][0] for f in facts[:n])
    rep.spanning += sum(f[2][1] for f in facts[:n])


def _reference(rb: pa.RecordBatch, f: str, first: int, i: int) -> list:
    """Rows ``i:`` of ``rb`` as :func:`agentrl.store.scan` gives them (decoded by the per-record reader)."""
    out = []
    for n, rec, digest in decode_rows(rb.slice(i), repr(f), first + i, True):
        bad = isinstance(rec, RecordError)
        out.append(StoredRow(f, n, None if bad else rec, rec if bad else None, digest))
    return out


def _keys(py: dict, content: dict, n: int) -> tuple[np.ndarray, np.ndarray]:
    """``([n] uint64 key64, [n] uint64 digest64)`` of rows ``0..n-1`` (accepted rows: ``content`` has them), keyed
    as :func:`agentrl.checks.dedupe_key` keys the record the reference builds (identity, else the digest)."""
    gid, rid, att = ((py.get(c) or [None] * n)[:n] for c in ('group_id', 'rollout_id', 'attempt'))
    keys = np.fromiter((key64(('id', g or '', r or '', int(a)) if g or r else ('digest', content[i]))
                        for i, (g, r, a) in enumerate(zip(gid, rid, att))), dtype=np.uint64, count=n)
    return keys, np.fromiter((digest64(content[i]) for i in range(n)), dtype=np.uint64, count=n)


def _one_tokenizer(one_tokenizer, tok: list, f: str, first: int, n: int) -> int:
    """The first of rows ``0..n-1`` whose tokenizer is not its file's first (``n``: none), as the reference's
    :class:`~agentrl.checks.consistency.OneTokenizerPerFile` sees them in row order (a row with the tokenizer of
    the row before it passes as that one did)."""
    last = None
    for i in range(n):
        t = tok[i] or ''
        if t != last:
            if one_tokenizer.see(SimpleNamespace(provenance=SimpleNamespace(tokenizer=t)), f, first + i):
                return i
            last = t
    return n


def _batch(rb, f: str, first: int, rep, seen: Deduper, expected_for, one_tokenizer=None) -> Iterator[list]:
    toks = _lists(rb)
    B = rb.num_rows
    if toks is None:                              # a batch the columns cannot align: all by the reference
        yield _reference(rb, f, first, 0)
        return
    T = np.diff(toks['ids'][0])
    hashed = {name: np.ascontiguousarray(vals.astype(_HASH_DTYPE[name])) for name, (_, vals, _) in toks.items()}
    py = {n: rb.column(n).to_pylist() for n in rb.schema.names if n not in _LISTS}
    py.setdefault('reward', [None] * B)
    py.setdefault('digest', [None] * B)
    facts = _decode(py, B)
    content = _verified(py, {n: rb.schema.field(n).type for n in py if n in rb.schema.names}, toks, hashed,
                        facts, B)
    ok = _accepted(toks, py, sorted(content), facts, expected_for)
    trained = np.bincount(np.repeat(np.arange(B), T - 1), weights=hashed['action_mask'], minlength=B)
    ok &= np.array([p in POLICIES for p in (py.get('policy') or [None] * B)], dtype=bool)
    n = int(np.argmin(ok)) if not ok.all() else B       # rows 0..n-1 pass every rule
    keys, digests = _keys(py, content, n)
    n = seen.first_repeat(keys)                          # ... and are new (rare hits: the reference words them)
    if one_tokenizer is not None:
        n = _one_tokenizer(one_tokenizer, py.get('tokenizer') or [None] * B, f, first, n)
    seen.add_new(keys[:n], digests[:n], f, np.arange(first, first + n))
    _flush(rep, n, T, trained, facts, py)
    if n < B:
        yield _reference(rb, f, first, n)         # this row and the rest of the batch, as scan lists them


def rows_to_check(opts, rep, seen: Deduper, expected_for, one_tokenizer=None) -> Iterator[list]:
    """The rows of ``opts.path`` that :func:`agentrl.jobs.check.run_check` must check itself.

    Accepted new rows are counted into ``rep`` (:class:`~agentrl.jobs.check.CheckReport`: ``n``,
    lengths, trained tokens, stops, truncation, policies, scripted, versions) and registered in
    ``seen``; from the first row of a record batch that is not, the rest of the batch is yielded as one
    list of :class:`agentrl.store.StoredRow` (what :func:`agentrl.store.scan` lists for those rows, so the
    check orders their refusals as it does per record); an empty list follows each record batch.

    Args:
        opts: :class:`~agentrl.jobs.check.CheckOptions` (``path``, ``batch_size``).
        rep: the report being filled. seen: the check's :class:`~agentrl.checks.Deduper` (compact).
        expected_for: ``provenance -> Expected`` (``provenance.tokenizer`` is the only field read).
        one_tokenizer: the check's :class:`agentrl.checks.consistency.OneTokenizerPerFile`; a row of another
            tokenizer than its file's first goes to the reference, which refuses it. Only rows of agentrl's
            own policies (:data:`agentrl.jobs.plan.POLICIES`) are counted here.

    Raises:
        FileNotFoundError, ValueError, MemoryError: as :func:`agentrl.store.scan` (a row group this process has no
            memory for, to decode or to convert, is named by file and number).
    """
    for f, first, rb in record_batches(opts.path, opts.batch_size):
        try:
            yield from _batch(rb, f, first, rep, seen, expected_for, one_tokenizer)
        except MemoryError:        # a batch's cells to Python (a huge info string): named as the reader names it
            raise out_of_memory_error(f, row=first) from None
        yield []
