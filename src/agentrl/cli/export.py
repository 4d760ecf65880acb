"""``agentrl export RUN --to FRAMEWORK --out PATH``: records as the batch a trainer loads (verl, TRL, slime,
OpenRLHF, SkyRL, prime-rl, SFT), plus ``PATH/manifest.json``. The work is :func:`agentrl.interop.export`.

Before anything is written, the records pass the rules ``agentrl check RUN`` runs without a model
(:func:`agentrl.jobs.check.require_accepted`): a record the check refuses stops the export with the
check's first refusal line and its exit code 1, and ``PATH`` is not created. The exporter's own
refusals (placeholder log-probs for RL, support, groups) follow.

A rollout run that is not finished (fewer episodes stored than ``run.json`` plans, no ``summary.json``,
or a job still holding ``RUN/.lock``) is exported with what it holds, exit 0, and says so: a warning on
stderr and ``"incomplete": "incomplete: K of N episodes stored ...; resume with ..."`` in
``PATH/manifest.json`` (the key is absent for a complete run or an input without a plan).
"""
from __future__ import annotations

import os
from dataclasses import dataclass

from ..fields import option

from ..io import atomic_write
from ..jobs.check import require_accepted
from ..jobs.report import incompleteness
from ..tokenizer import BUGFIX_VOCAB
from .options import UserError, add_fields, check_numbers, from_args

FRAMEWORKS = ('verl', 'trl', 'slime', 'openrlhf', 'skyrl', 'prime-rl', 'sft', 'skyrl-sft')
#: :data:`agentrl.train.CORRECTION_MODES` (written out: the CLI starts without torch)
CORRECTION_MODES = ('token_tis', 'seq_tis', 'token_mask', 'icepop', 'geo_mask', 'seq_mask_tis')


