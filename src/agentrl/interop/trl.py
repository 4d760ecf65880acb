"""L4: agentrl records <-> TRL's ``GRPOTrainer`` batch, and its ``rollout_func`` hook.

Two forms (TRL 1.16, ``trl/trainer/grpo_trainer.py``):

1. **rollout_func output** (``GRPOTrainer._generate``): one row per prompt, lists:
   ``prompt_ids = ids[:P]``, ``completion_ids = ids[P:E]``, ``logprobs = sample_logp[P-1:E-1]``,
   ``env_mask = action_mask[P-1:E-1]`` (TRL turns it into ``tool_mask``). Every other key is handed
   to the reward functions: ``agentrl_reward`` (use :func:`trl_reward`) and ``agentrl_provenance``.
   :func:`trl_rollout_func` serves records in this form to the trainer.
2. **padded batch** (``_generate_and_score_completions``): ``prompt_ids``/``prompt_mask`` ``[B, Pmax]``
   int64 **left**-padded; ``completion_ids``/``completion_mask`` ``[B, Cmax]`` int64 right-padded;
   ``tool_mask [B, Cmax]`` int64 right-padded with **1** (TRL pads it with 1; the loss mask is
   ``completion_mask * tool_mask``); ``sampling_per_token_logps [B, Cmax]`` float32, 0.0 pad.

Records with images (``info['images']``, docs/design.md#images) add an ``images`` column: per row the list of
its images (bytes, or PIL with ``image_form='pil'``), the column ``GRPOTrainer`` reads from its inputs
(``example.get("images")``); the padded batch also gets ``image_grid_thw [n, 3]`` int64 (every row's grids in
order) and ``num_images [B]`` (TRL splits ``image_grid_thw`` per row with it); pixels come from the trainer's processor.

Traps handled: the ``P-1`` slice; TRL pads ``tool_mask`` with 1 (only ``completion_mask`` stops the
padding from training); the trailing observation is trimmed because TRL calls a completion whose
last token is not EOS/pad truncated (``mask_truncated_completions`` zeroes the whole row); groups
are consecutive runs of ``num_generations`` rows (refused otherwise).
"""
from __future__ import annotations

import json

import torch

from ..batching import pad_rows
from ..record import Provenance, SamplingSpec, Trajectory
from ..checks import errors as E
from .common import (as_list, check_ids, check_mask, check_reward, check_same, prepare_export, provenance_for_import,
                     record_from_response, ResponseColumns, split)
from ..images import has_images
from .images import image_grids, row_images
from .owners import finish_import

__all__ = ['to_trl', 'to_trl_rollout', 'from_trl', 'trl_rollout_func', 'trl_reward']


def to_trl_rollout(records, *, trim: bool = True, allow_support_mismatch: bool = False,
                   check_group_order: bool = True, images=None, image_form: str = 'bytes') -> dict:
    """Export records as the dict a TRL ``rollout_func`` returns (lists, one row per record).

    Args:
        records: B records in the order TRL will consume them (each group's rows consecutive).
        trim: drop the trailing observation ``ids[E:]`` (default True; False keeps every token).
        allow_support_mismatch: warn instead of refusing top-k/top-p log-probs.
        check_group_order: refuse groups whose rows are not consecutive (TRL groups by position).
        images: where the records' images are (the run folder, or ``digest -> bytes``); needed only when a
            record lists images. image_form: ``'bytes'`` or ``'pil'`` (:data:`agentrl.interop.images.IMAGE_FORMS`).

    Returns:
        ``{'prompt_ids': [[int]], 'completion_ids': [[int]], 'logprobs': [[float]], 'env_mask': [[int]],
        'agentrl_reward': [float], 'agentrl_provenance': [str | None], 'agentrl_info': [str]}``, plus
        ``'images': [[bytes | PIL.Image]]`` and ``'image_grid_thw': [[[t, h, w], ...]]`` (per row) when a
        record lists images.

    Raises:
        agentrl.checks.errors.RecordError: refused records (see :func:`agentrl.interop.common.check_exportable`),
            SupportMismatchError, or GroupOrderError. ValueError, FileNotFoundError: records with images whose
            images cannot be loaded (:func:`agentrl.interop.images.row_images`).
    """
    records, _ = prepare_export(records, 'to_trl', 'TRL', allow_support_mismatch=allow_support_mismatch,
                                groups='TRL (num_generations consecutive rows)' if check_group_order else None,
                                images=True)
    ends = []
    out = {k: [] for k in ('prompt_ids', 'completion_ids', 'logprobs', 'env_mask', 'agentrl_reward',
                           'agentrl_provenance', 'agentrl_info')}
    for i, rec in enumerate(records):
        s = split(rec, i)
        end = s.end(trim)
        ends.append(end)
        ids = rec.ids.tolist()
        out['prompt_ids'].append(ids[:s.P])
        out['completion_ids'].append(ids[s.P:end])
        out['logprobs'].append(rec.sample_logp[s.P - 1:end - 1].tolist())
        out['env_mask'].append(rec.action_mask[s.P - 1:end - 1].long().tolist())
        out['agentrl_reward'].append(float(rec.reward))
        out['agentrl_provenance'].append(None if rec.provenance is None else rec.provenance.to_json())
        out['agentrl_info'].append(json.dumps(rec.info, sort_keys=True, default=str))
    if any(has_images(r.info) for r in records):
        out['images'] = row_images(records, ends, images, 'to_trl', image_form)
        out['image_grid_thw'] = [image_grids(r, e).tolist() for r, e in zip(records, ends)]
    return out


