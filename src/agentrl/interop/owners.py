"""L4: the template's ownership of an imported record, rebuilt from the tokenizer's chat tokens.

A trainer's batch keeps one bit per token (trained or not), so an importer can only tell policy
tokens (mask 1) from the rest (``prompt`` before the first policy token, ``tool`` after it,
:func:`agentrl.interop.common.record_from_response`). The chat template's own control tokens
(role headers, ``<|im_end|>``, ``<tool_response>`` ...) then look like message content, and the
acceptance rule :func:`agentrl.checks.template_rules.control_ids_not_in_content` would refuse every
chat record.

With a tokenizer, :func:`finish_import` gives those ids back to the template: a non-policy id in
the tokenizer's control ranges (:meth:`agentrl.templates.ChatTemplate.chat_tokens`, the ranges
``ChatRecorder`` stores) is ``template``-owned. This is the recorder's own invariant: with
``content_text`` ``'plain'`` or ``'refuse'`` no message content ever holds a control id, so in a record
``ChatRecorder`` made every control id outside policy turns was written by the template. The records
get the tokenizer's ``chat_tokens`` (when they carry none), so the end-of-turn and closed-turn rules
apply to them.

Without a tokenizer nothing is relabelled and each chat record says so in ``info['import']``
(``template_owners: 'mask'``); the control-token rule then skips it and ``agentrl check`` counts it
as not checked (:func:`unchecked_template_owners`). docs/interop.md#template-ownership.
"""
from __future__ import annotations

import torch

from ..checks import errors as E
from ..checks.template_rules import chat_tokens, unchecked_template_owners  # noqa: F401 - re-exported
from ..record import OWNER
from ..templates.chat import as_template, tokenizer_fingerprint

__all__ = ['finish_import', 'UNCHECKED_NOTE', 'unchecked_template_owners']

_POLICY, _TEMPLATE = OWNER['policy'], OWNER['template']

#: The one line ``agentrl import`` prints (and ``info['import']['unchecked']`` holds) without ``--tokenizer``.
UNCHECKED_NOTE = ('template ownership (imported without --tokenizer: owners come from the mask, so the '
                  "template's control tokens count as prompt/tool content, and one forged by a message's text "
                  'cannot be told apart)')


def _note(rec, **fields) -> None:
    info = rec.info if isinstance(rec.info, dict) else {}
    imp = info.get('import') if isinstance(info.get('import'), dict) else {}
    info['import'] = {**imp, **fields}
    rec.info = info


def finish_import(records: list, tokenizer, what: str) -> list:
    """Rebuild template ownership of imported records from ``tokenizer`` (or mark it unchecked); in place.

    Args:
        records: records an importer built (owners from the mask).
        tokenizer: a Hugging Face tokenizer with a chat template, a :class:`agentrl.templates.ChatTemplate`,
            or None.
        what: the importer (``'from_verl'``), named in errors.

    Returns:
        ``records``: each ``owner [T]`` with the control ids outside policy tokens as ``template``;
        ``info['template']['chat_tokens']`` set where absent; ``info['import']['template_owners']``
        ``'tokenizer'``. Without a tokenizer, records that carry ``chat_tokens`` (a chat record exported
        by agentrl) get ``'mask'`` and ``info['import']['unchecked']`` (:data:`UNCHECKED_NOTE`); others
        are left as they are (no template rule applies to them).
        ``action_mask`` is unchanged (template, prompt and tool tokens are all untrained).

    Raises:
        agentrl.checks.errors.TokenizerMismatchError: a record's ``provenance.tokenizer`` is
            another tokenizer's fingerprint (fix: pass the tokenizer the rollouts used).
        ValueError: the tokenizer has no chat template (as :class:`agentrl.templates.ChatTemplate`).
    """
    if tokenizer is None:
        for r in records:
            if chat_tokens(r) is not None:          # a chat record: its template rules need the owners
                _note(r, template_owners='mask', unchecked=[UNCHECKED_NOTE])
        return records
    template = as_template(tokenizer)
    ct, fp = template.chat_tokens(), tokenizer_fingerprint(template)
    for i, r in enumerate(records):
        had = r.provenance.tokenizer if r.provenance is not None else ''
        if had and had != fp:
            raise E.TokenizerMismatchError(
                f'{what} row {i}: was tokenized by {had!r}, but --tokenizer is {fp!r}; its ids would be read as '
                "another vocabulary's tokens", field='provenance.tokenizer',
                fix='pass the tokenizer folder the rollouts used')
        if r.provenance is not None and not had:
            r.provenance.tokenizer = fp
        ids, owner = torch.as_tensor(r.ids), torch.as_tensor(r.owner).clone()
        ctl = torch.zeros_like(ids, dtype=torch.bool)
        for lo, hi in ct['control']:
            ctl |= (ids >= lo) & (ids < hi)
        owner[ctl & (owner != _POLICY)] = _TEMPLATE
        r.owner = owner
        if chat_tokens(r) is None:
            info = r.info if isinstance(r.info, dict) else {}
            tmpl = info.get('template') if isinstance(info.get('template'), dict) else {}
            info['template'] = {**tmpl, 'chat_tokens': ct}
            r.info = info
        _note(r, template_owners='tokenizer')
    return records
