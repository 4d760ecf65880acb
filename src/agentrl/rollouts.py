"""L2: episodes as token logs, and the rollouts that fill them (book chapter 5.6-5.7).

Token-in/token-out: the policy's sampled ids are appended as they were sampled (with their
log-probs), decoded only to hand text to ``env.step``; the observation is encoded once and
appended between ``<obs>`` and ``</obs>`` template tokens. Records are frozen through
:meth:`agentrl.record.Trajectory.from_tokens` (docs/design.md#shift).
"""
from __future__ import annotations

import copy
from dataclasses import dataclass, field

import torch

from .batching import pad_rows
from .model import fill_holes
from .record import Provenance, SamplingSpec, StopReason, TokenLog, Trajectory
from .sampling import sample

__all__ = ['MAX_CALL_TOKENS', 'Episode', 'make_trajectory', 'scripted_rollout', 'generate_call',
           'rollout', 'rollout_batch', 'RolloutBatchOptions', 'rollout_batch_options', 'model_provenance',
           'sampling_spec', 'supports_kv_cache']

#: A call longer than this many tokens is cut off and parsed as it is. Source: book chapter 5.6.
MAX_CALL_TOKENS = 6


class Episode:
    """Token log of one episode: sampled calls and encoded observations, appended in order.

    Args:
        env: a BugFix-style env (``reset(task) -> str``, ``step(text) -> (obs, reward, done, info)``,
            ``final_info(solved) -> dict``).
        task: the task passed to ``env.reset``.
        tok: the word-level :class:`~agentrl.tokenizer.Tokenizer`.
        max_turns: the rollout's turn limit (calls); reaching it before the env ends the episode
            stops it as ``truncated`` with reward 0.
        max_len: the model's context length; if the next observation plus a full call
            (``MAX_CALL_TOKENS``) would not fit, the episode stops as ``truncated``, reward 0.

    Attributes:
        log: the episode's :class:`~agentrl.record.TokenLog` (the one writer of its tokens).
        ids, owner, turn, logp: its per-token lists, read-only views (logp 0.0 where not sampled).
        observations: observation strings so far (the issue first); actions: decoded calls.
        done, reward, info: episode state after the last call.

    Source: book chapter 5.6 (``Episode``), truncation rule included.
    """

    def __init__(self, env, task, tok, max_turns: int = 6, max_len: int = 256):
        self.env, self.tok, self.max_turns, self.max_len = env, tok, max_turns, max_len
        self.log = TokenLog()
        self.observations, self.actions = [env.reset(task)], []
        self.done, self.reward, self.info = False, 0.0, None
        self.add([tok.bos_id], 'template', -1)
        self.add(tok.encode(self.observations[0], specials=False), 'prompt', -1)
        if len(self.ids) + MAX_CALL_TOKENS > max_len:
            raise ValueError(f'the prompt ({len(self.ids)} tokens) plus one call ({MAX_CALL_TOKENS}) does not '
                             f'fit max_len={max_len}; use a model with a larger max_len')

    ids = property(lambda self: self.log.ids, doc='``[T]`` token ids so far (the log\'s list).')
    owner = property(lambda self: self.log.owner, doc='``[T]`` owner codes so far.')
    turn = property(lambda self: self.log.turn, doc='``[T]`` turn index of each token (-1 for the prompt).')
    logp = property(lambda self: self.log.logp, doc='``[T]`` sampling log-probs (0.0 where not sampled).')

    def add(self, ids, owner: str, turn: int, logp=None) -> None:
        """Append ``ids`` owned by ``owner`` in ``turn`` (with their sampling log-probs, if any).

        Raises:
            ValueError: as :meth:`agentrl.record.TokenLog.append` (a ``logp`` of another length).
        """
        self.log.append(ids, owner, turn, logp)

    def act(self, call_ids, call_logp=None) -> bool:
        """Append one sampled call, step the env, append its observation; return ``done``.

        The observation after the final call is not appended (no action depends on it).
        """
        if self.done:
            raise ValueError('Episode.act after the episode ended; check episode.done before acting')
        k = len(self.actions)
        self.add(call_ids, 'policy', k, call_logp)
        self.actions.append(self.tok.decode(call_ids))
        obs, self.reward, self.done, self.info = self.env.step(self.actions[-1])
        obs_ids = self.tok.encode(obs, specials=False)
        no_room = len(self.ids) + 2 + len(obs_ids) + MAX_CALL_TOKENS > self.max_len
        if not self.done and (k + 1 >= self.max_turns or no_room):
            self.done, self.reward = True, 0.0
            self.info = dict(self.env.final_info(False), stop=StopReason.TRUNCATED)
        if not self.done:                   # <obs> observation </obs>: template, tool, template
            self.observations.append(obs)
            self.add([self.tok.obs_id], 'template', k)
            self.add(obs_ids, 'tool', k)
            self.add([self.tok.obs_end_id], 'template', k)
        return self.done


