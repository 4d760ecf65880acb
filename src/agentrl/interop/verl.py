"""L4: agentrl records <-> verl's rollout batch (the ``DataProto`` the PPO/GRPO trainer receives).

Layout (verl 0.9.1, ``experimental/agent_loop/agent_loop.py`` ``_agent_loop_postprocess`` and
``_postprocess``), ``B`` rows, ``Lp = rollout.prompt_length``, ``Lr = rollout.response_length``:

=====================  ==============  =======  =============================================
key                    shape           dtype    content
=====================  ==============  =======  =============================================
prompts                ``[B, Lp]``     int64    ``ids[:P]``, **left**-padded with the pad id
responses              ``[B, Lr]``     int64    ``ids[P:E]``, **right**-padded with the pad id
input_ids              ``[B, Lp+Lr]``  int64    ``cat(prompts, responses)``
attention_mask         ``[B, Lp+Lr]``  int64    0 on both pads
position_ids           ``[B, Lp+Lr]``  int64    ``clip(cumsum(attention_mask) - 1, 0)``
response_mask          ``[B, Lr]``     int64    ``action_mask[P-1:E-1]`` (own index), 0 on pad
rollout_log_probs      ``[B, Lr]``     float32  ``sample_logp[P-1:E-1]`` (own index), 0.0 on pad
rm_scores              ``[B, Lr]``     float32  the reward at the last response token
=====================  ==============  =======  =============================================

Non-tensor (object arrays): ``uid`` (GRPO groups rows by it: ``provenance.group_id``),
``__num_turns__`` (int32), ``agentrl_provenance`` and ``agentrl_info`` (JSON, so
:func:`from_verl` gives the record back). ``meta_info['temperature']`` is the sampling temperature
(verl divides the logits by it when it recomputes log-probs).

Records with images (``info['images']``, docs/design.md#images) add, per row, ``multi_modal_data``
``{'images': [bytes or PIL]}`` (the key verl 0.9.1's agent loop gives its processor) and ``multi_modal_inputs``
``{'image_grid_thw': [n, 3] int64, 'images_seqlens': [sum t] int64}`` (pixel-free: the trainer's processor makes
``pixel_values`` from the images); ``{}`` for a row without images. ``position_ids`` is then ``[B, 4, Lp+Lr]``
as verl's ``_compute_position_ids`` builds it for Qwen-VL: row 0 the text positions, rows 1-3 the 3-D rope
positions (:func:`agentrl.interop.images.mrope_positions`), 1 on padding.

Traps handled: the ``P-1`` slice (only after it does ``response_mask`` equal agentrl's mask);
fixed widths (a prompt longer than ``Lp`` would be left-truncated by verl: refused here); the
trailing observation ``ids[E:]`` is trimmed so ``rm_scores`` lands on a policy token.

Bounds (docs/design.md#bounds): widths over :data:`MAX_WIDTH` tokens, or padded tensors over
``AGENTRL_MAX_EXPORT_BYTES`` (default :data:`MAX_EXPORT_BYTES`), are refused before anything is allocated.
"""
from __future__ import annotations

import json

import numpy as np
import torch

from ..batching import pad_rows
from ..checks import errors as E
from ..record import Provenance, SamplingSpec, Trajectory
from .common import (ResponseColumns, as_list, check_ids, check_len, check_mask, check_same, load_pt, prepare_export,
                     provenance_for_import, record_from_response, source_fix, split)
from ..images import has_images
from ..io import env_bound
from .images import image_grids, mrope_positions, row_images
from .owners import finish_import
__all__ = ['to_verl', 'to_verl_dataproto', 'from_verl', 'MAX_WIDTH', 'MAX_EXPORT_BYTES']

#: verl's names of the parts of a ``DataProto`` batch.
_COLUMNS = ResponseColumns('from_verl', prompt='prompts', response='responses', logp='rollout_log_probs')

#: The widest ``prompt_length`` / ``response_length`` accepted, in tokens (docs/design.md#bounds).
MAX_WIDTH = 1 << 24
#: Default of ``AGENTRL_MAX_EXPORT_BYTES``: the padded tensors one verl export may allocate.
MAX_EXPORT_BYTES = 4 << 30
#: Bytes of the padded tensors per row and width token (5 int64 tensors over Lp+Lr, 2 float32 and 1 int64 over Lr, temporaries).
_BYTES_PER_TOKEN = 56


