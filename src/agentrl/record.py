"""L0: the trajectory record, its batch form and its provenance (torch only).

Ownership is provenance: a token's owner is fixed by whoever produced it when it was
appended, and the action mask is derived from it. The shift from token positions ``ids``
to predicted positions ``ids[1:]`` happens in exactly one place, :meth:`Trajectory.from_tokens`.

Peer names: ``action_mask`` ~ verl ``response_mask`` ~ TRL ``completion_mask * tool_mask``;
``sample_logp`` ~ verl ``rollout_log_probs`` ~ TRL ``sampling_per_token_logps``.
"""
from __future__ import annotations

import json
from array import array
from dataclasses import asdict, dataclass, field, fields
from typing import Any, Iterator

import torch

__all__ = ['OWNER', 'OWNER_NAMES', 'SamplingSpec', 'Provenance', 'Trajectory', 'Batch', 'LOGP_MODES']

#: Owner code of each token. Source: book chapter 5.1 (template, prompt, policy, tool).
OWNER = {'template': 0, 'prompt': 1, 'policy': 2, 'tool': 3}
#: Owner names indexed by code.
OWNER_NAMES = tuple(sorted(OWNER, key=OWNER.get))
#: ``processed``: log-prob under the distribution actually sampled from (after temperature and
#: truncation); ``raw``: log-softmax of the unmodified logits.
LOGP_MODES = ('processed', 'raw')


@dataclass(frozen=True)
class SamplingSpec:
    """The sampler a record's log-probabilities were drawn under.

    Attributes:
        temperature: softmax temperature (> 0; 0 means greedy, stored log-prob is then the
            argmax's log-prob at temperature 1).
        top_k: keep the k most likely tokens; 0 disables.
        top_p: nucleus mass in (0, 1]; 1.0 disables.
        min_p: drop tokens whose probability is below ``min_p * max_prob``; 0.0 disables.
        logp_mode: ``'processed'`` or ``'raw'`` (see :data:`LOGP_MODES`).

    Raises:
        ValueError: a field out of range, naming the field and its allowed range.
    """
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0
    logp_mode: str = 'processed'

    def __post_init__(self):
        if not self.temperature >= 0:
            raise ValueError(f'SamplingSpec.temperature must be >= 0, got {self.temperature}')
        if not (isinstance(self.top_k, int) and self.top_k >= 0):
            raise ValueError(f'SamplingSpec.top_k must be an int >= 0 (0 = off), got {self.top_k!r}')
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f'SamplingSpec.top_p must be in (0, 1] (1 = off), got {self.top_p}')
        if not 0.0 <= self.min_p < 1.0:
            raise ValueError(f'SamplingSpec.min_p must be in [0, 1) (0 = off), got {self.min_p}')
        if self.logp_mode not in LOGP_MODES:
            raise ValueError(f'SamplingSpec.logp_mode must be one of {LOGP_MODES}, got {self.logp_mode!r}')

    def to_dict(self) -> dict:
        """Plain-dict form (JSON-serialisable), the inverse of :meth:`from_dict`."""
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict | None) -> 'SamplingSpec | None':
        """Rebuild from :meth:`to_dict` output; None gives None."""
        return None if d is None else cls(**d)


def _version() -> str:
    from ._version import __version__
    return __version__


@dataclass
class Provenance:
    """What another process needs to trust a record: who made it, with what, and which attempt.

    Attributes:
        policy: the policy kind (``'model'``, ``'oracle'``, ``'hf'`` ...).
        tokenizer: tokenizer fingerprint (vocabulary, special ids, class), hex string.
        template: chat-template fingerprint (or the word-level tokenizer's), hex string.
        sampling: the :class:`SamplingSpec` the log-probs were drawn under; None when the
            record was not sampled (scripted demonstrations).
        model: model or checkpoint id ('' when none).
        logp_placeholder: True when ``sample_logp`` is a placeholder (scripted policies):
            such a record must never enter an importance ratio.
        group_id, rollout_id, attempt: identity; a retry that samples again is a new attempt,
            a resend keeps its identity.
        seed: the episode's own sampling seed, when it has one.
        agentrl_version: the library version that wrote the record.
    """
    policy: str = ''
    tokenizer: str = ''
    template: str = ''
    sampling: SamplingSpec | None = None
    model: str = ''
    logp_placeholder: bool = False
    group_id: str = ''
    rollout_id: str = ''
    attempt: int = 1
    seed: int | None = None
    agentrl_version: str = field(default_factory=_version)

    def to_dict(self) -> dict:
        """Plain-dict form (JSON-serialisable), the inverse of :meth:`from_dict`."""
        d = asdict(self)
        d['sampling'] = None if self.sampling is None else self.sampling.to_dict()
        return d

    @classmethod
    def from_dict(cls, d: dict | None) -> 'Provenance | None':
        """Rebuild from :meth:`to_dict` output; None gives None."""
        if d is None:
            return None
        d = dict(d)
        d['sampling'] = SamplingSpec.from_dict(d.get('sampling'))
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in known})

    def to_json(self) -> str:
        """Sorted-key JSON of :meth:`to_dict` (stored in Parquet)."""
        return json.dumps(self.to_dict(), sort_keys=True)


