"""Benchmark the gym's env steps per second, and the sandbox's cost per ``run_tests`` call.

Usage::

    PYTHONPATH=src .venv/bin/python bench/bench_sandbox.py [--episodes 2000] [--repeat 3]

Three workloads, each timed best of ``--repeat``:

* ``env_steps_per_s``: scripted episodes (oracle, random, hacker policies over every task:
  read, edit, test, submit), counting every ``BugFixEnv.step``;
* ``run_tests_same_source_us``: one ``run_tests`` call on a source seen before (the common case:
  many episodes grade the same few sources);
* ``run_tests_new_source_us``: one ``run_tests`` call on a source never seen (a fresh edit).

Run it on two commits to compare (the numbers in bench/RESULTS.md are side by side).
"""
from __future__ import annotations

import argparse
import time


def env_steps(episodes: int) -> int:
    from agentrl.gym import BugFixEnv, make_tasks, scripted_policy
    tasks = make_tasks('all')
    policies = [scripted_policy('oracle', tasks=tasks), scripted_policy('random', seed=1), scripted_policy('hacker')]
    n = 0
    for i in range(episodes):
        task, policy = tasks[i % len(tasks)], policies[i % len(policies)]
        env = BugFixEnv()
        obs = [env.reset(task)]
        done = False
        while not done:
            o, _, done, _ = env.step(policy(obs))
            obs.append(o)
            n += 1
    return n


def best(fn, repeat: int):
    out, t = None, float('inf')
    for _ in range(repeat):
        t0 = time.perf_counter()
        out = fn()
        t = min(t, time.perf_counter() - t0)
    return t, out


def measure(episodes: int = 2000, repeat: int = 3) -> dict:
    from agentrl.gym import CLAMP_BUGGY, make_tasks, run_tests
    tests = make_tasks('all')[0].public_tests
    run_tests(CLAMP_BUGGY, tests, 'clamp')                       # warm up (starts a sandbox worker, if any)
    t_env, n = best(lambda: env_steps(episodes), repeat)
    calls = 200
    t_same, _ = best(lambda: [run_tests(CLAMP_BUGGY, tests, 'clamp') for _ in range(calls)], repeat)
    counter = iter(range(10**9))
    t_new, _ = best(lambda: [run_tests(CLAMP_BUGGY + f'\ndef g{next(counter)}(x):\n    return x\n', tests, 'clamp')
                             for _ in range(calls)], repeat)
    return {'env_steps': n, 'env_steps_per_s': n / t_env, 'run_tests_same_source_us': 1e6 * t_same / calls,
            'run_tests_new_source_us': 1e6 * t_new / calls}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    ap.add_argument('--episodes', type=int, default=2000)
    ap.add_argument('--repeat', type=int, default=3)
    args = ap.parse_args()
    m = measure(args.episodes, args.repeat)
    print(f"env steps/s            {m['env_steps_per_s']:.0f}  ({m['env_steps']} steps)")
    print(f"run_tests, seen source {m['run_tests_same_source_us']:.0f} us per call")
    print(f"run_tests, new source  {m['run_tests_new_source_us']:.0f} us per call")


if __name__ == '__main__':
    main()
