"""Codex CLI (npm ``@openai/codex``, pinned in tests/harness/package.json) through the gateway's Responses dialect.

A gateway on 127.0.0.1 serves a 2-layer random Qwen3 (context 16384: Codex's first prompt is about 8.7k
tokens) with the real Qwen3 tokenizer. Codex gets the session URL as a custom ``model_provider``
(``wire_api = "responses"``) in a private ``CODEX_HOME`` and runs ``codex exec``; the model's turns are
teacher-forced (``ForcingHF``, tests/_gateway.py): an ``exec_command`` call that writes a file, then an
answer. Codex runs the command, sends its output back with the reasoning item it was given
(``encrypted_content``), and the episode must be recorded as one branch that ``agentrl check`` replays.
"""
import json
import os
import subprocess
from pathlib import Path

import pytest

from _tokenizers import tokenizer_path

CODEX = Path(__file__).resolve().parent / 'node_modules' / '.bin' / 'codex'
if not CODEX.exists():
    pytest.skip('Codex CLI is not installed: run `npm ci --prefix tests/harness` (or `make test-harness`)',
                allow_module_level=True)
pytest.importorskip('transformers')
pytest.importorskip('uvicorn')
try:                       # openai >= 3 ships httpx2; older versions use httpx
    import httpx2 as httpx
except ImportError:
    httpx = pytest.importorskip('httpx')

from _gateway import ForcingHF  # noqa: E402
from agentrl.gateway import Gateway, read_journal  # noqa: E402
from agentrl.gateway.server import Server  # noqa: E402

CALL = json.dumps({'name': 'exec_command', 'arguments': {'cmd': 'echo hello > out.txt'}})
TURNS = [f'<think>\nI will write the file.\n</think>\n\n<tool_call>\n{CALL}\n</tool_call><|im_end|>',
         '<think>\nDone.\n</think>\n\nI wrote out.txt.<|im_end|>']


def codex_home(path: Path, base_url: str) -> Path:
    """A private ``CODEX_HOME`` whose config points Codex at ``base_url`` (the key comes from ``AGENTRL_KEY``)."""
    path.mkdir(parents=True)
    (path / 'config.toml').write_text(f'model = "policy"\nmodel_provider = "agentrl"\n\n[model_providers.agentrl]\n'
                                      f'name = "agentrl"\nbase_url = "{base_url}"\nwire_api = "responses"\n'
                                      'env_key = "AGENTRL_KEY"\n')
    return path


def test_codex_exec_runs_a_command_and_is_recorded_as_one_branch(tmp_path):
    from agentrl import store
    from agentrl.cli.main import main as agentrl
    from agentrl.engines import hf
    model_dir = hf.make_test_model(tmp_path / 'm', tokenizer_path('qwen3'), max_positions=16384)
    up = ForcingHF(model_dir, device='cpu', max_new_tokens=64)
    run, work = tmp_path / 'run', tmp_path / 'work'
    work.mkdir()
    srv = Server(Gateway(up, run)).start()
    try:
        sess = httpx.post(srv.url + '/sessions', json={'group_id': 'codex', 'rollout_id': '0'}, timeout=60).json()
        env = dict(os.environ, CODEX_HOME=str(codex_home(tmp_path / 'codex-home', sess['base_url'])),
                   HOME=str(tmp_path), AGENTRL_KEY='unused')
        up.force += TURNS
        p = subprocess.run([str(CODEX), 'exec', '--skip-git-repo-check', '--dangerously-bypass-approvals-and-sandbox',
                            '-C', str(work), 'Write hello to out.txt'], env=env, stdin=subprocess.DEVNULL,
                           capture_output=True, text=True, timeout=300)
        assert p.returncode == 0, p.stderr[-2000:]
        assert up.force == [] and p.stdout.strip() == 'I wrote out.txt.'
        assert (work / 'out.txt').read_text() == 'hello\n'
        r = httpx.post(f'{srv.url}/sessions/{sess["token"]}/finish', json={'reward': 1.0}, timeout=60)
        assert r.status_code == 200 and r.json()['records'] == 1, r.text
    finally:
        srv.stop()
    calls = [e for e in read_journal(run / 'journal.jsonl') if e['ev'] == 'call']
    assert len(calls) == 2 and [e['req']['dialect'] for e in calls] == ['responses', 'responses']
    names = [t['function']['name'] for t in calls[0]['req']['tools']]
    assert 'exec_command' in names and 'multi_agent_v1__spawn_agent' in names and 'web_search' not in names
    assert [c['function']['name'] for c in calls[0]['message']['tool_calls']] == ['exec_command']
    echoed, output = calls[1]['req']['messages'][-2:]
    assert echoed['reasoning_content'] == 'I will write the file.'          # restored from encrypted_content
    assert output['role'] == 'tool' and output['tool_call_id'] == calls[0]['message']['tool_calls'][0]['id']
    [t] = store.read_trajectories(run / 'trajectories')
    g = t.info['gateway']
    assert (g['calls'], g['fork'], g['variants'], g['finish_reasons']) == ([0, 1], None, [], ['tool_calls', 'stop'])
    assert agentrl(['check', str(run), '--model', str(model_dir)]) == 0