def to_trl(records, *, pad_id: int, trim: bool = True, allow_support_mismatch: bool = False,
           check_group_order: bool = True, images=None, image_form: str = 'bytes') -> dict:
    """Export records as the padded tensors ``GRPOTrainer._generate_and_score_completions`` builds.

    Args:
        records, trim, allow_support_mismatch, check_group_order, images, image_form: as in :func:`to_trl_rollout`.
        pad_id: the tokenizer's pad id.

    Returns:
        dict with ``prompt_ids``, ``prompt_mask`` ``[B, Pmax]`` int64 (left pad), ``completion_ids``,
        ``completion_mask``, ``tool_mask`` ``[B, Cmax]`` int64 (right pad; ``tool_mask`` padded with 1),
        ``sampling_per_token_logps [B, Cmax]`` float32 (0.0 pad), ``rewards [B]`` float32, plus the
        ``agentrl_provenance`` / ``agentrl_info`` lists; with images also ``images`` (per row),
        ``image_grid_thw [n, 3]`` int64 and ``num_images [B]`` (module docstring).

    Raises:
        As :func:`to_trl_rollout`.
    """
    d = to_trl_rollout(records, trim=trim, allow_support_mismatch=allow_support_mismatch,
                       check_group_order=check_group_order, images=images, image_form=image_form)
    P, C = d['prompt_ids'], d['completion_ids']
    long = torch.long
    prompt_ids = pad_rows(P, None, pad_id, side='left', dtype=long)
    prompt_mask = pad_rows([[1] * len(p) for p in P], prompt_ids.shape[1], 0, side='left', dtype=long)
    completion_ids = pad_rows(C, None, pad_id, dtype=long)
    Cm = completion_ids.shape[1]
    completion_mask = pad_rows([[1] * len(c) for c in C], Cm, 0, dtype=long)
    tool_mask = pad_rows(d['env_mask'], Cm, 1, dtype=long)                    # TRL pads tool_mask with 1
    logps = pad_rows(d['logprobs'], Cm, 0.0, dtype=torch.float32)
    out = {'prompt_ids': prompt_ids, 'prompt_mask': prompt_mask, 'completion_ids': completion_ids,
           'completion_mask': completion_mask, 'tool_mask': tool_mask, 'sampling_per_token_logps': logps,
           'rewards': torch.tensor(d['agentrl_reward'], dtype=torch.float32),
           'agentrl_provenance': d['agentrl_provenance'], 'agentrl_info': d['agentrl_info']}
    if 'images' in d:
        out['images'] = d['images']
        out['num_images'] = [len(x) for x in d['images']]
        out['image_grid_thw'] = torch.tensor([g for row in d['image_grid_thw'] for g in row],
                                             dtype=torch.long).reshape(-1, 3)
    return out


