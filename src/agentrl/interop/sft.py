"""L4: agentrl records -> pre-tokenized SFT rows (TRL ``SFTTrainer``, SkyRL ``pretokenized_dataset_paths``).

Every SFT loader takes masks at **own index, full length** and shifts inside the loss:

* TRL (``trl/trainer/sft_trainer.py``): a dataset with ``input_ids`` is used as is; labels come from
  ``assistant_masks`` (``token if mask else -100``) or from a ``labels`` column.
* SkyRL: ``input_ids`` with a 0/1 ``loss_mask`` (``labels`` is rejected there).

So ``assistant_masks = loss_mask = [0] + action_mask`` and ``labels[t] = ids[t] if mask[t] else -100``.
Trap: handing agentrl's ``action_mask`` (length ``T-1``) itself as ``assistant_masks`` is silently
accepted by TRL (it zips without ``strict``): every label moves one token and the last is dropped.
:func:`check_sft_row` refuses that shape.
"""
from __future__ import annotations

from ..checks import errors as E
from .common import check_exportable, split
from .images import refuse_images

__all__ = ['to_sft', 'check_sft_row', 'SFT_FORMS']

#: ``'assistant_masks'`` (TRL), ``'labels'`` (TRL, -100 ignored), ``'loss_mask'`` (SkyRL).
SFT_FORMS = ('assistant_masks', 'labels', 'loss_mask')


def check_sft_row(row: dict, i: int = 0) -> None:
    """Refuse an SFT row whose mask is not one entry per ``input_ids`` token.

    Raises:
        agentrl.checks.errors.MaskAlignmentError: a mask of length ``T-1`` (agentrl's ``action_mask``
            handed as an own-index mask) or of any other length.
    """
    T = len(row['input_ids'])
    for k in ('assistant_masks', 'loss_mask', 'labels', 'completion_mask'):
        if k in row and len(row[k]) != T:
            raise E.MaskAlignmentError(
                f'SFT row {i}: has {len(row[k])} entries for {T} input_ids'
                + ('; this is a mask aligned to ids[1:] (agentrl action_mask), which the SFT collator would '
                   'shift by one token' if len(row[k]) == T - 1 else ''),
                field=k, fix='use [0] + action_mask (to_sft builds it)')


def to_sft(records, *, form: str = 'assistant_masks') -> list[dict]:
    """Export records as pre-tokenized SFT rows.

    Args:
        records: records (placeholder log-probs are fine: SFT ignores them).
        form: one of :data:`SFT_FORMS`.

    Returns:
        list of ``{'input_ids': [T] ints, form: [T]}`` (0/1 masks, or labels with -100).
        The rows train exactly ``sum(action_mask)`` tokens.

    Raises:
        ValueError: unknown ``form``; a record with no policy token.
        agentrl.checks.errors.RecordError: a record the acceptance check refuses.
    """
    if form not in SFT_FORMS:
        raise ValueError(f'to_sft: form={form!r}; use one of {SFT_FORMS}')
    records = list(records)
    refuse_images(records, 'to_sft', 'an SFT row (input_ids and a mask)')
    check_exportable(records, need_logp=False)
    out = []
    for i, r in enumerate(records):
        split(r, i)
        ids = r.ids.tolist()
        mask = [0] + r.action_mask.long().tolist()
        if form == 'labels':
            row = {'input_ids': ids, 'labels': [t if m else -100 for t, m in zip(ids, mask, strict=True)]}
        else:
            row = {'input_ids': ids, form: mask}
        check_sft_row(row, i)
        out.append(row)
    return out
