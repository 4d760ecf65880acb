"""L3: retry and resend identity of rollout records.

Identity, retry and resend are those of docs/design.md#integrity; a conflict is an
:class:`~agentrl.checks.errors.IdentityConflictError`.
"""
from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import replace

import numpy as np
from .._lazy import lazy_module

torch = lazy_module('torch')

from ..record import Provenance, Trajectory
from .errors import IdentityConflictError, MissingProvenanceError

__all__ = ['identity', 'has_identity', 'dedupe_key', 'record_key', 'episode_key', 'record_digest', 'digest_arrays',
           'new_attempt', 'is_resend', 'dedupe']


def identity(record: Trajectory) -> tuple[str, str, int]:
    """The record's identity ``(group_id, rollout_id, attempt)``.

    Args:
        record: a :class:`~agentrl.record.Trajectory` with provenance.

    Returns:
        ``(group_id: str, rollout_id: str, attempt: int)``.

    Raises:
        MissingProvenanceError: ``record.provenance`` is None. Fix: build records with a
            :class:`~agentrl.record.Provenance` (rollouts do).
    """
    prov = record.provenance
    if prov is None:
        raise MissingProvenanceError('record has no provenance, so it has no identity', field='provenance',
                                     fix='attach a Provenance with group_id, rollout_id and attempt')
    return (str(prov.group_id), str(prov.rollout_id), int(prov.attempt))


def has_identity(record: Trajectory) -> bool:
    """True when the record carries a usable identity (provenance with a group or rollout id)."""
    prov = record.provenance
    return prov is not None and bool(prov.group_id or prov.rollout_id)


def record_key(record: Trajectory) -> str:
    """Identity as one string for messages, ``'group/rollout#attempt'``; e.g. ``'g3/r7#2'``.

    A rollout id that already starts with ``group/`` (agentrl's own runs name rollouts
    ``group_id + '/k'``) is not prefixed again: ``'0/model/clamp/3#1'``, not
    ``'0/model/clamp/0/model/clamp/3#1'``. Compare identities with :func:`identity`, not this label.

    Raises:
        MissingProvenanceError: as :func:`identity`.
    """
    g, r, a = identity(record)
    return f'{episode_key(g, r)}#{a}'


def episode_key(group_id: str, rollout_id: str) -> str:
    """An episode ``(group_id, rollout_id)`` as one string for messages: ``'group/rollout'``.

    A rollout id that already starts with ``group/`` is printed alone: ``episode_key('0/model/clamp',
    '0/model/clamp/3')`` is ``'0/model/clamp/3'``; ``episode_key('g3', 'r7')`` is ``'g3/r7'``.
    """
    return rollout_id if group_id and rollout_id.startswith(f'{group_id}/') else f'{group_id}/{rollout_id}'


#: The digested fields, in hashing order: (name hashed, record field, dtype of the hashed bytes).
DIGEST_FIELDS = (('ids', 'ids', np.int64), ('owner', 'owner', np.int64), ('turn', 'turn', np.int64),
                 ('mask', 'action_mask', np.float32), ('logp', 'sample_logp', np.float32))
_TORCH_DTYPES = {np.int64: 'int64', np.float32: 'float32'}   # torch dtype names


def _field_bytes(a, dtype) -> bytes:
    """The bytes of one field as ``dtype`` (C order); ``b'<none>'`` for None."""
    if a is None:
        return b'<none>'
    if isinstance(a, np.ndarray):
        return (a if a.dtype == dtype else a.astype(dtype)).tobytes()
    return torch.as_tensor(a).detach().to('cpu', getattr(torch, _TORCH_DTYPES[dtype])).contiguous().numpy().tobytes()


