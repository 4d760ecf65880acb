"""L2: how a chat template bridges sampled turns: the bridge text, its reusable shape, stability probes.

A **bridge** is what the template writes between the end of a sampled turn and the next
generation prompt (role headers, tool-result wrappers, the generation prompt, plus the tool or
user content inside). It is found by rendering the template, so it works for any family; its
tokens' owners follow docs/design.md#ownership. :class:`~agentrl.templates.ChatRecorder` appends them.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field

from .chat import ChatTemplate
from .labels import Region, owners_from_regions
from .messages import common_prefix, diff_span, owner_of_role

__all__ = ['Bridge', 'template_bridge', 'next_stop', 'bridge_shape', 'cached_bridge', 'probe_turn', 'probe_turn_text',
           'probe_stability', 'rendered_turn', 'turn_kind', 'probe_message', 'REASONING_STATES']

_PROBE_TOOL = 'Probe result.'
_PROBE_USER = 'Probe question.'
_PROBE_CALL = {'id': 'functions.probe:0', 'type': 'function', 'function': {'name': 'probe', 'arguments': {}}}
#: What a turn holds as reasoning, as :func:`turn_kind` tells it: no ``reasoning_content`` field, an empty one,
#: a non-empty one (a template may keep an empty think block in history, or drop it: Qwen3 drops it).
REASONING_STATES = ('none', 'empty', 'text')
#: Where a message's reasoning may be (transformers fills each from the others when it renders).
_REASONING_KEYS = ('reasoning_content', 'thinking', 'reasoning')


@dataclass
class Bridge:
    """The template's tokens between a sampled turn's end and the next generation prompt.

    Attributes:
        text: the bridge text; for Qwen3 after a tool call
            ``'\\n<|im_start|>user\\n<tool_response>\\n...\\n</tool_response><|im_end|>\\n<|im_start|>assistant\\n'``.
        ids: ``[n]`` token ids of ``text``.
        owner: ``[n]`` :data:`agentrl.record.OWNER` codes (template, prompt or tool).
        stop: the end-of-turn text the sampled stop token stands for ('' when the turn was cut
            off, in which case the template's end-of-turn text is part of the bridge).
        regions: character spans of the new messages' content inside ``text``.
        rewrite: the control text the template writes in history where the turn sampled its stop
            (gpt-oss ``'<|end|>'`` after an answer that stopped at ``<|return|>``), '' when it writes
            the sampled stop itself; the next turn's context then has ``rewrite`` in place of the
            sampled stop id (docs/design.md#stops).
    """
    text: str
    ids: list
    owner: list
    stop: str = ''
    regions: list = field(default_factory=list)
    rewrite: str = ''


def template_bridge(template: ChatTemplate, history: list, new_messages: list, terminated: bool = True,
                    add_generation_prompt: bool = True, turn: dict | None = None,
                    sampled_stop: str | None = None) -> Bridge:
    """Derive the bridge after the last assistant turn by rendering the template.

    The last assistant turn is the turn's real message (``turn``, e.g. with ``tool_calls``) with
    its content replaced by a sentinel ``S``; the conversation ``history + [turn] + new_messages``
    is rendered with the generation prompt, and the bridge is the text after the turn's
    end-of-turn token (what the template renders after ``S`` up to there, such as tool calls, was
    sampled by the policy).

    Args:
        template: the :class:`ChatTemplate`.
        history: messages before the sampled turn (the sampled turn itself excluded).
        new_messages: tool results and/or user messages that follow the turn (non-empty).
        terminated: the turn ended with the template's end-of-turn token; if not (cut off, or
            stopped at another stop token), the end-of-turn text becomes part of the
            (template-owned) bridge.
        add_generation_prompt: end the bridge with the next generation prompt.
        turn: the sampled turn as a message (``role`` assistant, ``tool_calls`` ...); default a
            plain assistant message. Templates that read the previous turn's tool calls when they
            render a tool result need it.
        sampled_stop: the text of the stop token the turn was sampled with (None: whichever the
            template writes there). It matters where the template writes no end-of-turn (GLM): the
            turn's rendering (its content, then the tool calls the policy sampled) ends where the
            template writes its next stop token, the next message's role token; when that is the
            sampled stop the bridge starts after it, otherwise (another stop, or a cut turn) the
            bridge starts with the template's token (template-owned) and ``stop`` is ''.

    Returns:
        :class:`Bridge`. For Qwen3 the engine stops at ``<|im_end|>`` and the template writes
        ``\\n`` after it, so a bridge after a terminated turn starts with that ``\\n``. For GLM a
        tool-call turn ends with the sampled ``<|observation|>`` and the bridge starts after it
        (``'\\n<tool_response>\\n...\\n</tool_response><|assistant|>'``): sampled text is never in a bridge.

    Raises:
        ValueError: the template does not render assistant content verbatim, or drops one of
            ``new_messages`` (the error names it).

    Source: book chapter 5.4 (token-in/token-out); the bridge rule is Hugging Face's rendering.
    """
    if not new_messages:
        raise ValueError('new_messages is empty: a bridge needs at least one tool or user message')
    s = template.sentinel(-1, avoid=''.join(str(m.get('content')) for m in new_messages))
    turn_msg = dict(turn or {'role': 'assistant'}, role='assistant', content=s)
    conv = list(history) + [turn_msg] + list(new_messages)
    try:
        text = template.render(conv, add_generation_prompt)
    except ValueError:
        if not any(k in turn_msg for k in _REASONING_KEYS):
            raise
        # gpt-oss refuses content beside reasoning in a call turn: the marker goes where the reasoning was
        turn_msg = {k: v for k, v in turn_msg.items() if k not in _REASONING_KEYS}
        conv[len(history)] = turn_msg
        text = template.render(conv, add_generation_prompt)
    j = text.rfind(s)
    if j >= 0 and text.count(s) == 1:
        after = j + len(s)
    else:
        after = _call_turn_end(template, conv[:len(history) + 1], text, add_generation_prompt)
        if after is None:
            raise ValueError('the chat template does not render assistant content verbatim (a marker put in '
                             '"content" did not come back once), so the bridge after a turn cannot be derived')
    ends = [(k, t) for t in getattr(template, 'end_texts', ()) for k in [text.find(t, after)] if k >= 0]
    rewrite = ''
    if ends:
        k, eot = min(ends)
        stop = eot if terminated else ''
        b0 = k + len(stop)
    else:
        if template.end_of_turn_text is not None:       # the end of turn is rewritten in history (gpt-oss)
            stop = template.leading_stop(text[after:]) if terminated else ''
            if terminated and not stop:
                rewrite = template.leading_control(text[after:])
            b0 = after + len(stop) + len(rewrite)
        else:                                             # no end of turn: the next role token stops (GLM)
            b0, stop = next_stop(template, text, after)
            if stop and b0 > after and b0 > _turn_end(template, text, conv[:len(history) + 1]):
                b0, stop = after, ''         # that stop is inside the new messages: the turn is followed by none
            if not terminated or (sampled_stop is not None and stop != sampled_stop):
                stop = ''
            b0 += len(stop)
    bridge = text[b0:]
    regions, cursor, base = [], 0, len(history) + 1
    for q, m in enumerate(new_messages):
        c = m.get('content')
        if isinstance(c, str) and not c:
            continue
        k = bridge.find(c, cursor) if isinstance(c, str) else -1
        if k >= 0 and bridge.find(c, k + 1) < 0:
            a, b = k, k + len(c)
        else:  # not verbatim or ambiguous: diff against a render with the content swapped out
            z = template.sentinel(q, avoid=text)
            other = template.render(conv[:base + q] + [dict(m, content=z)] + conv[base + q + 1:],
                                    add_generation_prompt)
            p, e, part = diff_span(text, other, z)
            if z not in part or p < b0:
                raise ValueError(f'new_messages[{q}] ({m.get("role")}) could not be located after the turn: '
                                 'the template drops it or rewrites earlier text when it is added')
            a, b = p - b0, e - b0
        regions.append(Region(a, b, owner_of_role(m['role']), q))
        cursor = b
    ids, offsets = template.encode_offsets(bridge, regions)
    owner, _ = owners_from_regions(offsets, regions, len(bridge))
    return Bridge(text=bridge, ids=ids, owner=owner, stop=stop, regions=regions, rewrite=rewrite)


def _call_turn_end(template: ChatTemplate, upto_turn: list, text: str, add_generation_prompt: bool) -> int | None:
    """Where a tool-call turn whose content the template does not write (Llama 3.1: the call JSON alone) ends in
    ``text``, before its end-of-turn text: the conversation up to the turn rendered alone is a prefix of ``text``.
    None for a turn without calls or a template that rewrites the turn once messages follow it."""
    if not upto_turn[-1].get('tool_calls'):
        return None
    try:
        alone = template.render(upto_turn, False)
    except ValueError:
        return None
    if not text.startswith(alone):
        return None
    end = next((t for t in _ends(template) if alone.endswith(t)), '')
    return len(alone) - len(end)


def _turn_end(template: ChatTemplate, text: str, upto_turn: list) -> int:
    """Where the rendering of the conversation up to the turn stops agreeing with ``text`` (its length if it raises)."""
    try:
        return common_prefix(text, template.render(upto_turn, False))
    except ValueError:
        return len(text)


def next_stop(template: ChatTemplate, text: str, start: int) -> tuple:
    """``(position, stop text)`` of the first stop text the template wrote in ``text`` at or after ``start``.

    Where a template writes no end-of-turn (GLM), this is where a sampled turn's rendering ends: the
    next message's role token, which the model samples as its stop. ``(start, '')`` when none follows.
    """
    hits = [(k, t) for k, t in ((text.find(t, start), t) for t in template.stop_texts) if k >= 0]
    return min(hits, key=lambda h: (h[0], -len(h[1]))) if hits else (start, '')


#: Content used to check that a template inserts message content verbatim (whitespace at both
#: ends, quotes, backslash, markup, braces, non-ASCII): if it comes back unchanged, a bridge's
#: shape can be reused with other contents.
_TRICKY = ' \n\t"quoted" \\ <tag> {"k": [1]} \u00e9\u00a0\U0001F600 end\n '


def _skeleton(m: dict) -> str:
    """A message without its content: role and the other non-empty fields (JSON)."""
    rest = sorted((k, v) for k, v in m.items() if k != 'content' and v not in (None, '', [], {}))
    return json.dumps([m.get('role'), rest], sort_keys=True, default=str, ensure_ascii=False)


def bridge_shape(template: ChatTemplate, history: list, new_messages: list, terminated: bool = True,
                 turn: dict | None = None, sampled_stop: str | None = None):
    """The bridge as template text with one slot per new message's content, or None.

    Renders the bridge with sentinels as contents, then checks with awkward contents (whitespace at
    both ends, quotes, backslash, markup, non-ASCII) that the template inserts content verbatim.

    Returns:
        ``(parts, stop, rewrite)``: ``parts`` is the bridge text split at the slots (``len(new) + 1``
        strings), ``stop`` and ``rewrite`` as :class:`Bridge`'s; None when a content is not a string or the template transforms content (then
        each bridge must be rendered).

    Args: as :func:`template_bridge`.

    Raises:
        ValueError: as :func:`template_bridge` (a message the template drops).

    Source: Hugging Face ``apply_chat_template`` (rendered twice per shape).
    """
    if any(not isinstance(m.get('content'), str) for m in new_messages):
        return None
    avoid = ''.join(m['content'] for m in new_messages)
    zs = [template.sentinel(1000 + q, avoid=avoid) for q in range(len(new_messages))]
    b = template_bridge(template, history, [dict(m, content=z) for m, z in zip(new_messages, zs)], terminated,
                        turn=turn, sampled_stop=sampled_stop)
    parts, rest = [], b.text
    for z in zs:
        if rest.count(z) != 1:
            return None
        head, rest = rest.split(z)
        parts.append(head)
    parts.append(rest)
    tricky = [_TRICKY.replace('end', f'end{q}') for q in range(len(new_messages))]
    t = template_bridge(template, history, [dict(m, content=c) for m, c in zip(new_messages, tricky)], terminated,
                        turn=turn, sampled_stop=sampled_stop)
    if t.text != _fill(parts, tricky)[0]:
        return None
    return parts, b.stop, b.rewrite


def _fill(parts: list, contents: list) -> tuple:
    """Bridge text from its shape and the contents, with the content spans ``[(start, end)]``."""
    out, spans, pos = [parts[0]], [], len(parts[0])
    for c, tail in zip(contents, parts[1:]):
        spans.append((pos, pos + len(c)))
        out += [c, tail]
        pos += len(c) + len(tail)
    return ''.join(out), spans


def cached_bridge(template: ChatTemplate, history: list, turn: dict, new_messages: list,
                  terminated: bool = True, sampled_stop: str | None = None) -> Bridge:
    """:func:`template_bridge`, reusing the bridge's shape (:func:`bridge_shape`) when only the contents changed.

    Shapes are kept in the template's own cache (cleared past 512 entries), keyed by the messages
    without their contents. A shape that cannot be reused (content that is not a string, or a
    template that transforms content) falls back to :func:`template_bridge`.

    Args: as :func:`template_bridge` (``turn`` the sampled turn's message).

    Raises:
        ValueError: as :func:`template_bridge`.
    """
    cache = template._cache
    key = ('bridge', tuple(_skeleton(m) for m in history), _skeleton(turn),
           tuple(_skeleton(m) for m in new_messages), terminated, sampled_stop)
    if key not in cache:
        if len(cache) > 512:
            cache.clear()
        cache[key] = bridge_shape(template, history, new_messages, terminated, turn=turn, sampled_stop=sampled_stop)
    shape = cache[key]
    if shape is None:
        return template_bridge(template, history, new_messages, terminated, turn=turn, sampled_stop=sampled_stop)
    parts, stop, rewrite = shape
    text, spans = _fill(parts, [m['content'] for m in new_messages])
    regions = [Region(a, b, owner_of_role(m['role']), q)
               for q, (m, (a, b)) in enumerate(zip(new_messages, spans)) if b > a]
    ids, offsets = template.encode_offsets(text, regions)
    owner, _ = owners_from_regions(offsets, regions, len(text))
    return Bridge(text=text, ids=ids, owner=owner, stop=stop, regions=regions, rewrite=rewrite)


def rendered_turn(template: ChatTemplate, history: list, message: dict) -> tuple | None:
    """What the template writes for the assistant ``message`` after ``history``'s generation prompt.

    The turn is rendered last, without the generation prompt, and the text after the generation
    prompt is kept up to and including the first stop text (all of it when none follows). Tried in
    order: the message as is, then without ``reasoning_content`` (a generation prompt that closed
    the reasoning block, Qwen3's ``enable_thinking=False``), each as a continuation of the context;
    then, for a template that rewrites earlier turns once this one is rendered (Kimi K2 drops
    earlier reasoning when a final answer is rendered), the text after the last occurrence of the
    generation prompt.

    Args:
        template: the :class:`ChatTemplate`. history: messages before the turn (ending with a user,
            tool or system message). message: the assistant turn (``content``, ``reasoning_content``,
            ``tool_calls`` ...).

    Returns:
        ``(text, how)``: ``how`` is ``'verbatim'``, ``'without_reasoning'`` or ``'rewrites_history'``
        (the render of the turn changes the text before the generation prompt); None when the
        template writes the turn after no copy of its own generation prompt (it cannot be served
        token-in/token-out).

    Raises:
        ValueError: the template cannot render the messages.

    Source: the template itself; docs/design.md#templates (history rewrites, per-turn contexts).
    """
    ctx = template.render(history, True)
    head = template.render(history, False)
    gen = ctx[len(head):] if ctx.startswith(head) else ''
    plain = {k: v for k, v in message.items() if k != 'reasoning_content'}
    tries = [message] if plain == message else [message, plain]
    fulls = [template.render(history + [m], False) for m in tries]
    for m, full in zip(tries, fulls):
        if full.startswith(ctx):
            return _to_stop(template, full[len(ctx):]), 'verbatim' if m is message else 'without_reasoning'
    for full in fulls:
        k = full.rfind(gen) if gen else -1
        if k >= 0:
            return _to_stop(template, full[k + len(gen):]), 'rewrites_history'
    return None


def _ends(template: ChatTemplate) -> tuple:
    """The texts a turn ends at: the template's ends of turn (``end_texts``, gpt-oss ``<|call|>``) and stop texts."""
    return tuple(getattr(template, 'end_texts', ())) + tuple(template.stop_texts)


def _to_stop(template: ChatTemplate, rest: str) -> str:
    """``rest`` up to and including its first end or stop text (all of it when none occurs)."""
    hits = [(rest.find(t), -len(t), t) for t in _ends(template) if rest.find(t) >= 0]
    if not hits:
        return rest
    pos, _, t = min(hits)
    return rest[:pos + len(t)]


def turn_kind(template: ChatTemplate, message: dict) -> tuple:
    """The kind of an assistant turn, as far as a template's history rendering can depend on it.

    Returns:
        ``(call, reasoning, shape)``: ``call`` is ``'tool_call'`` when the message has ``tool_calls``,
        else ``'answer'``; ``reasoning`` one of :data:`REASONING_STATES`; ``shape`` the content with
        every run of text between control tokens replaced by None and whitespace-only runs kept (so a
        decoded turn ``'<think>\\n\\n</think>\\n\\nDone.'`` with an empty think block differs from one with
        reasoning: ``('<think>', '\\n\\n', '</think>', '\\n\\n', None)`` for Qwen3).

    Source: Qwen3's template keeps a think block in history only when the reasoning is non-empty;
    docs/design.md#templates.
    """
    r = message.get('reasoning_content')
    state = 'none' if r is None else ('empty' if not str(r).strip() else 'text')
    content = message.get('content')
    content = content if isinstance(content, str) else ''
    ctl = template._control_re
    parts, pos = [], 0
    for hit in (ctl.finditer(content) if ctl is not None else ()):
        parts += [content[pos:hit.start()], hit.group(0)]
        pos = hit.end()
    parts.append(content[pos:])
    shape = []
    for q, part in enumerate(parts):
        if q % 2:
            shape.append(part)
        elif part:
            shape.append(part if not part.strip() else None)
    return ('tool_call' if message.get('tool_calls') else 'answer', state, tuple(shape))


def probe_message(kind: tuple) -> dict:
    """A probe assistant turn of a :func:`turn_kind` kind (probe words where the turn had text).

    Returns:
        ``{'role': 'assistant', 'content', 'reasoning_content'?, 'tool_calls'?}``: one call to
        ``probe`` for a ``'tool_call'`` kind; reasoning ``''`` or ``'Probe reasoning.'`` per state.
    """
    call, state, shape = kind
    content = ''.join(f'Probe text {q}.' if part is None else part for q, part in enumerate(shape))
    msg = {'role': 'assistant', 'content': content}
    if state != 'none':
        msg['reasoning_content'] = '' if state == 'empty' else 'Probe reasoning.'
    if call == 'tool_call':
        msg['tool_calls'] = [_PROBE_CALL]
    return msg


_PROBE_ANSWER = {'role': 'assistant', 'content': 'Probe answer.', 'reasoning_content': 'Probe reasoning.'}
_PROBE_CALLING = {'role': 'assistant', 'content': '', 'reasoning_content': 'Probe reasoning.', 'tool_calls': [_PROBE_CALL]}


def probe_turn(template: ChatTemplate, opening: list, call: bool = False) -> tuple:
    """A probe assistant turn the way a family writes one, and its text: ``(message, text)``.

    The message carries its reasoning in ``reasoning_content`` (transformers also passes it as
    ``thinking``, which gpt-oss reads) and, with ``call``, a call in ``tool_calls``; never control
    text in ``content``. ``text`` is :func:`rendered_turn`'s; the message loses its reasoning where
    the template writes the turn without it (a generation prompt that closed the reasoning).

    Returns:
        ``(message dict, text)``; where the template writes the turn after no copy of its generation
        prompt, the plain answer ``'Probe answer.'`` and the last stop text.

    Raises:
        ValueError: the template cannot render the opening or the turn.
    """
    msg = _PROBE_CALLING if call else _PROBE_ANSWER
    found = rendered_turn(template, opening, msg)
    if found is None:
        return {'role': 'assistant', 'content': 'Probe answer.'}, 'Probe answer.' + template.stop_texts[-1]
    text, how = found
    return (dict(msg) if how != 'without_reasoning'
            else {k: v for k, v in msg.items() if k != 'reasoning_content'}), text


def probe_turn_text(template: ChatTemplate, opening: list, message: dict | None = None) -> str:
    """What a model writes after the generation prompt, as the template renders it (incl. stop).

    :func:`rendered_turn` of ``message`` (default an answer with reasoning) after the opening. For
    Qwen3 in thinking mode: ``'<think>\\nProbe reasoning.\\n</think>\\n\\nProbe answer.<|im_end|>'``.
    When the template writes the turn after no copy of its generation prompt: ``'Probe answer.'`` and
    the last stop text.

    Raises:
        ValueError: the template cannot render the opening.

    Source: the template itself (its rendering of a final assistant turn).
    """
    found = rendered_turn(template, opening, message or _PROBE_ANSWER)
    return found[0] if found is not None else 'Probe answer.' + template.stop_texts[-1]


def probe_stability(template: ChatTemplate, opening: list, pattern: tuple, rounds: int = 2,
                    turn: dict | None = None) -> bool:
    """Whether appending messages with roles ``pattern`` after sampled turns keeps contexts prefixes.

    Runs a probe episode: the opening, a tool-call turn with reasoning and its tool result (what a
    template drops first when it rewrites history; left out when the template cannot render it
    after its generation prompt), then ``rounds`` rounds of ``turn`` and ``pattern``'s messages. After
    each round the recorded text (the template's rendering before the rounds, then each turn's
    :func:`rendered_turn` text and bridge) must equal the template's rendering of the conversation
    with the generation prompt.

    Args:
        template: the :class:`ChatTemplate`.
        opening: the episode's opening messages.
        pattern: roles of the messages appended after each turn, e.g. ``('tool',)``.
        rounds: probe rounds.
        turn: the probe assistant turn (:func:`probe_message` of the sampled turn's :func:`turn_kind`);
            default an answer with reasoning, then (where the template refuses ``pattern`` after an
            answer: gpt-oss renders a tool result only after a call) a tool-call turn with reasoning.

    Returns:
        True when every probe context is a prefix of the next one; False as well when rendering the
        turn rewrites earlier turns (Kimi K2's final answer drops the reasoning before it).

    Raises:
        ValueError: the template cannot render the opening (a message the template drops in the
            probe makes the pattern unstable instead).

    Source: book chapter 5.3 (prefix stability; Qwen3 is stable across tool turns in thinking
    mode, not after a new user message, and not across turns in non-thinking mode, where the
    empty think block of the generation prompt is not kept in history; nor after a tool-call turn
    whose think block is empty, which its template drops from history).
    """
    msgs = list(opening)
    canary = {'role': 'assistant', 'content': '', 'reasoning_content': 'Probe canary.', 'tool_calls': [_PROBE_CALL]}
    try:
        found = rendered_turn(template, msgs, canary)
        if found is not None and found[1] == 'verbatim':
            msgs += [canary, {'role': 'tool', 'content': f'{_PROBE_TOOL} c'}]
            template.render(msgs, True)
    except ValueError:
        msgs = list(opening)
    for probe in ([turn] if turn else [_PROBE_ANSWER, _PROBE_CALLING]):
        stable = _probe_rounds(template, msgs, probe, pattern, rounds)
        if stable is not None:
            return stable
    return False


def _probe_rounds(template: ChatTemplate, msgs: list, turn: dict, pattern: tuple, rounds: int) -> bool | None:
    """:func:`probe_stability`'s rounds with one probe turn; None where a bridge cannot be derived after it
    (gpt-oss renders a tool result only after a call)."""
    recorded = template.render(msgs, True)
    for r in range(rounds):
        found = rendered_turn(template, msgs, turn)
        if found is None or found[1] == 'rewrites_history':
            return False
        text, how = found
        said = turn if how == 'verbatim' else {k: v for k, v in turn.items() if k != 'reasoning_content'}
        stop = next((t for t in _ends(template) if text.endswith(t)), '')
        new = [{'role': role, 'content': _PROBE_USER if role in ('user', 'system') else f'{_PROBE_TOOL} {r}{q}'}
               for q, role in enumerate(pattern)]
        try:
            bridge = template_bridge(template, msgs, new, terminated=bool(stop), turn=said)
        except ValueError:
            return None
        recorded += text + bridge.text
        msgs = msgs + [said] + new
        if template.render(msgs, True) != recorded:
            return False
    return True
