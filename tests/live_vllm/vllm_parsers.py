"""vLLM's own tool and reasoning parsers and its structured-output gate, run in the vLLM venv, for cross-checking
agentrl's families and its declared grammar start."""
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


GATE = Path(__file__).resolve().parent / '_vllm_grammar_gate.py'


def vllm_grammar_gate(tokenizer_dir, cases, *, reasoning_parser) -> list:
    """Where vLLM's structured-output gate applies the grammar (see ``_vllm_grammar_gate.py``): one
    ``{masked: [bool per step], fed: [ids]}`` per ``{prompt, turn, chat_template_kwargs}`` case.

    Raises:
        AssertionError: the runner failed (its stderr's last lines are in the message).
    """
    job = {'tokenizer': str(tokenizer_dir), 'reasoning_parser': reasoning_parser, 'cases': list(cases)}
    p = subprocess.run([str(vllm_python()), str(GATE)], input=json.dumps(job), capture_output=True, text=True,
                       timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    return json.loads(p.stdout)
