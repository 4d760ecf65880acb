"""L4: the pieces every exporter and importer shares: the split of a record, the refusals, one builder.

Notation (for one record with ``T = len(ids)``):

* ``P``: index of the first policy token (``P >= 1``: ``Trajectory.from_tokens`` refuses a
  policy-owned first token). Frameworks call ``ids[:P]`` the prompt.
* ``E``: one past the last policy token; ``ids[E:]`` is a trailing observation that trains nothing.
* Response-aligned fields at own index (verl, TRL GRPO, slime, SkyRL): ``mask[P:E] = action_mask[P-1:E-1]``,
  ``logp[P:E] = sample_logp[P-1:E-1]``. Full-length own-index fields (TRL SFT, SkyRL SFT,
  prime-rl): ``[0] + action_mask``. Only OpenRLHF keeps agentrl's ``[T-1]`` alignment.

Source: the layouts of verl 0.9.1 (``_agent_loop_postprocess``), TRL 1.16 (``GRPOTrainer._generate``),
slime (``Sample``), OpenRLHF (``Experience``), SkyRL (``GeneratorOutput``), prime-rl (``TrainingSample``).
"""
from __future__ import annotations

import numbers
import warnings
from dataclasses import dataclass

import torch

from ..checks import errors as E
from ..checks.acceptance import find_problems
from ..record import OWNER, Provenance, SamplingSpec, Trajectory
from .images import refuse_images

__all__ = ['Split', 'split', 'split_turns', 'check_exportable', 'check_support', 'SupportMismatchWarning',
           'expected_step0_ratio', 'check_groups', 'group_key', 'sort_by_group', 'record_from_response',
           'ResponseColumns', 'provenance_for_import', 'as_list', 'guess_source', 'source_fix', 'check_ids',
           'check_mask', 'check_same', 'check_reward']

_POLICY = OWNER['policy']


@dataclass(frozen=True)
class Split:
    """Where the framework's prompt and response lie in one record.

    Attributes:
        P: first policy token (the prompt is ``ids[:P]``).
        E: one past the last policy token.
        T: ``len(ids)``.
    """
    P: int
    E: int
    T: int

    def end(self, trim: bool) -> int:
        """End of the exported response: ``E`` when trimming the trailing observation, else ``T``."""
        return self.E if trim else self.T


def split(rec: Trajectory, row: int = 0) -> Split:
    """The ``(P, E, T)`` split of a record.

    Args:
        rec: a record with ``owner [T]``.
        row: its index in the batch (named in errors).

    Raises:
        agentrl.checks.errors.MissingFieldError: ``rec.owner`` is None (fix: build with ``Trajectory.from_tokens``).
        ValueError: the record has no policy token (nothing to train; drop it before export).
    """
    if rec.owner is None:
        raise E.MissingFieldError(f'record {row} has no owner; the split into prompt and response needs it',
                                  field='owner', fix='build records with Trajectory.from_tokens')
    pol = (torch.as_tensor(rec.owner) == _POLICY).nonzero().flatten()
    if len(pol) == 0:
        raise ValueError(f'record {row} has no policy token (action_mask all 0): a trainer has nothing to learn '
                         'from it; drop it before export')
    return Split(int(pol[0]), int(pol[-1]) + 1, len(rec.ids))


def split_turns(records) -> list:
    """Records with ``turn_contexts`` replaced by one record per turn (:func:`agentrl.record.turn_records`);
    others unchanged. Each turn row keeps the episode's provenance (so its group) and reward."""
    from ..record import turn_records
    out = []
    for r in records:
        out.extend(turn_records(r) if r.turn_contexts is not None else [r])
    return out


def as_list(x) -> list:
    """A tensor, numpy array or sequence as a plain Python list."""
    return x.tolist() if hasattr(x, 'tolist') else list(x)


