"""L0: the trajectory record, its batch form, its provenance and its vocabulary (owners, stop reasons).

The record follows docs/design.md#ownership (the action mask is derived from the owners) and
docs/design.md#shift (:meth:`Trajectory.from_tokens` is where the shift happens).

Peer names: ``action_mask`` ~ verl ``response_mask`` ~ TRL ``completion_mask * tool_mask``;
``sample_logp`` ~ verl ``rollout_log_probs`` ~ TRL ``sampling_per_token_logps``.
"""
from __future__ import annotations

import enum
import json
import math
from array import array
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from itertools import groupby
from typing import Any, Iterator

from ._lazy import lazy_module

torch = lazy_module('torch')   # imported on first tensor use: `agentrl check` runs without torch

from ._version import __version__
from .constraints import Constraint

__all__ = ['OWNER', 'OWNER_NAMES', 'SamplingSpec', 'Provenance', 'Trajectory', 'Batch', 'LOGP_MODES',
           'PENALTY_SEMANTICS', 'StopReason', 'TokenLog', 'owner_runs', 'turn_spans', 'turn_records']

#: Owner code of each token. Source: book chapter 5.1 (template, prompt, policy, tool).
OWNER = {'template': 0, 'prompt': 1, 'policy': 2, 'tool': 3}
#: Owner names indexed by code.
OWNER_NAMES = tuple(sorted(OWNER, key=OWNER.get))


class StopReason(str, enum.Enum):
    """Why an episode ended (``info['stop']``); str-valued, so stored records keep their strings.

    Source: docs/design.md#stops; book chapter 4 (the gym's stops).
    """
    SUBMITTED = 'submitted'     #: the policy called ``submit``
    BUDGET = 'budget'           #: the turn budget ran out
    TRUNCATED = 'truncated'     #: a turn or the context was cut at its token limit
    UNKNOWN = 'unknown'         #: the record does not say

    def __str__(self) -> str:
        return self.value

    def __repr__(self) -> str:
        # printed inside lists and dicts (the book prints ``info['stop']`` values that way)
        return repr(self.value)


#: The log-prob modes (docs/design.md#sampling): ``processed`` (the distribution drawn from), ``raw`` (the
#: unmodified logits), ``scaled`` (penalties and temperature, no truncation: SGLang's default).
LOGP_MODES = ('processed', 'raw', 'scaled')
#: Which engine's penalty rules a :class:`SamplingSpec` follows (see its attributes).
PENALTY_SEMANTICS = ('transformers', 'vllm')