def make_trajectory(episode: Episode, provenance: Provenance | None = None) -> Trajectory:
    """Freeze an :class:`Episode` into a :class:`~agentrl.record.Trajectory`.

    Returns:
        Trajectory with ids ``[T]``, action_mask and sample_logp ``[T-1]`` aligned to ``ids[1:]``
        (via ``Trajectory.from_tokens``), owner and turn ``[T]``, ``info`` = final info plus
        ``actions`` (the decoded calls).
    """
    info = dict(episode.info or {}, actions=list(episode.actions))
    return episode.log.freeze(episode.reward, info, provenance=provenance)


def _scripted_provenance(policy, tok) -> Provenance:
    return Provenance(policy=getattr(policy, 'kind', 'scripted'), tokenizer=tok.fingerprint,
                      template=tok.template_fingerprint(), sampling=None, logp_placeholder=True)


def sampling_spec(temperature: float = 1.0, spec: SamplingSpec | None = None, who: str = 'rollout') -> SamplingSpec:
    """The :class:`~agentrl.record.SamplingSpec` of a TinyAgent rollout, from ``temperature`` or ``spec``.

    Args:
        temperature: the book's argument (``<= 0`` greedy), used when ``spec`` is None.
        spec: a full sampler (temperature, top-k, top-p, min-p, ``logp_mode``).
        who: the public name that raises (for the message).

    Returns:
        the spec the rollout samples under and records.

    Raises:
        ValueError: both a non-default ``temperature`` and a ``spec`` whose temperature differs
            (pass one of them), or a spec with penalties (repetition / presence / frequency
            penalties are applied by the Hugging Face engine, ``agentrl.engines.hf``; TinyAgent
            rollouts refuse them rather than record a sampler they did not use).
    """
    if spec is None:
        return SamplingSpec(temperature=max(float(temperature), 0.0))
    if not isinstance(spec, SamplingSpec):
        raise ValueError(f'{who}: spec must be an agentrl.record.SamplingSpec, got {type(spec).__name__}')
    if float(temperature) != 1.0 and float(temperature) != spec.temperature:
        raise ValueError(f'{who}: temperature={temperature} disagrees with spec.temperature={spec.temperature}; '
                         'pass the temperature inside spec only')
    if spec.penalized:
        raise ValueError(f'{who}: spec has repetition/presence/frequency penalties, which TinyAgent rollouts do not '
                         'apply; sample with the Hugging Face engine (agentrl.engines.hf) or drop the penalties')
    return spec