def _check_widths(B: int, Lp: int, Lr: int, longest_p: int, longest_r: int) -> None:
    """Refuse widths past :data:`MAX_WIDTH` or tensors past ``AGENTRL_MAX_EXPORT_BYTES``, naming the records' longest."""
    fix = (f'the longest prompt of these records is {longest_p} tokens and the longest response {longest_r}: pass '
           'widths near those (or none: the longest)')
    for name, L in (('prompt_length', Lp), ('response_length', Lr)):
        if L > MAX_WIDTH:
            raise ValueError(f'to_verl: {name} {L} is over the cap of {MAX_WIDTH} tokens; {fix}')
    cap = env_bound('AGENTRL_MAX_EXPORT_BYTES', MAX_EXPORT_BYTES)
    need = B * (Lp + Lr) * _BYTES_PER_TOKEN
    if need > cap:
        raise ValueError(f'to_verl: prompt_length {Lp} + response_length {Lr} for {B} records would allocate about '
                         f'{need} bytes of padded tensors, over the bound of {cap} bytes (AGENTRL_MAX_EXPORT_BYTES); '
                         f'{fix}, or raise AGENTRL_MAX_EXPORT_BYTES')


def to_verl(records, *, pad_id: int, prompt_length: int | None = None, response_length: int | None = None,
            trim: bool = True, allow_support_mismatch: bool = False, images=None, image_form: str = 'bytes') -> dict:
    """Export records as verl's rollout batch (plain tensors; see :func:`to_verl_dataproto`).

    Args:
        records: B records (``ids [T]``, ``owner [T]``, ``action_mask``/``sample_logp`` ``[T-1]``).
        pad_id: the tokenizer's pad id (verl pads with ``pad_token_id``).
        prompt_length: ``rollout.prompt_length`` (``Lp``); None: the longest prompt.
        response_length: ``rollout.response_length`` (``Lr``); None: the longest response.
        trim: drop the trailing observation ``ids[E:]`` (default True; False keeps every token,
            for an exact round trip).
        allow_support_mismatch: export top-k/top-p log-probs with a warning instead of refusing.
        images: where the records' images are (the run folder, or ``digest -> bytes``); needed only when a
            record lists images. image_form: ``'bytes'`` or ``'pil'`` (:data:`agentrl.interop.images.IMAGE_FORMS`).

    Returns:
        ``{'batch': {name: tensor}, 'non_tensor_batch': {name: np.ndarray[object]}, 'meta_info': {...}}``
        with the layout of the module docstring.

    Raises:
        agentrl.checks.errors.RecordError: a record the acceptance check refuses, placeholder
            log-probs (ScriptedRecordError) or a support mismatch (SupportMismatchError).
        ValueError: no records, a prompt longer than ``prompt_length`` (verl would left-truncate
            it) or a response longer than ``response_length`` (fix: raise the width); a width over
            :data:`MAX_WIDTH`, or tensors over ``AGENTRL_MAX_EXPORT_BYTES`` (docs/design.md#bounds); records
            with images and no ``images`` (see :func:`agentrl.interop.images.row_images`).
        FileNotFoundError: an image the run folder lacks.
    """
    records, temperature = prepare_export(records, 'to_verl', 'verl', allow_support_mismatch=allow_support_mismatch,
                                          images=True)
    ends = []
    prompts, responses, masks, logps, rewards, uids, turns, provs, infos = [], [], [], [], [], [], [], [], []
    for i, rec in enumerate(records):
        s = split(rec, i)
        end = s.end(trim)
        ends.append(end)
        ids = rec.ids.tolist()
        prompts.append(ids[:s.P])
        responses.append(ids[s.P:end])
        masks.append(rec.action_mask[s.P - 1:end - 1].long())
        logps.append(rec.sample_logp[s.P - 1:end - 1].float())
        rewards.append(float(rec.reward))
        prov = rec.provenance
        uids.append(prov.group_id if prov is not None and prov.group_id else f'row{i}')
        runs = (rec.action_mask[1:] > rec.action_mask[:-1]).sum() + (rec.action_mask[0] > 0)
        turns.append(int(runs))
        provs.append(None if prov is None else prov.to_json())
        infos.append(json.dumps(rec.info, sort_keys=True, default=str))
    Lp = max(len(p) for p in prompts) if prompt_length is None else int(prompt_length)
    Lr = max(len(r) for r in responses) if response_length is None else int(response_length)
    for i, (p, r) in enumerate(zip(prompts, responses)):
        if len(p) > Lp:
            raise ValueError(f'to_verl: record {i} has a prompt of {len(p)} tokens > prompt_length {Lp}; verl would '
                             'left-truncate it silently. Fix: raise rollout.prompt_length (prompt_length=)')
        if len(r) > Lr:
            raise ValueError(f'to_verl: record {i} has a response of {len(r)} tokens > response_length {Lr}. '
                             'Fix: raise rollout.response_length (response_length=)')
    _check_widths(len(records), Lp, Lr, max(map(len, prompts)), max(map(len, responses)))
    prompts_t = pad_rows(prompts, Lp, pad_id, side='left', dtype=torch.long)
    responses_t = pad_rows(responses, Lr, pad_id, dtype=torch.long)
    attn = torch.cat([pad_rows([[1] * len(p) for p in prompts], Lp, 0, side='left', dtype=torch.long),
                      pad_rows([[1] * len(r) for r in responses], Lr, 0, dtype=torch.long)], dim=1)
    rm = torch.zeros(len(records), Lr, dtype=torch.float32)
    for b, (r, w) in enumerate(zip(responses, rewards)):
        rm[b, len(r) - 1] = w
    batch = {
        'prompts': prompts_t,
        'responses': responses_t,
        'input_ids': torch.cat([prompts_t, responses_t], dim=1),
        'attention_mask': attn,
        'position_ids': torch.clip(torch.cumsum(attn, dim=1) - 1, min=0),
        'response_mask': pad_rows(masks, Lr, 0, dtype=torch.long),
        'rollout_log_probs': pad_rows(logps, Lr, 0.0, dtype=torch.float32),
        'rm_scores': rm,
    }
    obj = lambda xs: np.array(xs, dtype=object)  # noqa: E731
    non_tensor = {'uid': obj(uids), '__num_turns__': np.array(turns, dtype=np.int32),
                  'agentrl_provenance': obj(provs), 'agentrl_info': obj(infos)}
    if any(has_images(r.info) for r in records):
        _add_images(batch, non_tensor, records, ends, images, image_form)
    meta = {'temperature': 1.0 if temperature is None else float(temperature), 'pad_token_id': int(pad_id),
            'agentrl_trimmed': bool(trim)}
    return {'batch': batch, 'non_tensor_batch': non_tensor, 'meta_info': meta}