def digest_arrays(fields: dict, reward: float) -> str:
    """The content digest of a record given as its fields: the one digest rule (:func:`record_digest`).

    Args:
        fields: ``{'ids', 'owner', 'turn', 'action_mask', 'sample_logp'}`` -> a numpy array, a torch
            tensor, a list, or None (a missing key counts as None). Hashed as int64 (ids, owner,
            turn) and float32 (mask, log-probs) bytes; numpy arrays are hashed without torch
            (the store's reader), tensors are converted on the CPU.
        reward: the episode reward, hashed as float64.

    Returns:
        str, 32 lowercase hex digits (sha256).
    """
    h = hashlib.sha256()
    for name, field, dtype in DIGEST_FIELDS:
        h.update(name.encode())
        h.update(_field_bytes(fields.get(field), dtype))
    h.update(b'reward')
    h.update(np.float64(reward).tobytes())
    return h.hexdigest()[:32]


def record_digest(record: Trajectory) -> str:
    """Content digest of a record: sha256 (32 hex digits) of what a scorer consumed.

    Covers ``ids`` (as int64), ``owner``, ``turn`` (int64), ``action_mask``, ``sample_logp``
    (float32 bit patterns) and ``reward`` (float64); not ``info`` (it may carry timings) and not
    provenance (the identity is compared separately). Two records with equal digests are the
    same result. The bytes are those of :func:`digest_arrays` (the store verifies rows with it).

    Returns:
        str, 32 lowercase hex digits.
    """
    return digest_arrays({field: getattr(record, field) for _, field, _ in DIGEST_FIELDS}, float(record.reward))


def new_attempt(record: Trajectory | Provenance, **changes) -> Provenance:
    """Provenance for a retry that samples again: same group and rollout, ``attempt + 1``.

    The caller samples a fresh episode and attaches this provenance; the old record keeps its
    own identity and is never overwritten.

    Args:
        record: the record (or its provenance) being retried.
        **changes: further :class:`~agentrl.record.Provenance` fields to set (e.g. ``seed``).

    Returns:
        A new :class:`~agentrl.record.Provenance`; the input is not modified.

    Raises:
        MissingProvenanceError: a Trajectory without provenance. Fix: attach one first.

    Example:
        >>> new_attempt(Provenance(group_id='g', rollout_id='r', attempt=1)).attempt
        2
    """
    prov = record if isinstance(record, Provenance) else record.provenance
    if prov is None:
        raise MissingProvenanceError('cannot retry a record without provenance', field='provenance',
                                     fix='attach a Provenance with group_id, rollout_id and attempt')
    return replace(prov, attempt=int(prov.attempt) + 1, **changes)


def is_resend(stored: Trajectory, incoming: Trajectory) -> bool:
    """Whether ``incoming`` is a resend of ``stored`` (same identity, same content).

    Returns:
        True for a resend; False when the identities differ (a different record, e.g. a retry).

    Raises:
        IdentityConflictError: same identity but different content (a retry that reused its
            attempt number). Fix: give the retry :func:`new_attempt`.
        MissingProvenanceError: either record has no provenance.
    """
    if identity(stored) != identity(incoming):
        return False
    if record_digest(stored) != record_digest(incoming):
        raise _conflict(record_key(incoming))
    return True


def _conflict(key: str) -> IdentityConflictError:
    return IdentityConflictError(
        f'identity {key} is already taken by a record with different content; a retry that samples '
        'again must not overwrite a scored record', field='provenance.attempt',
        fix='give the retry a new attempt with agentrl.checks.new_attempt(record)')


def dedupe_key(record: Trajectory, digest: str | None = None) -> tuple:
    """The key under which records count as the same: ``('id', group_id, rollout_id, attempt)`` for a
    record with an identity (:func:`has_identity`), else ``('digest', content digest)``.

    Args:
        record: a Trajectory. digest: its :func:`record_digest` when already computed.

    Returns:
        a hashable tuple. Used by :func:`dedupe`, ``agentrl check`` (duplicates and identity
        conflicts) and ``agentrl report`` (records counted once).
    """
    if has_identity(record):
        return ('id', *identity(record))
    return ('digest', digest if digest is not None else record_digest(record))


