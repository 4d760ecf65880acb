"""L5: what a rollout run is: its options, its episodes, its chunks and its manifest.

A run is planned once, before anything runs, as a list of episodes (policy, task, repeat) with
their record identities (``group_id = '{seed}/{policy}/{task}'``, ``rollout_id = group_id +
'/{repeat}'``) and their sampling seeds (:func:`agentrl.sampling.episode_seed`, the one seed
rule), then cut into fixed **chunks** of at most ``chunk_size`` consecutive episodes of one
policy. The cut depends only on the plan, never on the number of workers, so a chunk is batched
the same way wherever it runs and the records of ``--workers 0``, ``1`` and ``2`` are equal bit
for bit.

The manifest ``OUT/run.json`` records the plan (the options that define the episodes, the
chunk size and the model's name and fingerprint, never a local path), so ``--resume OUT`` runs
only the missing episodes of the same plan, and refuses a different one.
"""
from __future__ import annotations

import json
import math
import os
from dataclasses import MISSING, asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Sequence

__all__ = ['POLICIES', 'SCRIPTED', 'ENGINES', 'MANIFEST', 'TRAJECTORY_DIR', 'SUMMARY', 'PLAN_FIELDS',
           'PATH_FIELDS', 'RolloutOptions', 'EpisodeJob', 'plan_episodes', 'plan_chunks', 'read_manifest',
           'SCALE_OUT_FIELDS', 'manifest_of', 'resume_options', 'public_options', 'check_fields', 'flag_of']

#: Every policy ``agentrl rollout`` knows: four scripted ones and ``model`` (TinyAgent or HF).
POLICIES = ('oracle', 'blind', 'random', 'hacker', 'model')
#: The scripted policies (:func:`agentrl.gym.scripted_policy`).
SCRIPTED = ('oracle', 'blind', 'random', 'hacker')
#: Engines of the ``model`` policy.
ENGINES = ('tinyagent', 'hf')
#: The run manifest inside the run folder.
MANIFEST = 'run.json'
#: The shard folder inside the run folder.
TRAJECTORY_DIR = 'trajectories'
#: The summary written last: its presence marks a complete run.
SUMMARY = 'summary.json'


def _opt(default, help: str, **meta):
    """A dataclass field whose metadata is its flag's help and checks (read by :mod:`agentrl.cli.options`)."""
    if isinstance(default, list) or default is None and meta.get('parse') == 'list':
        return field(default=None, metadata=dict(meta, help=help))
    return field(default=default, metadata=dict(meta, help=help))


