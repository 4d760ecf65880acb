"""L3: acceptance rules for records written through a chat template (``ChatRecorder``).

A chat record carries what these rules need in ``info['template']['chat_tokens']`` (written by
:meth:`agentrl.templates.ChatTemplate.chat_tokens`, stored with the record as ``info`` is):
``end_of_turn`` (the id the template writes after an assistant message, found by rendering one),
``stop`` (every id the engine may stop at), ``control`` (``[lo, hi)`` ranges of the tokenizer's
added/control ids) and ``content_text`` (``'plain'`` or ``'refuse'``). Records without it (the
word-level toy stack, hand-made records) are not checked by these rules.

- :func:`turn_closed`: every policy turn ends with the end-of-turn id, is followed by it, or ends
  the record (a final turn cut off by a length limit); a turn stopped at another stop id is closed
  as docs/design.md#policy-positions says.
- :func:`control_ids_not_in_content`: no control id is owned by a tool, user or system message
  (docs/design.md#data-is-text). The placeholder runs an image's entry of ``info['images']`` lists
  (``ids[start:start + length]``, owned by whoever supplied the image) are exempt, and only they:
  :func:`agentrl.checks.images.image_problems` refuses a placeholder id outside every run
  (docs/design.md#images); the vision delimiters around a run are template-owned already
  (:func:`agentrl.templates.vision.own_images`).
  Records imported without a tokenizer (:func:`unchecked_template_owners`) are skipped: their owners
  come from a trainer's mask, which does not keep template tokens apart from content.

Source: the chat template's own rendering (Hugging Face ``apply_chat_template``): the end-of-turn
closes every assistant message, and message content is text, never control tokens.
"""
from __future__ import annotations

from .._lazy import lazy_module

torch = lazy_module('torch')

from ..images import ImageEntryError, parse_images
from ..record import OWNER, owner_runs
from .errors import ControlTokenInContentError, RecordError, UnclosedTurnError

__all__ = ['chat_tokens', 'turn_closed', 'control_ids_not_in_content', 'unchecked_template_owners', 'image_runs']

_POLICY = OWNER['policy']


def chat_tokens(record) -> dict | None:
    """The record's ``info['template']['chat_tokens']`` when well-formed, else None (rules skip)."""
    info = getattr(record, 'info', None)
    tmpl = info.get('template') if isinstance(info, dict) else None
    ct = tmpl.get('chat_tokens') if isinstance(tmpl, dict) else None
    if not isinstance(ct, dict):
        return None
    try:
        return {'end_of_turn': [int(i) for i in ct.get('end_of_turn') or ()],
                'stop': [int(i) for i in ct.get('stop') or ()],
                'control': [(int(a), int(b)) for a, b in ct.get('control') or ()]}
    except (TypeError, ValueError):
        return None


def unchecked_template_owners(record) -> bool:
    """True for a record imported without a tokenizer (``info['import']['template_owners'] == 'mask'``):
    its template tokens are labelled prompt/tool by the mask, so :func:`control_ids_not_in_content`
    cannot tell them from forged ones and skips it (``agentrl check`` counts it as not checked;
    :func:`agentrl.interop.owners.finish_import`)."""
    info = getattr(record, 'info', None)
    imp = info.get('import') if isinstance(info, dict) else None
    return isinstance(imp, dict) and imp.get('template_owners') == 'mask'


def image_runs(record) -> list:
    """``[(start, end)]`` of the placeholder runs ``record.info['images']`` lists (``end = start + length``), or
    ``[]`` without images or with a malformed list (:func:`agentrl.checks.images.image_problems` words that).
    Raises nothing."""
    info = getattr(record, 'info', None)
    if not isinstance(info, dict) or 'images' not in info:
        return []
    try:
        return [(ref.start, ref.start + ref.length) for ref in parse_images(info['images'])]
    except ImageEntryError:
        return []


def turn_closed(r) -> list[RecordError]:
    """Every policy turn is closed by the template's end-of-turn id (sampled or template-written).

    Args:
        r: the validator's :class:`~agentrl.checks.acceptance.Facts` (``record``, ``ids [T]``, ``owner [T]``).

    Returns:
        ``[UnclosedTurnError]`` naming the first unclosed turn (position: the index into ``ids``
        where the end-of-turn is missing) and the count, or ``[]``.
    """
    ct = chat_tokens(r.record)
    if ct is None or not ct['end_of_turn']:
        return []
    eot = set(ct['end_of_turn'])
    ids = r.ids.tolist()
    turn = r.record.turn if r.record.turn is not None else [0] * len(ids)
    bad = [(k, e) for k, s, e in owner_runs(r.owner, turn, _POLICY)
           if ids[e - 1] not in eot and e < len(ids) and ids[e] not in eot]
    if not bad:
        return []
    k, e = bad[0]
    return [UnclosedTurnError(
        f'is {ids[e]}, but policy turn {k} ends with id {ids[e - 1]} (not the end-of-turn {sorted(eot)}) and the '
        "template's end-of-turn does not follow it", field='ids', position=e, count=len(bad),
        fix='keep the sampled stop id and append the end-of-turn template-owned (ChatRecorder does), or stop the '
            'engine at the end-of-turn')]


def control_ids_not_in_content(r) -> list[RecordError]:
    """No control id is owned by a tool or prompt (user/system) message, outside the image placeholder runs
    ``info['images']`` lists (:func:`image_runs`).

    Returns:
        ``[ControlTokenInContentError]`` at the first such id with the count, or ``[]``.
    """
    ct = chat_tokens(r.record)
    if ct is None or not ct['control'] or unchecked_template_owners(r.record):
        return []
    content = (r.owner == OWNER['tool']) | (r.owner == OWNER['prompt'])
    is_ctl = torch.zeros_like(content)
    for lo, hi in ct['control']:
        is_ctl |= (r.ids >= lo) & (r.ids < hi)
    bad = content & is_ctl
    if bool(bad.any()):
        for s, e in image_runs(r.record):
            bad[s:e] = False
    if not bool(bad.any()):
        return []
    where = torch.nonzero(bad).flatten()
    j = int(where[0])
    return [ControlTokenInContentError(
        f'is the control id {int(r.ids[j])}, owned by {"tool" if int(r.owner[j]) == OWNER["tool"] else "prompt"} '
        'content: message text became a control token (a forged turn boundary or role header)', field='ids',
        position=j, count=len(where),
        fix="record with ChatRecorder/label_owners, which encode control-token text in content as ordinary text "
            "(content_text='plain'), or clean the content")]
