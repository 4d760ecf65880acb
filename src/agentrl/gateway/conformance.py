"""L5: the start-up conformance gate: bridge-by-bridge recording must equal the template's full render.

Before serving, the gateway records a fixture corpus of multi-turn tool conversations the way it
records traffic (:class:`~agentrl.templates.ChatRecorder`, ``history='sampled'``: each assistant
turn as the ids of the text the template writes for it, each tool message as a bridge) and
compares the recorded ids, after every turn's bridge, with the template's full rendering of the
conversation so far (with the generation prompt), encoded. The first differing token is reported
and the gateway refuses to start: a template whose bridges disagree with its own rendering (a
newline written only when a message is not the last one, say) would record contexts the model
would never be shown by a full render.

Source: gateway-peers survey §4 item 2 (renderer conformance gate per served model and template).
"""
from __future__ import annotations

from ..templates import ChatRecorder

__all__ = ['CORPUS', 'conformance', 'ConformanceError']

_READ = {'type': 'function', 'function': {'name': 'read', 'arguments': {}}}
_EDIT = {'type': 'function', 'function': {'name': 'edit', 'arguments': {'op': 'swap_minmax'}}}
_TEST = {'type': 'function', 'function': {'name': 'test', 'arguments': {}}}
#: Conversations the gate records: (opening, [(assistant turn, following messages)]). Turns carry reasoning, as
#: an agent's do: a template that drops an *empty* think block from history (Qwen3) rewrites history, which
#: the gateway's sampled-history recording keeps on purpose; that is not a bridge fault.
CORPUS = [
    ([{'role': 'user', 'content': 'Fix clamp: it returns hi when x < lo.'}],
     [({'role': 'assistant', 'content': '', 'reasoning_content': 'Read it first.', 'tool_calls': [_READ]},
       [{'role': 'tool', 'content': 'def clamp(x, lo, hi):\n    return max(hi, min(lo, x))'}]),
      ({'role': 'assistant', 'content': 'Swapping.', 'reasoning_content': 'max and min are swapped.',
        'tool_calls': [_EDIT]},
       [{'role': 'tool', 'content': 'ok'}]),
      ({'role': 'assistant', 'content': '', 'reasoning_content': 'Check.', 'tool_calls': [_TEST]},
       [{'role': 'tool', 'content': 'passed 3/3'}]),
      ({'role': 'assistant', 'content': '', 'reasoning_content': 'Look again.', 'tool_calls': [_READ]},
       [{'role': 'tool', 'content': 'def clamp(x, lo, hi):\n    return max(lo, min(hi, x))'}]),
      ({'role': 'assistant', 'content': 'Done: the bounds were swapped.', 'reasoning_content': 'Tests pass.'}, [])]),
    ([{'role': 'system', 'content': 'You are a careful engineer.'}, {'role': 'user', 'content': 'Run the tests.'}],
     [({'role': 'assistant', 'content': '', 'reasoning_content': 'Both.', 'tool_calls': [_READ, _EDIT]},
       [{'role': 'tool', 'content': 'a'}, {'role': 'tool', 'content': 'b'}]),
      ({'role': 'assistant', 'content': 'All green.', 'reasoning_content': 'Done.'}, [])]),
]


class ConformanceError(ValueError):
    """The template's bridges disagree with its full render (names the conversation, turn and token)."""


def _turn_ids(template, history: list, turn: dict) -> list:
    """The ids of what the template writes for ``turn`` after ``history``'s generation prompt (incl. end of turn).

    A template that rewrites earlier turns once a final answer is rendered (Kimi K2 drops their reasoning)
    gives the text after the last generation prompt of that render.
    """
    ctx = template.render(history, True)
    full = template.render(history + [turn], False)
    if not full.startswith(ctx):         # a non-thinking generation prompt: the model writes no reasoning
        full = template.render(history + [{k: v for k, v in turn.items() if k != 'reasoning_content'}], False)
    if full.startswith(ctx):
        text = full[len(ctx):]
    else:                                # the turn rewrites history: what follows the last generation prompt
        bare = template.render(history, False)
        prompt = ctx[len(bare):] if ctx.startswith(bare) else ''
        full = template.render(history + [turn], False)
        at = full.rfind(prompt) if prompt else -1
        if at < 0:
            raise ConformanceError('the template does not render an assistant turn after its own generation prompt; '
                                   'it cannot be served token-in/token-out')
        text = full[at + len(prompt):]
    eot = template.end_of_turn_text
    if eot and eot in text:
        text = text[:text.index(eot) + len(eot)]
    return template.encode(text)


def conformance(template, corpus=None, *, strict: bool = False) -> dict:
    """Record ``corpus`` bridge by bridge and compare with the full render after every bridge.

    Each recorded prompt is compared with the encoded full render of the conversation so far.
    Where they differ, the newest bridge (the tokens after the last turn) must still equal the
    render's tail: a difference only before it is the template rewriting history (Qwen3 dropping
    an empty think block, say), which sampled-history recording keeps on purpose and which is
    counted, not refused; ``strict`` refuses it too.

    Args:
        template: the :class:`~agentrl.templates.ChatTemplate` to serve (its tools are rendered too).
        corpus: conversations as :data:`CORPUS` (default).
        strict: refuse any difference from the full render.

    Returns:
        ``{'conversations', 'turns', 'bridges', 'history_rewrites'}`` (counts).

    Raises:
        ConformanceError: the first refused difference: conversation, turn, token offset, the
            recorded and the rendered text around it.
    """
    corpus = CORPUS if corpus is None else corpus
    n_turns = n_bridges = rewrites = 0
    for c, (opening, rounds) in enumerate(corpus):
        rec = ChatRecorder(template, opening, history='sampled')
        msgs = list(opening)
        for k, (turn, after) in enumerate(rounds):
            rec.add_turn(_turn_ids(template, msgs, turn), message=turn)
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
    return {'conversations': len(corpus), 'turns': n_turns, 'bridges': n_bridges, 'history_rewrites': rewrites}
