"""Fixtures of the real-package interop tests: the test model and episodes it sampled (CPU, seconds).

These tests run in the interop venv (``make test-interop``: TRL and verl installed); in the main
venv every module here skips through ``pytest.importorskip``.
"""
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))     # tests/_tokenizers.py


@pytest.fixture(scope='session')
def lm(tmp_path_factory):
    pytest.importorskip('transformers')
    from _tokenizers import tokenizer_path
    from agentrl.engines import hf
    torch.set_num_threads(1)
    out = hf.make_test_model(tmp_path_factory.mktemp('tiny-qwen3'), tokenizer_path('qwen3'))
    model, tok = hf.load_model(out)
    return out, model, tok


@pytest.fixture(scope='session')
def records(lm):
    """4 BugFix episodes at temperature 1 (processed log-probs), groups of 2 in order (g0 g0 g1 g1), rewards 1 0 0 1."""
    import agentrl as arl
    from agentrl.jobs.bugfix import BugFixOptions, bugfix_rollouts
    _, model, tok = lm
    tasks = arl.make_tasks('all')
    recs = bugfix_rollouts(model, tok, [tasks[0], tasks[0], tasks[1], tasks[1]], BugFixOptions(max_new_tokens=16, max_turns=3, seed=5))
    for i, r in enumerate(recs):
        r.provenance.group_id = f'g{i // 2}'
        r.reward = float(i in (0, 3))     # distinct rewards in each group: a non-zero GRPO advantage
    return recs
