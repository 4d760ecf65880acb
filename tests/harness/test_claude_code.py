"""Claude Code (the real CLI, pinned in tests/harness/package.json) through ``agentrl serve``'s Anthropic Messages
dialect, recorded as one token-exact episode.

The gateway serves ``make_test_model``'s 2-layer Qwen3 with the real Qwen3 tokenizer and a 16384-token context
(Claude Code's first prompt, its system prompt and 12 tools, is about 9.6k tokens). The tiny random model cannot
work a task, so its two turns are teacher-forced through ``ForcingHF`` (tests/_gateway.py: the ids are given, the
log-probs are the model's): a Bash call ``echo hi`` (with reasoning), then the answer. Claude Code runs the
command itself and sends its output back as a ``tool_result``; it echoes the reasoning as a signed thinking
block with its text omitted (``display: omitted``), which the gateway maps back to the sampled reasoning.
"""
import json
import os
import subprocess
from pathlib import Path

import pytest

from _tokenizers import tokenizer_path

pytest.importorskip('transformers')
pytest.importorskip('starlette')
pytest.importorskip('uvicorn')
try:                       # the SDKs ship httpx2; older versions use httpx
    import httpx2 as httpx
except ImportError:
    httpx = pytest.importorskip('httpx')

from _gateway import ForcingHF  # noqa: E402

CLAUDE = Path(__file__).resolve().parent / 'node_modules' / '.bin' / 'claude'
TASK = 'Run `echo hi` in the shell and tell me what it printed.'
BASH = '<think>\nI should run it.\n</think>\n\n<tool_call>\n{"name": "Bash", "arguments": {"command": "echo hi", ' \
       '"description": "Print hi"}}\n</tool_call><|im_end|>'
ANSWER = '<think>\nIt printed hi.\n</think>\n\nThe command printed: hi<|im_end|>'


@pytest.fixture(scope='session')
def gateway_16k(tmp_path_factory):
    """``(server, upstream, run dir, model dir)``: one gateway for the session over a 16384-context test model."""
    from agentrl.engines import hf
    from agentrl.gateway import Gateway
    from agentrl.gateway.server import Server
    model_dir = hf.make_test_model(tmp_path_factory.mktemp('cc-model'), tokenizer_path('qwen3'), max_positions=16384)
    up = ForcingHF(model_dir, device='cpu', max_new_tokens=64)
    run = tmp_path_factory.mktemp('cc-run') / 'run'
    srv = Server(Gateway(up, run)).start()
    yield srv, up, run, model_dir
    srv.stop()


def test_claude_code_runs_a_bash_call_and_the_episode_is_one_checked_record(gateway_16k, tmp_path):
    from agentrl import store
    from agentrl.cli.main import main as agentrl
    srv, up, run, model_dir = gateway_16k
    sess = httpx.post(srv.url + '/sessions', json={'group_id': 'claude-code', 'rollout_id': 'echo-0',
                                                   'task': 'echo'}, timeout=60).json()
    home, work = tmp_path / 'home', tmp_path / 'work'
    home.mkdir()
    work.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith(('ANTHROPIC_', 'CLAUDE'))}
    env.update(ANTHROPIC_BASE_URL=sess['base_url'][:-len('/v1')], ANTHROPIC_API_KEY='unused', HOME=str(home),
               CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC='1', DISABLE_AUTOUPDATER='1')
    up.force += [BASH, ANSWER]
    p = subprocess.run([str(CLAUDE), '-p', TASK, '--output-format', 'json', '--allowedTools', 'Bash'],
                       env=env, cwd=work, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    out = json.loads(p.stdout)
    assert (out['is_error'], out['num_turns'], out['result']) == (False, 2, 'The command printed: hi'), out
    assert up.force == []
    state = httpx.get(f'{srv.url}/sessions/{sess["token"]}', timeout=60).json()
    assert (state['calls'], state['branches'], state['forks']) == (2, 1, [])
    r = httpx.post(f'{srv.url}/sessions/{sess["token"]}/finish', json={'reward': 1.0}, timeout=120)
    assert r.status_code == 200 and r.json()['records'] == 1, r.text
    [t] = store.read_trajectories(run / 'trajectories')
    g = t.info['gateway']
    assert (g['calls'], g['dialects'], g['variants']) == ([0, 1], ['anthropic', 'anthropic'], [])
    assert (t.provenance.group_id, t.provenance.rollout_id, t.reward) == ('claude-code', 'echo-0', 1.0)
    ids, mask = t.ids.tolist(), t.action_mask.tolist()
    trained = [ids[j + 1] for j, m in enumerate(mask) if m]
    assert trained == sum((up.tokenizer(x, add_special_tokens=False)['input_ids'] for x in (BASH, ANSWER)), [])
    text = up.tokenizer.decode(ids)
    assert text.count('<|im_start|>assistant\n') == 2 and '<tool_response>\nhi\n</tool_response>' in text
    assert len(ids) > 9000                                      # Claude Code's own system prompt and tools
    assert agentrl(['check', str(run), '--model', str(model_dir)]) == 0