def _add_images(batch: dict, non_tensor: dict, records, ends, images, image_form: str) -> None:
    """Add ``multi_modal_data``, ``multi_modal_inputs`` and the ``[B, 4, L]`` position ids of a batch with images."""
    loaded = row_images(records, ends, images, 'to_verl', image_form)
    data, inputs = [], []
    for rec, end, imgs in zip(records, ends, loaded):
        grids = image_grids(rec, end)
        data.append({'images': imgs} if imgs else {})
        inputs.append({'image_grid_thw': grids,
                       'images_seqlens': torch.repeat_interleave(grids[:, 1] * grids[:, 2], grids[:, 0])}
                      if imgs else {})
    attn = batch['attention_mask']
    B, L = attn.shape
    pos = torch.ones(B, 4, L, dtype=torch.long)
    for b, (rec, end) in enumerate(zip(records, ends)):
        cols = torch.nonzero(attn[b], as_tuple=True)[0]          # the row's real tokens: ids[:end] in order
        pos[b, 0, cols] = torch.arange(len(cols))
        pos[b, 1:, cols] = mrope_positions(rec, end)
    batch['position_ids'] = pos
    non_tensor['multi_modal_data'] = np.array(data, dtype=object)       # one dict per row
    non_tensor['multi_modal_inputs'] = np.array(inputs, dtype=object)


def to_verl_dataproto(records, **kwargs):
    """:func:`to_verl` as a ``verl.DataProto`` (verl's ``DataProto.from_dict``, which runs its
    ``check_consistency``). Takes the arguments of :func:`to_verl`.

    Raises:
        ImportError: verl is not installed (``pip install agentrl[interop]`` and ``verl --no-deps``).
    """
    try:
        from verl.protocol import DataProto
    except ImportError as e:
        raise ImportError(f'to_verl_dataproto needs verl ({e}); install it into an interop venv '
                          '(make test-interop builds .venv-interop), or use to_verl for plain tensors') from e
    d = to_verl(records, **kwargs)
    return DataProto.from_dict(tensors=d['batch'], non_tensors=d['non_tensor_batch'], meta_info=d['meta_info'])


