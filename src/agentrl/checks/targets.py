"""L3: which prediction row scores which generated token.

Source: docs/design.md#shift, the standalone fixture; docs/design.md#integrity.
"""
from __future__ import annotations

__all__ = ['action_targets']


def action_targets(ids, generated) -> list[tuple[int, int]]:
    """Pair each generated token with the prediction row that scores it.

    Row ``i - 1`` sees positions ``0 .. i-1`` and predicts token ``ids[i]``, so a token generated
    at position ``i`` is scored by row ``i - 1``. Context tokens (prompt, tool output) stay in the
    input; they only produce no pair.

    Args:
        ids: ``[T]`` token ids (list of int, or anything with ``tolist()``).
        generated: ``[T]`` origin flags, Python ``bool`` each: True where the policy sampled
            the token.

    Returns:
        list of ``(prediction_row, target_id)`` in position order.

    Raises:
        ValueError: ``ids`` and ``generated`` differ in length (fix: one flag per token); a flag
            is not a ``bool`` (fix: pass True/False, not 0/1 or tensors); the first token is
            flagged generated (fix: start with a context token, nothing precedes position 0).

    Example:
        >>> action_targets([101, 102, 201, 202, 301, 302, 203],
        ...                [False, False, True, True, False, False, True])
        [(1, 201), (2, 202), (5, 203)]

    Source: docs/design.md#shift.
    """
    ids = ids.tolist() if hasattr(ids, 'tolist') else list(ids)
    generated = list(generated)
    if len(ids) != len(generated):
        raise ValueError(f'action_targets: {len(ids)} ids but {len(generated)} origin flags; '
                         'pass one flag per token')
    bad = [i for i, flag in enumerate(generated) if type(flag) is not bool]
    if bad:
        raise ValueError(f'action_targets: generated[{bad[0]}] is {generated[bad[0]]!r}, not a bool; origin '
                         'flags must be True/False')
    if generated and generated[0]:
        raise ValueError('action_targets: generated[0] is True, but a scored action needs a preceding '
                         'context position; start the sequence with a prompt or template token')
    return [(i - 1, ids[i]) for i, flag in enumerate(generated) if flag]
