"""L4: multi-turn chat episodes with a Hugging Face model, and the BugFix gym through function calling.

Each episode is a :class:`~agentrl.templates.ChatRecorder`: the sampler continues the
recorder's prompt ids, the sampled ids go into the record as they are, and the environment's
answer comes back as a tool (or user) message through the template-derived bridge. Text exists
only at the boundary: the decoded turn is handed to a parser, never encoded again.
"""
from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass, field
from typing import Callable

import torch

from ...gym import TOOL_SCHEMAS, BugFixEnv
from ...model import fill_holes
from ...record import Provenance, SamplingSpec
from ...sampling import PenaltyContext, episode_seed
from ...templates import ChatRecorder, ChatTemplate
from .models import model_id as _model_id
from .sampler import HFSampler, SampledTurn

__all__ = ['Reply', 'run_chat_episodes', 'format_profile', 'merge_profiles', 'PROFILE_KEYS', 'parse_tool_calls', 'gym_call', 'bugfix_rollouts',
           'bugfix_opening', 'bugfix_job']

#: Given to the gym for a turn without a valid call: it answers ``MESSAGES['malformed']``.
_MALFORMED = ''
_TOOL_CALL = re.compile(r'<tool_call>(.*?)</tool_call>', re.S)


@dataclass
class Reply:
    """What the environment answers to one sampled turn.

    Attributes:
        messages: tool results and/or user messages to append (through the recorder's bridge)
            before the next turn; ignored when ``done`` (no action depends on them).
        done: the episode ends after this turn.
        reward: the episode reward (read when ``done``).
        info: the final info (read when ``done``).
        action: what the turn meant to the environment (kept in ``info['actions']``).

    Source: book chapter 4 (``env.step`` returns observation, reward, done, info).
    """
    messages: list = field(default_factory=list)
    done: bool = False
    reward: float = 0.0
    info: dict | None = None
    action: object = None


#: Per-turn time split keys of :func:`run_chat_episodes` ``profile`` (seconds ``_s``, counts otherwise).
PROFILE_KEYS = ('prefill_tokens', 'prefill_s', 'rebuilt_tokens', 'decode_tokens', 'decode_s', 'sample_s',
                'template_s', 'gym_s')


class _Profile:
    """Per-turn accumulators of the time split (see :data:`PROFILE_KEYS`)."""

    def __init__(self):
        self.turns: list[dict] = []
        self.decode_steps = 0

    def add(self, turn: int, key: str, value) -> None:
        while len(self.turns) <= turn:
            self.turns.append(dict.fromkeys(PROFILE_KEYS, 0))
        self.turns[turn][key] += value

    def result(self, path: str, wall_s: float, records: list, forward_calls: int) -> dict:
        totals = {k: sum(t[k] for t in self.turns) for k in PROFILE_KEYS}
        totals['forward_s'] = totals['prefill_s'] + totals['decode_s']
        totals['other_s'] = wall_s - totals['forward_s'] - totals['sample_s'] - totals['template_s'] - totals['gym_s']
        totals['decode_steps'] = self.decode_steps
        totals['forward_calls'] = forward_calls
        totals['record_tokens'] = sum(len(t.ids) for t in records)
        rnd = lambda d: {k: round(v, 6) if isinstance(v, float) else v for k, v in d.items()}  # noqa: E731
        return {'engine': 'hf', 'path': path, 'episodes': len(records), 'wall_s': round(wall_s, 6),
                'totals': rnd(totals), 'turns': [dict(turn=k, **rnd(t)) for k, t in enumerate(self.turns)]}


