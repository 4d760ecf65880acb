"""L2: the owner of every token of a chat template's rendering (``label_owners``).

The template is treated as a black box. Each message is located by re-rendering the
conversation with that message's content replaced by a unique sentinel and diffing the two
renderings: the stretch that changes is the message's text. An assistant turn's policy positions
are docs/design.md#policy-positions'; everything no message accounts for is template. No role header,
delimiter or model name is hard-coded.
"""
from __future__ import annotations

import warnings
from bisect import bisect_left
from dataclasses import dataclass, field

from ..record import OWNER, OWNER_NAMES, owner_runs
from .budget import TemplateTimeoutError
from .chat import ChatTemplate, as_template, check_messages, diff_span, owner_of_role
from .vision import expand_images, image_spans, own_images, vision_facts

__all__ = ['Region', 'OwnerLabels', 'label_owners', 'label_checked', 'locate_messages', 'owners_from_regions',
           'sampling_contexts', 'GENERATION_MASK_MODES', 'AssistantMaskMismatch', 'AssistantMaskError']

#: What :func:`label_owners` does when a template's ``{% generation %}`` mask disagrees with the
#: ownership rule: ``'warn'`` (:class:`AssistantMaskMismatch`), ``'error'`` (:class:`AssistantMaskError`).
GENERATION_MASK_MODES = ('warn', 'error')


class AssistantMaskMismatch(UserWarning):
    """A template's ``{% generation %}`` mask disagrees with agentrl's ownership rule (labels keep the rule)."""


class AssistantMaskError(ValueError):
    """As :class:`AssistantMaskMismatch`, raised with ``generation_mask='error'``."""


def _mask_message(diff: list, ids: list, template) -> str:
    k = diff[0]
    tok = template.tokens(ids[k:k + 1])
    return (f'the template\'s {{% generation %}} mask disagrees with the ownership rule (what the engine samples '
            f'after the generation prompt, through the end-of-turn token) on {len(diff)} tokens, first at token '
            f'{k} {tok}: agentrl labels by the rule (a ChatRecorder episode with this template records the same); '
            'fix the template\'s generation block, or pass generation_mask=\'error\' to stop on it')



@dataclass(frozen=True)
class Region:
    """A character span ``[start, end)`` of a rendering and who wrote it.

    Attributes:
        start, end: character offsets into the rendered text.
        owner: ``'prompt'``, ``'policy'`` or ``'tool'`` (uncovered text is ``'template'``).
        message: index of the message the span belongs to.
    """
    start: int
    end: int
    owner: str
    message: int


@dataclass
class OwnerLabels:
    """A rendered conversation, tokenized, with one owner per token.

    Attributes:
        text: the rendering (``apply_chat_template(..., tokenize=False)``).
        ids: ``[T]`` token ids of ``text`` (``add_special_tokens=False``), equal to
            ``apply_chat_template(..., tokenize=True)``.
        owner: ``[T]`` :data:`agentrl.record.OWNER` codes.
        offsets: ``[T]`` ``(start, end)`` character span of each token.
        message: ``[T]`` index of the message each token belongs to, -1 for template tokens.
        regions: the character spans found, sorted by ``start``.
        images: one :class:`~agentrl.images.ImageRef` per image part, in order (empty without images);
            ``[img.to_dict() for img in images]`` is a record's ``info['images']``.
        image_data: ``{digest: bytes}`` of those images, as received.
    """
    text: str
    ids: list
    owner: list
    offsets: list
    message: list
    regions: list = field(default_factory=list)
    images: list = field(default_factory=list)
    image_data: dict = field(default_factory=dict)

    def counts(self) -> dict:
        """Tokens per owner name, e.g. ``{'template': 350, 'prompt': 37, 'policy': 55, 'tool': 23}``."""
        out = {name: 0 for name in OWNER_NAMES}
        for o in self.owner:
            out[OWNER_NAMES[o]] += 1
        return out

    def owner_names(self) -> list:
        """``[T]`` owner names."""
        return [OWNER_NAMES[o] for o in self.owner]

    def spans(self, owner: str = 'policy') -> list:
        """Maximal runs of ``owner`` tokens as ``(message, start, end)`` token index ranges."""
        return owner_runs(self.owner, self.message, OWNER[owner])