def check_exportable(records, *, need_logp: bool = True) -> None:
    """Refuse records that no exporter may hand on: the acceptance check, placeholder log-probs, per-turn contexts.

    Args:
        records: the records to export.
        need_logp: the target consumes sampling log-probs (every RL layout); placeholder
            (scripted) log-probs are then refused.

    Raises:
        agentrl.checks.errors.RecordError: the first refusal of :func:`agentrl.checks.find_problems`
            (prefixed with the row), ``ScriptedRecordError`` for placeholder log-probs, or
            ``TurnContextError`` for a record with ``turn_contexts`` (one sequence cannot hold them),
            ``TokenizerMismatchError`` for records of two tokenizer fingerprints (one batch, one vocabulary).
    """
    first = None                                    # (row, fingerprint) of the first record that names one
    for i, rec in enumerate(records):
        fp = rec.provenance.tokenizer if rec.provenance is not None else ''
        if fp and first is None:
            first = (i, fp)
        elif fp and fp != first[1]:
            raise E.TokenizerMismatchError(
                f'record {i} was tokenized by {fp!r} but record {first[0]} by {first[1]!r}; one batch holds one '
                "tokenizer's ids (the same id is another token in the other vocabulary)",
                field='provenance.tokenizer', fix='export the records of each tokenizer separately')
        if rec.turn_contexts is not None:
            raise E.TurnContextError(
                f'record {i} has per-turn contexts (its template rewrites history, so turn k was sampled after '
                'another prefix than ids[:start_k]); as one sequence, the trainer would score its turns in the '
                'wrong context', field='turn_contexts',
                fix='split it into one row per turn with agentrl.record.turn_records (export(..., split_turns=True), '
                    '--split-turns) for slime, SkyRL, prime-rl, OpenRLHF or SFT; verl and TRL take one trajectory '
                    'per prompt, so sample with history="sampled" for them')
        problems = find_problems(rec, require_provenance=False)
        if problems:
            p = problems[0]
            raise type(p)(f'record {i}: {p}', field=p.field, position=p.position, fix='')
        if need_logp and rec.provenance is not None and rec.provenance.logp_placeholder:
            raise E.ScriptedRecordError(
                f'record {i} carries placeholder log-probs (a scripted policy); an RL trainer would use them as '
                'the behaviour policy', field='sample_logp',
                fix="export it for SFT (export(records, 'sft', out); CLI: --to sft), or re-score it with the policy "
                    'before an RL export')


def expected_step0_ratio(spec: SamplingSpec) -> str:
    """What the step-0 ratio ``exp(trainer logp - stored logp)`` is for records drawn under ``spec``
    when the trainer recomputes ``log_softmax(logits / T)`` over the full vocabulary.

    Processed log-probs under truncation are ``log p - log(kept mass)``, so the ratio per token is the
    kept mass: in ``[top_p, 1]`` under top-p alone, in ``(0, 1]`` otherwise. Raw log-probs at
    ``T != 1`` are ``log_softmax(logits)``: the ratio is unbounded either way.

    Greedy records (``temperature == 0``) store the argmax's log-prob at temperature 1: scored at
    ``T = 1`` the ratio is exactly 1, but the tokens were never sampled from that distribution.

    Source: vLLM ``logprobs_mode`` (processed vs raw); trl#6789.
    """
    if spec.temperature == 0:
        return ('exactly 1 when scored at temperature 1 (the stored log-prob is the argmax\'s at temperature 1), '
                'but the tokens are argmax picks, not samples of that distribution: the update is biased')
    if spec.logp_mode == 'raw':
        return (f'raw log-probs at temperature {spec.temperature}: the ratio per token is '
                f'softmax(logits/{spec.temperature}) / softmax(logits), not 1 and not bounded')
    if spec.top_p < 1 and spec.top_k == 0 and spec.min_p == 0:
        return f'each token\'s kept mass, in [{spec.top_p}, 1] (top_p={spec.top_p}); below 1 wherever the nucleus cut'
    return (f'each token\'s kept mass, in (0, 1] (top_k={spec.top_k}, top_p={spec.top_p}, min_p={spec.min_p}); '
            'below 1 wherever the support was cut')