@dataclass
class ExportOptions:
    """Options of ``agentrl export`` (one field per flag; help and range in the metadata).

    Attributes:
        run: a run folder (``RUN/trajectories.parquet`` or ``RUN/trajectories/``), a ``.parquet`` file or a shard folder.
        to: the framework (:data:`FRAMEWORKS`).
        out: output folder.
        pad_id: the tokenizer's pad id (verl, TRL, OpenRLHF pad with it).
        no_trim: keep each record's trailing observation (default: the framework's rule; verl, TRL and
            SkyRL drop it so the reward and the last token land on a policy token).
        allow_support_mismatch: export top-k/top-p log-probs with a warning instead of refusing.
        sort_groups: reorder records so each group's rows are contiguous.
        split_turns: one row per turn for records with per-turn contexts (not verl, TRL).
        prompt_length, response_length: verl's fixed widths (None: the longest).
        model: the trainer's model (TinyAgent ``model.pt`` or Hugging Face folder), with ``correction``.
        correction: write this off-policy correction's weights and rejection mask into the trainer's own
            fields (:mod:`agentrl.interop.correction`); needs ``model``.
        rollout_is_threshold, is_correction_threshold: the correction's thresholds (verl's C; OpenRLHF's
            ``LOW,HIGH`` band). device: where ``model`` runs. no_packed: score right-padded batches.
        mask_forced: zero the action mask at grammar-forced tokens (:func:`agentrl.constraints.mask_forced`).
        mask_malformed_calls: zero the action mask over every stored tool call whose status is not ``ok``
            (:func:`agentrl.checks.calls.mask_malformed_calls`); the records on disk are unchanged.
    """
    run: str = option(None, 'run folder, trajectories .parquet file or shard folder', positional=True, metavar='RUN')
    to: str = option(None, 'target framework (required)', choices=FRAMEWORKS)
    out: str = option(None, 'output folder (required)', metavar='PATH')
    pad_id: int = option(0, "the tokenizer's pad id", min=0, max=2 ** 31 - 1)
    no_trim: bool = option(False, 'keep every token after the last policy token (exact round trip); default: the '
                                "framework's rule (verl, TRL, SkyRL drop the trailing observation)")
    allow_support_mismatch: bool = option(False, 'export top-k/top-p log-probs to a full-vocabulary trainer with a '
                                               'warning naming the expected step-0 ratio (default: refuse)')
    sort_groups: bool = option(False, "make each group's rows contiguous (stable order)")
    split_turns: bool = option(False, 'one row per turn for records whose template rewrites history (slime, SkyRL, '
                                    'prime-rl, OpenRLHF, SFT)')
    prompt_length: int | None = option(None, 'verl rollout.prompt_length (default: the longest prompt)', min=1)
    response_length: int | None = option(None, 'verl rollout.response_length (default: the longest response)', min=1)
    model: str | None = option(None, "with --correction: the trainer's model (TinyAgent model.pt or Hugging Face "
                                     'folder) whose log-probs the weights compare with the stored ones', metavar='M')
    correction: str | None = option(None, "write this off-policy correction's weights and rejection mask into the "
                                          "trainer's own batch fields (docs/interop.md#off-policy-correction)",
                                    choices=CORRECTION_MODES, metavar='MODE')
    rollout_is_threshold: float = option(2.0, 'token_tis / seq_tis: truncate weights at C (verl rollout_is_threshold)',
                                         gt=0)
    is_correction_threshold: list | None = option(None, 'token_mask / icepop / geo_mask / seq_mask_tis: keep ratios '
                                                        'in LOW,HIGH (OpenRLHF is_correction_threshold; default '
                                                        '0.5,5.0)', parse='list', metavar='LOW,HIGH')
    device: str = option('cpu', 'where --model runs (cpu, cuda ...)', metavar='DEV')
    no_packed: bool = option(False, 'score the --model right-padded instead of packed (same numbers)')
    mask_forced: bool = option(False, 'leave the tokens a declared grammar forced (support of one token, no policy '
                                      'gradient) out of the loss mask (docs/grammar.md)')
    mask_malformed_calls: bool = option(False, "leave every tool call whose stored status is not ok (invalid_json, "
                                               'unclosed_block, missing_name, unknown_tool, in_reasoning) out of the '
                                               'loss mask; manifest.json counts them (docs/design.md#families)')

    def source(self) -> str:
        """The trajectory file or shard folder inside ``run``."""
        for cand in (os.path.join(self.run, 'trajectories.parquet'), os.path.join(self.run, 'trajectories')):
            if os.path.exists(cand):
                return cand
        return self.run

    def validate(self) -> None:
        """Raise :class:`~agentrl.cli.options.UserError` naming the bad flag and the fix."""
        if self.to is None or self.out is None:
            raise UserError('--to FRAMEWORK and --out PATH are required, e.g. `agentrl export RUN --to verl --out '
                            'RUN/verl`')
        check_numbers(self)
        if not os.path.exists(self.run):
            raise UserError(f'RUN {self.run!r} does not exist; pass a run folder or a trajectories .parquet file')
        if os.path.isfile(self.out):
            raise UserError(f'--out {self.out!r} is a file; pass a folder')
        if self.correction is not None and self.model is None:
            raise UserError('--correction needs --model: the weights compare the trainer\'s log-probs (recomputed by '
                            'the model) with the stored ones; pass --model model.pt or a Hugging Face folder')
        if self.model is not None and self.correction is None:
            raise UserError(f'--model is only read with --correction; pass --correction MODE ({", ".join(CORRECTION_MODES)}) '
                            'or drop --model')
        if self.correction is not None and self.to in ('sft', 'skyrl-sft'):
            raise UserError(f'--correction: {self.to} exports carry no sampling log-probs, so there is nothing to '
                            'correct; export to an RL trainer')
        if self.model is not None and not os.path.exists(self.model):
            raise UserError(f'--model {self.model!r} does not exist; pass a TinyAgent model.pt or a Hugging Face folder')
        self.thresholds()

    def thresholds(self) -> tuple:
        """``--is-correction-threshold`` as ``(low, high)`` floats (default (0.5, 5.0)).

        Raises:
            UserError: not two numbers with 0 < LOW <= HIGH.
        """
        if self.is_correction_threshold is None:
            return (0.5, 5.0)
        try:
            low, high = (float(x) for x in self.is_correction_threshold)
        except ValueError:
            low = high = float('nan')
        if not 0 < low <= high < float('inf'):
            raise UserError(f'--is-correction-threshold must be LOW,HIGH with 0 < LOW <= HIGH, got '
                            f'{",".join(self.is_correction_threshold)}')
        return (low, high)


