"""L5: the start-up conformance gate: bridge-by-bridge recording must equal the template's full render.

Before serving, the gateway records a fixture corpus of multi-turn tool conversations the way it
records traffic (:class:`~agentrl.templates.ChatRecorder`, ``history='sampled'``: each assistant
turn as the ids of the text the template writes for it and the stop a model samples, each tool
message as a bridge) and
compares the recorded ids, after every turn's bridge, with the template's full rendering of the
conversation so far (with the generation prompt), encoded. The first differing token is reported
and the gateway refuses to start: a template whose bridges disagree with its own rendering (a
newline written only when a message is not the last one, say) would record contexts the model
would never be shown by a full render.

It also tells a history rewrite from a template that cannot be served: a bridge whose tail equals
the render's (Qwen3 dropping an empty think block) and an assistant turn written after a copy of
the generation prompt while earlier text changes (Kimi K2 drops earlier reasoning once a final
answer is rendered) are rewrites, counted and served (docs/design.md#templates: per-turn contexts
where the recorder follows the template; the gateway records as sampled); a turn written after no
copy of the generation prompt, or bridges that differ from the render in their own tokens, are
refused. Every tool call the template writes is parsed back with the model family
(docs/design.md#families); a call format the family cannot read is refused, naming the format.

Source: gateway-peers survey §4 item 2 (renderer conformance gate per served model and template).
"""
from __future__ import annotations

from ..families import FAMILIES
from ..templates import ChatRecorder
from ..templates.bridge import next_stop, rendered_turn

__all__ = ['CORPUS', 'conformance', 'ConformanceError']

def _call(name: str, arguments: dict, k: int) -> dict:
    """Call ``k`` of a conversation, its id in the ``functions.NAME:IDX`` form a template may render back (Kimi K2)."""
    return {'id': f'functions.{name}:{k}', 'type': 'function', 'function': {'name': name, 'arguments': arguments}}


def _result(content: str, name: str, k: int) -> dict:
    return {'role': 'tool', 'tool_call_id': f'functions.{name}:{k}', 'content': content}


_SWAP = {'op': 'swap_minmax'}
#: Conversations the gate records: (opening, [(assistant turn, following messages)]). Turns carry reasoning, as
#: an agent's do: a template that drops an *empty* think block from history (Qwen3) rewrites history, which
#: the gateway's sampled-history recording keeps on purpose; that is not a bridge fault.
CORPUS = [
    ([{'role': 'user', 'content': 'Fix clamp: it returns hi when x < lo.'}],
     [({'role': 'assistant', 'content': '', 'reasoning_content': 'Read it first.',
        'tool_calls': [_call('read', {}, 0)]},
       [_result('def clamp(x, lo, hi):\n    return max(hi, min(lo, x))', 'read', 0)]),
      ({'role': 'assistant', 'content': 'Swapping.', 'reasoning_content': 'max and min are swapped.',
        'tool_calls': [_call('edit', _SWAP, 1)]},
       [_result('ok', 'edit', 1)]),
      ({'role': 'assistant', 'content': '', 'reasoning_content': 'Check.', 'tool_calls': [_call('test', {}, 2)]},
       [_result('passed 3/3', 'test', 2)]),
      ({'role': 'assistant', 'content': '', 'reasoning_content': 'Look again.', 'tool_calls': [_call('read', {}, 3)]},
       [_result('def clamp(x, lo, hi):\n    return max(lo, min(hi, x))', 'read', 3)]),
      ({'role': 'assistant', 'content': 'Done: the bounds were swapped.', 'reasoning_content': 'Tests pass.'}, [])]),
    ([{'role': 'system', 'content': 'You are a careful engineer.'}, {'role': 'user', 'content': 'Run the tests.'}],
     [({'role': 'assistant', 'content': '', 'reasoning_content': 'Both.',
        'tool_calls': [_call('read', {}, 0), _call('edit', _SWAP, 1)]},
       [_result('a', 'read', 0), _result('b', 'edit', 1)]),
      ({'role': 'assistant', 'content': 'All green.', 'reasoning_content': 'Done.'}, [])]),
]


class ConformanceError(ValueError):
    """The template cannot be served: its bridges disagree with its full render (names the conversation, turn and
    token), it writes a turn after no copy of its generation prompt, or the family cannot parse its tool calls."""


def _call_text(family, text: str) -> str:
    """The part of a rendered turn that holds its calls: after the reasoning, without the stop text."""
    body = family.split_reasoning(text)[1] if family is not None else text
    return body.strip()


