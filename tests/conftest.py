"""Shared fixtures: the 30 BugFix tasks and their tokenizer, built once per session."""
import os
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]

# TinyAgent is tiny: intra-op threads only add contention on the 2-core CI machine.
torch.set_num_threads(1)

# One hypothesis profile for every property test: AGENTRL_MAX_EXAMPLES examples each (default 25;
# e.g. AGENTRL_MAX_EXAMPLES=500 for a long soak, 5 for a quick pass), no deadline (CI timing varies).
try:
    from hypothesis import HealthCheck, settings
except ImportError:  # pragma: no cover - hypothesis is a test dependency
    pass
else:
    settings.register_profile('agentrl', max_examples=int(os.environ.get('AGENTRL_MAX_EXAMPLES', '25')),
                              deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                    HealthCheck.function_scoped_fixture])
    settings.load_profile('agentrl')


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


# ---------------------------------------------------------------------------- the 'slow' marker
#: whole files that are slow (each test starts Ray, a vLLM server or a subprocess job)
SLOW_FILES = ('tests/test_ray.py', 'tests/live_vllm/')
_SLOW = {line.strip() for line in (ROOT / 'tests' / 'slow_tests.txt').read_text().splitlines()
         if line.strip() and not line.startswith('#')}


def pytest_collection_modifyitems(config, items):
    """Mark the tests of ``tests/slow_tests.txt`` and ``SLOW_FILES`` as ``slow`` (``pytest -m "not slow"``: the quick loop)."""
    for item in items:
        rel = Path(str(item.fspath)).resolve().relative_to(ROOT).as_posix()
        if rel.startswith(SLOW_FILES) or f'{rel}::{item.originalname}' in _SLOW:
            item.add_marker(pytest.mark.slow)


# tests/ is on sys.path while pytest runs (rootdir conftest); a folder here named like a package (e.g. ``vllm``) would
# shadow it for every `find_spec` check (trl's is_vllm_available read tests/vllm as vLLM "N/A" and failed to import).
assert not (ROOT / 'tests' / 'vllm').exists(), ('tests/vllm shadows the vllm package: the live tests are in tests/live_vllm; '
                                               'remove the folder (after a pull it holds only __pycache__)')
