"""Shared fixtures: the 30 BugFix tasks and their tokenizer, built once per session."""
import os
from pathlib import Path

import pytest
import torch

from _durations import SLOW_FILES, load, merge, read_slow_list, write

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
_SLOW = set(read_slow_list())


def pytest_collection_modifyitems(config, items):
    """Mark the tests of ``tests/slow_tests.txt`` and ``SLOW_FILES`` as ``slow`` (``pytest -m "not slow"``: the quick loop)."""
    for item in items:
        rel = Path(str(item.fspath)).resolve().relative_to(ROOT).as_posix()
        if rel.startswith(SLOW_FILES) or f'{rel}::{item.originalname}' in _SLOW:
            item.add_marker(pytest.mark.slow)


# ---------------------------------------------------------------------------- recorded durations
def pytest_addoption(parser):
    parser.addoption('--record-durations', metavar='PATH', default=None,
                     help='merge the seconds of every test run (setup + call + teardown) into PATH, e.g. '
                          'tests/durations.json (tests/_durations.py); files not run keep their entries')


_RUN_SECONDS: dict = {}
_SKIPPED: set = set()


def pytest_runtest_logreport(report):
    _RUN_SECONDS[report.nodeid] = _RUN_SECONDS.get(report.nodeid, 0.0) + report.duration
    if report.skipped:                      # a skipped test's seconds say nothing about it
        _SKIPPED.add(report.nodeid)


def pytest_sessionfinish(session):
    if hasattr(session.config, 'workerinput'):   # a pytest-xdist worker: the controller sees every report and writes
        return
    path = session.config.getoption('--record-durations')
    ran = {k: v for k, v in _RUN_SECONDS.items() if k not in _SKIPPED}
    if path and ran:
        path = Path(path)
        write(merge(load(path), ran), path)


# tests/ is on sys.path while pytest runs (rootdir conftest); a folder here named like a package (e.g. ``vllm``) would
# shadow it for every `find_spec` check (trl's is_vllm_available read tests/vllm as vLLM "N/A" and failed to import).
assert not (ROOT / 'tests' / 'vllm').exists(), ('tests/vllm shadows the vllm package: the live tests are in tests/live_vllm; '
                                               'remove the folder (after a pull it holds only __pycache__)')
