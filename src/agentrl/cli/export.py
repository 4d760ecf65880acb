"""``agentrl export RUN --to FRAMEWORK --out PATH``: records as the batch a trainer loads (verl, TRL, slime,
OpenRLHF, SkyRL, prime-rl, SFT), plus ``PATH/manifest.json``. The work is :func:`agentrl.interop.export`."""
from __future__ import annotations

import os
from dataclasses import dataclass

FRAMEWORKS = ('verl', 'trl', 'slime', 'openrlhf', 'skyrl', 'prime-rl', 'sft', 'skyrl-sft')


@dataclass
class ExportOptions:
    """Options of ``agentrl export`` (one field per flag).

    Attributes:
        run: a run folder (``RUN/trajectories.parquet`` or ``RUN/trajectories/``), a ``.parquet`` file or a shard folder.
        to: the framework (:data:`FRAMEWORKS`).
        out: output folder.
        pad_id: the tokenizer's pad id (verl, TRL, OpenRLHF pad with it).
        trim: drop each record's trailing observation (None: the framework's default).
        allow_support_mismatch: export top-k/top-p log-probs with a warning instead of refusing.
        sort_groups: reorder records so each group's rows are contiguous.
        prompt_length, response_length: verl's fixed widths (None: the longest).
        split_turns: one row per turn for records with per-turn contexts (not verl, TRL).
    """
    run: str
    to: str
    out: str
    pad_id: int = 0
    trim: bool | None = None
    allow_support_mismatch: bool = False
    sort_groups: bool = False
    prompt_length: int | None = None
    response_length: int | None = None
    split_turns: bool = False

    def source(self) -> str:
        """The trajectory file or shard folder inside ``run``."""
        for cand in (os.path.join(self.run, 'trajectories.parquet'), os.path.join(self.run, 'trajectories')):
            if os.path.exists(cand):
                return cand
        return self.run

    def validate(self) -> None:
        """Raise :class:`~agentrl.cli.main.UserError` naming the bad flag and the fix."""
        from .main import UserError
        if not os.path.exists(self.run):
            raise UserError(f'RUN {self.run!r} does not exist; pass a run folder or a trajectories .parquet file')
        if self.to not in FRAMEWORKS:
            raise UserError(f'--to {self.to!r}; use one of {", ".join(FRAMEWORKS)}')
        for flag, v in (('--prompt-length', self.prompt_length), ('--response-length', self.response_length)):
            if v is not None and v < 1:
                raise UserError(f'{flag} must be >= 1, got {v}')


def register(sub) -> None:
    """Add this subcommand's parser (every flag documented) to ``sub`` and set ``func=run``."""
    p = sub.add_parser('export', help='write records as the batch verl/TRL/slime/OpenRLHF/SkyRL/prime-rl loads',
                       description='Export a run\'s records in the exact layout a trainer consumes (masks and '
                                   'log-probs moved to its alignment), with OUT/manifest.json. Refuses records '
                                   'that would train silently wrong (shifted masks, split groups, truncated-support '
                                   'log-probs).')
    p.add_argument('run', metavar='RUN', help='run folder, trajectories .parquet file or shard folder')
    p.add_argument('--to', required=True, choices=FRAMEWORKS, help='target framework')
    p.add_argument('--out', '-o', required=True, help='output folder')
    p.add_argument('--pad-id', type=int, default=0, help='the tokenizer\'s pad id (default: 0)')
    p.add_argument('--trim', dest='trim', action='store_true', default=None,
                   help='drop the trailing observation after the last policy token (default for verl, TRL, SkyRL)')
    p.add_argument('--no-trim', dest='trim', action='store_false', help='keep every token (exact round trip)')
    p.add_argument('--allow-support-mismatch', action='store_true',
                   help='export top-k/top-p log-probs to a full-vocabulary trainer with a warning (default: refuse)')
    p.add_argument('--sort-groups', action='store_true', help='make each group\'s rows contiguous (stable)')
    p.add_argument('--prompt-length', type=int, default=None, help='verl rollout.prompt_length (default: longest)')
    p.add_argument('--split-turns', action='store_true',
                   help='one row per turn for records whose template rewrites history (slime, SkyRL, prime-rl, '
                        'OpenRLHF, SFT)')
    p.add_argument('--response-length', type=int, default=None, help='verl rollout.response_length (default: longest)')
    p.set_defaults(func=run)


def run(args) -> int:
    """Run the subcommand for parsed ``args``; return the exit code (errors raise, one line)."""
    opts = ExportOptions(run=args.run, to=args.to, out=args.out, pad_id=args.pad_id, trim=args.trim,
                         allow_support_mismatch=args.allow_support_mismatch, sort_groups=args.sort_groups,
                         prompt_length=args.prompt_length, response_length=args.response_length,
                         split_turns=args.split_turns)
    opts.validate()
    from .. import interop, store
    records = store.read_trajectories(opts.source())
    m = interop.export(records, opts.to, opts.out, pad_id=opts.pad_id, trim=opts.trim,
                       allow_support_mismatch=opts.allow_support_mismatch, sort_groups=opts.sort_groups,
                       prompt_length=opts.prompt_length, response_length=opts.response_length,
                       split_turns=opts.split_turns)
    print(f"wrote {m['records']} records for {opts.to} to {opts.out}: {', '.join(m['files'])}, manifest.json")
    return 0