@dataclass(frozen=True)
class RolloutBatchOptions:
    """How :func:`rollout_batch` samples and records (all but the model, the envs, the tasks and the random streams).

    Attributes:
        max_turns: call budget per episode, >= 1.
        spec: the sampler (:class:`~agentrl.record.SamplingSpec`: temperature, top-k, top-p, min-p,
            ``logp_mode``); every record's provenance carries it. No penalties (they are applied by the
            Hugging Face engine, ``agentrl.engines.hf``). Default: temperature 1.0, nothing else.
        cache: use the incremental KV cache when the model supports it (:func:`supports_kv_cache`).
        max_active: at most this many episodes live at once (>= 1; continuous batching), or None: all
            episodes are reset up front and live from the first step (the book's behaviour).
        policy_version: every record's ``provenance.policy_version`` (the training step or checkpoint
            fingerprint of the model's weights); None records none.

    Raises:
        ValueError: a field out of its range, one line naming the field and the fix.
    """
    max_turns: int = 6
    spec: SamplingSpec = field(default_factory=SamplingSpec)
    cache: bool = True
    max_active: int | None = None
    policy_version: int | str | None = None

    def __post_init__(self):
        if isinstance(self.max_turns, bool) or not isinstance(self.max_turns, int) or self.max_turns < 1:
            raise ValueError(f'RolloutBatchOptions.max_turns = {self.max_turns!r}: must be an int >= 1; pass the call '
                             'budget per episode, e.g. 6')
        if not isinstance(self.spec, SamplingSpec):
            raise ValueError(f'RolloutBatchOptions.spec: must be an agentrl.record.SamplingSpec, got '
                             f'{type(self.spec).__name__}; pass SamplingSpec(temperature=...)')
        if self.spec.penalized:
            raise ValueError('RolloutBatchOptions.spec: has repetition/presence/frequency penalties, which TinyAgent '
                             'rollouts do not apply; sample with the Hugging Face engine (agentrl.engines.hf) or '
                             'drop the penalties')
        if self.max_active is not None and (isinstance(self.max_active, bool) or not isinstance(self.max_active, int)
                                            or self.max_active < 1):
            raise ValueError(f'RolloutBatchOptions.max_active = {self.max_active!r}: must be None or an int >= 1; '
                             'pass None to run every episode at once')


def rollout_batch_options(options: RolloutBatchOptions | None = None, max_turns: int | None = None,
                          temperature: float | None = None, who: str = 'rollout_batch') -> RolloutBatchOptions:
    """The options of a call that may use the book's keywords (``max_turns``, ``temperature``) instead.

    The one place the book's ``rollout_batch(model, envs, tasks, tok, max_turns=6, temperature=1.0,
    generator=None)`` becomes a :class:`RolloutBatchOptions`.

    Args:
        options: the caller's options, or None.
        max_turns: the book's call budget (None: 6, or ``options.max_turns``).
        temperature: the book's temperature (``<= 0`` greedy; None: 1.0, or ``options.spec``).
        who: the public name that raises (for the message).

    Returns:
        ``options`` unchanged when given, else ``RolloutBatchOptions(max_turns, SamplingSpec(temperature))``.

    Raises:
        ValueError: ``options`` together with ``max_turns`` or ``temperature`` (pass them inside
            ``options``), or ``options`` that is not a :class:`RolloutBatchOptions`.
    """
    if options is None:
        return RolloutBatchOptions(max_turns=6 if max_turns is None else max_turns,
                                   spec=sampling_spec(1.0 if temperature is None else temperature, None, who))
    if not isinstance(options, RolloutBatchOptions):
        raise ValueError(f'{who}: options must be an agentrl.RolloutBatchOptions, got {type(options).__name__}')
    given = [n for n, v in (('max_turns', max_turns), ('temperature', temperature)) if v is not None]
    if given:
        raise ValueError(f'{who}: {" and ".join(given)} given beside options; pass them inside options '
                         '(RolloutBatchOptions(max_turns=..., spec=SamplingSpec(temperature=...)))')
    return options