def from_trl(data, *, spec: SamplingSpec | None = None, tokenizer=None, model: str = '',
             rewards=None, pad_id: int | None = None) -> list[Trajectory]:
    """Import TRL GRPO rows (either form of the module docstring) as agentrl records.

    Per row: ``ids = prompt_ids[prompt_mask == 1] ++ completion_ids[:n]`` where ``n`` counts the
    real completion tokens (``completion_mask``'s length before padding; for the list form, the
    list length); owner ``policy`` where ``tool_mask``/``env_mask`` is 1, ``tool`` where 0 (all
    policy when absent); log-probs ``sampling_per_token_logps``/``logprobs`` at own index.

    ``completion_mask`` is all-zero on rows TRL masked as truncated (``mask_truncated_completions``);
    such rows are measured by ``pad_id`` instead (without it: the full width), or use the list form.

    Args:
        data: the dict of :func:`to_trl_rollout` or :func:`to_trl` (or TRL's own).
        spec: the sampler when the rows do not carry an agentrl provenance.
        tokenizer: a Hugging Face tokenizer: fingerprint and template ownership
            (:func:`agentrl.interop.owners.finish_import`).
        model: model id.
        rewards: ``[B]`` rewards when the rows carry none (TRL computes rewards outside the batch).
        pad_id: the pad id, to measure rows whose ``completion_mask`` TRL zeroed.

    Returns:
        list of B records.

    Raises:
        KeyError: ``prompt_ids`` or ``completion_ids`` missing.
        agentrl.checks.errors.MaskAlignmentError / LogProbLengthError: a row's mask or log-probs do
            not have one entry per completion token.
        agentrl.checks.errors.LengthMismatchError: a field whose rows or columns do not line up with
            ``completion_ids`` / ``prompt_ids`` (``completion_mask`` one column short), or a padding
            mask with holes.
        agentrl.checks.errors.TokenIdError, MaskValueError: non-integer ids, mask entries outside {0, 1}.
        agentrl.checks.errors.TokenizerMismatchError: see :func:`~agentrl.interop.owners.finish_import`.
    """
    for k in ('prompt_ids', 'completion_ids'):
        if k not in data:
            raise KeyError(f'from_trl: no {k!r}; pass a rollout_func output or a GRPO batch, keys are {sorted(data)}')
    tensors = torch.is_tensor(data['completion_ids'])
    B = len(data['prompt_ids'])
    logp_key = 'sampling_per_token_logps' if 'sampling_per_token_logps' in data else 'logprobs'
    mask_key = 'tool_mask' if 'tool_mask' in data else 'env_mask'
    _check_rows(data, B, tensors, mask_key, logp_key)
    columns = ResponseColumns('from_trl', response='completion_ids', mask=mask_key, logp=logp_key)
    provs = data.get('agentrl_provenance') or [None] * B
    infos = data.get('agentrl_info') or [None] * B
    rw = data.get('agentrl_reward', data.get('rewards', rewards))
    out = []
    for b in range(B):
        where = f'from_trl row {b}'
        if tensors:
            p, c, m, lp = _tensor_row(data, b, where, mask_key, logp_key, pad_id)
        else:
            p, c = as_list(data['prompt_ids'][b]), as_list(data['completion_ids'][b])
            m = data[mask_key][b] if mask_key in data else [1] * len(c)
            lp = data[logp_key][b] if logp_key in data else None
        if provs[b]:
            prov = Provenance.from_dict(json.loads(provs[b]))
        else:
            prov = provenance_for_import('trl', spec=spec, rollout_id=str(b), tokenizer=tokenizer, model=model,
                                         placeholder=lp is None)
        info = json.loads(infos[b]) if infos[b] else {'source': 'trl', 'row': b}
        reward = check_reward(rw[b], 'agentrl_reward', f'from_trl row {b}') if rw is not None else 0.0
        out.append(record_from_response(p, c, m, lp, reward=reward, info=info, provenance=prov, row=b,
                                        columns=columns))
    return finish_import(out, tokenizer, 'from_trl')