def _ratio_floor(spec: SamplingSpec) -> float:
    """The lowest step-0 ratio :func:`expected_step0_ratio` allows (-1: unbounded, raw log-probs)."""
    if spec.temperature == 0:
        return 1.0
    if spec.logp_mode == 'raw':
        return -1.0
    if spec.top_k > 0 or spec.min_p > 0:
        return 0.0
    return spec.top_p


class SupportMismatchWarning(UserWarning):
    """Exported log-probs the trainer will not reproduce at step 0 (``allow_support_mismatch=True``)."""


def _support_ok(spec: SamplingSpec, replays_top_p: bool) -> bool:
    if spec.temperature == 0:
        return False
    if spec.logp_mode == 'raw':
        return spec.temperature == 1
    truncated = spec.top_k > 0 or spec.min_p > 0 or (spec.top_p < 1 and not replays_top_p)
    return not truncated


def check_support(records, target: str, *, allow_support_mismatch: bool = False, replays_top_p: bool = False):
    """Refuse (or warn about) log-probs the target's trainer cannot reproduce at step 0.

    Every trainer here recomputes ``log_softmax(logits / T)`` over the full vocabulary (slime replays
    the top-p keep set, ``replays_top_p=True``). Stored log-probs equal that only when they are
    ``processed`` with no truncation (``top_k == 0``, ``top_p == 1``, ``min_p == 0``), or ``raw`` at
    ``T == 1``. Greedy records (``temperature == 0``) are refused: their stored log-probs are the
    argmax's at temperature 1, not the probability of a sampler that drew the token (the argmax is
    never drawn at random), so a policy-gradient update on them is biased; allowed, they are scored
    at temperature 1 (step-0 ratio exactly 1).

    Args:
        records: records with ``provenance.sampling`` (records without one pass: nothing is declared).
        target: the framework's name (in messages).
        allow_support_mismatch: warn instead of refusing: one :class:`SupportMismatchWarning` per
            call, with the count of such records and the worst step-0 ratio among their samplers.
        replays_top_p: the trainer replays the top-p keep set.

    Returns:
        The sampling temperature all records share (None when none declares one); greedy records
        count as temperature 1.0 (the temperature their stored log-probs were taken at).

    Raises:
        agentrl.checks.errors.SupportMismatchError: a record's declared sampler differs from the
            trainer's recomputation and ``allow_support_mismatch`` is False.
        ValueError: records declare different temperatures (a trainer has one temperature).
    """
    temps = set()
    bad: dict = {}                                  # sampler -> indices of the records drawn under it
    for i, rec in enumerate(records):
        spec = rec.provenance.sampling if rec.provenance is not None else None
        if spec is None:
            continue
        temps.add(1.0 if spec.temperature == 0 else spec.temperature)
        if _support_ok(spec, replays_top_p):
            continue
        if not allow_support_mismatch and spec.temperature == 0:
            raise E.SupportMismatchError(
                f'record {i} was decoded greedily (temperature 0): its tokens are argmax picks, not samples, and '
                'its stored log-probs are the argmax\'s at temperature 1, not the probability of the token under '
                f'the sampler that chose it; a policy-gradient update in {target} on them is biased',
                field='provenance.sampling',
                fix='sample RL records with temperature > 0 (e.g. 1.0), export greedy records for SFT (--to sft), '
                    'or pass allow_support_mismatch=True (--allow-support-mismatch) to export them scored at '
                    'temperature 1 (step-0 ratio exactly 1)')
        if not allow_support_mismatch:
            raise E.SupportMismatchError(
                f'record {i} was sampled with {spec.to_dict()}, but {target} recomputes log_softmax(logits / T) '
                f'over the full vocabulary; the step-0 ratio is {expected_step0_ratio(spec)}',
                field='provenance.sampling',
                fix='re-score the records under a temperature-only sampler, sample with top_k=0, top_p=1, '
                    'min_p=0, or pass allow_support_mismatch=True (--allow-support-mismatch) to export anyway')
        bad.setdefault(spec, []).append(i)
    if bad:                                         # one warning for all of them
        n = sum(map(len, bad.values()))
        first = min(min(v) for v in bad.values())
        worst = min(bad, key=_ratio_floor)
        samplers = f'{next(iter(bad)).to_dict()}' if len(bad) == 1 else f'{len(bad)} samplers'
        warnings.warn(SupportMismatchWarning(
            f'{n} of {len(records)} records (the first: record {first}) were sampled with {samplers}, but {target} '
            f'recomputes log_softmax(logits / T) over the full vocabulary; the worst step-0 ratio is '
            f'{expected_step0_ratio(worst)}'), stacklevel=3)
    if len(temps) > 1:
        raise ValueError(f'records declare temperatures {sorted(temps)}; {target} scores every row at one '
                         'temperature: export each temperature separately')
    return temps.pop() if temps else None