def model_provenance(model, tok, temperature: float | SamplingSpec, model_id: str = '',
                     policy_version: int | str | None = None) -> Provenance:
    """Provenance of a TinyAgent rollout: fingerprints, the sampler (a temperature or a
    :class:`~agentrl.record.SamplingSpec`), the model id, the ``policy_version`` (int step or str
    checkpoint fingerprint; None: not recorded)."""
    spec = temperature if isinstance(temperature, SamplingSpec) else SamplingSpec(temperature=max(float(temperature), 0.0))
    return Provenance(policy='model', tokenizer=tok.fingerprint, template=tok.template_fingerprint(),
                      sampling=spec, model=model_id or type(model).__name__, policy_version=policy_version)


def scripted_rollout(policy, env, task, tok, max_turns: int = 6, max_len: int = 256) -> Trajectory:
    """Run a text policy (``policy(observations) -> call text``) through the same token path.

    ``sample_logp`` is a placeholder 0.0 (the policy is not a model): the record's provenance
    says ``logp_placeholder=True`` and it must never enter an importance ratio.
    Source: book chapter 5.6.
    """
    episode = Episode(env, task, tok, max_turns, max_len)
    while not episode.done:
        episode.act(tok.encode(policy(episode.observations)))
    return make_trajectory(episode, _scripted_provenance(policy, tok))


def supports_kv_cache(model) -> bool:
    """Whether rollouts can drive ``model`` with an incremental KV cache.

    Detection is duck-typed: the model must have callable ``new_cache(batch)`` and
    ``extend(cache, ids, n_new)`` methods (the interface of :class:`~agentrl.model.TinyAgent`,
    see :meth:`~agentrl.model.TinyAgent.extend`). A subclass that overrides ``forward`` but not
    ``extend`` does not count (its own ``forward`` could compute something else), and neither
    does any plain ``nn.Module`` mapping ids to logits: those are rolled out KV-free.

    Returns:
        True when the cached path will be used for ``cache=True``.
    """
    if not (callable(getattr(model, 'new_cache', None)) and callable(getattr(model, 'extend', None))):
        return False
    mro = type(model).__mro__
    def defined_at(name: str) -> int:      # MRO depth of the class that defines ``name``
        return next((i for i, c in enumerate(mro) if name in vars(c)), len(mro))
    return defined_at('extend') <= defined_at('forward')


def _generate_call_kv_free(model, ids, tok, spec, generator):
    call_ids, call_logp = [], []
    with torch.no_grad():
        for _ in range(MAX_CALL_TOKENS):
            logits = model(torch.tensor([list(ids) + call_ids]))[:, -1]
            next_id, logp = sample(logits, spec, generator=generator, caller='sample_next')
            call_ids.append(int(next_id))
            call_logp.append(float(logp))
            if call_ids[-1] == tok.call_end_id:
                break
    return call_ids, call_logp