def merge_profiles(profiles: list) -> dict:
    """One profile from the profiles of several :func:`run_chat_episodes` calls (chunks of a run).

    Counts and seconds add up per turn index and in the totals; ``wall_s`` and ``episodes`` add
    up; ``chunks`` says how many were merged.

    Raises:
        ValueError: an empty list, or profiles of different paths (cross-turn cache vs per turn).
    """
    if not profiles:
        raise ValueError('merge_profiles: no profiles; pass the dicts run_chat_episodes filled')
    paths = {p['path'] for p in profiles}
    if len(paths) != 1:
        raise ValueError(f'merge_profiles: profiles of different paths {sorted(paths)}; merge one path at a time')
    turns: list[dict] = []
    for p in profiles:
        for t in p['turns']:
            while len(turns) <= t['turn']:
                turns.append(dict(turn=len(turns), **dict.fromkeys(PROFILE_KEYS, 0)))
            for k in PROFILE_KEYS:
                turns[t['turn']][k] += t[k]
    totals = {k: sum(p['totals'][k] for p in profiles) for k in profiles[0]['totals']}
    rnd = lambda d: {k: round(v, 6) if isinstance(v, float) else v for k, v in d.items()}  # noqa: E731
    return {'engine': 'hf', 'path': paths.pop(), 'episodes': sum(p['episodes'] for p in profiles),
            'wall_s': round(sum(p['wall_s'] for p in profiles), 6), 'chunks': len(profiles), 'totals': rnd(totals),
            'turns': [rnd(t) for t in turns]}


def format_profile(profile: dict) -> str:
    """The time split of :func:`run_chat_episodes` as a plain-text table (one row per turn, then totals).

    Args:
        profile: the dict filled by ``run_chat_episodes(..., profile={})``.

    Returns:
        Lines: turn, prefill tokens / s, rebuilt tokens, decode tokens / s, sampling, template, gym
        (seconds), then the totals, forward time and its share of the wall time.
    """
    head = f'{"turn":>5} {"prefill tok":>11} {"prefill s":>9} {"rebuilt":>7} {"decode tok":>10} {"decode s":>8} ' \
           f'{"sample s":>8} {"template s":>10} {"gym s":>7}'
    row = lambda name, t: (f'{name:>5} {t["prefill_tokens"]:>11,} {t["prefill_s"]:>9.3f} {t["rebuilt_tokens"]:>7,} '  # noqa: E731
                           f'{t["decode_tokens"]:>10,} {t["decode_s"]:>8.3f} {t["sample_s"]:>8.3f} '
                           f'{t["template_s"]:>10.3f} {t["gym_s"]:>7.3f}')
    tot = profile['totals']
    lines = [f'hf engine profile ({profile["path"]}): {profile["episodes"]} episodes, {tot["record_tokens"]:,} '
             f'record tokens, wall {profile["wall_s"]:.3f} s', head]
    lines += [row(str(t['turn']), t) for t in profile['turns']]
    lines.append(row('all', tot))
    share = tot['forward_s'] / profile['wall_s'] if profile['wall_s'] > 0 else 0.0
    lines.append(f'forward {tot["forward_s"]:.3f} s ({share:.0%} of wall) in {tot["forward_calls"]:,} calls, '
                 f'{tot["decode_steps"]:,} decode steps; other {tot["other_s"]:.3f} s')
    return '\n'.join(lines)


def _common_prefix(a: list, b: list) -> int:
    """Length of the common prefix of two id lists."""
    n = min(len(a), len(b))
    if a[:n] == b[:n]:
        return n
    lo, hi = 0, n                       # a[:lo] == b[:lo], a[:hi] != b[:hi]
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid
    return lo