def group_key(rec: Trajectory, row: int) -> str:
    """The group a record belongs to: ``provenance.group_id``, or its own row when it has none."""
    g = rec.provenance.group_id if rec.provenance is not None else ''
    return g if g else f'#row{row}'


def check_groups(records, target: str) -> int:
    """Check that every group's rows are contiguous and all groups have one size.

    Trainers that group by position (TRL ``num_generations``, slime and OpenRLHF
    ``n_samples_per_prompt``) reshape rewards to ``(-1, G)``; a group split across positions mixes
    rewards of different prompts into one advantage baseline, silently.

    Args:
        records: the records in export order.
        target: the framework's name (in messages).

    Returns:
        ``G``, the group size.

    Raises:
        agentrl.checks.errors.GroupOrderError: a group's rows are not contiguous, or groups differ in size.
    """
    keys = [group_key(r, i) for i, r in enumerate(records)]
    seen, sizes, prev = {}, {}, None
    for i, k in enumerate(keys):
        if k != prev and k in seen:
            raise E.GroupOrderError(
                f'group {k!r} has rows {seen[k]} and {i} with other groups between them; {target} groups rows '
                'by position, so this group would be split', field='provenance.group_id', position=i,
                fix='sort the records by group (sort_groups=True / --sort-groups keeps the order within a group)')
        seen.setdefault(k, i)
        sizes[k] = sizes.get(k, 0) + 1
        prev = k
    distinct = sorted(set(sizes.values()))
    if len(distinct) > 1:
        small = min(sizes, key=sizes.get)
        raise E.GroupOrderError(
            f'groups have sizes {distinct} (group {small!r} has {sizes[small]}); {target} reshapes rows to '
            '(-1, group size), so every group needs the same number of rows', field='provenance.group_id',
            fix='drop or complete the short groups before export')
    return distinct[0] if distinct else 0


def sort_by_group(records) -> list:
    """Records reordered so each group's rows are contiguous (stable: first appearance, then row order)."""
    order: dict = {}
    for i, r in enumerate(records):
        order.setdefault(group_key(r, i), len(order))
    idx = sorted(range(len(records)), key=lambda i: order[group_key(records[i], i)])
    return [records[i] for i in idx]


def provenance_for_import(source: str, *, spec: SamplingSpec | None, group_id: str = '', rollout_id: str = '',
                          tokenizer=None, model: str = '', placeholder: bool = False) -> Provenance:
    """Provenance of an imported record: the source framework, the declared sampler, the identity.

    Args:
        source: ``'verl'``, ``'trl'``, ``'vllm'`` ... (stored as ``provenance.policy``).
        spec: the sampler (None when the source does not carry it and none was declared).
        group_id, rollout_id: identity.
        tokenizer: a Hugging Face tokenizer to fingerprint (None: left empty).
        model: model id.
        placeholder: the source had no log-probs (zeros stored).
    """
    fp = ''
    if tokenizer is not None:
        from ..templates.chat import tokenizer_fingerprint
        fp = tokenizer_fingerprint(tokenizer)
    return Provenance(policy=source, tokenizer=fp, sampling=None if placeholder else spec, model=model,
                      logp_placeholder=placeholder, group_id=str(group_id), rollout_id=str(rollout_id))


