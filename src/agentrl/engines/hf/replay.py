"""L4: the step-0 proof for Hugging Face records: a plain forward pass reproduces ``sample_logp``.

The trainer's view of a record is one forward pass over its ids. At step 0 (same weights as the
sampler) the log-prob of every action token recomputed that way, under the record's declared
sampler, must equal the stored sampling log-prob. Records whose template is not prefix-stable
carry per-turn contexts; each turn is then scored in the context it was sampled in
(:func:`agentrl.templates.turn_records`).
"""
from __future__ import annotations

import torch

from ...checks.replay import (TOKEN_KINDS, RatioStats, RecordReplay, ReplayReport, classify_tokens, replay_logp,
                              require_sampled)
# through the package's lazy export: importing the submodule ``agentrl.batching`` first would leave
# ``agentrl.batching`` bound to the module instead of the function
from ...batching import collate
from ...templates import turn_records

__all__ = ['score_rows', 'replay_records', 'expand_turns']


def expand_turns(records) -> list:
    """``[(key, record)]``: records with ``turn_contexts`` split into one record per turn.

    Args:
        records: iterable of :class:`~agentrl.record.Trajectory`.

    Returns:
        Pairs in order; a key is ``'group/rollout#attempt'`` (or the record's index), with
        ``' turn k'`` appended for split records.

    Raises:
        ValueError: as :func:`agentrl.templates.turn_records` (contexts that disagree with the turns).

    Source: book chapter 5.8 ("score turns against the context they were sampled in").
    """
    out = []
    for n, rec in enumerate(records):
        p = rec.provenance
        key = f'{p.group_id}/{p.rollout_id}#{p.attempt}' if p is not None and (p.group_id or p.rollout_id) else str(n)
        if rec.turn_contexts is None:
            out.append((key, rec))
        else:
            out += [(f'{key} turn {t.info["turn"]}', t) for t in turn_records(rec)]
    return out


def _head(model):
    """``(decoder, output head, softcap)`` for scoring only the needed rows, or None."""
    get_dec = getattr(model, 'get_decoder', None)
    get_out = getattr(model, 'get_output_embeddings', None)
    if get_dec is None or get_out is None:
        return None
    try:
        dec, head = get_dec(), get_out()
    except (AttributeError, NotImplementedError):
        return None
    if dec is None or head is None or dec is model:
        return None
    return dec, head, getattr(getattr(model, 'config', None), 'final_logit_softcapping', None)


@torch.no_grad()
def score_rows(model, ids: torch.Tensor, attention_mask: torch.Tensor, rows: list) -> list:
    """Logits at chosen prediction rows of a right-padded batch, from one plain forward pass.

    Args:
        model: a transformers causal LM.
        ids: ``[B, T]`` int64, right-padded.
        attention_mask: ``[B, T]`` (1 on real tokens).
        rows: B int64 tensors; ``rows[b]`` are positions j whose logits predict ``ids[b, j+1]``.

    Returns:
        B float32 tensors ``[len(rows[b]), V]``.

    Notes:
        Only the requested rows go through the output head (a 150k vocabulary makes full
        ``[B, T, V]`` logits hundreds of MB per record); the decoder runs with default
        positions, which are right for right padding. Models with a final logit soft-cap
        (Gemma 2) get it applied.

    Source: book chapter 3.7 / 5.7 (one causal forward pass over the padded batch).
    """
    dev = next(model.parameters()).device
    ids, attention_mask = ids.to(dev), attention_mask.to(dev).long()
    parts = _head(model)
    if parts is None:
        logits = model(input_ids=ids, attention_mask=attention_mask).logits
        return [logits[b, r.to(dev)].float().cpu() for b, r in enumerate(rows)]
    dec, head, cap = parts
    hidden = dec(input_ids=ids, attention_mask=attention_mask).last_hidden_state
    out = []
    for b, r in enumerate(rows):
        lg = head(hidden[b, r.to(dev)]).float()
        if cap:
            lg = torch.tanh(lg / cap) * cap
        out.append(lg.cpu())
    return out


def replay_records(model, records, *, pad_id: int = 0, batch_size: int = 8, tol: float = 1e-4) -> ReplayReport:
    """Recompute every action token's log-prob with a plain forward pass and compare with ``sample_logp``.

    Records (or, with ``turn_contexts``, their per-turn records) are right-padded with
    :func:`agentrl.batching` in batches of ``batch_size``; the logits at each action row are replayed
    under the record's own :class:`~agentrl.record.SamplingSpec`
    (:func:`agentrl.checks.classify_tokens`: ``processed`` mode replays temperature and
    truncation). At step 0 every token is a ``match``.

    Args:
        model: the transformers causal LM that sampled the records (eval mode).
        records: sampled :class:`~agentrl.record.Trajectory` records.
        pad_id: id for padding (masked out).
        batch_size: records per forward pass.
        tol: agreement tolerance in nats (default 1e-4).

    Returns:
        :class:`~agentrl.checks.ReplayReport`: one entry per scored record (per turn for split
        records) with the log-ratio ``replayed - stored`` of each action token and its kind;
        ``report.ok`` when all match, ``report.overall.max_abs_dev`` the largest ``|ratio - 1|``.

    Raises:
        ScriptedRecordError, MissingProvenanceError: a record that must not enter a ratio
            (see :func:`agentrl.checks.require_sampled`).
        ValueError: inconsistent ``turn_contexts``.

    Source: issue 5, item 5 (the step-0 proof); issue 4, item 3 (replay under the declared sampler).
    """
    items = expand_turns(records)
    for _, rec in items:
        require_sampled(rec)
    reps = []
    for start in range(0, len(items), batch_size):
        chunk = items[start:start + batch_size]
        batch = collate([r for _, r in chunk], pad_id)
        rows = [(r.action_mask > 0).nonzero().flatten() for _, r in chunk]
        logits = score_rows(model, batch.ids, batch.attention_mask, rows)
        for (key, rec), rw, lg in zip(chunk, rows, logits):
            spec = rec.provenance.sampling
            targets = rec.ids[rw + 1]
            stored = rec.sample_logp[rw]
            log_ratio = replay_logp(lg, targets, spec) - stored.double()
            if bool((log_ratio.abs() <= tol).all()):      # all match: skip the (costly) mismatch classification
                kinds = torch.zeros(len(rw), dtype=torch.long)
            else:
                log_ratio, kinds = classify_tokens(lg, targets, stored, spec, tol)
            counts = {TOKEN_KINDS[k]: int((kinds == k).sum()) for k in range(len(TOKEN_KINDS))
                      if bool((kinds == k).any())}
            worst = TOKEN_KINDS[int(kinds.max())] if len(kinds) else 'match'
            reps.append(RecordReplay(key=key, kind=worst, stats=RatioStats.of(log_ratio), token_kinds=counts,
                                     rows=rw, log_ratio=log_ratio.cpu(), kinds=kinds.cpu()))
    return ReplayReport.of(reps)
