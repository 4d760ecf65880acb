"""L2: pad trajectories into one :class:`~agentrl.record.Batch` (book chapter 5.7)."""
from __future__ import annotations

from ._lazy import lazy_module

torch = lazy_module('torch')   # imported on first use (agentrl check runs without torch)
F = lazy_module('torch.nn.functional')

from .record import Batch, Trajectory

__all__ = ['pad_rows', 'collate']


def pad_rows(rows, length: int | None, value, side: str = 'right', *, dtype: torch.dtype | None = None) -> torch.Tensor:
    """Pad 1-D rows to a common length, on the right (records, trainer batches) or the left (prompts).

    Args:
        rows: sequence of 1-D tensors (same dtype), or of lists of Python numbers (one
            ``torch.tensor`` call: lists of ints give int64, of floats float32).
        length: target length, >= every row's length; None: the longest row's.
        value: padding value.
        side: ``'right'`` (row ``b`` at ``[b, :len]``) or ``'left'`` (at ``[b, length - len:]``, the
            layout of a batch of prompts that generate at the same last column).
        dtype: the result's dtype (default: the rows').

    Returns:
        ``[B, length]`` tensor.

    Raises:
        ValueError: no rows, a row that is not 1-D, a row longer than ``length``, or another ``side``.

    Example:
        >>> pad_rows([[1, 2], [3]], 3, 0, side='left').tolist()
        [[0, 1, 2], [0, 0, 3]]
    """
    if side not in ('right', 'left'):
        raise ValueError(f"pad_rows: side must be 'right' or 'left', got {side!r}")
    if len(rows) == 0:
        raise ValueError('pad_rows: no rows to pad; pass at least one 1-D tensor')
    lists = not isinstance(rows[0], torch.Tensor)
    if length is None:
        length = max(len(r) for r in rows)
    for i, r in enumerate(rows):
        if not lists and r.dim() != 1:
            raise ValueError(f'pad_rows: row {i} has shape {tuple(r.shape)}; rows must be 1-D')
        if len(r) > length:
            raise ValueError(f'pad_rows: row {i} has length {len(r)} > target length {length}')
    if lists:                                       # one tensor from padded lists (the rollouts' hot path)
        fill = [value]
        rows = [list(r) + fill * (length - len(r)) if side == 'right' else fill * (length - len(r)) + list(r)
                for r in rows]
        return torch.tensor(rows, dtype=dtype)
    out = torch.stack([F.pad(r, (0, length - len(r)) if side == 'right' else (length - len(r), 0), value=value)
                       for r in rows])
    return out if dtype is None else out.to(dtype)


def collate(trajs: list[Trajectory], pad_id: int, max_len: int | None = None) -> Batch:
    """Right-pad trajectories into batch tensors.

    Args:
        trajs: B trajectories (fields aligned as in :class:`~agentrl.record.Trajectory`).
        pad_id: id used to pad ``ids`` (``tok.pad_id``, 0 for TinyAgent).
        max_len: optional context limit; a trajectory longer than it raises.

    Returns:
        :class:`~agentrl.record.Batch` with ids ``[B, T]`` int64 (padded with ``pad_id``),
        attention_mask ``[B, T]`` float32, action_mask ``[B, T-1]`` float32 (0 on padding),
        sample_logp ``[B, T-1]`` float32 (0 on padding), turn_ids ``[B, T-1]`` int64 (-1 on
        padding), rewards ``[B]`` float32; T is the longest trajectory.

    Raises:
        ValueError: an empty list; a trajectory whose fields disagree in length (names the
            trajectory and the field); a trajectory longer than ``max_len``.

    Example: 4 oracle + 4 untrained BugFix rollouts -> ids (8, 76), action_mask (8, 75).
    """
    if len(trajs) == 0:
        raise ValueError('collate([]): no trajectories; pass at least one Trajectory')
    fast = _collate_fast(trajs, pad_id, max_len)
    return fast if fast is not None else _collate_reference(trajs, pad_id, max_len)


def _collate_reference(trajs, pad_id, max_len):
    """The book's collate (row by row, with every check and its message); the fast path's twin."""
    for i, t in enumerate(trajs):
        try:
            t.check_shapes()
        except ValueError as e:
            raise ValueError(f'collate: trajectory {i}: {e}') from None
        if t.turn is None:
            raise ValueError(f'collate: trajectory {i} has no turn field; build it with Trajectory.from_tokens')
        if max_len is not None and len(t.ids) > max_len:
            raise ValueError(f'collate: trajectory {i} ids has length {len(t.ids)} > max_len={max_len}; '
                             'truncate episodes in the rollout (Episode max_len) or raise max_len')
    T = max(len(t.ids) for t in trajs)
    return Batch(ids=pad_rows([t.ids.long() for t in trajs], T, pad_id),
                 attention_mask=pad_rows([torch.ones(len(t.ids)) for t in trajs], T, 0.0),
                 action_mask=pad_rows([t.action_mask.float() for t in trajs], T - 1, 0.0),
                 sample_logp=pad_rows([t.sample_logp.float() for t in trajs], T - 1, 0.0),
                 turn_ids=pad_rows([t.turn[1:].long() for t in trajs], T - 1, -1),
                 rewards=torch.tensor([float(t.reward) for t in trajs], dtype=torch.float32))


def _collate_fast(trajs, pad_id, max_len):
    """Vectorised collate: one concatenation and one indexed copy per field.

    Returns None when any trajectory is not plainly well formed (a field of the wrong length,
    dimension or dtype, a missing turn, too long, on another device): the reference path then
    builds the same batch or raises its exact error.
    """
    ids_l, am_l, lp_l, turn_l, lens = [], [], [], [], []
    long, f32 = torch.int64, torch.float32
    try:
        for t in trajs:
            ids, am, lp, turn, owner = t.ids, t.action_mask, t.sample_logp, t.turn, t.owner
            n = ids.shape[0]
            if (ids.dim() != 1 or am.shape != (n - 1,) or lp.shape != (n - 1,) or turn is None
                    or turn.shape != (n,) or (owner is not None and len(owner) != n) or n == 0
                    or ids.dtype != long or am.dtype != f32 or lp.dtype != f32 or turn.dtype != long
                    or ids.device.type != 'cpu'):
                return None
            ids_l.append(ids)
            am_l.append(am)
            lp_l.append(lp)
            turn_l.append(turn[1:])
            lens.append(n)
    except (AttributeError, IndexError, TypeError):
        return None
    T = max(lens)
    if max_len is not None and T > max_len:
        return None
    B = len(trajs)
    valid = torch.arange(T) < torch.tensor(lens)[:, None]                   # [B, T]
    at = valid.view(-1).nonzero().squeeze(1)
    at1 = valid[:, 1:].reshape(-1).nonzero().squeeze(1)                    # predicted positions

    def fill(rows, idx, width, value, dtype):
        out = torch.full((B * width,), value, dtype=dtype)
        return out.index_copy_(0, idx, torch.cat(rows)).view(B, width)

    return Batch(ids=fill(ids_l, at, T, pad_id, long),
                 attention_mask=valid.float(),
                 action_mask=fill(am_l, at1, T - 1, 0.0, f32),
                 sample_logp=fill(lp_l, at1, T - 1, 0.0, f32),
                 turn_ids=fill(turn_l, at1, T - 1, -1, long),
                 rewards=torch.tensor([float(t.reward) for t in trajs], dtype=torch.float32))