def run_chat_episodes(sampler: HFSampler, recorders: list, respond: Callable, *, seeds=None,
                      max_turns: int = 6, max_context: int | None = None, batch_size: int = 32,
                      provenance: Callable | None = None, on_done: Callable | None = None,
                      reuse_cache: bool = True, profile: dict | None = None) -> list:
    """Drive chat episodes: sample a turn, record it, answer it, bridge the answer, until each ends.

    Two paths give the same records (same seeds: the same ids, log-probs equal to fp rounding):

    * ``reuse_cache=True`` (default, when the sampler supports it): each episode keeps its own
      row of one KV cache for its whole life. After a turn only the tokens the cache does not
      hold yet are fed (the last sampled id, the bridge: tool result and next generation
      prompt); where the template rewrote history (``recorder.prompt_ids`` is not an extension
      of what the row holds, e.g. Qwen3 without thinking drops the empty think block of earlier
      turns) the row is cut back to the common prefix and refilled from there. Episodes join
      the running batch as rows free up and leave it when they end (continuous batching): every
      decode step feeds one token to every live row, whatever turn it is in.
    * ``reuse_cache=False``, or a sampler subclass that overrides ``sample``: each round feeds
      every live episode's ``recorder.prompt_ids`` to ``sampler.sample`` (in chunks of
      ``batch_size``), so each turn prefills the whole conversation again.

    Either way the sampled ids and log-probs go into the recorder verbatim (``add_turn``), the
    decoded text goes to ``respond``, and its messages come back through ``add_messages``.

    Args:
        sampler: an :class:`~agentrl.engines.hf.HFSampler` (its spec is recorded).
        recorders: one fresh :class:`~agentrl.templates.ChatRecorder` per episode.
        respond: ``respond(i, turn, text) -> Reply`` for episode ``i``, the
            :class:`~agentrl.engines.hf.SampledTurn` and its decoded text (end-of-turn token
            stripped); it must not re-encode ``text``. Calls for one episode come in turn order;
            calls of different episodes interleave differently on the two paths.
        seeds: one int per episode (its own ``torch.Generator``; stored as ``Provenance.seed``);
            None uses torch's global RNG (then the two paths draw differently).
        max_turns: turn limit; an episode still running after it stops as ``truncated``, reward 0.
        max_context: context limit in tokens (default the model's ``max_position_embeddings``);
            a turn's budget is ``min(max_new_tokens, max_context - len(prompt))``, and an episode
            with no room for one token stops as ``truncated``, reward 0.
        batch_size: at most this many episodes sampled at once (rows of the cache).
        provenance: ``provenance(i) -> Provenance`` for episode ``i`` (default: policy ``'hf'``,
            the sampler's spec, the model id, the seed); the recorder adds the template and
            tokenizer fingerprints.
        on_done: optional callback ``on_done(i)`` when episode ``i`` ends (progress bars).
        reuse_cache: keep each episode's KV cache across turns (see above).
        profile: optional dict, filled with the time split: ``path`` (``'cross_turn_cache'`` or
            ``'per_turn'``), ``wall_s``, ``episodes``, ``turns`` (one dict per turn index with
            :data:`PROFILE_KEYS`: prompt tokens fed in prompt forward passes and their seconds,
            cached positions dropped and fed again because the template rewrote history, decode
            tokens (one per live row and step) and
            their share of the decode forward seconds, sampling seconds, recorder (template and
            bridges) seconds, ``respond`` (gym) seconds) and ``totals`` (the same summed, plus
            ``forward_s``, ``other_s``, ``decode_steps``, ``forward_calls``, ``record_tokens``).
            :func:`format_profile` prints it.

    Returns:
        One :class:`~agentrl.record.Trajectory` per episode, in order. ``info`` holds the final
        info of the reply that ended it, plus ``actions`` (each turn's ``Reply.action``),
        ``truncated_turns`` (turns cut at their budget: no end-of-turn token in their span),
        ``turn_tokens`` (sampled tokens per turn) and the recorder's ``template`` report.

    Raises:
        ValueError: ``max_turns < 1``; ``seeds`` of another length than ``recorders``; an opening
            prompt that leaves no room for a turn within ``max_context``; a reply without messages
            for an episode that goes on; as ``ChatRecorder`` and
            ``HFSampler.sample`` (e.g. a sampled id outside the tokenizer's vocabulary).

    Source: book chapter 5.6-5.8 (truncation gives reward 0 and is recorded); continuous
    batching with one cache row per episode as :func:`agentrl.rollouts.rollout_batch` does for
    TinyAgent.
    """
    t_start = time.perf_counter()
    n = len(recorders)
    if max_turns < 1:
        raise ValueError(f'run_chat_episodes: max_turns must be >= 1, got {max_turns}')
    if seeds is not None and len(seeds) != n:
        raise ValueError(f'run_chat_episodes: {len(seeds)} seeds for {n} episodes; pass one per episode')
    if batch_size < 1:
        raise ValueError(f'run_chat_episodes: batch_size must be >= 1, got {batch_size}')
    gens = [None] * n if seeds is None else [torch.Generator().manual_seed(int(s)) for s in seeds]
    if max_context is None:
        max_context = getattr(getattr(sampler.model, 'config', None), 'max_position_embeddings', None) or 1 << 30
    for i, rec in enumerate(recorders):
        if len(rec.prompt_ids) >= max_context:
            raise ValueError(f'run_chat_episodes: episode {i} opens with {len(rec.prompt_ids)} prompt tokens, no '
                             f'room for a turn within max_context={max_context}; shorten the prompt or raise it')
    mid = _model_id(sampler.model)
    state = [{'actions': [], 'truncated_turns': [], 'turn_tokens': [], 'done': False, 'reward': 0.0, 'info': None}
             for _ in range(n)]
    prof = _Profile()
    calls0 = sampler.forward_calls

    def end(i: int, reward: float, info, stop: str | None = None) -> None:
        state[i].update(done=True, reward=float(reward), info=dict(info or {}, **({'stop': stop} if stop else {})))
        if on_done is not None:
            on_done(i)

    def after_turn(i: int, k: int, t) -> bool:
        """Record turn k of episode i and its answer; True when the episode goes on."""
        rec, st = recorders[i], state[i]
        t0 = time.perf_counter()
        text = rec.add_turn(t.ids, t.logp)
        t1 = time.perf_counter()
        st['turn_tokens'].append(len(t.ids))
        if t.truncated:
            st['truncated_turns'].append(k)
        reply = respond(i, t, text)
        t2 = time.perf_counter()
        prof.add(k, 'template_s', t1 - t0)
        prof.add(k, 'gym_s', t2 - t1)
        st['actions'].append(reply.action)
        if reply.done:
            end(i, reply.reward, reply.info)
            return False
        if k + 1 >= max_turns:
            end(i, 0.0, reply.info, 'truncated')
            return False
        if not reply.messages:
            raise ValueError(f'run_chat_episodes: respond returned no messages for running episode {i} '
                             f'(turn {k}); answer each turn with a tool or user message, or done=True')
        rec.add_messages(reply.messages)
        prof.add(k, 'template_s', time.perf_counter() - t2)
        return True

    rows = (reuse_cache and sampler.cache and type(sampler).sample is HFSampler.sample
            and sampler.supports_row_cache())
    if rows:
        _drive_rows(sampler, recorders, gens, after_turn, end, prof, max_context, min(batch_size, max(n, 1)))
    else:
        _drive_turns(sampler, recorders, gens, after_turn, end, state, prof, max_turns, max_context, batch_size)
    out = []
    for i, (rec, st) in enumerate(zip(recorders, state)):
        prov = provenance(i) if provenance is not None else Provenance(
            policy='hf', sampling=sampler.spec, model=mid, seed=None if seeds is None else int(seeds[i]))
        info = dict(st['info'] or {}, actions=st['actions'], truncated_turns=st['truncated_turns'],
                    turn_tokens=st['turn_tokens'])
        out.append(rec.finish(reward=st['reward'], info=info, provenance=prov))
    if profile is not None:
        profile.update(prof.result('cross_turn_cache' if rows else 'per_turn', time.perf_counter() - t_start, out,
                                   sampler.forward_calls - calls0))
    return out


