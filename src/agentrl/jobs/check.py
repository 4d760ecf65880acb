"""L5: the check job: validate every stored record, replay sampled ones, tally, and report.

:func:`run_check` reads a trajectory file or folder row by row (:func:`agentrl.store.scan`) and
returns a :class:`CheckReport`; ``agentrl check`` prints :meth:`CheckReport.format` and exits
with :attr:`CheckReport.code`. Nothing a trainer must never see passes:

* a row that cannot be converted (a null, a wrong type, malformed JSON): MalformedRowError;
* a row whose content no longer matches its stored digest (edited after writing):
  DigestMismatchError;
* the acceptance rules of :mod:`agentrl.checks.acceptance` (ids outside the vocabulary, a
  non-finite reward, mask and log-prob faults, provenance and fingerprints);
* a record stored twice (a resend): DuplicateRecordError; two records with one identity
  ``(group, rollout, attempt)`` but different content: IdentityConflictError;
* with a model: a sampled record the model cannot replay (NotReplayableError), a declared
  sampler that does not reproduce the stored log-probs, and any replay ratio that is
  non-finite or further than ``max_ratio_dev`` from 1.

An empty input fails too (nothing was checked). Replaying with the model that sampled the
records is the step-0 check, where every ratio is 1.

Source: docs/design.md#integrity (identity, resends, digests) and docs/design.md#replay.
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass, field, replace
from typing import Callable

from ..stats import is_truncated, source_stop_reason
from ..tokenizer import BUGFIX_VOCAB
from .check_report import SAMPLER_DEFECTS, CheckReport  # noqa: F401 - re-exported (agentrl.jobs.check.CheckReport)
from .plan import POLICIES

__all__ = ['CheckOptions', 'CheckReport', 'CheckFailedError', 'run_check', 'require_accepted', 'load_model',
           'count_rows']



@dataclass
class CheckOptions:
    """Options of the check (one field per ``agentrl check`` flag).

    Attributes:
        path: a trajectory ``.parquet`` file or a folder of shards.
        model: TinyAgent checkpoint or Hugging Face model folder to replay sampled records with
            (None: no replay).
        expect_tokenizer: refuse records whose tokenizer fingerprint differs (None: any).
        expect_template: refuse records whose template fingerprint differs (None: any).
        pad_id: padding id (None: agentrl's word-level tokenizer's when the records use it).
        eot_ids: end-of-turn ids (empty: the records' template end-of-turn, else the word-level ``</call>``).
        vocab_size: number of token ids; ids outside ``[0, vocab_size)`` are refused (None: the
            word-level tokenizer's when the records use it, else only ids < 0; with a model, an id
            it cannot score fails its replay).
        tol: replay agreement tolerance in nats (finite, >= 0).
        max_ratio_dev: fail when any replay ratio is further than this from 1 (>= 0, default
            1e-3; ``inf``: report only, e.g. when replaying with another checkpoint; NaN refused).
        examples: how many refusal messages to print (>= 0).
        batch_size: records read per batch (>= 1).
        dtype: the replay model's parameter dtype: ``float32`` (the step-0 check: passes at ``tol``
            1e-4 and ``max_ratio_dev`` 1e-3) or ``bfloat16`` (reports its mismatch; passes only when
            every token's ``|Δ log-p|`` is within the ``tol`` the user gives, since bfloat16 replays
            of float32 samples differ by up to about 0.06 nats: docs/vllm.md).
        device: where the replay model runs (``cpu``, ``cuda``, ``cuda:1`` ...).
        correction: with ``model``, print the would-be weight distribution of this off-policy correction
            mode (:func:`agentrl.train.off_policy_correction`, default thresholds) over the replayed tokens.
        current_version, max_staleness: report staleness against the trainer's step, and refuse records
            more than ``max_staleness`` steps old (:mod:`agentrl.checks.staleness`; docs/design.md#training).
        no_packed: replay right-padded batches instead of packed rows (:func:`agentrl.checks.score_sequences`).
        workers: Ray workers the shards are split across (0: this process; :mod:`agentrl.jobs.check_workers`).
        image_token_id: the image placeholder id (None: each image's processor class's; :mod:`agentrl.checks.images`).
    """
    path: str = field(metadata={'positional': True, 'help': 'trajectory .parquet file or folder of shards'})
    model: str | None = field(default=None, metadata={
        'metavar': 'M', 'help': 'TinyAgent checkpoint (model.pt) or Hugging Face model folder to replay sampled '
                                'records under their declared sampler (per-turn contexts included); a record it '
                                'cannot replay fails the check'})
    expect_tokenizer: str | None = field(default=None, metadata={'metavar': 'FP',
                                                                 'help': 'expected tokenizer fingerprint'})
    expect_template: str | None = field(default=None, metadata={'metavar': 'FP',
                                                                'help': 'expected template fingerprint'})
    pad_id: int | None = field(default=None, metadata={'min': 0, 'help': 'padding id (default: from the word-level '
                                                                         'tokenizer when the records use it)'})
    eot_ids: list = field(default_factory=list, metadata={
        'flag': '--eot-id', 'metavar': 'ID',
        'help': "end-of-turn id, repeatable (default: the records' template end-of-turn, or the word-level </call>)"})
    vocab_size: int | None = field(default=None, metadata={
        'min': 1, 'metavar': 'V', 'help': "refuse ids outside [0, V) (default: the word-level tokenizer's when "
                                          "the records use it; without it only negative ids are refused and the "
                                          "model's replay catches the rest)"})
    tol: float = field(default=1e-4, metadata={'min': 0, 'help': 'replay agreement tolerance, nats'})
    max_ratio_dev: float = field(default=1e-3, metadata={
        'min': 0, 'allow_inf': True, 'help': 'fail if any replay ratio differs from 1 by more than this (the '
                                             'step-0 check; inf: only report, e.g. when replaying with another '
                                             'checkpoint; NaN is refused)'})
    examples: int = field(default=5, metadata={'min': 0, 'help': 'refusal messages to print'})
    batch_size: int = field(default=256, metadata={'min': 1, 'help': 'records per read batch'})
    dtype: str = field(default='float32', metadata={
        'choices': ('float32', 'bfloat16'), 'help': "the --model replay's dtype: float32 (the step-0 check) or "
                                                    "bfloat16 (reports the mismatch; passes only within --tol)"})
    device: str = field(default='cpu', metadata={'metavar': 'DEV', 'help': 'where the --model replay runs '
                                                                           '(cpu, cuda, cuda:1 ...)'})
    current_version: int | None = field(default=None, metadata={
        'min': 0, 'metavar': 'STEP', 'help': "the trainer's current step: report each record's staleness against it "
                                             '(records stamped with integer policy versions)'})
    correction: str | None = field(default=None, metadata={
        'choices': ('token_tis', 'seq_tis', 'token_mask', 'icepop', 'geo_mask', 'seq_mask_tis'), 'metavar': 'MODE',
        'help': 'with --model: print the off-policy correction weights this replay would give '
                '(agentrl.correction; default thresholds)'})
    max_staleness: int | None = field(default=None, metadata={
        'min': 0, 'metavar': 'K', 'help': 'with --current-version: refuse records sampled more than K steps earlier'})
    no_packed: bool = field(default=False, metadata={
        'help': 'with --model: score right-padded batches instead of packed rows (the reference path; same numbers)'})
    image_token_id: int | None = field(default=None, metadata={
        'min': 0, 'metavar': 'ID', 'help': "the image placeholder id of records with images (default: their "
                                           "processor class's, agentrl.images.IMAGE_TOKEN_IDS)"})
    workers: int = field(default=0, metadata={
        'min': 0, 'metavar': 'N', 'help': 'check the shards of a folder on N local Ray workers (0: in this process); '
                                          'the same report (agentrl.jobs.check_workers)'})

    def validate(self) -> None:
        """Raise ValueError naming the flag when an option is out of range (nothing has run yet).

        Raises:
            ValueError: ``--tol`` not finite or < 0; ``--max-ratio-dev`` NaN or < 0 (inf is
                allowed: report only); ``--batch-size`` < 1; ``--examples`` < 0;
                ``--vocab-size`` < 1; a negative ``--pad-id`` / ``--eot-id``.
        """
        if not (isinstance(self.tol, (int, float)) and math.isfinite(self.tol) and self.tol >= 0):
            raise ValueError(f'--tol must be a finite number >= 0 (nats), got {self.tol}')
        if not (isinstance(self.max_ratio_dev, (int, float)) and self.max_ratio_dev >= 0):
            raise ValueError(f'--max-ratio-dev must be a number >= 0 (inf: only report the ratios), got '
                             f'{self.max_ratio_dev}; a NaN threshold would switch the gate off')
        if self.correction is not None and self.model is None:
            raise ValueError('--correction needs --model: the weights compare the replayed log-probs with the stored ones')
        if self.max_staleness is not None and self.current_version is None:
            raise ValueError('--max-staleness needs --current-version (the step staleness is counted from)')
        if self.batch_size < 1:
            raise ValueError(f'--batch-size must be >= 1, got {self.batch_size}')
        if self.examples < 0:
            raise ValueError(f'--examples must be >= 0, got {self.examples}')
        if self.workers < 0:
            raise ValueError(f'--workers must be >= 0 (0: in this process), got {self.workers}')
        if self.vocab_size is not None and self.vocab_size < 1:
            raise ValueError(f'--vocab-size must be >= 1, got {self.vocab_size}')
        if self.pad_id is not None and self.pad_id < 0:
            raise ValueError(f'--pad-id must be >= 0, got {self.pad_id}')
        if any(e < 0 for e in self.eot_ids):
            raise ValueError(f'--eot-id must be >= 0, got {min(self.eot_ids)}')


def load_model(path: str, dtype: str = 'float32', device: str = 'cpu'):
    """Load the replay scorer of ``--model``: a TinyAgent checkpoint or a Hugging Face model folder.

    Uses :func:`agentrl.engines.scorer.load_scorer` (a checkpoint's config is validated and
    bounded before anything is allocated); ``dtype`` (``'float32'`` / ``'bfloat16'``) and
    ``device``: as :class:`CheckOptions`.

    Returns:
        :class:`agentrl.checks.Scorer`.

    Raises:
        FileNotFoundError: nothing at ``path``, or a folder without ``config.json``.
        ValueError: not a TinyAgent checkpoint, or a config out of bounds (one line, naming
            ``--model``); a ``device`` torch does not know or this machine lacks (naming ``--device``).
            ImportError: a Hugging Face folder without the ``hf`` extra.
    """
    from ..engines.scorer import load_scorer
    if not os.path.exists(path):
        raise FileNotFoundError(f'--model {path!r} does not exist; pass a TinyAgent checkpoint (model.pt) or a '
                                'Hugging Face model folder')
    import torch
    try:
        torch.empty(0, device=torch.device(device))         # a device this machine has, before the model loads
    except (RuntimeError, AssertionError) as e:
        why = (str(e).strip().splitlines() or [type(e).__name__])[0][:120]
        raise ValueError(f'--device {device!r} cannot be used here ({why}); pass --device cpu, or cuda / cuda:N on '
                         'a machine with that GPU') from None
    try:
        return load_scorer(path, device=device, dtype=getattr(torch, dtype))
    except ValueError as e:
        msg = str(e)
        raise ValueError(msg if msg.startswith('--model') else f'--model {msg}') from None


def count_rows(path: str) -> int:
    """Number of rows in a trajectory file or folder, from the Parquet footers (no data read).

    Returns 0 when a footer cannot be read (the check itself then reports the file).
    """
    import pyarrow.parquet as pq

    from .. import store
    n = 0
    for f in store.data_files(path):
        try:
            n += pq.ParquetFile(f).metadata.num_rows
        except Exception:
            return 0
    return n


class CheckFailedError(ValueError):
    """Records that ``agentrl check`` refuses, met by a command that must not hand them on (``export``).

    Attributes:
        report: the :class:`CheckReport`. exit_code: 1, as ``agentrl check`` exits on a refusal.
    """
    exit_code = 1

    def __init__(self, report: CheckReport):
        self.report = report
        super().__init__(f'{report.examples[0]} ({report.refused} of {report.n} records refused; '
                         f'`agentrl check {report.path}` lists them all)')


def require_accepted(path: str, batch_size: int = 256) -> CheckReport:
    """Run the no-model check of ``agentrl check PATH`` and raise when it refuses a record.

    The same rules, in the same order, with the same defaults as ``agentrl check PATH`` without
    ``--model``: malformed or edited rows, the acceptance rules (provenance and sampler required,
    the word-level tokenizer's vocabulary, padding and end-of-turn when the records use it),
    resends stored twice and identity conflicts.

    Args:
        path: a trajectory ``.parquet`` file or a folder of shards.
        batch_size: records per read batch (>= 1).

    Returns:
        the :class:`CheckReport` (no record refused; it may hold no records).

    Raises:
        CheckFailedError: a record is refused; the message is the check's first refusal line
            (``KEY: KIND: field[pos]: what. Fix: ...``) with the count. FileNotFoundError,
            ValueError: as :func:`run_check`.
    """
    report = run_check(CheckOptions(path=str(path), batch_size=batch_size, examples=1))
    if report.refused:
        raise CheckFailedError(report)
    return report


def _expected(opts: CheckOptions, base, prov, model_vocab):
    """The expectations for one record: flags first, then the word-level tokenizer's defaults."""
    exp = base
    if prov is not None and prov.tokenizer and (base.pad_id is None or not base.eot_ids or base.vocab_size is None):
        if prov.tokenizer == BUGFIX_VOCAB.fingerprint:
            exp = replace(base, pad_id=BUGFIX_VOCAB.pad_id if base.pad_id is None else base.pad_id,
                          eot_ids=base.eot_ids or (BUGFIX_VOCAB.eot_id,),
                          vocab_size=BUGFIX_VOCAB.vocab_size if base.vocab_size is None else base.vocab_size)
    if exp.vocab_size is None and model_vocab is not None:
        exp = replace(exp, vocab_size=model_vocab)
    if exp.vocab_size is not None:          # an id the tokenizer cannot produce would pass every pad test
        for flag, ids in (('--pad-id', [] if opts.pad_id is None else [opts.pad_id]), ('--eot-id', opts.eot_ids)):
            bad = [i for i in ids if i >= exp.vocab_size]
            if bad:
                raise ValueError(f'{flag} {bad[0]} is outside the vocabulary of the records\' tokenizer '
                                 f'(ids 0..{exp.vocab_size - 1}); pass an id of that tokenizer or drop {flag}')
    return exp


def _not_replayable(e: Exception):
    from .. import checks
    if isinstance(e, (checks.NotReplayableError, checks.ConstrainedSupportError)):   # the grammar's refusal by name
        return e
    what = e.what if isinstance(e, checks.RecordError) else f'{type(e).__name__}: {" ".join(str(e).split())[:160]}'
    return checks.NotReplayableError(f'cannot be replayed under the model ({what})',
                                     field=getattr(e, 'field', 'ids'),
                                     fix='replay with the model (and tokenizer) that sampled the record')


@dataclass
class _Row:
    """One read row on its way through the check: its record, its key for messages, what refuses it, its replays."""
    record: object
    key: str
    problems: list
    replays: list = field(default_factory=list)


def _replay(rows: list, scorer, tol: float, batch_size: int = 8, packed: bool = True) -> None:
    """Replay the sampled records of ``rows`` (:class:`_Row`) in batches.

    Sets each row's ``replays`` to its :class:`agentrl.checks.RecordReplay` results (one per
    scored sequence: a record, or each turn of a record with ``turn_contexts``); a record the
    scorer cannot take gets a :class:`~agentrl.checks.NotReplayableError` in its problems instead.
    A failing batch is retried record by record, so the failure is pinned on its record.
    """
    from .. import checks
    max_len = getattr(scorer, 'max_len', None)
    todo = []
    for r in rows:
        rec = r.record
        if max_len is not None and rec.turn_contexts is None and len(rec.ids) > max_len:
            r.problems.append(checks.NotReplayableError(
                f"has {len(rec.ids)} tokens, more than the model's context of {max_len}", field='ids',
                fix='replay with the model that sampled the record'))
        else:
            todo.append(r)
    for start in range(0, len(todo), batch_size):
        chunk = todo[start:start + batch_size]
        try:
            report = checks.replay_records([r.record for r in chunk], scorer, tol=tol, batch_size=batch_size,
                                           packed=packed)
        except (ValueError, IndexError, RuntimeError, TypeError):
            report = None
        if report is not None and len(report.records) == len(chunk) and all(r.record.turn_contexts is None
                                                                            for r in chunk):
            for r, rep in zip(chunk, report.records):
                r.replays.append(rep)
            continue
        for r in chunk:                      # per record: turns of one record stay together
            try:
                r.replays.extend(checks.replay_records([r.record], scorer, tol=tol, batch_size=1,
                                                       packed=packed).records)
            except (ValueError, IndexError, RuntimeError, TypeError) as err:
                r.problems.append(_not_replayable(err))


def _repeat_problem(verdict: str, first, key: str):
    """The refusal of a record that repeats an earlier one's identity (:class:`agentrl.checks.Deduper`)."""
    from .. import checks
    if verdict == checks.Deduper.RESEND:
        return checks.DuplicateRecordError(
            f'repeats {first[0]!r} row {first[1]} (same identity and content: a resend stored twice); a '
            'reader would train on it twice', field='provenance', fix='store each record once '
            '(ShardWriter drops resends): rewrite the data without the repeated rows')
    return checks.IdentityConflictError(
        f'identity {key} is already taken by {first[0]!r} row {first[1]} with different content; a '
        'retry that samples again must not reuse an attempt number', field='provenance.attempt',
        fix='give the retry a new attempt with agentrl.checks.new_attempt(record)')


def _image_problems(rec, file, token_id, verified: dict) -> list:
    """The image gate of a record read from ``file`` (:func:`agentrl.checks.images.image_problems`; nothing to do,
    and nothing imported, for a record without images)."""
    if 'images' not in (rec.info or {}):
        return []
    from ..checks.images import image_problems
    from ..images import run_folder
    return image_problems(rec, run_folder(file), token_id, verified)


def _tally(rep: CheckReport, rec) -> None:
    """Count a record's length, trained tokens, stop, truncation, policy and tool-call statuses."""
    prov = rec.provenance
    rep.lengths.append(len(rec.ids))
    if rec.action_mask is not None:
        rep.trained.append(int(rec.action_mask.float().sum()))
        if prov is not None and prov.sampling is not None and prov.sampling.constraint is not None:
            from ..constraints import forced_rows
            rep.forced.append(int(forced_rows(rec).sum()))
    rep.stops[_stop_reason(rec)] += 1
    template = (rec.info or {}).get('template')           # a turn cut at max_tokens: unterminated_turns
    rep.truncated += is_truncated(rec) or (isinstance(template, dict) and bool(template.get('unterminated_turns')))
    rep.policies[prov.policy if prov is not None else '(none)'] += 1
    if prov is not None and prov.logp_placeholder:
        if _ours(prov):
            rep.scripted += 1
        else:
            rep.no_logp += 1
    from ..checks.consistency import unchecked_notes
    rep.unchecked.update(unchecked_notes(rec))
    from ..checks.calls import call_counts, stored_calls
    if stored_calls(rec) is not None:
        rep.call_records += 1
        rep.calls.update(call_counts(rec))


def _ours(prov) -> bool:
    """Whether a record comes from one of agentrl's BugFix policies (scripted or TinyAgent), not an import."""
    return prov.policy in POLICIES


def _stop_reason(rec) -> str:
    """The stop reason to count: ``info['stop']`` (the gym's words: submitted, budget, truncated), except for
    an imported record, which keeps its source's words: the server's ``finish_reason`` (``stop``,
    ``length``, ``tool_calls``) or the trainer's stop field; ``'(not recorded)'`` when it has none."""
    info = rec.info or {}
    source = source_stop_reason(info)
    if source is not None:
        return source
    stop = info.get('stop')
    if rec.provenance is not None and not _ours(rec.provenance) and stop is None:
        return '(not recorded)'
    return str(stop)


def _model_tokenizer(path: str) -> str | None:
    """The tokenizer fingerprint of a Hugging Face ``--model`` folder (None for a TinyAgent checkpoint, which
    does not name its tokenizer, or a folder whose tokenizer cannot be loaded)."""
    if not os.path.isdir(path):
        return None
    try:
        from ..templates import load_tokenizer
        from ..templates.chat import tokenizer_fingerprint
        return tokenizer_fingerprint(load_tokenizer(path))
    except (ImportError, ValueError, AttributeError):
        return None


def _other_tokenizer(prov, model_tok: str, name: str) -> list:
    """A refusal of a sampled record whose tokenizer is not the replay model's (no ratio would mean anything)."""
    from ..checks import TokenizerMismatchError
    if not prov.tokenizer or prov.tokenizer == model_tok:
        return []
    return [TokenizerMismatchError(
        f"is {prov.tokenizer!r} but the tokenizer of --model {name} is {model_tok!r}: the model reads these ids as "
        'other words, so no replay ratio is computed', field='provenance.tokenizer',
        fix='replay with the model (and tokenizer) that sampled the records')]


def _versions(rep: CheckReport, rec, opts: CheckOptions, key) -> list:
    """Count the record's policy versions and staleness; return a refusal when it is older than ``--max-staleness``."""
    from ..checks.staleness import StaleVersionError, record_staleness, record_versions
    versions = record_versions(rec)
    rep.versions[('..'.join(str(v) for v in (versions[0], versions[-1])) if len(versions) > 1 else str(versions[0]))
                 if versions else '(none)'] += 1
    rep.spanning += len(versions) > 1
    if opts.current_version is None or not versions:
        return []
    try:
        steps = record_staleness(rec, opts.current_version)
    except StaleVersionError:
        rep.staleness['not a step'] += 1
        return []
    rep.staleness[steps] += 1
    if opts.max_staleness is not None and steps > opts.max_staleness:
        return [StaleVersionError(f'was sampled {steps} steps before --current-version {opts.current_version} '
                                  f'(> --max-staleness {opts.max_staleness})', field='provenance.policy_version',
                                  fix='resample it with the current weights, or raise --max-staleness')]
    return []


def run_check(opts: CheckOptions, progress: Callable[[int], None] | None = None) -> CheckReport:
    """Check every row of ``opts.path``; return the :class:`CheckReport`.

    Args:
        opts: :class:`CheckOptions` (validated first).
        progress: called with the number of rows read so far after each batch (for a display).

    Returns:
        :class:`CheckReport`; ``report.code`` is the exit code (0 ok, 1 refused).

    Raises:
        ValueError: an option out of range, a ``--model`` that is not a TinyAgent checkpoint or
            model folder, or a file that is not a trajectory file. FileNotFoundError: nothing at
            ``opts.path`` or ``opts.model``.
    """
    from .. import checks, store
    from ..checks.mismatch import context_drift
    opts.validate()
    if opts.workers:                        # the shards on Ray workers, the same report
        from .check_workers import check_on_workers
        return check_on_workers(opts, run_check, progress)
    scorer = load_model(opts.model, opts.dtype, opts.device) if opts.model else None
    if scorer is not None and hasattr(scorer, 'image_data'):     # a vision model: the run's images feed its replay
        from ..images import ImageFolder, images_folder
        if images_folder(opts.path).is_dir():
            scorer.image_data = ImageFolder(opts.path)
    model_tok = _model_tokenizer(opts.model) if opts.model else None
    base = checks.Expected(tokenizer=opts.expect_tokenizer, template=opts.expect_template, pad_id=opts.pad_id,
                           eot_ids=tuple(opts.eot_ids), vocab_size=opts.vocab_size)
    rep = CheckReport(path=opts.path, model=opts.model, max_ratio_dev=opts.max_ratio_dev, examples_max=opts.examples,
                      correction=opts.correction, dtype=opts.dtype, tol=opts.tol)
    seen = checks.Deduper(compact=True)     # identity (or digest) -> (file, row) where first seen
    from ..checks.consistency import OneTokenizerPerFile
    one_tokenizer = OneTokenizerPerFile()
    verified_images: dict = {}              # (run, digest) -> finding: each stored image hashed once
    from .check_columnar import columnar_enabled, rows_to_check   # model-free: clean rows counted by columns
    source = (rows_to_check(opts, rep, seen, lambda prov: _expected(opts, base, prov, None), one_tokenizer)
              if columnar_enabled(opts) else store.scan(opts.path, opts.batch_size))
    for batch in source:
        rows = []
        for row in batch:
            rep.n += 1
            rec = row.record
            if rec is None:
                rep.refuse(row.source, [row.problem])
                continue
            key = checks.record_key(rec) if rec.provenance is not None else row.source
            problems = checks.find_problems(rec, _expected(opts, base, rec.provenance,
                                                           getattr(scorer, 'vocab_size', None)))
            if model_tok and rec.provenance is not None and not rec.provenance.logp_placeholder:
                problems += _other_tokenizer(rec.provenance, model_tok, scorer.name)   # said before any ratio
            verdict, first = seen.see(rec, where=(row.file, row.row), digest=row.digest)   # hashed once, at verify
            if verdict != checks.Deduper.NEW:
                problems.append(_repeat_problem(verdict, first, key))
            problems += one_tokenizer.see(rec, row.file, row.row, problems)
            problems += _image_problems(rec, row.file, opts.image_token_id, verified_images)
            _tally(rep, rec)
            problems += _versions(rep, rec, opts, key)
            drift = context_drift(rec)
            if drift:
                rep.drift.append((key, drift))
            rows.append(_Row(rec, key, problems))
        if scorer is not None:
            sampled = []
            for r in rows:
                if not r.problems:
                    if r.record.provenance.logp_placeholder:
                        rep.replay_skipped['scripted (placeholder log-probs)' if _ours(r.record.provenance)
                                           else 'no sampling log-probs (their source stored none)'] += 1
                    else:
                        sampled.append(r)
            _replay(sampled, scorer, opts.tol, packed=not opts.no_packed)
        for r in rows:
            rep.replays.extend(r.replays)
            if r.problems:
                rep.refuse(r.key, r.problems)
        if progress is not None:
            progress(rep.n)
    return rep