def dedupe(records, seen: dict | None = None) -> tuple[list[Trajectory], int]:
    """Drop resends, keep retries, refuse identity conflicts.

    Records with an identity (:func:`has_identity`) are keyed by it; anonymous records are keyed
    by their content digest (an exact duplicate is a resend).

    Args:
        records: iterable of Trajectory.
        seen: optional ``{key: digest}`` of records already stored; updated in place with the
            kept records.

    Returns:
        ``(kept, n_resends)``: the records to store, in input order, and how many were resends.

    Raises:
        IdentityConflictError: a record shares its identity with a stored or earlier record but
            differs in content. Fix: :func:`new_attempt` for retries.
    """
    deduper = Deduper(seen)
    kept = []
    for rec in records:
        verdict, _ = deduper.see(rec)
        if verdict == Deduper.NEW:
            kept.append(rec)
        elif verdict == Deduper.CONFLICT:
            raise _conflict(record_key(rec))
    n_resends = deduper.repeats
    return kept, n_resends


# ----------------------------------------------------------------------------- Deduper: the one dedupe loop

_ROW_BITS = 40                        # a packed where: file index << 40 | row (row < 2**40)
_NO_WHERE, _ODD_WHERE = -1, -2        # packed where of None / of a where kept in a side dict


def key64(key: tuple) -> int:
    """A stable 64-bit hash of a :func:`dedupe_key` (blake2b, the same in every process: not ``hash()``).

    ``('id', group, rollout, attempt)`` hashes ``'id\\0{len(group)}\\0{group}\\0{rollout}\\0{attempt}'`` and
    ``('digest', d)`` hashes ``'digest\\0{d}'`` (UTF-8, ``surrogatepass``), so no two keys share their bytes.

    Returns:
        int in ``[0, 2**64)``. Two distinct keys collide with probability about 2**-64 per pair.
    """
    if key[0] == 'id':
        _, g, r, a = key
        text = f'id\0{len(g)}\0{g}\0{r}\0{a}'
    else:
        text = f'digest\0{key[1]}'
    return int.from_bytes(hashlib.blake2b(text.encode('utf-8', 'surrogatepass'), digest_size=8).digest(), 'little')


def digest64(digest: str) -> int:
    """The first 64 bits of a content digest (:func:`record_digest`, hex) as an int: what a compact
    :class:`Deduper` compares to tell a resend from a conflict."""
    return int(digest[:16], 16)


class _Runs:
    """Sorted runs of ``(key, digest prefix, packed where)`` as uint64 / uint64 / int64 arrays (an LSM tree:
    each run more than twice the next, so at most log2(n) runs and O(log n) copies per entry), plus a
    small dict of entries added one at a time. 24 bytes per entry; a merge holds about 10 more."""

    def __init__(self):
        self.runs: list = []              # [(keys sorted, digests, wheres)], largest first
        self.buf: dict = {}               # key -> (digest prefix, packed where), merged at 4096 or before a batch

    def __len__(self) -> int:
        return len(self.buf) + sum(len(k) for k, _, _ in self.runs)

    def get(self, key: int):
        """``(digest prefix, packed where)`` of ``key``, or None."""
        if key in self.buf:
            return self.buf[key]
        q = np.uint64(key)
        for k, d, w in self.runs:
            i = int(np.searchsorted(k, q))
            if i < len(k) and k[i] == q:
                return int(d[i]), int(w[i])
        return None

    def put(self, key: int, digest: int, where: int) -> None:
        self.buf[key] = (digest, where)
        if len(self.buf) >= 4096:
            self.flush()

    def flush(self) -> None:
        if self.buf:
            n, vals = len(self.buf), self.buf.values()
            keys = np.fromiter(self.buf, dtype=np.uint64, count=n)
            digests = np.fromiter((d for d, _ in vals), dtype=np.uint64, count=n)
            wheres = np.fromiter((w for _, w in vals), dtype=np.int64, count=n)
            self.buf = {}
            self.add(keys, digests, wheres)

    def found(self, keys: np.ndarray) -> np.ndarray:
        """``[n]`` bool: which of ``keys`` (uint64) are held (call :meth:`flush` first)."""
        out = np.zeros(len(keys), dtype=bool)
        for k, _, _ in self.runs:
            i = np.minimum(np.searchsorted(k, keys), len(k) - 1)
            out |= k[i] == keys
        return out

    def add(self, keys: np.ndarray, digests: np.ndarray, wheres: np.ndarray) -> None:
        """Add entries whose keys are new and distinct (uint64, uint64, int64 arrays of one length)."""
        if not len(keys):
            return
        order = np.argsort(keys, kind='stable')
        self.runs.append((keys[order], digests[order], wheres[order]))
        while len(self.runs) > 1 and len(self.runs[-2][0]) <= 2 * len(self.runs[-1][0]):
            self._merge_last()

    def _merge_last(self) -> None:
        """Merge the two smallest runs, one array at a time (each old array freed once copied: ~34 bytes an entry)."""
        small, big = list(self.runs.pop()), list(self.runs.pop())
        n = len(big[0]) + len(small[0])
        to_small = np.zeros(n, dtype=bool)
        to_small[np.searchsorted(big[0], small[0]) + np.arange(len(small[0]))] = True
        to_big = ~to_small
        out = []
        for j in range(3):
            m = np.empty(n, dtype=big[j].dtype)
            m[to_big], m[to_small] = big[j], small[j]
            big[j] = small[j] = None
            out.append(m)
        self.runs.append(tuple(out))