def _refuse_placeholders(opts: ExportOptions, records) -> None:
    """Refuse the first record with placeholder (scripted) log-probs for an RL target, naming its file and row.

    ``records`` are the rows of ``opts.source()`` in file order (as :func:`agentrl.store.read_trajectories`
    returns them), so the position of a record locates it.

    Raises:
        agentrl.checks.errors.ScriptedRecordError: ``'FILE' row N: sample_logp: ... Fix: ... --to sft ...``.
    """
    i = next((i for i, r in enumerate(records) if r.provenance is not None and r.provenance.logp_placeholder), None)
    if i is None:
        return
    import pyarrow.parquet as pq

    from .. import store
    from ..checks.errors import ScriptedRecordError
    where = f'record {i}'
    for f in store.data_files(opts.source()):
        n = pq.ParquetFile(f).metadata.num_rows
        if i < n:
            where = f'{f!r} row {i}'
            break
        i -= n
    raise ScriptedRecordError(
        f'the record carries placeholder log-probs (scripted policy); --to {opts.to} would hand them to the '
        'trainer as the behaviour policy', field='sample_logp',
        fix='export scripted records with `--to sft`, or pass a run sampled by a model '
            '(agentrl rollout --policy model)').at(where)


def _mask_malformed_calls(records) -> tuple:
    """``(records with non-ok calls out of the loss, manifest entry)``: the entry counts the records, the
    calls and the action tokens masked (:func:`agentrl.checks.calls.mask_malformed_calls`)."""
    from ..checks.calls import call_counts, mask_malformed_calls
    from ..families.base import OK
    out, rows, calls, tokens = [], 0, 0, 0
    for r in records:
        m, n = mask_malformed_calls(r)
        bad = sum(v for k, v in call_counts(r).items() if k != OK)
        rows += bad > 0
        calls += bad
        tokens += n
        out.append(m)
    return out, {'records': rows, 'calls': calls, 'action_tokens': tokens}


def _check_pad_id(pad_id: int, records) -> None:
    """Refuse a ``--pad-id`` outside the vocabulary of the records' tokenizer (when it is agentrl's word-level one).

    Raises:
        UserError: ``--pad-id N is outside the vocabulary ...`` (nothing written yet).
    """
    if not any(r.provenance is not None and r.provenance.tokenizer == BUGFIX_VOCAB.fingerprint for r in records):
        return
    if pad_id >= BUGFIX_VOCAB.vocab_size:
        raise UserError(f"--pad-id {pad_id} is outside the vocabulary of the records' tokenizer (ids "
                        f'0..{BUGFIX_VOCAB.vocab_size - 1}); pass its pad id ({BUGFIX_VOCAB.pad_id}) or drop --pad-id')


def register(sub) -> None:
    """Add this subcommand's parser (every flag documented) to ``sub`` and set ``func=run``."""
    p = sub.add_parser('export', help='write records as the batch verl/TRL/slime/OpenRLHF/SkyRL/prime-rl loads',
                       description='Export a run\'s records in the exact layout a trainer consumes (masks and '
                                   'log-probs moved to its alignment), with PATH/manifest.json. Refuses records '
                                   'that would train silently wrong (shifted masks, split groups, truncated-support '
                                   'log-probs, per-turn contexts) and every record `agentrl check` refuses.')
    add_fields(p, ExportOptions)
    p.set_defaults(func=run)