@dataclass(frozen=True)
class SamplingSpec:
    """The sampler a record's log-probabilities were drawn under.

    Attributes:
        temperature: softmax temperature (> 0; 0 means greedy, stored log-prob is then the
            argmax's log-prob at temperature 1).
        top_k: keep the k most likely tokens; 0 disables.
        top_p: nucleus mass in (0, 1]; 1.0 disables.
        min_p: drop tokens whose probability is below ``min_p * max_prob``; 0.0 disables.
        logp_mode: ``'processed'``, ``'raw'`` or ``'scaled'`` (see :data:`LOGP_MODES`); ``raw`` is the
            log-softmax of the model's logits before any penalty, temperature or truncation; ``scaled`` the
            log-softmax after the penalties and the temperature, over the whole vocabulary (no top-k / top-p /
            min-p renormalisation: SGLang's ``/generate`` log-probs); without truncation it equals ``processed``.
        repetition_penalty: > 0; 1.0 disables (CTRL, Keskar et al. 2019): over the turn's context and its
            tokens so far, as transformers' ``RepetitionPenaltyLogitsProcessor`` and vLLM's ``apply_penalties``.
        presence_penalty, frequency_penalty: in ``[-2, 2]``; 0.0 disables; over the turn's sampled tokens only
            (vLLM ``apply_penalties``, the OpenAI API definitions). Need ``penalty_semantics='vllm'``.
        penalty_semantics: ``'transformers'`` (repetition penalty only) or ``'vllm'`` (all three). The order
            (penalties on raw logits, then temperature, then truncation) is docs/design.md#sampling.
        constraint: the grammar over every policy turn (:class:`~agentrl.constraints.Constraint`) or None: docs/grammar.md.

    Raises:
        ValueError: a field out of range, naming the field and its allowed range.
    """
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0
    logp_mode: str = 'processed'
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    penalty_semantics: str = 'transformers'
    constraint: Constraint | None = None

    def __post_init__(self):
        if isinstance(self.constraint, dict):        # a stored row's form (Constraint.to_dict)
            object.__setattr__(self, 'constraint', Constraint.from_dict(self.constraint))
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
        if not (math.isfinite(self.repetition_penalty) and self.repetition_penalty > 0):
            raise ValueError(f'SamplingSpec.repetition_penalty must be a finite number > 0 (1 = off), '
                             f'got {self.repetition_penalty}')
        for name in ('presence_penalty', 'frequency_penalty'):
            v = getattr(self, name)
            if not -2.0 <= v <= 2.0:
                raise ValueError(f'SamplingSpec.{name} must be in [-2, 2] (0 = off), got {v}')
        if self.penalty_semantics not in PENALTY_SEMANTICS:
            raise ValueError(f'SamplingSpec.penalty_semantics must be one of {PENALTY_SEMANTICS}, '
                             f'got {self.penalty_semantics!r}')
        if self.penalty_semantics == 'transformers' and (self.presence_penalty or self.frequency_penalty):
            raise ValueError('SamplingSpec.presence_penalty / frequency_penalty need penalty_semantics=\'vllm\': '
                             'transformers\' generate has no presence or frequency penalty')

    @property
    def penalized(self) -> bool:
        """True when a repetition, presence or frequency penalty is on."""
        return self.repetition_penalty != 1.0 or self.presence_penalty != 0.0 or self.frequency_penalty != 0.0

    @property
    def truncated(self) -> bool:
        """True when top-k, top-p or min-p cuts the support (temperature > 0)."""
        return self.top_k > 0 or self.top_p < 1.0 or self.min_p > 0.0

    def to_dict(self) -> dict:
        """Plain-dict form (JSON-serialisable), the inverse of :meth:`from_dict`. The penalty fields and the constraint
        are left out at their defaults, so a record sampled without them keeps its bytes and digest."""
        d = {f.name: getattr(self, f.name) for f in fields(self)}    # every field but constraint is a scalar
        for name in _PENALTY_FIELDS:
            if d[name] == _PENALTY_DEFAULTS[name]:
                del d[name]
        return d if d.pop('constraint') is None else {**d, 'constraint': self.constraint.to_dict()}

    @classmethod
    def from_dict(cls, d: dict | None) -> 'SamplingSpec | None':
        """Rebuild from :meth:`to_dict` output; None gives None. Keys absent from ``d`` (records written before
        a field existed) take their defaults. Raises ValueError: an unknown key (naming it) or a value out of range."""
        if d is None:
            return None
        unknown = sorted(set(d) - {f.name for f in fields(cls)})
        if unknown:
            raise ValueError(f'SamplingSpec: unknown key(s) {unknown}; known: {[f.name for f in fields(cls)]}')
        return cls(**d)


_PENALTY_DEFAULTS = {'repetition_penalty': 1.0, 'presence_penalty': 0.0, 'frequency_penalty': 0.0,
                     'penalty_semantics': 'transformers'}
_PENALTY_FIELDS = tuple(_PENALTY_DEFAULTS)


