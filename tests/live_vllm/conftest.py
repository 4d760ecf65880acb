"""One vLLM server per test session (``make test-vllm``): a head_dim-32 test model, float32, processed log-probs.

The server runs from ``.venv-vllm`` (``$AGENTRL_VLLM_PYTHON`` overrides), pinned to one core
(``$AGENTRL_VLLM_CPUS``, default ``1``). Without that venv every test here skips with the fix.
"""
import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / 'tests'))              # tests/_tokenizers.py


def vllm_python() -> Path:
    return Path(os.environ.get('AGENTRL_VLLM_PYTHON') or ROOT / '.venv-vllm' / 'bin' / 'python')


def pytest_collection_modifyitems(config, items):
    if vllm_python().is_file():
        return
    skip = pytest.mark.skip(reason=f'no vLLM venv at {vllm_python()}: run `make test-vllm` (builds .venv-vllm) '
                                   'or set AGENTRL_VLLM_PYTHON')
    for item in items:
        if 'tests/live_vllm' in str(item.fspath).replace(os.sep, '/'):
            item.add_marker(skip)


@pytest.fixture(scope='session')
def vllm_py() -> Path:
    """The vLLM venv's python (for tests that start their own server)."""
    return vllm_python()


@pytest.fixture(scope='session')
def model_dir(tmp_path_factory):
    pytest.importorskip('transformers')
    from _tokenizers import tokenizer_path
    from agentrl.engines import hf
    return hf.make_test_model(tmp_path_factory.mktemp('tiny-qwen3-hd32'), tokenizer_path('qwen3'), hidden=64,
                              heads=2, kv_heads=1)


@pytest.fixture(scope='session')
def server(model_dir, tmp_path_factory):
    from agentrl.engines.vllm import VLLMServer, VLLMServerOptions
    log = tmp_path_factory.mktemp('vllm-log') / 'server.log'
    options = VLLMServerOptions(name='tiny', cpus=os.environ.get('AGENTRL_VLLM_CPUS', '1'), max_model_len=2048,
                                max_num_seqs=32, ready_timeout=600)
    srv = VLLMServer(model_dir, options, python=vllm_python(), log_path=log)
    with srv:
        yield srv


@pytest.fixture(scope='session')
def lm(model_dir):
    from agentrl.engines import hf
    return hf.load_model(model_dir)
