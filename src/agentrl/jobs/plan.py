"""L5: what a rollout run is: its options, its episodes and its chunks.

A run is planned once, before anything runs, as a list of episodes (policy, task, repeat) with
their record identities (``group_id = '{seed}/{policy}/{task}'``, ``rollout_id = group_id +
'/{repeat}'``) and their sampling seeds (:func:`agentrl.sampling.episode_seed`, docs/design.md#seeds),
then cut into fixed **chunks** of at most ``chunk_size`` consecutive episodes of one
policy. The cut depends only on the plan, never on the number of workers (docs/design.md#scale-out).

The manifest ``OUT/run.json`` and the resume rules are in :mod:`agentrl.jobs.resume` (which imports
this module); the option-field machinery (``check_fields``, ``flag_of``) is
:mod:`agentrl.fields`.
"""
from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, fields  # noqa: F401 - fields: tests read jobs.plan.fields
from pathlib import Path
from typing import Sequence

from ..constraints import backend_version, response_format_constraint, tool_call_constraint
from ..engines.factory import BACKENDS, ENGINES as FACTORY_ENGINES, Names, backend, rollout_kit
from ..fields import check_fields, flag_of, option  # noqa: F401 - check_fields, flag_of: their old home
from ..record import SamplingSpec
from ..sampling import episode_seed

__all__ = ['POLICIES', 'SCRIPTED', 'ENGINES', 'MANIFEST', 'TRAJECTORY_DIR', 'SUMMARY', 'RolloutOptions', 'EpisodeJob',
           'plan_episodes', 'plan_chunks', 'public_options', 'check_fields', 'flag_of']

#: Every policy ``agentrl rollout`` knows: four scripted ones and ``model`` (TinyAgent or HF).
POLICIES = ('oracle', 'blind', 'random', 'hacker', 'model')
#: The scripted policies (:func:`agentrl.gym.scripted_policy`).
SCRIPTED = ('oracle', 'blind', 'random', 'hacker')
#: Engines of the ``model`` policy.
ENGINES = FACTORY_ENGINES
#: The engines each flag applies to, from the registry's facts (docs/design.md#engines): live views,
#: so a backend added to the registry gets the flags of its facts.
TINYAGENT_WEIGHTS = Names(lambda b: not b.model_dir)          # --checkpoint: the run's TinyAgent weights
TINYAGENT_LOOP = Names(lambda b: not b.chat)                   # --no-batch: TinyAgent's batched loop
MODEL_DIR = Names(lambda b: b.model_dir)                       # --model DIR
SERVERS = Names(lambda b: b.servers)                           # --server, --vllm-python, --vllm-cpus
CHAT = Names(lambda b: b.chat)                                 # --max-new-tokens: a chat engine's turn budget
GRAMMAR = Names(lambda b: b.grammar)                           # --tool-choice, --response-format
IN_PROCESS = Names(lambda b: b.model_dir and not b.servers)    # --profile: the in-process model's time split
#: The run manifest inside the run folder.
MANIFEST = 'run.json'
#: The shard folder inside the run folder.
TRAJECTORY_DIR = 'trajectories'
#: The summary written last: its presence marks a complete run.
SUMMARY = 'summary.json'


