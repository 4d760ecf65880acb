"""L3: the acceptance rules over columns: which rows of a batch every rule of :data:`RULES` accepts.

:func:`screen` evaluates the rules of :mod:`agentrl.checks.acceptance` on flat numpy arrays (one
pass per rule over all tokens of a batch, no per-record Python), so ``agentrl check`` can accept
clean rows at tens of thousands per second. It only *accepts*: a row it does not accept is checked
by :func:`agentrl.checks.find_problems` (the reference), which words the refusal. So the verdicts
and messages are the per-record rules' by construction, provided :func:`screen` never accepts a row
the reference refuses (tests/test_check_scale.py: a property test over mutated files).

Not covered here, left to the reference (the caller sends such rows there): records whose ``info``
carries ``template`` (the chat rules :func:`~agentrl.checks.template_rules.turn_closed`,
:func:`~agentrl.checks.template_rules.control_ids_not_in_content` and cut turns) or ``turn_calls``
(:func:`~agentrl.checks.calls.call_spans_valid`), records with
``turn_contexts``, and batches whose per-token fields disagree in length. Standard library and
numpy only (no torch). Source: docs/design.md#integrity.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..record import OWNER, OWNER_NAMES
from .acceptance import POSITIVE_LOGP_TOL, RULES, Expected

__all__ = ['COVERED_RULES', 'TokenColumns', 'covers', 'screen']

#: the names of :data:`agentrl.checks.RULES` that :func:`screen` evaluates (a rule added to RULES
#: without a columnar twin switches the columnar check off: :func:`covers`)
COVERED_RULES = frozenset({
    'fields_present', 'lengths_agree', 'owner_codes_known', 'ids_in_vocabulary', 'first_token_not_policy',
    'mask_binary', 'padding_untrained', 'end_of_turn_trained', 'mask_off_context', 'mask_on_actions',
    'logp_present', 'logp_not_nan', 'logp_finite', 'logp_not_positive', 'reward_finite',
    'turn_closed', 'control_ids_not_in_content',      # rows with chat-template info go to the reference
    'call_spans_valid',                               # rows with info['turn_calls'] go to the reference
    'provenance_present', 'sampling_declared', 'tokenizer_expected', 'template_expected'})

_POLICY = OWNER['policy']


def covers(rules=None) -> bool:
    """True when every rule of ``rules`` (default :data:`agentrl.checks.RULES`) has a columnar twin here."""
    return {r.name for r in (RULES if rules is None else rules)} <= COVERED_RULES


@dataclass
class TokenColumns:
    """The token fields of ``B`` rows whose lengths agree, as flat arrays.

    Attributes:
        starts: ``[B]`` int64, the first token of each row in ``ids``/``owner`` (``ends - starts = T >= 1``).
        ends: ``[B]`` int64.
        ids, owner: ``[N]`` int64, every row's tokens concatenated (N = sum of T).
        mask: ``[N - B]`` float64 ``action_mask`` (aligned to ``ids[1:]`` of each row), logp: ``[N - B]``
            float64 ``sample_logp``.
        reward: ``[B]`` float64 (NaN where not a number). prov: ``[B]`` bool, the row has provenance.
        declared: ``[B]`` bool, ``provenance.sampling`` is set or ``logp_placeholder`` is True.
        tokenizer, template: ``[B]`` object arrays of the provenance fingerprints (``''`` when unset).
    """
    starts: np.ndarray
    ends: np.ndarray
    ids: np.ndarray
    owner: np.ndarray
    mask: np.ndarray
    logp: np.ndarray
    reward: np.ndarray
    prov: np.ndarray
    declared: np.ndarray
    tokenizer: np.ndarray
    template: np.ndarray


def _per_row(bad: np.ndarray, row_of: np.ndarray, B: int) -> np.ndarray:
    """``[B]`` bool: the row holds a True of ``bad`` (``row_of`` gives each entry's row)."""
    return np.bincount(row_of[bad], minlength=B) > 0


def _trailing_padding(c: TokenColumns, exp: Expected, row_tok: np.ndarray, N: int) -> np.ndarray:
    """``[N]`` bool: the token is in its row's trailing run of non-policy ``exp.pad_id`` tokens."""
    if exp.pad_id is None:
        return np.zeros(N, dtype=bool)
    is_pad = (c.ids == exp.pad_id) & (c.owner != _POLICY)
    pos = np.arange(N)
    last_kept = np.maximum.reduceat(np.where(is_pad, -1, pos), c.starts)   # rows are non-empty
    return pos > last_kept[row_tok]


def screen(c: TokenColumns, exp: Expected, require_provenance: bool = True) -> np.ndarray:
    """``[B]`` bool: True where :func:`agentrl.checks.find_problems` (``expected=exp``) finds nothing.

    Each term is one rule of :data:`RULES` over all tokens at once (same comparisons in float64 as the
    reference); a row is accepted when no rule refuses it. Rows with chat-template info or
    ``turn_contexts`` must not be passed as accepted on this verdict (see the module docstring).

    Args:
        c: :class:`TokenColumns` of B rows. exp: the expectations of every row (group rows by
            :class:`Expected` and call once per group). require_provenance: as :func:`find_problems`.

    Returns:
        ``[B]`` bool numpy array.
    """
    B, N = len(c.starts), len(c.ids)
    T = c.ends - c.starts
    row_tok = np.repeat(np.arange(B), T)
    row_pos = np.repeat(np.arange(B), T - 1)
    first = np.zeros(N, dtype=bool)
    first[c.starts] = True
    last = np.zeros(N, dtype=bool)
    last[c.ends - 1] = True
    nxt, prev = ~first, ~last                      # token j+1 and token j of each mask position j
    bad_tok = (c.owner < 0) | (c.owner >= len(OWNER_NAMES)) | (c.ids < 0)
    if exp.vocab_size is not None:
        bad_tok |= c.ids >= exp.vocab_size
    bad = _per_row(bad_tok, row_tok, B) | (c.owner[c.starts] == _POLICY)
    policy = c.owner[nxt] == _POLICY
    mask, lp = c.mask, c.logp
    binary = (mask == 0) | (mask == 1)
    padding = _trailing_padding(c, exp, row_tok, N)[nxt]
    if exp.eot_ids:
        eot_untrained = (np.isin(c.ids[nxt], np.asarray(exp.eot_ids, dtype=np.int64)) & (c.owner[prev] == _POLICY)
                         & (mask == 0) & binary & ~padding)
    else:
        eot_untrained = np.zeros(len(mask), dtype=bool)
    with np.errstate(invalid='ignore'):
        bad_pos = (~binary | (padding & (mask == 1)) | eot_untrained | ((mask == 1) & ~policy & ~padding)
                   | ((mask == 0) & policy & ~eot_untrained)
                   | (policy & (np.isnan(lp) | np.isinf(lp) | (lp > POSITIVE_LOGP_TOL))))
    bad |= _per_row(bad_pos, row_pos, B)
    bad |= ~np.isfinite(c.reward)
    sampled = np.bincount(row_pos[policy], minlength=B) > 0
    if require_provenance or exp.tokenizer or exp.template:
        bad |= ~c.prov
    if require_provenance:
        bad |= c.prov & ~c.declared & (T >= 2) & sampled
    if exp.tokenizer:
        bad |= c.prov & (c.tokenizer != exp.tokenizer)
    if exp.template:
        bad |= c.prov & (c.template != exp.template)
    return ~bad