def _check_rows(data: dict, B: int, tensors: bool, mask_key: str, logp_key: str) -> None:
    """Every field of a TRL batch has B rows; in the padded form every ``[B, C]`` field is as wide as
    ``completion_ids`` and ``prompt_mask`` is ``prompt_ids``' shape (named refusals, never absorbed)."""
    for k in ('completion_ids', mask_key, logp_key, 'completion_mask', 'prompt_mask', 'agentrl_provenance',
              'agentrl_info', 'agentrl_reward', 'rewards'):
        v = data.get(k)
        if v is not None and len(v) != B:
            check_same(k, (len(v),), (B,), 'from_trl', 'prompt_ids (rows)')
    if not tensors:
        return
    C = tuple(data['completion_ids'].shape)
    for k in ('completion_mask', mask_key, logp_key):
        if data.get(k) is not None:
            check_same(k, tuple(data[k].shape), C, 'from_trl', 'completion_ids')
    if data.get('prompt_mask') is not None:
        check_same('prompt_mask', tuple(data['prompt_mask'].shape), tuple(data['prompt_ids'].shape), 'from_trl',
                   'prompt_ids')


def _tensor_row(data: dict, b: int, where: str, mask_key: str, logp_key: str, pad_id):
    """(prompt ids, completion ids, tool mask, log-probs or None) of row ``b`` of the padded form."""
    p = check_ids(data['prompt_ids'][b], 'prompt_ids', where)
    if 'prompt_mask' in data:
        pm = check_mask(data['prompt_mask'][b], 'prompt_mask', where)
        if any(pm[j - 1] > pm[j] for j in range(1, len(pm))):
            raise E.LengthMismatchError(f'{where}: is not left padding (0...0 1...1): {pm}', field='prompt_mask',
                                        fix='pass prompt_mask as TRL built it')
        p = [x for x, keep in zip(p, pm) if keep]
    row = check_ids(data['completion_ids'][b], 'completion_ids', where)
    cm = data.get('completion_mask')
    cm = None if cm is None else check_mask(cm[b], 'completion_mask', where)
    n = sum(cm) if cm is not None else 0
    if cm is not None and any(cm[n:]):
        raise E.LengthMismatchError(f'{where}: is not right padding (1...1 0...0): 1 at column '
                                    f'{n + cm[n:].index(1)}', field='completion_mask', position=n + cm[n:].index(1),
                                    fix='pass completion_mask as TRL built it')
    if n == 0:       # a row TRL masked as truncated (mask_truncated_completions)
        n = sum(x != pad_id for x in row) if pad_id is not None else len(row)
    m = check_mask(data[mask_key][b][:n], mask_key, where) if mask_key in data else [1] * n
    lp = data[logp_key][b][:n] if logp_key in data else None
    return p, row[:n], m, lp


def trl_rollout_func(records, *, trim: bool = True, allow_support_mismatch: bool = False):
    """A TRL ``rollout_func(prompts, trainer) -> dict`` that serves ``records`` in order.

    Each call takes the next ``len(prompts)`` records (wrapping around) and returns them in the
    :func:`to_trl_rollout` form, so ``GRPOTrainer`` trains on agentrl records instead of sampling.
    Pair it with :func:`trl_reward` as the reward function. TRL's ``RepeatSampler`` repeats each
    prompt ``num_generations`` times, so the records must come in groups of that size.

    Raises:
        As :func:`to_trl_rollout`, at construction (every record is checked once).
    """
    records = list(records)
    to_trl_rollout(records, trim=trim, allow_support_mismatch=allow_support_mismatch)   # refuse early
    state = {'next': 0}

    def rollout_func(prompts, trainer=None):
        n = len(prompts)
        idx = [(state['next'] + k) % len(records) for k in range(n)]
        state['next'] = (state['next'] + n) % len(records)
        return to_trl_rollout([records[i] for i in idx], trim=trim, allow_support_mismatch=True,
                              check_group_order=False)
    return rollout_func


def trl_reward(prompts=None, completions=None, agentrl_reward=None, **kwargs) -> list[float]:
    """TRL reward function returning each record's own reward (from the ``agentrl_reward`` extra key).

    Raises:
        ValueError: the batch has no ``agentrl_reward`` (the rollout_func was not :func:`trl_rollout_func`).
    """
    if agentrl_reward is None:
        raise ValueError('trl_reward: no agentrl_reward in the batch; use agentrl.interop.trl_rollout_func as '
                         'the rollout_func')
    return [float(r) for r in agentrl_reward]