def _parts(data):
    """(tensors, non_tensors, meta_info) of a DataProto or of the dict of :func:`to_verl`."""
    if hasattr(data, 'batch') and hasattr(data, 'non_tensor_batch'):
        return dict(data.batch.items()), dict(data.non_tensor_batch or {}), dict(data.meta_info or {})
    return dict(data['batch']), dict(data.get('non_tensor_batch', {})), dict(data.get('meta_info', {}))


def from_verl(data, *, spec: SamplingSpec | None = None, tokenizer=None, model: str = '') -> list[Trajectory]:
    """Import verl rollout rows as agentrl records (one per row).

    Per row ``b``: ``ids = prompts[b][attention_mask[:Lp] == 1] ++ responses[b][:n]`` with
    ``n = attention_mask[b, Lp:].sum()``; owner ``prompt`` on the prompt, ``policy`` where
    ``response_mask`` is 1, ``tool`` where it is 0; log-probs ``[0]*P ++ rollout_log_probs[b, :n]``;
    reward ``rm_scores[b].sum()`` (or ``token_level_scores``); group ``uid``. Rows written by
    :func:`to_verl` give back their provenance and info exactly.

    Args:
        data: a ``verl.DataProto`` or the dict of :func:`to_verl`.
        spec: the sampler, when the batch does not say (default: temperature from ``meta_info``).
        tokenizer: a Hugging Face tokenizer: fingerprinted into the provenance, and the template's
            control ids become template-owned (:func:`agentrl.interop.owners.finish_import`; None:
            owners from the mask, marked unchecked).
        model: model id for the provenance.

    Returns:
        list of records; without ``rollout_log_probs`` they are marked ``logp_placeholder``.

    Raises:
        KeyError: a required key (``prompts``, ``responses``, ``attention_mask``, ``response_mask``) is missing.
        agentrl.checks.errors.MaskAlignmentError: ``response_mask`` narrower than ``responses`` by one.
        agentrl.checks.errors.LengthMismatchError: any tensor that does not line up with ``prompts``/``responses``
            (rows, columns), or an ``attention_mask`` with a hole in its padding.
        agentrl.checks.errors.TokenIdError, MaskValueError: a non-integer id; a mask entry outside {0, 1},
            or ``response_mask`` 1 on padding (:func:`~agentrl.interop.common.check_ids`, ``check_mask``).
        agentrl.checks.errors.TokenizerMismatchError: see :func:`~agentrl.interop.owners.finish_import`.
    """
    t, nt, meta = _parts(data)
    for k in ('prompts', 'responses', 'attention_mask', 'response_mask'):
        if k not in t:
            raise KeyError(f'from_verl: the batch has no {k!r}; pass the output of the agent loop (with '
                           f'response_mask), keys are {sorted(t)}')
    prompts, responses, attn, rmask = t['prompts'], t['responses'], t['attention_mask'], t['response_mask']
    logps, scores = t.get('rollout_log_probs'), t.get('rm_scores', t.get('token_level_scores'))
    _check_shapes(prompts, responses, attn, rmask, logps, scores, nt)
    Lp = prompts.shape[1]
    if spec is None and 'temperature' in meta:
        spec = SamplingSpec(temperature=float(meta['temperature']))
    out = []
    for b in range(prompts.shape[0]):
        where = f'from_verl row {b}'
        a = check_mask(attn[b], 'attention_mask', where)
        n = _padding_runs(a, Lp, where)
        pmask = torch.as_tensor(a[:Lp], dtype=torch.bool)
        rm = check_mask(rmask[b], 'response_mask', where)
        if any(rm[n:]):
            raise E.MaskValueError(f'{where}: is 1 at response position {n + rm[n:].index(1)}, on padding past '
                                   f'the {n} real response tokens (attention_mask)', field='response_mask',
                                   position=n + rm[n:].index(1), fix='response_mask is 0 on padding')
        prov_json = nt.get('agentrl_provenance', [None] * (b + 1))[b]
        info_json = nt.get('agentrl_info', [None] * (b + 1))[b]
        if prov_json:
            prov = Provenance.from_dict(json.loads(prov_json))
        else:
            uid = nt['uid'][b] if 'uid' in nt else ''
            prov = provenance_for_import('verl', spec=spec, group_id=uid, rollout_id=str(b), tokenizer=tokenizer,
                                         model=model, placeholder=logps is None)
        info = json.loads(info_json) if info_json else {'source': 'verl', 'row': b}
        reward = float(scores[b].sum()) if scores is not None else 0.0
        prompt = [x for x, keep in zip(check_ids(prompts[b], 'prompts', where), pmask.tolist()) if keep]
        out.append(record_from_response(
            prompt, responses[b, :n], rm[:n], None if logps is None else logps[b, :n], reward=reward, info=info,
            provenance=prov, row=b, columns=_COLUMNS))
    return finish_import(out, tokenizer, 'from_verl')