def _find_prefix_of(g: str, window: str) -> tuple[int, int]:
    """Largest k with ``g[:k]`` in ``window``; returns (k, position of its last occurrence)."""
    if not g or not window:
        return 0, -1
    lo, hi = 0, len(g)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if g[:mid] in window:
            lo = mid
        else:
            hi = mid - 1
    return lo, (window.rfind(g[:lo]) if lo else -1)


def locate_messages(template: ChatTemplate, messages: list, add_generation_prompt: bool = False,
                    text: str | None = None, fast: bool = True) -> tuple[str, list]:
    """Find the character span of every message in the template's rendering.

    Args:
        template: the :class:`ChatTemplate`.
        messages: the conversation.
        add_generation_prompt: render with the generation prompt.
        text: the rendering, when already computed.
        fast: first try one rendering with every content swapped for a sentinel (two renderings in
            all, whatever the length; used when putting the contents back gives the rendering
            exactly); False locates every message by its own diff rendering (one rendering per message).

    Returns:
        ``(text, regions)``: the rendering and a list of :class:`Region`, sorted by start.
        Content of system/user messages is ``prompt``, of tool messages ``tool``; an assistant
        message is ``policy`` from the end of the generation prompt (as the template writes it
        before that turn) through its end-of-turn token.

    Raises:
        ValueError: a message the template does not render (e.g. assistant ``tool_calls`` on a
            template without tool-call support; the error names the message and the call), or
            two messages whose text cannot be separated.

    Source: Hugging Face ``apply_chat_template``; the "after the generation prompt through the
    end-of-turn token" rule is book chapter 5.2-5.3.
    """
    gen = add_generation_prompt
    R = template.render(messages, gen) if text is None else text
    found = _locate_fast(template, messages, gen, R) if fast else None
    if found is not None:
        return R, _check_overlaps(found)
    raw = []  # (i, start, end, sentinel_part) per message
    for i, m in enumerate(messages):
        z = template.sentinel(i, avoid=R)
        probe = {'role': 'assistant', 'content': z} if m['role'] == 'assistant' else dict(m, content=z)
        other = template.render(messages[:i] + [probe] + messages[i + 1:], gen)
        a, b, y = diff_span(R, other, z)
        raw.append((i, a, b, y, z))
    regions = []
    starts = sorted((a, b) for _, a, b, y, z in raw if z in y and b > a)
    for idx, (i, a, b, y, z) in enumerate(raw):
        m = messages[i]
        role = m['role']
        content = m.get('content')
        if z not in y:
            has_text = (isinstance(content, str) and content.strip()) or m.get('tool_calls') or \
                (role == 'assistant' and (m.get('reasoning_content') or '').strip())
            if has_text:
                raise ValueError(f'messages[{i}] ({role}) does not appear in the rendering: this chat template '
                                 'drops it (check its role and fields against the template)')
            continue
        if role != 'assistant':
            if b <= a:
                continue
            if y != z and isinstance(content, str) and content:
                # the template also rendered surrounding text differently: narrow to the content
                for c in (content, content.strip(), content.strip('\n')):
                    k = R.find(c, a, b) if c else -1
                    if k >= 0:
                        a, b = k, k + len(c)
                        break
            regions.append(Region(a, b, owner_of_role(role), i))
            continue
        # assistant: start after the generation prompt the template writes before this turn
        g = template.generation_prompt(messages[:i]) if i > 0 else ''
        prev_end = max([e for s, e in starts if e <= a] + [0])
        k, pos = _find_prefix_of(g, R[prev_end:a])
        start = prev_end + pos + k if k else a
        nxt = min([s for s, e in starts if s >= b] + [len(R)])
        window = R[b:nxt]
        hits = [(window.find(t), t) for t in template.stop_texts if window.find(t) >= 0]
        end = b + min(hits)[0] + len(min(hits)[1]) if hits else b
        span = R[start:end]
        for call in m.get('tool_calls') or ():
            name = (call.get('function') or call).get('name') if isinstance(call, dict) else None
            if name and name not in span:
                raise ValueError(f'messages[{i}]["tool_calls"]: this chat template does not render tool calls '
                                 f'(the call to {name!r} is missing from its rendering); it cannot train tool '
                                 'calls as structured messages: write the call into "content" as the model '
                                 'emits it, or use a template with tool-call support')
        regions.append(Region(start, end, 'policy', i))
    return R, _check_overlaps(regions)


