"""vLLM's own tool and reasoning parsers, run in the vLLM venv, for cross-checking agentrl's families."""
import json
import subprocess
from pathlib import Path

from .conftest import vllm_python

RUNNER = Path(__file__).resolve().parent / '_vllm_parse.py'


def vllm_parse(tokenizer_dir, texts, *, tool_parser=None, reasoning_parser=None, tools=None, harmony=False) -> list:
    """Parse ``texts`` with vLLM's parsers (see ``_vllm_parse.py``): one ``{reasoning, content, calls}`` per text.

    ``harmony``: parse as vLLM parses a harmony (gpt-oss) model, from the texts' harmony-encoding ids.

    Raises:
        AssertionError: the runner failed (its stderr's last lines are in the message).
    """
    job = {'tokenizer': str(tokenizer_dir), 'tool_parser': tool_parser, 'reasoning_parser': reasoning_parser,
           'tools': tools or [], 'texts': list(texts), 'harmony': bool(harmony)}
    p = subprocess.run([str(vllm_python()), str(RUNNER)], input=json.dumps(job), capture_output=True, text=True,
                       timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    return json.loads(p.stdout)
