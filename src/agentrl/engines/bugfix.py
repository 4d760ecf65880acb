"""L4: the BugFix gym behind function calling, for any engine (HF, vLLM, a recording gateway).

:class:`BugFixAdapter` owns one :class:`~agentrl.gym.BugFixEnv` per episode: it gives each
episode's opening messages, answers each decoded turn with a :class:`~agentrl.engines.episode.Reply`
(its call parsed from the text, never encoded again), and finishes the records with the parsed
calls and the gym's final info. Torch-free (no torch, no transformers).

Source: docs/design.md#hf-engine; book chapter 5.2 (``TOOL_SCHEMAS`` as function-calling tools).
"""
from __future__ import annotations

from ..families import QWEN3
from ..gym import TOOL_SCHEMAS, BugFixEnv
from ..record import StopReason
from .episode import Reply

__all__ = ['BugFixAdapter', 'parse_tool_calls', 'gym_call', 'bugfix_opening', 'MALFORMED']

#: Given to the gym for a turn without a valid call: it answers ``MESSAGES['malformed']``.
MALFORMED = ''


def parse_tool_calls(text: str, family=QWEN3) -> list | None:
    """The function calls of a decoded assistant turn, when every call in it is well formed.

    The family reads them (:meth:`~agentrl.families.Family.strict_calls`: calls inside reasoning do
    not count); parsing only, the text is never encoded again.

    Args:
        text: the decoded turn (without its end-of-turn token).
        family: the model family of the policy's template (the BugFix tools are taught in Qwen3's
            Hermes format, so that is the default).

    Returns:
        ``[(name, arguments)]`` in order, ``arguments`` a dict; ``[]`` when the turn calls nothing;
        None when a call is not ``ok`` or a call mark stands outside a block.

    Example:
        >>> parse_tool_calls('<tool_call>\\n{"name":"edit","arguments":{"op":"swap_minmax"}}\\n</tool_call>')
        [('edit', {'op': 'swap_minmax'})]

    Source: book chapter 5.2.
    """
    if not isinstance(text, str):
        return None
    calls = family.strict_calls(text)
    return None if calls is None else [(c.name, c.arguments) for c in calls]


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


class BugFixAdapter:
    """BugFix episodes for a chat engine: openings, one :class:`Reply` per turn, the records' info.

    Args:
        tasks: one task per episode (repeat a task for a group).
        max_turns: the gym's turn budget (stop ``budget``); pass the driver the same limit.
        reward_tests: ``'hidden'`` or ``'public'`` (see :class:`~agentrl.gym.BugFixEnv`).

    Attributes:
        tools: ``TOOL_SCHEMAS``, for the chat template's ``tools=``.
        tasks, envs: the tasks and their environments (episode ``i`` steps ``envs[i]``).
        tool_calls: per episode, the parsed calls of each turn (``[{'name', 'arguments'}]``, None
            when the turn's text did not parse or the turn was cut at its budget).

    Example:
        >>> adapter = BugFixAdapter(tasks, max_turns=6)
        >>> recorders = [ChatRecorder(template, m) for m in adapter.openings()]
        >>> trajs = adapter.finish(run_chat_episodes(sampler, recorders, adapter.respond, max_turns=6))

    Source: the gym's grammar (:mod:`agentrl.gym.calls`); book chapter 5.2.
    """

    tools = TOOL_SCHEMAS

    def __init__(self, tasks, max_turns: int = 6, reward_tests: str = 'hidden'):
        self.tasks = list(tasks)
        self.max_turns = int(max_turns)
        self.envs = [BugFixEnv(max_turns=max_turns, reward_tests=reward_tests) for _ in self.tasks]
        self.tool_calls: list = [[] for _ in self.tasks]

    def openings(self) -> list:
        """Reset every env; one opening message list per task (:func:`bugfix_opening` of its issue)."""
        self.tool_calls = [[] for _ in self.tasks]
        return [bugfix_opening(env.reset(task)) for env, task in zip(self.envs, self.tasks)]

    def respond(self, i: int, turn, text: str) -> Reply:
        """Step episode ``i`` with the call in ``text``; the observation comes back as a ``tool`` message.

        Args:
            i: the episode. turn: the sampled turn (``turn.truncated``: cut at its token budget,
                then the turn is a malformed call whatever its text). text: the decoded turn
                without its end-of-turn token.

        Returns:
            :class:`Reply` with the gym's observation, reward, done and info; ``action`` is the
            gym call text (``''`` for a malformed call).
        """
        calls = None if turn.truncated else parse_tool_calls(text)
        call = gym_call(calls) if calls is not None else None
        self.tool_calls[i].append([{'name': n, 'arguments': a} for n, a in calls] if calls is not None else None)
        obs, reward, done, info = self.envs[i].step(call if call is not None else MALFORMED)
        return Reply(messages=[{'role': 'tool', 'content': obs}], done=done, reward=reward, info=info,
                     action=call or '')

    def finish(self, trajs: list) -> list:
        """Add ``info['tool_calls']`` to each record (in episode order), and the gym's final info
        (``task``, ``solved`` ...) to records the driver stopped as truncated; returns ``trajs``.

        Raises:
            ValueError: another number of records than tasks.
        """
        if len(trajs) != len(self.tasks):
            raise ValueError(f'BugFixAdapter.finish: {len(trajs)} records for {len(self.tasks)} tasks; '
                             'pass the records of every episode, in order')
        for i, t in enumerate(trajs):
            self.finish_one(i, t)
        return trajs

    def finish_one(self, i: int, traj):
        """:meth:`finish` for the record of episode ``i`` alone (e.g. the episodes that ended before
        a server died); returns ``traj``."""
        traj.info['tool_calls'] = self.tool_calls[i]
        if traj.info.get('stop') == StopReason.TRUNCATED and 'task' not in traj.info:
            traj.info.update({k: v for k, v in self.envs[i].final_info(False).items() if k not in traj.info})
        return traj
