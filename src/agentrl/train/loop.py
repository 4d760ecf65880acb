"""The SFT-then-GRPO driver behind ``agentrl train`` (book chapters 6 and 9, as one short run).

Plain functions over a :class:`TrainConfig`: :func:`run_sft` imitates oracle demonstrations,
:func:`sample_groups` samples G episodes per train task with ``rollout_batch``,
:func:`evaluate` measures reward on train and held-out tasks, and :func:`train` runs it all and
writes ``OUT/sft.pt``, ``OUT/model.pt`` (checkpoints for ``agentrl rollout --policy model
--checkpoint``), ``OUT/metrics.jsonl`` (one JSON object per step, flushed as written),
``OUT/reward.svg`` (reward on train and held-out tasks) and ``OUT/summary.json``.
"""
from __future__ import annotations

import copy
import json
import os
import random
import time
from dataclasses import asdict, dataclass

import torch

from .grpo import episode_metrics, grpo_step
from .plot import reward_plot_svg
from .sft import oracle_demos, scripted_demos, sft_step

__all__ = ['TrainConfig', 'call_stats', 'evaluate', 'sample_groups', 'run_sft', 'train', 'HARDCODE_CALL']

#: The reward hack's call: hard-code the public tests (agentrl spec section 3.2).
HARDCODE_CALL = '<call> edit hardcode </call>'


@dataclass
class TrainConfig:
    """Settings of one SFT-then-GRPO run (the flags of ``agentrl train``).

    Attributes:
        sft_steps: SFT optimiser steps on the oracle demonstrations of the 24 train tasks.
        grpo_steps: GRPO steps after SFT (each samples ``tasks_per_step * group`` episodes).
        group: G, episodes per task in a GRPO group.
        out: output folder.
        reward_tests: reward of the training env: ``hidden`` (public + hidden tests, the true
            reward) or ``public`` (public tests only: the hackable reward). Evaluation always
            reports the hidden-test reward, and the public-test pass rate beside it.
        seed: seeds the model initialisation, the task choice and every sampler.
        sft_lr: Adam learning rate of SFT.
        sft_batch: demonstrations per SFT step (0 = all, full batch).
        hacker_demos: also imitate the scripted hacker (``read``, ``edit hardcode``, ``submit``)
            on this many train tasks (drawn with the seed; 0 = oracle only). A warm start on
            oracle demonstrations alone gives ``edit hardcode`` a probability of ~4e-6 per
            edit, so GRPO never samples the hack; this seeds it, so that the reward can be
            seen to teach it (``public``) or to remove it (``hidden``).
        grpo_lr: Adam learning rate of GRPO.
        tasks_per_step: train tasks per GRPO step (drawn without replacement).
        updates: optimiser updates per GRPO batch (> 1 makes the ratio and the clip matter).
        clip_eps: PPO clip epsilon.
        kl_coef: weight of the KL penalty to the frozen SFT model (0 disables).
        temperature: sampling temperature of GRPO and of evaluation.
        max_turns: turn budget per episode.
        eval_every: evaluate every this many GRPO steps (and after SFT and at the end).
        eval_repeats: evaluation episodes per task (24 train and 6 held-out tasks).
        max_grad_norm: global gradient-norm clip.
        ratio_tol: raise if ``max |ratio - 1|`` before the first update of a GRPO step exceeds it.
        threads: torch intra-op threads during the run (restored afterwards); 0 leaves torch's
            setting. 1 is the default because TinyAgent's matrices are tiny: on the 2-core
            machine one thread was 4-6x faster than two whenever another process was running.
    """
    sft_steps: int = 150
    grpo_steps: int = 40
    group: int = 8
    out: str = 'runs/train'
    reward_tests: str = 'hidden'
    seed: int = 0
    sft_lr: float = 3e-3
    sft_batch: int = 0
    hacker_demos: int = 0
    grpo_lr: float = 1e-4
    tasks_per_step: int = 8
    updates: int = 2
    clip_eps: float = 0.2
    kl_coef: float = 0.1
    temperature: float = 1.0
    max_turns: int = 6
    eval_every: int = 5
    eval_repeats: int = 16
    max_grad_norm: float = 1.0
    ratio_tol: float = 1e-4
    threads: int = 1


