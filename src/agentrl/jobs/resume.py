"""L5: a run folder's manifest and its resume rules: what ``--resume OUT`` keeps, checks and refuses.

``OUT/run.json`` (:func:`manifest_of`) records the plan: the options that define the episodes, the
chunk size and the model's ``name@fingerprint`` (docs/design.md#scale-out). :func:`resume_options`
finishes a run with that plan and this command's scale-out flags; :func:`stored_records` yields
the records a resume finds, each checked against what the manifest fixes; :func:`refuse_if_complete`
raises :class:`RunComplete` when there is nothing left to run. Reads only: the rollout job
(:mod:`agentrl.jobs.rollout`) does the writing.
"""
from __future__ import annotations

import json
import os
import shlex
from dataclasses import fields, replace
from pathlib import Path
from typing import Callable

from ..engines.factory import backend, rollout_kit
from ..fields import check_fields, field_default, flag_of
from .plan import MANIFEST, POLICIES, SUMMARY, TRAJECTORY_DIR, EpisodeJob, RolloutOptions
from .runner import RunSpec

__all__ = ['PLAN_FIELDS', 'PATH_FIELDS', 'SCALE_OUT_FIELDS', 'RunComplete', 'manifest_of', 'read_manifest',
           'resume_options', 'resume_command', 'holds_run', 'refuse_if_complete', 'stored_records']


class RunComplete(Exception):
    """``--resume`` of a run that is already complete: its summary is written and every planned episode
    is stored. Nothing was written (not even ``OUT/.lock``).

    Attributes:
        out: the run folder. done: episodes stored. total: episodes planned.
    """

    def __init__(self, out: str, done: int, total: int):
        self.out, self.done, self.total = out, done, total
        super().__init__(f'{out!r} is already complete: {done} of {total} episodes are stored and {SUMMARY} is '
                         'written; nothing to run')


def resume_command(out: str, checkpoint: str | None = None, model: str | None = None, server=None) -> str:
    """The command that finishes the run in ``out``: ``agentrl rollout --resume OUT`` plus the model flag it needs.

    A run sampled from ``--checkpoint FILE`` or ``--model DIR`` stores the model's name, not its
    path, so its resume passes the flag again (shell-quoted when needed); ``server``: the
    ``--server`` URLs of a server backend's run (any live servers of that model will do: seeds are per request).
    """
    cmd = f'agentrl rollout --resume {shlex.quote(str(out))}'
    for flag, path in (('--checkpoint', checkpoint), ('--model', model)):
        if path:
            cmd += f' {flag} {shlex.quote(str(path))}'
    if server:
        cmd += ' --server ' + shlex.quote(','.join(server))
    return cmd


#: RolloutOptions fields that define the plan and its records; a resumed run keeps them.
PLAN_FIELDS = ('policy', 'split', 'repeats', 'seed', 'checkpoint', 'temperature', 'max_turns', 'reward_tests',
               'batch', 'engine', 'model', 'top_k', 'top_p', 'min_p', 'max_new_tokens', 'tool_choice',
               'screenshots')


#: PLAN_FIELDS that name a model by a local path on the command line; the manifest stores the model's
#: ``name@fingerprint`` instead (records and manifests never hold a local path), so a resume is given
#: the path again and the model found there must have that fingerprint.
PATH_FIELDS = ('checkpoint', 'model')


def manifest_of(opts: RolloutOptions, episodes: int, model: dict | None) -> dict:
    """The manifest of a run (what ``OUT/run.json`` holds).

    Args:
        opts: the run's options. episodes: planned episodes. model: ``{'name', 'fingerprint'}``
            of the model policy (None without one).

    Returns:
        ``{'plan': {field: value for PLAN_FIELDS}, 'chunk_size', 'episodes', 'model', 'seed_rule'}``;
        a :data:`PATH_FIELDS` flag that was given is stored as ``'name@fingerprint'`` (e.g.
        ``'tiny-qwen3@1a2b3c4d5e6f'``), never as its path.
    """
    plan = {k: getattr(opts, k) for k in PLAN_FIELDS}
    for k in PATH_FIELDS:
        if plan[k]:
            plan[k] = f'{model["name"]}@{model["fingerprint"]}' if model else Path(plan[k]).name
    return {'plan': plan, 'chunk_size': int(opts.chunk_size), 'episodes': int(episodes), 'model': model,
            'seed_rule': 'agentrl.sampling.episode_seed(run seed, group_id, rollout_id)'}


