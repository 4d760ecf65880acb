"""``agentrl rollout``: the main job. Roll out policies on BugFix tasks and store the records."""
from __future__ import annotations

import json
import math
import os
import time
from dataclasses import asdict, dataclass, field

POLICIES = ('oracle', 'blind', 'random', 'hacker', 'model')
SCRIPTED = ('oracle', 'blind', 'random', 'hacker')
ENGINES = ('tinyagent', 'hf')        # model policy: TinyAgent, or a Hugging Face LM (agentrl.engines.hf)


@dataclass
class RolloutOptions:
    """Options of ``agentrl rollout`` (one field per flag).

    Attributes:
        policy: policies to run, from oracle, blind, random, hacker, model (TinyAgent).
        split: task split: train (24), heldout (6) or all (30).
        repeats: episodes per task and policy.
        seed: seeds the scripted policies' RNG, the TinyAgent initialisation and its sampler.
        out: output folder (``trajectories.parquet``, ``summary.json``).
        checkpoint: TinyAgent checkpoint (``model.pt`` from ``agentrl train``); None = an untrained
            TinyAgent initialised from ``seed``, saved as ``OUT/model.pt`` for replay checks.
        temperature: sampling temperature of the model policy.
        max_turns: turn budget per episode (the gym's is 6).
        reward_tests: ``hidden`` (default) or ``public`` (the hackable reward).
        batch: sample model episodes with ``rollout_batch`` (False: one by one with ``rollout``).
        workers: Ray actors to run the episodes on (0: this process, the single-file output).
            With workers, output is the shard folder ``OUT/trajectories/`` and every episode
            samples from its own seed (:mod:`agentrl.engines.ray_rollout`; extra ``agentrl[ray]``).
        address: Ray cluster to join (``auto`` or ``HOST:PORT``); None starts a local instance.
        resume: a run folder started with ``--workers``: run only its missing episodes there.
        chunk_size: episodes per actor call and per shard (with ``--workers``).
        engine: ``tinyagent`` (default) or ``hf``: the ``model`` policy is then a Hugging Face
            causal LM from ``--model`` driven through real function calling
            (:mod:`agentrl.engines.hf`; extra ``agentrl[hf]``), and the default policy list is ``model``.
        model: ``save_pretrained`` folder for ``--engine hf`` (``agentrl make-test-model OUT`` builds one).
        top_k, top_p, min_p: truncation of the ``hf`` sampler (0, 1.0, 0.0 = off).
        max_new_tokens: token budget of one ``hf`` turn (a turn cut there is truncated: malformed call).
        profile: print the ``hf`` engine's per-turn time split (prefill, decode, sampling,
            template, gym) and store it as ``summary['hf']['profile']``.
    """
    policy: list[str] = field(default_factory=lambda: list(POLICIES))
    split: str = 'all'
    repeats: int = 3
    seed: int = 0
    out: str = 'runs/rollout'
    checkpoint: str | None = None
    temperature: float = 1.0
    max_turns: int = 6
    reward_tests: str = 'hidden'
    batch: bool = True
    # --- scale-out on Ray (agentrl.engines.ray_rollout) ---
    workers: int = 0
    address: str | None = None
    resume: str | None = None
    chunk_size: int = 32
    # --- Hugging Face engine (agentrl.engines.hf) ---
    engine: str = 'tinyagent'
    model: str | None = None
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0
    max_new_tokens: int = 256
    profile: bool = False

    def validate(self) -> None:
        """Raise :class:`~agentrl.cli.main.UserError` naming the bad flag and the fix."""
        from .main import UserError
        bad = [p for p in self.policy if p not in POLICIES]
        if bad or not self.policy:
            raise UserError(f'--policy {",".join(bad) or "(empty)"} is not known; choose from {",".join(POLICIES)}')
        if self.split not in ('train', 'heldout', 'all'):
            raise UserError(f'--split {self.split!r} is not known; choose train, heldout or all')
        if self.repeats < 1:
            raise UserError(f'--repeats must be >= 1, got {self.repeats}')
        if self.max_turns < 1:
            raise UserError(f'--max-turns must be >= 1, got {self.max_turns}')
        if not (math.isfinite(self.temperature) and self.temperature >= 0):
            raise UserError(f'--temperature must be a finite number >= 0 (0 = greedy), got {self.temperature}')
        if self.reward_tests not in ('hidden', 'public'):
            raise UserError(f'--reward-tests {self.reward_tests!r}: choose hidden or public')
        if self.checkpoint and not os.path.exists(self.checkpoint):
            raise UserError(f'--checkpoint {self.checkpoint!r} does not exist; pass model.pt from `agentrl train`')
        # --- scale-out on Ray ---
        if self.workers < 0:
            raise UserError(f'--workers must be >= 0, got {self.workers}')
        if self.chunk_size < 1:
            raise UserError(f'--chunk-size must be >= 1, got {self.chunk_size}')
        if self.address and self.workers < 1:
            raise UserError('--address joins a Ray cluster for the workers; add --workers N (N >= 1)')
        if self.resume and not os.path.isdir(self.resume):
            raise UserError(f'--resume {self.resume!r} is not a folder; pass the --out folder of a --workers run')
        # --- Hugging Face engine ---
        if self.engine not in ENGINES:
            raise UserError(f'--engine {self.engine!r} is not known; choose from {",".join(ENGINES)}')
        if self.engine == 'hf':
            if not self.model or not os.path.isfile(os.path.join(self.model, 'config.json')):
                raise UserError(f'--engine hf needs --model DIR with config.json (got {self.model!r}); '
                                '`agentrl make-test-model OUT` builds a small one')
            if self.workers or self.resume:
                raise UserError('--engine hf runs in this process; drop --workers/--resume')
            if self.checkpoint:
                raise UserError('--checkpoint is a TinyAgent checkpoint; with --engine hf pass --model DIR')
            if self.max_new_tokens < 1:
                raise UserError(f'--max-new-tokens must be >= 1, got {self.max_new_tokens}')
            try:
                self.hf_spec()
            except ValueError as e:
                raise UserError(str(e)) from None
        elif self.model:
            raise UserError('--model is the Hugging Face model of --engine hf; add --engine hf (or use --checkpoint)')
        if self.profile and self.engine != 'hf':
            raise UserError('--profile times the hf engine; add --engine hf --model DIR')

    def hf_spec(self):
        """The :class:`~agentrl.record.SamplingSpec` of ``--engine hf`` (raises ValueError when out of range)."""
        from ..record import SamplingSpec
        return SamplingSpec(temperature=max(self.temperature, 0.0), top_k=self.top_k, top_p=self.top_p,
                            min_p=self.min_p)