def _version() -> str:
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
        group_id, rollout_id, attempt: identity (docs/design.md#integrity: retry vs resend).
        seed: the episode's own sampling seed, when it has one.
        agentrl_version: the library version that wrote the record.
        policy_version: the weights that sampled it, an int training step or a str checkpoint fingerprint;
            turn_policy_versions: one per turn (index = turn id) when turns had different weights. None:
            unknown, and left out of :meth:`to_dict` (older records keep their bytes). Else ValueError.
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
    policy_version: int | str | None = None
    turn_policy_versions: list | None = None

    def __post_init__(self):
        vs = self.turn_policy_versions = None if self.turn_policy_versions is None else list(self.turn_policy_versions)
        for v in [self.policy_version, *(vs or ())]:
            if v is not None and (isinstance(v, bool) or not isinstance(v, (int, str))):
                raise ValueError(f'Provenance: a policy version is an int step or a str fingerprint, got {v!r}')

    @property
    def spans_versions(self) -> bool:
        """True when its turns were sampled by more than one policy version (valid: asynchronous RL)."""
        return len(set(self.turn_policy_versions or ())) > 1

    def to_dict(self) -> dict:
        """Plain-dict form (JSON-serialisable), the inverse of :meth:`from_dict`."""
        d = {f.name: getattr(self, f.name) for f in fields(self)}    # scalars, and the spec below
        d['sampling'] = None if self.sampling is None else self.sampling.to_dict()
        return {k: v for k, v in d.items() if v is not None or k not in ('policy_version', 'turn_policy_versions')}

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
    """A new 1-D tensor with its own memory from a list (through ``array``: one C loop, about 2x faster than
    ``torch.tensor``) or a tensor."""
    if torch.is_tensor(values):
        return values.detach().to(dtype).clone()
    if len(values) and str(dtype) in _ARRAY_CODE:
        try:
            return torch.frombuffer(array(_ARRAY_CODE[str(dtype)], values), dtype=dtype).clone()
        except (TypeError, OverflowError):             # e.g. floats in an id list: let torch convert
            pass
    return torch.tensor(values, dtype=dtype)


_ARRAY_CODE = {'torch.int64': 'q', 'torch.float32': 'f'}   # by name: no torch import at load


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
        owner: ``[T]`` int64 :data:`OWNER` code of each token (required; None only for a row read from a
            file without the column).
        turn: ``[T]`` int64 turn index of each token, -1 for the prompt (required; None as ``owner``).
        provenance: :class:`Provenance`, or None for records built by hand.
        turn_contexts: optional per-turn scoring contexts (``[(start, context_ids [L_k])]``)
            for templates that are not prefix-stable; None means the sequence itself is the
            context of every turn.

    Positional order matches the book (``Trajectory(ids, action_mask, sample_logp, reward,
    info, owner, turn)``). Build records with :meth:`from_tokens` (docs/design.md#shift).
    """
    ids: torch.Tensor
    action_mask: torch.Tensor
    sample_logp: torch.Tensor
    reward: float
    info: dict
    owner: torch.Tensor | None
    turn: torch.Tensor | None
    provenance: Provenance | None = None
    turn_contexts: list | None = None

    @classmethod
    def from_tokens(cls, ids, owner, turn, logp, reward: float, info: dict,
                    provenance: Provenance | None = None, turn_contexts=None) -> 'Trajectory':
        """Freeze per-token lists into a record, shifting masks and log-probs to ``ids[1:]``.

        The shift to predicted positions happens here (docs/design.md#shift).

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
                   reward=float(reward), info=dict(info), owner=owner_t, turn=_fresh(turn, torch.long),
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
        want = {'action_mask': T - 1, 'sample_logp': T - 1, 'owner': T, 'turn': T}
        for name, n in want.items():
            if name in ('owner', 'turn') and getattr(self, name) is None:
                continue
            got = len(getattr(self, name))
            if got != n:
                aligned = 'ids[1:]' if n == T - 1 else 'ids'
                raise ValueError(f'Trajectory.{name} has length {got} but ids has length {T}: {name} '
                                 f'must be aligned to {aligned} (length {n}); build records with '
                                 'Trajectory.from_tokens')


_BATCH_FIELDS = ('ids', 'attention_mask', 'action_mask', 'sample_logp', 'turn_ids', 'rewards')


@dataclass(frozen=True, eq=False)
class Batch(Mapping):
    """Padded tensors of B trajectories, the input of every loss; frozen once built.

    Attributes:
        ids: ``[B, T]`` int64, right-padded with the pad id.
        attention_mask: ``[B, T]`` float32, 1.0 on real tokens.
        action_mask: ``[B, T-1]`` float32, aligned to ``ids[:, 1:]``; 0 on padding.
        sample_logp: ``[B, T-1]`` float32 nats; 0 on padding.
        turn_ids: ``[B, T-1]`` int64; -1 on prompt and padding.
        rewards: ``[B]`` float32.

    A :class:`collections.abc.Mapping` over these six names: ``batch['ids']``, ``batch.keys()``,
    ``batch.items()`` (in the order above, as lists, like the book's dict). Neither a field nor a key can be
    set or deleted after construction (``dataclasses.FrozenInstanceError``, ``TypeError``); build another
    batch with :func:`dataclasses.replace` or :meth:`to`. The tensors themselves are not copied.
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


class TokenLog:
    """The one token writer: ids, owner, turn and sampling log-prob of an episode, a span at a time.

    Every writer of a record (:class:`agentrl.rollouts.Episode`, :class:`agentrl.templates.ChatRecorder`)
    appends through :meth:`append` (docs/design.md#ownership), so the four per-token lists can never
    disagree in length; :meth:`freeze` hands them to :meth:`Trajectory.from_tokens` (docs/design.md#shift).

    Attributes:
        ids: ``[T]`` list of int token ids.
        owner: ``[T]`` list of int :data:`OWNER` codes.
        turn: ``[T]`` list of int turn indices (-1 for the prompt).
        logp: ``[T]`` list of float sampling log-probs (nats; 0.0 where not sampled).

    Example:
        >>> log = TokenLog()
        >>> log.append([1, 7], 'prompt', -1)
        >>> log.append([9, 4], 'policy', 0, [-0.5, -0.25])
        >>> log.owner, log.logp
        ([1, 1, 2, 2], [0.0, 0.0, -0.5, -0.25])

    Source: book chapter 5.6 ("one helper appends ids and owner together").
    """
    __slots__ = ('ids', 'owner', 'turn', 'logp')

    def __init__(self):
        self.ids, self.owner, self.turn, self.logp = [], [], [], []       # lists of int, int, int, float

    def __len__(self) -> int:
        return len(self.ids)

    def append(self, ids, owner, turn: int, logp=None) -> None:
        """Append one span: ``ids`` with their owner(s), turn and sampling log-probs, together.

        Args:
            ids: ``[n]`` token ids (list, tuple or 1-D tensor of int).
            owner: one owner for the whole span (a name of :data:`OWNER` or its int code), or
                ``[n]`` codes/names, one per id (a template bridge holding tool content).
            turn: the span's turn index (-1 for the prompt).
            logp: ``[n]`` float sampling log-probs (nats); None writes 0.0 (not sampled).

        Raises:
            ValueError: ``logp`` or a per-id ``owner`` list of another length than ``ids``, or an
                owner name outside :data:`OWNER`; the message names the field.
        """
        ids = ids.tolist() if hasattr(ids, 'tolist') else [int(i) for i in ids]
        n = len(ids)
        if isinstance(owner, (str, int)):
            code = OWNER.get(owner) if isinstance(owner, str) else int(owner)
            if code is None or code not in OWNER.values():
                raise ValueError(f'TokenLog.append: owner {owner!r} is not one of {list(OWNER)}')
            owners = [code] * n
        else:
            owners = [OWNER[o] if isinstance(o, str) else int(o) for o in owner]
            if len(owners) != n:
                raise ValueError(f'TokenLog.append: {len(owners)} owners for {n} ids; pass one owner per id '
                                 'or one owner for the span')
        if logp is None:
            lp = [0.0] * n
        else:
            lp = logp.tolist() if hasattr(logp, 'tolist') else [float(x) for x in logp]
            if len(lp) != n:
                raise ValueError(f'TokenLog.append: {len(lp)} log-probs for {n} ids; pass one per id')
        self.ids += ids
        self.owner += owners
        self.turn += [int(turn)] * n
        self.logp += lp

    def truncate(self, n: int) -> None:
        """Drop every token from position ``n`` on (undo the spans appended after length ``n``).

        Raises:
            ValueError: ``n`` outside ``[0, len(self)]``.
        """
        if not 0 <= n <= len(self.ids):
            raise ValueError(f'TokenLog.truncate: n={n} outside [0, {len(self.ids)}]')
        del self.ids[n:], self.owner[n:], self.turn[n:], self.logp[n:]

    def freeze(self, reward: float, info: dict, provenance: 'Provenance | None' = None,
               turn_contexts=None) -> Trajectory:
        """The record: :meth:`Trajectory.from_tokens` over the four lists (the one ``[1:]`` shift).

        Returns:
            Trajectory with ids/owner/turn ``[T]``, action_mask/sample_logp ``[T-1]``.

        Raises:
            ValueError: as :meth:`Trajectory.from_tokens` (empty log, policy-owned first token).
        """
        return Trajectory.from_tokens(self.ids, self.owner, self.turn, self.logp, reward, info,
                                      provenance=provenance, turn_contexts=turn_contexts)


def owner_runs(owner, group, code: int) -> list:
    """Maximal runs of tokens with owner ``code`` and one ``group`` value, as ``(group, start, end)``.

    The one "runs of policy tokens" helper: record turn spans, label spans and drift spans use it.

    Args:
        owner: ``[T]`` int owner codes (list or tensor).
        group: ``[T]`` int message or turn index of each token (list or tensor).
        code: the :data:`OWNER` code to collect.

    Returns:
        ``[(group, start, end)]`` token index ranges ``[start, end)`` in order.

    Example:
        >>> owner_runs([1, 2, 2, 0, 2], [-1, 0, 0, 0, 1], OWNER['policy'])
        [(0, 1, 3), (1, 4, 5)]
    """
    owner = owner.tolist() if hasattr(owner, 'tolist') else owner
    group = group.tolist() if hasattr(group, 'tolist') else group
    out, i = [], 0
    for (o, g), run in groupby(zip(owner, group)):
        n = sum(1 for _ in run)
        if o == code:
            out.append((g, i, i + n))
        i += n
    return out


def turn_spans(traj: Trajectory) -> list:
    """``[(turn, start, end)]``: token range of each turn's policy tokens in ``traj.ids``.

    A turn whose policy tokens form several runs spans from its first to its last policy token.

    Raises:
        ValueError: ``traj.owner`` or ``traj.turn`` is None (build records with ``Trajectory.from_tokens``).

    Source: book chapter 5.6 (``turn`` is -1 for the prompt, k for turn k and its observation).
    """
    if traj.owner is None or traj.turn is None:
        raise ValueError('turn_spans: traj.owner and traj.turn are needed; build records with '
                         'Trajectory.from_tokens or ChatRecorder')
    span: dict = {}
    for k, s, e in owner_runs(traj.owner, traj.turn, OWNER['policy']):
        span[k] = (span.get(k, (s, e))[0], e)
    return [(k, s, e) for k, (s, e) in sorted(span.items())]


def turn_records(traj: Trajectory) -> list:
    """Split a record into one record per turn, each scored in the context it was sampled in.

    Record ``k`` is ``context_k + policy ids of turn k``: the context from
    ``traj.turn_contexts`` (or ``ids[:start_k]`` when it is None), every context token
    prompt-owned (not scored), the turn's tokens with their owners and sampling log-probs.
    Summed over turns, the scored tokens are exactly the policy tokens of ``traj``.

    Args:
        traj: a :class:`Trajectory` with ``owner`` and ``turn``.

    Returns:
        list of :class:`Trajectory`, one per turn (in turn order), built with
        ``Trajectory.from_tokens``; ``info['turn']`` is the turn index; with
        ``provenance.turn_policy_versions`` each turn's ``policy_version`` is its own.

    Raises:
        ValueError: ``turn_contexts`` has another number of entries than the record has turns,
            or an entry whose start disagrees with the turn's first policy token.

    Source: book chapter 5.8 ("score turns against the context they were sampled in").
    """
    spans = turn_spans(traj)
    ctxs = traj.turn_contexts
    if ctxs is not None and len(ctxs) != len(spans):
        raise ValueError(f'traj.turn_contexts has {len(ctxs)} entries but the record has {len(spans)} turns '
                         'with policy tokens: give one (start, context_ids) per turn')
    logp = torch.cat([torch.zeros(1), traj.sample_logp.float()])  # aligned to ids
    out, vs = [], None if traj.provenance is None else traj.provenance.turn_policy_versions
    for n, (k, s, e) in enumerate(spans):
        if ctxs is None:
            ctx = traj.ids[:s]
        else:
            start, ctx = ctxs[n]
            if int(start) != s:
                raise ValueError(f'traj.turn_contexts[{n}] starts at {start} but turn {k} starts at token {s}')
            ctx = torch.as_tensor(ctx, dtype=torch.long)
        log = TokenLog()
        log.append(ctx, 'prompt', -1)
        log.append(traj.ids[s:e], traj.owner[s:e], k, logp[s:e])
        prov = traj.provenance if vs is None or k >= len(vs) else replace(traj.provenance, policy_version=vs[k],
                                                                          turn_policy_versions=None)
        out.append(log.freeze(traj.reward, {**traj.info, 'turn': k}, provenance=prov))
    return out
