"""Hugging Face engine throughput (issue 5): batched with a KV cache vs one by one without a cache.

``run(quick)`` returns rows ``{name, value, unit, notes}`` for ``bench/run.py``; run this file
directly to print them::

    .venv/bin/python bench/bench_engine_hf.py [--quick] [--episodes 32] [--threads 1] [--model DIR]

What is measured, in one process: BugFix episodes through real function calling
(:func:`agentrl.engines.hf.bugfix_rollouts`) with the small random Qwen3 of
:func:`agentrl.engines.hf.make_test_model` (2 layers, hidden 64, the real 151,669-token Qwen3
tokenizer; built in a temporary folder unless ``--model`` is given), temperature 1, each
episode with its own seed:

* ``batched_kv``: all episodes in one lockstep batch (left padding, one KV cache per turn);
* ``one_by_one_no_cache``: each episode alone, every token recomputing the whole context.

Both runs use the same per-episode generators, so they draw the same ids except where a draw
lands within fp32 rounding of a boundary of the (near-uniform) CDF of the random model (the
number of identical episodes is reported); the rows give generated (policy) tokens per second
of wall time, end to end (recorder, bridges and gym included), and their ratio. ``quick`` uses
8 episodes and shorter turns.

Torch runs on one thread by default (``--threads``): the machine has 2 shared cores.
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _tokenizer_dir() -> Path | None:
    for d in ([Path(os.environ['AGENTRL_TOKENIZERS']) / 'qwen3'] if os.environ.get('AGENTRL_TOKENIZERS') else []) + \
             [ROOT.parent / 'shared' / 'tokenizers' / 'qwen3']:
        if (d / 'tokenizer_config.json').is_file():
            return d
    return None


def measure(model_dir, episodes: int = 32, max_new_tokens: int = 32, max_turns: int = 6, seed: int = 0) -> dict:
    """Time ``episodes`` BugFix episodes batched with a KV cache and one by one without.

    Returns:
        dict with ``tokens`` (generated per variant), ``batched_s``, ``single_s`` (wall seconds),
        ``same_ids`` (episodes in which both variants drew the same ids).
    """
    import torch  # noqa: F401

    import agentrl as arl
    from agentrl.engines import hf
    model, tok = hf.load_model(model_dir)
    tasks_all = arl.make_tasks('all')
    tasks = [tasks_all[i % len(tasks_all)] for i in range(episodes)]
    seeds = [hf.episode_seed(seed, i) for i in range(episodes)]
    template = arl.ChatTemplate(tok, tools=arl.TOOL_SCHEMAS)
    kw = dict(spec=arl.SamplingSpec(), max_new_tokens=max_new_tokens, max_turns=max_turns, template=template)
    hf.bugfix_rollouts(model, tok, tasks[:2], seeds=seeds[:2], **kw)             # warm-up: template probes, caches
    t0 = time.perf_counter()
    batched = hf.bugfix_rollouts(model, tok, tasks, seeds=seeds, batch_size=episodes, cache=True, **kw)
    batched_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    single = [hf.bugfix_rollouts(model, tok, [t], seeds=[s], batch_size=1, cache=False, **kw)[0]
              for t, s in zip(tasks, seeds)]
    single_s = time.perf_counter() - t0
    tokens = sum(int(t.action_mask.sum()) for t in batched)
    same = sum(torch.equal(a.ids, b.ids) for a, b in zip(batched, single))
    return {'tokens': tokens, 'tokens_single': sum(int(t.action_mask.sum()) for t in single), 'batched_s': batched_s,
            'single_s': single_s, 'same_ids': same, 'episodes': episodes, 'turns': sum(len(t.info['turn_tokens'])
                                                                                      for t in batched)}


def run(quick: bool, model_dir: str | None = None, episodes: int | None = None) -> list[dict]:
    """Rows for bench/run.py: tokens/s of both variants and their ratio."""
    try:
        import jinja2  # noqa: F401
        import transformers  # noqa: F401
    except ImportError as e:
        return [{'name': 'engine_hf', 'value': None, 'unit': '', 'notes': f'skipped: needs agentrl[hf] ({e})'}]
    os.environ.setdefault('HF_HUB_OFFLINE', '1')
    from agentrl.engines import hf
    n = episodes or (8 if quick else 32)
    new_tokens, turns = (16, 3) if quick else (32, 6)
    with tempfile.TemporaryDirectory() as tmp:
        if model_dir is None:
            tdir = _tokenizer_dir()
            if tdir is None:
                return [{'name': 'engine_hf', 'value': None, 'unit': '',
                         'notes': 'skipped: no qwen3 tokenizer (set AGENTRL_TOKENIZERS)'}]
            model_dir = hf.make_test_model(Path(tmp) / 'model', tdir)
        m = measure(model_dir, episodes=n, max_new_tokens=new_tokens, max_turns=turns)
    b_tps = m['tokens'] / m['batched_s']
    s_tps = m['tokens_single'] / m['single_s']
    setup = f'{n} BugFix episodes, <= {turns} turns of <= {new_tokens} tokens, 2-layer hidden-64 Qwen3, T=1'
    return [
        {'name': f'batched_kv_{n}', 'value': round(b_tps, 1), 'unit': 'tok/s',
         'notes': f'{setup}; one lockstep batch, left padding, KV cache; {m["tokens"]} tokens in '
                  f'{m["batched_s"]:.2f} s'},
        {'name': f'one_by_one_no_cache_{n}', 'value': round(s_tps, 1), 'unit': 'tok/s',
         'notes': f'same episodes one at a time, full recompute per token; {m["tokens_single"]} tokens in '
                  f'{m["single_s"]:.2f} s'},
        {'name': f'speedup_{n}', 'value': round(b_tps / s_tps, 2), 'unit': 'x',
         'notes': f'batched+KV tok/s / one-by-one no-cache tok/s; identical episodes: {m["same_ids"]}/{n} (a '
                  'draw within fp32 rounding of a CDF boundary of the near-uniform random model may pick a neighbour)'},
    ]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    ap.add_argument('--quick', action='store_true', help='8 episodes, short turns')
    ap.add_argument('--episodes', type=int, default=None, help='episodes (default 32; 8 with --quick)')
    ap.add_argument('--model', default=None, help='model folder (default: build the test model in a temp folder)')
    ap.add_argument('--threads', type=int, default=1, help='torch threads (default 1)')
    args = ap.parse_args(argv)
    import torch
    torch.set_num_threads(args.threads)
    for r in run(args.quick, args.model, args.episodes):
        v = '-' if r['value'] is None else r['value']
        print(f"{r['name']:<28} {v!s:>10} {r['unit']:<6} {r['notes']}")
    return 0


if __name__ == '__main__':
    sys.exit(main())
