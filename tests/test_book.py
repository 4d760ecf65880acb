"""The book chapter's own code blocks, run by ../shared/tools/run_book.py, print what the book prints.

Blocks 2, 7, 8, 9 (Qwen3 template), 13 (vocabulary), 18 (oracle table), 27 (context growth),
28 (truncation) and 29 (mask demo) do not depend on random draws or on the Qwen model's weights:
they must match exactly in both modes (ours: agentrl's chapter-5 API; book: the chapter's code
on agentrl's gym and model).
"""
import os
import re
import subprocess
import sys

import pytest

from conftest import shared_dir

GOLDEN = [2, 7, 8, 9, 13, 18, 27, 28, 29]
RUN_BOOK = shared_dir() / 'tools' / 'run_book.py'


@pytest.mark.parametrize('mode', ['ours', 'book'])
def test_book_blocks_match(mode):
    if not RUN_BOOK.exists():
        pytest.skip(f'{RUN_BOOK} not found: the book runner lives in the project\'s shared/ folder (seeds, spec, '
                    'tokenizers, tools) beside the clone; set AGENTRL_SHARED to it')
    pytest.importorskip('transformers')
    env = dict(os.environ, HF_HUB_OFFLINE='1', TRANSFORMERS_OFFLINE='1', OMP_NUM_THREADS='1')
    env.setdefault('AGENTRL_TOKENIZERS', str(shared_dir() / 'tokenizers'))
    out = subprocess.run([sys.executable, str(RUN_BOOK), '--mode', mode, '--show-diff'], capture_output=True,
                         text=True, env=env, timeout=600).stdout
    status = {int(m.group(1)): m.group(2) for m in re.finditer(r'^\[\s*(\d+)\] (\S+)', out, re.M)}
    assert 'agentrl lacks chapter-5 names' not in out, out
    bad = {b: status.get(b) for b in GOLDEN if status.get(b) != 'same'}
    assert not bad, f'blocks not matching the book in mode {mode}: {bad}\n{out}'
