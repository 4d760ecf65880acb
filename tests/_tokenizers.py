"""Real Hugging Face tokenizers for the template tests, loaded once per process.

Folder: ``$AGENTRL_TOKENIZERS``, else ``$AGENTRL_SHARED/tokenizers``, else ``../shared/tokenizers``
next to the repository. Tests that need a tokenizer skip when the folder, transformers or jinja2
is missing. Nothing is downloaded (``HF_HUB_OFFLINE=1``).
"""
import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FAMILIES = ('qwen3', 'deepseek-v3', 'llama3')
_CACHE = {}


def tokenizers_dir() -> Path:
    """The folder holding ``qwen3/``, ``deepseek-v3/`` and ``llama3/``."""
    if os.environ.get('AGENTRL_TOKENIZERS'):
        return Path(os.environ['AGENTRL_TOKENIZERS'])
    if os.environ.get('AGENTRL_SHARED'):
        return Path(os.environ['AGENTRL_SHARED']) / 'tokenizers'
    return ROOT.parent / 'shared' / 'tokenizers'


def tokenizer_path(family: str) -> Path:
    """Folder of one family, or skip the test when it is absent."""
    d = tokenizers_dir() / family
    if not (d / 'tokenizer_config.json').is_file():
        pytest.skip(f'no {family} tokenizer at {d} (set AGENTRL_TOKENIZERS to the tokenizers folder)')
    return d


def load(family: str):
    """The family's tokenizer (cached for the whole test session), or skip."""
    if family not in _CACHE:
        pytest.importorskip('jinja2')
        transformers = pytest.importorskip('transformers')
        path = tokenizer_path(family)
        os.environ.setdefault('HF_HUB_OFFLINE', '1')
        os.environ.setdefault('TRANSFORMERS_OFFLINE', '1')
        level = transformers.logging.get_verbosity()
        transformers.logging.set_verbosity_error()  # DeepSeek-V3's class-name warning
        try:
            _CACHE[family] = transformers.AutoTokenizer.from_pretrained(str(path))
        finally:
            transformers.logging.set_verbosity(level)
    return _CACHE[family]