def run(args) -> int:
    """Run the subcommand for parsed ``args``; return the exit code (errors raise, one line)."""
    opts = from_args(ExportOptions, args)
    opts.validate()
    from .. import interop, store
    from ..gateway.records import train_shared_once
    from ..images import run_folder
    require_accepted(opts.source())             # what `agentrl check` refuses is never exported; nothing written yet
    records = train_shared_once(store.read_trajectories(opts.source()))   # gateway forks: each sampled token once
    if opts.mask_forced:
        from ..constraints import mask_forced
        records = [mask_forced(r) for r in records]
    masked_calls = None
    if opts.mask_malformed_calls:
        records, masked_calls = _mask_malformed_calls(records)
    if opts.to not in ('sft', 'skyrl-sft'):
        _refuse_placeholders(opts, records)
    _check_pad_id(opts.pad_id, records)
    corr = None
    if opts.correction is not None:
        from ..interop.correction import load_correction
        from ..jobs.rollout import model_fingerprint
        try:
            corr = load_correction(opts.model, opts.correction, rollout_is_threshold=opts.rollout_is_threshold,
                                   is_correction_threshold=opts.thresholds(), device=opts.device,
                                   model_fingerprint=model_fingerprint(opts.model), packed=not opts.no_packed)
        except (FileNotFoundError, ValueError) as e:
            msg = str(e)
            raise UserError(msg if msg.startswith('--model') else f'--model {opts.model!r}: {msg}') from None
    m = interop.export(records, opts.to, opts.out, pad_id=opts.pad_id, trim=False if opts.no_trim else None,
                       allow_support_mismatch=opts.allow_support_mismatch, sort_groups=opts.sort_groups,
                       prompt_length=opts.prompt_length, response_length=opts.response_length,
                       split_turns=opts.split_turns, correction=corr, images=run_folder(opts.source()))
    if masked_calls is not None:
        _add_to_manifest(opts.out, mask_malformed_calls=masked_calls)
    note = incomplete_note(opts.run, records)
    if note:                                    # the manifest and stderr say so; the export itself stands
        _add_to_manifest(opts.out, incomplete=note)
        import warnings
        warnings.warn(f'{opts.run!r} is {note}; the export holds only those records (manifest.json says '
                      '"incomplete")')
    print(f"wrote {m['records']} records for {opts.to} to {opts.out}: {', '.join(m['files'])}, manifest.json")
    if masked_calls is not None:
        print(f"  --mask-malformed-calls: {masked_calls['action_tokens']} action tokens of {masked_calls['calls']} "
              f"calls not ok, in {masked_calls['records']} records, left out of the loss")
    c = m.get('correction')
    if c:
        w = c['weights']
        print(f"  {c['mode']} weights in {c['fields']['weights']} (rejections in {c['fields']['mask']}): mean "
              f"{w['mean']:.4f}  min {w['min']:.4f}  max {w['max']:.4f}; {c['masked_tokens']} of "
              f"{c['action_tokens']} action tokens masked in {c['masked_records']} records")
    return 0


def incomplete_note(run: str, records) -> str:
    """What says the rollout run behind ``run`` is unfinished (:func:`agentrl.jobs.report.incompleteness`), or ''.

    ``run`` is a run folder, its ``trajectories/`` folder or one of its shards; any other input
    (a plain ``.parquet`` file, an import) has no plan to compare with and gives ''. ``records`` None:
    the episodes are counted from the run's files (``agentrl check``). A run whose
    ``OUT/.lock`` is still there may be being written (or its job was killed). A gateway run
    (``run.json`` kind ``gateway``) is incomplete while it has no ``summary.json``.
    """
    from pathlib import Path

    folder = Path(run).resolve()
    if folder.is_file():                                    # a shard or RUN/trajectories.parquet: its folder
        folder = folder.parent
    if folder.name == 'trajectories' and not (folder / 'run.json').is_file():
        folder = folder.parent
    if not (folder / 'run.json').is_file():
        return ''
    done = (folder / 'summary.json').is_file()
    if _run_kind(folder) == 'gateway':                      # agentrl serve: summary.json is written at shutdown
        note = '' if done else ('incomplete: no summary.json (the gateway is still serving, or was killed: '
                                f'`agentrl serve --out {folder}` resumes its open sessions)')
    else:
        note = incompleteness(str(folder), records, done)
    if note and (folder / '.lock').exists():
        note = note.replace('; resume with', ', OUT/.lock held (a job may still be writing it); resume with', 1)
    return note


def _run_kind(folder) -> str | None:
    """``run.json``'s ``kind`` (``'gateway'`` for ``agentrl serve``; None for a rollout run or unreadable JSON)."""
    import json
    try:
        with open(folder / 'run.json') as f:
            kind = json.load(f).get('kind')
    except (OSError, ValueError, AttributeError):
        return None
    return kind if isinstance(kind, str) else None


def _add_to_manifest(out: str, **fields) -> None:
    """Add ``fields`` to ``out/manifest.json`` (rewritten atomically, still the last file written)."""
    import json

    path = os.path.join(out, 'manifest.json')
    with open(path) as f:
        manifest = json.load(f)
    manifest.update(fields)
    atomic_write(path, json.dumps(manifest, indent=2, sort_keys=True) + '\n')