def read_manifest(run_dir: str | os.PathLike) -> dict | None:
    """``run_dir/run.json`` as a dict, or None when the folder has none.

    Raises:
        ValueError: the file is not a manifest (not JSON, no ``plan``). Fix: pass the run folder
            of ``agentrl rollout --out``, or start a new one.
    """
    path = Path(run_dir) / MANIFEST
    if not path.is_file():
        return None
    try:
        m = json.loads(path.read_text())
    except (ValueError, UnicodeDecodeError) as e:
        raise ValueError(f'{str(path)!r} is not a run manifest ({e}); start a new --out') from None
    if not isinstance(m, dict) or not isinstance(m.get('plan'), dict) or 'chunk_size' not in m:
        raise ValueError(f'{str(path)!r} is not a run manifest (no plan); start a new --out')
    return m


#: RolloutOptions fields a resume may change: how the missing episodes are run, not which or how they sample.
SCALE_OUT_FIELDS = ('workers', 'address', 'profile', 'resume', 'server', 'vllm_python', 'vllm_cpus')


def _shown(v) -> str:
    """A plan value as a flag's argument (``oracle,model`` for a policy list)."""
    return ','.join(map(str, v)) if isinstance(v, list) else str(v)


def resume_options(opts: RolloutOptions, given: frozenset | None = None) -> tuple[RolloutOptions, dict]:
    """The options to finish ``opts.resume`` with: its plan from the manifest, this command's scale-out.

    The manifest names the model of ``--checkpoint`` / ``--model`` by ``name@fingerprint``, not by
    its path (:data:`PATH_FIELDS`), so a resume of such a run is given the flag again; the job then
    refuses a model whose fingerprint differs.

    Args:
        opts: options with ``resume`` set (``workers``, ``address``, ``profile`` may differ from the
            run's: :data:`SCALE_OUT_FIELDS`; ``checkpoint`` / ``model`` given again when the run used them).
        given: the fields whose flags the command line gave (:func:`agentrl.cli.options.given_flags`;
            default ``opts.given`` when set): each must equal the plan's value, even when it is the
            default. None (a call from code): the fields that differ from their defaults.

    Returns:
        ``(options, manifest)``: ``out`` is the run folder, the plan fields and ``chunk_size``
        are the manifest's (``checkpoint`` and ``model``: this command's paths).

    Raises:
        ValueError: no ``run.json`` in the folder, a plan value in it out of its flag's range, a
            given flag (or ``chunk_size``) that differs from the plan, ``--out`` (the run folder is
            ``--resume``'s), or a run sampled from a ``--checkpoint`` / ``--model`` that this
            command does not pass again.
    """
    run_dir = Path(opts.resume)
    if run_dir.name == TRAJECTORY_DIR and not (run_dir / MANIFEST).exists():
        run_dir = run_dir.parent
    manifest = read_manifest(run_dir)
    if manifest is None:
        raise ValueError(f'--resume {opts.resume!r}: no {MANIFEST} there; pass the --out folder of an '
                         '`agentrl rollout` run')
    by_name = {x.name: x for x in fields(RolloutOptions)}
    if given is None:
        given = getattr(opts, 'given', None)
    if given is None:
        default = RolloutOptions()
        given = frozenset(k for k in by_name if getattr(opts, k) != getattr(default, k))
    if 'out' in given:
        raise ValueError(f'--resume {opts.resume!r} writes into that run folder; drop --out (or drop --resume to '
                         'start a new run in --out)')
    plan = {k: manifest['plan'][k] for k in PLAN_FIELDS if k in manifest['plan']}
    _check_plan(run_dir / MANIFEST, {**plan, 'chunk_size': manifest['chunk_size']})
    for k in PATH_FIELDS:
        named, mine = plan.pop(k, None), getattr(opts, k)
        f = by_name[k]
        if named and not mine:
            raise ValueError(f'--resume {opts.resume!r}: {MANIFEST} names the model {named}, not its path; pass '
                             f'{flag_of(f)} {f.metadata["metavar"]} (that model) again')
        if mine and not named:
            raise ValueError(f'--resume {opts.resume!r}: the run was planned without {flag_of(f)}, this command '
                             f'says {mine!r}; drop the flag (resume keeps the plan) or start a new --out')
    for k, v in {**plan, 'chunk_size': int(manifest['chunk_size'])}.items():
        mine = getattr(opts, k)
        if k in given and mine != v:
            flag = flag_of(by_name[k])
            if isinstance(v, bool):     # a switch: name the plan's side of it
                theirs, says = ('without', 'with') if v == by_name[k].default else ('with', 'without')
                raise ValueError(f'--resume {opts.resume!r}: the run was planned {theirs} {flag}, this command '
                                 f'says {says} {flag}; drop the flag (resume keeps the plan) or start a new --out')
            raise ValueError(f'--resume {opts.resume!r}: the run was planned with {flag} {_shown(v)}, this command '
                             f'says {flag} {_shown(mine)}; drop the flag (resume keeps the plan) or start a new --out')
    return replace(opts, out=str(run_dir), chunk_size=int(manifest['chunk_size']), **plan), manifest