def register(sub) -> None:
    """Add this subcommand's parser (every flag documented) to ``sub`` and set ``func=run``."""
    d = RolloutOptions()
    p = sub.add_parser('rollout', help='roll out policies on BugFix tasks and store token-exact records',
                       description='Roll out scripted policies and TinyAgent on BugFix tasks; write '
                                   'OUT/trajectories.parquet (one row per episode) and OUT/summary.json, '
                                   'and print a table per policy.')
    p.add_argument('--policy', default=None,
                   help=f'comma-separated policies from {",".join(POLICIES)} (default: all; with --engine hf: model)')
    p.add_argument('--split', default=d.split, choices=['train', 'heldout', 'all'],
                   help='task split: train (24 tasks), heldout (6) or all (30) (default: all)')
    p.add_argument('--repeats', type=int, default=d.repeats, help='episodes per task and policy (default: 3)')
    p.add_argument('--seed', type=int, default=d.seed,
                   help='seed of the scripted policies, the TinyAgent init and its sampler (default: 0)')
    p.add_argument('--out', default=d.out, help='output folder (default: runs/rollout)')
    p.add_argument('--checkpoint', default=None,
                   help='TinyAgent checkpoint (model.pt from `agentrl train`); default: untrained')
    p.add_argument('--temperature', type=float, default=d.temperature, help='model sampling temperature; 0 = greedy, whose stored log-prob is the argmax at temperature 1 (default: 1.0)')
    p.add_argument('--max-turns', type=int, default=d.max_turns, help='turn budget per episode (default: 6)')
    p.add_argument('--reward-tests', default=d.reward_tests, choices=['hidden', 'public'],
                   help='reward on hidden+public tests (default) or public only (hackable)')
    p.add_argument('--no-batch', dest='batch', action='store_false',
                   help='sample model episodes one by one with rollout() instead of rollout_batch()')
    # --- scale-out on Ray (agentrl.engines.ray_rollout) ---
    p.add_argument('--workers', type=int, default=d.workers,
                   help='run episodes on N Ray actors and stream them to OUT/trajectories/ (shards); '
                        'needs agentrl[ray] (default: 0, this process)')
    p.add_argument('--address', default=None,
                   help='Ray cluster to join with --workers: auto or HOST:PORT (default: start a local instance)')
    p.add_argument('--resume', default=None, metavar='DIR',
                   help='finish a --workers run in DIR: read its shards and run only the missing episodes')
    p.add_argument('--chunk-size', type=int, default=d.chunk_size,
                   help='episodes per actor call and per shard with --workers (default: 32)')
    # --- Hugging Face engine (agentrl.engines.hf) ---
    p.add_argument('--engine', default=d.engine, choices=list(ENGINES),
                   help='model policy: tinyagent (default) or hf, a Hugging Face causal LM from --model '
                        'through real function calling (needs agentrl[hf])')
    p.add_argument('--model', default=None, metavar='DIR',
                   help='save_pretrained folder for --engine hf (`agentrl make-test-model OUT` builds one)')
    p.add_argument('--top-k', type=int, default=d.top_k, help='hf sampler top-k, 0 = off (default: 0)')
    p.add_argument('--top-p', type=float, default=d.top_p, help='hf sampler nucleus mass, 1 = off (default: 1.0)')
    p.add_argument('--min-p', type=float, default=d.min_p, help='hf sampler min-p, 0 = off (default: 0.0)')
    p.add_argument('--max-new-tokens', type=int, default=d.max_new_tokens,
                   help='token budget of one hf turn; a turn cut there is truncated (default: 256)')
    p.add_argument('--profile', action='store_true',
                   help='print the hf engine\'s per-turn time split and store it in summary.json')
    p.set_defaults(func=run)


