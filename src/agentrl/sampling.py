"""L1: the one sampler: seeds, processed log-probs, the draw and the token log-prob gather.

Every engine (TinyAgent, Hugging Face) and every replay (checks, trainer) uses this module, so a
record's ``sample_logp`` and its replay come from the same arithmetic.

The episode seed rule lives here too: one formula for every engine and every scale
(in process, one Ray worker, many), so ``--workers 0/1/2`` give the same records.
"""
from __future__ import annotations

import hashlib

__all__ = ['episode_seed']

_SEED_DOMAIN = b'agentrl/episode-seed/v1'


def episode_seed(run_seed: int, group_id: str, rollout_id: str) -> int:
    """The sampling seed of one episode, from the run seed and the episode's identity.

    A stable hash (blake2b, 8 bytes, top bit cleared), not Python's ``hash()``: the same on every
    machine, process and Python version, and independent of which worker runs the episode or
    which other episodes share its batch. The attempt is not part of it: a retry after a lost
    worker samples the episode the lost attempt would have sampled.

    Args:
        run_seed: the run's ``--seed``.
        group_id: the episode's group (``'{seed}/{policy}/{task}'`` for ``agentrl rollout``).
        rollout_id: the episode's rollout id.

    Returns:
        int in ``[0, 2**63)`` (fits the store's int64 ``seed`` column and ``torch.Generator``).

    Example:
        >>> episode_seed(0, '0/model/clamp', '0/model/clamp/0') == episode_seed(0, '0/model/clamp', '0/model/clamp/0')
        True
    """
    h = hashlib.blake2b(digest_size=8, person=b'agentrl-seed')
    for part in (_SEED_DOMAIN, str(int(run_seed)).encode(), group_id.encode(), rollout_id.encode()):
        h.update(len(part).to_bytes(8, 'big'))
        h.update(part)
    return int.from_bytes(h.digest(), 'big') >> 1