def _with_next_stop(template, history: list, turn: dict, after: list, text: str) -> str:
    """``text`` (a turn as rendered) with the stop a model samples at its end where the template writes no end of
    turn (GLM): the header of the messages ``after`` (``<|observation|>`` before tool results)."""
    if template.end_of_turn_text is not None or not after:
        return text
    full = template.render(history + [turn], False)
    nxt = template.render(history + [turn] + after, True)
    at, stop = next_stop(template, nxt, len(full))
    return text + stop if nxt.startswith(full) and at == len(full) and full.endswith(text) else text


def _renderable(template, history: list, turn: dict, after: list) -> tuple:
    """``(turn, after)``, or what the template can render of them: where it refuses content beside reasoning in
    a turn that calls tools (gpt-oss writes one analysis message before a call), the turn with empty content;
    where it refuses several calls in one message (Llama 3.1 takes one), the first call and its result."""
    try:
        template.render(history + [turn], False)
        return turn, after
    except ValueError:
        calls = turn.get('tool_calls') or []
        if len(calls) > 1:
            first = calls[0].get('id')
            kept = [m for m in after if m.get('role') != 'tool' or m.get('tool_call_id') == first]
            return _renderable(template, history, dict(turn, tool_calls=calls[:1]), kept)
        if not (calls and turn.get('content') and turn.get('reasoning_content')):
            raise
        return dict(turn, content=''), after


def _calls_of(message: dict) -> list:
    """``[(name, arguments)]`` of an assistant message's ``tool_calls``."""
    out = []
    for c in message.get('tool_calls') or ():
        fn = c.get('function', c)
        out.append((fn.get('name'), fn.get('arguments')))
    return out


def _check_calls(template, family, history: list, turn: dict, text: str, stop: str) -> str:
    """``'parsed'`` when ``family`` reads ``turn``'s calls back from ``text``, ``'not rendered'`` when the template
    writes nothing for them; else raise :class:`ConformanceError` naming the format and the families that read it.

    A template that renders only the first calls of a message (gpt-oss writes one call per message) passes when
    the family reads those back."""
    body = text[:len(text) - len(stop)] if stop and text.endswith(stop) else text
    want = _calls_of(turn)
    got = [(c.name, c.arguments) for c in family.parse_text(body).ok_calls] if family is not None else []
    if got and got == want[:len(got)]:
        return 'parsed'
    plain = {k: v for k, v in turn.items() if k != 'tool_calls'}
    without = rendered_turn(template, history, plain)
    if without is not None and without[0] == text:
        return 'not rendered'
    others = [f.name for f in FAMILIES.values() if f is not family
              and [(c.name, c.arguments) for c in f.parse_text(body).ok_calls] == want]
    shown = _call_text(family, body)
    shown = shown if len(shown) <= 80 else shown[:77] + '...'
    if others:
        hint = f'the {others[0]} family parses them: pass --family {others[0]}'
    else:
        hint = 'no model family parses them: pass --family NAME or add a family module (docs/design.md#families)'
    fam = f' (the {family.name} family reads no such calls)' if family is not None else ''
    raise ConformanceError(f'{template.name} writes tool calls as {shown!r}{fam}; {hint}')


