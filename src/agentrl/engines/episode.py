"""L4: the engine-agnostic parts of a chat episode: what the environment answers, and each episode's books.

Torch-free (no torch, no transformers): the episode driver (:func:`agentrl.engines.driver.drive_episodes`)
keeps its books with these, and an environment adapter (:class:`agentrl.jobs.bugfix.BugFixAdapter`)
answers with :class:`Reply`.

Source: docs/design.md#hf-engine; book chapter 4 (``env.step``) and 5.6-5.8 (truncation gives reward 0
and is recorded).
"""
from __future__ import annotations

from dataclasses import dataclass, field

from ..record import StopReason

__all__ = ['Reply', 'SampledTurn', 'EpisodeState', 'StopReason']


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


@dataclass
class SampledTurn:
    """One sampled assistant turn.

    Attributes:
        ids: sampled token ids, in order; the stop id last when the turn stopped on one
            (docs/design.md#stops).
        logp: ``len(ids)`` float sampling log-probs (nats) under the sampler's spec (``processed`` mode,
            docs/design.md#sampling).
        truncated: True when the turn was cut at its token budget (``max_new_tokens`` or the
            context limit).
        prompt_len: number of prompt ids the turn was sampled after.
    """
    ids: list = field(default_factory=list)
    logp: list = field(default_factory=list)
    truncated: bool = False
    prompt_len: int = 0


@dataclass
class EpisodeState:
    """One episode's books while a driver runs it: per-turn facts, then how it ended.

    Attributes:
        actions: each turn's ``Reply.action``.
        truncated_turns: indices of the turns cut at their token budget (no end-of-turn token).
        turn_tokens: sampled tokens per turn.
        done, reward, info: set by :meth:`end` (``info['stop']`` when the driver stopped it).
    """
    actions: list = field(default_factory=list)
    truncated_turns: list = field(default_factory=list)
    turn_tokens: list = field(default_factory=list)
    done: bool = False
    reward: float = 0.0
    info: dict | None = None

    def end(self, reward: float, info: dict | None = None, stop: StopReason | None = None) -> None:
        """End the episode with ``reward``; ``stop`` (when given) is written to ``info['stop']``."""
        self.done, self.reward = True, float(reward)
        self.info = dict(info or {}, **({'stop': stop} if stop else {}))

    def add_turn(self, k: int, n_tokens: int, truncated: bool) -> None:
        """Note turn ``k``: ``n_tokens`` sampled tokens, cut at its budget or not."""
        self.turn_tokens.append(int(n_tokens))
        if truncated:
            self.truncated_turns.append(k)

    def apply(self, reply: Reply, k: int, max_turns: int, *, episode: int = 0, caller: str = 'driver') -> bool:
        """Take the environment's answer to turn ``k``; True when the episode goes on.

        A reply with ``done`` ends the episode with its reward and info; a running episode at
        ``max_turns`` turns ends as docs/design.md#stops says (:attr:`StopReason.TRUNCATED`, reward 0).

        Raises:
            ValueError: a reply without messages for an episode that goes on (names ``caller``,
                ``episode`` and the turn).
        """
        self.actions.append(reply.action)
        if reply.done:
            self.end(reply.reward, reply.info)
            return False
        if k + 1 >= max_turns:
            self.end(0.0, reply.info, StopReason.TRUNCATED)
            return False
        if not reply.messages:
            raise ValueError(f'{caller}: respond returned no messages for running episode {episode} '
                             f'(turn {k}); answer each turn with a tool or user message, or done=True')
        return True

    def final_info(self) -> dict:
        """The record's ``info``: the final info plus ``actions``, ``truncated_turns``, ``turn_tokens``."""
        return dict(self.info or {}, actions=self.actions, truncated_turns=self.truncated_turns,
                    turn_tokens=self.turn_tokens)
