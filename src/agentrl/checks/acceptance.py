"""L3: the acceptance validator: may another process trust this record?

The validator is an ordered tuple of small named rules (:data:`RULES`), each a predicate over one
record in the style of TRL's ``chat_template_utils`` checks: it looks at one property and returns
the refusals it finds, each its own exception type (:mod:`agentrl.checks.errors`) naming the
field, the first position, the count and the fix. :func:`find_problems` runs every rule and lists
every reason (one error per kind); :func:`validate` raises the first.

Rule stages (:class:`Rule.stage`):

* ``'shape'``: the fields exist, agree in length and hold known codes; a failure stops the
  remaining rules (nothing else can be read reliably).
* ``'position'``: per-position rules; consecutive ones are merged and ordered by the first
  position each names, so :func:`validate` raises the earliest fault in the sequence.
* ``'record'``: whole-record rules (first token, reward, provenance, fingerprints).

Context positions need no probability and are never deleted: only generated (policy-owned)
positions are checked for log-probs. Source: the acceptance check of the book's record-integrity
chapter ("refuse missing probabilities for generated positions, mismatched lengths and unknown
tokenization revisions; exempt context positions from the probability requirement without
deleting them"); docs/design.md#integrity.

To add a rule: write ``def rule_name(r: Facts) -> list[RecordError]`` (for a ``'position'`` rule,
return ``[(position, error), ...]``) and insert ``Rule('name', rule_name, stage)`` into
:data:`RULES` where its refusal should rank.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property
from typing import Callable

from .._lazy import lazy_module

torch = lazy_module('torch')

from ..record import OWNER, OWNER_NAMES, Trajectory
from .errors import (EndOfTurnNotTrainedError, InfiniteLogProbError, LengthMismatchError, MaskMissingOnPolicyError,
                     MaskOnNonPolicyError, MaskValueError, MissingFieldError, MissingLogProbError,
                     MissingProvenanceError, NaNLogProbError, NonFiniteRewardError, PaddingMaskedError,
                     PolicyFirstTokenError, PositiveLogProbError, RecordError, TemplateMismatchError,
                     TokenIdError, TokenizerMismatchError, UnknownOwnerError)

from .calls import call_spans_valid, malformed_call_rows, stored_calls
from .template_rules import chat_tokens, control_ids_not_in_content, turn_closed

__all__ = ['Expected', 'Facts', 'Rule', 'RULES', 'validate', 'find_problems', 'POSITIVE_LOGP_TOL']

#: A generated position's log-prob above this is refused as positive (probability > 1).
POSITIVE_LOGP_TOL = 1e-6

_POLICY = OWNER['policy']
_FIX_MASK = 'derive the mask from owner with Trajectory.from_tokens (action_mask[j] = owner[j+1] == policy)'
_FIX_LOGP = 'store log_softmax of the sampled distribution at each generated token; context positions need none'


def _unterminated_turns(record) -> list[int]:
    """Turns whose end-of-turn the template wrote, not the policy: cut off, or stopped at another stop id.

    Source: ``ChatRecorder`` writes ``info['template']['unterminated_turns']`` and ``['closed_by_template']``.
    """
    info = getattr(record, 'info', None) or {}
    template = info.get('template') if isinstance(info, dict) else None
    if not isinstance(template, dict):
        return []
    out = []
    for key in ('unterminated_turns', 'closed_by_template'):
        turns = template.get(key)
        out += [int(k) for k in turns] if isinstance(turns, (list, tuple)) else []
    return out


def _vocab_size(tok) -> int | None:
    """Number of token ids of a tokenizer (added tokens included), or None if it cannot say."""
    inner = getattr(tok, 'tokenizer', None)          # a ChatTemplate wraps a Hugging Face tokenizer
    for obj in (inner, tok):
        if obj is not None and hasattr(obj, '__len__'):
            try:
                return int(len(obj))
            except TypeError:
                pass
    v = getattr(tok, 'vocab_size', None)
    return int(v) if isinstance(v, int) else None


@dataclass(frozen=True)
class Expected:
    """What the consumer expects of every record; None / empty disables that check.

    Attributes:
        tokenizer: expected ``provenance.tokenizer`` fingerprint.
        template: expected ``provenance.template`` fingerprint.
        pad_id: padding id; a trailing run of non-policy tokens with this id is padding.
        eot_ids: end-of-turn ids (e.g. the word-level ``</call>``, a chat model's ``<|im_end|>``);
            one that directly follows a policy token was sampled and must be trained.
        vocab_size: number of token ids V; an id outside ``[0, V)`` is refused (ids < 0 are
            refused even when V is unknown).
    """
    tokenizer: str | None = None
    template: str | None = None
    pad_id: int | None = None
    eot_ids: tuple = ()
    vocab_size: int | None = None

    @classmethod
    def from_tokenizer(cls, tok, eot_ids=None) -> 'Expected':
        """Expectations of a tokenizer: its fingerprints, pad id, end-of-turn ids and vocabulary size.

        Args:
            tok: an :class:`agentrl.tokenizer.Tokenizer` (``call_end_id`` is its end of turn), a
                :class:`agentrl.templates.ChatTemplate`, or any object with ``fingerprint``
                (method or property) and optionally ``template_fingerprint()``,
                ``pad_id`` / ``pad_token_id``, ``eos_token_id`` and ``len()``.
            eot_ids: override the end-of-turn ids.
        """
        fp = getattr(tok, 'fingerprint')
        tmpl = getattr(tok, 'template_fingerprint', None)
        pad = getattr(tok, 'pad_id', getattr(tok, 'pad_token_id', None))
        if eot_ids is None:
            eot = getattr(tok, 'call_end_id', getattr(tok, 'eos_token_id', None))
            eot_ids = () if eot is None else (eot,) if isinstance(eot, int) else tuple(eot)
        return cls(tokenizer=fp() if callable(fp) else fp, template=tmpl() if callable(tmpl) else None,
                   pad_id=pad, eot_ids=tuple(int(e) for e in eot_ids), vocab_size=_vocab_size(tok))


def _as_expected(expected) -> Expected:
    if expected is None:
        return Expected()
    if isinstance(expected, Expected):
        return expected
    if isinstance(expected, dict):
        return Expected(**expected)
    if hasattr(expected, 'fingerprint'):
        return Expected.from_tokenizer(expected)
    raise TypeError(f'expected must be an Expected, a dict of its fields, a tokenizer or None, '
                    f'got {type(expected).__name__}')


def _first(bad: torch.Tensor) -> tuple[int, int]:
    idx = bad.nonzero().flatten()
    return int(idx[0]), len(idx)


def _shift_hint(mask: torch.Tensor, want: torch.Tensor) -> str:
    if len(mask) > 1 and torch.equal(mask[:-1], want[1:]) and mask[-1] == 0:
        return ' The mask equals the correct one shifted left by one (aligned to ids[2:]): it was shifted twice.'
    if len(mask) > 1 and torch.equal(mask[1:], want[:-1]) and mask[0] == 0:
        return ' The mask equals the correct one shifted right by one (aligned to ids, not ids[1:]): it was never shifted.'
    return ''


class Facts:
    """One record and the derived views the rules share (computed once, on first use).

    Attributes:
        record: the :class:`~agentrl.record.Trajectory`.
        exp: the :class:`Expected`.
        require_provenance: see :func:`find_problems`.
        ids, owner: ``[T]`` int64; mask: ``[T-1]`` float32 (valid once the shape rules passed).
        T: number of tokens.
        policy: ``[T-1]`` bool, ``ids[j+1]`` is policy-owned.
        binary: ``[T-1]`` bool, ``action_mask[j]`` is 0 or 1.
        padding: ``[T-1]`` bool, ``ids[j+1]`` is trailing padding (``exp.pad_id``).
        eot_ids: the end-of-turn ids: ``exp.eot_ids``, else the record's template end-of-turn
            (``info['template']['chat_tokens']['end_of_turn']``), so the shifted-mask rule needs no flag.
        eot_untrained: ``[T-1]`` bool, a sampled end-of-turn token with mask 0.
        forced_untrained: ``[T-1]`` bool, a token the declared grammar forced (stored log-prob 0.0) with mask 0:
            left out of the loss on purpose (``--mask-forced``, docs/grammar.md).
        call_untrained: ``[T-1]`` bool, a token of a stored tool call whose status is not ``ok`` with mask 0:
            left out of the loss on purpose (``--mask-malformed-calls``, :mod:`agentrl.checks.calls`).
    """

    def __init__(self, record: Trajectory, exp: Expected, require_provenance: bool):
        self.record, self.exp, self.require_provenance = record, exp, require_provenance

    @cached_property
    def T(self) -> int:
        return len(self.record.ids)

    @cached_property
    def ids(self) -> torch.Tensor:
        return torch.as_tensor(self.record.ids).long()

    @cached_property
    def owner(self) -> torch.Tensor:
        return torch.as_tensor(self.record.owner).long()

    @cached_property
    def mask(self) -> torch.Tensor:
        return torch.as_tensor(self.record.action_mask).float()

    @cached_property
    def policy(self) -> torch.Tensor:
        return self.owner[1:] == _POLICY

    @cached_property
    def binary(self) -> torch.Tensor:
        return (self.mask == 0) | (self.mask == 1)

    @cached_property
    def padding(self) -> torch.Tensor:
        if self.exp.pad_id is None or self.T < 2:
            return torch.zeros(max(self.T - 1, 0), dtype=torch.bool)
        is_pad = (self.ids == self.exp.pad_id) & (self.owner != _POLICY)
        return is_pad.flip(0).long().cumprod(0).flip(0).bool()[1:]

    @cached_property
    def eot_ids(self) -> tuple:
        """``exp.eot_ids``, else the record's own template end-of-turn (``info['template']['chat_tokens']``)."""
        if self.exp.eot_ids:
            return tuple(self.exp.eot_ids)
        ct = chat_tokens(self.record)
        return tuple(ct['end_of_turn']) if ct is not None else ()

    @cached_property
    def forced_untrained(self) -> torch.Tensor:
        r, zeros = self.record, torch.zeros(max(self.T - 1, 0), dtype=torch.bool)
        spec = r.provenance.sampling if r.provenance is not None else None
        if spec is None or spec.constraint is None or r.sample_logp is None or len(r.sample_logp) != len(zeros):
            return zeros
        return self.policy & (self.mask == 0) & (torch.as_tensor(r.sample_logp) == 0)

    @cached_property
    def call_untrained(self) -> torch.Tensor:
        zeros = torch.zeros(max(self.T - 1, 0), dtype=torch.bool)
        if stored_calls(self.record) is None:
            return zeros
        try:
            rows = malformed_call_rows(self.record)
        except (RecordError, TypeError, ValueError):     # a bad entry: call_spans_valid refuses it
            return zeros
        return rows & (self.mask == 0) if len(rows) == len(zeros) else zeros

    @cached_property
    def eot_untrained(self) -> torch.Tensor:
        if not self.eot_ids or self.T < 2:
            return torch.zeros(max(self.T - 1, 0), dtype=torch.bool)
        is_eot = torch.isin(self.ids[1:], torch.tensor(self.eot_ids, dtype=torch.long))
        bad = is_eot & (self.owner[:-1] == _POLICY) & (self.mask == 0) & self.binary & ~self.padding
        cut = _unterminated_turns(self.record)
        if cut and self.record.turn is not None:
            # a turn cut at max_new_tokens was closed by the template, not sampled
            bad &= ~torch.isin(torch.as_tensor(self.record.turn)[:-1], torch.tensor(cut, dtype=torch.long))
        return bad & ~self.forced_untrained

    def owner_name(self, j: int) -> str:
        """Owner name of the token that row ``j`` predicts (``ids[j+1]``)."""
        return OWNER_NAMES[int(self.owner[j + 1])]

    def at(self, err_cls, bad: torch.Tensor, what: Callable[[int], str], field: str, fix: str) -> list:
        """``[(first position, err_cls(...))]`` when ``bad`` (bool ``[N]``) has any True, else ``[]``."""
        if not bool(bad.any()):
            return []
        j, n = _first(bad)
        return [(j, err_cls(what(j), field=field, position=j, fix=fix, count=n))]


@dataclass(frozen=True)
class Rule:
    """One named acceptance rule.

    Attributes:
        name: short name (``'mask_on_actions'``), for listing and selection.
        check: ``check(facts) -> list``: refusals (``'shape'`` / ``'record'``) or
            ``(position, refusal)`` pairs (``'position'``); empty when the rule holds.
        stage: ``'shape'`` (a refusal stops the later rules), ``'position'`` (ordered by first
            position with its neighbours) or ``'record'``.
    """
    name: str
    check: Callable[[Facts], list]
    stage: str = 'record'


# ------------------------------------------------------------------------------ shape rules

def fields_present(r: Facts) -> list[RecordError]:
    """``ids`` non-empty; ``owner`` and ``action_mask`` present."""
    rec = r.record
    if rec.ids is None or len(rec.ids) == 0:
        return [MissingFieldError('is empty or missing; a record needs at least its first context token',
                                  field='ids', fix='build records with Trajectory.from_tokens')]
    return [MissingFieldError(f'is missing; the check needs {name} to tell actions from context', field=name,
                              fix='build records with Trajectory.from_tokens, which keeps owner and derives '
                                  'action_mask from it')
            for name in ('owner', 'action_mask') if getattr(rec, name) is None]


def lengths_agree(r: Facts) -> list[RecordError]:
    """``owner``/``turn`` have T entries, ``action_mask``/``sample_logp`` T-1 (aligned to ``ids[1:]``)."""
    rec, T = r.record, r.T
    out = []
    for name, n in (('owner', T), ('turn', T), ('action_mask', T - 1), ('sample_logp', T - 1)):
        val = getattr(rec, name)
        if val is not None and len(val) != n:
            aligned = 'ids' if n == T else 'ids[1:]'
            out.append(LengthMismatchError(
                f'has length {len(val)} but ids has length {T}; {name} is aligned to {aligned} (length {n})',
                field=name, fix='build records with Trajectory.from_tokens, the one place the shift happens'))
    return out


def owner_codes_known(r: Facts) -> list[RecordError]:
    """Every owner code is one of :data:`agentrl.record.OWNER`."""
    bad = (r.owner < 0) | (r.owner >= len(OWNER_NAMES))
    if not bool(bad.any()):
        return []
    j, n = _first(bad)
    return [UnknownOwnerError(f'is {int(r.owner[j])}, not an owner code {OWNER}', field='owner', position=j,
                              fix='label each token template, prompt, policy or tool when appending it', count=n)]


# ------------------------------------------------------------------------------ record rules

def ids_in_vocabulary(r: Facts) -> list[RecordError]:
    """Every id is in ``[0, vocab_size)`` (``>= 0`` when the vocabulary size is unknown)."""
    V = r.exp.vocab_size
    bad = r.ids < 0 if V is None else (r.ids < 0) | (r.ids >= V)
    if not bool(bad.any()):
        return []
    j, n = _first(bad)
    span = '>= 0' if V is None else f'in [0, {V}), the vocabulary of the expected tokenizer'
    return [TokenIdError(f'is {int(r.ids[j])}, not a token id (ids are {span})', field='ids', position=j,
                         fix='the record was corrupted or came from another tokenizer; re-run the rollout, or '
                             'check against the tokenizer that made it', count=n)]


def first_token_not_policy(r: Facts) -> list[RecordError]:
    """``owner[0]`` is not policy: no position precedes the first token to score it."""
    if int(r.owner[0]) != _POLICY:
        return []
    return [PolicyFirstTokenError('is policy, but the first token has no preceding position to score it',
                                  field='owner', position=0, fix='start the sequence with a template or prompt token')]


def reward_finite(r: Facts) -> list[RecordError]:
    """``reward`` is a finite number (a NaN or inf reward poisons every advantage of its group)."""
    reward = r.record.reward
    try:
        value = float(reward)
    except (TypeError, ValueError):
        value = None
    if value is not None and math.isfinite(value):
        return []
    shown = repr(reward) if value is None else str(value)
    return [NonFiniteRewardError(f'is {shown}, not a finite number; it would poison every advantage of its group',
                                 field='reward', fix='score the episode again, or drop it before training')]


# ------------------------------------------------------------------------------ position rules

def mask_binary(r: Facts) -> list:
    """Every ``action_mask`` entry is 0.0 or 1.0."""
    return r.at(MaskValueError, ~r.binary, lambda j: f'is {float(r.mask[j])}, not 0 or 1', 'action_mask',
                'action_mask entries are 0.0 or 1.0; derive them from owner')


def padding_untrained(r: Facts) -> list:
    """Trailing padding (``Expected.pad_id``) has ``action_mask`` 0."""
    return r.at(PaddingMaskedError, r.padding & (r.mask == 1),
                lambda j: f'is 1 on padding (ids[{j + 1}] is the pad id {r.exp.pad_id})', 'action_mask',
                'padding is never trained: set action_mask to 0 on padding (collate does)')


def end_of_turn_trained(r: Facts) -> list:
    """An end-of-turn token right after a policy token was sampled, so its mask is 1."""
    return r.at(EndOfTurnNotTrainedError, r.eot_untrained,
                lambda j: f'is 0 at the end-of-turn token ids[{j + 1}]={int(r.ids[j + 1])} (owner '
                          f'{r.owner_name(j)}) that ends a policy turn; the policy sampled it, so it must learn '
                          'to stop', 'action_mask',
                'mark end-of-turn tokens the policy sampled as policy-owned, so action_mask is 1')


def mask_off_context(r: Facts) -> list:
    """``action_mask`` is 0 where ``ids[j+1]`` is not policy-owned (context is never trained)."""
    want = r.policy.float()
    return r.at(MaskOnNonPolicyError, (r.mask == 1) & ~r.policy & ~r.padding,
                lambda j: f'is 1 but ids[{j + 1}] is owned by {r.owner_name(j)}; only policy tokens are trained.'
                          + _shift_hint(r.mask, want), 'action_mask', _FIX_MASK)


def mask_on_actions(r: Facts) -> list:
    """``action_mask`` is 1 where ``ids[j+1]`` was sampled by the policy."""
    want = r.policy.float()
    return r.at(MaskMissingOnPolicyError, (r.mask == 0) & r.policy & ~r.eot_untrained & ~r.forced_untrained
                & ~r.call_untrained,
                lambda j: f'is 0 but ids[{j + 1}] was sampled by the policy; the action would get no gradient.'
                          + _shift_hint(r.mask, want), 'action_mask', _FIX_MASK)


def logp_present(r: Facts) -> list:
    """A record with generated positions stores ``sample_logp``."""
    if r.record.sample_logp is not None or not bool(r.policy.any()):
        return []
    j = int(r.policy.nonzero()[0])
    return [(j, MissingLogProbError('is missing but the record has generated positions', field='sample_logp',
                                    fix='store the log-prob each token was sampled with (sample_next returns it)'))]


def _logp(r: Facts) -> torch.Tensor | None:
    lp = r.record.sample_logp
    return None if lp is None else torch.as_tensor(lp).double()


def logp_not_nan(r: Facts) -> list:
    """No generated position's ``sample_logp`` is NaN."""
    lp = _logp(r)
    return [] if lp is None else r.at(
        NaNLogProbError, r.policy & lp.isnan(),
        lambda j: f'is NaN at a generated position (ids[{j + 1}]); the probability is missing', 'sample_logp',
        _FIX_LOGP)


def logp_finite(r: Facts) -> list:
    """No generated position's ``sample_logp`` is +-inf."""
    lp = _logp(r)
    return [] if lp is None else r.at(
        InfiniteLogProbError, r.policy & lp.isinf(),
        lambda j: f'is {float(lp[j])} at a generated position (ids[{j + 1}]); a sampled token had zero '
                  'probability', 'sample_logp', _FIX_LOGP + ', under the declared support')


def logp_not_positive(r: Facts) -> list:
    """No generated position's ``sample_logp`` exceeds :data:`POSITIVE_LOGP_TOL` (a probability > 1)."""
    lp = _logp(r)
    return [] if lp is None else r.at(
        PositiveLogProbError, r.policy & (lp > POSITIVE_LOGP_TOL) & lp.isfinite(),
        lambda j: f'is {float(lp[j]):.6g} > 0 at a generated position (ids[{j + 1}]); a log-probability is '
                  '<= 0 (was a probability or a logit stored?)', 'sample_logp', _FIX_LOGP + ' (natural log, nats)')


# ------------------------------------------------------------------------------ provenance rules

def provenance_present(r: Facts) -> list[RecordError]:
    """The record carries a :class:`~agentrl.record.Provenance` (when required or fingerprints are expected)."""
    if r.record.provenance is not None or not (r.require_provenance or r.exp.tokenizer or r.exp.template):
        return []
    return [MissingProvenanceError(
        'is missing; another process cannot tell which tokenizer, template and sampler made the record',
        field='provenance', fix='attach a Provenance (rollouts do)')]


def sampling_declared(r: Facts) -> list[RecordError]:
    """A record with sampled tokens declares its :class:`~agentrl.record.SamplingSpec` (or is a placeholder)."""
    prov = r.record.provenance
    if (prov is None or not r.require_provenance or prov.sampling is not None or prov.logp_placeholder
            or r.T < 2 or not bool(r.policy.any())):
        return []
    return [MissingProvenanceError(
        'is None on a record with sampled tokens; nobody can tell which distribution the log-probs came from',
        field='provenance.sampling', fix='record the SamplingSpec (temperature, top_k, top_p, min_p, logp_mode), '
                                         'or set logp_placeholder=True for scripted records')]


def tokenizer_expected(r: Facts) -> list[RecordError]:
    """``provenance.tokenizer`` equals the expected fingerprint (when one is expected)."""
    prov = r.record.provenance
    if prov is None or not r.exp.tokenizer or prov.tokenizer == r.exp.tokenizer:
        return []
    return [TokenizerMismatchError(
        f'is {prov.tokenizer!r} but {r.exp.tokenizer!r} was expected; the ids came from another tokenizer '
        'revision and mean other words', field='provenance.tokenizer',
        fix='re-run the rollout with the expected tokenizer, or expect this fingerprint')]


def template_expected(r: Facts) -> list[RecordError]:
    """``provenance.template`` equals the expected fingerprint (when one is expected)."""
    prov = r.record.provenance
    if prov is None or not r.exp.template or prov.template == r.exp.template:
        return []
    return [TemplateMismatchError(
        f'is {prov.template!r} but {r.exp.template!r} was expected; the conditioning prefix was rendered by '
        'another template', field='provenance.template',
        fix='re-render with the expected template, or expect this fingerprint')]


#: The acceptance rules in the order their refusals are reported (see the module docstring).
RULES: tuple[Rule, ...] = (
    Rule('fields_present', fields_present, 'shape'),
    Rule('lengths_agree', lengths_agree, 'shape'),
    Rule('owner_codes_known', owner_codes_known, 'shape'),
    Rule('ids_in_vocabulary', ids_in_vocabulary),
    Rule('first_token_not_policy', first_token_not_policy),
    Rule('mask_binary', mask_binary, 'position'),
    Rule('padding_untrained', padding_untrained, 'position'),
    Rule('end_of_turn_trained', end_of_turn_trained, 'position'),
    Rule('mask_off_context', mask_off_context, 'position'),
    Rule('mask_on_actions', mask_on_actions, 'position'),
    Rule('logp_present', logp_present, 'position'),
    Rule('logp_not_nan', logp_not_nan, 'position'),
    Rule('logp_finite', logp_finite, 'position'),
    Rule('logp_not_positive', logp_not_positive, 'position'),
    Rule('reward_finite', reward_finite),
    Rule('turn_closed', turn_closed),
    Rule('control_ids_not_in_content', control_ids_not_in_content),
    Rule('call_spans_valid', call_spans_valid),
    Rule('provenance_present', provenance_present),
    Rule('sampling_declared', sampling_declared),
    Rule('tokenizer_expected', tokenizer_expected),
    Rule('template_expected', template_expected),
)


def find_problems(record: Trajectory, expected=None, *, require_provenance: bool = True,
                  rules: tuple[Rule, ...] = RULES) -> list[RecordError]:
    """Every reason to refuse ``record``: one error per kind, in the order :func:`validate` raises.

    Runs :data:`RULES` in order: a ``'shape'`` rule's refusal stops the rest; consecutive
    ``'position'`` rules are reported ordered by the first position each names.

    Args:
        record: a :class:`~agentrl.record.Trajectory` (``ids [T]``, ``owner [T]``,
            ``action_mask`` / ``sample_logp`` ``[T-1]`` aligned to ``ids[1:]``).
        expected: an :class:`Expected`, a dict of its fields, a tokenizer (see
            :meth:`Expected.from_tokenizer`) or None (structural checks only).
        require_provenance: refuse records without provenance, or sampled records without a
            sampling spec (default True).
        rules: the rules to run (default :data:`RULES`).

    Returns:
        list of :class:`~agentrl.checks.errors.RecordError` (empty when the record is accepted).

    Raises:
        TypeError: ``expected`` of an unsupported type.
    """
    facts = Facts(record, _as_expected(expected), require_provenance)
    out: list[RecordError] = []
    pending: list[tuple[int, RecordError]] = []
    for rule in rules:
        if rule.stage != 'position' and pending:
            out.extend(err for _, err in sorted(pending, key=lambda p: p[0]))
            pending = []
        found = rule.check(facts)
        if rule.stage == 'position':
            pending.extend(found)
        else:
            out.extend(found)
            if rule.stage == 'shape' and found:
                return out
    out.extend(err for _, err in sorted(pending, key=lambda p: p[0]))
    return out


def validate(record: Trajectory, expected=None, *, require_provenance: bool = True) -> None:
    """Accept a record or raise the first reason to refuse it.

    Refusals (each its own type, all :class:`~agentrl.checks.errors.RecordError`, a ValueError):
    missing ``owner`` / ``action_mask`` (MissingFieldError); lengths that disagree
    (LengthMismatchError); unknown owner codes (UnknownOwnerError); an id below 0 or outside the
    expected vocabulary (TokenIdError); a policy-owned first token (PolicyFirstTokenError); mask
    values other than 0/1 (MaskValueError); padding with mask 1 (PaddingMaskedError); an
    end-of-turn token sampled but not trained (EndOfTurnNotTrainedError); mask 1 on a non-policy
    position (MaskOnNonPolicyError) or 0 on a policy one (MaskMissingOnPolicyError); missing,
    NaN, infinite or positive log-probs on generated positions (MissingLogProbError,
    NaNLogProbError, InfiniteLogProbError, PositiveLogProbError); a reward that is not a finite
    number (NonFiniteRewardError); no provenance or no sampling spec (MissingProvenanceError); a
    tokenizer or template fingerprint other than expected (TokenizerMismatchError,
    TemplateMismatchError, both FingerprintMismatchError); a stored tool-call span outside the ids or
    over non-policy tokens (CallSpanError). Each message names the field, the position and the fix.

    Args:
        record: the record (see :func:`find_problems`).
        expected: what the consumer expects (see :func:`find_problems`).
        require_provenance: see :func:`find_problems`.

    Raises:
        RecordError: the first problem, in :func:`find_problems` order.

    Example:
        ids ``[p1, p2, a1, a2, EOS]`` owned prompt, prompt, policy, policy, policy: the mask over
        ``ids[1:]`` ``[0, 1, 1, 1]`` is accepted; the doubly shifted ``[1, 1, 1, 0]`` raises
        ``MaskOnNonPolicyError: action_mask[0]: is 1 but ids[1] is owned by prompt ...``.
    """
    problems = find_problems(record, expected, require_provenance=require_provenance)
    if problems:
        raise problems[0]