@dataclass
class RolloutOptions:
    """Options of ``agentrl rollout`` and of :func:`agentrl.jobs.rollout.rollout_job` (one field per flag).

    Each field's ``metadata['help']`` is its flag's help text; ``min``/``max``/``gt`` bound a
    number (checked by :meth:`validate` and by the command line before anything runs) and
    ``engines`` names the engines a flag applies to (any other engine refuses it).

    Attributes:
        policy: policies to run (None: all five; with ``engine='hf'`` or ``'vllm'``: ``['model']``).
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
        engine: ``tinyagent``, ``hf`` (the ``model`` policy is a Hugging Face causal LM) or ``vllm``
            (the same model sampled by vLLM servers, docs/vllm.md).
        model: ``save_pretrained`` folder for ``engine='hf'``; for ``'vllm'`` the tokenizer and
            template (and the model of a local server when no ``server`` is given).
        server: running vLLM servers' URLs (``engine='vllm'``; None: start one from ``model``).
        vllm_python: the vLLM venv's python for a local server (None: ``.venv-vllm/bin/python``).
        vllm_cpus: ``taskset -c`` cores of a local server (None: no pinning).
        top_k, top_p, min_p: truncation of the model policy's sampler, either engine (0, 1.0, 0.0 = off).
        max_new_tokens: token budget of one ``hf`` turn.
        profile: time the ``hf`` engine per turn (summary ``hf.profile``; in process only).
        screenshots: answer each ``read`` with a PNG of the source (an image part of the tool message) for a
            vision-language ``model`` (its folder has ``preprocessor_config.json``); the records list the
            images in ``info['images']`` and the run stores them once in ``OUT/images/`` (docs/design.md#images).
            In this process only (Ray actors do not send images back).
    """
    policy: list | None = option(None, 'comma-separated policies from oracle,blind,random,hacker,model '
                                     '(default: all; with --engine hf or vllm: model)', parse='list', metavar='P[,P...]')
    split: str = option('all', 'task split: train (24 tasks), heldout (6) or all (30)',
                      choices=('train', 'heldout', 'all'))
    repeats: int = option(3, 'episodes per task and policy (at most 100000)', min=1, max=100_000)
    seed: int = option(0, 'run seed: every episode samples from episode_seed(seed, group, rollout); also the '
                        'untrained TinyAgent init', min=0, max=2 ** 63 - 1)
    out: str = option('runs/rollout', 'run folder: run.json, model.pt, trajectories/part-*.parquet, summary.json',
                    metavar='DIR')
    checkpoint: str | None = option(None, 'TinyAgent checkpoint (model.pt from `agentrl train`); default: an '
                                        'untrained TinyAgent saved as OUT/model.pt', metavar='FILE',
                                  engines=TINYAGENT_WEIGHTS)
    temperature: float = option(1.0, 'model sampling temperature; 0 = greedy, whose stored log-prob is the argmax '
                                   'at temperature 1', min=0.0, max=100.0)
    max_turns: int = option(6, 'turn budget per episode', min=1, max=1000)
    reward_tests: str = option('hidden', 'reward on hidden+public tests (default) or public only (hackable)',
                             choices=('hidden', 'public'))
    batch: bool = option(True, 'sample TinyAgent episodes one by one with rollout() instead of rollout_batch()',
                       flag='--no-batch', engines=TINYAGENT_LOOP)
    workers: int = option(0, 'Ray actors to run the chunks on (needs agentrl[ray]); 0 = this process; the '
                           'records are the same', min=0, max=4096)
    address: str | None = option(None, 'Ray cluster to join with --workers: auto or HOST:PORT (default: a local '
                                     'instance)', metavar='ADDR')
    resume: str | None = option(None, 'finish the run in DIR: run only its missing episodes, with its plan',
                              metavar='DIR')
    chunk_size: int = option(32, 'episodes per chunk: one batch, one shard, the unit an interrupt finishes',
                           min=1, max=100_000)
    engine: str = option('tinyagent', 'model policy: tinyagent; hf: a Hugging Face causal LM from --model '
                                    'through real function calling (needs agentrl[hf]); vllm: the same model '
                                    'sampled by vLLM servers (--server URL, or a local one from --model)',
                         choices=ENGINES)
    model: str | None = option(None, 'save_pretrained folder for --engine hf or vllm (`agentrl make-test-model OUT` '
                                   'builds one); with --engine vllm its tokenizer and template, and the model of a '
                                   'local server when no --server is given', metavar='DIR', engines=MODEL_DIR,
                             wrong_engine='--model is the Hugging Face model of --engine hf or vllm; add --engine hf '
                                          '(or use --checkpoint for a TinyAgent)')
    server: list | None = option(None, 'running vLLM servers for --engine vllm (repeatable or comma-separated '
                                     'URLs; an episode stays on one server); default: start one from --model',
                                 parse='list', repeatable=True, metavar='URL', engines=SERVERS)
    vllm_python: str | None = option(None, 'python of the vLLM venv for the local server of --engine vllm '
                                         '(default: .venv-vllm/bin/python)', metavar='PATH', engines=SERVERS)
    vllm_cpus: str | None = option(None, 'taskset -c cores of the local vLLM server (default: not pinned)',
                                   metavar='LIST', engines=SERVERS)
    # top_k/top_p/min_p ranges are SamplingSpec's own (checked by sampling_spec, which names the field)
    top_k: int = option(0, 'sampler top-k, 0 = off', min=0, max=2 ** 31 - 1)
    top_p: float = option(1.0, 'sampler nucleus mass in (0, 1], 1 = off')
    min_p: float = option(0.0, 'sampler min-p in [0, 1), 0 = off')
    max_new_tokens: int = option(256, 'token budget of one hf or vllm turn; a turn cut there is truncated', min=1,
                               max=1 << 20, engines=CHAT,
                               wrong_engine='--max-new-tokens applies to --engine hf, not --engine tinyagent; drop '
                                            '--max-new-tokens or choose --engine hf (or vllm)')
    tool_choice: str | None = option(None, "constrain every policy turn to tool calls with xgrammar: 'required' (one "
                                           'or more) or a tool name (one call of it); docs/grammar.md',
                                     metavar='CHOICE', engines=GRAMMAR)
    response_format: str | None = option(None, 'JSON file of an OpenAI response_format ({"type": "json_schema", '
                                               '"json_schema": {"name": ..., "schema": {...}}}) constraining every '
                                               'policy turn with xgrammar; docs/grammar.md', metavar='FILE',
                                         engines=GRAMMAR)
    profile: bool = option(False, "print the hf engine's per-turn time split (prefill, decode, sampling, template, "
                                'gym) and store it in summary.json (in this process: --workers 0)', engines=IN_PROCESS)
    screenshots: bool = option(False, 'answer every read call with a PNG of the source (an image in the tool '
                                      'message) instead of its text: for a vision-language --model (a folder with '
                                      'preprocessor_config.json); images are stored once in OUT/images/',
                               engines=MODEL_DIR,
                               wrong_engine='--screenshots shows read results as images to a vision-language model '
                                            'of --engine hf or vllm; add --engine hf --model DIR (a folder with '
                                            'preprocessor_config.json) or drop --screenshots')

    def __post_init__(self):
        if self.policy is None:
            known = BACKENDS.get(self.engine)                   # an unknown name: validate() refuses it
            self.policy = ['model'] if known is not None and known.model_only else list(POLICIES)
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
        if not 0.0 < self.top_p <= 1.0:       # SamplingSpec checks them too, naming its field, not the flag
            raise ValueError(f'--top-p must be in (0, 1] (got {self.top_p:g}); 1 turns it off')
        if not 0.0 <= self.min_p < 1.0:
            raise ValueError(f'--min-p must be in [0, 1) (got {self.min_p:g}); 0 turns it off')
        self.sampling_spec()                  # any other range: SamplingSpec names the field
        if '' in self.policy:
            raise ValueError(f'--policy {",".join(self.policy)!r} has an empty name; separate the names by single '
                             'commas, e.g. oracle,model')
        bad = [p for p in self.policy if p not in POLICIES]
        if bad or not self.policy:
            raise ValueError(f'--policy {",".join(bad) or "(empty)"} is not known; choose from {",".join(POLICIES)}')
        if len(set(self.policy)) != len(self.policy):
            raise ValueError(f'--policy lists a policy twice ({",".join(self.policy)}); list each once')
        if not self.resume and self.checkpoint and 'model' not in self.policy:
            raise ValueError(f'--checkpoint is the TinyAgent of --policy model (got {",".join(self.policy)}); drop '
                             '--checkpoint for scripted policies, or add model to --policy')
        if self.checkpoint and not os.path.exists(self.checkpoint):
            raise ValueError(f'--checkpoint {self.checkpoint!r} does not exist; pass model.pt from `agentrl train`')
        if self.address and self.workers < 1:
            raise ValueError('--address joins a Ray cluster for the workers; add --workers N (N >= 1)')
        if self.resume and not os.path.isdir(self.resume):
            raise ValueError(f'--resume {self.resume!r} is not a folder; pass the --out folder of a run')
        b = backend(self.engine)
        if not self.resume and b.model_only and 'model' not in self.policy:
            raise ValueError(f'--engine {self.engine} samples only --policy model (got {",".join(self.policy)}); '
                             'drop --engine/--model for scripted policies, or add model to --policy')
        if b.model_dir:
            if not self.model:
                raise ValueError(f'--engine {self.engine} needs --model DIR with config.json (a save_pretrained '
                                 'folder); `agentrl make-test-model OUT` builds a small one')
            if not os.path.isfile(os.path.join(self.model, 'config.json')):
                raise ValueError(f'--engine {self.engine} needs --model DIR with config.json (got {self.model!r}); '
                                 '`agentrl make-test-model OUT` builds a small one')
        if b.servers and not self.server:     # the local server the job would start: refused now if it cannot
            rollout_kit(self.engine).check_local(self.model, self.vllm_python)
        self.constraint(())                   # --tool-choice / --response-format: the file, the names, the backend
        if self.profile and self.workers:
            raise ValueError('--profile times the hf engine in this process; drop --workers')
        if self.screenshots:
            self._check_screenshots(b)

    def _check_screenshots(self, b) -> None:
        """Refuse ``--screenshots`` without a vision-language model or with Ray workers (before anything runs)."""
        if self.workers:
            raise ValueError('--screenshots stores the images from this process (Ray actors do not send them back); '
                             'drop --workers')
        if b.model_dir and self.model and not os.path.isfile(os.path.join(self.model, 'preprocessor_config.json')):
            raise ValueError(f'--screenshots needs a vision-language --model (got {self.model!r}, which has no '
                             'preprocessor_config.json); pass a folder with its image processor (`agentrl '
                             'make-test-model --vision OUT` builds one) or drop --screenshots')

    def sampling_spec(self):
        """The :class:`~agentrl.record.SamplingSpec` of the model policy (either engine).

        Raises:
            ValueError: a field out of the spec's range (the spec names it).
        """
        return SamplingSpec(temperature=max(self.temperature, 0.0), top_k=self.top_k, top_p=self.top_p,
                            min_p=self.min_p)

    def constraint(self, stop_ids):
        """The :class:`~agentrl.constraints.Constraint` of ``--tool-choice`` / ``--response-format`` (None: neither),
        ending on the template's ``stop_ids``.

        Raises:
            ValueError: both flags, an unreadable file, a tool name the gym does not have, xgrammar missing.
        """
        if not self.tool_choice and not self.response_format:
            return None
        if self.tool_choice and self.response_format:
            raise ValueError('--tool-choice and --response-format are two grammars; pass one')
        if not backend_version():
            raise ValueError('--tool-choice / --response-format sample with xgrammar, which is not installed; '
                             'pip install "agentrl[grammar]"')
        if self.tool_choice:
            from ..gym import TOOL_SCHEMAS
            return tool_call_constraint(TOOL_SCHEMAS, self.tool_choice, stop_ids)
        try:
            with open(self.response_format) as f:
                rf = json.load(f)
        except (OSError, ValueError) as e:
            raise ValueError(f'--response-format {self.response_format!r}: {e}; pass a JSON file holding '
                             '{"type": "json_schema", "json_schema": {"name": ..., "schema": {...}}}') from None
        c = response_format_constraint(rf, stop_ids)
        if c is None:
            raise ValueError(f'--response-format {self.response_format!r} is type text, which constrains nothing; '
                             'drop the flag')
        return c


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


def public_options(opts: RolloutOptions) -> dict:
    """The options as stored in a summary: local paths reduced to their last component."""
    d = asdict(opts)
    for k in ('checkpoint', 'model', 'resume', 'out', 'vllm_python'):
        if d.get(k):
            d[k] = Path(d[k]).name
    return d