def _fresh(values, dtype: torch.dtype) -> torch.Tensor:
    """A new 1-D tensor with its own memory from a list or a tensor.

    Lists of plain numbers go through ``array`` (one C loop, then one copy into torch's memory:
    about 2x faster than ``torch.tensor`` on a list); anything else is converted by torch.
    """
    if torch.is_tensor(values):
        return values.detach().to(dtype).clone()
    if len(values) and dtype in _ARRAY_CODE:
        try:
            return torch.frombuffer(array(_ARRAY_CODE[dtype], values), dtype=dtype).clone()
        except (TypeError, OverflowError):             # e.g. floats in an id list: let torch convert
            pass
    return torch.tensor(values, dtype=dtype)


_ARRAY_CODE = {torch.long: 'q', torch.float32: 'f'}


@dataclass
class Trajectory:
    """One episode as the trainer sees it.

    Attributes:
        ids: ``[T]`` int64, every token of the episode in order.
        action_mask: ``[T-1]`` float32, 1.0 where ``ids[j+1]`` was sampled by the policy.
        sample_logp: ``[T-1]`` float32, natural-log probability with which ``ids[j+1]`` was
            sampled (0.0 on non-policy positions).
        reward: scalar episode reward.
        info: the environment's final info (``stop``, ``n_turns``, ``n_invalid`` ...) plus
            ``actions`` (decoded call texts).
        owner: ``[T]`` int64 :data:`OWNER` code of each token.
        turn: ``[T]`` int64 turn index of each token, -1 for the prompt.
        provenance: :class:`Provenance`, or None for records built by hand.
        turn_contexts: optional per-turn scoring contexts (``[(start, context_ids [L_k])]``)
            for templates that are not prefix-stable; None means the sequence itself is the
            context of every turn.

    Positional order matches the book (``Trajectory(ids, action_mask, sample_logp, reward,
    info, owner, turn)``). Build records with :meth:`from_tokens`, where the shift happens.
    """
    ids: torch.Tensor
    action_mask: torch.Tensor
    sample_logp: torch.Tensor
    reward: float
    info: dict
    owner: torch.Tensor = None
    turn: torch.Tensor = None
    provenance: Provenance | None = None
    turn_contexts: list | None = None

    @classmethod
    def from_tokens(cls, ids, owner, turn, logp, reward: float, info: dict,
                    provenance: Provenance | None = None, turn_contexts=None) -> 'Trajectory':
        """Freeze per-token lists into a record, shifting masks and log-probs to ``ids[1:]``.

        This is the only place in agentrl where the shift to predicted positions happens.

        Args:
            ids: ``[T]`` token ids (list or tensor), T >= 1.
            owner: ``[T]`` owner codes (ints of :data:`OWNER`) or owner names.
            turn: ``[T]`` turn index per token (-1 for the prompt).
            logp: ``[T]`` sampling log-prob of each token, aligned to ``ids`` (0.0 where not
                sampled). Entry 0 belongs to the first token, which is never predicted.
            reward: episode reward.
            info: final info dict (copied).

        Returns:
            Trajectory with ``action_mask[j] = (owner[j+1] == policy)`` and
            ``sample_logp[j] = logp[j+1]``.

        Raises:
            ValueError: when the per-token fields disagree in length, are empty, or the first
                token is policy-owned (nothing precedes it, so it cannot be scored).
        """
        owner = owner.tolist() if torch.is_tensor(owner) else owner
        if not set(map(type, owner)) <= {int}:                  # names (or numpy ints): to codes
            owner = [OWNER[o] if isinstance(o, str) else int(o) for o in owner]
        n = {'ids': len(ids), 'owner': len(owner), 'turn': len(turn), 'logp': len(logp)}
        if len(set(n.values())) != 1:
            raise ValueError(f'per-token fields disagree in length {n}: ids, owner, turn and logp '
                             'must each have one entry per token')
        if n['ids'] == 0:
            raise ValueError('ids is empty: a trajectory needs at least its first context token')
        if owner[0] == OWNER['policy']:
            raise ValueError('owner[0] is policy: the first token has no preceding position to score '
                             'it; start the sequence with a template or prompt token')
        owner_t = _fresh(owner, torch.long)
        return cls(ids=_fresh(ids, torch.long),
                   action_mask=(owner_t[1:] == OWNER['policy']).float(),
                   sample_logp=_fresh(logp[1:], torch.float32),
                   reward=float(reward), info=dict(info), owner=owner_t,
                   turn=_fresh(turn, torch.long),
                   provenance=provenance, turn_contexts=turn_contexts)

    def __len__(self) -> int:
        return len(self.ids)

    @property
    def turn_ids(self) -> torch.Tensor:
        """``[T-1]`` int64 turn index of each predicted token ``ids[1:]``."""
        return self.turn[1:]

    def check_shapes(self) -> None:
        """Raise ValueError if the fields disagree in length (names the field and the fix)."""
        T = len(self.ids)
        if T == 0:
            raise ValueError('Trajectory.ids is empty: a trajectory needs at least one token')
        want = {'action_mask': T - 1, 'sample_logp': T - 1}
        if self.owner is not None:
            want['owner'] = T
        if self.turn is not None:
            want['turn'] = T
        for name, n in want.items():
            got = len(getattr(self, name))
            if got != n:
                aligned = 'ids[1:]' if n == T - 1 else 'ids'
                raise ValueError(f'Trajectory.{name} has length {got} but ids has length {T}: {name} '
                                 f'must be aligned to {aligned} (length {n}); build records with '
                                 'Trajectory.from_tokens')


