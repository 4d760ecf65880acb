"""The harness suite: real agent programs, pinned in tests/harness/package.json, against ``agentrl serve``.

The programs run from ``tests/harness/node_modules/.bin``; without that folder every test here is skipped with
the one line that installs it. ``make test-harness`` installs and runs them (the main suite leaves this folder
out; every test here is slow by its folder, tests/_durations.py).
"""
from pathlib import Path

import pytest

BIN = Path(__file__).resolve().parent / 'node_modules' / '.bin'


@pytest.fixture(scope='session', autouse=True)
def _harness_programs():
    if not BIN.is_dir():
        pytest.skip('tests/harness/node_modules is missing: run `npm ci --prefix tests/harness --no-audit --no-fund` '
                    '(or `make test-harness`)')