def check_ids(values, name: str, where: str) -> list:
    """``values`` as a list of Python ints, or a refusal: every importer reads token ids through this.

    Args:
        values: ``[N]`` ids (list, tensor or numpy array).
        name: the source field (``'responses'``), named in the error.
        where: who and which row (``'from_verl row 3'``).

    Raises:
        agentrl.checks.errors.TokenIdError: an entry that is not an integer (``141.5``, ``True``,
            ``'7'``, None); a float dtype tensor counts as all its entries. Position: the first one.
    """
    vals = as_list(values)
    bad = [j for j, v in enumerate(vals) if isinstance(v, bool) or not isinstance(v, numbers.Integral)]
    if bad:
        v = vals[bad[0]]
        raise E.TokenIdError(f'{where}: is {v!r} ({type(v).__name__}), not an integer token id', field=name,
                             position=bad[0], count=len(bad),
                             fix='store token ids as integers (int64); a float or boolean id is not the token '
                                 'that was sampled')
    return [int(v) for v in vals]


def check_mask(values, name: str, where: str) -> list:
    """``values`` as a list of 0/1 ints, or a refusal: every importer reads masks through this.

    ``True``/``False`` and ``0.0``/``1.0`` are 1/0; anything else (2, 0.5, -1, None, text) is refused.

    Raises:
        agentrl.checks.errors.MaskValueError: an entry outside {0, 1}, naming the field, the first
            position and the count.
    """
    vals = as_list(values)
    bad = [j for j, v in enumerate(vals) if not isinstance(v, numbers.Real) or v not in (0, 1)]
    if bad:
        raise E.MaskValueError(f'{where}: is {vals[bad[0]]!r}, not 0 or 1', field=name, position=bad[0],
                               count=len(bad), fix='masks are 0/1 (1: sampled by the policy)')
    return [int(v) for v in vals]


def check_reward(value, name: str, where: str) -> float:
    """``value`` (a number, or a list of per-token numbers summed, as SkyRL's) as a Python float, or a refusal:
    every importer reads rewards through this.

    Args:
        value: the source's reward (JSON number, tensor item, list of numbers).
        name: the source field (``'rewards'``), named in the error.
        where: who and which row (``'from_skyrl row 3'``).

    Returns:
        the reward (float64; NaN and inf pass through to the acceptance checks, which refuse them).

    Raises:
        agentrl.checks.errors.NonFiniteRewardError: an integer too large for a float64 (a JSON number of
            hundreds of digits), or a value that is not a number (text, None, a dict).
    """
    try:
        return float(sum(value) if isinstance(value, (list, tuple)) else value)
    except OverflowError:
        digits = len(str(abs(int(sum(value) if isinstance(value, (list, tuple)) else value))))
        raise E.NonFiniteRewardError(f'{where}: is an integer of {digits} digits, too large for a float64 reward',
                                     field=name, fix='store rewards as numbers within +-1.8e308 (a float64), '
                                                     'e.g. rescale them') from None
    except (TypeError, ValueError):
        raise E.NonFiniteRewardError(f'{where}: is {str(value)[:40]!r} ({type(value).__name__}), not a number',
                                     field=name, fix='store each reward as a number (float)') from None


