"""L3: retry and resend identity of rollout records.

A record's identity is ``(group_id, rollout_id, attempt)`` from its provenance. A **retry**
samples again: it is a new attempt (``attempt + 1``, so a new identity) and never replaces a
record that was already scored. A **resend** delivers a completed result again: it keeps its
identity and content and is stored once. Same identity with different content is neither; it is
refused (:class:`~agentrl.checks.errors.IdentityConflictError`).

Source: docs/design.md#integrity.
"""
from __future__ import annotations

import hashlib
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

class Deduper:
    """Records seen so far, by :func:`dedupe_key`: each new one is new, a resend or a conflict.

    The one loop behind ``agentrl check`` (a repeat is refused, naming where the first was),
    ``agentrl report`` and ``agentrl show`` (records counted once). A **resend** repeats a seen
    record's key and content digest; a **conflict** repeats its key with other content.

    Args:
        seen: optional ``{key: digest}`` of records already seen (as :func:`dedupe` takes it);
            updated in place.
        compact: key by ``hash(key)`` (a 64-bit int) instead of the key, to hold millions of records.

    Attributes:
        seen: ``{key: digest}``. repeats: resends plus conflicts met so far (an int >= 0).
    """
    NEW, RESEND, CONFLICT = 'new', 'resend', 'conflict'

    def __init__(self, seen: dict | None = None, *, compact: bool = False):
        self.seen = {} if seen is None else seen
        self.repeats = 0
        self._compact = compact
        self._where: dict = {}

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
            key = hash(key)
        old = self.seen.get(key)
        if old is None:
            self.seen[key] = digest
            if where is not None:
                self._where[key] = where
            return self.NEW, where
        self.repeats += 1
        return (self.RESEND if old == digest else self.CONFLICT), self._where.get(key)

    def unique(self, records) -> list[Trajectory]:
        """The records whose key is new, in input order (resends and conflicts counted in :attr:`repeats`)."""
        return [r for r in records if self.see(r)[0] == self.NEW]


__all__ += ['Deduper']
