"""L3: the replay's grammar hook: rebuild a record's declared constraint over its own ids, and name an undeclared one.

:func:`constrained_logits` masks the logits of each action row with the allowed tokens the declared
:class:`~agentrl.constraints.Constraint` gives after the turn's ids so far (a fresh grammar per turn), before the
declared sampler's own steps, as the engines sampled (docs/grammar.md). :func:`undeclared_constraint` names the
likely cause when a record declares no constraint but every mismatched token's stored log-prob is *above* its
replay (a smaller support than the full vocabulary).
"""
from __future__ import annotations

from .._lazy import lazy_module

torch = lazy_module('torch')

from ..constraints import ConstraintError, Grammar, GrammarRejection, mask_logits, support_sizes
from ..record import SamplingSpec
from .errors import ConstrainedSupportError

__all__ = ['constrained_logits', 'forced_positions', 'undeclared_constraint']

_GRAMMARS: dict = {}       # (constraint, id(tokenizer), V) -> Grammar


def _grammar(spec: SamplingSpec, tokenizer, vocab_size: int, key: str) -> Grammar:
    c = spec.constraint
    if tokenizer is None:
        raise ConstrainedSupportError(f'record {key} declares a {c.kind} constraint but the replay has no tokenizer to '
                                      'compile it against', field='provenance.sampling.constraint',
                                      fix='replay with a Hugging Face model folder that holds its tokenizer, or pass '
                                          'tokenizer= to replay_records')
    k = (c, id(tokenizer), int(vocab_size))
    if k not in _GRAMMARS:
        try:
            _GRAMMARS[k] = Grammar(c, tokenizer, vocab_size)
        except ConstraintError as e:
            raise ConstrainedSupportError(f'record {key}: {e}', field='provenance.sampling.constraint',
                                          fix='install the declared backend version, or drop the record from RL') \
                from None
    return _GRAMMARS[k]


def constrained_logits(spec: SamplingSpec, ids: torch.Tensor, rows: torch.Tensor, starts: torch.Tensor,
                       logits: torch.Tensor, tokenizer, key: str = ''):
    """The logits of a scored sequence's action rows under its declared constraint.

    Args:
        spec: the record's sampler (``spec.constraint`` None: the logits are returned as they are).
        ids: ``[L]`` int64 the scored sequence. rows: ``[n]`` int64 its action rows (row j predicts ``ids[j+1]``).
        starts: ``[n]`` int64 the first policy position of each row's turn (the grammar starts afresh there, or
            after the turn's reasoning with ``constraint.start_after``), or None (a record without owner / turn).
        logits: ``[n, V]`` float the rows' logits (masked in place when float32 / 16-bit).
        tokenizer: the ids' Hugging Face tokenizer. key: the record's label.

    Returns:
        ``(logits [n, V], support [n] int64 or None)``: ``-inf`` outside the allowed tokens; each row's number of
        allowed tokens (None without a constraint; ``V`` at a row before the grammar's start).

    Raises:
        ConstrainedSupportError: no tokenizer, a backend or version that is not installed, a text that does not
            compile, or a grammar that rejects the record's own id (naming its position and token).
    """
    if spec.constraint is None or not len(rows):
        return logits, None
    if starts is None:
        raise ConstrainedSupportError(f'record {key} declares a grammar constraint but has no owner / turn, so its '
                                      'turns (where the grammar starts) are unknown', field='turn',
                                      fix='build records with Trajectory.from_tokens or TokenLog')
    g = _grammar(spec, tokenizer, logits.shape[-1], key)
    parts, starts_l, rows_l = [], starts.tolist(), rows.tolist()
    i = 0
    while i < len(rows_l):                     # one grammar run per turn (rows of a turn share its start)
        j = i
        while j < len(rows_l) and starts_l[j] == starts_l[i]:
            j += 1
        try:
            parts.append(g.turn_bitmask(ids, starts_l[i], rows_l[i:j]))
        except GrammarRejection as e:
            raise ConstrainedSupportError(
                f'record {key}: the declared {spec.constraint.kind} constraint rejects token {e.token}, so its '
                'allowed-token support is unknown from there on', field='ids', position=e.position,
                fix='the record was not sampled under this constraint (or was edited): declare the constraint it was '
                    'sampled under (a server that applied it only after the reasoning: its start_after, '
                    'docs/grammar.md), or drop it from RL') from None
        i = j
    bm = torch.cat(parts)
    return mask_logits(logits, bm), support_sizes(bm, logits.shape[-1])


def forced_positions(support: torch.Tensor | None) -> torch.Tensor:
    """``[n]`` bool: rows whose allowed support holds exactly one token (they carry no policy gradient)."""
    if support is None:
        return torch.zeros(0, dtype=torch.bool)
    return support == 1


def undeclared_constraint(spec: SamplingSpec, log_ratio: torch.Tensor, unexplained: torch.Tensor,
                          stored: torch.Tensor) -> str:
    """Name an undeclared grammar when it is the likely cause of unexplained tokens, else ''.

    A grammar mask only removes tokens, so a record sampled under one and replayed without it stores a
    log-prob at least its replay at every token (ratio ``exp(replayed - stored) <= 1``), and exactly 0.0 where
    the grammar forced the token. Both must hold (at least one forced token): a peaked policy replayed by
    another model also stores more than it replays, but practically never exactly 0.0 in float32.

    Args:
        spec: the declared sampler (a declared constraint gives '').
        log_ratio: ``[N]`` float64 ``replayed - stored``. unexplained: ``[N]`` bool tokens no other kind explains.
        stored: ``[N]`` float64 stored log-probs.

    Returns:
        A one-line cause for the report's detail, or ''.
    """
    n = int(unexplained.sum())
    if spec.constraint is not None or n == 0 or bool((log_ratio[unexplained] >= 0).any()):
        return ''
    forced = int((stored[unexplained] == 0).sum())
    if not forced:
        return ''
    return (f'likely an undeclared grammar constraint (tool_choice, response_format, structured output): '
            f'{n} tokens stored above their replay, {forced} of them forced (log-prob 0.0); declare it in '
            'SamplingSpec.constraint (docs/grammar.md)')