def check_same(name: str, got, want, where: str, of: str) -> None:
    """Refuse a field whose shape (or row count) is not ``want``: a slip of one column is never absorbed.

    Raises:
        agentrl.checks.errors.LengthMismatchError (MaskAlignmentError for a mask one entry short):
            ``got != want``, naming both fields and both shapes.
    """
    if tuple(got) == tuple(want):
        return
    cls = E.MaskAlignmentError if 'mask' in name and len(got) == len(want) and got[-1] == want[-1] - 1 \
        else E.LengthMismatchError
    raise cls(f'{where}: has shape {list(got)} but {of} has {list(want)}; every row and column must line up '
              'with it (a column short or extra would move or drop tokens)', field=name,
              fix=f'pass {name} exactly as the framework wrote it, one entry per {of} entry')


def check_len(name: str, got: int, want: int, row, what: str) -> None:
    """Refuse a per-token field of an imported row whose length is not one entry per token.

    Args:
        name: the field's name in the source framework (``...mask`` and ``...log...`` names get their own error).
        got: entries the field has. want: tokens of the row. row: the row's index, for the message.
        what: the source framework's name of the batch, for the message.

    Raises:
        agentrl.checks.errors.MaskAlignmentError: a mask one entry short (aligned to ``ids[1:]``).
        agentrl.checks.errors.LogProbLengthError: a log-prob field of the wrong length.
        agentrl.checks.errors.LengthMismatchError: any other field of the wrong length.
    """
    if got == want:
        return
    if name.endswith('mask') and got == want - 1:
        raise E.MaskAlignmentError(
            f'{what} row {row}: has length {got} but {want} tokens; a mask aligned to ids[1:] (length T-1) '
            'was handed where one value per token at own index is expected, so every label would move one '
            'token', field=name,
            fix="give one entry per token (agentrl's action_mask becomes [0] + action_mask, or "
                'action_mask[P-1:E-1] over a response)')
    if 'log' in name:
        raise E.LogProbLengthError(f'{what} row {row}: has {got} log-probs for {want} tokens', field=name,
                                   fix='give one log-prob per token at own index (0.0 where not sampled)')
    raise E.LengthMismatchError(f'{what} row {row}: has length {got} but {want} tokens', field=name,
                                fix='give one entry per token')


@dataclass(frozen=True)
class ResponseColumns:
    """What a source calls the parts :func:`record_from_response` reads, for its one-line errors.

    Each importer holds one (``from_trl`` reads ``completion_ids`` and ``tool_mask``, ``from_slime`` reads
    ``tokens`` and ``loss_mask``), so a refusal names the source's own field.

    Attributes:
        what: the importer's public name (``'from_verl'``); errors begin ``"{what} row {row}"``.
        prompt, response, mask, logp: the source's names of the prompt ids, the response ids, the own-index
            response mask and the response log-probs.

    Raises:
        ValueError: a field that is not a non-empty string.
    """
    what: str = 'import'
    prompt: str = 'prompt_ids'
    response: str = 'response_ids'
    mask: str = 'response_mask'
    logp: str = 'response_logprobs'

    def __post_init__(self):
        for name in ('what', 'prompt', 'response', 'mask', 'logp'):
            value = getattr(self, name)
            if not isinstance(value, str) or not value:
                raise ValueError(f'ResponseColumns.{name} = {value!r}: must be a non-empty string; pass the name the '
                                 'source uses for it')


