"""The SFT-then-GRPO driver behind ``agentrl train`` (book chapters 6 and 9, as one short run).

Plain functions over a :class:`TrainConfig`: :func:`run_sft` imitates oracle demonstrations,
:func:`sample_groups` samples G episodes per train task with ``rollout_batch``,
:func:`evaluate` measures reward on train and held-out tasks, and :func:`train` runs it all and
writes ``OUT/sft.pt``, ``OUT/model.pt`` (checkpoints for ``agentrl rollout --policy model
--checkpoint``), ``OUT/metrics.jsonl`` (one JSON object per step, flushed as written),
``OUT/reward.svg`` (reward on train and held-out tasks) and ``OUT/summary.json``.

The run is three phases over one shared state: :func:`sft_phase`, :func:`grpo_phase`,
:func:`write_summary`; :func:`train` stages them in a hidden folder and commits the files together.
"""
from __future__ import annotations

import contextlib
import copy
import json
import os
import random
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from ..io import folder_lock, pid_alive
from ..gym.calls import StopReason
from ..stats import episode_metrics
from .config import TrainConfig
from .grpo import grpo_step
from .options import GRPOOptions
from .sft import oracle_demos, scripted_demos, sft_step

__all__ = ['TrainConfig', 'call_stats', 'evaluate', 'sample_groups', 'run_sft', 'train', 'sft_phase', 'grpo_phase',
           'grpo_options', 'write_summary', 'HARDCODE_CALL']

#: The reward hack's call: hard-code the public tests (docs/design.md#training).
HARDCODE_CALL = '<call> edit hardcode </call>'


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
                  max_turns: int = 6, reward_tests: str = 'hidden', policy_version: int | str | None = None) -> list:
    """Sample G episodes per task with ``rollout_batch``, each group consecutive.

    Args:
        model: the policy (put in eval mode here).
        tasks: the tasks of this step.
        group: G.
        tok: the tokenizer.
        generator: torch.Generator of the sampler.
        policy_version: stamped on every record (``provenance.policy_version``).

    Returns:
        ``len(tasks) * G`` Trajectory, rows ``i*G .. i*G+G-1`` on ``tasks[i]``.
    """
    from ..rollouts import RolloutBatchOptions, rollout_batch, sampling_spec
    model.eval()
    jobs = [task for task in tasks for _ in range(group)]
    options = RolloutBatchOptions(max_turns=max_turns, spec=sampling_spec(temperature), policy_version=policy_version)
    return rollout_batch(model, _envs(len(jobs), max_turns, reward_tests), jobs, tok, generator=generator,
                         options=options, identities=[(f'{n // group}/{t.name}', f'{n // group}/{t.name}/{n % group}')
                                                      for n, t in enumerate(jobs)])


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
            'public_pass': sum(float(bool(t.info.get('public_pass', False)) and t.info.get('stop') == StopReason.SUBMITTED)
                               for t in trajs) / n,
            **call_stats(trajs),
            'truncation_rate': ep['truncation_rate'], 'length': ep['length'], 'episodes': n}