def _drive_turns(sampler, recorders, gens, after_turn, end, state, prof, max_turns, max_context, batch_size):
    """The per-turn path: each round samples every live episode's whole prompt again."""
    live = list(range(len(recorders)))
    for turn in range(max_turns):
        room = {i: max_context - len(recorders[i].prompt_ids) for i in live}
        for i in live:
            if room[i] < 1:
                end(i, 0.0, None, 'truncated')
        live = [i for i in live if not state[i]['done']]
        for start in range(0, len(live), batch_size):
            chunk = live[start:start + batch_size]
            before = dict(sampler.stats)
            turns = sampler.sample([recorders[i].prompt_ids for i in chunk], [gens[i] for i in chunk],
                                   max_new_tokens=[min(sampler.max_new_tokens, room[i]) for i in chunk])
            for key in ('prefill_tokens', 'prefill_s', 'decode_tokens', 'decode_s', 'sample_s'):
                prof.add(turn, key, sampler.stats[key] - before[key])
            prof.decode_steps += sampler.stats['decode_steps'] - before['decode_steps']
            for i, t in zip(chunk, turns):
                after_turn(i, turn, t)
        live = [i for i in live if not state[i]['done']]
        if not live:
            break


def _drive_rows(sampler, recorders, gens, after_turn, end, prof, max_context, max_rows):
    """The cross-turn path: one cache row per live episode, continuous batching (see run_chat_episodes)."""
    clock = time.perf_counter
    stop_ids = sampler.stop_ids
    cache = sampler.new_row_cache(max_rows)
    pending = list(range(len(recorders)))[::-1]          # popped from the end: episode order
    episode: list[int] = []                               # row -> episode
    held: list[list] = []                                 # row -> ids whose keys and values the row holds
    feed: list[int] = []                                  # row -> the id the next decode step feeds
    turn_of: list[int] = []                               # row -> turn index
    current: list = []                                    # row -> the SampledTurn being sampled
    budget: list[int] = []                                # row -> its token budget for this turn
    prompt_of: list = []                                  # row -> the turn's prompt (penalty context)
    penalized = sampler.spec.penalized

    def start_turn(r: int, k: int) -> bool:
        """Bring row r up to the prompt of turn k; False when the episode has no room left."""
        i = episode[r]
        prompt = recorders[i].prompt_ids
        room = max_context - len(prompt)
        if room < 1:
            end(i, 0.0, None, 'truncated')
            return False
        have = held[r]
        c = min(_common_prefix(have, prompt), len(prompt) - 1)
        if c < len(have):                                  # the template rewrote history: refill from c
            prof.add(k, 'rebuilt_tokens', len(have) - c)
        cache.lengths[r] = c
        todo = prompt[c:-1]                                 # the last prompt id goes in the next decode step
        if todo:
            t0 = clock()
            sampler.prefill_row(cache, r, todo)
            prof.add(k, 'prefill_s', clock() - t0)
            prof.add(k, 'prefill_tokens', len(todo))
        del have[c:]
        have += todo
        feed[r] = prompt[-1]
        turn_of[r] = k
        current[r] = SampledTurn(prompt_len=len(prompt))
        budget[r] = min(sampler.max_new_tokens, room)
        prompt_of[r] = prompt if penalized else None
        return True

    while pending or episode:
        while pending and len(episode) < max_rows:          # episodes join as rows free up
            r = len(episode)
            episode.append(pending.pop())
            held.append([])
            feed.append(0)
            turn_of.append(0)
            current.append(None)
            budget.append(0)
            prompt_of.append(None)
            cache.lengths[r] = 0
            if not start_turn(r, 0):
                for lst in (episode, held, feed, turn_of, current, budget, prompt_of):
                    lst.pop()
        if not episode:
            break
        n = len(episode)
        t0 = clock()
        logits = sampler.decode_rows(cache, feed)
        t1 = clock()
        ctx = PenaltyContext.of(prompt_of, [t.ids for t in current]) if penalized else None
        ids, logp = sampler.choose(logits, [gens[i] for i in episode], context=ctx)
        ids, logp = ids.tolist(), logp.tolist()
        t2 = clock()
        prof.decode_steps += 1
        for k in turn_of:
            prof.add(k, 'decode_tokens', 1)
            prof.add(k, 'decode_s', (t1 - t0) / n)
            prof.add(k, 'sample_s', (t2 - t1) / n)
        ended = []
        for r in range(n):
            held[r].append(feed[r])
            t = current[r]
            t.ids.append(ids[r])
            t.logp.append(logp[r])
            if ids[r] in stop_ids or len(t.ids) >= budget[r]:
                t.truncated = ids[r] not in stop_ids
                sampler.tokens_generated += len(t.ids)
                if not (after_turn(episode[r], turn_of[r], t) and start_turn(r, turn_of[r] + 1)):
                    ended.append(r)
            else:
                feed[r] = ids[r]
        if ended:                                           # episodes leave: the last rows fill the holes
            order = fill_holes(n, ended)
            for dst, src in enumerate(order):
                if dst != src:
                    cache.move_row(src, dst)
            for lst in (episode, held, feed, turn_of, current, budget, prompt_of):
                lst[:] = [lst[src] for src in order]


