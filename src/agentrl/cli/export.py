"""``agentrl export RUN --to FRAMEWORK --out PATH``: records as the batch a trainer loads (verl, TRL, slime,
OpenRLHF, SkyRL, prime-rl, SFT), plus ``PATH/manifest.json``. The work is :func:`agentrl.interop.export`.

Before anything is written, the records pass the rules ``agentrl check RUN`` runs without a model
(:func:`agentrl.jobs.check.require_accepted`): a record the check refuses stops the export with the
check's first refusal line and its exit code 1, and ``PATH`` is not created. The exporter's own
refusals (placeholder log-probs for RL, support, groups) follow.
"""
from __future__ import annotations

import os
from dataclasses import dataclass

from ..fields import option

from .options import UserError, add_fields, check_numbers, from_args

FRAMEWORKS = ('verl', 'trl', 'slime', 'openrlhf', 'skyrl', 'prime-rl', 'sft', 'skyrl-sft')


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
        mask_forced: zero the action mask at grammar-forced tokens (:func:`agentrl.constraints.mask_forced`).
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
    mask_forced: bool = option(False, 'leave the tokens a declared grammar forced (support of one token, no policy '
                                      'gradient) out of the loss mask (docs/grammar.md)')

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


def _check_pad_id(pad_id: int, records) -> None:
    """Refuse a ``--pad-id`` outside the vocabulary of the records' tokenizer (when it is agentrl's word-level one).

    Raises:
        UserError: ``--pad-id N is outside the vocabulary ...`` (nothing written yet).
    """
    from ..jobs.check import _wordlevel_defaults
    wordlevel = _wordlevel_defaults()
    if wordlevel is None or not any(r.provenance is not None and r.provenance.tokenizer == wordlevel[0]
                                    for r in records):
        return
    if pad_id >= wordlevel[3]:
        raise UserError(f"--pad-id {pad_id} is outside the vocabulary of the records' tokenizer (ids "
                        f'0..{wordlevel[3] - 1}); pass its pad id ({wordlevel[1]}) or drop --pad-id')


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
    from ..jobs.check import require_accepted
    require_accepted(opts.source())             # what `agentrl check` refuses is never exported; nothing written yet
    records = store.read_trajectories(opts.source())
    if opts.mask_forced:
        from ..constraints import mask_forced
        records = [mask_forced(r) for r in records]
    _check_pad_id(opts.pad_id, records)
    m = interop.export(records, opts.to, opts.out, pad_id=opts.pad_id, trim=False if opts.no_trim else None,
                       allow_support_mismatch=opts.allow_support_mismatch, sort_groups=opts.sort_groups,
                       prompt_length=opts.prompt_length, response_length=opts.response_length,
                       split_turns=opts.split_turns)
    print(f"wrote {m['records']} records for {opts.to} to {opts.out}: {', '.join(m['files'])}, manifest.json")
    return 0
