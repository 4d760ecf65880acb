"""``agentrl check``: validate every record of a trajectory file or dataset folder.

Prints the record count, refusals by kind (with the first few messages), truncation rate,
length statistics and, when a model checkpoint is given, replay ratio statistics under each
record's declared sampler. Exits 1 when any record is refused, or when a replay shows that a
record's declared sampler is not the one it was drawn from (log-prob-mode or support mismatch).
Any replay ratio further than ``--max-ratio-dev`` (default 1e-3) from 1 also fails the check:
replaying with the model that sampled the records is the step-0 check, where every ratio is 1
(pass ``--max-ratio-dev inf`` to only report the ratios of another model). An empty file or
folder fails too (nothing was checked).

Source: issue 4 (record integrity), item 7.
"""
from __future__ import annotations

import os
from collections import Counter
from dataclasses import dataclass, field, replace
from functools import lru_cache

#: replay kinds that mean the record's declared sampler is wrong (a defect of the record)
_SAMPLER_DEFECTS = ('logp_mode_mismatch', 'support_mismatch', 'sampler_mismatch')


@dataclass
class CheckOptions:
    """Options of ``agentrl check`` (one field per flag).

    Attributes:
        path: a trajectory ``.parquet`` file or a folder of shards.
        model: TinyAgent checkpoint to replay sampled records with (None: no replay).
        expect_tokenizer: refuse records whose tokenizer fingerprint differs (None: any).
        expect_template: refuse records whose template fingerprint differs (None: any).
        pad_id: padding id (None: agentrl's word-level tokenizer's when the records use it).
        eot_ids: end-of-turn ids (empty: the word-level ``</call>`` when the records use it).
        tol: replay agreement tolerance in nats.
        max_ratio_dev: fail when any replay ratio is further than this from 1 (default 1e-3;
            ``inf``: report only, e.g. when replaying with another checkpoint).
        examples: how many refusal messages to print.
        batch_size: records read per batch (streaming).
    """
    path: str = ''
    model: str | None = None
    expect_tokenizer: str | None = None
    expect_template: str | None = None
    pad_id: int | None = None
    eot_ids: list = field(default_factory=list)
    tol: float = 1e-4
    max_ratio_dev: float | None = 1e-3
    examples: int = 5
    batch_size: int = 256


def register(sub) -> None:
    """Add this subcommand's parser (every flag documented) to ``sub`` and set ``func=run``."""
    d = CheckOptions()
    p = sub.add_parser('check', help='validate trajectory records (masks, log-probs, provenance, replay)',
                       description='Validate every record of a trajectory file or folder; print refusals by '
                                   'kind, truncation rate, length stats and (with --model) replay ratio stats. '
                                   'Exit 1 if any record is refused.')
    p.add_argument('path', help='trajectory .parquet file or folder of shards')
    p.add_argument('--model', default=None, metavar='CKPT',
                   help='TinyAgent checkpoint (model.pt) to replay sampled records under their declared sampler')
    p.add_argument('--expect-tokenizer', default=None, metavar='FP', help='expected tokenizer fingerprint')
    p.add_argument('--expect-template', default=None, metavar='FP', help='expected template fingerprint')
    p.add_argument('--pad-id', type=int, default=None, help='padding id (default: from the word-level tokenizer)')
    p.add_argument('--eot-id', type=int, action='append', default=[], dest='eot_ids',
                   help='end-of-turn id, repeatable (default: the word-level </call>)')
    p.add_argument('--tol', type=float, default=d.tol, help='replay agreement tolerance, nats (default: 1e-4)')
    p.add_argument('--max-ratio-dev', type=float, default=d.max_ratio_dev,
                   help='fail if any replay ratio differs from 1 by more than this (default: 1e-3, the step-0 '
                        'check; inf: only report, e.g. when replaying with another checkpoint)')
    p.add_argument('--examples', type=int, default=d.examples, help='refusal messages to print (default: 5)')
    p.add_argument('--batch-size', type=int, default=d.batch_size, help='records per read batch (default: 256)')
    p.set_defaults(func=run)


def options_from_args(args) -> CheckOptions:
    """Build the options dataclass from the parsed ``args``."""
    return CheckOptions(path=args.path, model=args.model, expect_tokenizer=args.expect_tokenizer,
                        expect_template=args.expect_template, pad_id=args.pad_id, eot_ids=list(args.eot_ids),
                        tol=args.tol, max_ratio_dev=args.max_ratio_dev, examples=args.examples,
                        batch_size=args.batch_size)


def load_model(path: str):
    """Load a TinyAgent checkpoint for replay (:func:`agentrl.model.load_checkpoint`).

    Accepts :func:`agentrl.model.save_checkpoint` files (``{'config', 'state_dict'}``) and plain
    ``{'state_dict', 'vocab_size', 'max_len'}`` dicts.

    Raises:
        UserError: no file at ``path``, or not a TinyAgent checkpoint (fix: pass model.pt).
    """
    from .. import model as model_mod
    from .main import UserError
    if not os.path.exists(path):
        raise UserError(f'--model {path!r} does not exist; pass a TinyAgent checkpoint (model.pt)')
    try:
        return model_mod.load_checkpoint(path)
    except ValueError as e:
        raise UserError(f'--model {e}') from None


@lru_cache(maxsize=1)
def _wordlevel_defaults():
    """(fingerprint, pad_id, eot_id) of agentrl's word-level tokenizer, or None if unavailable."""
    try:
        from .. import gym, tokenizer
        tok = tokenizer.build_tokenizer(gym.make_tasks('all'))
    except Exception:  # the gym is optional for checking foreign records
        return None
    return tok.fingerprint(), tok.pad_id, tok.call_end_id