def _check_overlaps(regions: list) -> list:
    regions.sort(key=lambda r: (r.start, r.end))
    for r0, r1 in zip(regions, regions[1:]):
        if r1.start < r0.end:
            raise ValueError(f'messages[{r0.message}] and messages[{r1.message}] overlap in the rendering '
                             f'(chars {r0.start}-{r0.end} and {r1.start}-{r1.end}): the template renders them '
                             'together or changes one when the other changes, so their tokens have no single owner')
    return regions


def coarse_shape(m: dict) -> tuple:
    """A message's structure: role, whether it has content, and its other non-empty fields (no values)."""
    return (m.get('role'), bool(m.get('content')),
            tuple(sorted(k for k, v in m.items() if k not in ('role', 'content') and v not in (None, '', [], {}))))


def _window_prompt(template, messages: list, i: int, last: int, cache: dict) -> str:
    """The generation prompt before message ``i``, rendered on a window with the same structure.

    The window is the opening through the first user message plus the messages since ``last``
    (the last assistant turn before ``i``, or -1); the prompt is cached per window structure.
    """
    first_user = next((k for k, m in enumerate(messages) if m['role'] == 'user'), 0)
    window = messages[:first_user + 1] + messages[max(last, first_user + 1):i]
    key = tuple(coarse_shape(m) for m in window)
    if key not in cache:
        cache[key] = template.generation_prompt(window)
    return cache[key]


def _locate_fast(template, messages: list, gen: bool, R: str) -> list | None:
    """Regions from one rendering with every content swapped for a sentinel (O(total length)).

    Used when putting the contents back into that rendering gives exactly ``R`` (the template inserts
    contents verbatim and its structure does not depend on them); None otherwise (then every
    message is located by its own diff rendering).
    """
    if len(messages) < 8:
        return None                      # short conversations: the per-message diff is cheap and exact
    import re
    nonce = 0
    while f'AgentrlSlotN{nonce}Q' in R:                    # a base not in R, so no 'base<i>Z' is either
        nonce += 1
    base = f'AgentrlSlotN{nonce}Q'
    probe, slots = [], {}
    for i, m in enumerate(messages):
        c = m.get('content')
        if isinstance(c, str) and c:
            probe.append(dict(m, content=f'{base}{i}Z'))
            slots[i] = c
        else:
            probe.append(m)
    try:
        S = template.render(probe, gen)
    except TemplateTimeoutError:
        raise
    except ValueError:
        return None
    found, seen = [], set()
    for hit in re.finditer(re.escape(base) + r'(\d+)Z', S):
        i = int(hit.group(1))
        if i not in slots or i in seen:
            return None
        seen.add(i)
        found.append((hit.start(), i, hit.group(0), slots[i]))
    if len(seen) != len(slots):
        return None
    pieces, pos, shift, span = [], 0, 0, {}
    for k, i, z, c in found:
        pieces += [S[pos:k], c]
        span[i] = (k + shift, k + shift + len(c))
        shift += len(c) - len(z)
        pos = k + len(z)
    pieces.append(S[pos:])
    if ''.join(pieces) != R:
        return None
    regions, prev_end, cache, last = [], 0, {}, -1
    starts = [span[i][0] if i in span else None for i in range(len(messages))]
    following, nxt_start = [len(R)] * len(messages), len(R)
    for i in range(len(messages) - 1, -1, -1):              # start of the next message with a content span
        following[i] = nxt_start
        if starts[i] is not None:
            nxt_start = starts[i]
    for i, m in enumerate(messages):
        if m['role'] != 'assistant':
            if i in span:
                regions.append(Region(*span[i], owner_of_role(m['role']), i))
                prev_end = span[i][1]
            continue
        nxt = following[i]
        g = _window_prompt(template, messages, i, last, cache) if i > 0 else ''
        last = i
        bound = span[i][0] if i in span else nxt
        k, p = _find_prefix_of(g, R[prev_end:bound])
        if g and k < len(g):
            g = template.generation_prompt(messages[:i])      # the window guessed wrong: render it exactly
            k, p = _find_prefix_of(g, R[prev_end:bound])
        start = prev_end + p + k if k else (span[i][0] if i in span else prev_end)
        after = span[i][1] if i in span else start
        hits = [(R.find(t, after, nxt), t) for t in template.stop_texts if R.find(t, after, nxt) >= 0]
        if not hits:
            return None
        end = min(hits)[0] + len(min(hits)[1])
        if end > nxt:
            return None
        piece = R[start:end]
        for call in m.get('tool_calls') or ():
            name = (call.get('function') or call).get('name') if isinstance(call, dict) else None
            if name and name not in piece:
                return None                     # the slow path names the call the template drops
        if (m.get('content') or m.get('tool_calls')) and end <= start:
            return None
        regions.append(Region(start, end, 'policy', i))
        prev_end = end
    return regions