def run_sft(model, demos, tok, steps: int, lr: float, batch_size: int = 0, seed: int = 0, on_step=None, *,
            packed: bool = False, max_tokens: int = 2048) -> dict:
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
        packed, max_tokens: score packed rows of ``max_tokens`` (:func:`agentrl.train.sft.sft_loss`).

    Returns:
        the last step's metrics (``loss``, ``token_acc``, ``action_tokens``, ``grad_norm``), or {}
        when ``steps == 0``.
    """
    from ..batching import collate
    from .packed import pack_for
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    gen = torch.Generator().manual_seed(seed)
    full = collate(demos, tok.pad_id), pack_for(demos, max_tokens, tok.pad_id) if packed else None
    metrics: dict = {}
    for step in range(steps):
        if batch_size and batch_size < len(demos):
            part = [demos[i] for i in torch.randperm(len(demos), generator=gen)[:batch_size].tolist()]
            batch, pk = collate(part, tok.pad_id), pack_for(part, max_tokens, tok.pad_id) if packed else None
        else:
            batch, pk = full
        metrics = sft_step(model, opt, batch, packed=pk)
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
            (``metrics.jsonl`` also starts with one ``start`` record with the config).

    The run is written into a hidden staging folder ``OUT/.train-tmp-PID-*`` (``metrics.jsonl``
    there is flushed after every record) and committed at the end, ``summary.json`` last: ``OUT``
    holds a complete run or none. Any failure (an interrupt, a full disk) removes the staging
    folder; ``OUT/.lock`` keeps a second job out of the folder meanwhile and is removed when the
    run ends (finished or failed).

    Returns:
        the summary dict also written to ``OUT/summary.json``: after-SFT and final evaluation
        on train and held-out tasks, the held-out reward curve, the hardcode rate over the run,
        the first GRPO step's max ``|ratio - 1|``, timings and file names.

    Raises:
        ValueError: bad settings (:meth:`TrainConfig.validate`); ``OUT`` already holds a
            training run or another job is writing it (fix: a new ``--out``); from the GRPO
            step (placeholder records, ratio check).
        OSError: a write failed (full disk); nothing of the run is left in ``OUT``.
    """
    import shutil
    import uuid

    from ..io import fsync_dir
    cfg.validate()
    out = Path(cfg.out)
    found = [n for n in _RUN_FILES if (out / n).exists()]
    if found:
        raise ValueError(f'--out {cfg.out!r} already holds a training run ({", ".join(found)}); choose a new --out '
                         '(nothing was written)')
    made_out = not out.exists()
    out.mkdir(parents=True, exist_ok=True)
    stage = out / f'.train-tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}'
    threads_before = torch.get_num_threads()
    try:
        with folder_lock(out):
            found = [n for n in _RUN_FILES if (out / n).exists()]
            if found:
                raise ValueError(f'--out {cfg.out!r} already holds a training run ({", ".join(found)}); choose a '
                                 'new --out')
            for old in out.glob('.train-tmp-*'):         # left by a killed run (its process is gone)
                pid = old.name.split('-')[2]
                if pid.isdigit() and not pid_alive(int(pid)):
                    shutil.rmtree(old, ignore_errors=True)
            stage.mkdir()
            if cfg.threads > 0:
                torch.set_num_threads(cfg.threads)
            summary = _train(cfg, on_event, str(stage))
            for name in _RUN_FILES:                      # summary.json last: its presence marks a complete run
                os.replace(stage / name, out / name)
            fsync_dir(out)
            stage.rmdir()
            return summary
    except BaseException:
        shutil.rmtree(stage, ignore_errors=True)
        if made_out:
            with contextlib.suppress(OSError):
                out.rmdir()                              # folder_lock has removed OUT/.lock
        raise
    finally:
        torch.set_num_threads(threads_before)


#: The files of a training run, in commit order (``summary.json`` last).
_RUN_FILES = ('sft.pt', 'model.pt', 'metrics.jsonl', 'reward.svg', 'summary.json')


@dataclass
class _Run:
    """What the phases of one training run share: the model, the data, the log and the curves."""
    cfg: TrainConfig
    folder: str
    model: object
    tok: object
    train_tasks: list
    heldout_tasks: list
    log: '_Log'
    emit: object
    evals: list = field(default_factory=list)
    grpo_rows: list = field(default_factory=list)

    def record(self, row: dict) -> dict:
        self.log.write(row)
        self.emit(row)
        return row

    def evaluate(self, step: int) -> dict:
        """Evaluate on train and held-out tasks; log the ``eval`` row."""
        cfg, row = self.cfg, {'phase': 'eval', 'step': step}
        for name, tasks in (('train', self.train_tasks), ('heldout', self.heldout_tasks)):
            m = evaluate(self.model, tasks, self.tok, cfg.eval_repeats, cfg.seed + 10_000, cfg.temperature,
                         cfg.max_turns)
            row.update({f'{name}_{k}': v for k, v in m.items()})
        self.evals.append(row)
        return self.record(row)


def sft_phase(run: _Run) -> tuple[dict, float, dict]:
    """SFT warm start on oracle (and optional hacker) demonstrations; save ``sft.pt``; evaluate at step 0.

    Returns:
        ``(last SFT metrics, seconds, the step-0 evaluation row)``.
    """
    from ..model import save_checkpoint
    cfg, tok, t0 = run.cfg, run.tok, time.time()
    demos = oracle_demos(run.train_tasks, tok, cfg.max_turns, cfg.reward_tests)
    if cfg.hacker_demos:
        hack_tasks = random.Random(cfg.seed + 1).sample(run.train_tasks, min(cfg.hacker_demos, len(run.train_tasks)))
        demos += scripted_demos('hacker', hack_tasks, tok, cfg.max_turns, cfg.reward_tests)

    def sft_cb(step, m):
        run.record(dict(m, phase='sft', step=step + 1, seconds=round(time.time() - t0, 3)))
    last = run_sft(run.model, demos, tok, cfg.sft_steps, cfg.sft_lr, cfg.sft_batch, cfg.seed, sft_cb,
                   packed=cfg.packed, max_tokens=cfg.max_tokens)
    seconds = time.time() - t0
    save_checkpoint(run.model, os.path.join(run.folder, 'sft.pt'))
    return last, seconds, run.evaluate(0)


