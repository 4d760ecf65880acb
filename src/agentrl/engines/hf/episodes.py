"""L4: multi-turn chat episodes with a Hugging Face model, and the BugFix gym through function calling.

Each episode is a :class:`~agentrl.templates.ChatRecorder`: the sampler continues the
recorder's prompt ids, the sampled ids go into the record as they are, and the environment's
answer comes back as a tool (or user) message through the template-derived bridge. Text exists
only at the boundary: the decoded turn is handed to a parser, never encoded again.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Callable

import torch

from ...gym import TOOL_SCHEMAS, BugFixEnv
from ...record import Provenance, SamplingSpec
from ...templates import ChatRecorder, ChatTemplate
from .models import model_id as _model_id
from .sampler import HFSampler

__all__ = ['Reply', 'run_chat_episodes', 'parse_tool_calls', 'gym_call', 'episode_seed', 'bugfix_rollouts',
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


def episode_seed(seed: int, index: int) -> int:
    """The sampling seed of episode ``index`` of a run seeded with ``seed``: ``seed * 2**20 + index``.

    Source: design notes (``Provenance.seed``: the episode's own sampling seed).
    """
    return int(seed) * (1 << 20) + int(index)


def run_chat_episodes(sampler: HFSampler, recorders: list, respond: Callable, *, seeds=None,
                      max_turns: int = 6, max_context: int | None = None, batch_size: int = 32,
                      provenance: Callable | None = None, on_done: Callable | None = None) -> list:
    """Drive chat episodes in lockstep, one sampled turn per live episode per round.

    Each round feeds every live episode's ``recorder.prompt_ids`` to ``sampler`` (in chunks of
    ``batch_size``), appends the sampled ids and log-probs with ``recorder.add_turn`` (verbatim),
    asks ``respond`` for the answer and appends its messages with ``recorder.add_messages``.

    Args:
        sampler: an :class:`~agentrl.engines.hf.HFSampler` (its spec is recorded).
        recorders: one fresh :class:`~agentrl.templates.ChatRecorder` per episode.
        respond: ``respond(i, turn, text) -> Reply`` for episode ``i``, the
            :class:`~agentrl.engines.hf.SampledTurn` and its decoded text (end-of-turn token
            stripped); it must not re-encode ``text``.
        seeds: one int per episode (its own ``torch.Generator``; stored as ``Provenance.seed``);
            None uses torch's global RNG.
        max_turns: turn limit; an episode still running after it stops as ``truncated``, reward 0.
        max_context: context limit in tokens (default the model's ``max_position_embeddings``);
            a turn's budget is ``min(max_new_tokens, max_context - len(prompt))``, and an episode
            with no room for one token stops as ``truncated``, reward 0.
        batch_size: at most this many episodes per sampler call.
        provenance: ``provenance(i) -> Provenance`` for episode ``i`` (default: policy ``'hf'``,
            the sampler's spec, the model id, the seed); the recorder adds the template and
            tokenizer fingerprints.
        on_done: optional callback ``on_done(i)`` when episode ``i`` ends (progress bars).

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

    Source: issue 5, item 2; book chapter 5.6-5.8 (truncation gives reward 0 and is recorded).
    """
    n = len(recorders)
    if max_turns < 1:
        raise ValueError(f'run_chat_episodes: max_turns must be >= 1, got {max_turns}')
    if seeds is not None and len(seeds) != n:
        raise ValueError(f'run_chat_episodes: {len(seeds)} seeds for {n} episodes; pass one per episode')
    gens = None if seeds is None else [torch.Generator().manual_seed(int(s)) for s in seeds]
    if max_context is None:
        max_context = getattr(getattr(sampler.model, 'config', None), 'max_position_embeddings', None) or 1 << 30
    for i, rec in enumerate(recorders):
        if len(rec.prompt_ids) >= max_context:
            raise ValueError(f'run_chat_episodes: episode {i} opens with {len(rec.prompt_ids)} prompt tokens, no '
                             f'room for a turn within max_context={max_context}; shorten the prompt or raise it')
    mid = _model_id(sampler.model)
    state = [{'actions': [], 'truncated_turns': [], 'turn_tokens': [], 'done': False, 'reward': 0.0, 'info': None}
             for _ in range(n)]

    def end(i: int, reward: float, info, stop: str | None = None) -> None:
        state[i].update(done=True, reward=float(reward), info=dict(info or {}, **({'stop': stop} if stop else {})))
        if on_done is not None:
            on_done(i)

    live = list(range(n))
    for turn in range(max_turns):
        room = {i: max_context - len(recorders[i].prompt_ids) for i in live}
        for i in live:
            if room[i] < 1:
                end(i, 0.0, None, 'truncated')
        live = [i for i in live if not state[i]['done']]
        for start in range(0, len(live), batch_size):
            chunk = live[start:start + batch_size]
            turns = sampler.sample([recorders[i].prompt_ids for i in chunk],
                                   None if gens is None else [gens[i] for i in chunk],
                                   max_new_tokens=[min(sampler.max_new_tokens, room[i]) for i in chunk])
            for i, t in zip(chunk, turns):
                rec, st = recorders[i], state[i]
                text = rec.add_turn(t.ids, t.logp)
                st['turn_tokens'].append(len(t.ids))
                if t.truncated:
                    st['truncated_turns'].append(turn)
                reply = respond(i, t, text)
                st['actions'].append(reply.action)
                if reply.done:
                    end(i, reply.reward, reply.info)
                elif turn + 1 >= max_turns:
                    end(i, 0.0, reply.info, 'truncated')
                elif not reply.messages:
                    raise ValueError(f'run_chat_episodes: respond returned no messages for running episode {i} '
                                     f'(turn {turn}); answer each turn with a tool or user message, or done=True')
                else:
                    rec.add_messages(reply.messages)
        live = [i for i in live if not state[i]['done']]
        if not live:
            break
    out = []
    for i, (rec, st) in enumerate(zip(recorders, state)):
        prov = provenance(i) if provenance is not None else Provenance(
            policy='hf', sampling=sampler.spec, model=mid, seed=None if seeds is None else int(seeds[i]))
        info = dict(st['info'] or {}, actions=st['actions'], truncated_turns=st['truncated_turns'],
                    turn_tokens=st['turn_tokens'])
        out.append(rec.finish(reward=st['reward'], info=info, provenance=prov))
    return out


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
                    sampler: HFSampler | None = None, on_done: Callable | None = None) -> list:
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
        seed: run seed; episode ``i`` samples with :func:`episode_seed` ``(seed, i)``.
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

    Returns:
        One :class:`~agentrl.record.Trajectory` per task, in order, with provenance (policy
        ``'hf'``, tokenizer and template fingerprints, the spec, the model id, the episode seed);
        ``info`` = the gym's final info + ``actions`` (gym call text, '' for a malformed call),
        ``tool_calls`` (parsed calls per turn, None if unparseable), ``truncated_turns``,
        ``turn_tokens`` and ``template``.

    Raises:
        ImportError: without the ``hf`` extra.
        ValueError: ``seeds`` of another length than ``tasks``; as :func:`run_chat_episodes`.

    Source: issue 5, item 2; book chapter 5.2 (``TOOL_SCHEMAS`` as function-calling tools).
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

    if seeds is None:
        seeds = [episode_seed(seed, i) for i in range(len(tasks))]
    elif len(seeds) != len(tasks):
        raise ValueError(f'bugfix_rollouts: {len(seeds)} seeds for {len(tasks)} tasks; pass one per task')
    seeds = [int(x) for x in seeds]
    name = model_name or _model_id(model)
    prov = lambda i: Provenance(policy='hf', sampling=spec, model=name, seed=seeds[i])  # noqa: E731
    trajs = run_chat_episodes(sampler, recorders, respond, seeds=seeds, max_turns=max_turns,
                              max_context=max_context, batch_size=batch_size, provenance=prov, on_done=on_done)
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
               on_done: Callable | None = None) -> list:
    """Load a model folder and roll out BugFix episodes with it (what ``agentrl rollout --engine hf`` runs).

    Args:
        model_dir: a ``save_pretrained`` folder with its tokenizer (``agentrl make-test-model OUT``).
        tasks: one task per episode, in order.
        spec, max_new_tokens, max_turns, reward_tests, seed, batch_size, on_done: as
            :func:`bugfix_rollouts`.
        device: where to run (default: ``cuda`` when available, else CPU); parameters in fp32.

    Returns:
        The records of :func:`bugfix_rollouts` (``Provenance.model`` is the folder's absolute path).

    Raises:
        ImportError: without the ``hf`` extra. FileNotFoundError / ValueError: as
        :func:`~agentrl.engines.hf.load_model`.

    Source: issue 5, item 2 (``agentrl rollout --engine hf --model DIR``).
    """
    from .models import load_model
    if device is None:
        device = 'cuda' if torch.cuda.is_available() else 'cpu'
    model, tok = load_model(model_dir, device=device)
    return bugfix_rollouts(model, tok, tasks, spec=spec, max_new_tokens=max_new_tokens, max_turns=max_turns,
                           reward_tests=reward_tests, seed=seed, batch_size=batch_size, on_done=on_done)