def generate_call(model, ids, tok, temperature: float = 1.0, generator=None, cache=True, *, spec=None):
    """Sample one call after the prefix ``ids``, with a KV cache or the KV-free loop (book 3.5).

    Both paths draw with the same :func:`agentrl.sampling.sample` calls, so for the same generator
    they sample the same ids with the same log-probs (to fp32 rounding, about 1e-6).

    Args:
        model: ids ``[1, T]`` -> logits ``[1, T, V]``; the cache is used only when
            :func:`supports_kv_cache` says so (TinyAgent), otherwise this falls back to KV-free.
        ids: the prefix, a non-empty list of int.
        tok: tokenizer (``call_end_id`` stops the call).
        temperature: sampling temperature (``<= 0`` greedy).
        generator: optional ``torch.Generator``.
        spec: instead of ``temperature``, a full :class:`~agentrl.record.SamplingSpec` (top-k,
            top-p, min-p, ``logp_mode``; see :func:`sampling_spec`).
        cache: ``True`` (a fresh cache, prefill the whole prefix), ``False`` (KV-free reference
            loop, the book's), or a one-row :class:`~agentrl.model.KVCache` from an earlier call of
            the same episode: only the ids it does not hold yet are prefilled and the cache is
            updated in place (it then holds ``ids`` plus the call minus its last token).

    Returns:
        ``(call_ids, call_logp)``: lists of at most ``MAX_CALL_TOKENS`` ints and floats (nats,
        under the distribution sampled from); the stop token ``</call>`` is kept.

    Raises:
        ValueError: a cache object that is not a one-row cache holding a strict prefix of ``ids``
            (pass the cache of this episode, or ``cache=True``); see :func:`sampling_spec`.
    """
    spec = sampling_spec(temperature, spec, 'generate_call')
    if cache is False or cache is None or not supports_kv_cache(model):
        return _generate_call_kv_free(model, ids, tok, spec, generator)
    ids = list(ids)
    if cache is True:
        kv = model.new_cache(1)
        kv.tokens = []
    else:
        kv = cache
        held = kv.tokens if kv.tokens is not None else []
        if (kv.batch_size != 1 or int(kv.lengths[0]) != len(held) or len(held) >= len(ids)
                or ids[:len(held)] != held):
            raise ValueError('generate_call: the cache does not hold a strict prefix of ids; pass the '
                             "cache of this episode's previous calls, or cache=True for a fresh one")
        kv.tokens = held
    feed = ids[len(kv.tokens):]
    call_ids, call_logp = [], []
    with torch.no_grad():
        for _ in range(MAX_CALL_TOKENS):
            logits = model.extend(kv, torch.tensor([feed]))
            next_id, logp = sample(logits, spec, generator=generator, caller='sample_next')
            kv.tokens.extend(feed)
            feed = [int(next_id)]
            call_ids.append(feed[0])
            call_logp.append(float(logp))
            if feed[0] == tok.call_end_id:
                break
    return call_ids, call_logp


def rollout(model, env, task, tok, max_turns: int = 6, temperature: float = 1.0, generator=None,
            cache: bool = True, *, spec: SamplingSpec | None = None,
            policy_version: int | str | None = None) -> Trajectory:
    """Sample one episode token-in/token-out.

    Args:
        model: ids ``[1, T]`` -> logits ``[1, T, V]`` (TinyAgent or any such module).
        env, task: a BugFix-style env and the task it resets to.
        tok: the word-level tokenizer.
        max_turns: call budget. temperature: sampling temperature. generator: ``torch.Generator``.
        cache: keep one KV cache for the episode (observations are prefilled once, between
            calls); falls back to KV-free when :func:`supports_kv_cache` is False. ``False``
            is the book's KV-free loop. Both give the same episode for the same generator.
        spec: instead of ``temperature``, a full :class:`~agentrl.record.SamplingSpec` (top-k,
            top-p, min-p, ``logp_mode``); the record's provenance carries it.
        policy_version: ``provenance.policy_version`` of the record (the training step or checkpoint
            fingerprint of ``model``'s weights); None (default) records none.

    Returns:
        Trajectory (ids ``[T]``, action_mask / sample_logp ``[T-1]``, reward, info, owner, turn,
        provenance with the sampler). ``T <= model.max_len`` (default 256).

    Raises:
        ValueError: see :func:`sampling_spec`.
    """
    spec = sampling_spec(temperature, spec, 'rollout')
    episode = Episode(env, task, tok, max_turns, getattr(model, 'max_len', 256))
    kv = model.new_cache(1) if cache and supports_kv_cache(model) else False   # one cache per episode
    while not episode.done:
        episode.act(*generate_call(model, episode.ids, tok, generator=generator, cache=kv, spec=spec))
    return make_trajectory(episode, model_provenance(model, tok, spec, policy_version=policy_version))


