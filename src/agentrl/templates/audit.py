"""L2: audits of a chat template: prefix stability, thinking mode, retokenization drift, fingerprint.

Each audit is a small function that renders a fixed conversation through the real template
and returns a report dataclass; the CLI (``agentrl template audit``) prints them.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from ..record import OWNER, owner_runs
from .budget import TemplateTimeoutError
from .chat import ChatTemplate, as_template, check_messages, common_prefix, tokenizer_fingerprint
from .labels import coarse_shape, label_owners
from .recorder import template_bridge

__all__ = ['MessageStability', 'PrefixReport', 'audit_prefix_stability', 'ThinkingReport', 'audit_thinking',
           'SpanDrift', 'DriftReport', 'audit_drift', 'template_fingerprint',
           'tokenizer_fingerprint', 'TemplateAudit', 'audit_template']

_REASONING_KEYS = ('reasoning_content', 'reasoning', 'thinking')


def _reasoning(m: dict) -> str:
    for k in _REASONING_KEYS:
        if isinstance(m.get(k), str) and m[k].strip():
            return m[k].strip()
    return ''


# ---------------------------------------------------------------------------- prefix stability
@dataclass
class MessageStability:
    """What appending one message does to the sampling contexts before it.

    Attributes:
        index: the message's index; role: its role.
        stable: True when every earlier sampling context is still a prefix after it is appended.
        broken: indices of the assistant turns whose sampling context it breaks.
        reason: why, naming the message whose rendering changed and the first differing text.
    """
    index: int
    role: str
    stable: bool = True
    broken: list = field(default_factory=list)
    reason: str = ''


@dataclass
class PrefixReport:
    """Prefix stability of a conversation under a template.

    Attributes:
        stable: every sampling context (the rendering before an assistant turn, with the
            generation prompt) is a text prefix of every later rendering.
        token_stable: the same holds for token ids of the final rendering (BPE merges at a
            boundary can break it even when the text is a prefix).
        messages: one :class:`MessageStability` per message.
        breaking: indices of the messages that break an earlier context.
        reasoning_total: assistant messages with non-empty reasoning.
        reasoning_rendered: of those, how many still show their reasoning in the final rendering.
        audited: messages rendered prefix by prefix (None: all of them; fewer for a long
            conversation audited on its structural summary, see :func:`audit_prefix_stability`).
    """
    stable: bool
    token_stable: bool
    messages: list
    breaking: list
    reasoning_total: int = 0
    reasoning_rendered: int = 0
    audited: int | None = None

    def summary(self) -> str:
        """One line per breaking message (or 'prefix-stable')."""
        if self.stable and self.token_stable:
            return 'prefix-stable: every sampling context is a prefix of the final rendering'
        lines = [m.reason for m in self.messages if not m.stable]
        if self.stable and not self.token_stable:
            lines.append('text is prefix-stable but token ids are not (a BPE merge crosses a boundary)')
        return '\n'.join(lines)


def audit_prefix_stability(tokenizer, messages, *, tools=None, **options) -> PrefixReport:
    """Check whether each turn's sampling context survives as a prefix of later renderings.

    For every assistant message ``i`` the sampling context is ``render(messages[:i],
    add_generation_prompt=True)``: what the model saw when it wrote turn ``i``. Messages are
    appended one by one; a message that makes an earlier context stop being a prefix is named,
    with the message whose rendering changed and (when it applies) the reasoning that was stripped.

    Args:
        tokenizer: a Hugging Face tokenizer or a :class:`ChatTemplate`.
        messages: the conversation.
        tools, **options: :class:`ChatTemplate` options (only with a tokenizer).

    Cost: near-linear in the conversation's length. Up to 48 messages every prefix is rendered
    (exact). A longer conversation is audited on its structural summary: a run of more than three
    rounds (an assistant turn and the messages after it) with the same structure (roles, empty or
    not, which other fields are set) keeps its first two rounds and its last; a dropped round
    reports what its representative (the second round of its run) reports, with indices mapped
    back, and ``PrefixReport.audited`` says how many messages were rendered. This assumes, as
    :class:`~agentrl.templates.ChatRecorder` does, that the template depends on history through
    its structure, not its length or contents. Reasoning counts are taken from the full rendering.

    Returns:
        :class:`PrefixReport`. For Qwen3 in thinking mode the chapter's clamp episode is stable
        across tool turns; after a new user message it is not (the user message is named and the
        earlier reasoning is stripped: reasoning_rendered 3 -> 0).

    Raises:
        ValueError: malformed messages or a template that cannot render them.

    Source: book chapter 5.3 (prefix stability; Qwen3 model card: "the historical model output
    should only include the final output part").
    """
    template = as_template(tokenizer, tools=tools, **options)
    messages = check_messages(messages)
    if len(messages) <= _EXACT_LIMIT:
        return _audit_exact(template, messages)
    kept, rep = _summary(messages)
    if len(kept) == len(messages):
        return _audit_exact(template, messages)
    sub = _audit_exact(template, [messages[j] for j in kept])
    return _expand(sub, messages, kept, rep, template)


#: Conversations up to this many messages are audited exactly (every prefix rendered).
_EXACT_LIMIT = 48
#: Rounds kept at the start of a run of rounds with the same structure (plus the run's last round).
_KEEP_ROUNDS = 2


def _summary(messages: list) -> tuple:
    """(kept message indices, {dropped index: (its representative's index, its run's first index)})."""
    first = next((i for i, m in enumerate(messages) if m['role'] == 'assistant'), len(messages))
    rounds, i = [], first
    while i < len(messages):
        j = i + 1
        while j < len(messages) and messages[j]['role'] != 'assistant':
            j += 1
        rounds.append(list(range(i, j)))
        i = j
    kept, rep = list(range(first)), {}
    sig = [tuple(coarse_shape(messages[k]) for k in r) for r in rounds]
    q = 0
    while q < len(rounds):
        e = q
        while e + 1 < len(rounds) and sig[e + 1] == sig[q]:
            e += 1
        run = rounds[q:e + 1]
        if len(run) > _KEEP_ROUNDS + 1:
            model = run[_KEEP_ROUNDS - 1]
            for r in run[:_KEEP_ROUNDS] + run[-1:]:
                kept += r
            for r in run[_KEEP_ROUNDS:-1]:
                rep.update({k: (model[n], run[0][0]) for n, k in enumerate(r)})
        else:
            for r in run:
                kept += r
        q = e + 1
    return sorted(kept), rep


def _expand(sub: 'PrefixReport', messages: list, kept: list, rep: dict, template) -> 'PrefixReport':
    """The summary's report on the full conversation's indices."""
    import re
    members: dict = {}
    for j, (r, _start) in rep.items():
        members.setdefault(r, []).append(j)
    comp = {c: j for c, j in enumerate(kept)}

    def kept_turns(broken: list, before: int) -> list:
        out = set()
        for c in broken:
            t = comp[c]
            out.add(t)
            out.update(members.get(t, ()))
        return sorted(t for t in out if t <= before)

    def shifted_turns(broken: list, j: int) -> list:       # a dropped message: its representative's, moved
        r, start = rep[j]
        return sorted({comp[c] + (j - r) if comp[c] >= start else comp[c] for c in broken})

    def text(reason: str) -> str:
        reason = re.sub(r'\b(message|turn) (\d+)', lambda m: f'{m.group(1)} {comp[int(m.group(2))]}', reason)
        return re.sub(r'messages \[([\d, ]*)\]',
                      lambda m: 'messages ' + str([comp[int(x)] for x in m.group(1).split(',') if x.strip()]), reason)

    by_orig = {comp[c]: ms for c, ms in enumerate(sub.messages)}
    out = []
    for j, m in enumerate(messages):
        if j in by_orig:
            src = by_orig[j]
            broken, reason = kept_turns(src.broken, j), text(src.reason)
        else:
            src = by_orig[rep[j][0]]
            broken = shifted_turns(src.broken, j)
            reason = f'as message {rep[j][0]} (same structure): {text(src.reason)}' if src.reason else ''
        out.append(MessageStability(index=j, role=m['role'], stable=src.stable, broken=broken, reason=reason))
    final = template.render(messages, messages[-1]['role'] != 'assistant')
    with_r = [m for m in messages if m['role'] == 'assistant' and _reasoning(m)]
    return PrefixReport(stable=sub.stable, token_stable=sub.token_stable, messages=out,
                        breaking=[ms.index for ms in out if not ms.stable], reasoning_total=len(with_r),
                        reasoning_rendered=sum(_reasoning(m) in final for m in with_r), audited=len(kept))


def _audit_exact(template: ChatTemplate, messages: list) -> 'PrefixReport':
    """The exact audit: every prefix rendered (quadratic in the number of messages)."""
    contexts = {i: template.render(messages[:i], True)
                for i, m in enumerate(messages) if m['role'] == 'assistant' and i > 0}
    alive = {('context', i): c for i, c in contexts.items()}
    renders, report, plain = [], [], {}

    def ends(k: int) -> int:  # length of the rendering of messages[:k + 1] without generation prompt
        if k not in plain:
            plain[k] = len(template.render(messages[:k + 1], False))
        return plain[k]

    for j, m in enumerate(messages):
        d = template.render(messages[:j + 1], m['role'] != 'assistant')
        renders.append(d)
        ms = MessageStability(index=j, role=m['role'])
        broken = [key for key in sorted(alive, key=lambda kk: (kk[1], kk[0]))
                  if key[1] <= j and not d.startswith(alive[key])]
        for key in broken:
            old = alive.pop(key)
            ms.stable = False
            if key[1] not in ms.broken:
                ms.broken.append(key[1])
            if not ms.reason:
                ms.reason = _break_reason(messages, ends, key, old, d, j, renders[j - 1] if j else '')
        if m['role'] == 'assistant' and j > 0 and ('context', j) in alive:
            # the turn as sampled: its context plus its own text through the end-of-turn token
            ctx = contexts[j]
            if d.startswith(ctx):
                rest = d[len(ctx):]
                hits = [rest.find(t) + len(t) for t in template.stop_texts if t in rest]
                alive[('turn', j)] = ctx + rest[:min(hits)] if hits else d
        report.append(ms)
    final = renders[-1]
    ids_final = template.encode(final)
    token_stable = True
    for i, ctx in contexts.items():
        if final.startswith(ctx):
            c_ids = template.encode(ctx)
            if ids_final[:len(c_ids)] != c_ids:
                token_stable = False
    with_r = [m for m in messages if m['role'] == 'assistant' and _reasoning(m)]
    return PrefixReport(stable=all(ms.stable for ms in report), token_stable=token_stable, messages=report,
                        breaking=[ms.index for ms in report if not ms.stable],
                        reasoning_total=len(with_r),
                        reasoning_rendered=sum(_reasoning(m) in final for m in with_r))


def _break_reason(messages, ends, key, old, d, j, before) -> str:
    kind, i = key
    p = common_prefix(old, d)
    what = f'message {j} ({messages[j]["role"]}) breaks the sampling context of turn {i}: ' if kind == 'context' \
        else f'message {j} ({messages[j]["role"]}) changes turn {i} as it was sampled: '
    if kind == 'context' and p >= ends(i - 1):
        what += 'the generation prompt the turn was sampled after'
    else:
        changed = next((k for k in range(j) if ends(k) > p), i)
        what += f'the rendering of message {changed} ({messages[changed]["role"]})'
    what += f' changes at char {p}: {old[p:p + 30]!r} -> {d[p:p + 30]!r}'
    stripped = [k for k in range(j) if messages[k]['role'] == 'assistant' and _reasoning(messages[k])
                and _reasoning(messages[k]) in before and _reasoning(messages[k]) not in d]
    if stripped:
        what += f'; the reasoning of messages {stripped} is stripped once message {j} is added'
    return what


# ---------------------------------------------------------------------------- thinking mode
@dataclass
class ThinkingReport:
    """What a template's thinking switch (``enable_thinking``) changes.

    Attributes:
        supported: the switch changes the generation prompt.
        prompt_thinking, prompt_non_thinking: the last 40 characters of each generation prompt.
        inserted_text: what non-thinking mode adds after the common prefix (Qwen3:
            ``'<think>\\n\\n</think>\\n\\n'``), template-owned.
        inserted_ids, inserted_tokens: its ids and token strings.
        removed_text: what thinking mode has there instead ('' for Qwen3).
        history_differs: the switch also changes how the given history renders.
    """
    supported: bool
    prompt_thinking: str
    prompt_non_thinking: str
    inserted_text: str
    inserted_ids: list
    inserted_tokens: list
    removed_text: str = ''
    history_differs: bool = False


def audit_thinking(tokenizer, messages=None, *, tools=None, **options) -> ThinkingReport:
    """Render the generation prompt with ``enable_thinking`` True and False and diff them.

    Args:
        tokenizer: a Hugging Face tokenizer or a :class:`ChatTemplate`.
        messages: the conversation before the generation prompt; default one user message
            ``'Fix clamp.'`` (chapter 5.3).
        tools, **options: :class:`ChatTemplate` options (only with a tokenizer).

    Returns:
        :class:`ThinkingReport`. In non-thinking mode the inserted tokens belong to the
        template; in thinking mode the same tags, when the model writes them, are policy.

    Raises:
        ValueError: malformed messages.

    Source: book chapter 5.3 (Qwen3's ``enable_thinking=False`` generation prompt).
    """
    template = as_template(tokenizer, tools=tools, **options)
    messages = check_messages(messages or [{'role': 'user', 'content': 'Fix clamp.'}])
    on = template.with_options(enable_thinking=True)
    off = template.with_options(enable_thinking=False)
    a, b = on.render(messages, True), off.render(messages, True)
    p = common_prefix(a, b)
    inserted = b[p:]
    ids = template.encode(inserted) if inserted else []
    hist = messages if messages[-1]['role'] == 'assistant' else None
    return ThinkingReport(supported=a != b, prompt_thinking=a[-40:], prompt_non_thinking=b[-40:],
                          inserted_text=inserted, inserted_ids=ids, inserted_tokens=template.tokens(ids),
                          removed_text=a[p:],
                          history_differs=bool(hist) and on.render(hist) != off.render(hist))


# ---------------------------------------------------------------------------- drift
@dataclass
class SpanDrift:
    """One policy span whose sampled ids differ from a re-encoding or a re-rendering.

    Attributes:
        turn: the span's turn index; start, end: token range ``[start, end)`` in the record.
        kind: ``'reencode'`` (decode then encode) or ``'rerender'`` (the turn rendered through
            the template from its parsed message).
        at: index within the span of the first differing token.
        sampled, other: token strings from ``at`` (two of each), e.g. ``['-', 'hi']`` and ``['-h', 'i']``.
        sampled_ids, other_ids: the whole span's ids, both ways.
    """
    turn: int
    start: int
    end: int
    kind: str
    at: int
    sampled: list
    other: list
    sampled_ids: list
    other_ids: list

    def describe(self) -> str:
        """One line naming the span, its position and the first differing tokens."""
        return (f'turn {self.turn} tokens [{self.start}, {self.end}) {self.kind}: at +{self.at} sampled '
                f'{self.sampled} -> {self.other} ({len(self.sampled_ids)} vs {len(self.other_ids)} tokens)')


@dataclass
class DriftReport:
    """Retokenization drift of every policy span of a record.

    Attributes:
        n_spans: policy spans checked.
        drifts: the :class:`SpanDrift` found (empty when token-in/token-out holds).
    """
    n_spans: int
    drifts: list

    @property
    def ok(self) -> bool:
        """True when no policy span drifts."""
        return not self.drifts

    def turns(self, kind: str | None = None) -> list:
        """Turn indices with drift (of ``kind`` if given)."""
        return sorted({d.turn for d in self.drifts if kind is None or d.kind == kind})


def first_diff(a: list, b: list) -> int:
    """Index of the first position where ``a`` and ``b`` differ (the shorter length when one is a prefix)."""
    return next((k for k, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def audit_drift(tokenizer, traj, messages=None, *, tools=None, **options) -> DriftReport:
    """Find policy spans whose sampled ids a text round trip would not reproduce.

    Two checks per span: decode then re-encode (BPE drift, e.g. ``['-', 'hi']`` -> ``['-h',
    'i']``), and, when ``messages`` is given, the span as the template renders the parsed
    assistant message (e.g. compact JSON re-serialised with spaces: 19 -> 21 tokens). The record
    is not changed: token-in/token-out keeps the sampled ids; this only reports.

    Args:
        tokenizer: a Hugging Face tokenizer or a :class:`ChatTemplate`.
        traj: a :class:`~agentrl.record.Trajectory` with ``owner`` and ``turn``.
        messages: optional conversation with one assistant message per policy span, in order.
        tools, **options: :class:`ChatTemplate` options (only with a tokenizer).

    Returns:
        :class:`DriftReport` naming each drifting span, its turn and the first differing tokens.

    Raises:
        ValueError: ``traj`` has no owner; ``messages`` has a different number of assistant
            turns than the record has policy spans.

    Source: book chapter 5.4 (retokenization drift, measured on Qwen3).
    """
    template = as_template(tokenizer, tools=tools, **options)
    if getattr(traj, 'owner', None) is None:
        raise ValueError('audit_drift: traj.owner is None; record with ChatRecorder or Trajectory.from_tokens')
    ids = traj.ids.tolist()
    turn = traj.turn if traj.turn is not None else [0] * len(traj.owner)
    spans = owner_runs(traj.owner, turn, OWNER['policy'])
    drifts = []
    for t, s, e in spans:
        sampled = ids[s:e]
        again = template.encode(template.decode(sampled))
        if again != sampled:
            drifts.append(_drift(template, t, s, e, 'reencode', sampled, again))
    if messages is not None:
        messages = check_messages(messages)
        lab = label_owners(template, messages, add_generation_prompt=messages[-1]['role'] != 'assistant')
        rendered = [lab.ids[a:b] for _m, a, b in lab.spans('policy')]
        if len(rendered) != len(spans):
            raise ValueError(f'audit_drift: messages render {len(rendered)} assistant spans but the record has '
                             f'{len(spans)} policy spans; pass one assistant message per sampled turn')
        for (t, s, e), other in zip(spans, rendered):
            if other != ids[s:e]:
                drifts.append(_drift(template, t, s, e, 'rerender', ids[s:e], other))
    return DriftReport(n_spans=len(spans), drifts=drifts)


def _drift(template, t, s, e, kind, sampled, other) -> SpanDrift:
    at = first_diff(sampled, other)
    return SpanDrift(turn=t, start=s, end=e, kind=kind, at=at, sampled=template.tokens(sampled[at:at + 2]),
                     other=template.tokens(other[at:at + 2]), sampled_ids=list(sampled), other_ids=list(other))


# ---------------------------------------------------------------------------- fingerprints
def template_fingerprint(tokenizer, *, tools=None, **options) -> str:
    """sha256 (16 hex) of the template text, its kwargs, tool schemas, vocabulary and special ids.

    Store it on the record (``Provenance.template``); :meth:`ChatRecorder.finish` does.

    Raises:
        ValueError: as :class:`ChatTemplate`.

    Source: book chapter 5.8 (template changes between SFT and RL: pin and check).
    """
    return as_template(tokenizer, tools=tools, **options).fingerprint


# ---------------------------------------------------------------------------- everything at once
@dataclass
class TemplateAudit:
    """Everything ``agentrl template audit`` prints.

    Attributes:
        owner_counts: tokens per owner of the conversation's rendering (None if it cannot be labelled).
        prefix: :class:`PrefixReport`; thinking: :class:`ThinkingReport`.
        bridge_after_tool, bridge_after_user: the :class:`~agentrl.templates.recorder.Bridge`, or the
            error text when the template cannot bridge that message.
        fingerprint, tokenizer_fingerprint: hex digests.
        problems: error texts naming what the template does not support (a tuple).
    """
    owner_counts: dict | None
    prefix: PrefixReport | None
    thinking: ThinkingReport
    bridge_after_tool: object
    bridge_after_user: object
    fingerprint: str
    tokenizer_fingerprint: str
    problems: tuple = ()

    def format(self) -> str:
        """Human-readable report."""
        out = [f'fingerprint: template {self.fingerprint}  tokenizer {self.tokenizer_fingerprint}']
        out.append(f'owner counts: {self.owner_counts}' if self.owner_counts is not None
                   else 'owner counts: (conversation cannot be labelled, see problems)')
        if self.prefix is not None:
            out.append(f'prefix-stable: {self.prefix.stable} (token ids: {self.prefix.token_stable}); '
                       f'reasoning rendered {self.prefix.reasoning_rendered}/{self.prefix.reasoning_total}')
            for m in self.prefix.messages:
                out.append(f'  message {m.index:>2} {m.role:<9} {"stable" if m.stable else "BREAKS"}'
                           + (f': {m.reason}' if m.reason else ''))
        th = self.thinking
        out.append(f'thinking switch: {"changes the generation prompt" if th.supported else "no effect"}')
        if th.supported:
            out.append(f'  thinking prompt ends     {th.prompt_thinking!r}')
            out.append(f'  non-thinking prompt ends {th.prompt_non_thinking!r}')
            out.append(f'  non-thinking inserts {th.inserted_text!r} = {th.inserted_tokens} (template-owned)')
        for name, b in (('tool', self.bridge_after_tool), ('user', self.bridge_after_user)):
            if isinstance(b, str):
                out.append(f'bridge after a {name} turn: unavailable: {b}')
            else:
                out.append(f'bridge after a {name} turn ({len(b.ids)} tokens, stop {b.stop!r} sampled): {b.text!r}')
        for p in self.problems:
            out.append(f'problem: {p}')
        return '\n'.join(out)


def audit_template(tokenizer, messages, *, tools=None, thinking: bool = True, **options) -> TemplateAudit:
    """Run every audit on one conversation (the CLI's ``agentrl template audit``).

    Args:
        tokenizer: a Hugging Face tokenizer.
        messages: the conversation (the CLI defaults to the chapter's two-turn clamp episode).
        tools: tool schemas (MCP or OpenAI style), or None.
        thinking: False renders with ``enable_thinking=False``.
        **options: other :class:`ChatTemplate` options.

    Returns:
        :class:`TemplateAudit`; what the template cannot do (``tools=`` ignored, tool calls not
        rendered) is listed in ``problems`` rather than raised.

    Raises:
        ValueError: malformed messages, or a template that cannot render them at all.
        TemplateTimeoutError: the first render past ``AGENTRL_TEMPLATE_SECONDS`` ends the audit (never
            listed as a problem and retried: docs/design.md#bounds).

    Source: book chapter 5.2-5.4 (one audit per hazard traced there).
    """
    problems = []
    messages = check_messages(messages)
    if not thinking:
        options['enable_thinking'] = False
    try:
        template = ChatTemplate(tokenizer, tools=tools or None, **options)
    except ValueError as e:
        if 'tools=' not in str(e):
            raise
        problems.append(str(e))
        template = ChatTemplate(tokenizer, **options)
    gen = messages[-1]['role'] != 'assistant'
    try:
        counts = label_owners(template, messages, add_generation_prompt=gen).counts()
    except TemplateTimeoutError:
        raise
    except ValueError as e:
        problems.append(str(e))
        counts = None
    plain = _plain_messages(messages)
    try:
        prefix = audit_prefix_stability(template, messages)
    except TemplateTimeoutError:
        raise
    except ValueError as e:
        problems.append(str(e))
        prefix = audit_prefix_stability(template, plain)
    bridges = {}
    for role, content in (('tool', 'Probe result.'), ('user', 'Probe question.')):
        hist, new = _bridge_case(plain, role, content)
        try:
            bridges[role] = template_bridge(template, hist, new)
        except TemplateTimeoutError:
            raise
        except ValueError as e:
            bridges[role] = str(e)
    return TemplateAudit(owner_counts=counts, prefix=prefix, thinking=audit_thinking(template, plain[:1]),
                         bridge_after_tool=bridges['tool'], bridge_after_user=bridges['user'],
                         fingerprint=template.fingerprint, tokenizer_fingerprint=tokenizer_fingerprint(template.tokenizer),
                         problems=tuple(problems))


def _plain_messages(messages: list) -> list:
    """Messages with structured tool calls folded into content as JSON text (what the model wrote)."""
    import json
    out = []
    for m in messages:
        m = dict(m)
        calls = m.pop('tool_calls', None)
        if calls:
            text = '\n'.join(json.dumps((c.get('function') or c), ensure_ascii=False) for c in calls)
            m['content'] = ((m.get('content') or '') + '\n' + text).strip()
        out.append(m)
    return out


def _bridge_case(messages: list, role: str, content: str) -> tuple:
    """(history, new messages) for the bridge after the first assistant turn followed by ``role``."""
    for i, m in enumerate(messages):
        if m['role'] == 'assistant' and i + 1 < len(messages) and messages[i + 1]['role'] == role:
            j = i + 1
            while j < len(messages) and messages[j]['role'] == role:
                j += 1
            return messages[:i], messages[i + 1:j]
    first = next((i for i, m in enumerate(messages) if m['role'] == 'assistant'), len(messages))
    return messages[:first], [{'role': role, 'content': content}]
