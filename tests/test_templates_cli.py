"""CLI smoke tests: ``agentrl template audit`` on the real tokenizers."""
import json

import pytest

from _tokenizers import load, tokenizer_path

pytest.importorskip('jinja2')
pytest.importorskip('transformers')

import agentrl.templates
from agentrl.cli.main import main


@pytest.fixture
def cached_loader(monkeypatch):
    """Serve the session's tokenizers instead of reloading them from disk (the path is still checked)."""
    names = {str(tokenizer_path(f)): f for f in ('qwen3', 'deepseek-v3', 'llama3')}
    monkeypatch.setattr(agentrl.templates, 'load_tokenizer', lambda p: load(names[p]))


def test_audit_qwen3_real_load(capsys):
    assert main(['template', 'audit', str(tokenizer_path('qwen3'))]) == 0
    out = capsys.readouterr().out
    assert "owner counts: {'template': " in out and "'prompt': 37, 'policy': 55, 'tool': 23}" in out
    assert 'prefix-stable: True (token ids: True); reasoning rendered 2/2' in out
    assert "non-thinking inserts '<think>\\n\\n</think>\\n\\n'" in out
    assert ("bridge after a tool turn (34 tokens, stop '<|im_end|>' sampled): "
            "'\\n<|im_start|>user\\n<tool_response>") in out
    assert "bridge after a user turn (12 tokens, stop '<|im_end|>' sampled): '\\n<|im_start|>user\\nProbe" in out
    assert 'fingerprint: template ' in out and 'problem:' not in out


def test_audit_qwen3_no_thinking_and_messages_file(cached_loader, tmp_path, capsys):
    msgs = [{'role': 'user', 'content': 'Fix clamp.'}, {'role': 'assistant', 'content': 'Reading.'},
            {'role': 'tool', 'content': 'src'}, {'role': 'assistant', 'content': 'Done.'}]
    f = tmp_path / 'm.json'
    f.write_text(json.dumps(msgs))
    assert main(['template', 'audit', str(tokenizer_path('qwen3')), '--messages', str(f), '--no-thinking']) == 0
    out = capsys.readouterr().out
    assert 'thinking: off' in out and 'prefix-stable: False' in out
    assert ('message  2 tool      BREAKS: message 2 (tool) breaks the sampling context of turn 1: '
            'the generation prompt the turn was sampled after changes') in out


@pytest.mark.parametrize('family', ['deepseek-v3', 'llama3'])
def test_audit_names_what_the_template_cannot_do(family, cached_loader, capsys):
    assert main(['template', 'audit', str(tokenizer_path(family))]) == 0
    out = capsys.readouterr().out
    assert 'problem: tools=: this chat template ignores tool schemas' in out
    assert 'problem: messages[1]["tool_calls"]: this chat template does not render tool calls' in out
    assert 'owner counts: (conversation cannot be labelled, see problems)' in out
    assert 'thinking switch: no effect' in out


def test_audit_bad_files(cached_loader, tmp_path, capsys):
    path = str(tokenizer_path('qwen3'))
    assert main(['template', 'audit', path, '--messages', str(tmp_path / 'missing.json')]) == 2
    assert "--messages '" in capsys.readouterr().err
    bad = tmp_path / 'bad.json'
    bad.write_text('{"messages": 3}')
    assert main(['template', 'audit', path, '--messages', str(bad)]) == 2
    assert 'must hold a non-empty JSON list of messages' in capsys.readouterr().err
    bad.write_text('[{"role": "user", "content": "x"}')
    assert main(['template', 'audit', path, '--messages', str(bad)]) == 2
    assert capsys.readouterr().err == (f"agentrl: error: --messages {str(bad)!r} is not valid JSON (Expecting ',' "
                                       'delimiter at line 1 column 34); pass a JSON list of messages to --messages\n')
    bad.write_bytes(b'[\xff]')
    assert main(['template', 'audit', path, '--tools', str(bad)]) == 2
    assert capsys.readouterr().err == (f'agentrl: error: --tools {str(bad)!r} is not UTF-8 text (byte 0xff at offset '
                                       '1); pass a JSON list of tool schemas to --tools\n')
    bad.write_text('[{"role": "robot", "content": "x"}]')
    assert main(['template', 'audit', path, '--messages', str(bad)]) == 2
    assert '["role"] is \'robot\'' in capsys.readouterr().err