def _first(offset) -> int:
    return offset[0]


def owners_from_regions(offsets: list, regions: list, n_chars: int) -> tuple[list, list]:
    """Owner code and message index of each token: those of the region holding its first char.

    Args:
        offsets: ``[T]`` ``(start, end)`` character spans.
        regions: sorted, disjoint :class:`Region` list.
        n_chars: length of the text (for zero-width tokens at the end).

    Returns:
        ``(owner [T] int codes, message [T] ints, -1 for template)``.

    Raises:
        KeyError: a region with an owner name outside :data:`agentrl.record.OWNER`.

    Source: book chapter 5.2 (label characters first, then give each token the label of its
    first character).
    """
    owner = [OWNER['template']] * len(offsets)
    message = [-1] * len(offsets)
    for r in regions:  # tokens whose first character lies in [r.start, r.end)
        i = bisect_left(offsets, r.start, key=_first)
        j = bisect_left(offsets, r.end, lo=i, key=_first)
        if j > i:
            owner[i:j] = [OWNER[r.owner]] * (j - i)
            message[i:j] = [r.message] * (j - i)
    return owner, message


def label_owners(tokenizer, messages, *, add_generation_prompt: bool = False, tools=None,
                 generation_mask: str = 'warn', **options) -> OwnerLabels:
    """Label every token of a finished conversation's rendering with its owner.

    Args:
        tokenizer: a Hugging Face tokenizer or a :class:`ChatTemplate`.
        messages: the conversation as message dicts (e.g. SFT data).
        add_generation_prompt: also render (template-owned) the generation prompt.
        tools: tool schemas for the template (``tools=``); only with a tokenizer.
        generation_mask: for templates with ``{% generation %}`` blocks, what to do when
            transformers' ``assistant_masks`` disagrees with the ownership rule (one of
            :data:`GENERATION_MASK_MODES`); the labels always follow the rule.
        **options: :class:`ChatTemplate` options (``enable_thinking=False``, ``chat_template``,
            ``stop_tokens``, ``content_text``); only with a tokenizer.

    Returns:
        :class:`OwnerLabels` with ``ids [T]`` equal to ``apply_chat_template(...,
        tokenize=True)`` and ``owner [T]`` int64 codes: assistant content, reasoning, tool
        calls and the end-of-turn token -> policy; system and user content -> prompt; tool
        results -> tool; role headers, delimiters, the tool-schema preamble, the generation
        prompt and the empty think block a template inserts before a non-thinking turn ->
        template. A token spanning two owners takes the owner of its first character.
        One ownership rule for SFT labels and RL records (:class:`ChatRecorder` gives the same
        policy positions): policy is what the engine samples after the generation prompt,
        through the end-of-turn token; never the generation prompt, a think block the template
        inserts, or the newline after the end-of-turn. Control-token text inside system, user
        and tool content is encoded as ordinary text (``content_text='plain'``) or refused.
        List-of-parts content is rendered as its text; on a vision template (``vision`` settings) an
        ``image_url`` part of a user or tool message is rendered as the template's image text with its
        placeholder repeated as the processor computes (:func:`~agentrl.templates.vision.expand_images`):
        the placeholder ids are the supplier's (prompt or tool), the delimiters the template's, and
        ``images`` says where each image is.

    Raises:
        ValueError: a message the template drops (for example ``tool_calls`` on Llama 3.0 or on
            DeepSeek-V3 under transformers 5, whose template needs ``content=None``), ``tools=``
            on a template that ignores them, a non-text content part (an image part on a text-only
            template; an http(s) image URL), an image whose placeholder count in the rendering is not the
            processor's (names the image and both counts), or malformed messages; each names the field.
        ControlTextError: control-token text in non-policy content with ``content_text='refuse'``.
        AssistantMaskError: with ``generation_mask='error'``, a ``{% generation %}`` mask that
            disagrees with the rule (with ``'warn'`` an :class:`AssistantMaskMismatch` warning).
        ImportError: without ``pip install agentrl[hf]``.

    Example:
        >>> lab = label_owners(qwen_tok, [{'role': 'user', 'content': 'Hi'},
        ...                               {'role': 'assistant', 'content': 'Yo'}])
        >>> qwen_tok.convert_ids_to_tokens(lab.ids[9:])
        ['<think>', 'ĊĊ', '</think>', 'ĊĊ', 'Yo', '<|im_end|>', 'Ċ']
        >>> lab.owner_names()[9:]        # thinking mode: the model writes the think block itself
        ['policy', 'policy', 'policy', 'policy', 'policy', 'policy', 'template']

    Source: book chapter 5.2 (owners of Qwen3's rendering) and 5.3 (thinking mode).
    """
    if generation_mask not in GENERATION_MASK_MODES:
        raise ValueError(f'generation_mask={generation_mask!r}; use one of {GENERATION_MASK_MODES}')
    template = as_template(tokenizer, tools=tools, **options)
    messages, images = expand_images(template, messages)
    return label_checked(template, check_messages(messages), images, add_generation_prompt, generation_mask)