class _CompactSeen(Mapping):
    """``{key64: digest prefix (16 hex digits)}``: the ``seen`` of a compact :class:`Deduper` (read only)."""

    def __init__(self, runs: _Runs):
        self._runs = runs

    def __getitem__(self, key):
        got = self._runs.get(key) if isinstance(key, int) and 0 <= key < 2 ** 64 else None
        if got is None:
            raise KeyError(key)
        return f'{got[0]:016x}'

    def __iter__(self):
        yield from self._runs.buf
        for k, _, _ in self._runs.runs:
            yield from k.tolist()

    def __len__(self) -> int:
        return len(self._runs)


class Deduper:
    """Records seen so far, by :func:`dedupe_key`: each new one is new, a resend or a conflict.

    The one loop behind ``agentrl check`` (a repeat is refused, naming where the first was),
    ``agentrl report`` and ``agentrl show`` (records counted once). A **resend** repeats a seen
    record's key and content digest; a **conflict** repeats its key with other content.

    Args:
        seen: optional ``{key: digest}`` of records already seen (as :func:`dedupe` takes it);
            updated in place. Not with ``compact``.
        compact: hold millions of records in 24 bytes each: numpy arrays of :func:`key64` (the key),
            :func:`digest64` (the digest) and the ``where`` packed as ``(file index, row)`` (a ``where`` that is
            not ``(str, int)`` is kept in a dict). A resend and a conflict are told apart by 64 digest bits.
            :meth:`first_repeat` and :meth:`add_new` take a record batch's keys at once (the columnar check).

    Attributes:
        seen: ``{key: digest}`` (compact: a read-only mapping ``{key64: 16 hex digits}``). repeats: resends
        plus conflicts met by :meth:`see` so far (an int >= 0).

    Raises:
        ValueError: ``seen`` given with ``compact``.
    """
    NEW, RESEND, CONFLICT = 'new', 'resend', 'conflict'

    def __init__(self, seen: dict | None = None, *, compact: bool = False):
        if compact and seen is not None:
            raise ValueError('Deduper(seen, compact=True): a compact Deduper keeps its own arrays; pass seen only '
                             'without compact')
        self._compact = compact
        self._runs = _Runs() if compact else None
        self.seen = _CompactSeen(self._runs) if compact else {} if seen is None else seen
        self.repeats = 0
        self._where: dict = {}            # key -> where (compact: only a where that does not pack)
        self._files: dict = {}            # compact: file -> index
        self._names: list = []            # compact: index -> file

    def see(self, record: Trajectory, where=None, digest: str | None = None) -> tuple[str, object]:
        """Record ``record``; return ``(verdict, first_where)``.

        Args:
            record: a Trajectory. where: what to report for it when a later record repeats it (e.g.
                ``(file, row)``; kept only for new records). digest: its :func:`record_digest` when
                already computed.

        Returns:
            ``('new', where)``, or ``('resend' | 'conflict', where of the first record with that key)``.
        """
        digest = record_digest(record) if digest is None else digest
        key = dedupe_key(record, digest)
        if self._compact:
            return self._see_compact(key64(key), digest64(digest), where)
        old = self.seen.get(key)
        if old is None:
            self.seen[key] = digest
            if where is not None:
                self._where[key] = where
            return self.NEW, where
        self.repeats += 1
        return (self.RESEND if old == digest else self.CONFLICT), self._where.get(key)

    def _see_compact(self, key: int, digest: int, where) -> tuple[str, object]:
        old = self._runs.get(key)
        if old is None:
            packed = self._pack(where)
            if packed == _ODD_WHERE:
                self._where[key] = where
            self._runs.put(key, digest, packed)
            return self.NEW, where
        self.repeats += 1
        return (self.RESEND if old[0] == digest else self.CONFLICT), self._unpack(key, old[1])

    def _file_index(self, file: str) -> int:
        if file not in self._files:
            self._files[file] = len(self._names)
            self._names.append(file)
        return self._files[file]

    def _pack(self, where) -> int:
        if where is None:
            return _NO_WHERE
        if (isinstance(where, tuple) and len(where) == 2 and isinstance(where[0], str)
                and isinstance(where[1], (int, np.integer)) and not isinstance(where[1], bool)
                and 0 <= where[1] < 1 << _ROW_BITS):
            return self._file_index(where[0]) << _ROW_BITS | int(where[1])
        return _ODD_WHERE

    def _unpack(self, key: int, packed: int):
        if packed == _NO_WHERE:
            return None
        if packed == _ODD_WHERE:
            return self._where.get(key)
        return self._names[packed >> _ROW_BITS], packed & ((1 << _ROW_BITS) - 1)

    def first_repeat(self, keys: np.ndarray) -> int:
        """Compact only: the index of the first of ``keys`` (``[n]`` uint64, :func:`key64`, in row order) that
        repeats a held key or an earlier one of ``keys``; ``n`` when none does. Changes nothing.

        Raises:
            ValueError: not compact.
        """
        if not self._compact:
            raise ValueError('Deduper.first_repeat needs Deduper(compact=True)')
        n = len(keys)
        if not n:
            return 0
        self._runs.flush()
        order = np.argsort(keys, kind='stable')
        sk = keys[order]
        later = order[1:][sk[1:] == sk[:-1]]           # a later row of a key met earlier in keys
        hits = np.flatnonzero(self._runs.found(keys))
        return int(min(later.min() if len(later) else n, hits[0] if len(hits) else n))

    def add_new(self, keys: np.ndarray, digests: np.ndarray, file: str, rows: np.ndarray) -> None:
        """Compact only: register new records at once: ``keys`` ``[n]`` uint64 (:func:`key64`, none held, none
        repeated: :meth:`first_repeat` gave ``n``), ``digests`` ``[n]`` uint64 (:func:`digest64`), and where they
        are: ``file`` and ``rows`` ``[n]`` int (each ``0 <= row < 2**40``).

        Raises:
            ValueError: not compact.
        """
        if not self._compact:
            raise ValueError('Deduper.add_new needs Deduper(compact=True)')
        rows = np.asarray(rows, dtype=np.int64)
        if len(rows) and (rows.min() < 0 or rows.max() >= 1 << _ROW_BITS):
            raise ValueError(f'Deduper.add_new: rows must lie in [0, 2**{_ROW_BITS})')
        self._runs.add(np.asarray(keys, dtype=np.uint64), np.asarray(digests, dtype=np.uint64),
                       rows | np.int64(self._file_index(file) << _ROW_BITS))

    def unique(self, records) -> list[Trajectory]:
        """The records whose key is new, in input order (resends and conflicts counted in :attr:`repeats`)."""
        return [r for r in records if self.see(r)[0] == self.NEW]


__all__ += ['Deduper', 'key64', 'digest64']