def conformance(template, corpus=None, *, strict: bool = False, family=None) -> dict:
    """Record ``corpus`` bridge by bridge and compare with the full render after every bridge.

    Each recorded prompt is compared with the encoded full render of the conversation so far.
    Where they differ, the newest bridge (the tokens after the last turn) must still equal the
    render's tail: a difference only before it is the template rewriting history (Qwen3 dropping
    an empty think block, say), which sampled-history recording keeps on purpose and which is
    counted, not refused; ``strict`` refuses it too. A turn the template writes after a copy of its
    generation prompt while rewriting the text before it (:func:`~agentrl.templates.bridge.rendered_turn`,
    Kimi K2's final answer) is counted as a turn rewrite. With ``family``, each turn's tool calls
    are parsed back from the text the template writes for them.

    Args:
        template: the :class:`~agentrl.templates.ChatTemplate` to serve (its tools are rendered too).
        corpus: conversations as :data:`CORPUS` (default).
        strict: refuse any difference from the full render.
        family: the model family (:func:`agentrl.families.family_for`) that parses the replies;
            None skips the tool-call check.

    Returns:
        ``{'conversations', 'turns', 'bridges', 'history_rewrites', 'turn_rewrites'}`` (counts),
        ``'tool_calls'``: ``'parsed'`` (by ``family``), ``'not rendered'`` (the template writes no
        calls), or ``'unchecked'`` (no family given), and ``'found'``: the finding in one line.

    Raises:
        ConformanceError: the first refused difference: conversation, turn, token offset, the
            recorded and the rendered text around it; a turn the template writes after no copy of
            its generation prompt; tool calls ``family`` does not parse back (names the format and
            a family that parses it, or says none does).
    """
    corpus = CORPUS if corpus is None else corpus
    n_turns = n_bridges = rewrites = turn_rewrites = 0
    calls = 'unchecked'
    for c, (opening, rounds) in enumerate(corpus):
        rec = ChatRecorder(template, opening, history='sampled')
        msgs = list(opening)
        for k, (turn, after) in enumerate(rounds):
            turn, after = _renderable(template, msgs, turn, after)
            found = rendered_turn(template, msgs, turn)
            if found is None:
                ctx, head = template.render(msgs, True), template.render(msgs, False)
                gen = ctx[len(head):] if ctx.startswith(head) else ''
                raise ConformanceError(
                    f'conformance: conversation {c}, turn {k}: {template.name} writes the assistant turn after no '
                    f'copy of its own generation prompt {gen!r}, so a sampled turn cannot be recorded as it renders; '
                    'it cannot be served token-in/token-out (fix the chat template)')
            text, how = found
            turn_rewrites += how == 'rewrites_history'
            stop = next((t for t in tuple(template.end_texts) + tuple(template.stop_texts) if text.endswith(t)), '')
            if turn.get('tool_calls') and family is not None and calls != 'not rendered':
                calls = _check_calls(template, family, msgs, turn, text, stop)
            rec.add_turn(template.encode(_with_next_stop(template, msgs, turn, after, text)), message=turn)
            msgs.append(turn)
            n_turns += 1
            if not after:
                continue
            got = rec.add_messages(after)
            msgs += after
            n_bridges += 1
            want = template.encode(template.render(msgs, True))
            if got == want:
                continue
            n = len(rec.bridges[-1].ids)
            if not strict and got[-n:] == want[-n:]:
                rewrites += 1
                continue
            p = next((i for i, (a, b) in enumerate(zip(got, want)) if a != b), min(len(got), len(want)))
            if not strict:      # the bridge is the tail: report where it differs, aligned from the end
                p = len(got) - next(i for i in range(1, n + 1) if i > len(want) or got[-i] != want[-i])
                q = p - len(got) + len(want)
            else:
                q = p
            raise ConformanceError(
                f'conformance: conversation {c}, after turn {k}: the bridged record differs from the full render at '
                f'token {p}: recorded {template.decode(got[max(0, p - 3):p + 3])!r}, rendered '
                f'{template.decode(want[max(0, q - 3):q + 3])!r}; the bridges disagree with the template\'s own '
                'rendering, so it cannot be served token-in/token-out (fix the chat template)')
    if strict and turn_rewrites:
        raise ConformanceError(f'conformance: {template.name} rewrites earlier turns when it renders an assistant '
                               f'turn ({turn_rewrites} of {n_turns} turns), refused in strict mode')
    report = {'conversations': len(corpus), 'turns': n_turns, 'bridges': n_bridges, 'history_rewrites': rewrites,
              'turn_rewrites': turn_rewrites, 'tool_calls': calls}
    report['found'] = _found(report, family)
    return report


def _found(report: dict, family) -> str:
    """The gate's finding in one line (``agentrl serve`` prints it)."""
    n, b = report['turns'], report['bridges']
    parts = []
    if report['history_rewrites']:
        parts.append(f"{report['history_rewrites']} of {b} bridges follow a rewrite of earlier history (the template "
                     'drops or changes earlier text when a message is added)')
    if report['turn_rewrites']:
        parts.append(f"{report['turn_rewrites']} of {n} turns rewrite earlier turns when rendered (a final answer "
                     'drops earlier reasoning, as Kimi K2\'s template does)')
    head = (f'conformance: {n} turns, {b} bridges: ' +
            ('; '.join(parts) + ', recorded as sampled' if parts else 'the bridged record equals the full render'))
    tail = {'parsed': f'; tool calls parsed back by the {getattr(family, "name", "")} family',
            'not rendered': '; the template writes no tool calls', 'unchecked': ''}[report['tool_calls']]
    return head + tail
