"""Grammar-constrained sampling (docs/grammar.md): the declared constraint, the HF engine under it, and its
exact replay.

A small random Qwen3 (the real tokenizer) samples BugFix turns under xgrammar constraints; the replay rebuilds the
grammar over each record's own ids. CPU only, fp32.
"""
import dataclasses
import json

import pytest
import torch

from _tokenizers import tokenizer_path

pytest.importorskip('transformers')
xgr = pytest.importorskip('xgrammar')

import agentrl as arl  # noqa: E402
from agentrl import checks  # noqa: E402
from agentrl.checks import ConstrainedSupportError  # noqa: E402
from agentrl.constraints import (Constraint, ConstraintError, Grammar, json_schema_constraint,  # noqa: E402
                                 response_format_constraint, tool_call_constraint)
from agentrl.engines import hf  # noqa: E402
from agentrl.engines.scorer import hf_scorer  # noqa: E402
from agentrl.record import OWNER, SamplingSpec  # noqa: E402
from agentrl.store import read_trajectories, write_trajectories  # noqa: E402
from agentrl.templates import ChatTemplate  # noqa: E402
from agentrl.jobs.bugfix import BugFixOptions, bugfix_rollouts  # noqa: E402

REGEX = r'(read|test)\(\)'


@pytest.fixture(scope='module')
def model_dir(tmp_path_factory):
    return hf.make_test_model(tmp_path_factory.mktemp('tiny-qwen3'), tokenizer_path('qwen3'))


@pytest.fixture(scope='module')
def lm(model_dir):
    return hf.load_model(model_dir)


@pytest.fixture(scope='module')
def template(lm):
    return ChatTemplate(lm[1], tools=arl.TOOL_SCHEMAS)


@pytest.fixture(scope='module')
def tasks():
    return arl.make_tasks('all')


def rollout(lm, template, tasks, constraint, n=3, spec=SamplingSpec(), turns=2, tokens=24):
    model, tok = lm
    spec = dataclasses.replace(spec, constraint=constraint)
    return bugfix_rollouts(model, tok, tasks[:n], BugFixOptions(spec=spec, max_new_tokens=tokens, max_turns=turns, seed=5), template=template)


@pytest.fixture(scope='module')
def tool_records(lm, template, tasks):
    return rollout(lm, template, tasks, tool_call_constraint(arl.TOOL_SCHEMAS, 'required', template.stop_ids))


@pytest.fixture(scope='module')
def regex_records(lm, template, tasks):
    c = Constraint('regex', REGEX, 'xgrammar', xgr_version(), tuple(template.stop_ids))
    return rollout(lm, template, tasks, c, n=4, turns=1)


def xgr_version():
    from importlib.metadata import version
    return version('xgrammar')


def policy_text(rec, tok):
    ids = torch.as_tensor(rec.ids)
    return tok.decode(ids[torch.as_tensor(rec.owner) == OWNER['policy']].tolist())


def test_constraint_round_trip_and_old_specs_keep_their_bytes():
    c = tool_call_constraint(arl.TOOL_SCHEMAS, 'required', [151645])
    spec = SamplingSpec(temperature=0.7, constraint=c)
    d = spec.to_dict()
    assert d['constraint']['kind'] == 'tool_call' and d['constraint']['stop_ids'] == [151645]
    assert d['constraint']['version'] == '0.2.8' and d['constraint']['tool_choice'] == 'required'
    assert SamplingSpec.from_dict(json.loads(json.dumps(d))) == spec
    assert SamplingSpec(temperature=0.7).to_dict() == {'temperature': 0.7, 'top_k': 0, 'top_p': 1.0, 'min_p': 0.0,
                                                       'logp_mode': 'processed'}
    with pytest.raises(ValueError, match=r"Constraint.kind must be one of .* got 'ebnf'"):
        Constraint('ebnf', 'x')
    with pytest.raises(ValueError, match=r"Constraint: unknown key\(s\) \['schema'\]"):
        SamplingSpec.from_dict({'constraint': {'kind': 'regex', 'text': 'a', 'schema': 1}})
    assert response_format_constraint({'type': 'text'}) is None
    rf = response_format_constraint({'type': 'json_schema', 'json_schema': {'name': 'a', 'schema': {'type': 'integer'}}})
    assert rf == json_schema_constraint({'type': 'integer'}) and rf.text == '{"type": "integer"}'
    with pytest.raises(ConstraintError, match="tool_choice 'write' names no tool of"):
        tool_call_constraint(arl.TOOL_SCHEMAS, 'write')