@dataclass
class RolloutOptions:
    """Options of ``agentrl rollout`` and of :func:`agentrl.jobs.rollout.rollout_job` (one field per flag).

    Each field's ``metadata['help']`` is its flag's help text; ``min``/``max``/``gt`` bound a
    number (checked by :meth:`validate` and by the command line before anything runs) and
    ``engines`` names the engines a flag applies to (any other engine refuses it).

    Attributes:
        policy: policies to run (None: all five; with ``engine='hf'``: ``['model']``).
        split: task split: ``train`` (24), ``heldout`` (6) or ``all`` (30).
        repeats: episodes per task and policy.
        seed: the run seed: episode seeds (:func:`agentrl.sampling.episode_seed`), the
            untrained TinyAgent's initialisation.
        out: the run folder (``run.json``, ``model.pt``, ``trajectories/part-*.parquet``,
            ``summary.json``).
        checkpoint: TinyAgent checkpoint (``model.pt`` of ``agentrl train``); None: an untrained
            TinyAgent initialised from ``seed``, saved as ``OUT/model.pt`` for replay checks.
        temperature: sampling temperature of the model policy (0: greedy).
        max_turns: turn budget per episode.
        reward_tests: ``hidden`` (true reward) or ``public`` (hackable reward).
        batch: sample TinyAgent episodes of a chunk together with ``rollout_batch`` (False: one by
            one with ``rollout``).
        workers: Ray actors (0: this process). Same records either way.
        address: Ray cluster to join (``auto`` or ``HOST:PORT``); None starts a local instance.
        resume: a run folder to finish: only its missing episodes run, with its plan.
        chunk_size: episodes per chunk: one batch, one shard, the unit an interrupt finishes.
        engine: ``tinyagent`` or ``hf`` (the ``model`` policy is a Hugging Face causal LM).
        model: ``save_pretrained`` folder for ``engine='hf'``.
        top_k, top_p, min_p: truncation of the model policy's sampler, either engine (0, 1.0, 0.0 = off).
        max_new_tokens: token budget of one ``hf`` turn.
        profile: time the ``hf`` engine per turn (summary ``hf.profile``; in process only).
    """
    policy: list | None = _opt(None, 'comma-separated policies from oracle,blind,random,hacker,model '
                                     '(default: all; with --engine hf: model)', parse='list', metavar='P[,P...]')
    split: str = _opt('all', 'task split: train (24 tasks), heldout (6) or all (30)',
                      choices=('train', 'heldout', 'all'))
    repeats: int = _opt(3, 'episodes per task and policy (at most 100000)', min=1, max=100_000)
    seed: int = _opt(0, 'run seed: every episode samples from episode_seed(seed, group, rollout); also the '
                        'untrained TinyAgent init', min=0, max=2 ** 63 - 1)
    out: str = _opt('runs/rollout', 'run folder: run.json, model.pt, trajectories/part-*.parquet, summary.json',
                    metavar='DIR')
    checkpoint: str | None = _opt(None, 'TinyAgent checkpoint (model.pt from `agentrl train`); default: an '
                                        'untrained TinyAgent saved as OUT/model.pt', metavar='FILE',
                                  engines=('tinyagent',))
    temperature: float = _opt(1.0, 'model sampling temperature; 0 = greedy, whose stored log-prob is the argmax '
                                   'at temperature 1', min=0.0, max=100.0)
    max_turns: int = _opt(6, 'turn budget per episode', min=1, max=1000)
    reward_tests: str = _opt('hidden', 'reward on hidden+public tests (default) or public only (hackable)',
                             choices=('hidden', 'public'))
    batch: bool = _opt(True, 'sample TinyAgent episodes one by one with rollout() instead of rollout_batch()',
                       flag='--no-batch', engines=('tinyagent',))
    workers: int = _opt(0, 'Ray actors to run the chunks on (needs agentrl[ray]); 0 = this process; the '
                           'records are the same', min=0, max=4096)
    address: str | None = _opt(None, 'Ray cluster to join with --workers: auto or HOST:PORT (default: a local '
                                     'instance)', metavar='ADDR')
    resume: str | None = _opt(None, 'finish the run in DIR: run only its missing episodes, with its plan',
                              metavar='DIR')
    chunk_size: int = _opt(32, 'episodes per chunk: one batch, one shard, the unit an interrupt finishes',
                           min=1, max=100_000)
    engine: str = _opt('tinyagent', 'model policy: tinyagent, or hf: a Hugging Face causal LM from --model '
                                    'through real function calling (needs agentrl[hf])', choices=ENGINES)
    model: str | None = _opt(None, 'save_pretrained folder for --engine hf (`agentrl make-test-model OUT` '
                                   'builds one)', metavar='DIR', engines=('hf',),
                             wrong_engine='--model is the Hugging Face model of --engine hf; add --engine hf (or use '
                                          '--checkpoint for a TinyAgent)')
    # top_k/top_p/min_p ranges are SamplingSpec's own (checked by sampling_spec, which names the field)
    top_k: int = _opt(0, 'sampler top-k, 0 = off', min=0, max=2 ** 31 - 1)
    top_p: float = _opt(1.0, 'sampler nucleus mass in (0, 1], 1 = off')
    min_p: float = _opt(0.0, 'sampler min-p in [0, 1), 0 = off')
    max_new_tokens: int = _opt(256, 'token budget of one hf turn; a turn cut there is truncated', min=1,
                               max=1 << 20, engines=('hf',))
    profile: bool = _opt(False, "print the hf engine's per-turn time split (prefill, decode, sampling, template, "
                                'gym) and store it in summary.json (in this process: --workers 0)', engines=('hf',))

    def __post_init__(self):
        if self.policy is None:
            self.policy = ['model'] if self.engine == 'hf' else list(POLICIES)
        elif isinstance(self.policy, str):
            self.policy = [p.strip() for p in self.policy.split(',')]     # validate refuses an empty name
        else:
            self.policy = list(self.policy)

    def validate(self) -> None:
        """Check every option before anything is read or written.

        Raises:
            ValueError: a number out of its range or not finite, an unknown name, a flag that
                does not apply to the engine, a missing file; the message names the flag and the fix.
        """
        # a resume learns its engine from run.json: resume_options' caller checks the flags against it
        check_fields(self, engine=None if self.resume else self.engine)
        self.sampling_spec()                  # top-k/top-p/min-p ranges: SamplingSpec names the field
        if '' in self.policy:
            raise ValueError(f'--policy {",".join(self.policy)!r} has an empty name; separate the names by single '
                             'commas, e.g. oracle,model')
        bad = [p for p in self.policy if p not in POLICIES]
        if bad or not self.policy:
            raise ValueError(f'--policy {",".join(bad) or "(empty)"} is not known; choose from {",".join(POLICIES)}')
        if len(set(self.policy)) != len(self.policy):
            raise ValueError(f'--policy lists a policy twice ({",".join(self.policy)}); list each once')
        if self.checkpoint and not os.path.exists(self.checkpoint):
            raise ValueError(f'--checkpoint {self.checkpoint!r} does not exist; pass model.pt from `agentrl train`')
        if self.address and self.workers < 1:
            raise ValueError('--address joins a Ray cluster for the workers; add --workers N (N >= 1)')
        if self.resume and not os.path.isdir(self.resume):
            raise ValueError(f'--resume {self.resume!r} is not a folder; pass the --out folder of a run')
        if self.engine == 'hf':
            if not self.model or not os.path.isfile(os.path.join(self.model, 'config.json')):
                raise ValueError(f'--engine hf needs --model DIR with config.json (got {self.model!r}); '
                                 '`agentrl make-test-model OUT` builds a small one')
            if self.profile and self.workers:
                raise ValueError('--profile times the hf engine in this process; drop --workers')

    def sampling_spec(self):
        """The :class:`~agentrl.record.SamplingSpec` of the model policy (either engine).

        Raises:
            ValueError: a field out of the spec's range (the spec names it).
        """
        from ..record import SamplingSpec
        return SamplingSpec(temperature=max(self.temperature, 0.0), top_k=self.top_k, top_p=self.top_p,
                            min_p=self.min_p)