def options_from_args(args) -> RolloutOptions:
    """Build the options dataclass from the parsed ``args``."""
    policy = args.policy if args.policy is not None else ('model' if args.engine == 'hf' else ','.join(POLICIES))
    return RolloutOptions(policy=[x.strip() for x in policy.split(',') if x.strip()], split=args.split,
                          repeats=args.repeats, seed=args.seed, out=args.out, checkpoint=args.checkpoint,
                          temperature=args.temperature, max_turns=args.max_turns,
                          reward_tests=args.reward_tests, batch=args.batch,
                          workers=args.workers, address=args.address, resume=args.resume,
                          chunk_size=args.chunk_size,
                          engine=args.engine, model=args.model, top_k=args.top_k, top_p=args.top_p,
                          min_p=args.min_p, max_new_tokens=args.max_new_tokens, profile=args.profile)


def run(args) -> int:
    """Run the subcommand for parsed ``args``; return the exit code (errors raise ``UserError``, one line)."""
    opts = options_from_args(args)
    opts.validate()
    summary = run_rollouts(opts)
    print_summary(summary)
    return 0


def _episodes(policy: str, opts: RolloutOptions, tasks, tok, progress, bar, to_save: dict, net=None,
              profile: dict | None = None):
    """Roll out one policy on every task ``repeats`` times -> list of Trajectory.

    ``net``: the TinyAgent loaded from ``opts.checkpoint`` (loaded once, by the caller).
    ``profile``: filled with the hf engine's time split (``--engine hf --profile``).
    """
    import torch

    from .. import gym, model as model_mod, rollouts
    env = lambda: gym.BugFixEnv(max_turns=opts.max_turns, reward_tests=opts.reward_tests)  # noqa: E731
    jobs = [(task, r) for task in tasks for r in range(opts.repeats)]
    if policy in SCRIPTED:
        fn = gym.scripted_policy(policy, seed=opts.seed)
        out = []
        for task, _ in jobs:
            out.append(rollouts.scripted_rollout(fn, env(), task, tok, max_turns=opts.max_turns))
            progress.advance(bar)
        return out
    if opts.engine == 'hf':       # --engine hf: a Hugging Face model through function calling (agentrl.engines.hf)
        from ..engines.hf import bugfix_job
        return bugfix_job(opts.model, [t for t, _ in jobs], spec=opts.hf_spec(), max_new_tokens=opts.max_new_tokens,
                          max_turns=opts.max_turns, reward_tests=opts.reward_tests, seed=opts.seed,
                          on_done=lambda i: progress.advance(bar), profile=profile)
    if opts.checkpoint:
        model_id = os.path.abspath(opts.checkpoint)
    else:
        torch.manual_seed(opts.seed)
        net = model_mod.TinyAgent(tok.vocab_size).eval()
        model_id = os.path.abspath(os.path.join(opts.out, 'model.pt'))
        to_save[model_id] = net      # saved with the records, so `agentrl check --model` replays them
    gen = torch.Generator().manual_seed(opts.seed)
    if opts.batch:
        out = []
        for start in range(0, len(jobs), 256):     # bounded memory per lockstep batch
            chunk = jobs[start:start + 256]
            out += rollouts.rollout_batch(net, [env() for _ in chunk], [t for t, _ in chunk], tok,
                                          max_turns=opts.max_turns, temperature=opts.temperature, generator=gen)
            progress.advance(bar, len(chunk))
    else:
        out = []
        for task, _ in jobs:
            out.append(rollouts.rollout(net, env(), task, tok, max_turns=opts.max_turns,
                                        temperature=opts.temperature, generator=gen))
            progress.advance(bar)
    for t in out:
        t.provenance.model = model_id
    return out