def record_from_response(prompt_ids, response_ids, response_mask, response_logp, *, reward: float, info: dict,
                         provenance: Provenance | None, row=0, columns: ResponseColumns = ResponseColumns(),
                         turn_contexts=None) -> Trajectory:
    """Build one record from a prompt and a response with own-index mask and log-probs.

    Owners: ``prompt`` on ``prompt_ids``; on the response, ``policy`` where the mask is 1 and
    ``tool`` where it is 0 (no framework keeps template and tool tokens apart). Turn ``k`` is the
    ``k``-th run of policy tokens plus the mask-0 tokens after it; the prompt is turn -1.

    Args:
        prompt_ids: ``[P]`` ints, ``P >= 1``.
        response_ids: ``[R]`` ints.
        response_mask: ``[R]`` 0/1 at own index (1: the policy sampled this token).
        response_logp: ``[R]`` float sampling log-probs at own index, or None (zeros; the caller
            marks the provenance ``logp_placeholder``).
        reward, info, provenance: as in :meth:`Trajectory.from_tokens`.
        row: the row's index in the source, named in errors.
        columns: the source's names of the parts (:class:`ResponseColumns`), named in errors.
        turn_contexts: passed through.

    Raises:
        agentrl.checks.errors.MaskAlignmentError: the mask has ``R-1`` entries (a ``[T-1]`` mask).
        agentrl.checks.errors.LogProbLengthError: log-probs of another length than the response.
        agentrl.checks.errors.MaskValueError: a mask entry other than 0 or 1 (:func:`check_mask`).
        agentrl.checks.errors.TokenIdError: an id that is not an integer (:func:`check_ids`).
        ValueError: an empty prompt (the first token cannot be policy-owned).
    """
    c, what = columns, columns.what
    where = f'{what} row {row}'
    prompt_ids, response_ids = check_ids(prompt_ids, c.prompt, where), check_ids(response_ids, c.response, where)
    mask = as_list(response_mask)
    check_len(c.mask, len(mask), len(response_ids), row, what)
    mask = check_mask(mask, c.mask, where)
    logp = [0.0] * len(response_ids) if response_logp is None else as_list(response_logp)
    check_len(c.logp, len(logp), len(response_ids), row, what)
    if not prompt_ids:
        raise ValueError(f'{what} row {row}: the prompt is empty; the first token has no preceding position. '
                         'Fix: include the prompt ids the response was sampled after')
    owner = [OWNER['prompt']] * len(prompt_ids)
    turn = [-1] * len(prompt_ids)
    k, prev = -1, 0
    for m in mask:
        m = int(m)
        if m and not prev:
            k += 1
        owner.append(_POLICY if m else OWNER['tool'])
        turn.append(max(k, 0) if m or k >= 0 else -1)
        prev = m
    lp = [0.0] * len(prompt_ids) + [float(x) for x in logp]
    return Trajectory.from_tokens(prompt_ids + response_ids, owner, turn, lp, reward, info,
                                  provenance=provenance, turn_contexts=turn_contexts)


def prepare_export(records, caller: str, target: str, *, allow_support_mismatch: bool = False,
                   replays_top_p: bool = False, groups: str | None = None, images: bool = False):
    """The checks every RL exporter runs first: some records, sampled, on the target's support, grouped.

    Args:
        records: the records (any iterable).
        caller: the exporter's name for the message (``'to_verl'``).
        target: the framework, as :func:`check_support` names it.
        allow_support_mismatch, replays_top_p: see :func:`check_support`.
        groups: when given, the target groups rows by position: :func:`check_groups` with this description.
        images: the target takes images beside the ids (verl, TRL); False: a record that lists images is
            refused (:func:`agentrl.interop.images.refuse_images`).

    Returns:
        ``(records as a list, the records' temperature or None)``.

    Raises:
        ValueError: no records; a record with images for a target without an image input. RecordError: what
            :func:`check_exportable`, :func:`check_support` and :func:`check_groups` refuse.
    """
    records = list(records)
    if not records:
        raise ValueError(f'{caller}: no records; pass at least one')
    if not images:
        refuse_images(records, caller, target)
    check_exportable(records)
    temperature = check_support(records, target, allow_support_mismatch=allow_support_mismatch,
                                replays_top_p=replays_top_p)
    if groups is not None:
        check_groups(records, groups)
    return records, temperature


# ----------------------------------------------------------------------------- loaded files

