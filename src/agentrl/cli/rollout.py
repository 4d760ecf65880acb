"""``agentrl rollout``: the main job. Roll out policies on BugFix tasks and store the records."""
from __future__ import annotations

import json
import os
import time
from dataclasses import asdict, dataclass, field

POLICIES = ('oracle', 'blind', 'random', 'hacker', 'model')
SCRIPTED = ('oracle', 'blind', 'random', 'hacker')


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

    def validate(self) -> None:
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
        if self.reward_tests not in ('hidden', 'public'):
            raise UserError(f'--reward-tests {self.reward_tests!r}: choose hidden or public')
        if self.checkpoint and not os.path.exists(self.checkpoint):
            raise UserError(f'--checkpoint {self.checkpoint!r} does not exist; pass model.pt from `agentrl train`')


def register(sub) -> None:
    d = RolloutOptions()
    p = sub.add_parser('rollout', help='roll out policies on BugFix tasks and store token-exact records',
                       description='Roll out scripted policies and TinyAgent on BugFix tasks; write '
                                   'OUT/trajectories.parquet (one row per episode) and OUT/summary.json, '
                                   'and print a table per policy.')
    p.add_argument('--policy', default=','.join(d.policy),
                   help=f'comma-separated policies from {",".join(POLICIES)} (default: all)')
    p.add_argument('--split', default=d.split, choices=['train', 'heldout', 'all'],
                   help='task split: train (24 tasks), heldout (6) or all (30) (default: all)')
    p.add_argument('--repeats', type=int, default=d.repeats, help='episodes per task and policy (default: 3)')
    p.add_argument('--seed', type=int, default=d.seed,
                   help='seed of the scripted policies, the TinyAgent init and its sampler (default: 0)')
    p.add_argument('--out', default=d.out, help='output folder (default: runs/rollout)')
    p.add_argument('--checkpoint', default=None,
                   help='TinyAgent checkpoint (model.pt from `agentrl train`); default: untrained')
    p.add_argument('--temperature', type=float, default=d.temperature, help='model sampling temperature (default: 1.0)')
    p.add_argument('--max-turns', type=int, default=d.max_turns, help='turn budget per episode (default: 6)')
    p.add_argument('--reward-tests', default=d.reward_tests, choices=['hidden', 'public'],
                   help='reward on hidden+public tests (default) or public only (hackable)')
    p.add_argument('--no-batch', dest='batch', action='store_false',
                   help='sample model episodes one by one with rollout() instead of rollout_batch()')
    p.set_defaults(func=run)


def options_from_args(args) -> RolloutOptions:
    return RolloutOptions(policy=[x.strip() for x in args.policy.split(',') if x.strip()], split=args.split,
                          repeats=args.repeats, seed=args.seed, out=args.out, checkpoint=args.checkpoint,
                          temperature=args.temperature, max_turns=args.max_turns,
                          reward_tests=args.reward_tests, batch=args.batch)


def run(args) -> int:
    opts = options_from_args(args)
    opts.validate()
    summary = run_rollouts(opts)
    print_summary(summary)
    return 0


def _episodes(policy: str, opts: RolloutOptions, tasks, tok, progress, bar):
    """Roll out one policy on every task ``repeats`` times -> list of Trajectory."""
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
    if opts.checkpoint:
        net = model_mod.load_checkpoint(opts.checkpoint)
        model_id = os.path.abspath(opts.checkpoint)
    else:
        torch.manual_seed(opts.seed)
        net = model_mod.TinyAgent(tok.vocab_size).eval()
        model_id = os.path.abspath(os.path.join(opts.out, 'model.pt'))
        model_mod.save_checkpoint(net, model_id)     # so `agentrl check --model` can replay the records
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
    from rich.progress import Progress

    from .. import gym, store, tokenizer
    from ..stats import policy_summary
    tasks = gym.make_tasks(opts.split)
    tok = tokenizer.build_tokenizer(gym.make_tasks('all'))
    os.makedirs(opts.out, exist_ok=True)
    t0 = time.time()
    per_policy, records = {}, []
    with Progress(transient=True) as progress:
        for policy in opts.policy:
            bar = progress.add_task(f'{policy:<7}', total=len(tasks) * opts.repeats)
            trajs = _episodes(policy, opts, tasks, tok, progress, bar)
            for i, t in enumerate(trajs):
                task = tasks[i // opts.repeats]
                t.provenance.group_id = f'{opts.seed}/{policy}/{task.name}'
                t.provenance.rollout_id = f'{opts.seed}/{policy}/{task.name}/{i % opts.repeats}'
            per_policy[policy] = policy_summary(trajs, unk_id=tok.unk_id)
            records += trajs
    path = os.path.join(opts.out, 'trajectories.parquet')
    store.write_trajectories(path, records)
    summary = {'options': asdict(opts), 'tasks': len(tasks), 'episodes': len(records),
               'seconds': round(time.time() - t0, 3), 'trajectories': path,
               'tokenizer': tok.fingerprint(), 'vocab_size': tok.vocab_size, 'policies': per_policy}
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
