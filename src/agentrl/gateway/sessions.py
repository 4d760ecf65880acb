"""L5: a gateway session: branches of token logs, echo matching, forks.

Each branch is a :class:`~agentrl.templates.ChatRecorder` in ``history='sampled'`` mode (the
engine always continues the recorded ids) plus the conversation as the harness sees it (the
*view*: the opening messages, each returned assistant message, the messages that followed).
A request is matched against every branch's view:

* it **extends** a branch when the view is a prefix of its messages up to differences of form
  (an echoed assistant message is compared with the message the gateway returned: content,
  tool-call names and parsed arguments; tool-call ids, argument formatting and
  ``reasoning_content`` are ignored and noted as the turn's ``variants``), its tools are the
  branch's, and what follows is tool/user/system messages only: they are bridged through the
  template and the engine gets the recorded ids plus the bridge;
* otherwise it **forks**: from the branch that matches longest, replaying that branch's steps up
  to its last matching sampled turn (the sampled ids are reused, never re-encoded) when only
  non-assistant messages follow; else as a new branch rendered from the messages (every token
  prompt-owned). Each fork is stored as data (:meth:`Session.fork_info`);
* it is **another conversation** (a side call: a title or summary request) when both its tools and its
  first message differ from every branch's: it starts a root of its own (no fork), so the agent's
  conversation is never recorded as a fork of a side call; the records name the primary root
  (:func:`agentrl.gateway.records.primary_root`). A change of the tools alone (``tools_changed``) or of
  the first message alone (``system_prompt_changed``, ``subagent``) still forks.

Everything here is deterministic in the requests and the sampled ids, so a session is rebuilt
from its journal (:mod:`agentrl.gateway.journal`) by calling :meth:`Session.plan` and
:meth:`Session.commit` again with the journalled samples.

Source: docs/gateway.md#branches; docs/design.md#hf-engine (token-in/token-out).
"""
from __future__ import annotations

import json
import time
from dataclasses import dataclass, field

from ..templates import ChatRecorder
from .parse import normalize_assistant

__all__ = ['Turn', 'Branch', 'Plan', 'Session', 'FORK_CATEGORIES']

#: Why a request did not extend any branch.
FORK_CATEGORIES = ('compaction', 'system_prompt_changed', 'tools_changed', 'history_edited', 'retry', 'subagent',
                   'other')


@dataclass
class Turn:
    """One sampled turn of a branch: ``call`` (session call index), ``ids``/``logp`` ``[n]``, the returned
    ``message``, ``truncated``, ``start`` (its position in the branch's ids), ``delivered``, ``variants``
    (differences of form seen in the harness's echoes of it)."""
    call: int
    ids: list
    logp: list
    message: dict
    truncated: bool = False
    start: int = 0
    delivered: bool = True
    variants: list = field(default_factory=list)

    def record_message(self) -> dict:
        """The turn as the template renders it (arguments as objects, content never None)."""
        m = {'role': 'assistant', 'content': self.message.get('content') or ''}
        if self.message.get('reasoning_content') is not None:
            m['reasoning_content'] = self.message['reasoning_content']
        if self.message.get('tool_calls'):
            m['tool_calls'] = [{'type': 'function', 'function': {'name': c['function']['name'],
                                                                 'arguments': json.loads(c['function']['arguments'])}}
                               for c in self.message['tool_calls']]
        return m


class Branch:
    """A token log with its steps: ``opening`` messages, then ``('turn', Turn)`` / ``('msgs', [...])`` steps;
    ``root``: the index of the root branch it descends from (its own for a root)."""

    def __init__(self, index: int, template, tools_key: str, opening: list, steps=(), fork: dict | None = None):
        self.index, self.template, self.tools_key, self.root = index, template, tools_key, index
        self.opening, self.steps, self.fork = list(opening), list(steps), fork
        self.recorder = None
        self.seen: tuple = ([], [])       # the harness's last matching messages and their echo notes (match cache)
        self.build()

    def build(self) -> None:
        """(Re)build the recorder by replaying the steps (the same ids as when they were first added)."""
        self._view, self._folded = [(m, None) for m in self.opening], 0
        rec = ChatRecorder(self.template, self.opening, history='sampled')
        for kind, x in self.steps:
            if kind == 'turn':
                rec.add_turn(x.ids, x.logp, message=x.record_message())
            else:
                rec.add_messages(x)
        self.recorder = rec

    @property
    def turns(self) -> list:
        return [x for kind, x in self.steps if kind == 'turn']

    def view(self) -> list:
        """``[(message, Turn or None)]``: the conversation as the harness was shown it (cached; do not mutate)."""
        if self._folded > len(self.steps):
            self._view, self._folded = [(m, None) for m in self.opening], 0
        for kind, x in self.steps[self._folded:]:
            self._view += [(x.message, x)] if kind == 'turn' else [(m, None) for m in x]
        self._folded = len(self.steps)
        return self._view

    def sampled_after(self, offset: int) -> int:
        """Sampled tokens of this branch at positions >= ``offset``."""
        return sum(max(0, t.start + len(t.ids) - max(offset, t.start)) for t in self.turns)