# ---------------------------------------------------------------------------- function calling
def parse_tool_calls(text: str) -> list | None:
    """Parse the function calls of a decoded assistant turn (Hermes / Qwen3 ``<tool_call>`` JSON).

    Only the text after the last ``</think>`` is searched (calls inside reasoning do not count).
    Parsing only: the text is never encoded again.

    Args:
        text: the decoded turn (without its end-of-turn token).

    Returns:
        ``[(name, arguments)]`` in order, ``arguments`` a dict (a JSON-string ``arguments`` is
        decoded); ``[]`` when the turn has no ``<tool_call>`` block; None when a block is not a
        JSON object with a string ``name`` and object ``arguments``, or a ``<tool_call>`` is left open.

    Example:
        >>> parse_tool_calls('<tool_call>\\n{"name":"edit","arguments":{"op":"swap_minmax"}}\\n</tool_call>')
        [('edit', {'op': 'swap_minmax'})]

    Source: Qwen3's chat template (``<tool_call>\\n{"name": ..., "arguments": ...}\\n</tool_call>``);
    book chapter 5.2.
    """
    if not isinstance(text, str):
        return None
    body = text.rsplit('</think>', 1)[-1]
    calls = []
    for m in _TOOL_CALL.finditer(body):
        try:
            obj = json.loads(m.group(1))
        except ValueError:
            return None
        if not isinstance(obj, dict) or not isinstance(obj.get('name'), str):
            return None
        args = obj.get('arguments', {})
        if isinstance(args, str):
            try:
                args = json.loads(args)
            except ValueError:
                return None
        if not isinstance(args, dict):
            return None
        calls.append((obj['name'], args))
    if body.count('<tool_call>') != len(calls) or body.count('</tool_call>') != len(calls):
        return None
    return calls