def flag_of(f) -> str:
    """The command-line flag of a dataclass field: ``metadata['flag']`` or ``--`` + name with dashes."""
    return f.metadata.get('flag') or '--' + f.name.replace('_', '-')


def check_fields(obj, engine: str | None = None) -> None:
    """Range-check the numbers of an options dataclass from its fields' metadata.

    Every ``int``/``float`` field must be finite (``metadata['allow_inf']`` lets ``inf`` through)
    and within ``min``/``max`` (inclusive) and above ``gt`` (exclusive); a ``choices`` field must
    hold one of them; with ``engine``, a field whose ``metadata['engines']`` excludes it must keep
    its default (a flag that does not apply is refused, not ignored); a text field must not be
    empty or whitespace (an empty path would mean the current folder).

    Raises:
        ValueError: ``--FLAG must be ...`` naming the flag, the range and the value given;
            ``--FLAG is empty; ...``.
    """
    for f in fields(obj):
        v, m = getattr(obj, f.name), f.metadata
        flag = flag_of(f)
        if isinstance(v, str) and not v.strip():
            raise ValueError(f'{flag} is empty; pass a path (`.` for the current folder)' if m.get('metavar') in
                             ('DIR', 'FILE', 'PATH', 'OUT', 'RUN') else f'{flag} is empty; pass a value or drop the flag')
        if 'choices' in m and v is not None and v not in m['choices']:
            raise ValueError(f'{flag} {v!r} is not known; choose from {",".join(map(str, m["choices"]))}')
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            pass
        else:
            if isinstance(v, float) and (math.isnan(v) or (math.isinf(v) and not m.get('allow_inf'))):
                raise ValueError(f'{flag} must be a finite number, got {v}')
            lo, hi, gt = m.get('min'), m.get('max'), m.get('gt')
            if lo is not None and v < lo or hi is not None and v > hi or gt is not None and not v > gt:
                lo_s = f'> {gt}' if gt is not None else f'>= {lo}' if lo is not None else ''
                hi_s = f'<= {hi}' if hi is not None else ''
                raise ValueError(f'{flag} must be {" and ".join(s for s in (lo_s, hi_s) if s)}, got {v}')
        if engine is not None and 'engines' in m and engine not in m['engines'] and v != _default(f):
            raise ValueError(m.get('wrong_engine') or f'{flag} applies to --engine {"/".join(m["engines"])}, not '
                             f'--engine {engine}; drop {flag} or choose --engine {m["engines"][0]}')


def _default(f):
    if f.default is not MISSING:
        return f.default
    return f.default_factory() if f.default_factory is not MISSING else None


# ----------------------------------------------------------------------------- the plan

