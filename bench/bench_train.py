"""Training throughput on CPU: SFT and GRPO (G = 8) steps per second and tokens per second.

``run(quick)`` returns rows ``{name, value, unit, notes}`` for ``bench/run.py``; run this file
directly to print them. Tokens are real (unpadded) tokens of the collated batch; a GRPO step is
sampling ``tasks x G`` episodes with ``rollout_batch`` plus the optimiser updates on them.
"""
from __future__ import annotations

import time

import torch


def _setup(sft_steps: int):
    import agentrl as arl
    from agentrl.train import oracle_demos
    from agentrl.train.loop import run_sft
    tok = arl.build_tokenizer(arl.make_tasks('all'))
    train_tasks = arl.make_tasks('train')
    demos = oracle_demos(train_tasks, tok)
    torch.manual_seed(0)
    model = arl.TinyAgent(tok.vocab_size)
    t0 = time.perf_counter()
    run_sft(model, demos, tok, sft_steps, 3e-3)
    return tok, train_tasks, demos, model, time.perf_counter() - t0


def run(quick: bool = False) -> list[dict]:
    """Measure SFT and GRPO throughput with one torch thread (``agentrl train``'s default).

    Args:
        quick: fewer steps (a few seconds in all) instead of the full measurement, which also
            times SFT with two threads.

    Returns:
        list of ``{'name', 'value', 'unit', 'notes'}`` rows.
    """
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        rows = _measure(quick)
        if not quick:
            torch.set_num_threads(2)
            steps = 60
            _, _, demos, _, seconds = _setup(steps)
            rows.append({'name': 'sft_steps_per_s_2threads', 'value': round(steps / seconds, 2), 'unit': 'steps/s',
                         'notes': 'same SFT with 2 torch threads (slower whenever another process runs)'})
        return rows
    finally:
        torch.set_num_threads(before)


def _measure(quick: bool) -> list[dict]:
    from agentrl.batching import collate
    from agentrl.train import GRPOOptions, grpo_step
    from agentrl.train.loop import sample_groups
    sft_steps = 30 if quick else 150
    grpo_steps = 2 if quick else 6
    tasks_per_step, G, updates = 8, 8, 2
    tok, train_tasks, demos, model, sft_s = _setup(sft_steps)
    sft_tokens = int(collate(demos, tok.pad_id).attention_mask.sum())
    threads = torch.get_num_threads()
    rows = [
        {'name': 'sft_steps_per_s', 'value': round(sft_steps / sft_s, 2), 'unit': 'steps/s',
         'notes': f'full batch of {len(demos)} oracle demos, {sft_tokens} tokens/step, Adam, torch threads: {threads}'},
        {'name': 'sft_tokens_per_s', 'value': round(sft_steps * sft_tokens / sft_s), 'unit': 'tokens/s',
         'notes': 'forward + backward + step'},
    ]
    import copy
    ref = copy.deepcopy(model).eval()                  # KL 0.1 to the SFT model, as agentrl train does
    opt = torch.optim.Adam(model.parameters(), lr=1e-4)
    gen = torch.Generator().manual_seed(0)
    t_sample = t_update = 0.0
    n_tokens = 0
    for step in range(grpo_steps):
        tasks = [train_tasks[(step * tasks_per_step + i) % len(train_tasks)] for i in range(tasks_per_step)]
        t0 = time.perf_counter()
        trajs = sample_groups(model, tasks, G, tok, gen)
        t1 = time.perf_counter()
        grpo_step(model, opt, trajs, G, tok.pad_id, GRPOOptions(updates=updates, kl_coef=0.1), ref_model=ref)
        t2 = time.perf_counter()
        t_sample, t_update = t_sample + t1 - t0, t_update + t2 - t1
        n_tokens += sum(len(t.ids) for t in trajs)
    total = t_sample + t_update
    eps = tasks_per_step * G
    rows += [
        {'name': 'grpo_steps_per_s', 'value': round(grpo_steps / total, 3), 'unit': 'steps/s',
         'notes': f'G={G}, {tasks_per_step} tasks/step ({eps} episodes), {updates} updates/step, KL 0.1, after SFT'},
        {'name': 'grpo_tokens_per_s', 'value': round(n_tokens / total), 'unit': 'tokens/s',
         'notes': 'episode tokens per second of a whole step (sampling + updates)'},
        {'name': 'grpo_sample_tokens_per_s', 'value': round(n_tokens / t_sample), 'unit': 'tokens/s',
         'notes': f'rollout_batch of {eps} episodes, {t_sample / grpo_steps:.2f} s/step'},
        {'name': 'grpo_update_tokens_per_s', 'value': round(n_tokens * updates / t_update), 'unit': 'tokens/s',
         'notes': f'reference forward + {updates} x (forward + backward + step), {t_update / grpo_steps:.2f} s/step'},
    ]
    return rows


if __name__ == '__main__':
    import argparse
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument('--quick', action='store_true', help='a few seconds instead of the full measurement')
    for row in run(ap.parse_args().quick):
        print(f"{row['name']:<26} {row['value']:>12} {row['unit']:<9} {row['notes']}")