def gym_call(calls) -> str | None:
    """Map parsed function calls to the BugFix gym's call text, or None when it is no valid call.

    The gym takes one call per turn: exactly one function call whose name is a gym tool and
    whose arguments are exactly the tool's (``read``, ``test``, ``submit``: none; ``edit``: one
    string ``op`` without whitespace; an unknown op still maps, and the gym answers ``error :
    unknown op``).

    Args:
        calls: the output of :func:`parse_tool_calls`.

    Returns:
        e.g. ``'<call> edit swap_minmax </call>'``, or None (the turn is a malformed call).

    Source: the gym's grammar (:mod:`agentrl.gym.calls`) and ``TOOL_SCHEMAS``.
    """
    if not calls or len(calls) != 1:
        return None
    name, args = calls[0]
    if name in ('read', 'test', 'submit') and not args:
        return f'<call> {name} </call>'
    if name == 'edit' and set(args) == {'op'} and isinstance(args['op'], str) and args['op'] \
            and len(args['op'].split()) == 1 and args['op'] == args['op'].strip():
        return f'<call> edit {args["op"]} </call>'
    return None


def bugfix_opening(issue: str) -> list:
    """The opening messages of a BugFix episode: the issue as the user message.

    The tools reach the model through the template's ``tools=`` (``TOOL_SCHEMAS``), so no
    system message is needed.

    Source: book chapter 5.2 (the clamp episode opens with the issue as the user turn).
    """
    return [{'role': 'user', 'content': issue}]


