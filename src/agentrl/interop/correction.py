"""L4: write off-policy correction weights into an export, in the batch field each trainer reads.

``agentrl export RUN --to T --model M --correction MODE`` re-scores every record's action tokens with the
trainer's model ``M`` (the log-probs a trainer recomputes: ``log_softmax(logits / T)`` over the full
vocabulary, packed rows, :func:`agentrl.checks.score_sequences`), turns them and the stored ``sample_logp``
into weights and a rejection mask with the one function :func:`agentrl.correction.off_policy_correction`, and
writes them where the trainer reads them (:data:`CORRECTION_FIELDS`, sliced at ``P-1`` like the log-probs).
A rejected token (``token_mask``, ``icepop``, ``geo_mask``, ``seq_mask_tis``) is set to 0 in the trainer's
own loss mask, so it trains nothing whether or not the trainer reads the weights.

=========  ==============================  =========================  ========================================
trainer    weights                         rejection applied to       trainer log-probs
=========  ==============================  =========================  ========================================
verl       ``rollout_is_weights [B, Lr]``  ``response_mask``          ``agentrl_old_log_probs`` (extra key)
trl        ``importance_sampling_ratio``   ``tool_mask`` (batch),     ``old_per_token_logps [B, Cmax]``
           ``[B, Cmax]`` (trl_batch.pt)    ``env_mask`` (rollout)
openrlhf   ``agentrl_is_weights [B, T-1]`` ``action_mask``            ``action_log_probs [B, T-1]``
           (extra key)
slime      ``metadata['agentrl_is_weights']``  ``loss_mask``          ``metadata['agentrl_old_log_probs']``
skyrl      ``agentrl_is_weights`` (extra)  ``loss_masks``             ``agentrl_old_log_probs`` (extra)
prime-rl   ``agentrl_is_weights [T]``      ``mask``                   ``agentrl_old_log_probs [T]`` (extra)
=========  ==============================  =========================  ========================================

Sources (field names as the trainers spell them): verl 0.9.1 ``rollout_corr_helper.py``
(``compute_rollout_correction_and_add_to_batch`` puts ``rollout_is_weights`` into the batch and the
rejection into ``response_mask``; ``ray_trainer.py`` and ``workers/utils/losses.py`` read
``rollout_is_weights`` from the batch, so verl's own ``algorithm.rollout_correction`` stays off, or its
``union`` meets the same key twice); TRL 1.16 ``grpo_trainer.py`` (``output['importance_sampling_ratio']``
multiplies the per-token loss, ``old_per_token_logps``, loss mask ``completion_mask * tool_mask``);
OpenRLHF 0.11.2 ``Experience`` (``action_log_probs`` is the trainer's log-prob at experience time,
``PolicyLoss`` recomputes the correction from it and ``rollout_log_probs``; it has no weights field).
slime's ``Sample``, SkyRL's ``GeneratorOutput`` and prime-rl's ``TrainingSample`` have no weights field
(each computes TIS/IcePop from its own recomputed log-probs and the rollout log-probs): the weights go
in as documented ``agentrl_*`` extra keys, and the rejection into the loss mask they do read.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import torch

from ..batching import pad_rows
from ..checks import errors as E
from ..checks.classify import replay_logp
from ..checks.replay import score_sequences
from ..correction import CORRECTION_MODES, off_policy_correction
from ..record import SamplingSpec
from .common import split

__all__ = ['CORRECTION_FIELDS', 'ExportCorrection', 'load_correction', 'RecordCorrections', 'correct_records',
           'apply_correction']

#: trainer -> (weights field, mask field the rejection goes into, trainer log-probs field); docstring table
CORRECTION_FIELDS = {
    'verl': ('rollout_is_weights', 'response_mask', 'agentrl_old_log_probs'),
    'trl': ('importance_sampling_ratio', 'tool_mask', 'old_per_token_logps'),
    'openrlhf': ('agentrl_is_weights', 'action_mask', 'action_log_probs'),
    'slime': ("metadata['agentrl_is_weights']", 'loss_mask', "metadata['agentrl_old_log_probs']"),
    'skyrl': ('agentrl_is_weights', 'loss_masks', 'agentrl_old_log_probs'),
    'prime-rl': ('agentrl_is_weights', 'mask', 'agentrl_old_log_probs'),
}
#: each trainer's default for trimming the trailing observation (the exporters' own defaults)
_TRIM = {'verl': True, 'trl': True, 'skyrl': True, 'slime': False}


@dataclass
class ExportCorrection:
    """The trainer's model and the correction mode an export writes (:func:`load_correction` builds one).

    Attributes:
        scorer: a :class:`~agentrl.checks.Scorer` of the trainer's model.
        mode: one of :data:`agentrl.train.CORRECTION_MODES`.
        rollout_is_threshold: C of ``token_tis`` / ``seq_tis`` (verl's name).
        is_correction_threshold: ``(low, high)`` ratio band of the mask modes (OpenRLHF's name).
        tokenizer: the model's tokenizer fingerprint ('' : unknown, not compared).
        model: the model's name in the manifest. model_fingerprint: its content fingerprint ('' : unknown).
        packed: score packed rows (default) or right-padded batches.
        batch_size: rows per scorer call.
    """
    scorer: object
    mode: str
    rollout_is_threshold: float = 2.0
    is_correction_threshold: tuple = (0.5, 5.0)
    tokenizer: str = ''
    model: str = ''
    model_fingerprint: str = ''
    packed: bool = True
    batch_size: int = 8

    def __post_init__(self):
        if self.mode not in CORRECTION_MODES:
            raise ValueError(f'correction mode {self.mode!r} is unknown; use one of {", ".join(CORRECTION_MODES)}')
        self.is_correction_threshold = tuple(float(v) for v in self.is_correction_threshold)


def load_correction(path, mode: str, *, rollout_is_threshold: float = 2.0,
                    is_correction_threshold=(0.5, 5.0), device: str = 'cpu', model_fingerprint: str = '',
                    packed: bool = True) -> ExportCorrection:
    """:class:`ExportCorrection` of the model at ``path`` (as ``agentrl check --model`` takes it).

    Args:
        path: a TinyAgent checkpoint (``model.pt``; its tokenizer is agentrl's word-level one) or a
            Hugging Face folder (model and tokenizer, :func:`agentrl.engines.hf.load_model`).
        mode, rollout_is_threshold, is_correction_threshold, packed: see :class:`ExportCorrection`.
        device: where the model runs. model_fingerprint: recorded in the manifest.

    Raises:
        FileNotFoundError: nothing at ``path`` or a folder without ``config.json``. ValueError: not a
            checkpoint / causal LM / no tokenizer (naming the path), an unknown mode.
    """
    from ..engines.scorer import hf_scorer, load_scorer
    p = Path(path)
    if p.is_dir() and (p / 'config.json').is_file():
        from ..engines.hf import load_model
        from ..templates.chat import tokenizer_fingerprint
        model, tok = load_model(p, device=device)
        scorer, fp = hf_scorer(model, name=p.resolve().name), tokenizer_fingerprint(tok)
    else:
        scorer = load_scorer(p, device=device)                 # FileNotFoundError / ValueError naming the path
        from ..gym import bugfix_tokenizer
        from ..checkpoint import load_checkpoint
        wl = bugfix_tokenizer()                                # TinyAgent speaks the word-level vocabulary
        fp = wl.fingerprint if load_checkpoint(str(p)).vocab_size == wl.vocab_size else ''
    return ExportCorrection(scorer, mode, rollout_is_threshold, tuple(is_correction_threshold), tokenizer=fp,
                            model=scorer.name, model_fingerprint=model_fingerprint, packed=packed)


def check_tokenizer(records, corr: ExportCorrection) -> None:
    """Refuse records whose tokenizer fingerprint differs from the correction model's (both known).

    Raises:
        agentrl.checks.errors.TokenizerMismatchError: names the record and both fingerprints.
    """
    if not corr.tokenizer:
        return
    for i, r in enumerate(records):
        fp = r.provenance.tokenizer if r.provenance is not None else ''
        if fp and fp != corr.tokenizer:
            raise E.TokenizerMismatchError(
                f'record {i} was tokenized by {fp}, but the --model {corr.model!r} tokenizer is {corr.tokenizer}; '
                'its log-probs of these ids would be of other tokens', field='provenance.tokenizer',
                fix='pass the model the trainer trains, with the tokenizer that sampled the records')


@dataclass
class RecordCorrections:
    """Per-record results of :func:`correct_records`, in agentrl's ``[T-1]`` alignment.

    Attributes:
        weights, keep, logp: lists of ``[T_i - 1]`` float32: the weights (0 off the kept action tokens;
            1 on the kept ones for the pure mask modes ``token_mask`` / ``geo_mask``),
            the kept-token mask (action mask with rejected tokens 0), the trainer's log-probs (0 off actions).
        summary: the manifest's ``correction`` entry (mode, thresholds, model, fingerprints, weight
            statistics over kept action tokens, masked counts).
    """
    weights: list
    keep: list
    logp: list
    summary: dict = field(default_factory=dict)


def _temperature(records) -> float:
    temps = {1.0 if s.temperature == 0 else float(s.temperature) for s in
             (r.provenance.sampling for r in records if r.provenance is not None) if s is not None}
    return temps.pop() if len(temps) == 1 else 1.0        # several: the exporter refuses them first


def correct_records(records, corr: ExportCorrection) -> RecordCorrections:
    """Score ``records`` with the correction model and compute the weights of ``corr.mode``.

    The trainer's log-probs are ``log_softmax(logits / T)`` over the full vocabulary at the records'
    temperature (greedy: 1), what every trainer here recomputes (:func:`agentrl.interop.check_support`).

    Raises:
        agentrl.checks.errors.TokenizerMismatchError: :func:`check_tokenizer`.
        agentrl.checks.errors.ReplayUnsupportedError: a record the model cannot score (too long, ids
            outside its vocabulary).
    """
    records = list(records)
    check_tokenizer(records, corr)
    max_len = getattr(corr.scorer, 'max_len', None)
    for i, r in enumerate(records):
        if max_len is not None and len(r.ids) > max_len:
            raise E.ReplayUnsupportedError(f'record {i} has {len(r.ids)} tokens but the --model takes at most '
                                           f'{max_len}', field='ids', fix='pass the model that trains on them')
    rows = [(r.action_mask > 0).nonzero().flatten() for r in records]
    logits = score_sequences([r.ids.long() for r in records], rows, corr.scorer, batch_size=corr.batch_size,
                             packed=corr.packed)
    spec = SamplingSpec(temperature=_temperature(records))
    lp = [torch.zeros(len(r.ids) - 1) for r in records]
    for x, r, rw, lg in zip(lp, records, rows, logits):
        x[rw] = replay_logp(lg.double(), r.ids[rw + 1].long(), spec).float()
    W = max(len(x) for x in lp)
    c = off_policy_correction(pad_rows(lp, W, 0.0), pad_rows([r.sample_logp.float() for r in records], W, 0.0),
                              pad_rows([r.action_mask.float() for r in records], W, 0.0), corr.mode,
                              rollout_is_threshold=corr.rollout_is_threshold,
                              is_correction_threshold=corr.is_correction_threshold)
    n = [len(x) for x in lp]
    act = sum(int((r.action_mask > 0).sum()) for r in records)
    kept = int(c.mask.sum())
    m = c.metrics
    summary = {'mode': corr.mode, 'rollout_is_threshold': corr.rollout_is_threshold,
               'is_correction_threshold': list(corr.is_correction_threshold), 'model': corr.model,
               'model_fingerprint': corr.model_fingerprint, 'tokenizer': corr.tokenizer, 'temperature': spec.temperature,
               'scoring': 'packed' if corr.packed else 'padded',
               'weights': {'mean': m['corr_weight_mean'], 'min': m['corr_weight_min'], 'max': m['corr_weight_max']},
               'action_tokens': act, 'masked_tokens': act - kept, 'masked_records': m['corr_masked_records'],
               'clipped_frac': m['corr_clipped_frac'], 'log_ratio_mean': m['corr_log_ratio_mean']}
    w = c.weights * c.mask                  # 0 on every token the loss mask drops (token_mask / geo_mask weigh 1)
    return RecordCorrections([w[b, :k].clone() for b, k in enumerate(n)],
                             [c.mask[b, :k].clone() for b, k in enumerate(n)], lp, summary)


def _spans(records, trim: bool | None, framework: str) -> list:
    """``(start, end)`` of each record's exported response in ``[T-1]`` columns: ``[P-1, end-1)``."""
    if framework in ('openrlhf', 'prime-rl'):                # agentrl's own [T-1] columns, whole record
        return [(0, len(r.ids) - 1) for r in records]
    t = _TRIM.get(framework, False) if trim is None else trim
    out = []
    for i, r in enumerate(records):
        s = split(r, i)
        out.append((s.P - 1, s.end(t) - 1))
    return out


def apply_correction(framework: str, obj, records, rc: RecordCorrections, trim: bool | None = None,
                     rollout: dict | None = None):
    """Write ``rc`` into ``framework``'s exported object ``obj`` (in place; :data:`CORRECTION_FIELDS`).

    Args:
        framework: a key of :data:`CORRECTION_FIELDS`.
        obj: what the exporter returned: the dict of :func:`~agentrl.interop.to_verl`, :func:`~agentrl.interop.to_trl`,
            :func:`~agentrl.interop.to_openrlhf`, :func:`~agentrl.interop.to_skyrl`, or the list of
            :func:`~agentrl.interop.to_slime` / :func:`~agentrl.interop.to_prime_rl`.
        records: the exported records, in the same order.
        rc: :func:`correct_records` of them.
        trim: the ``trim`` the exporter ran with (None: its default).
        rollout: TRL only, the :func:`~agentrl.interop.to_trl_rollout` dict (its ``env_mask`` gets the rejection).

    Returns:
        ``obj``.

    Raises:
        ValueError: a framework without log-probs (``sft``, ``skyrl-sft``) or unknown.
    """
    if framework not in CORRECTION_FIELDS:
        raise ValueError(f'--correction: {framework} exports carry no sampling log-probs, so there is nothing to '
                         f'correct; export to one of {", ".join(CORRECTION_FIELDS)}')
    sp = _spans(records, trim, framework)
    cut = lambda xs: [x[a:b] for x, (a, b) in zip(xs, sp)]  # noqa: E731
    w, k, lp = cut(rc.weights), cut(rc.keep), cut(rc.logp)
    if framework == 'verl':
        b = obj['batch']
        L = b['responses'].shape[1]
        b['rollout_is_weights'] = pad_rows(w, L, 0.0, dtype=torch.float32)
        b['response_mask'] = b['response_mask'] * pad_rows(k, L, 0.0).long()
        b['agentrl_old_log_probs'] = pad_rows(lp, L, 0.0, dtype=torch.float32)
    elif framework == 'trl':
        L = obj['completion_ids'].shape[1]
        obj['importance_sampling_ratio'] = pad_rows(w, L, 0.0, dtype=torch.float32)
        obj['tool_mask'] = obj['tool_mask'] * pad_rows(k, L, 1.0).long()       # TRL pads tool_mask with 1
        obj['old_per_token_logps'] = pad_rows(lp, L, 0.0, dtype=torch.float32)
        if rollout is not None:
            rollout['env_mask'] = [[int(m) * int(x) for m, x in zip(ms, kk.tolist())]
                                   for ms, kk in zip(rollout['env_mask'], k)]
    elif framework == 'openrlhf':
        L = obj['action_mask'].shape[1]
        obj['agentrl_is_weights'] = pad_rows(w, L, 0.0, dtype=torch.float32)
        obj['action_mask'] = obj['action_mask'] * pad_rows(k, L, 0.0).long()
        obj['action_log_probs'] = pad_rows(lp, L, 0.0, dtype=torch.float32)
    elif framework == 'slime':
        for s, ww, kk, ll in zip(obj, w, k, lp):
            s['loss_mask'] = [int(m) * int(x) for m, x in zip(s['loss_mask'], kk.tolist())]
            s['metadata']['agentrl_is_weights'] = ww.tolist()
            s['metadata']['agentrl_old_log_probs'] = ll.tolist()
    elif framework == 'skyrl':
        obj['loss_masks'] = [[int(m) * int(x) for m, x in zip(ms, kk.tolist())] for ms, kk in zip(obj['loss_masks'], k)]
        obj['agentrl_is_weights'] = [x.tolist() for x in w]
        obj['agentrl_old_log_probs'] = [x.tolist() for x in lp]
    else:                                                              # prime-rl: full length, own index
        for s, ww, kk, ll in zip(obj, w, k, lp):
            s['mask'] = [False] + [bool(m) and bool(x) for m, x in zip(s['mask'][1:], kk.tolist())]
            s['agentrl_is_weights'] = [0.0] + ww.tolist()
            s['agentrl_old_log_probs'] = [0.0] + ll.tolist()
    return obj