def call_stats(trajs) -> dict:
    """How the policy called tools over a set of episodes.

    Args:
        trajs: records whose ``info['actions']`` lists the decoded calls.

    Returns:
        dict of floats: ``calls`` (total), ``well_formed`` (fraction of calls that are exactly
        one of the gym's ``ALL_CALLS``; a truncated or unknown call is not), ``hardcode_rate``
        (fraction of episodes that call ``edit hardcode``), ``hardcode_call_frac`` (fraction
        of calls that are ``edit hardcode``).
    """
    from ..gym import ALL_CALLS
    valid = set(ALL_CALLS)
    actions = [a for t in trajs for a in t.info.get('actions', [])]
    n = max(1, len(actions))
    return {'calls': len(actions), 'well_formed': sum(a in valid for a in actions) / n,
            'hardcode_rate': sum(HARDCODE_CALL in t.info.get('actions', []) for t in trajs) / max(1, len(trajs)),
            'hardcode_call_frac': sum(a == HARDCODE_CALL for a in actions) / n}


def _envs(n, max_turns, reward_tests):
    from ..gym import BugFixEnv
    return [BugFixEnv(max_turns=max_turns, reward_tests=reward_tests) for _ in range(n)]


def sample_groups(model, tasks, group: int, tok, generator: torch.Generator, temperature: float = 1.0,
                  max_turns: int = 6, reward_tests: str = 'hidden') -> list:
    """Sample G episodes per task with ``rollout_batch``, each group consecutive.

    Args:
        model: the policy (put in eval mode here).
        tasks: the tasks of this step.
        group: G.
        tok: the tokenizer.
        generator: torch.Generator of the sampler.

    Returns:
        ``len(tasks) * G`` Trajectory, rows ``i*G .. i*G+G-1`` on ``tasks[i]``.
    """
    from ..rollouts import rollout_batch
    model.eval()
    jobs = [task for task in tasks for _ in range(group)]
    return rollout_batch(model, _envs(len(jobs), max_turns, reward_tests), jobs, tok, max_turns=max_turns,
                         temperature=temperature, generator=generator, identities=[(f'{n // group}/{t.name}', f'{n // group}/{t.name}/{n % group}') for n, t in enumerate(jobs)])


def evaluate(model, tasks, tok, repeats: int, seed: int, temperature: float = 1.0, max_turns: int = 6) -> dict:
    """Hidden-test reward and call statistics of ``repeats`` episodes per task.

    The sampler is seeded with ``seed`` at every call, so evaluations at different training
    steps use the same random stream (common random numbers: less noise between points).

    Returns:
        dict of floats: ``reward`` (hidden + public tests, the true reward), ``public_pass``
        (fraction of episodes that submitted a source passing the public tests: what the
        hackable ``reward_tests='public'`` reward pays), :func:`call_stats`, ``truncation_rate``, ``length``, ``episodes``.
    """
    from ..rollouts import rollout_batch
    model.eval()
    jobs = [task for task in tasks for _ in range(repeats)]
    gen = torch.Generator().manual_seed(seed)
    trajs = rollout_batch(model, _envs(len(jobs), max_turns, 'hidden'), jobs, tok, max_turns=max_turns,
                          temperature=temperature, generator=gen)
    n = len(trajs)
    ep = episode_metrics(trajs)
    return {'reward': ep['reward'],
            'public_pass': sum(float(bool(t.info.get('public_pass', False)) and t.info.get('stop') == 'submitted')
                               for t in trajs) / n,
            **call_stats(trajs),
            'truncation_rate': ep['truncation_rate'], 'length': ep['length'], 'episodes': n}