def rollout_batch(model, envs, tasks, tok, max_turns: int | None = None, temperature: float | None = None,
                  generator=None, *, options: RolloutBatchOptions | None = None, generators=None,
                  identities=None) -> list[Trajectory]:
    """Sample ``len(tasks)`` episodes in lockstep: one ``sample_next`` call per token step.

    With ``options.cache`` (and a model that :func:`supports_kv_cache`) each step feeds only the
    tokens a row has not seen (its last sampled token, or the call's last token plus the new
    observation) into a ragged :class:`~agentrl.model.KVCache`; rows leave the cache when their
    episodes end, so its memory follows the live rows and the longest of them. Without it (the
    book's KV-free reference) every step recomputes the right-padded prefixes (harmless under
    causal attention). Both paths make the same ``sample_next`` calls over the same live rows in
    the same order, so for the same generator they return the same episodes (same ids; log-probs
    equal to fp32 rounding, about 1e-6) and leave the generator in the same state. The random
    stream is consumed in a different order than sequential :func:`rollout`. With
    ``options.max_active`` at most that many episodes are live (continuous batching: when episodes
    end, the next ones in task order join at the next step, each env reset when it joins); this
    bounds memory (the KV cache holds about 1 KB per token of each live row for TinyAgent) at some
    cost in throughput.

    Args:
        model: ids ``[B, T]`` -> logits ``[B, T, V]`` (TinyAgent or any such module).
        envs, tasks: one env and one task per episode (equal lengths).
        tok: the word-level tokenizer.
        max_turns, temperature: the book's keywords (call budget, default 6; sampling temperature,
            default 1.0, ``<= 0`` greedy); give them or ``options``, not both (:func:`rollout_batch_options`).
        generator: ``torch.Generator`` shared by all episodes.
        options: the sampler, call budget, cache, live-row bound and policy version
            (:class:`RolloutBatchOptions`); None: the book's defaults.
        generators: optional list with one ``torch.Generator`` per episode (instead of
            ``generator``): each row then draws its uniform from its own stream
            (``sample_next(..., generators=...)``), so an episode's draws do not depend on which
            other episodes share its batch (the same episode as ``rollout(...,
            generator=generators[b])``, up to fp32 rounding of batched logits). Scale-out uses it
            for results identical at any number of workers. A little slower than one shared
            generator (one small draw per row and token).
        identities: optional ``(group_id, rollout_id)`` per task, written into each record's
            provenance (the identity GRPO groups are read from, :func:`agentrl.train.group_index`).

    Returns:
        list of Trajectory in task order.

    Raises:
        ValueError: ``envs`` and ``tasks`` differ in length, both ``generator`` and ``generators``
            given, ``generators`` or ``identities`` of the wrong length, or a prompt plus one call does
            not fit the model's ``max_len`` (from :class:`Episode`); see :func:`rollout_batch_options`.
    """
    opts = rollout_batch_options(options, max_turns, temperature, 'rollout_batch')
    if len(envs) != len(tasks):
        raise ValueError(f'rollout_batch: {len(envs)} envs for {len(tasks)} tasks; pass one env per task')
    if generators is not None:
        if generator is not None:
            raise ValueError('rollout_batch: pass generator (one shared stream) or generators (one per '
                             'episode), not both')
        if len(generators) != len(tasks):
            raise ValueError(f'rollout_batch: {len(generators)} generators for {len(tasks)} tasks; pass one '
                             'torch.Generator per episode')
        generator = _PerRow(generators)
    if identities is not None and len(identities) != len(tasks):
        raise ValueError(f'rollout_batch: {len(identities)} identities for {len(tasks)} tasks; pass one '
                         '(group_id, rollout_id) per task')
    sched = _Schedule(envs, tasks, tok, opts.max_turns, getattr(model, 'max_len', 256), opts.max_active,
                      model_provenance(model, tok, opts.spec, policy_version=opts.policy_version), identities)
    with torch.no_grad():
        if opts.cache and supports_kv_cache(model):
            _drive_cached(model, sched, tok, opts.spec, generator)
        else:
            _drive_kv_free(model, sched, tok, opts.spec, generator)
    return sched.trajs


