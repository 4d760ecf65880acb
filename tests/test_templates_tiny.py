"""The committed tiny chat tokenizer and the one tokenizer lookup: tests that never need ../shared."""
import json

import pytest

from _tokenizers import TINY, load

pytest.importorskip('jinja2')
transformers = pytest.importorskip('transformers')

import agentrl as arl  # noqa: E402
import agentrl.templates as tt  # noqa: E402
from agentrl import checks  # noqa: E402
from agentrl.record import OWNER, SamplingSpec  # noqa: E402
from agentrl.templates import chat, loading  # noqa: E402
from agentrl.jobs.bugfix import BugFixOptions, bugfix_rollouts  # noqa: E402


def test_tiny_tokenizer_is_small_and_qwen_style():
    tok = load('tiny')
    size = sum(p.stat().st_size for p in TINY.iterdir())
    assert size < 100_000 and len(tok) == 588
    ids = tok.convert_tokens_to_ids(['<|endoftext|>', '<|im_start|>', '<|im_end|>', '<think>', '</think>',
                                     '<tool_call>', '</tool_call>', '<tool_response>', '</tool_response>'])
    assert ids == list(range(579, 588)) and tok.eos_token == '<|im_end|>'
    t = tt.ChatTemplate(tok, tools=arl.TOOL_SCHEMAS)
    assert t.render([{'role': 'user', 'content': 'Hi'}], True).startswith('<|im_start|>system\n# Tools\n')
    assert t.end_of_turn_id == 581 and t.chat_tokens()['control'] == [[579, 588]]
    assert tt.audit_thinking(tok).inserted_text == '<think>\n\n</think>\n\n'


def test_find_tokenizer_dir_order_and_message(tmp_path, monkeypatch):
    (tmp_path / 'qwen3').mkdir()
    (tmp_path / 'qwen3' / 'tokenizer_config.json').write_text(json.dumps({}))
    monkeypatch.setenv('AGENTRL_TOKENIZERS', str(tmp_path))
    assert chat.find_tokenizer_dir('qwen3') == tmp_path / 'qwen3'
    assert chat.find_tokenizer_dir('Qwen/Qwen3-8B') == tmp_path / 'qwen3'       # a model id names its family
    monkeypatch.setenv('AGENTRL_SHARED', str(tmp_path / 'nowhere'))
    monkeypatch.setattr(loading, '__file__', str(tmp_path / 'a' / 'b' / 'c' / 'loading.py'))
    monkeypatch.chdir(tmp_path)
    with pytest.raises(FileNotFoundError, match=r'no llama3 tokenizer found \(tried .*\); set AGENTRL_TOKENIZERS to '
                                                r'a folder holding llama3/ .* the upstream repo is gated'):
        chat.find_tokenizer_dir('llama3', hub=False)
    with pytest.raises(FileNotFoundError, match="or let agentrl fetch the ungated hub repo 'deepseek-ai/DeepSeek-V3'"):
        chat.find_tokenizer_dir('deepseek-v3', hub=False)
    assert chat.tokenizer_family('meta-llama/Meta-Llama-3-8B-Instruct') == 'llama3'
    assert chat.tokenizer_family('gpt2') is None


def test_hf_engine_episodes_on_the_tiny_tokenizer(tmp_path):
    torch = pytest.importorskip('torch')
    from agentrl.engines import hf
    path = hf.make_test_model(tmp_path / 'm', TINY, layers=1, hidden=32, heads=2, kv_heads=1, max_positions=2048)
    model, tok = hf.load_model(path)
    assert len(tok) == 588 and not model.training
    tasks = arl.make_tasks('all')[:2]

    def run():
        return bugfix_rollouts(model, tok, tasks, BugFixOptions(spec=SamplingSpec(), max_new_tokens=12, max_turns=2, seed=5, enable_thinking=False))
    a, b = run(), run()
    for x, y in zip(a, b):
        assert torch.equal(x.ids, y.ids) and torch.equal(x.sample_logp, y.sample_logp)     # one seed, one record
        assert x.info['template']['chat_tokens']['end_of_turn'] == [581] and x.turn_contexts is not None
        assert int(x.action_mask.sum()) == (x.owner == OWNER['policy']).sum() > 0
        checks.validate(x)


@pytest.mark.parametrize('user_every', [None, 7])
def test_long_audit_on_its_structural_summary_equals_the_exact_audit(user_every):
    from agentrl.templates.audit import _audit_exact
    t = tt.ChatTemplate(load('tiny'))
    msgs = [{'role': 'system', 'content': 'You fix bugs.'}, {'role': 'user', 'content': 'Fix clamp.'}]
    k = 0
    while len(msgs) < 64:
        msgs += [{'role': 'assistant', 'content': f'read {k}', 'reasoning_content': f'Think {k}.'},
                 {'role': 'tool', 'content': f'def f{k}(x): return x'}]
        if user_every and k % user_every == user_every - 1:
            msgs.append({'role': 'user', 'content': f'Go on {k}.'})
        k += 1
    fast, exact = tt.audit_prefix_stability(t, msgs), _audit_exact(t, msgs)
    assert fast.audited < len(msgs) and exact.audited is None
    assert (fast.stable, fast.breaking, fast.reasoning_total, fast.reasoning_rendered) == \
        (exact.stable, exact.breaking, exact.reasoning_total, exact.reasoning_rendered)
    assert [m.broken for m in fast.messages] == [m.broken for m in exact.messages]
    assert [bool(m.reason) for m in fast.messages] == [bool(m.reason) for m in exact.messages]
    lab = tt.label_owners(t, msgs)
    from agentrl.templates.labels import locate_messages
    assert lab.regions == locate_messages(t, tt.labels.check_messages(msgs), fast=False)[1]


def test_the_gate_and_the_turn_kind_probe_on_the_tiny_template():
    from agentrl.families import QWEN3, family_for
    from agentrl.gateway import conformance
    from agentrl.templates.bridge import probe_message, turn_kind
    t = tt.ChatTemplate(load('tiny'))
    assert family_for(t) is QWEN3
    assert conformance(t, family=QWEN3)['found'] == ('conformance: 7 turns, 5 bridges: the bridged record equals the '
                                                     'full render; tool calls parsed back by the qwen3 family')
    opening = [{'role': 'user', 'content': 'Fix clamp.'}]
    empty = turn_kind(t, {'role': 'assistant', 'content': '<think>\n\n</think>\n\nok'})
    full = turn_kind(t, {'role': 'assistant', 'content': '<think>\nhm\n</think>\n\nok'})
    assert (empty, full) == (('answer', 'none', ('<think>', '\n\n', '</think>', None)),
                             ('answer', 'none', ('<think>', None, '</think>', None)))
    # the tiny template keeps assistant content verbatim: an empty think block stays in history (Qwen3's drops it)
    assert [tt.probe_stability(t, opening, ('tool',), turn=probe_message(k)) for k in (empty, full)] == [True, True]