def _stats(values) -> str:
    if not values:
        return 'n/a'
    return f'min {min(values)}  mean {sum(values) / len(values):.1f}  max {max(values)}'


def check(opts: CheckOptions, out=print) -> int:
    """Run the check and print the report through ``out``; return the exit code (0 ok, 1 refused)."""
    from .. import checks, store
    if opts.batch_size < 1:
        raise ValueError(f'--batch-size must be >= 1, got {opts.batch_size}')
    net = load_model(opts.model) if opts.model else None
    base = checks.Expected(tokenizer=opts.expect_tokenizer, template=opts.expect_template, pad_id=opts.pad_id,
                           eot_ids=tuple(opts.eot_ids))
    n = refused = truncated = scripted = 0
    kinds: Counter = Counter()
    examples: list[str] = []
    lengths, trained, policies, stops = [], [], Counter(), Counter()
    replays, replay_skipped, replay_examples = [], Counter(), []
    for batch in store.iter_batches(opts.path, opts.batch_size):
        for rec in batch:
            n += 1
            prov = rec.provenance
            exp = base
            if prov is not None and prov.tokenizer and (base.pad_id is None or not base.eot_ids):
                wordlevel = _wordlevel_defaults()   # cached
                if wordlevel is not None and prov.tokenizer == wordlevel[0]:
                    exp = replace(base, pad_id=wordlevel[1] if base.pad_id is None else base.pad_id,
                                  eot_ids=base.eot_ids or (wordlevel[2],))
            problems = checks.find_problems(rec, exp)
            key = checks.record_key(rec) if prov is not None else f'#{n - 1}'
            if problems:
                refused += 1
                kinds.update(p.kind for p in problems)
                for p in problems:
                    if len(examples) < opts.examples:
                        examples.append(f'{key}: {p.kind}: {p}')
            lengths.append(len(rec.ids))
            if rec.action_mask is not None:
                trained.append(int(rec.action_mask.float().sum()))
            stop = (rec.info or {}).get('stop')
            stops[str(stop)] += 1
            truncated += stop == 'truncated'
            policies[prov.policy if prov is not None else '(none)'] += 1
            if prov is not None and prov.logp_placeholder:
                scripted += 1
            if net is None or problems:
                continue
            if prov.logp_placeholder:
                replay_skipped['scripted (placeholder log-probs)'] += 1
            elif rec.turn_contexts is not None:
                replay_skipped['per-turn contexts'] += 1
            else:
                try:
                    replays.extend(checks.replay_check([rec], net, tol=opts.tol).records)
                except checks.ReplayUnsupportedError as e:
                    replay_skipped['the model cannot score them'] += 1
                    if len(replay_examples) < opts.examples:
                        replay_examples.append(f'{key}: {e}')
    out(f'records          {n}  (refused {refused}, scripted {scripted})')
    out('policies         ' + ('  '.join(f'{k} {v}' for k, v in sorted(policies.items())) or 'none'))
    out(f'length (tokens)  {_stats(lengths)}')
    out(f'trained tokens   {_stats(trained)}')
    out('stops            ' + ('  '.join(f'{k} {v}' for k, v in sorted(stops.items())) or 'none'))
    out(f'truncation rate  {truncated / n:.3f}  (stop == truncated)' if n else 'truncation rate  n/a')
    if kinds:
        out('refusals by kind:')
        for kind, c in kinds.most_common():
            out(f'  {kind:<28} {c}')
        for e in examples:
            out(f'  e.g. {e}')
    else:
        out('refusals by kind: none')
    code = 1 if refused else 0
    reasons = [f'{refused} of {n} records refused'] if refused else []
    if n == 0:
        out(f'no records in {opts.path}; pass a trajectories .parquet file or its shard folder '
            '(OUT/trajectories.parquet or OUT/trajectories/)')
        code = 1
        reasons.append('no records')
    if net is not None:
        report = checks.ReplayReport.of(replays)
        out(f'replay under the declared sampler (model {opts.model}, {len(replays)} records):')
        for line in report.table().splitlines():
            out('  ' + line)
        for why, c in replay_skipped.items():
            out(f'  not replayed: {c} {why}')
        for e in replay_examples:
            out(f'  e.g. {e}')
        bad = [r for r in replays if r.kind in _SAMPLER_DEFECTS]
        for r in bad[:opts.examples]:
            out(f'  e.g. {r.key}: {r.kind} (ratio mean {r.stats.mean:.4f}); the declared sampler does not '
                'reproduce the stored log-probs')
        if bad:
            code = 1
            reasons.append(f'{len(bad)} records not reproduced by their declared sampler')
        if opts.max_ratio_dev is not None and report.overall.n and report.overall.max_abs_dev > opts.max_ratio_dev:
            out(f'  max |ratio - 1| = {report.overall.max_abs_dev:.2e} exceeds --max-ratio-dev {opts.max_ratio_dev}'
                ' (stored sample_logp is not what this model gives; pass --max-ratio-dev inf to only report)')
            code = 1
            reasons.append(f'replay ratio off by {report.overall.max_abs_dev:.2e}')
    out('result: ' + ('OK' if code == 0 else f"FAILED ({'; '.join(reasons)})"))
    return code


def run(args) -> int:
    """Run the subcommand for parsed ``args``; return the exit code (errors raise ``UserError``, one line)."""
    return check(options_from_args(args))
