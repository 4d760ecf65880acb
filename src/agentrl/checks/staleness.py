"""L3: policy-version staleness: how many training steps behind the current weights a record was sampled.

A record's versions are ``provenance.turn_policy_versions`` (one per turn, asynchronous RL) or else
``provenance.policy_version``. Version order is defined for integer training steps only: the staleness
of a record is ``current_version - min(its versions)``, so a record whose turns span versions is as
stale as its oldest turn. A str version (a checkpoint fingerprint) equals or differs, it has no order:
comparing one raises :class:`StaleVersionError`, naming the record and the fix.

Source: asynchronous-RL staleness bounds (AReaL, Fu et al. 2025, "max staleness eta"; verl and slime's
``max_staleness`` / off-policy step limits): records older than k policy versions are refused.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from ..record import Trajectory
from .errors import RecordError
from .identity import record_key

__all__ = ['StaleVersionError', 'record_versions', 'record_staleness', 'StalenessReport', 'staleness_report',
           'require_fresh', 'sampled_by', 'require_one_version']


class StaleVersionError(RecordError):
    """A record sampled more than ``max_staleness`` policy versions ago, a version without an order, or records
    of several versions given without the current one (:func:`require_one_version`)."""


def record_versions(record: Trajectory) -> tuple:
    """The distinct policy versions that sampled ``record``, in turn order (``()`` when it has none)."""
    p = record.provenance
    if p is None:
        return ()
    vs = p.turn_policy_versions if p.turn_policy_versions is not None else [p.policy_version]
    return tuple(dict.fromkeys(v for v in vs if v is not None))


def _step(v, what: str, i: int) -> int:
    if isinstance(v, bool) or not isinstance(v, int):
        raise StaleVersionError(
            f'is {v!r} ({what}); staleness orders integer training steps only, a str fingerprint has no order',
            field='provenance.policy_version', position=i,
            fix='stamp records with the integer training step (policy_version=step), or drop max_staleness')
    return v


def record_staleness(record: Trajectory, current_version: int, i: int = 0) -> int | None:
    """``current_version - min(versions)`` in steps (None for a record without versions).

    Raises:
        StaleVersionError: ``current_version`` or a record version is not an int (``i`` names the record).
    """
    cur = _step(current_version, 'current_version', i)
    vs = record_versions(record)
    return None if not vs else cur - min(_step(v, f'record {i}', i) for v in vs)


def sampled_by(records: list[Trajectory], current_version) -> list[bool]:
    """Per record: True when every turn was sampled by ``current_version`` (or the record has no version,
    or ``current_version`` is None). Equality only: works for str fingerprints too. The step-0 ratio guard
    of :func:`agentrl.train.grpo_step` applies to these records only."""
    if current_version is None:
        return [True] * len(records)
    return [all(v == current_version for v in record_versions(r)) for r in records]


def require_one_version(records: list[Trajectory], caller: str) -> None:
    """Refuse records sampled by more than one policy version when no current version is known.

    Without the current version every record counts as sampled by the weights being trained, so the
    step-0 ratio guard and the update would treat older samples as on-policy (docs/design.md#training).

    Raises:
        StaleVersionError: ``CALLER: these records were sampled by N policy versions [...] and no current_version
            was given``, naming the versions (records without a version do not count).
    """
    seen = dict.fromkeys(v for r in records for v in record_versions(r))
    if len(seen) < 2:
        return
    found = sorted(seen, key=lambda v: (isinstance(v, str), v))
    raise StaleVersionError(
        f'{caller}: these records were sampled by {len(found)} policy versions {found} and no current_version was '
        'given, so all would count as sampled by the weights being trained', field='provenance.policy_version',
        fix=f'pass current_version= (the version of the weights being trained, e.g. {found[-1]!r}) so older records '
            'count as off-policy, or train on the records of one version')


@dataclass
class StalenessReport:
    """What :func:`staleness_report` found.

    Attributes:
        current_version: the version compared against.
        counts: ``{staleness: number of records}`` (int steps; key None: records without a version).
        spanning: indices of records whose turns span several versions (valid; reported).
        stale: indices of records with staleness > ``max_staleness`` (empty without a bound).
        max_staleness: the bound checked, or None.
    """
    current_version: int
    counts: dict = field(default_factory=dict)
    spanning: list = field(default_factory=list)
    stale: list = field(default_factory=list)
    max_staleness: int | None = None

    def to_dict(self) -> dict:
        """JSON-ready form (``counts`` keys as strings, ``'none'`` for unversioned)."""
        return {'current_version': self.current_version, 'max_staleness': self.max_staleness,
                'counts': {('none' if k is None else str(k)): n for k, n in sorted(
                    self.counts.items(), key=lambda kv: (kv[0] is None, kv[0] or 0))},
                'spanning': list(self.spanning), 'stale': list(self.stale)}


def staleness_report(records: list[Trajectory], current_version: int,
                     max_staleness: int | None = None) -> StalenessReport:
    """Staleness of every record against ``current_version`` (what ``agentrl check`` reports).

    Args:
        records: the records.
        current_version: the trainer's current step (int).
        max_staleness: optional bound k >= 0; records older than k steps are listed in ``stale``.

    Returns:
        :class:`StalenessReport`.

    Raises:
        StaleVersionError: a non-int ``current_version`` or record version (naming the record).
        ValueError: ``max_staleness < 0``.
    """
    if max_staleness is not None and max_staleness < 0:
        raise ValueError(f'staleness_report: max_staleness must be >= 0, got {max_staleness}')
    rep = StalenessReport(current_version=current_version, max_staleness=max_staleness)
    for i, r in enumerate(records):
        s = record_staleness(r, current_version, i)
        rep.counts[s] = rep.counts.get(s, 0) + 1
        if len(record_versions(r)) > 1:
            rep.spanning.append(i)
        if max_staleness is not None and s is not None and s > max_staleness:
            rep.stale.append(i)
    return rep


def require_fresh(records: list[Trajectory], current_version: int, max_staleness: int) -> None:
    """Refuse the first record sampled more than ``max_staleness`` versions before ``current_version``.

    Raises:
        StaleVersionError: names the record (position and ``rollout_id``), its versions, its staleness and
            the bound; or a version without an order (see :func:`record_staleness`).
        ValueError: ``max_staleness < 0``.
    """
    rep = staleness_report(records, current_version, max_staleness)
    if rep.stale:
        i = rep.stale[0]
        r = records[i]
        s = record_staleness(r, current_version, i)
        raise StaleVersionError(
            f'record {i} ({record_key(r)}) was sampled by version(s) {list(record_versions(r))}, {s} steps before '
            f'current version {current_version} > max_staleness={max_staleness}', field='provenance.policy_version',
            position=i, count=len(rep.stale),
            fix='drop or re-sample the stale records, or raise max_staleness')