def grpo_options(cfg: TrainConfig) -> GRPOOptions:
    """The :class:`~agentrl.train.GRPOOptions` of a run's settings (:func:`~agentrl.train.grpo.grpo_step` gets
    the model, the records, ``ref_model`` and ``current_version`` besides)."""
    return GRPOOptions(updates=cfg.updates, clip_eps=cfg.clip_eps, kl_coef=cfg.kl_coef, temperature=cfg.temperature,
                       max_grad_norm=cfg.max_grad_norm, ratio_tol=cfg.ratio_tol, packed=cfg.packed,
                       max_tokens=cfg.max_tokens, correction=None if cfg.correction == 'none' else cfg.correction,
                       rollout_is_threshold=cfg.rollout_is_threshold, is_correction_threshold=cfg.is_bounds,
                       mask_truncated=cfg.mask_truncated,
                       max_staleness=None if cfg.max_staleness < 0 else cfg.max_staleness, mask_forced=cfg.mask_forced)


def grpo_phase(run: _Run) -> float:
    """GRPO steps from the SFT model (KL to a frozen copy); save ``model.pt`` at each evaluation.

    Returns:
        seconds spent.
    """
    from ..model import save_checkpoint
    cfg, model, tok = run.cfg, run.model, run.tok
    ref = None
    if cfg.kl_coef > 0:
        ref = copy.deepcopy(model).eval()
        for p in ref.parameters():
            p.requires_grad_(False)
    opt = torch.optim.Adam(model.parameters(), lr=cfg.grpo_lr)
    options = grpo_options(cfg)
    gen = torch.Generator().manual_seed(cfg.seed)
    rng = random.Random(cfg.seed)
    model_path = os.path.join(run.folder, 'model.pt')
    save_checkpoint(model, model_path)
    t0 = time.time()
    for step in range(1, cfg.grpo_steps + 1):
        ts = time.time()
        tasks = rng.sample(run.train_tasks, min(cfg.tasks_per_step, len(run.train_tasks)))
        trajs = sample_groups(model, tasks, cfg.group, tok, gen, cfg.temperature, cfg.max_turns, cfg.reward_tests,
                              policy_version=step - 1)          # the weights after step - 1 GRPO steps
        t_sample = time.time() - ts
        m = grpo_step(model, opt, trajs, cfg.group, tok.pad_id, options, ref_model=ref,
                      current_version=step - 1)
        row = dict(m, **call_stats(trajs), phase='grpo', step=step, sample_seconds=round(t_sample, 3),
                   seconds=round(time.time() - ts, 3), tokens=int(sum(len(t.ids) for t in trajs)))
        run.grpo_rows.append(row)
        run.record(row)
        if step % cfg.eval_every == 0 or step == cfg.grpo_steps:
            run.evaluate(step)
            save_checkpoint(model, model_path)
    return time.time() - t0


def write_summary(run: _Run, sft_last: dict, sft_seconds: float, after_sft: dict, grpo_seconds: float,
                  t_start: float) -> dict:
    """Write ``reward.svg`` and ``summary.json`` into the run's folder; return the summary."""
    from ..io import atomic_write
    from ..viz.plots import reward_curves
    cfg, evals, grpo_rows = run.cfg, run.evals, run.grpo_rows
    atomic_write(os.path.join(run.folder, 'reward.svg'), reward_curves(
        evals, grpo_rows, title=f'agentrl train (reward_tests={cfg.reward_tests}, G={cfg.group}, seed={cfg.seed})'))
    n_calls = sum(r['calls'] for r in grpo_rows)
    summary = {
        'config': asdict(cfg),
        'sft': {'steps': cfg.sft_steps, 'seconds': round(sft_seconds, 3), **sft_last},
        'after_sft': after_sft, 'final': evals[-1],
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
        'files': {'sft_checkpoint': 'sft.pt', 'checkpoint': 'model.pt', 'metrics': 'metrics.jsonl',
                  'plot': 'reward.svg'},
    }
    atomic_write(os.path.join(run.folder, 'summary.json'), json.dumps(summary, indent=2))
    return summary


def _train(cfg: TrainConfig, on_event, folder: str) -> dict:
    """The body of :func:`train`: SFT, GRPO and the summary, written into ``folder`` (the staging folder)."""
    from .. import gym
    from ..model import TinyAgent
    t_start = time.time()
    tok = gym.bugfix_tokenizer()
    torch.manual_seed(cfg.seed)
    model = TinyAgent(tok.vocab_size)
    log = _Log(os.path.join(folder, 'metrics.jsonl'))
    run = _Run(cfg, folder, model, tok, gym.make_tasks('train'), gym.make_tasks('heldout'), log,
               on_event or (lambda record: None))
    log.write({'phase': 'start', 'config': asdict(cfg), 'time': time.strftime('%Y-%m-%dT%H:%M:%S'),
               'tokenizer': tok.fingerprint()})
    try:
        sft_last, sft_seconds, after_sft = sft_phase(run)
        grpo_seconds = grpo_phase(run)
    finally:
        log.close()
    return write_summary(run, sft_last, sft_seconds, after_sft, grpo_seconds, t_start)
