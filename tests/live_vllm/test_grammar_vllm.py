"""Grammar-constrained sampling on the session's vLLM server (docs/grammar.md): ``--tool-choice required``
and a JSON-schema ``--response-format`` go to ``/v1/completions`` as ``structured_outputs``, and
``check --model`` replays the records at ratio 1 under the same xgrammar masks; vLLM's own reasoning gate (no server)
applies a grammar where an imported record's ``start_after`` says."""
import dataclasses
import json

import pytest
import torch

from agentrl import store
from agentrl.cli.main import main
from agentrl.jobs.check import CheckOptions, run_check
from agentrl.record import OWNER

pytest.importorskip('xgrammar')

SCHEMA = {'type': 'object', 'properties': {'op': {'type': 'string', 'enum': ['read', 'test']},
                                           'line': {'type': 'integer'}}, 'required': ['op', 'line']}


def rollout(out, server, model_dir, *extra):
    return main(['rollout', '--engine', 'vllm', '--server', server.url, '--model', str(model_dir), '--split',
                 'heldout', '--repeats', '1', '--max-turns', '2', '--max-new-tokens', '24', '--chunk-size', '6',
                 '--seed', '7', '--out', str(out), *extra])


def records(out):
    return sorted((r.record for rows in store.scan(out / 'trajectories') for r in rows),
                  key=lambda t: t.provenance.rollout_id)


def policy_texts(recs, tok):
    return [tok.decode(r.ids[r.owner == OWNER['policy']].tolist()) for r in recs]


def test_tool_choice_required_replays_at_ratio_1(server, model_dir, lm, tmp_path):
    assert rollout(tmp_path / 'run', server, model_dir, '--tool-choice', 'required') == 0
    recs = records(tmp_path / 'run')
    assert len(recs) == 6
    cons = {r.provenance.sampling.constraint for r in recs}
    assert len(cons) == 1 and next(iter(cons)).kind == 'tool_call' and next(iter(cons)).tool_choice == 'required'
    assert all(t.startswith('<tool_call>') for t in policy_texts(recs, lm[1]))
    rep = run_check(CheckOptions(path=str(tmp_path / 'run'), model=str(model_dir)))
    assert rep.ok, rep.format()
    assert rep.replay.overall.max_abs_dev < 1e-4 and rep.replay.record_kinds == {'match': 6}
    forced = sum(int((r.sample_logp[r.action_mask > 0] == 0).sum()) for r in recs)
    assert rep.replay.forced == forced > 0
    assert f'forced tokens    {forced} in 6 grammar-constrained records' in rep.format()


def test_json_schema_response_format_replays_at_ratio_1(server, model_dir, lm, tmp_path):
    rf = tmp_path / 'rf.json'
    rf.write_text(json.dumps({'type': 'json_schema', 'json_schema': {'name': 'call', 'schema': SCHEMA}}))
    assert rollout(tmp_path / 'run', server, model_dir, '--response-format', str(rf)) == 0
    recs = records(tmp_path / 'run')
    c = recs[0].provenance.sampling.constraint
    assert c.kind == 'json_schema' and json.loads(c.text) == SCHEMA and c.version == '0.2.8'
    assert all(t.lstrip().startswith('{') for t in policy_texts(recs, lm[1]))
    rep = run_check(CheckOptions(path=str(tmp_path / 'run'), model=str(model_dir)))
    assert rep.ok, rep.format()
    assert rep.replay.overall.max_abs_dev < 1e-4
    # the same records declared without the grammar: every ratio below 1 (a mask only removes tokens). A JSON schema
    # compiled with any_whitespace forces no token (whitespace is always allowed), so the undeclared-grammar verdict,
    # which needs a forced token, is not given here: the records read as a policy change (docs/grammar.md).
    from agentrl import checks
    from agentrl.engines.scorer import load_scorer
    import dataclasses
    assert rep.replay.forced == 0
    bare = [dataclasses.replace(r, provenance=dataclasses.replace(
        r.provenance, sampling=dataclasses.replace(r.provenance.sampling, constraint=None))) for r in recs[:2]]
    rep2 = checks.replay_records(bare, load_scorer(model_dir))
    assert not rep2.ok and rep2.overall.max <= 1.0 + 1e-6
    assert set(rep2.record_kinds) == {'policy_change'}
    assert torch.isfinite(torch.tensor(rep2.overall.max))