@dataclass(frozen=True)
class EpisodeJob:
    """One episode to run: what to run and the identity its record gets.

    Attributes:
        policy: ``'model'`` or a scripted kind (``'oracle'``, ``'blind'``, ``'random'``, ``'hacker'``).
        task: task name (``Task.name`` of the BugFix gym).
        repeat: repeat index within (policy, task).
        group_id, rollout_id, attempt: the record's identity.
        seed: :func:`agentrl.sampling.episode_seed` of the episode (its own sampling seed).
        index: position in the plan (summaries take the first episode of a policy by it).
    """
    policy: str
    task: str
    repeat: int
    group_id: str
    rollout_id: str
    seed: int
    attempt: int = 1
    index: int = 0

    @property
    def key(self) -> tuple[str, str]:
        """``(group_id, rollout_id)``: the episode, whatever its attempt."""
        return (self.group_id, self.rollout_id)


def plan_episodes(policies: Sequence[str], tasks: Sequence[str], repeats: int, seed: int) -> list[EpisodeJob]:
    """Every episode of a run, in the order of ``agentrl rollout`` (policy, task, repeat).

    Args:
        policies: policy names. tasks: task names. repeats: episodes per (policy, task), >= 1.
        seed: the run seed.

    Returns:
        list of :class:`EpisodeJob` (attempt 1), ``len(policies) * len(tasks) * repeats`` long.

    Raises:
        ValueError: ``repeats < 1``, or a repeated policy or task name (identities would
            collide). Fix: pass each once.
    """
    from ..sampling import episode_seed
    if repeats < 1:
        raise ValueError(f'plan_episodes: repeats must be >= 1, got {repeats}')
    for what, names in (('policy', policies), ('task', tasks)):
        if len(set(names)) != len(names):
            raise ValueError(f'plan_episodes: a {what} is listed twice in {list(names)}; list each once')
    jobs = []
    for policy in policies:
        for task in tasks:
            group = f'{seed}/{policy}/{task}'
            for r in range(repeats):
                rid = f'{group}/{r}'
                jobs.append(EpisodeJob(policy, task, r, group, rid, episode_seed(seed, group, rid), 1, len(jobs)))
    return jobs


def plan_chunks(jobs: Sequence[EpisodeJob], chunk_size: int) -> list[list[EpisodeJob]]:
    """Cut the plan into chunks of at most ``chunk_size`` consecutive episodes of one policy.

    The cut depends only on the plan and ``chunk_size``, never on the number of workers, so a
    chunk is batched the same way wherever it runs (the records are then equal bit for bit).

    Args:
        jobs: the plan (:func:`plan_episodes`). chunk_size: episodes per chunk, >= 1.

    Returns:
        list of chunks (lists of :class:`EpisodeJob`), in plan order.

    Raises:
        ValueError: ``chunk_size < 1``.

    Example:
        >>> [len(c) for c in plan_chunks(plan_episodes(['oracle', 'model'], ['clamp', 'double'], 2, 0), 3)]
        [3, 1, 3, 1]
    """
    if chunk_size < 1:
        raise ValueError(f'plan_chunks: chunk_size must be >= 1, got {chunk_size}')
    chunks: list[list[EpisodeJob]] = []
    for job in jobs:
        if chunks and chunks[-1][0].policy == job.policy and len(chunks[-1]) < chunk_size:
            chunks[-1].append(job)
        else:
            chunks.append([job])
    return chunks


# ----------------------------------------------------------------------------- manifest and resume

#: RolloutOptions fields that define the plan and its records; a resumed run keeps them.
PLAN_FIELDS = ('policy', 'split', 'repeats', 'seed', 'checkpoint', 'temperature', 'max_turns', 'reward_tests',
               'batch', 'engine', 'model', 'top_k', 'top_p', 'min_p', 'max_new_tokens')


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
SCALE_OUT_FIELDS = ('workers', 'address', 'profile', 'resume')


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
                object.__setattr__(probe, g.name, _default(g) if g.name != k else v)
            probe.policy = list(POLICIES)
            check_fields(probe)
        except ValueError as e:
            msg = str(e)
            msg = msg.split(' ', 1)[1] if msg.startswith(flag_of(f)) else msg
            raise ValueError(f'{str(path)!r}: plan field {k} {msg}; restore {MANIFEST} or start a new --out') from None


def public_options(opts: RolloutOptions) -> dict:
    """The options as stored in a summary: local paths reduced to their last component."""
    d = asdict(opts)
    for k in ('checkpoint', 'model', 'resume', 'out'):
        if d.get(k):
            d[k] = Path(d[k]).name
    return d