@dataclass
class Plan:
    """Where a request goes: ``branch`` (extended in place, or new and not yet attached), its
    ``prompt_ids`` ``[L]``, ``new`` (True for a fork or the first branch), ``fork`` (the fork data or None),
    ``variants`` ``[(Turn, [note])]`` to note on echoed turns, ``seen`` the branch's match cache once committed."""
    branch: Branch
    prompt_ids: list
    new: bool
    fork: dict | None = None
    variants: list = field(default_factory=list)
    seen: tuple = ([], [])


def _content(m: dict) -> str:
    return m.get('content') or ''


def _text_key(m: dict) -> str:
    """A message's content as a hashable key (content parts with images as their JSON)."""
    c = _content(m)
    return c if isinstance(c, str) else json.dumps(c, sort_keys=True)


def _same(ours: dict, theirs: dict) -> bool:
    """Two non-sampled messages agree in substance (role, content, name, tool calls; tool_call_id ignored)."""
    if ours.get('role') != theirs.get('role') or _content(ours) != _content(theirs):
        return False
    if ours.get('name') != theirs.get('name'):
        return False
    return ours['role'] != 'assistant' or normalize_assistant(ours) == normalize_assistant(theirs)


def _echo_notes(ours: dict, theirs: dict, family) -> list | None:
    """None when ``theirs`` is not an echo of the returned ``ours``; else the differences of form.

    ``family``: the model family, which splits reasoning a harness inlined in the content."""
    if theirs.get('role') != 'assistant':
        return None
    notes, t = [], dict(theirs)
    if family.think_open is not None and _content(t).lstrip().startswith(family.think_open):
        reasoning, t['content'] = family.split_reasoning(_content(t))
        notes.append('reasoning_inline')
    if normalize_assistant(ours) != normalize_assistant(t):
        return None
    if ours.get('reasoning_content') and theirs.get('reasoning_content') != ours['reasoning_content'] \
            and 'reasoning_inline' not in notes:
        notes.append('reasoning_changed' if theirs.get('reasoning_content') else 'reasoning_dropped')
    oc, tc = ours.get('tool_calls') or [], theirs.get('tool_calls') or []
    if [c.get('id') for c in oc] != [c.get('id') for c in tc]:
        notes.append('tool_call_ids_changed')
    if [c['function']['arguments'] for c in oc] != [c.get('function', {}).get('arguments') for c in tc]:
        notes.append('arguments_reserialized')
    if ours.get('content') != theirs.get('content') and _content(ours) == _content(theirs):
        notes.append('content_null')
    return notes


def _edit_category(view: list, n: int, messages: list) -> str:
    """``'compaction'``: a shorter history that brings a user or system message the branch never had (a
    summary); else ``'history_edited'`` (edited or reordered tool results, a removed turn, a changed message)."""
    if len(messages) < len(view):
        seen = {(v.get('role'), _text_key(v)) for v, _ in view}
        if any((m['role'], _text_key(m)) not in seen for m in messages[n:] if m['role'] in ('user', 'system',
                                                                                             'developer')):
            return 'compaction'
    return 'history_edited'


def match(view: list, messages: list, family, seen: tuple = ([], [])) -> tuple:
    """``(n, variants, notes)``: how many view entries ``messages`` repeats in substance, the echo notes
    ``[(Turn, [note])]``, and the per-entry notes (None for non-turn entries). ``family``: the model
    family (it reads reasoning a harness inlined in an echo).

    ``seen`` = ``(messages, notes)`` of an earlier request that matched this view: an entry equal
    to the one seen there matched then and gets the same notes without comparing again (the
    request's prefix is repeated verbatim by most harnesses, so a call costs O(1) comparisons
    of substance, not O(turns)).
    """
    old, old_notes = seen
    m = min(len(old), len(view), len(messages))
    while m and old[:m] != messages[:m]:            # one C-level comparison in the common case
        m //= 2
    per = list(old_notes[:m])
    variants = [(view[i][1], per[i]) for i in range(m) if per[i]]
    for i in range(m, len(view)):
        v, turn = view[i]
        if i >= len(messages):
            return i, variants, per
        if turn is not None:
            notes = _echo_notes(v, messages[i], family)
            if notes is None:
                return i, variants, per
        elif not _same(v, messages[i]):
            return i, variants, per
        else:
            notes = None
        per.append(notes)
        if turn is not None and notes:
            variants.append((turn, notes))
    return len(view), variants, per