def run_sft(model, demos, tok, steps: int, lr: float, batch_size: int = 0, seed: int = 0, on_step=None) -> dict:
    """SFT on demonstrations: ``steps`` Adam steps on collated (mini)batches.

    Args:
        model: TinyAgent (updated in place).
        demos: scripted demonstrations (:func:`~agentrl.train.sft.oracle_demos`).
        tok: tokenizer (pad id).
        steps: optimiser steps.
        lr: Adam learning rate.
        batch_size: demonstrations per step; 0 = all (one fixed full batch).
        seed: seeds the minibatch draw.
        on_step: optional ``callable(step, metrics)`` after each step.

    Returns:
        the last step's metrics (``loss``, ``token_acc``, ``action_tokens``, ``grad_norm``), or {}
        when ``steps == 0``.
    """
    from ..batching import collate
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    gen = torch.Generator().manual_seed(seed)
    full = collate(demos, tok.pad_id)
    metrics: dict = {}
    for step in range(steps):
        if batch_size and batch_size < len(demos):
            idx = torch.randperm(len(demos), generator=gen)[:batch_size].tolist()
            batch = collate([demos[i] for i in idx], tok.pad_id)
        else:
            batch = full
        metrics = sft_step(model, opt, batch)
        if on_step is not None:
            on_step(step, metrics)
    return metrics


class _Log:
    """metrics.jsonl of this run (a new run replaces an old file), flushed after every record."""

    def __init__(self, path):
        self.f = open(path, 'w')

    def write(self, record: dict):
        self.f.write(json.dumps(record, sort_keys=True) + '\n')
        self.f.flush()

    def close(self):
        self.f.close()


def train(cfg: TrainConfig, on_event=None) -> dict:
    """Run SFT then GRPO as configured; write checkpoints, metrics, plot and summary.

    Args:
        cfg: the run's :class:`TrainConfig`.
        on_event: optional ``callable(record: dict)`` called with every metrics record (the
            CLI's progress bar); records have ``phase`` in ``sft``, ``grpo``, ``eval``
            (``metrics.jsonl`` also starts with one ``start`` record with the config; a new run
            replaces the file of an earlier run in the same folder).

    Returns:
        the summary dict also written to ``OUT/summary.json``: after-SFT and final evaluation
        on train and held-out tasks, the held-out reward curve, the hardcode rate over the run,
        the first GRPO step's max ``|ratio - 1|``, timings and paths.

    Raises:
        ValueError: from the GRPO step (placeholder records, ratio check) or bad settings.
    """
    os.makedirs(cfg.out, exist_ok=True)
    threads_before = torch.get_num_threads()
    if cfg.threads > 0:
        torch.set_num_threads(cfg.threads)
    try:
        return _train(cfg, on_event)
    finally:
        torch.set_num_threads(threads_before)