def _check_shapes(prompts, responses, attn, rmask, logps, scores, nt) -> None:
    """Every tensor of a verl batch lines up with ``prompts [B, Lp]`` and ``responses [B, Lr]``; named refusals."""
    B, Lp, Lr = prompts.shape[0], prompts.shape[1], responses.shape[1]
    check_same('responses', (responses.shape[0],), (B,), 'from_verl', 'prompts (rows)')
    if rmask.shape[1] != Lr:
        check_len('response_mask', rmask.shape[1], Lr, 'all', 'from_verl')
    check_same('response_mask', tuple(rmask.shape), (B, Lr), 'from_verl', 'responses')
    if logps is not None:
        if logps.shape[1] != Lr:
            check_len('rollout_log_probs', logps.shape[1], Lr, 'all', 'from_verl')
        check_same('rollout_log_probs', tuple(logps.shape), (B, Lr), 'from_verl', 'responses')
    check_same('attention_mask', tuple(attn.shape), (B, Lp + Lr), 'from_verl', 'prompts ++ responses')
    if scores is not None:
        check_same('rm_scores', tuple(scores.shape), (B, Lr), 'from_verl', 'responses')
    for k, v in nt.items():
        if k in ('uid', 'agentrl_provenance', 'agentrl_info') and len(v) != B:
            check_same(k, (len(v),), (B,), 'from_verl', 'prompts (rows)')


def _padding_runs(a: list, Lp: int, where: str) -> int:
    """The number of real response tokens of one ``attention_mask`` row, refusing holes in the padding.

    verl left-pads prompts and right-pads responses, so ``a[:Lp]`` is 0...0 1...1 and ``a[Lp:]``
    1...1 0...0; anything else would take tokens from the wrong places.
    """
    p, r = a[:Lp], a[Lp:]
    n = sum(r)
    bad = next((j for j in range(1, Lp) if p[j - 1] > p[j]), None)
    if bad is None and any(r[n:]):
        bad = Lp + next(j for j in range(n, len(r)) if r[j])
    if bad is not None:
        raise E.LengthMismatchError(f'{where}: has a 0/1 hole at column {bad}: verl left-pads the prompt and '
                                    'right-pads the response, so the real tokens would be taken from the wrong '
                                    'columns', field='attention_mask', position=bad,
                                    fix='pass attention_mask as verl built it (0 only on padding)')
    return n


def load_verl(path) -> dict:
    """Read a batch written by :func:`agentrl.interop.export` (``verl_batch.pt``) back as the dict of :func:`to_verl`.

    Raises:
        ValueError: the file has no ``batch``/``non_tensor_batch`` dict (names the file, the field and,
            when it looks like another framework's file, that framework).
    """
    d = load_pt(path, 'verl')
    for key in ('batch', 'non_tensor_batch'):
        if not isinstance(d, dict) or not isinstance(d.get(key), dict):
            what = 'is missing' if not isinstance(d, dict) or key not in d else f'is of type {type(d[key]).__name__}'
            raise ValueError(f"{str(path)!r}: {key}: {what}; a verl batch is {{'batch': {{...}}, 'non_tensor_batch': "
                             f"{{...}}, 'meta_info': {{...}}}}; {source_fix(d, 'verl')}")
    d['non_tensor_batch'] = {k: (np.array(v, dtype=np.int32) if k == '__num_turns__' else np.array(v, dtype=object))
                             for k, v in d['non_tensor_batch'].items()}
    return d


def _as_saveable(d: dict) -> dict:
    return {'batch': d['batch'], 'non_tensor_batch': {k: as_list(v) for k, v in d['non_tensor_batch'].items()},
            'meta_info': d['meta_info']}