_BATCH_FIELDS = ('ids', 'attention_mask', 'action_mask', 'sample_logp', 'turn_ids', 'rewards')


@dataclass
class Batch:
    """Padded tensors of B trajectories, the input of every loss.

    Attributes:
        ids: ``[B, T]`` int64, right-padded with the pad id.
        attention_mask: ``[B, T]`` float32, 1.0 on real tokens.
        action_mask: ``[B, T-1]`` float32, aligned to ``ids[:, 1:]``; 0 on padding.
        sample_logp: ``[B, T-1]`` float32 nats; 0 on padding.
        turn_ids: ``[B, T-1]`` int64; -1 on prompt and padding.
        rewards: ``[B]`` float32.

    Also a read-only mapping: ``batch['ids']``, ``batch.keys()``, ``batch.items()`` (in the
    order above), as the book's dict.
    """
    ids: torch.Tensor
    attention_mask: torch.Tensor
    action_mask: torch.Tensor
    sample_logp: torch.Tensor
    turn_ids: torch.Tensor
    rewards: torch.Tensor

    def __getitem__(self, name: str) -> torch.Tensor:
        if name not in _BATCH_FIELDS:
            raise KeyError(f'{name!r} is not a Batch field; fields are {list(_BATCH_FIELDS)}')
        return getattr(self, name)

    def __iter__(self) -> Iterator[str]:
        return iter(_BATCH_FIELDS)

    def __len__(self) -> int:
        return len(_BATCH_FIELDS)

    def __contains__(self, name: Any) -> bool:
        return name in _BATCH_FIELDS

    def keys(self):
        """Field names in batch order: ids, attention_mask, action_mask, sample_logp, turn_ids, rewards."""
        return list(_BATCH_FIELDS)

    def values(self):
        """Field tensors in :meth:`keys` order."""
        return [getattr(self, k) for k in _BATCH_FIELDS]

    def items(self):
        """``(name, tensor)`` pairs in :meth:`keys` order, like the book's dict."""
        return [(k, getattr(self, k)) for k in _BATCH_FIELDS]

    def to(self, device) -> 'Batch':
        """Copy every tensor to ``device``."""
        return Batch(**{k: v.to(device) for k, v in self.items()})