def test_constrained_hf_rollout_replays_at_ratio_1(lm, template, tool_records, tmp_path):
    model, tok = lm
    texts = [policy_text(r, tok) for r in tool_records]
    assert all(t.startswith('<tool_call>') for t in texts), texts
    # stored, digested and read back with its constraint
    write_trajectories(tmp_path / 'c.parquet', tool_records)
    back = read_trajectories(tmp_path / 'c.parquet')
    assert [r.provenance.sampling for r in back] == [r.provenance.sampling for r in tool_records]
    assert back[0].provenance.sampling.constraint.kind == 'tool_call'
    rep = checks.replay_records(back, hf_scorer(model), tokenizer=tok)
    assert rep.ok, rep.table()
    assert rep.overall.n == sum(int(torch.as_tensor(r.action_mask).sum()) for r in tool_records)
    assert rep.overall.max_abs_dev < 1e-4
    stored_zero = sum(int((torch.as_tensor(r.sample_logp)[torch.as_tensor(r.action_mask) > 0] == 0).sum())
                      for r in tool_records)
    assert rep.forced == stored_zero > 0


def test_stripping_the_constraint_is_a_support_mismatch(lm, tool_records):
    model, tok = lm
    bare = [dataclasses.replace(r, provenance=dataclasses.replace(
        r.provenance, sampling=dataclasses.replace(r.provenance.sampling, constraint=None))) for r in tool_records[:2]]
    rep = checks.replay_records(bare, hf_scorer(model), tokenizer=tok)
    assert rep.record_kinds == {'support_mismatch': len(bare)}
    assert all('likely an undeclared grammar constraint (tool_choice, response_format, structured output)' in r.detail
               for r in rep.records)
    assert rep.overall.max <= 1.0 + 1e-6


def test_tampered_id_is_refused_by_name(lm, tool_records):
    model, tok = lm
    rec = tool_records[0]
    ids = list(rec.ids)
    owner = torch.as_tensor(rec.owner)
    first = int((owner == OWNER['policy']).nonzero()[0])
    bad = tok.encode('hello', add_special_tokens=False)[0]
    ids[first + 2] = bad
    tampered = dataclasses.replace(rec, ids=torch.as_tensor(ids, dtype=rec.ids.dtype) if hasattr(rec.ids, 'dtype')
                                   else ids)
    with pytest.raises(ConstrainedSupportError,
                       match=rf'ids\[{first + 2}\]: record .*: the declared tool_call constraint rejects token {bad}'):
        checks.replay_records([tampered], hf_scorer(model), tokenizer=tok)


def test_unrebuildable_constraint_is_refused(lm, tool_records):
    model, tok = lm
    rec = tool_records[0]
    c = dataclasses.replace(rec.provenance.sampling.constraint, backend='outlines')
    odd = dataclasses.replace(rec, provenance=dataclasses.replace(
        rec.provenance, sampling=dataclasses.replace(rec.provenance.sampling, constraint=c)))
    with pytest.raises(ConstrainedSupportError, match=r"backend 'outlines' is not one agentrl can rebuild"):
        checks.replay_records([odd], hf_scorer(model), tokenizer=tok)
    with pytest.raises(ConstrainedSupportError, match='the replay has no tokenizer'):
        checks.replay_records([rec], hf_scorer(model))


def _brute_force_forced(grammar, tok_ids, start, rows, V):
    """Single-token supports by trying every token of the vocabulary after each prefix."""
    n = 0
    for r in rows:
        m = grammar.matcher()
        for t in tok_ids[start:r + 1]:
            assert m.accept_token(int(t))
        ok = 0
        for t in range(V):
            if m.accept_token(t):
                ok += 1
                m.rollback(1)
                if ok > 1:
                    break
        n += ok == 1
    return n


def test_forced_count_equals_brute_force(lm, regex_records):
    model, tok = lm
    rep = checks.replay_records(regex_records, hf_scorer(model), tokenizer=tok)
    assert rep.ok, rep.table()
    V = model.config.vocab_size
    g = Grammar(regex_records[0].provenance.sampling.constraint, tok, V)
    brute = 0
    for rec in regex_records:
        rows = (torch.as_tensor(rec.action_mask) > 0).nonzero().flatten().tolist()
        start = rows[0] + 1
        brute += _brute_force_forced(g, list(rec.ids), start, rows, V)
    assert rep.forced == brute > 0
    assert [r.forced for r in rep.records] == [
        int((torch.as_tensor(r.sample_logp)[torch.as_tensor(r.action_mask) > 0] == 0).sum()) for r in regex_records]