def test_vllms_reasoning_gate_applies_the_grammar_where_the_import_declares_it():
    """vLLM's own structured-output gate with ``--reasoning-parser qwen3`` (run in the vLLM venv, no server): it masks
    the steps and feeds the grammar the ids the imported record's ``start_after`` says (docs/grammar.md)."""
    from _tokenizers import tokenizer_path
    from agentrl.constraints import json_schema_constraint
    from agentrl.interop.openai import grammar_start_of
    from agentrl.templates import load_tokenizer
    from .vllm_parsers import vllm_grammar_gate
    tok_dir = tokenizer_path('qwen3')
    tok = load_tokenizer(tok_dir)
    prompt = [151644, 872, 198, 64, 30, 151645, 198, 151644, 77091, 198]             # user 'a?', generation prompt
    two_phase = tok.encode('<think>\nok\n</think>{"op": "read", "line": 1}<|im_end|>', add_special_tokens=False)
    unclosed = tok.encode('<think>\nok<|im_end|>', add_special_tokens=False)
    off = tok.encode('{"op": "test", "line": 2}<|im_end|>', add_special_tokens=False)
    off_prompt = prompt + tok.encode('<think>\n\n</think>\n\n', add_special_tokens=False)    # enable_thinking false
    cases = [{'prompt': prompt, 'turn': two_phase}, {'prompt': prompt, 'turn': unclosed},
             {'prompt': off_prompt, 'turn': off, 'chat_template_kwargs': {'enable_thinking': False}}]
    theirs = vllm_grammar_gate(tok_dir, cases, reasoning_parser='qwen3')
    c = json_schema_constraint(SCHEMA, [151645])
    for case, t in zip(cases, theirs):
        kwargs = case.get('chat_template_kwargs') or {}
        ex = [{'request': {'messages': [], 'response_format': {'type': 'json_object'}, 'chat_template_kwargs': kwargs},
               'response': {'choices': [{'message': {'reasoning': 'ok'}, 'token_ids': case['turn']}]}}]
        declared = dataclasses.replace(c, start_after=grammar_start_of(0, ex, tok, c, None, kwargs))
        turn = case['turn']
        start = declared.grammar_start(turn)
        assert t == {'masked': [declared.grammar_start(turn[:k]) is not None for k in range(len(turn))],
                     'fed': turn[start:] if start is not None else []}, (case, t)
    assert theirs[0]['masked'].count(False) == two_phase.index(151668) + 1 and theirs[1]['fed'] == []
    assert all(theirs[2]['masked'])


def test_the_gateways_forced_tool_choice_goes_to_vllm_as_structured_outputs_and_replays(server, model_dir, lm,
                                                                                      tmp_path):
    """``tool_choice`` naming a function through ``agentrl serve`` on the vLLM engine (thinking off: the grammar from
    the first token): the turn is the named call's Hermes block, the record declares the grammar, ``check --model``
    replays it."""
    from agentrl.engines.vllm.engine import VLLMEngine
    from agentrl.gateway import Gateway, parse_request
    from agentrl.gym import TOOL_SCHEMAS
    from agentrl.templates.chat import function_tools
    gw = Gateway(VLLMEngine([server.url], model_dir, max_new_tokens=64), tmp_path / 'run')
    _, s = gw.open_session({'rollout_id': 'forced'})
    body = {'messages': [{'role': 'user', 'content': 'Fix clamp.'}], 'tools': function_tools(TOOL_SCHEMAS),
            'tool_choice': {'type': 'function', 'function': {'name': 'read'}}, 'seed': 2, 'max_tokens': 64,
            'temperature': 0.5, 'chat_template_kwargs': {'enable_thinking': False}}
    r, _, _ = gw.chat(s, parse_request(json.dumps(body).encode(), 1 << 20)[0], 'd', 0)
    gw.finish(s, 1.0, {})
    [rec] = records(tmp_path / 'run')
    c = rec.provenance.sampling.constraint
    assert (c.kind, c.tool_choice, c.start_after) == ('tool_call', 'read', ())
    assert policy_texts([rec], lm[1])[0].startswith('<tool_call>')
    if r['choices'][0]['finish_reason'] == 'tool_calls':
        assert [t['function']['name'] for t in r['choices'][0]['message']['tool_calls']] == ['read']
    rep = run_check(CheckOptions(path=str(tmp_path / 'run'), model=str(model_dir)))
    assert rep.ok, rep.format()
    assert rep.replay.overall.max_abs_dev < 1e-4