def guess_source(data) -> str | None:
    """The framework whose file ``data`` looks like (by its keys), or None.

    Args:
        data: a loaded file: a dict (verl, slime, TRL, OpenRLHF, SkyRL, one vLLM/SGLang episode) or a
            list of dicts (prime-rl rows, vLLM/SGLang episodes).

    Returns:
        ``'verl'``, ``'slime'``, ``'trl'``, ``'openrlhf'``, ``'skyrl'``, ``'prime-rl'``, ``'vllm'``
        (vLLM or SGLang episodes) or None when no framework's keys are there. Never raises.
    """
    if isinstance(data, (list, tuple)) and data and isinstance(data[0], dict):
        data = data[0]
    if not isinstance(data, dict):
        return None
    keys = set(map(str, data))
    for name, need in (('verl', {'batch', 'non_tensor_batch'}), ('slime', {'samples'}),
                       ('trl', {'prompt_ids', 'completion_ids'}), ('openrlhf', {'sequences', 'action_mask'}),
                       ('skyrl', {'prompt_token_ids', 'response_ids'}), ('prime-rl', {'token_ids', 'mask'}),
                       ('vllm', {'exchanges'})):
        if need <= keys:
            return name
    return None


def source_fix(data, framework: str) -> str:
    """The fix for a file that is not of ``framework``'s shape: the framework it looks like, if another.

    Returns:
        ``'is this a verl file? pass --from verl'`` (vLLM/SGLang episodes: ``pass --from vllm or
        --from sglang``) when :func:`guess_source` names another framework, else ``'pass the file (or
        folder) `agentrl export --to FRAMEWORK` or FRAMEWORK wrote'``.
    """
    g = guess_source(data)
    if g == 'vllm' and framework not in ('vllm', 'sglang'):
        return 'is this a file of vLLM/SGLang episodes? pass --from vllm or --from sglang'
    if g is not None and g != 'vllm' and g != framework:
        return f'is this a {g} file? pass --from {g}'
    if framework in ('vllm', 'sglang'):
        return ('pass a JSON list of episodes {"exchanges": [{"request": ..., "response": ...}, ...]} or a JSONL '
                'file, one episode per line')
    return f'pass the file (or folder) `agentrl export --to {framework}` or {framework} wrote'


def _damaged_pt(e: BaseException) -> str | None:
    """``TYPE: first sentence`` of a ``torch.load`` error from a cut or damaged file; None for torch's ``Unsupported
    global`` (a whole file naming a class or function weights_only=True refuses)."""
    text = ' '.join(str(e).split())
    if 'Unsupported global' in text or 'Unsupported class' in text:
        return None
    text = text.split('. ')[0].rstrip('.')
    return f'{type(e).__name__}: {text}' if text else type(e).__name__


def load_pt(path, framework: str | None = None):
    """``torch.load`` restricted to tensors and plain containers (no code runs from the file).

    Raises:
        ValueError: the file holds objects beyond tensors and plain containers (torch's ``Unsupported
            global``), is truncated or damaged (a cut zip, an empty file, bytes no unpickler reads: the
            fix never says to unpickle it), or is JSON text (names the file and, when ``framework`` is
            given, the framework it looks like).
    """
    try:
        return torch.load(path, weights_only=True)
    except Exception as e:  # pickle.UnpicklingError and friends: objects beyond tensors and plain data
        with open(path, 'rb') as f:
            head = f.read(64).lstrip()
        if framework is not None and head[:1] in (b'{', b'['):
            from ..io import read_json
            try:
                data = read_json(path, fix='', lines='auto')
            except ValueError:
                data = None
            raise ValueError(f'{str(path)!r} is JSON text, not a torch .pt file; {source_fix(data, framework)}') from e
        if _damaged_pt(e):                  # a cut or damaged file: never advise unpickling it
            raise ValueError(f'{str(path)!r} is truncated or damaged, not a readable torch .pt file '
                             f'({_damaged_pt(e)}); write it again or pass an intact copy') from e
        raise ValueError(f'{str(path)!r} holds objects beyond tensors, lists and dicts ({type(e).__name__}); '
                         'agentrl loads .pt files with weights_only=True. Fix: if you trust the file, load it '
                         'yourself with torch.load(weights_only=False) and pass the result to the from_* function') from e