def _common(a: list, b: list) -> int:
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


class Session:
    """One episode of a harness: its identity, branches, calls, forks and end state.

    Args:
        sid: the session id (a digest of its capability token; the token itself is never stored).
        identity: ``{'group_id', 'rollout_id', 'task'}`` given at creation.
        created: creation time (epoch seconds).
    """

    def __init__(self, sid: str, identity: dict, created: float | None = None):
        self.sid, self.identity = sid, dict(identity)
        self.created = self.last_seen = created if created is not None else time.time()
        self.branches: list[Branch] = []
        self.calls: list[dict] = []        # per call: branch, digest, retry, response, spec, seed, delivered
        self.undelivered: set[int] = set()  # calls whose turn the client never received (until echoed)
        self.forks: list[dict] = []
        self._turns: dict[int, Turn] = {}    # call index -> its turn (turn_of without a walk)
        self.state = 'open'                # open | finished | committed
        self.reward, self.info, self.aborted = 0.0, {}, False
        self.out_tokens = 0
        self.in_flight = 0
        self.spec = None
        self.template_kwargs = None        # the template options of the first call (request_options)
        self.last_messages: list = []      # the messages of the latest call (the journal stores calls as deltas)
        self.checked: tuple | None = None  # (raw, checked) messages of the latest parsed request (parse_request)
        self.images: dict = {}             # digest -> bytes of the images its calls received (stored at commit)

    # ------------------------------------------------------------------ planning
    def plan(self, messages: list, tools_key: str, template, family) -> Plan:
        """Decide which branch ``messages`` extends, or the fork it makes; compute the prompt ids.

        ``family``: the model family (:func:`agentrl.families.family_for`), which reads echoed reasoning.

        Raises:
            ValueError: the template cannot render or bridge the messages (the message says why).
        """
        cands = []
        for b in self.branches:
            view = b.view()
            n, var, per = match(view, messages, family, b.seen)
            cands.append((n, var, per, b, len(view)))
        ext = [(n, b.index, var, per, b) for n, var, per, b, size in cands
               if n == size and b.tools_key == tools_key and len(messages) > n
               and all(m['role'] != 'assistant' for m in messages[n:])]
        if ext:
            n, _, var, per, b = max(ext, key=lambda x: x[:2])
            tail = messages[n:]
            prompt = b.recorder.add_messages(tail)
            b.steps.append(('msgs', tail))
            return Plan(b, prompt, False, variants=var, seen=(messages, per + [None] * len(tail)))
        if self.branches and all(b.tools_key != tools_key and not _same(b.opening[0], messages[0])
                                 for b in self.branches):
            return self._fork(None, 0, [], [], messages, tools_key, template)     # another conversation
        pool = [(n, b.index, var, per, b) for n, var, per, b, _ in cands if b.tools_key == tools_key] or \
            [(n, b.index, var, per, b) for n, var, per, b, _ in cands]
        if not pool:
            return self._fork(None, 0, [], [], messages, tools_key, template)
        n, _, var, per, b = max(pool, key=lambda x: x[:2])
        return self._fork(b, n, var, per, messages, tools_key, template)

    def _fork(self, parent, n, variants, per, messages, tools_key, template) -> Plan:
        index = len(self.branches)
        if parent is None:
            b = Branch(index, template, tools_key, messages)
            return Plan(b, b.recorder.prompt_ids, True, seen=(messages, [None] * len(messages)))
        view = parent.view()
        matched = [i for i, (_, t) in enumerate(view[:n]) if t is not None] if parent.tools_key == tools_key else []
        tail = messages[matched[-1] + 1:] if matched else None
        if tail is not None and all(m['role'] != 'assistant' for m in tail):
            k, seen = 0, 0                     # the step index of the last matching turn
            for k, (kind, _) in enumerate(parent.steps):
                seen += kind == 'turn'
                if seen == len(matched):
                    break
            b = Branch(index, template, tools_key, parent.opening, parent.steps[:k + 1] + [('msgs', tail)])
            seen = (messages, per[:matched[-1] + 1] + [None] * len(tail))
            category = 'retry' if n == len(messages) and n < len(view) and view[n][1] is not None \
                else _edit_category(view, n, messages)
        else:
            b = Branch(index, template, tools_key, messages)
            seen = (messages, [None] * len(messages))
            category = 'retry' if (parent.tools_key == tools_key and n == len(messages) and n < len(view)
                                   and view[n][1] is not None) else self._root_category(parent, view, n, messages,
                                                                                         tools_key)
            variants = []
        prompt = b.recorder.prompt_ids
        offset = _common(parent.recorder.prompt_ids, prompt)
        shared = sum(len(t.ids) for t in b.turns)       # replayed parent turns, trained in both rows
        fork = {'branch': index, 'parent': parent.index, 'message_index': n, 'token_offset': offset,
                'category': category, 'sampled_left_untrained': parent.sampled_after(offset),
                'shared_sampled_tokens': shared, 'call': len(self.calls)}
        b.fork, b.root = fork, parent.root
        return Plan(b, prompt, True, fork=fork, variants=variants, seen=seen)

    @staticmethod
    def _root_category(parent, view, n, messages, tools_key) -> str:
        if parent.tools_key != tools_key:
            return 'tools_changed'
        first, theirs = view[0][0], messages[0]
        if n == 0 and first['role'] == 'system' and theirs['role'] == 'system':
            same_user = len(view) > 1 and len(messages) > 1 and _same(view[1][0], messages[1])
            return 'system_prompt_changed' if same_user else 'subagent'
        return _edit_category(view, n, messages) if n < len(messages) else 'other'

    # ------------------------------------------------------------------ committing
    def commit(self, plan: Plan, sample, message: dict, call: dict) -> Turn:
        """Add the sampled turn to the plan's branch (attaching a new branch) and note the call.

        Args:
            plan: from :meth:`plan`. sample: the engine's :class:`~agentrl.engines.contract.TurnResult`.
            message: the returned assistant message. call: the call's journal fields (digest, ...).
        """
        b = plan.branch
        turn = Turn(call=len(self.calls), ids=list(sample.ids), logp=list(sample.logp), message=message,
                    truncated=bool(sample.truncated), start=len(plan.prompt_ids))
        b.recorder.add_turn(turn.ids, turn.logp, message=turn.record_message())
        b.steps.append(('turn', turn))
        self._turns[turn.call] = turn
        b.seen = plan.seen
        if self.undelivered:               # (a set, so a call costs no walk over the branch's turns)
            for t in b.turns:              # echoed back (or replayed from): the client had them
                if not t.delivered:
                    t.delivered = True
                    self.calls[t.call]['delivered'] = True
                    self.undelivered.discard(t.call)
        if plan.new:
            self.branches.append(b)
            if plan.fork is not None:
                self.forks.append(plan.fork)
        for t, notes in plan.variants:
            t.variants.append({'call': turn.call, 'notes': notes})
        self.calls.append(dict(call, branch=b.index, delivered=True))
        self.out_tokens += len(turn.ids)
        return turn

    def abandon(self, plan: Plan) -> None:
        """Undo a plan whose sampling failed (an extended branch is rebuilt from its steps)."""
        if not plan.new:
            plan.branch.steps.pop()
            plan.branch.build()

    def turn_of(self, call: int) -> Turn | None:
        """The turn a call sampled (a fork that replays it shares the same :class:`Turn`)."""
        return self._turns.get(call)

    def mark_undelivered(self, call: int) -> None:
        """The client never received call ``call``'s response (or not yet: the gateway marks a call so until
        every byte of its response was handed over)."""
        self._mark(call, False)

    def mark_delivered(self, call: int) -> None:
        """Every byte of call ``call``'s response was handed to the client: its turn is trained."""
        self._mark(call, True)

    def _mark(self, call: int, delivered: bool) -> None:
        t = self.turn_of(call)
        if t is not None:
            t.delivered = delivered
        (self.undelivered.discard if delivered or t is None else self.undelivered.add)(call)
        if 0 <= call < len(self.calls):
            self.calls[call]['delivered'] = delivered

    def describe(self) -> dict:
        """The state ``GET /sessions/{token}`` reports."""
        return {'session': self.sid, 'state': self.state, 'identity': self.identity, 'calls': len(self.calls),
                'branches': len(self.branches), 'forks': self.forks, 'sampled_tokens': self.out_tokens,
                'aborted': self.aborted, 'reward': self.reward if self.state != 'open' else None}


def extends(b, n, tools_key, messages) -> bool:
    """Whether ``messages`` extends branch ``b`` whose view it repeats for ``n`` entries."""
    return (b.tools_key == tools_key and n == len(b.view()) and len(messages) > n
            and all(m['role'] != 'assistant' for m in messages[n:]))