def test_vllm_request_sends_the_exact_text_and_import_reads_requests():
    from agentrl.constraints import request_constraint
    from agentrl.engines.vllm.client import request_body
    c = tool_call_constraint(arl.TOOL_SCHEMAS, 'required', [151645])
    body = request_body('m', [1, 2], SamplingSpec(constraint=c), max_tokens=4, stop_ids=[151645], seed=0)
    assert body['structured_outputs'] == {'structural_tag': c.text}
    j = json_schema_constraint({'type': 'integer'})
    assert request_body('m', [1], SamplingSpec(constraint=j), max_tokens=1, stop_ids=[], seed=None)[
        'structured_outputs'] == {'json': '{"type": "integer"}'}
    assert 'structured_outputs' not in request_body('m', [1], SamplingSpec(), max_tokens=1, stop_ids=[], seed=None)
    assert request_constraint({'tool_choice': 'required', 'tools': arl.TOOL_SCHEMAS}, [151645]) == c
    named = request_constraint({'tool_choice': {'type': 'function', 'function': {'name': 'read'}},
                                'tools': arl.TOOL_SCHEMAS})
    tags = json.loads(named.text)['format']['tags']
    assert named.tool_choice == 'read' and [t['begin'] for t in tags] == [
        '<tool_call>\n{"name": "read", "arguments": ', '<tool_call>{"name": "read", "arguments": ']
    assert request_constraint({'structured_outputs': {'regex': 'a+'}}, [7]) == Constraint(
        'regex', 'a+', 'xgrammar', xgr_version(), (7,))
    assert request_constraint({'guided_json': {'type': 'integer'}}).text == '{"type": "integer"}'
    assert request_constraint({'response_format': {'type': 'json_object'}}).text == '{"type": "object"}'
    assert request_constraint({'tool_choice': 'auto', 'tools': arl.TOOL_SCHEMAS}) is None
    assert request_constraint({'temperature': 1.0}) is None


def test_mask_forced_leaves_forced_tokens_out_and_is_accepted(tool_records):
    from agentrl.constraints import forced_rows, mask_forced
    rec = tool_records[0]
    n = int(forced_rows(rec).sum())
    masked = mask_forced(rec)
    assert n > 0 and int(masked.action_mask.sum()) == int(rec.action_mask.sum()) - n
    checks.validate(masked)                           # forced rows with mask 0 are not a missing mask
    assert not bool(forced_rows(masked).any())
    bare = dataclasses.replace(rec, provenance=dataclasses.replace(
        rec.provenance, sampling=dataclasses.replace(rec.provenance.sampling, constraint=None)))
    assert mask_forced(bare) is bare and not bool(forced_rows(bare).any())


def test_rollout_flags_build_the_constraint(tmp_path):
    from agentrl.jobs.plan import RolloutOptions
    opts = RolloutOptions(engine='hf', tool_choice='required')
    assert opts.constraint([151645]) == tool_call_constraint(arl.TOOL_SCHEMAS, 'required', [151645])
    with pytest.raises(ConstraintError, match=r"tool_choice 'write' names no tool of \['read', 'edit', 'test'"):
        RolloutOptions(engine='hf', tool_choice='write').constraint(())
    rf = tmp_path / 'rf.json'
    rf.write_text(json.dumps({'type': 'json_schema', 'json_schema': {'name': 'n', 'schema': {'type': 'object'}}}))
    assert RolloutOptions(engine='hf', response_format=str(rf)).constraint(()).text == '{"type": "object"}'
    with pytest.raises(ValueError, match='--tool-choice and --response-format are two grammars; pass one'):
        RolloutOptions(engine='hf', tool_choice='required', response_format=str(rf)).constraint(())
    rf.write_text('{')
    with pytest.raises(ValueError, match=r"--response-format '.*rf.json': Expecting"):
        RolloutOptions(engine='hf', response_format=str(rf)).constraint(())


def test_check_refuses_a_grammar_that_rejects_the_ids_by_name(lm, model_dir, tool_records, tmp_path):
    from agentrl.jobs.check import CheckOptions, run_check
    tok = lm[1]
    rec = tool_records[1]
    first = int((rec.owner == OWNER['policy']).nonzero()[0])
    ids = rec.ids.clone()
    ids[first] = tok.encode('hello', add_special_tokens=False)[0]
    write_trajectories(tmp_path / 'bad.parquet', [tool_records[0], dataclasses.replace(rec, ids=ids)])
    rep = run_check(CheckOptions(path=str(tmp_path / 'bad.parquet'), model=str(model_dir)))
    assert not rep.ok and rep.kinds == {'ConstrainedSupportError': 1}
    assert 'the declared tool_call constraint rejects token' in rep.format()
    assert rep.replay.forced == int((tool_records[0].sample_logp[tool_records[0].action_mask > 0] == 0).sum())