def run_rollouts(opts: RolloutOptions) -> dict:
    """Run every policy of ``opts``; write the Parquet file and summary.json; return the summary."""
    if opts.workers > 0 or opts.resume:   # scale-out on Ray: shards, per-episode seeds, resume
        from ..engines.ray_rollout import rollout_job
        return rollout_job(opts)
    from rich.progress import Progress

    from .. import gym, store, tokenizer
    from ..engines.ray_rollout import plan_episodes
    from ..stats import policy_summary
    tasks = gym.make_tasks(opts.split)
    tok = tokenizer.build_tokenizer(gym.make_tasks('all'))
    net = None
    if 'model' in opts.policy and opts.engine != 'hf' and opts.checkpoint:
        from .. import model as model_mod
        net = model_mod.load_checkpoint(opts.checkpoint)   # a bad file fails here, before the progress display
    os.makedirs(opts.out, exist_ok=True)
    t0 = time.time()
    per_policy, records, to_save = {}, [], {}
    hf_profile = {} if opts.profile and opts.engine == 'hf' else None
    with Progress(transient=True) as progress:
        for policy in opts.policy:
            bar = progress.add_task(f'{policy:<7}', total=len(tasks) * opts.repeats)
            trajs = _episodes(policy, opts, tasks, tok, progress, bar, to_save, net, hf_profile)
            # identities as the Ray job names them (one convention, engines.ray_rollout.plan_episodes)
            for t, job in zip(trajs, plan_episodes([policy], [task.name for task in tasks], opts.repeats, opts.seed)):
                t.provenance.group_id, t.provenance.rollout_id = job.group_id, job.rollout_id
            hf_model = policy == 'model' and opts.engine == 'hf'     # its tokenizer is not the word-level one
            per_policy[policy] = policy_summary(trajs, unk_id=None if hf_model else tok.unk_id)
            records += trajs
    path = os.path.join(opts.out, 'trajectories.parquet')
    store.write_trajectories(path, records)
    from ..model import save_checkpoint
    for model_path, net in to_save.items():      # only now: an interrupted run leaves the old pair intact
        save_checkpoint(net, model_path)
    summary = {'options': asdict(opts), 'tasks': len(tasks), 'episodes': len(records),
               'seconds': round(time.time() - t0, 3), 'trajectories': path,
               'tokenizer': tok.fingerprint(), 'vocab_size': tok.vocab_size, 'policies': per_policy}
    hf_prov = next((t.provenance for t in records if t.provenance.policy == 'hf'), None)
    if hf_prov is not None:       # --engine hf: the model policy's own tokenizer, template and sampler
        summary['hf'] = {'model': hf_prov.model, 'tokenizer': hf_prov.tokenizer, 'template': hf_prov.template,
                         'sampling': hf_prov.sampling.to_dict()}
        if hf_profile:
            summary['hf']['profile'] = hf_profile
    tmp = os.path.join(opts.out, f'.summary.json.tmp-{os.getpid()}')
    with open(tmp, 'w') as f:
        json.dump(summary, f, indent=2)
    os.replace(tmp, os.path.join(opts.out, 'summary.json'))
    return summary


def print_summary(summary: dict) -> None:
    """Print the per-policy table and a one-line summary."""
    from rich.console import Console
    from rich.table import Table
    table = Table(title=f"{summary['episodes']} episodes on {summary['tasks']} tasks")
    for col in ['policy', 'episodes', 'reward', 'stops', 'trunc', 'len mean', 'len max', 'action',
                'unk obs', 'context/turn (ep. 0)']:
        table.add_column(col, justify='left' if col in ('policy', 'stops') else 'right')
    for name, s in summary['policies'].items():
        stops = ' '.join(f'{k}:{v}' for k, v in s['stops'].items())
        table.add_row(name, str(s['episodes']), f"{s['mean_reward']:.3f}", stops, f"{s['truncation_rate']:.2f}",
                      f"{s['length_mean']:.1f}", str(s['length_max']), f"{s['action_tokens_mean']:.1f}",
                      str(s['unknown_obs_tokens']), f"{s['prompt_length']}:" + ','.join(map(str, s['first_context_lengths'])))
    console = Console()
    if not console.is_terminal:          # piped or captured: do not squeeze the table to 80 columns
        console = Console(width=140)
    console.print(table)
    console.print(f"wrote {summary['episodes']} episodes to {summary['trajectories']} in {summary['seconds']:.1f} s")
    if summary.get('hf', {}).get('profile'):
        from ..engines.hf import format_profile
        print(format_profile(summary['hf']['profile']))