def _check_plan(path: Path, plan: dict) -> None:
    """Check run.json's plan values against their flags' ranges (a hand-edited manifest is refused, not run).

    Raises:
        ValueError: ``'PATH': plan field FIELD ...; restore run.json or start a new --out``.
    """
    by_name = {x.name: x for x in fields(RolloutOptions)}
    for k, v in plan.items():
        f = by_name[k]
        probe = RolloutOptions.__new__(RolloutOptions)       # one field at a time: no __post_init__ defaults
        try:
            if k == 'policy':
                if not isinstance(v, list) or not v or not all(isinstance(p, str) and p in POLICIES for p in v):
                    raise ValueError(f'must list policies from {",".join(POLICIES)}, got {v!r}')
                continue
            t = type(f.default) if f.default is not None else str
            if v is not None and (type(v) is not t and not (t is float and type(v) is int)):
                raise ValueError(f'must be a {t.__name__}, got {v!r}')
            for g in fields(RolloutOptions):
                object.__setattr__(probe, g.name, field_default(g) if g.name != k else v)
            probe.policy = list(POLICIES)
            check_fields(probe)
        except ValueError as e:
            msg = str(e)
            msg = msg.split(' ', 1)[1] if msg.startswith(flag_of(f)) else msg
            raise ValueError(f'{str(path)!r}: plan field {k} {msg}; restore {MANIFEST} or start a new --out') from None


def holds_run(out: Path, writes_model: bool) -> list[str]:
    """The run files already in ``out`` (empty: nothing a new run could damage there)."""
    names = [MANIFEST, SUMMARY, 'trajectories.parquet'] + (['model.pt'] if writes_model else [])
    found = [n for n in names if (out / n).exists()]
    shards = out / TRAJECTORY_DIR
    if shards.is_dir() and any(shards.iterdir()):
        found.append(TRAJECTORY_DIR + '/')
    return found


def refuse_if_complete(out: Path, jobs: list) -> None:
    """Raise :class:`RunComplete` when ``out`` has its summary and every planned episode (reads only)."""
    from .. import store
    if not (out / SUMMARY).is_file():
        return
    planned = {j.key for j in jobs}
    if planned <= set(store.stored_identities(out / TRAJECTORY_DIR)):
        raise RunComplete(str(out), len(planned), len(planned))