def bugfix_rollouts(model, tokenizer, tasks, *, spec: SamplingSpec | None = None, max_new_tokens: int = 256,
                    max_turns: int = 6, reward_tests: str = 'hidden', seed: int = 0, batch_size: int = 32,
                    cache: bool = True, max_context: int | None = None, enable_thinking: bool | None = None,
                    template: ChatTemplate | None = None, model_name: str | None = None, seeds=None,
                    sampler: HFSampler | None = None, on_done: Callable | None = None, reuse_cache: bool = True,
                    profile: dict | None = None) -> list:
    """Roll out BugFix episodes with a Hugging Face model through real function calling.

    The gym's ``TOOL_SCHEMAS`` become the template's tools; each turn is sampled from the
    recorder's prompt ids; its call is parsed from the decoded text (:func:`parse_tool_calls`,
    :func:`gym_call`) and stepped in a :class:`~agentrl.gym.BugFixEnv`; an unparseable call, and
    any turn cut at its token budget, gets ``error : malformed call``; the observation returns
    as a ``tool`` message through the template's bridge.

    Args:
        model: a transformers causal LM (eval mode). tokenizer: its Hugging Face tokenizer.
        tasks: the episodes' tasks (one episode each; repeat a task for a group).
        spec: the sampler (default temperature 1, no truncation, ``processed`` log-probs).
        max_new_tokens: token budget of one turn.
        max_turns: the gym's turn budget (stop ``budget``) and the loop's limit.
        reward_tests: ``'hidden'`` or ``'public'`` (see :class:`~agentrl.gym.BugFixEnv`).
        seed: run seed; without ``seeds``, episode ``i`` of task ``t`` samples with
            :func:`agentrl.sampling.episode_seed` ``(seed, f'{seed}/hf/{t.name}', f'{seed}/hf/{t.name}/{i}')``.
        seeds: explicit per-episode seeds instead (one int per task), e.g. to sample a subset of a
            run one by one with the seeds it had in the batch.
        batch_size: episodes per sampler call. cache: use the KV cache (False: recompute).
        max_context: context limit (default the model's ``max_position_embeddings``).
        enable_thinking: passed to the template when not None (Qwen3: False renders an empty
            think block after the generation prompt, template-owned).
        template: a ready :class:`~agentrl.templates.ChatTemplate` (overrides ``tokenizer``,
            ``enable_thinking``; must carry the gym's tools).
        model_name: ``Provenance.model`` (default the folder the model was loaded from).
        sampler: a ready :class:`~agentrl.engines.hf.HFSampler` (or subclass) to use instead of
            building one from ``model``, ``spec``, ``max_new_tokens`` and ``cache``; its spec
            is the one recorded.
        on_done: progress callback ``on_done(i)``.
        reuse_cache, profile: as :func:`run_chat_episodes` (keep each episode's KV cache across
            turns; fill ``profile`` with the per-turn time split).

    Returns:
        One :class:`~agentrl.record.Trajectory` per task, in order, with provenance (policy
        ``'hf'``, tokenizer and template fingerprints, the spec, the model id, the episode seed);
        ``info`` = the gym's final info + ``actions`` (gym call text, '' for a malformed call),
        ``tool_calls`` (parsed calls per turn, None if unparseable), ``truncated_turns``,
        ``turn_tokens`` and ``template``.

    Raises:
        ImportError: without the ``hf`` extra.
        ValueError: ``seeds`` of another length than ``tasks``; as :func:`run_chat_episodes`.

    Source: docs/design.md#hf-engine; book chapter 5.2 (``TOOL_SCHEMAS`` as function-calling tools).
    """
    spec = spec if spec is not None else SamplingSpec()
    if template is None:
        opts = {} if enable_thinking is None else {'enable_thinking': bool(enable_thinking)}
        template = ChatTemplate(tokenizer, tools=TOOL_SCHEMAS, **opts)
    if sampler is None:
        sampler = HFSampler(model, template.stop_ids, spec, max_new_tokens=max_new_tokens, cache=cache,
                            pad_id=_pad_id(template.tokenizer, model))
    spec = sampler.spec
    envs = [BugFixEnv(max_turns=max_turns, reward_tests=reward_tests) for _ in tasks]
    recorders = [ChatRecorder(template, bugfix_opening(env.reset(task))) for env, task in zip(envs, tasks)]
    parsed: list = [[] for _ in tasks]

    def respond(i, turn, text):
        calls = None if turn.truncated else parse_tool_calls(text)
        call = gym_call(calls) if calls is not None else None
        parsed[i].append([{'name': n, 'arguments': a} for n, a in calls] if calls is not None else None)
        obs, reward, done, info = envs[i].step(call if call is not None else _MALFORMED)
        return Reply(messages=[{'role': 'tool', 'content': obs}], done=done, reward=reward, info=info,
                     action=call or '')

    if seeds is None:     # the one seed rule, over this call's identities (group = task, rollout = index)
        seeds = [episode_seed(seed, f'{seed}/hf/{t.name}', f'{seed}/hf/{t.name}/{i}') for i, t in enumerate(tasks)]
    elif len(seeds) != len(tasks):
        raise ValueError(f'bugfix_rollouts: {len(seeds)} seeds for {len(tasks)} tasks; pass one per task')
    seeds = [int(x) for x in seeds]
    name = model_name or _model_id(model)
    prov = lambda i: Provenance(policy='hf', sampling=spec, model=name, seed=seeds[i])  # noqa: E731
    trajs = run_chat_episodes(sampler, recorders, respond, seeds=seeds, max_turns=max_turns,
                              max_context=max_context, batch_size=batch_size, provenance=prov, on_done=on_done,
                              reuse_cache=reuse_cache, profile=profile)
    for i, (t, env) in enumerate(zip(trajs, envs)):
        t.info['tool_calls'] = parsed[i]
        if t.info.get('stop') == 'truncated' and 'task' not in t.info:
            t.info.update({k: v for k, v in env.final_info(False).items() if k not in t.info})
    return trajs


