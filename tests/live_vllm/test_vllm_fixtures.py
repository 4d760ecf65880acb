"""Recorded records of the vLLM engine: `agentrl rollout --engine vllm` and `agentrl serve` in front of vLLM.

The vLLM side of ``tests/test_engine_fixtures.py`` (its docstring and ``tests/_engine_fixtures.py``
describe the comparison and the file format): the CLI in a child process with fixed seeds, every
stored column of every row compared with ``tests/golden/engines/NAME.json``, except the fields of
each test's ``EXCLUDED`` map.

- ``rollout_vllm``: ``--engine vllm --server URL`` against the session's server (conftest), 6 short
  episodes.
- ``serve_vllm``: ``agentrl serve --server URL`` driven by :func:`_engine_fixtures.drive_gateway`
  (the HTTP responses are compared too), then ``serve --engine vllm`` (a local server started by the
  gateway), which must store the same records.

The model is conftest's head_dim-32 test model, hard-linked into a folder named ``tiny-qwen3-hd32`` so
the records' ``name@fingerprint`` does not depend on pytest's temporary folder names.

Regenerate (only on a tree whose records are known good)::

    AGENTRL_REGEN_FIXTURES=1 AGENTRL_VLLM_PYTHON=.venv-vllm/bin/python \\
        python -m pytest -p no:cacheprovider tests/live_vllm/test_vllm_fixtures.py

``CI=true`` refuses that.
"""
import os
import re
import shutil
from pathlib import Path

import pytest

from _engine_fixtures import Serve, agentrl, canonical, check_fixture, drive_gateway, stored_rows

#: Fields ``rollout --engine vllm`` stores that differ run to run. The server's address (a free port
#: each session; info.vllm.server) is substituted by ``<server>``, so only what hashes it is left out.
ROLLOUT_EXCLUDED = {
    'digest.row': "the row part of the digest hashes info, which holds the server's address",
}

#: Fields the gateway stores that differ run to run (the session ids and the server's address are
#: substituted by ``<session K>`` and ``<server>`` wherever they appear).
SERVE_EXCLUDED = {
    'digest.row': 'the row part of the digest hashes info, which holds the random session id',
}

VLLM_ROLLOUT = ['rollout', '--engine', 'vllm', '--server', '{server}', '--model', '{model}', '--split', 'heldout',
                '--repeats', '1', '--max-turns', '2', '--max-new-tokens', '8', '--seed', '5', '--out', '{out}']
SERVE_VLLM = ['serve', '--out', '{out}', '--model', '{model}', '--max-new-tokens', '8']


@pytest.fixture(scope='module')
def model_link(model_dir, tmp_path_factory):
    """conftest's model as ``.../tiny-qwen3-hd32`` (hard links): the records name a model by its folder's
    real name, and pytest numbers the folders it makes."""
    return Path(shutil.copytree(model_dir, tmp_path_factory.mktemp('vllm-fixture-model') / 'tiny-qwen3-hd32',
                                copy_function=os.link))


def _argv(command, **paths):
    return [a.format(**paths) for a in command]


def test_rollout_vllm(server, model_link, tmp_path):
    out = tmp_path / 'run'
    agentrl(*_argv(VLLM_ROLLOUT, server=server.url, model=model_link, out=out))
    names = {server.url: '<server>'}
    check_fixture('rollout_vllm', {'command': VLLM_ROLLOUT, 'excluded': ROLLOUT_EXCLUDED,
                                   'records': canonical(stored_rows(out / 'trajectories'), ROLLOUT_EXCLUDED, names)})


def _serve(tmp_path, model_link, engine_args, server_url=None):
    """Drive a gateway over vLLM; ``server_url`` None: the gateway's own server (its address from the
    gateway's stderr line ``agentrl serve: vllm server URL (pid N) started``)."""
    pytest.importorskip('starlette')
    pytest.importorskip('uvicorn')
    out = tmp_path / 'run'
    with Serve(*_argv(SERVE_VLLM[1:], out=out, model=model_link), *engine_args) as gateway:
        if server_url is None:
            started = re.search(r'vllm server (\S+) \(pid \d+\) started', gateway.stderr())
            assert started, f'no "vllm server URL started" line in: {gateway.stderr()[-2000:]}'
            server_url = started.group(1)
        calls = drive_gateway(gateway.url)
    sessions = [c['session'] for c in calls if 'session' in c]
    names = {s: f'<session {k}>' for k, s in enumerate(sessions)}
    names[server_url] = '<server>'
    return {'command': SERVE_VLLM, 'excluded': SERVE_EXCLUDED, 'calls': canonical(calls, {}, names),
            'records': canonical(stored_rows(out / 'trajectories'), SERVE_EXCLUDED, names)}


def test_serve_vllm_server(server, model_link, tmp_path):
    check_fixture('serve_vllm', _serve(tmp_path, model_link, ['--server', server.url], server.url))


def test_serve_engine_vllm(vllm_py, model_link, tmp_path):
    """A local server started by the gateway (``--engine vllm``) stores the ``--server`` records."""
    cpus = os.environ.get('AGENTRL_VLLM_CPUS', '1')
    data = _serve(tmp_path, model_link, ['--engine', 'vllm', '--vllm-python', vllm_py, '--vllm-cpus', cpus])
    check_fixture('serve_vllm', data, regen=False)