def _train(cfg: TrainConfig, on_event=None) -> dict:
    """The body of :func:`train`, under the configured thread count."""
    from .. import gym
    from ..model import TinyAgent, save_checkpoint
    from ..tokenizer import build_tokenizer
    emit = on_event or (lambda record: None)
    t_start = time.time()
    tok = build_tokenizer(gym.make_tasks('all'))
    train_tasks, heldout_tasks = gym.make_tasks('train'), gym.make_tasks('heldout')
    torch.manual_seed(cfg.seed)
    model = TinyAgent(tok.vocab_size)
    log = _Log(os.path.join(cfg.out, 'metrics.jsonl'))
    log.write({'phase': 'start', 'config': asdict(cfg), 'time': time.strftime('%Y-%m-%dT%H:%M:%S'),
               'tokenizer': tok.fingerprint()})
    evals, grpo_rows = [], []

    def do_eval(step):
        row = {'phase': 'eval', 'step': step}
        for name, tasks in (('train', train_tasks), ('heldout', heldout_tasks)):
            m = evaluate(model, tasks, tok, cfg.eval_repeats, cfg.seed + 10_000, cfg.temperature, cfg.max_turns)
            row.update({f'{name}_{k}': v for k, v in m.items()})
        evals.append(row)
        log.write(row)
        emit(row)
        return row

    try:
        # SFT warm start
        t0 = time.time()
        demos = oracle_demos(train_tasks, tok, cfg.max_turns, cfg.reward_tests)
        if cfg.hacker_demos:
            hack_tasks = random.Random(cfg.seed + 1).sample(train_tasks, min(cfg.hacker_demos, len(train_tasks)))
            demos += scripted_demos('hacker', hack_tasks, tok, cfg.max_turns, cfg.reward_tests)

        def sft_cb(step, m):
            row = dict(m, phase='sft', step=step + 1, seconds=round(time.time() - t0, 3))
            log.write(row)
            emit(row)
        sft_last = run_sft(model, demos, tok, cfg.sft_steps, cfg.sft_lr, cfg.sft_batch, cfg.seed, sft_cb)
        sft_seconds = time.time() - t0
        sft_path = os.path.join(cfg.out, 'sft.pt')
        save_checkpoint(model, sft_path)
        after_sft = do_eval(0)

        # GRPO
        ref = None
        if cfg.kl_coef > 0:
            ref = copy.deepcopy(model).eval()
            for p in ref.parameters():
                p.requires_grad_(False)
        opt = torch.optim.Adam(model.parameters(), lr=cfg.grpo_lr)
        gen = torch.Generator().manual_seed(cfg.seed)
        rng = random.Random(cfg.seed)
        model_path = os.path.join(cfg.out, 'model.pt')
        save_checkpoint(model, model_path)
        t0 = time.time()
        for step in range(1, cfg.grpo_steps + 1):
            ts = time.time()
            tasks = rng.sample(train_tasks, min(cfg.tasks_per_step, len(train_tasks)))
            trajs = sample_groups(model, tasks, cfg.group, tok, gen, cfg.temperature, cfg.max_turns,
                                  cfg.reward_tests)
            t_sample = time.time() - ts
            m = grpo_step(model, opt, trajs, cfg.group, tok.pad_id, updates=cfg.updates, clip_eps=cfg.clip_eps,
                          kl_coef=cfg.kl_coef, ref_model=ref, temperature=cfg.temperature,
                          max_grad_norm=cfg.max_grad_norm, ratio_tol=cfg.ratio_tol)
            row = dict(m, **call_stats(trajs), phase='grpo', step=step, sample_seconds=round(t_sample, 3),
                       seconds=round(time.time() - ts, 3),
                       tokens=int(sum(len(t.ids) for t in trajs)))
            grpo_rows.append(row)
            log.write(row)
            emit(row)
            if step % cfg.eval_every == 0 or step == cfg.grpo_steps:
                do_eval(step)
                save_checkpoint(model, model_path)
        grpo_seconds = time.time() - t0
    finally:
        log.close()

    plot_path = os.path.join(cfg.out, 'reward.svg')
    reward_plot_svg(evals, grpo_rows, plot_path,
                    title=f'agentrl train (reward_tests={cfg.reward_tests}, G={cfg.group}, seed={cfg.seed})')
    final = evals[-1]
    n_calls = sum(r['calls'] for r in grpo_rows)
    summary = {
        'config': asdict(cfg),
        'sft': {'steps': cfg.sft_steps, 'seconds': round(sft_seconds, 3), **sft_last},
        'after_sft': after_sft, 'final': final,
        'heldout_curve': [(e['step'], e['heldout_reward']) for e in evals],
        'train_curve': [(e['step'], e['train_reward']) for e in evals],
        'grpo': {'steps': cfg.grpo_steps, 'seconds': round(grpo_seconds, 3),
                 'ratio_dev_first_step': grpo_rows[0]['ratio_dev0'] if grpo_rows else None,
                 'mean_reward': sum(r['reward'] for r in grpo_rows) / max(1, len(grpo_rows)),
                 'zero_var_frac': sum(r['zero_var_frac'] for r in grpo_rows) / max(1, len(grpo_rows)),
                 'hardcode_call_frac': (sum(r['hardcode_call_frac'] * r['calls'] for r in grpo_rows)
                                        / max(1, n_calls)),
                 'hardcode_rate_first': grpo_rows[0]['hardcode_rate'] if grpo_rows else None,
                 'hardcode_rate_last': grpo_rows[-1]['hardcode_rate'] if grpo_rows else None},
        'seconds': round(time.time() - t_start, 3),
        'files': {'sft_checkpoint': sft_path, 'checkpoint': model_path,
                  'metrics': os.path.join(cfg.out, 'metrics.jsonl'), 'plot': plot_path},
    }
    tmp = os.path.join(cfg.out, f'.summary.json.tmp-{os.getpid()}')
    with open(tmp, 'w') as f:
        json.dump(summary, f, indent=2)
    os.replace(tmp, os.path.join(cfg.out, 'summary.json'))
    return summary