def _pad_id(tokenizer, model) -> int:
    config = getattr(model, 'config', None)
    for cand in (getattr(tokenizer, 'pad_token_id', None), getattr(config, 'pad_token_id', None),
                 getattr(tokenizer, 'eos_token_id', None)):
        if cand is not None:
            return int(cand)
    return 0


def bugfix_job(model_dir, tasks, *, spec: SamplingSpec | None = None, max_new_tokens: int = 256, max_turns: int = 6,
               reward_tests: str = 'hidden', seed: int = 0, batch_size: int = 32, device=None,
               on_done: Callable | None = None, profile: dict | None = None) -> list:
    """Load a model folder and roll out BugFix episodes with it (what ``agentrl rollout --engine hf`` runs).

    Args:
        model_dir: a ``save_pretrained`` folder with its tokenizer (``agentrl make-test-model OUT``).
        tasks: one task per episode, in order.
        spec, max_new_tokens, max_turns, reward_tests, seed, batch_size, on_done, profile: as
            :func:`bugfix_rollouts`.
        device: where to run (default: ``cuda`` when available, else CPU); parameters in fp32.

    Returns:
        The records of :func:`bugfix_rollouts` (``Provenance.model`` is the folder's absolute path).

    Raises:
        ImportError: without the ``hf`` extra. FileNotFoundError / ValueError: as
        :func:`~agentrl.engines.hf.load_model`.

    Source: docs/design.md#hf-engine.
    """
    from .models import load_model
    if device is None:
        device = 'cuda' if torch.cuda.is_available() else 'cpu'
    model, tok = load_model(model_dir, device=device)
    return bugfix_rollouts(model, tok, tasks, spec=spec, max_new_tokens=max_new_tokens, max_turns=max_turns,
                           reward_tests=reward_tests, seed=seed, batch_size=batch_size, on_done=on_done,
                           profile=profile)