def label_checked(template: ChatTemplate, messages: list, images: list, add_generation_prompt: bool = False,
                  generation_mask: str = 'warn') -> OwnerLabels:
    """:func:`label_owners` of messages already through :func:`~agentrl.templates.vision.expand_images` and
    :func:`~agentrl.templates.messages.check_messages` (``images`` the former's
    :class:`~agentrl.templates.vision.PendingImage` list).

    Raises:
        ValueError, ControlTextError, AssistantMaskError: as :func:`label_owners`.
    """
    text, regions = locate_messages(template, messages, add_generation_prompt)
    ids, offsets = template.encode_offsets(text, [r for r in regions if r.owner != 'policy'])
    owner, message = owners_from_regions(offsets, regions, len(text))
    facts = vision_facts(template) if images else None
    if facts is not None:
        owner = own_images(ids, owner, facts)
    if template.has_generation_blocks:
        _check_generation_mask(template, messages, add_generation_prompt, ids, owner, generation_mask)
    return OwnerLabels(text=text, ids=ids, owner=owner, offsets=offsets, message=message, regions=regions,
                       images=image_spans(ids, owner, images, facts),
                       image_data={img.digest: img.data for img in images})


def _check_generation_mask(template, messages, gen, ids, owner, mode) -> None:
    """Compare transformers' ``assistant_masks`` with the rule's policy tokens; warn or raise on a difference."""
    out = template.tokenizer.apply_chat_template(
        messages, tools=template.tools, chat_template=template.chat_template, tokenize=True,
        return_dict=True, return_assistant_tokens_mask=True, add_generation_prompt=gen,
        **template.template_kwargs)
    if list(out['input_ids']) != list(ids):
        if template.encode(template.render(messages, gen)) != list(ids):
            return      # control text in content was encoded as ordinary text: no like-for-like mask
        raise ValueError('return_assistant_tokens_mask tokenized the rendering differently from '
                         'tokenizer(text, add_special_tokens=False); cannot align {% generation %} spans')
    pol = OWNER['policy']
    diff = [k for k, (m, o) in enumerate(zip(out['assistant_masks'], owner)) if bool(m) != (o == pol)]
    if diff:
        msg = _mask_message(diff, ids, template)
        if mode == 'error':
            raise AssistantMaskError(msg)
        warnings.warn(msg, AssistantMaskMismatch, stacklevel=3)


def sampling_contexts(tokenizer, messages, *, tools=None, **options) -> list:
    """The template's sampling context before each assistant message of a conversation.

    For conversations that were not recorded token-in/token-out (logs, SFT data): context ``i``
    is ``render(messages[:i], add_generation_prompt=True)`` tokenized, what a chat API would
    have fed the model before turn ``i``.

    Args:
        tokenizer: a Hugging Face tokenizer or a :class:`~agentrl.templates.ChatTemplate`.
        messages: the conversation.
        tools, **options: template options (only with a tokenizer).

    Returns:
        ``[(i, ids [L_i] list of int)]`` for every assistant message ``i > 0``.

    Raises:
        ValueError: malformed messages.

    Source: book chapter 5.3 and 5.8.
    """
    template = as_template(tokenizer, tools=tools, **options)
    messages = check_messages(messages)
    plain = [m.get('content') for m in messages if m['role'] != 'assistant']
    return [(i, template.encode_plain(template.render(messages[:i], True), plain))
            for i, m in enumerate(messages) if m['role'] == 'assistant' and i > 0]