def _expected_provenance(spec: RunSpec, tok) -> Callable[[EpisodeJob], dict]:
    """What run.json fixes in the provenance of an episode's record: ``job -> {field: value}``.

    ``policy``, ``model`` (``name@fingerprint``), ``sampling`` (as a dict; None for scripted
    records), ``logp_placeholder``, ``tokenizer`` and ``template`` fingerprints and ``seed``. The
    ``hf`` engine's tokenizer and template are loaded from ``--model`` at the first ``hf`` record.
    """
    opts = spec.options
    sampling = spec.sampling.to_dict()
    word = {'tokenizer': tok.fingerprint, 'template': tok.template_fingerprint()}
    server_sampling = None
    b = backend(opts.engine)
    if b.servers:            # what the servers declared: the probed log-prob mode (RunSpec.logp_mode)
        kit = rollout_kit(opts.engine)
        server_sampling = kit.record_spec(spec.sampling, spec.logp_mode or spec.sampling.logp_mode).to_dict()
    hf: dict = {}

    def hf_fingerprints() -> dict:
        if not hf:
            from ..gym import TOOL_SCHEMAS
            from ..templates import ChatTemplate
            from ..templates.chat import load_tokenizer, tokenizer_fingerprint
            template = ChatTemplate(load_tokenizer(str(opts.model)), tools=TOOL_SCHEMAS)
            hf.update(tokenizer=tokenizer_fingerprint(template.tokenizer), template=template.fingerprint)
            stops.append(template.stop_ids)
        return hf
    stops: list = []

    def expected(job: EpisodeJob) -> dict:
        if job.policy != 'model':
            return dict(policy=job.policy, model='', sampling=None, logp_placeholder=True, **word, seed=job.seed)
        fps = hf_fingerprints() if b.chat else word
        declared = server_sampling if b.servers else sampling
        if b.grammar and (opts.tool_choice or opts.response_format):   # docs/grammar.md
            declared = dict(declared, constraint=opts.constraint(stops[0]).to_dict())
        return dict(policy=b.policy, model=spec.model_id, sampling=declared, logp_placeholder=False, **fps,
                    seed=job.seed)
    return expected


def _repeat_line(where: str, row, first: tuple, verdict: str, shard_dir: Path) -> str:
    """The one-line refusal of a stored record that repeats an earlier one's identity (a stray copy of a shard)."""
    from ..checks import episode_key
    prov = row.record.provenance
    ident = (f'episode {episode_key(prov.group_id, prov.rollout_id)} attempt {prov.attempt}' if prov is not None
             else 'a record without identity')
    what = 'the same record' if verdict == 'resend' else 'the identity of'
    return (f'{where}: {row.file!r} row {row.row} repeats {what} {first[0]!r} row {first[1]} ({ident} is stored '
            f'twice: a copy of a shard?); move one of the two files out of {str(shard_dir)!r} (the episodes only '
            'it held then run again), then resume; nothing was run')


def stored_records(shard_dir: Path, jobs: list, spec: RunSpec, tok):
    """Yield the records a resume finds in ``shard_dir``, a batch at a time, each checked against run.json.

    Args:
        shard_dir: ``OUT/trajectories``. jobs: the plan. spec: the run's :class:`~agentrl.jobs.runner.RunSpec`
            (its options and model id fix the provenance). tok: the word-level tokenizer.

    Raises:
        ValueError: a record of an episode the plan does not hold, or whose provenance differs from
            what run.json fixes (a shard of another run); the message names the shard file, the row,
            the field and the fix; a record stored twice (a copy of a shard: the same identity
            ``(group_id, rollout_id, attempt)`` in two rows), naming both files and rows. Resume refuses such
            a store rather than healing it: which copy is the stray one is the user's call.
            MalformedRowError, DigestMismatchError: a row that cannot be trusted.
    """
    from .. import store
    from ..checks import Deduper
    index = {j.key: j for j in jobs}
    expected = _expected_provenance(spec, tok)
    where = f'--resume {spec.options.out!r}'
    seen = Deduper()
    for rows in store.scan(shard_dir, 256):
        recs = []
        for row in rows:
            if row.problem is not None:
                raise row.problem
            verdict, first = seen.see(row.record, where=(row.file, row.row), digest=row.digest)
            if verdict != Deduper.NEW:
                raise ValueError(_repeat_line(where, row, first, verdict, shard_dir))
            prov = row.record.provenance
            fix = (f'move {Path(row.file).name} out of {str(shard_dir)!r} (its episodes then run again), or '
                   'start a new --out')
            job = index.get((prov.group_id, prov.rollout_id)) if prov is not None else None
            if job is None:
                from ..checks import episode_key
                ident = episode_key(prov.group_id, prov.rollout_id) if prov is not None else 'no identity'
                raise ValueError(f'{where}: {row.source}: provenance.group_id: episode {ident} is not in the plan of '
                                 f'{MANIFEST} (a shard of another run); {fix}')
            for name, want in expected(job).items():
                got = getattr(prov, name)
                if name == 'sampling' and got is not None:
                    got = got.to_dict()
                if got != want:
                    raise ValueError(f'{where}: {row.source}: provenance.{name} is {got!r} but {MANIFEST} fixes '
                                     f'{want!r} (a shard of another run); {fix}')
            recs.append(row.record)
        yield recs

