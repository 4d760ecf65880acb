"""L3: the acceptance validator: may another process trust this record?

:func:`validate` refuses a record for one reason at a time, each its own exception type
(:mod:`agentrl.checks.errors`); :func:`find_problems` lists every reason (one error per kind,
naming the first position and the count). Context positions need no probability and are never
deleted: only generated (policy-owned) positions are checked for log-probs.

Source: issue 4 (record integrity), item 4; lesson 004 ("Write an acceptance check that refuses
missing probabilities for generated positions, mismatched lengths and unknown tokenization
revisions. Exempt context positions from the probability requirement without deleting them.").
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ..record import OWNER, OWNER_NAMES, Trajectory
from .errors import (EndOfTurnNotTrainedError, InfiniteLogProbError, LengthMismatchError, MaskMissingOnPolicyError,
                     MaskOnNonPolicyError, MaskValueError, MissingFieldError, MissingLogProbError,
                     MissingProvenanceError, NaNLogProbError, PaddingMaskedError, PolicyFirstTokenError,
                     PositiveLogProbError, RecordError, TemplateMismatchError, TokenizerMismatchError,
                     UnknownOwnerError)

__all__ = ['Expected', 'validate', 'find_problems', 'POSITIVE_LOGP_TOL']

#: A generated position's log-prob above this is refused as positive (probability > 1).
POSITIVE_LOGP_TOL = 1e-6

_POLICY = OWNER['policy']
_FIX_MASK = 'derive the mask from owner with Trajectory.from_tokens (action_mask[j] = owner[j+1] == policy)'


def _unterminated_turns(record) -> list[int]:
    """Turns the recorder marked as cut off without a sampled end-of-turn token.

    Source: ``ChatRecorder`` writes ``info['template']['unterminated_turns']``.
    """
    info = getattr(record, 'info', None) or {}
    template = info.get('template') if isinstance(info, dict) else None
    turns = template.get('unterminated_turns') if isinstance(template, dict) else None
    return [int(k) for k in turns] if isinstance(turns, (list, tuple)) else []


@dataclass(frozen=True)
class Expected:
    """What the consumer expects of every record; None / empty disables that check.

    Attributes:
        tokenizer: expected ``provenance.tokenizer`` fingerprint.
        template: expected ``provenance.template`` fingerprint.
        pad_id: padding id; a trailing run of non-policy tokens with this id is padding.
        eot_ids: end-of-turn ids (e.g. the word-level ``</call>``, a chat model's ``<|im_end|>``);
            one that directly follows a policy token was sampled and must be trained.
    """
    tokenizer: str | None = None
    template: str | None = None
    pad_id: int | None = None
    eot_ids: tuple = ()

    @classmethod
    def from_tokenizer(cls, tok, eot_ids=None) -> 'Expected':
        """Expectations of a tokenizer: its fingerprints, pad id and end-of-turn ids.

        Args:
            tok: an :class:`agentrl.tokenizer.Tokenizer` (``call_end_id`` is its end of turn), or
                any object with ``fingerprint()`` and optionally ``template_fingerprint()``,
                ``pad_id`` / ``pad_token_id`` and ``eos_token_id``.
            eot_ids: override the end-of-turn ids.
        """
        tmpl = getattr(tok, 'template_fingerprint', None)
        pad = getattr(tok, 'pad_id', getattr(tok, 'pad_token_id', None))
        if eot_ids is None:
            eot = getattr(tok, 'call_end_id', getattr(tok, 'eos_token_id', None))
            eot_ids = () if eot is None else (eot,) if isinstance(eot, int) else tuple(eot)
        return cls(tokenizer=tok.fingerprint(), template=tmpl() if callable(tmpl) else None,
                   pad_id=pad, eot_ids=tuple(int(e) for e in eot_ids))


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


def find_problems(record: Trajectory, expected=None, *, require_provenance: bool = True) -> list[RecordError]:
    """Every reason to refuse ``record``: one error per kind, in the order :func:`validate` raises.

    Order: missing fields, lengths and owner codes (which stop the remaining checks), a
    policy-owned first token, then position checks ordered by their first position, then
    provenance and fingerprints.

    Args:
        record: a :class:`~agentrl.record.Trajectory` (``ids [T]``, ``owner [T]``,
            ``action_mask`` / ``sample_logp`` ``[T-1]`` aligned to ``ids[1:]``).
        expected: an :class:`Expected`, a dict of its fields, a tokenizer (see
            :meth:`Expected.from_tokenizer`) or None (structural checks only).
        require_provenance: refuse records without provenance, or sampled records without a
            sampling spec (default True).

    Returns:
        list of :class:`~agentrl.checks.errors.RecordError` (empty when the record is accepted).

    Raises:
        TypeError: ``expected`` of an unsupported type.
    """
    exp = _as_expected(expected)
    out: list[RecordError] = []
    ids, owner, mask, logp, turn = record.ids, record.owner, record.action_mask, record.sample_logp, record.turn
    if ids is None or len(ids) == 0:
        return [MissingFieldError('is empty or missing; a record needs at least its first context token',
                                  field='ids', fix='build records with Trajectory.from_tokens')]
    for name, val in (('owner', owner), ('action_mask', mask)):
        if val is None:
            out.append(MissingFieldError(f'is missing; the check needs {name} to tell actions from context',
                                         field=name, fix='build records with Trajectory.from_tokens, which '
                                         'keeps owner and derives action_mask from it'))
    if out:
        return out
    T = len(ids)
    lengths = {'owner': (owner, T), 'turn': (turn, T), 'action_mask': (mask, T - 1), 'sample_logp': (logp, T - 1)}
    for name, (val, n) in lengths.items():
        if val is not None and len(val) != n:
            aligned = 'ids' if n == T else 'ids[1:]'
            out.append(LengthMismatchError(
                f'has length {len(val)} but ids has length {T}; {name} is aligned to {aligned} (length {n})',
                field=name, fix='build records with Trajectory.from_tokens, the one place the shift happens'))
    if out:
        return out
    ids = torch.as_tensor(ids).long()
    owner = torch.as_tensor(owner).long()
    mask = torch.as_tensor(mask).float()
    bad = (owner < 0) | (owner >= len(OWNER_NAMES))
    if bad.any():
        j, n = _first(bad)
        return [UnknownOwnerError(f'is {int(owner[j])}, not an owner code {OWNER}', field='owner', position=j,
                                  fix='label each token template, prompt, policy or tool when appending it',
                                  count=n)]
    if owner[0] == _POLICY:
        out.append(PolicyFirstTokenError(
            'is policy, but the first token has no preceding position to score it', field='owner', position=0,
            fix='start the sequence with a template or prompt token'))

    positional: list[tuple[int, RecordError]] = []

    def add(err_cls, bad, what, field, fix):
        if bool(bad.any()):
            j, n = _first(bad)
            positional.append((j, err_cls(what(j), field=field, position=j, fix=fix, count=n)))

    pol = owner[1:] == _POLICY
    name = lambda j: OWNER_NAMES[int(owner[j + 1])]  # noqa: E731  owner of the token at row j
    binary = (mask == 0) | (mask == 1)
    add(MaskValueError, ~binary, lambda j: f'is {float(mask[j])}, not 0 or 1', 'action_mask',
        'action_mask entries are 0.0 or 1.0; derive them from owner')
    if T > 1:
        pad = torch.zeros(T - 1, dtype=torch.bool)
        if exp.pad_id is not None:
            is_pad = (ids == exp.pad_id) & (owner != _POLICY)
            trailing = is_pad.flip(0).long().cumprod(0).flip(0).bool()
            pad = trailing[1:]
            add(PaddingMaskedError, pad & (mask == 1),
                lambda j: f'is 1 on padding (ids[{j + 1}] is the pad id {exp.pad_id})', 'action_mask',
                'padding is never trained: set action_mask to 0 on padding (collate does)')
        eot_bad = torch.zeros(T - 1, dtype=torch.bool)
        if exp.eot_ids:
            is_eot = torch.isin(ids[1:], torch.tensor(exp.eot_ids, dtype=torch.long))
            eot_bad = is_eot & (owner[:-1] == _POLICY) & (mask == 0) & binary & ~pad
            cut = _unterminated_turns(record)
            if cut and getattr(record, 'turn', None) is not None:
                # a turn cut at max_new_tokens was closed by the template, not sampled
                eot_bad &= ~torch.isin(torch.as_tensor(record.turn)[:-1], torch.tensor(cut, dtype=torch.long))
            add(EndOfTurnNotTrainedError, eot_bad,
                lambda j: f'is 0 at the end-of-turn token ids[{j + 1}]={int(ids[j + 1])} (owner {name(j)}) that '
                          'ends a policy turn; the policy sampled it, so it must learn to stop',
                'action_mask', 'mark end-of-turn tokens the policy sampled as policy-owned, so action_mask is 1')
        want = pol.float()
        add(MaskOnNonPolicyError, (mask == 1) & ~pol & ~pad,
            lambda j: f'is 1 but ids[{j + 1}] is owned by {name(j)}; only policy tokens are trained.'
                      + _shift_hint(mask, want), 'action_mask', _FIX_MASK)
        add(MaskMissingOnPolicyError, (mask == 0) & pol & ~eot_bad,
            lambda j: f'is 0 but ids[{j + 1}] was sampled by the policy; the action would get no gradient.'
                      + _shift_hint(mask, want), 'action_mask', _FIX_MASK)
        if bool(pol.any()):
            if logp is None:
                j = int(pol.nonzero()[0])
                positional.append((j, MissingLogProbError(
                    'is missing but the record has generated positions', field='sample_logp',
                    fix='store the log-prob each token was sampled with (sample_next returns it)')))
            else:
                lp = torch.as_tensor(logp).double()
                fix = ('store log_softmax of the sampled distribution at each generated token; context '
                       'positions need none')
                add(NaNLogProbError, pol & lp.isnan(),
                    lambda j: f'is NaN at a generated position (ids[{j + 1}]); the probability is missing',
                    'sample_logp', fix)
                add(InfiniteLogProbError, pol & lp.isinf(),
                    lambda j: f'is {float(lp[j])} at a generated position (ids[{j + 1}]); a sampled token '
                              'had zero probability', 'sample_logp', fix + ', under the declared support')
                add(PositiveLogProbError, pol & (lp > POSITIVE_LOGP_TOL) & lp.isfinite(),
                    lambda j: f'is {float(lp[j]):.6g} > 0 at a generated position (ids[{j + 1}]); a '
                              'log-probability is <= 0 (was a probability or a logit stored?)', 'sample_logp',
                    fix + ' (natural log, nats)')
    out.extend(err for _, err in sorted(positional, key=lambda p: p[0]))

    prov = record.provenance
    if prov is None:
        if require_provenance or exp.tokenizer or exp.template:
            out.append(MissingProvenanceError(
                'is missing; another process cannot tell which tokenizer, template and sampler made the record',
                field='provenance', fix='attach a Provenance (rollouts do)'))
        return out
    if require_provenance and prov.sampling is None and not prov.logp_placeholder and T > 1 and bool(pol.any()):
        out.append(MissingProvenanceError(
            'is None on a record with sampled tokens; nobody can tell which distribution the log-probs '
            'came from', field='provenance.sampling',
            fix='record the SamplingSpec (temperature, top_k, top_p, min_p, logp_mode), or set '
                'logp_placeholder=True for scripted records'))
    if exp.tokenizer and prov.tokenizer != exp.tokenizer:
        out.append(TokenizerMismatchError(
            f'is {prov.tokenizer!r} but {exp.tokenizer!r} was expected; the ids came from another tokenizer '
            'revision and mean other words', field='provenance.tokenizer',
            fix='re-run the rollout with the expected tokenizer, or expect this fingerprint'))
    if exp.template and prov.template != exp.template:
        out.append(TemplateMismatchError(
            f'is {prov.template!r} but {exp.template!r} was expected; the conditioning prefix was rendered '
            'by another template', field='provenance.template',
            fix='re-render with the expected template, or expect this fingerprint'))
    return out


def validate(record: Trajectory, expected=None, *, require_provenance: bool = True) -> None:
    """Accept a record or raise the first reason to refuse it.

    Refusals (each its own type, all :class:`~agentrl.checks.errors.RecordError`, a ValueError):
    missing ``owner`` / ``action_mask`` (MissingFieldError); lengths that disagree
    (LengthMismatchError); unknown owner codes (UnknownOwnerError); a policy-owned first token
    (PolicyFirstTokenError); mask values other than 0/1 (MaskValueError); padding with mask 1
    (PaddingMaskedError); an end-of-turn token sampled but not trained (EndOfTurnNotTrainedError);
    mask 1 on a non-policy position (MaskOnNonPolicyError) or 0 on a policy one
    (MaskMissingOnPolicyError); missing, NaN, infinite or positive log-probs on generated
    positions (MissingLogProbError, NaNLogProbError, InfiniteLogProbError, PositiveLogProbError);
    no provenance or no sampling spec (MissingProvenanceError); a tokenizer or template
    fingerprint other than expected (TokenizerMismatchError, TemplateMismatchError, both
    FingerprintMismatchError). Each message names the field, the position and the fix.

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

    Source: issue 4, item 4; lesson 004 (acceptance check).
    """
    problems = find_problems(record, expected, require_provenance=require_provenance)
    if problems:
        raise problems[0]
