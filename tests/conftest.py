"""Shared fixtures: the 30 BugFix tasks and their tokenizer, built once per session."""
import os
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]

# TinyAgent is tiny: intra-op threads only add contention on the 2-core CI machine.
torch.set_num_threads(1)


def shared_dir() -> Path:
    """The project's ../shared folder (seeds, spec, tokenizers), or $AGENTRL_SHARED."""
    return Path(os.environ.get('AGENTRL_SHARED', ROOT.parent / 'shared'))


@pytest.fixture(scope='session')
def tasks():
    import agentrl as arl
    return arl.make_tasks('all')


@pytest.fixture(scope='session')
def tok(tasks):
    import agentrl as arl
    return arl.build_tokenizer(tasks)
