"""Tokenizers for the template tests, loaded once per process.

- ``load('tiny')``: the tiny chat tokenizer committed under ``tests/assets/tiny-chat`` (our own
  byte-level BPE and Qwen-style template; regenerate with ``tests/assets/make_tiny_tokenizer.py``).
  It always exists, so recorder, labels, audit and HF-engine tests never skip for want of files.
- ``load('qwen3' | 'deepseek-v3' | 'llama3')``: the real tokenizers, found by
  :func:`agentrl.templates.chat.find_tokenizer_dir` (``$AGENTRL_TOKENIZERS``, ``../shared/tokenizers``,
  then the Hugging Face hub for ungated repos when online); the test is skipped with a message saying
  how to get them when none is found. Tests skip when transformers or jinja2 is missing.
"""
import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TINY = ROOT / 'tests' / 'assets' / 'tiny-chat'
FAMILIES = ('qwen3', 'deepseek-v3', 'llama3')
_CACHE = {}


def tokenizer_path(family: str) -> Path:
    """Folder of one family (``'tiny'`` or a real one), or skip the test when it is absent."""
    if family == 'tiny':
        return TINY
    pytest.importorskip('jinja2')
    pytest.importorskip('transformers')
    from agentrl.templates.chat import find_tokenizer_dir
    try:
        return find_tokenizer_dir(family)
    except FileNotFoundError as e:
        pytest.skip(str(e))


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
            from agentrl.templates.loading import load_tokenizer   # checked against tokenizer.json (transformers 5.10)
            _CACHE[family] = load_tokenizer(str(path))
        finally:
            transformers.logging.set_verbosity(level)
    return _CACHE[family]