class _PerRow:
    """One generator per episode; the drivers pass the live episode indices with each draw."""

    def __init__(self, generators):
        self.generators = list(generators)


def _draw(logits, spec, generator, active):
    """:func:`agentrl.sampling.sample` over the live rows: one shared generator, or each episode's own."""
    if not isinstance(generator, _PerRow):
        return sample(logits, spec, generator=generator, caller='sample_next')
    return sample(logits, spec, generators=[generator.generators[b] for b in active], caller='sample_next')


class _Schedule:
    """Which episodes are live: all from the start, or at most ``max_active`` joining in order.

    Finished episodes are frozen into trajectories at once and their token lists released.
    """

    def __init__(self, envs, tasks, tok, max_turns, max_len, max_active, prov, identities=None):
        self.envs, self.tasks, self.args, self.prov = envs, tasks, (tok, max_turns, max_len), prov
        self.identities = identities
        self.limit = len(tasks) if max_active is None else max_active
        self.episodes, self.next = {}, 0
        self.trajs = [None] * len(tasks)
        if max_active is None:                       # the book: every env is reset up front
            for b in range(len(tasks)):
                self.episodes[b] = Episode(envs[b], tasks[b], *self.args)

    def join(self, n_live: int) -> list[int]:
        """Start episodes (in task order) while fewer than ``limit`` are live; return their indices."""
        new = []
        while n_live + len(new) < self.limit and self.next < len(self.tasks):
            b = self.next
            if b not in self.episodes:
                self.episodes[b] = Episode(self.envs[b], self.tasks[b], *self.args)
            new.append(b)
            self.next += 1
        return new

    def finish(self, b: int) -> None:
        """Freeze episode ``b`` into its trajectory and drop the episode."""
        prov = copy.copy(self.prov)
        if self.identities is not None:
            prov.group_id, prov.rollout_id = (str(x) for x in self.identities[b])
        self.trajs[b] = make_trajectory(self.episodes.pop(b), prov)


def _add_token(calls, b, i, lp, end_id):
    """Append a sampled token to episode ``b``'s open call; return ``(ids, logp)`` once it is complete."""
    call_ids, call_logp = calls[b]
    call_ids.append(i)
    call_logp.append(lp)
    if i == end_id or len(call_ids) == MAX_CALL_TOKENS:
        calls[b] = ([], [])
        return call_ids, call_logp
    return None


def _drive_kv_free(model, sched, tok, spec, generator) -> None:
    """The book's lockstep loop: recompute every live prefix each token step.

    Rows of ended episodes are removed with :func:`~agentrl.model.fill_holes` (the last live rows
    move into the holes), the row order :func:`_drive_cached` keeps its cache in, so both paths
    draw for the same episodes in the same order.
    """
    episodes, end_id = sched.episodes, tok.call_end_id
    active = sched.join(0)
    calls = {b: ([], []) for b in active}
    while active:
        rows = [episodes[b].ids + calls[b][0] for b in active]
        last = torch.tensor([len(r) - 1 for r in rows])
        logits = model(pad_rows(rows, None, tok.pad_id, dtype=torch.long))[torch.arange(len(rows)), last]
        next_ids, logps = _draw(logits, spec, generator, active)
        dead = []
        for r, (b, i, lp) in enumerate(zip(active, next_ids.tolist(), logps.tolist())):
            call = _add_token(calls, b, i, lp, end_id)
            if call is not None and episodes[b].act(*call):
                sched.finish(b)
                dead.append(r)
        if dead:
            active = [active[o] for o in fill_holes(len(active), dead)]
        joined = sched.join(len(active))
        calls.update((b, ([], [])) for b in joined)
        active = active + joined


