"""L2: what a model family is: a reply parser with per-call status and spans, stops and ends of turn.

A :class:`Family` answers, for one family of chat formats, the questions the template cannot:
how a sampled reply splits into reasoning, content and tool calls, and which ids end a turn of
each kind. Everything the template can tell (its end-of-turn token, its stop ids, its bridges)
is asked of the template (:class:`~agentrl.templates.ChatTemplate`, duck-typed here: ``stop_ids``,
``end_of_turn_id``, ``decode``, ``source``), so a family module holds only what differs.

A subclass sets :attr:`Family.name`, :attr:`Family.markers`, the reasoning marks and the call
marks, and implements :meth:`Family.find_calls`; the rest (reasoning split, token spans, the
streaming parser, the strict one-call reader) is shared. docs/design.md#families lists what a
family module provides.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from .spans import TokenSpans
from .stream import StreamParser, held_suffix

__all__ = ['CALL_STATUSES', 'OK', 'INVALID_JSON', 'UNCLOSED_BLOCK', 'MISSING_NAME', 'UNKNOWN_TOOL', 'IN_REASONING',
           'TURN_KINDS', 'ToolCall', 'Reply', 'TurnEnd', 'Family']

OK, INVALID_JSON, UNCLOSED_BLOCK, MISSING_NAME, UNKNOWN_TOOL = \
    'ok', 'invalid_json', 'unclosed_block', 'missing_name', 'unknown_tool'
#: What a parsed call can be: ``ok``; ``invalid_json`` (the block is not a JSON object, or its
#: arguments are not an object); ``unclosed_block`` (the block opens and the reply ends);
#: ``missing_name`` (no string ``name``); ``unknown_tool`` (a name outside the request's tools);
#: ``in_reasoning`` (a block inside the reasoning: never a call, :meth:`Family.reasoning_calls`).
IN_REASONING = 'in_reasoning'
CALL_STATUSES = (OK, INVALID_JSON, UNCLOSED_BLOCK, MISSING_NAME, UNKNOWN_TOOL, IN_REASONING)
#: The kinds of assistant turn whose end a family names: a final answer, a turn that calls tools.
TURN_KINDS = ('answer', 'tool_call')


@dataclass(frozen=True)
class ToolCall:
    """One tool-call block of a reply.

    Attributes:
        name: the function name (None when the block has none). arguments: the arguments object
            (None unless the block parsed). status: one of :data:`CALL_STATUSES`.
        text: the block verbatim, its open and close marks included.
        chars: ``(start, end)`` character span of ``text`` in the parsed reply text.
        tokens: ``(start, end)`` span in the reply's ids (``ids[start:end]`` decodes to a text that
            covers ``text``); None when the reply was parsed from text alone.
        id: the call's own id when the format writes one (Kimi K2's ``functions.NAME:IDX``, which the
            template renders back in history and tool results); None when the format has none.
    """
    name: str | None
    arguments: dict | None
    status: str
    text: str
    chars: tuple
    tokens: tuple | None = None
    id: str | None = None


@dataclass(frozen=True)
class Reply:
    """A sampled assistant turn, parsed.

    Attributes:
        content: the text that is neither reasoning nor an ``ok`` call (a malformed block stays in
            it verbatim); '' when there is none. reasoning: the reasoning text, or None when the
            reply holds no reasoning block. calls: every call block in order, ``ok`` or not.
        text: the text that was parsed.
    """
    content: str
    reasoning: str | None
    calls: tuple = ()
    text: str = ''

    @property
    def ok_calls(self) -> tuple:
        """The calls whose status is ``ok`` (what a harness is given)."""
        return tuple(c for c in self.calls if c.status == OK)


@dataclass(frozen=True)
class TurnEnd:
    """How a turn of one kind ends.

    Attributes:
        stop_ids: the ids that end such a turn when sampled (``frozenset[int]``).
        end_of_turn: the id the template writes after such a turn in history, or None when it writes
            none (then any stop id ends the turn and the next message's header follows).
    """
    stop_ids: frozenset
    end_of_turn: int | None


class Family:
    """One family of reply formats (subclass it; see the module docstring).

    Attributes:
        name: the registry name (``'qwen3'``). markers: strings that all occur in a template's source
            or special tokens of this family (the registry picks the family with the most matching).
        think_open, think_close: the reasoning marks (None: the family has no reasoning block).
        call_open, call_close: the tool-call block marks (None: the family parses no calls).
        parses_tools: whether :meth:`find_calls` finds calls (False for the generic family).
    """
    name = ''
    markers: tuple = ()
    think_open: str | None = None
    think_close: str | None = None
    call_open: str | None = None
    call_close: str | None = None

    @property
    def parses_tools(self) -> bool:
        return self.call_open is not None

    def __repr__(self) -> str:
        return f'<family {self.name}>'

    def for_tools(self, tools) -> 'Family':
        """The family that parses a reply to a request with ``tools`` (OpenAI function tools, or None).

        Itself, unless its call values are typed by the tools' JSON schemas (then a copy that knows
        them: Qwen3-Coder's XML parameters). Callers that parse a request's reply ask this first.
        """
        return self

    # ------------------------------------------------------------------ what a module implements
    def find_calls(self, body: str, offset: int = 0, tool_names=None) -> list:
        """Every call block in ``body`` (the reply after its reasoning), in order.

        Args:
            body: the text to scan. offset: where ``body`` starts in the parsed text (spans are
                given in the parsed text). tool_names: the request's tool names, or None to accept
                any name.

        Returns:
            ``[ToolCall]``, a block left open last (``unclosed_block``).
        """
        return []

    def block_calls(self, body: str, offset: int, pattern, parse) -> list:
        """:meth:`find_calls` of a format whose calls are delimited blocks (``pattern``, a compiled regex
        whose group 1 is the block's inside; a block opened by :attr:`call_open` and never closed is
        ``unclosed_block``). ``parse(inside) -> (status, name, arguments)`` reads one block."""
        out, pos = [], 0
        for m in pattern.finditer(body):
            status, name, args = parse(m.group(1))
            out.append(ToolCall(name, args, status, m.group(0), (offset + m.start(), offset + m.end())))
            pos = m.end()
        k = body.find(self.call_open, pos)
        if k >= 0:
            out.append(ToolCall(None, None, UNCLOSED_BLOCK, body[k:], (offset + k, offset + len(body))))
        return out
    def call_grammar(self, tools, choice: str, stop_ids=()):
        """The grammar of a turn that must call a tool in this family's format (``tool_choice`` required / named).

        Args:
            tools: OpenAI function tools (non-empty). choice: ``'required'`` (one or more calls of any of
                them) or a tool's name (exactly one call of it). stop_ids: the ids the turn ends on.

        Returns:
            :class:`~agentrl.constraints.Constraint` (kind ``tool_call``) starting at the turn's first token;
            the caller sets ``start_after`` when the turn may reason first.

        Raises:
            NotImplementedError: the family's call format has no grammar here (names the family).
        """
        raise NotImplementedError(f'the {self.name} family has no tool-call grammar here (only Hermes JSON '
                                  'calls, the qwen3 family, are constrained)')

    # ------------------------------------------------------------------ stops and ends of turn
    def turn_end(self, template, kind: str = 'answer') -> TurnEnd:
        """How a turn of ``kind`` (one of :data:`TURN_KINDS`) ends: the template's own stops and end of turn.

        Raises:
            ValueError: ``kind`` outside :data:`TURN_KINDS`.
        """
        if kind not in TURN_KINDS:
            raise ValueError(f'kind={kind!r}; use one of {TURN_KINDS}')
        return TurnEnd(self.stop_ids(template), template.end_of_turn_id)

    def stop_ids(self, template) -> frozenset:
        """Every id an engine stops a turn at, over all turn kinds (``frozenset[int]``): the template's.

        A family whose turn kinds end at other ids (a tool-call stop besides the answer's) returns
        their union here and each kind's own in :meth:`turn_end`.
        """
        ids = template.stop_ids
        return ids if isinstance(ids, frozenset) else frozenset(ids)

    def prompt_opens_reasoning(self, template, prompt_ids) -> bool:
        """Whether the prompt ends inside an open reasoning block (the template wrote its open mark)."""
        if self.think_open is None:
            return False
        tail = template.decode(list(prompt_ids[-4:])).rstrip('\n')
        return tail.endswith(self.think_open)

    # ------------------------------------------------------------------ parsing (shared)
    def split_reasoning(self, text: str, think_open: bool | None = None) -> tuple:
        """``(reasoning or None, body)``; ``body`` is always a suffix of ``text``.

        ``think_open`` None: a leading reasoning block, or the text before a lone close mark, is
        reasoning, and an unclosed block is content. True: the prompt opened the block, so the text
        is reasoning up to the first close mark. False: only a leading block is reasoning. With a
        bool, a block never closed is all reasoning (the turn was cut in it), and the body loses its
        leading newlines. Reasoning is stripped of newlines.
        """
        op, cl = self.think_open, self.think_close
        if op is None:
            return None, text
        if think_open is None:
            head = text.lstrip()
            if head.startswith(op) and cl in head:
                inner, rest = head[len(op):].split(cl, 1)
                return inner.strip('\n'), rest.lstrip('\n')
            if cl in text and op not in text:
                inner, rest = text.split(cl, 1)
                return inner.strip('\n'), rest.lstrip('\n')
            return None, text
        if think_open:
            inner = text
        else:
            head = text.lstrip()
            if not head.startswith(op):
                return None, text
            inner = head[len(op):]
        if cl in inner:
            r, rest = inner.split(cl, 1)
            return r.strip('\n'), rest.lstrip('\n')
        return inner.strip('\n'), ''

    def parse_text(self, text: str, *, think_open: bool | None = None, tools: bool = True,
                   tool_names=None) -> Reply:
        """Parse a decoded reply (its stop token already removed).

        Args:
            text: the reply text. think_open: see :meth:`split_reasoning` (the gateway passes
                whether the prompt opened a reasoning block). tools: parse call blocks (False: they
                stay content). tool_names: the request's tool names (a call outside them is
                ``unknown_tool``), or None.

        Returns:
            :class:`Reply` with char spans; ``content`` is the body less its ``ok`` blocks, with
            leading newlines dropped when ``think_open`` is a bool and outer newlines dropped when
            it holds an ``ok`` call.
        """
        reasoning, body = self.split_reasoning(text, think_open)
        at = len(text) - len(body)
        calls = self.find_calls(body, at, tool_names) if tools else []
        rest = _without(body, calls, at)
        if think_open is not None:
            rest = rest.lstrip('\n')
        if any(c.status == OK for c in calls):
            rest = rest.strip('\n')
        return Reply(rest, reasoning, tuple(calls), text)

    def parse(self, ids, template, *, think_open: bool | None = None, tools: bool = True,
              tool_names=None) -> Reply:
        """Parse a reply from its sampled ids: :meth:`parse_text` of the decoded ids, with token spans.

        Args:
            ids: ``[n]`` the reply's ids; a last id in the family's stop ids is not part of the text.
            template: the chat template (``decode``, ``stop_ids``). Other args: :meth:`parse_text`.

        Returns:
            :class:`Reply` whose calls carry ``tokens``: the smallest ``(start, end)`` with
            ``decode(ids[start:end])`` covering the block.
        """
        ids = [int(i) for i in ids]
        n = len(ids) - 1 if ids and ids[-1] in self.stop_ids(template) else len(ids)
        text = template.decode(ids[:n])
        reply = self.parse_text(text, think_open=think_open, tools=tools, tool_names=tool_names)
        if not reply.calls:
            return reply
        ends = TokenSpans(template, ids[:n], text)
        calls = tuple(replace(c, tokens=(ends.first_token(c.chars[0]), ends.last_token(c.chars[1])))
                      for c in reply.calls)
        return Reply(reply.content, reply.reasoning, calls, text)

    def reasoning_calls(self, reply: Reply, think_open: bool | None = None) -> list:
        """The call blocks written inside ``reply``'s reasoning, each with status ``in_reasoning``.

        They are never calls (:meth:`parse_text` reads calls after the reasoning only); a trainer may
        still want to count or mask them. ``think_open`` is the one ``reply`` was parsed with.

        Returns:
            ``[ToolCall]`` with character spans in ``reply.text`` (no token spans); ``[]`` when the
            reply has no reasoning or the family parses no calls.
        """
        r = reply.reasoning
        if not r or self.call_open is None or self.call_open not in r:
            return []
        text, base = reply.text, 0
        if not think_open:                            # after the open mark, else from the start (a lone close)
            head = text.lstrip()
            if head.startswith(self.think_open):
                base = len(text) - len(head) + len(self.think_open)
        at = text.find(r, base)                       # reasoning is the block stripped of newlines only
        if at < 0:
            return []
        return [ToolCall(c.name, c.arguments, IN_REASONING, c.text, c.chars) for c in self.find_calls(r, at)]

    def strict_calls(self, text: str) -> list | None:
        """The calls of a reply that must hold only well-formed calls (a gym step), or None.

        Only the text after the last reasoning close mark is read (calls inside reasoning do not
        count). None when a block is not ``ok`` or an open or close mark stands outside a block.

        Returns:
            ``[ToolCall]`` (every one ``ok``; ``[]`` when the reply calls nothing), or None.
        """
        body = text.rsplit(self.think_close, 1)[-1] if self.think_close else text
        calls = self.find_calls(body, len(text) - len(body))
        if any(c.status != OK for c in calls):
            return None
        if self.call_open is not None and (body.count(self.call_open) != len(calls)
                                           or body.count(self.call_close) != len(calls)):
            return None
        return calls

    def ok_calls_and_rest(self, text: str) -> tuple | None:
        """``(calls, rest)`` of a reply's text after its last reasoning close mark: the calls, every one ``ok``,
        and that text with each call's span cut out (where a family looks for stray marks); None when a call is
        not ``ok``. For families whose block holds several calls (:meth:`strict_calls` of sections, LFM2)."""
        body = text.rsplit(self.think_close, 1)[-1] if self.think_close else text
        at = len(text) - len(body)
        calls = self.find_calls(body, at)
        if any(c.status != OK for c in calls):
            return None
        rest = body
        for c in reversed(calls):
            rest = rest[:c.chars[0] - at] + rest[c.chars[1] - at:]
        return calls, rest

    # ------------------------------------------------------------------ streaming (shared)
    def stable_parts(self, text: str, think_open: bool, tools: bool) -> tuple:
        """``(reasoning, content, ok calls)`` of a reply so far that no continuation changes.

        Each is a prefix of the same field of :meth:`parse_text` (with the same ``think_open`` and
        ``tools``) of every continuation: ``reasoning`` None while it is unknown whether there is
        any; held back are a tail that could begin a mark, an open call block, trailing newlines.
        """
        op, cl = self.think_open, self.think_close
        if op is not None and not think_open:
            head = text.lstrip()
            if not head.startswith(op) and op.startswith(head):
                return None, '', []                       # '' or '<thi': reasoning or not is still open
        reasoning, body = self.split_reasoning(text, think_open)
        if reasoning is not None:
            inner = text if think_open else text.lstrip()[len(op):]
            if cl not in inner:
                inner = inner[:len(inner) - held_suffix(inner, cl)]
                return inner.lstrip('\n').rstrip('\n'), '', []
        if not tools or self.call_open is None:
            return reasoning, body.lstrip('\n'), []
        at = len(text) - len(body)
        calls = self.find_calls(body, at)
        if calls and calls[-1].status == UNCLOSED_BLOCK:
            safe = body[:calls[-1].chars[0] - at]         # an open block: its JSON is not closed yet
        else:
            safe = body[:len(body) - held_suffix(body, self.call_open)]
        calls = self.find_calls(safe, at)
        kept = _without(safe, calls, at)
        return reasoning, kept.lstrip('\n').rstrip('\n'), [c for c in calls if c.status == OK]

    def stream(self, think_open: bool, tools: bool = True) -> 'StreamParser':
        """A :class:`StreamParser` for one reply."""
        return StreamParser(self, think_open, tools)


def _without(body: str, calls, at: int) -> str:
    """``body`` (at char ``at`` of the parsed text) less the blocks of its ``ok`` calls."""
    kept, pos = [], 0
    for c in calls:
        if c.status == OK:
            kept.append(body[pos:c.chars[0] - at])
            pos = c.chars[1] - at
    kept.append(body[pos:])
    return ''.join(kept)
