"""L2: images through a chat template: the processor settings, the template's image text, its expansion.

A vision-language template writes one placeholder per image (Qwen2.5-VL:
``<|vision_start|><|image_pad|><|vision_end|>``); the model needs one placeholder id per merged patch.
:func:`expand_images` turns every ``image_url`` part of a user or tool message into a text part holding
the template's image text with the placeholder repeated :func:`~agentrl.images.placeholder_count` times
(computed from the image size and the processor settings, no tensors), so every rendering, label and
bridge sees the expanded text. Owners follow docs/design.md#ownership: the placeholder ids are the
supplier's (prompt or tool), the delimiters around them the template's (:func:`own_images`).

Functions here take the :class:`~agentrl.templates.ChatTemplate` by duck typing (``render``, ``tokens``,
``encode``, ``vision``); chat.py imports :func:`vision_settings` from here.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from ..images import (IMAGE_OWNERS, PROCESSOR_KEYS, ImageRef, decode_image_url, image_digest, image_size,
                      placeholder_count, vision_grid)
from ..record import OWNER
from .messages import TOOL_ROLES, owner_of_role

__all__ = ['vision_settings', 'VisionFacts', 'vision_facts', 'PendingImage', 'expand_images', 'own_images',
           'image_spans', 'IMAGE_TOKEN']

#: The placeholder text of the Qwen2-VL processors (``Qwen2_5_VLProcessor.image_token``), used when the model
#: folder's ``config.json`` names no ``image_token_id``.
IMAGE_TOKEN = '<|image_pad|>'
_PROBE_URL = 'data:image/png;base64,'


def vision_settings(source) -> dict | None:
    """The image processor settings of a model folder, or None for a text-only model.

    Args:
        source: a Hugging Face tokenizer (its ``name_or_path`` folder is read), a folder path, a settings
            dict (returned checked), or None / False.

    Returns:
        ``{'class', 'patch_size', 'merge_size', 'temporal_patch_size', 'min_pixels', 'max_pixels',
        'image_mean', 'image_std'}`` (:data:`agentrl.images.PROCESSOR_KEYS`) plus ``image_token_id``
        (from the folder's ``config.json``, None when absent); None when the folder holds no
        ``preprocessor_config.json``, or one of another processor family (no ``patch_size`` / ``merge_size`` /
        pixel bounds: a SigLIP or CLIP processor), whose images agentrl does not size: its template stays text-only.

    Raises:
        ValueError: a ``preprocessor_config.json`` that is not JSON; a settings dict without ``patch_size`` /
            ``merge_size`` / pixel bounds (names the key).

    Source: the Qwen2-VL image processor's saved settings (``size.shortest_edge`` is ``min_pixels``,
    ``size.longest_edge`` ``max_pixels``).
    """
    if source is None or source is False:
        return None
    if isinstance(source, dict):
        return _checked(dict(source), 'vision=')
    folder = getattr(source, 'name_or_path', source)
    try:
        path = Path(folder) / 'preprocessor_config.json'
        if not path.is_file():
            return None
    except (TypeError, OSError):
        return None
    try:
        raw = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise ValueError(f'{path} is not a JSON file ({e}); save the image processor with save_pretrained') from e
    size = raw.get('size') or {}
    out = {'class': raw.get('image_processor_type'), 'patch_size': raw.get('patch_size'),
           'merge_size': raw.get('merge_size'), 'temporal_patch_size': raw.get('temporal_patch_size'),
           'min_pixels': raw.get('min_pixels') or size.get('shortest_edge'),
           'max_pixels': raw.get('max_pixels') or size.get('longest_edge'),
           'image_mean': raw.get('image_mean'), 'image_std': raw.get('image_std')}
    cfg = path.parent / 'config.json'
    token = None
    if cfg.is_file():
        try:
            token = json.loads(cfg.read_text()).get('image_token_id')
        except (OSError, ValueError):
            token = None
    out['image_token_id'] = token
    if not all(isinstance(out[k], int) and out[k] > 0 for k in ('patch_size', 'merge_size', 'min_pixels', 'max_pixels')):
        return None             # not a Qwen2-VL-style processor: images stay refused by name
    return out


def _checked(s: dict, where: str) -> dict:
    for k in ('patch_size', 'merge_size', 'min_pixels', 'max_pixels'):
        if not isinstance(s.get(k), int) or s[k] < 1:
            raise ValueError(f'{where}: image processor setting {k!r} is {s.get(k)!r}; it must be a positive int')
    s.setdefault('image_token_id', None)
    return s


@dataclass(frozen=True)
class VisionFacts:
    """What a template writes for one image, and which of its tokens are what.

    Attributes:
        settings: :func:`vision_settings`. processor: the settings an :class:`~agentrl.images.ImageRef`
            records (:data:`~agentrl.images.PROCESSOR_KEYS`).
        image_text: the template's text for one image (``'<|vision_start|><|image_pad|><|vision_end|>'``).
        placeholder: the placeholder text (``'<|image_pad|>'``); placeholder_id its id.
        control_texts: the control-token texts of ``image_text`` (refused in text content; encoded as the
            control ids they are inside an expanded image). delimiter_ids: their ids but the placeholder's.
    """
    settings: dict
    processor: dict
    image_text: str
    placeholder: str
    placeholder_id: int
    control_texts: frozenset
    delimiter_ids: frozenset

    def expanded(self, n: int) -> str:
        """The image text with the placeholder repeated ``n`` times."""
        return self.image_text.replace(self.placeholder, self.placeholder * n)


def vision_facts(template) -> VisionFacts | None:
    """The template's :class:`VisionFacts` (computed once per template), or None for a text-only template.

    Raises:
        ValueError: the template writes no text for an image part, or not exactly one placeholder for it
            (names the template and what it wrote); the placeholder is not one token.
    """
    settings = getattr(template, 'vision', None)
    if not settings:
        return None
    cache = template._cache
    if 'vision_facts' in cache:
        return cache['vision_facts']
    a, b = 'AgentrlImageBefore', 'AgentrlImageAfter'
    image = {'type': 'image_url', 'image_url': {'url': _PROBE_URL}}
    text = template.render([{'role': 'user', 'content': [{'type': 'text', 'text': a}, image,
                                                        {'type': 'text', 'text': b}]}], False, tools=None)
    i, j = text.find(a), text.find(b)
    image_text = text[i + len(a):j] if 0 <= i < j else ''
    if not image_text:
        raise ValueError(f'{template.name} writes nothing for an image_url part: it is not a vision-language '
                         'template; pass a template that renders images, or send no images')
    tok = template.tokenizer
    pid = settings.get('image_token_id')
    placeholder = tok.convert_ids_to_tokens(int(pid)) if pid is not None else IMAGE_TOKEN
    if image_text.count(placeholder) != 1:
        raise ValueError(f'{template.name} writes {image_text!r} for one image, with {image_text.count(placeholder)} '
                         f'placeholders {placeholder!r}; agentrl expands exactly one per image')
    ids = template.encode(placeholder)
    if len(ids) != 1:
        raise ValueError(f'the image placeholder {placeholder!r} encodes to {len(ids)} tokens; it must be one token')
    ctl = template._control_re
    texts = frozenset(m.group(0) for m in ctl.finditer(image_text)) if ctl is not None else frozenset()
    delims = frozenset(i for t in texts - {placeholder} for i in template.encode(t))
    facts = VisionFacts(settings, {k: settings.get(k) for k in PROCESSOR_KEYS}, image_text, placeholder, ids[0],
                        texts | {placeholder}, delims)
    cache['vision_facts'] = facts
    return facts


@dataclass
class PendingImage:
    """An image part found in a message, before its placeholders are located in the ids.

    Attributes: digest, data (the bytes as received), ext (``'png'`` / ``'jpg'``), grid ``[t, h, w]``,
    length (placeholder ids), owner (``'prompt'`` / ``'tool'``), message (its index in the messages given).
    """
    digest: str
    data: bytes
    ext: str
    grid: list
    length: int
    owner: str
    message: int


def expand_images(template, messages, field: str = 'messages') -> tuple[list, list]:
    """Replace every ``image_url`` part by a text part holding the template's expanded image text.

    Args:
        template: a :class:`~agentrl.templates.ChatTemplate`; without vision settings the messages come back
            unchanged (and :func:`~agentrl.templates.messages.check_messages` refuses image parts by name).
        messages: message dicts (content a string or a list of parts). field: what errors call them.

    Returns:
        ``(messages, images)``: shallow copies with image parts replaced, and one :class:`PendingImage` per
        image in message order.

    Raises:
        ValueError: an image in a message that is not a user or tool message; an ``http(s)`` or malformed URL
            (:func:`agentrl.images.decode_image_url`); bytes that are not an image; text content holding the
            template's image control text (``'<|image_pad|>'``: send images as ``image_url`` parts); each names
            the field and the part.

    Source: the OpenAI chat format's ``image_url`` part; docs/design.md#images.
    """
    facts = vision_facts(template)
    if facts is None or not isinstance(messages, (list, tuple)):
        return messages, []
    out, images = [], []
    for i, m in enumerate(messages):
        if not isinstance(m, dict):
            out.append(m)
            continue
        role, c = m.get('role'), m.get('content')
        where = f'{field}[{i}]["content"]'
        if isinstance(c, str):
            if role != 'assistant':
                _refuse_control(c, facts, where)
            out.append(m)
            continue
        if not isinstance(c, list):
            out.append(m)
            continue
        parts = []
        for j, p in enumerate(c):
            kind = p.get('type') if isinstance(p, dict) else None
            if kind == 'text' and isinstance(p.get('text'), str) and role != 'assistant':
                _refuse_control(p['text'], facts, f'{where}[{j}]')
            if kind != 'image_url':
                parts.append(p)
                continue
            owner = owner_of_role(role) if role == 'user' or role in TOOL_ROLES else None
            if owner not in IMAGE_OWNERS:
                raise ValueError(f'{where}[{j}] is an image in a {role!r} message; images go in user messages '
                                 'or tool results')
            spec = p.get('image_url')
            url = spec.get('url') if isinstance(spec, dict) else spec
            data, ext = decode_image_url(url, f'{where}[{j}]["image_url"]')
            w, h = image_size(data, f'{where}[{j}]')
            grid = vision_grid(w, h, facts.settings)
            n = placeholder_count(grid, facts.settings['merge_size'])
            parts.append({'type': 'text', 'text': facts.expanded(n)})
            images.append(PendingImage(image_digest(data), data, ext, grid, n, owner, i))
        out.append(dict(m, content=parts))
    return out, images


def _refuse_control(text: str, facts: VisionFacts, where: str) -> None:
    for t in facts.control_texts:
        if t in text:
            raise ValueError(f'{where} holds the image control text {t!r}: send an image as an image_url part '
                             '(data:image/png;base64,...), never its placeholder as text')


def own_images(ids, owner, facts: VisionFacts | None) -> list:
    """``owner`` with the image delimiters inside supplied content given to the template (a new list).

    A delimiter id (``<|vision_start|>``) owned by prompt or tool came from an expanded image (text content
    cannot hold it, :func:`expand_images`); a policy-sampled one stays the policy's.
    """
    owner = list(owner)
    if facts is None:
        return owner
    supplied = (OWNER['prompt'], OWNER['tool'])
    for k, (i, o) in enumerate(zip(ids, owner)):
        if o in supplied and i in facts.delimiter_ids:
            owner[k] = OWNER['template']
    return owner


def image_spans(ids, owner, images: list, facts: VisionFacts | None) -> list:
    """Locate each image's placeholder run in ``ids``: one :class:`~agentrl.images.ImageRef` per image.

    Args:
        ids: ``[T]`` token ids. owner: ``[T]`` owner codes. images: :class:`PendingImage` in message order.
        facts: the template's :class:`VisionFacts`.

    Returns:
        ImageRef list in order (empty without images).

    Raises:
        ValueError: the ids hold another number of supplied placeholder ids than the images need, or an
            image's run is not contiguous or not owned by its supplier: the error names the image (index and
            digest) and both counts (the template's rendering against the processor's).
    """
    if not images:
        return []
    pol = OWNER['policy']
    pos = [k for k, (i, o) in enumerate(zip(ids, owner)) if i == facts.placeholder_id and o != pol]
    out, p = [], 0
    for q, img in enumerate(images):
        run = pos[p:p + img.length]
        nxt = pos[p + img.length] if p + img.length < len(pos) else None
        contiguous = bool(run) and run[-1] - run[0] == len(run) - 1
        if len(run) != img.length or not contiguous or (nxt is not None and nxt == run[-1] + 1 and
                                                        q == len(images) - 1):
            found = _run_length(pos, p)
            raise ValueError(f'image {q} ({img.digest}): the rendering holds {found} placeholder ids '
                             f'{facts.placeholder!r} for it, the processor computes {img.length} '
                             f'(grid {img.grid}, merge {facts.settings["merge_size"]})')
        if any(owner[k] != OWNER[img.owner] for k in run):
            raise ValueError(f'image {q} ({img.digest}): its placeholder ids are not all owned by {img.owner!r}')
        out.append(ImageRef(img.digest, run[0], img.length, tuple(img.grid), img.owner, dict(facts.processor)))
        p += img.length
    if p != len(pos):
        raise ValueError(f'the ids hold {len(pos)} supplied placeholder ids {facts.placeholder!r}, the '
                         f'{len(images)} images need {p}')
    return out


def _run_length(pos: list, p: int) -> int:
    """Length of the contiguous run of positions starting at ``pos[p]`` (0 when none is left)."""
    if p >= len(pos):
        return 0
    n = 1
    while p + n < len(pos) and pos[p + n] == pos[p] + n:
        n += 1
    return n