def _drive_cached(model, sched, tok, spec, generator) -> None:
    """Lockstep loop over a ragged KV cache: the same sampling as :func:`_drive_kv_free`.

    Cache row r belongs to episode ``active[r]``. A row whose open call goes on is fed its last
    sampled token (``next_ids[r]``); ``pending[r]`` holds the tokens of a row that needs more
    (its whole prompt at first, or after a call the call's last token plus the observation).
    Each step feeds them in one ragged :meth:`~agentrl.model.TinyAgent.extend` call and samples
    once for all rows; the open calls live in ``[A, MAX_CALL_TOKENS]`` tensors, so Python touches
    only the rows whose call ended. Rows of ended episodes are dropped
    (:meth:`~agentrl.model.KVCache.drop`: the last rows move into the holes) and the rows of
    episodes that join are appended.
    """
    episodes, end_id, pad = sched.episodes, tok.call_end_id, tok.pad_id
    active = sched.join(0)
    kv = model.new_cache(len(active))
    pending = {r: episodes[b].ids for r, b in enumerate(active)}
    call_ids = torch.zeros(len(active), MAX_CALL_TOKENS, dtype=torch.long)
    call_lp = torch.zeros(len(active), MAX_CALL_TOKENS)
    call_len = torch.zeros(len(active), dtype=torch.long)
    next_ids = torch.full((len(active),), pad, dtype=torch.long)
    while active:
        if pending:
            rows = torch.tensor(list(pending))
            fed = pad_rows(list(pending.values()), None, pad, dtype=torch.long)     # [P, t]
            ids = next_ids[:, None].repeat(1, fed.shape[1])
            ids[rows] = fed
            n_new = torch.ones(len(active), dtype=torch.long)
            n_new[rows] = torch.tensor([len(p) for p in pending.values()])
        else:
            ids, n_new = next_ids[:, None], None                  # pure decode step: the sampled ids
        logits = model.extend(kv, ids, n_new)                     # [A, V] after each row's last token
        next_ids, logps = _draw(logits, spec, generator, active)
        call_ids.scatter_(1, call_len[:, None], next_ids[:, None])
        call_lp.scatter_(1, call_len[:, None], logps[:, None])
        call_len += 1
        ended = ((next_ids == end_id) | (call_len == MAX_CALL_TOKENS)).nonzero().squeeze(1)
        pending, dead = {}, []
        if len(ended):
            lens = call_len[ended].tolist()
            for r, n, ci, cl in zip(ended.tolist(), lens, call_ids[ended].tolist(), call_lp[ended].tolist()):
                b = active[r]
                episode = episodes[b]
                start = len(episode.ids) + n - 1                   # tokens the cache holds
                if episode.act(ci[:n], cl[:n]):
                    sched.finish(b)
                    dead.append(r)
                else:
                    pending[r] = episode.ids[start:]
            call_len[ended] = 0
        joined = sched.join(len(active) - len(dead))
        if joined:                          # one compacting copy: survivors in fill_holes order + new rows
            order = fill_holes(len(active), dead)
            kv.keep(order, extra=len(joined))
        elif dead:                          # in place: only the rows that move are copied
            order = kv.drop(dead)
        if dead:
            active = [active[o] for o in order]
            pending = {r: pending[o] for r, o in enumerate(order) if o in pending}
            idx = torch.tensor(order, dtype=torch.long)
            next_ids, call_ids, call_lp, call_len = next_ids[idx], call_ids[idx], call_lp[idx], call_len[idx]
        if joined:
            n = len(joined)
            pending.update((len(active) + k, episodes[b].ids) for k, b in enumerate(joined))
            next_ids = torch.cat([next_ids, next_ids.new_full((n,), pad)])
            call_ids = torch.cat([call_ids, call_ids.new_zeros(n, MAX_CALL_TOKENS)])
            call_lp = torch.cat([call_lp, call_lp.new_zeros(n, MAX_CALL_TOKENS)])
            call_len = torch.cat([call_len, call_len.new_zeros(n)])
            active = active + joined
