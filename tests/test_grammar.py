"""Grammar-constrained sampling (docs/grammar.md): the declared constraint, the HF engine under it, and its
exact replay.

A small random Qwen3 (the real tokenizer) samples BugFix turns under xgrammar constraints; the replay rebuilds the
grammar over each record's own ids. CPU only, fp32.
"""
import dataclasses
import json
import math

import pytest
import torch

from _tokenizers import tokenizer_path

pytest.importorskip('transformers')
xgr = pytest.importorskip('xgrammar')

import agentrl as arl  # noqa: E402
from agentrl import checks, interop  # noqa: E402
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


# ---------------------------------------------------------------------------- a grammar after the reasoning
# vLLM with a reasoning parser and SGLang's reasoner grammar apply the grammar only after the close mark.
THINK, CLOSE, END = 151667, 151668, 151645          # Qwen3 <think>, </think>, <|im_end|>
PROMPT = [151644, 872, 198, 64, 30, 151645, 198, 151644, 77091, 198]     # user 'a?', then the generation prompt
SCHEMA = {'type': 'object', 'properties': {'a': {'type': 'integer'}}, 'required': ['a']}
TWO_PHASE = [THINK, 198, 562, 198, CLOSE, 4913, 64, 788, 220, 16, 92, END]   # <think>\nok\n</think>{"a": 1}<|im_end|>


@pytest.fixture(scope='module')
def qwen3_tok():
    from agentrl.templates import load_tokenizer
    return load_tokenizer(tokenizer_path('qwen3'))


def two_phase(start_after=(CLOSE,)):
    return dataclasses.replace(json_schema_constraint(SCHEMA, [END]), start_after=start_after)


def test_a_grammar_after_the_reasoning_masks_only_after_the_close_mark(qwen3_tok):
    from agentrl.constraints import GrammarRejection, support_sizes
    tok, V = qwen3_tok, len(qwen3_tok)
    assert tok.encode('<think>\nok\n</think>{"a": 1}<|im_end|>', add_special_tokens=False) == TWO_PHASE
    c = two_phase()
    assert c.to_dict()['start_after'] == [CLOSE] and Constraint.from_dict(json.loads(json.dumps(c.to_dict()))) == c
    assert 'start_after' not in two_phase(()).to_dict()            # from the first token: the bytes of before
    with pytest.raises(ValueError, match=r'^Constraint.start_after must be token ids \(>= 0\), got \[-1\]$'):
        two_phase((-1,))
    assert [c.grammar_start(TWO_PHASE[:k]) for k in (0, 4, 5, 12)] == [None, None, 5, 5]
    assert two_phase(()).grammar_start([THINK]) == 0
    g = Grammar(c, tok, V)
    sizes = [int(support_sizes(g.next_bitmask([TWO_PHASE[:k]]), V)[0]) for k in range(len(TWO_PHASE))]
    assert sizes == [V] * 5 + [7, 1, 13, 434, 434, 434, 1]       # the reasoning and its close mark: unconstrained
    first = g.next_allowed([TWO_PHASE[:5]])[0].nonzero().flatten().tolist()
    assert [tok.decode([i]) for i in first] == ['{', '{\n', '{\r\n', '{\n\n', '{"', '{\r\n\r\n', '{\n\n\n']
    rows = list(range(len(PROMPT) - 1, len(PROMPT) + len(TWO_PHASE) - 1))    # the replay's rows of the turn
    assert support_sizes(g.turn_bitmask(PROMPT + TWO_PHASE, len(PROMPT), rows), V).tolist() == sizes
    no_close = [THINK, 198, 562, END]                                # never closes its reasoning: all allowed
    assert support_sizes(g.turn_bitmask(PROMPT + no_close, len(PROMPT), rows[:4]), V).tolist() == [V] * 4
    # the grammar starts right after the close mark, so "\n\n" (271) there is outside it, as on the servers
    with pytest.raises(GrammarRejection, match=r'^the grammar rejects token 271 at position 5$'):
        g.next_bitmask([TWO_PHASE[:5] + [271]])
    with pytest.raises(GrammarRejection, match=rf'^the grammar rejects token {THINK} at position 0$'):
        Grammar(two_phase(()), tok, V).next_bitmask([[THINK]])


def test_the_hf_sampler_draws_freely_inside_the_reasoning(lm):
    from agentrl.engines.hf.sampler import HFSampler
    model, tok = lm
    V = model.config.vocab_size
    s = HFSampler(model, [END], SamplingSpec(temperature=0, constraint=two_phase()), tokenizer=tok)
    logits = torch.zeros(2, V)
    logits[:, THINK] = 10.0                           # the model wants <think> again at both rows
    ids, logp = s.choose(logits, turns=[TWO_PHASE[:4], TWO_PHASE[:5]])
    assert ids.tolist() == [THINK, 90]                # inside the reasoning: drawn; after </think>: '{' (id 90)
    assert logp[0].item() == pytest.approx(10 - math.log(math.exp(10) + V - 1), abs=1e-9)
    assert logp[1].item() == pytest.approx(-math.log(7), abs=1e-12)     # 7 allowed tokens, equal logits
    with pytest.raises(ValueError, match=rf'^constraint.start_after=\[{CLOSE}\]: the vllm engine\'s servers run no '):
        from agentrl.engines.vllm.client import structured_outputs
        structured_outputs(two_phase())


def _teacher_logp(model, tok, spec, ids, prompt=PROMPT):
    from agentrl.engines.hf.sampler import HFSampler
    [turn] = HFSampler(model, [END], spec, tokenizer=tok, max_new_tokens=len(ids)).sample([prompt], teacher=[ids])
    assert turn.ids == list(ids)
    return turn.logp


def _sglang(prompt, ids, logp, params, **request):
    return {'request': {'input_ids': prompt, 'sampling_params': dict(
        {'top_p': 1.0, 'top_k': -1, 'min_p': 0.0, 'repetition_penalty': 1.0, 'presence_penalty': 0.0,
         'frequency_penalty': 0.0, 'max_new_tokens': 32}, **params), 'return_logprob': True, **request},
        'response': {'output_ids': ids, 'meta_info': {'output_token_logprobs': [[x, i, None] for x, i in zip(logp, ids)],
                                                      'finish_reason': {'type': 'stop'}}}}


def _vllm(prompt, ids, logp, params, **request):
    return {'request': dict({'prompt': prompt, 'top_p': 1.0, 'top_k': 0, 'min_p': 0.0, 'repetition_penalty': 1.0,
                             'presence_penalty': 0.0, 'frequency_penalty': 0.0, 'max_tokens': 32}, **params, **request),
            'response': {'choices': [{'token_ids': ids, 'prompt_token_ids': prompt, 'finish_reason': 'stop',
                                      'logprobs': {'token_logprobs': list(logp)}}]}}


def _import_and_check(tmp_path, lm, name, episodes, *flags):
    """``agentrl import`` of the episodes (the model folder's tokenizer), then the replay ``agentrl check --model`` runs
    (on the loaded model)."""
    from agentrl.cli.main import main
    src = tmp_path / f'{name}.json'
    src.write_text(json.dumps([{'exchanges': [ex]} for ex in episodes]))
    model_dir = flags[-1]
    assert main(['import', str(src), '--out', str(tmp_path / name), '--tokenizer', str(model_dir), *flags[:-1]]) == 0
    recs = read_trajectories(tmp_path / name / 'trajectories.parquet')
    return recs, checks.replay_records(recs, hf_scorer(lm[0]), tokenizer=lm[1])


def test_a_two_phase_import_declares_its_start_and_check_replays_it(lm, model_dir, tmp_path):
    model, tok = lm
    spec = SamplingSpec(temperature=0.7, constraint=two_phase())
    processed = _teacher_logp(model, tok, spec, TWO_PHASE)
    raw = _teacher_logp(model, tok, dataclasses.replace(spec, logp_mode='raw'), TWO_PHASE)
    assert processed[6] == processed[11] == 0.0 and processed[:4] != raw[:4]     # forced '{"' -> 'a', '}' -> end
    # SGLang /generate: sampling_params.json_schema with require_reasoning (its two-phase grammar)
    sg = _sglang(PROMPT, TWO_PHASE, processed, {'temperature': 0.7, 'json_schema': json.dumps(SCHEMA)},
                 require_reasoning=True)
    [rec], rep = _import_and_check(tmp_path, lm, 'sglang', [sg], '--from', 'sglang', model_dir)
    assert rec.provenance.sampling == spec                 # start_after [</think>]; T=0.7 untruncated: processed
    assert rep.ok and rep.overall.n == 12 and rep.forced == 2, rep.table()
    # vLLM /v1/completions with structured_outputs: the request does not say the server parsed reasoning
    vl = _vllm(PROMPT, TWO_PHASE, raw, {'temperature': 0.7, 'structured_outputs': {'json': json.dumps(SCHEMA)}})
    with pytest.raises(ValueError, match=r"^episode 0 exchange 0: the turn closes a reasoning block \('</think>'\) under "
                                         r'a json_schema constraint, and the exchanges do not say whether the server '
                                         r'applied the grammar after the reasoning \(a reasoning parser\) or from the '
                                         r'first token; pass --grammar-start reasoning or turn \(grammar_start=\)$'):
        interop.from_openai([{'exchanges': [vl]}], tok)
    [rec], rep = _import_and_check(tmp_path, lm, 'vllm', [vl], '--from', 'vllm', '--grammar-start', 'reasoning', model_dir)
    assert rec.provenance.sampling == dataclasses.replace(spec, logp_mode='raw') and rep.ok, rep.table()
    # the same ids declared with the grammar from the first token: refused by name
    start0 = dataclasses.replace(rec, provenance=dataclasses.replace(rec.provenance, sampling=dataclasses.replace(
        rec.provenance.sampling, constraint=two_phase(()))))
    msg = (f'ids[{len(PROMPT)}]: record /0#1: the declared json_schema constraint rejects token {THINK}, so its '
           'allowed-token support is unknown from there on. Fix: the record was not sampled under this constraint (or '
           'was edited): declare the constraint it was sampled under (a server that applied it only after the '
           'reasoning: its start_after, docs/grammar.md), or drop it from RL')
    with pytest.raises(ConstrainedSupportError) as e:
        checks.replay_records([start0], hf_scorer(model), tokenizer=tok)
    assert str(e.value) == msg


def test_the_grammar_start_is_read_from_the_exchanges(qwen3_tok):
    from agentrl.constraints import request_constraint
    from agentrl.interop.openai import grammar_start_of
    tok, c = qwen3_tok, json_schema_constraint(SCHEMA, [END])
    chat = {'request': {'messages': [], 'response_format': {'type': 'json_object'}},
            'response': {'choices': [{'message': {'content': '{"a": 1}', 'reasoning': 'ok'}, 'token_ids': TWO_PHASE}]}}
    assert grammar_start_of(0, [chat], tok, c, None, {}) == (CLOSE,)              # the server parsed reasoning
    assert grammar_start_of(0, [chat], tok, c, 'turn', {}) == ()                  # the flag wins
    assert grammar_start_of(0, [chat], tok, c, None, {'enable_thinking': False}) == ()    # reasoning ended before
    sg = {'request': {'input_ids': [1], 'require_reasoning': False}, 'response': {'output_ids': TWO_PHASE}}
    assert grammar_start_of(0, [sg], tok, c, None, {}) == ()
    sep = {'request': {'messages': [], 'separate_reasoning': True}, 'response': {'choices': [{'token_ids': [5]}]}}
    assert grammar_start_of(0, [sep], tok, c, None, {}) == (CLOSE,)
    with pytest.raises(ValueError, match=r'^episode 0: a grammar after the reasoning needs the tokenizer '
                                         r'\(--tokenizer\) for the reasoning close mark$'):
        grammar_start_of(0, [sep], None, c, None, {})
    assert request_constraint({'sampling_params': {'json_schema': json.dumps(SCHEMA)}}, [END]) == c
    assert request_constraint({'sampling_params': {'regex': 'a+'}}).kind == 'regex'
    assert request_constraint({'sampling_params': {'ebnf': 'root ::= "a"'}}).kind == 'grammar'


# ---------------------------------------------------------------------------- each server's log-prob mode
def _second_choices(model, prompt, n=6):
    """n ids, each the model's second most likely next token: inside any top-k >= 2 support."""
    ids = list(prompt)
    with torch.no_grad():
        for _ in range(n):
            ids.append(int(model(torch.tensor([ids])).logits[0, -1].topk(2).indices[1]))
    return ids[len(prompt):]


def test_each_servers_logprob_mode_is_declared_and_replayed(lm, model_dir, tmp_path):
    from agentrl.interop.openai import server_logp_mode
    model, tok = lm
    spec = SamplingSpec(temperature=0.7, top_k=20)
    ids = _second_choices(model, PROMPT)
    lp = {m: _teacher_logp(model, tok, dataclasses.replace(spec, logp_mode=m), ids) for m in ('raw', 'processed',
                                                                                             'scaled')}
    assert all(lp['processed'][i] > lp['scaled'][i] != lp['raw'][i] for i in range(len(ids)))   # three numbers
    params = {'temperature': 0.7, 'top_k': 20}
    # SGLang: log_softmax(logits / T), never renormalised over the top-k: scaled, by default
    [rec], rep = _import_and_check(tmp_path, lm, 'sg', [_sglang(PROMPT, ids, lp['scaled'], params)], '--from', 'sglang',
                                   model_dir)
    assert rec.provenance.sampling == dataclasses.replace(spec, logp_mode='scaled') and rep.ok, rep.table()
    [rec], rep = _import_and_check(tmp_path, lm, 'sg-raw', [_sglang(PROMPT, ids, lp['scaled'], params)], '--from', 'sglang',
                                   '--logp-mode', 'raw', model_dir)
    assert rec.provenance.sampling.logp_mode == 'raw' and not rep.ok
    assert rep.record_kinds == {'logp_mode_mismatch': 1} and rep.overall.n == len(ids)
    # vLLM: raw by default (--logprobs-mode raw_logprobs), processed when the server ran processed_logprobs
    [rec], rep = _import_and_check(tmp_path, lm, 'vl-raw', [_vllm(PROMPT, ids, lp['raw'], params)], '--from', 'vllm',
                                   model_dir)
    assert rec.provenance.sampling == dataclasses.replace(spec, logp_mode='raw') and rep.ok, rep.table()
    [rec], rep = _import_and_check(tmp_path, lm, 'vl-proc', [_vllm(PROMPT, ids, lp['processed'], params)], '--from', 'vllm',
                                   '--logp-mode', 'processed', model_dir)
    assert rec.provenance.sampling == spec and rep.ok, rep.table()
    [rec], rep = _import_and_check(tmp_path, lm, 'vl-wrong', [_vllm(PROMPT, ids, lp['processed'], params)], '--from',
                                   'vllm', model_dir)
    assert not rep.ok and rep.record_kinds == {'logp_mode_mismatch': 1}
    # declared where it is the same number; refused where no server returns it
    assert server_logp_mode('sglang', None, SamplingSpec(temperature=0.7)) == 'processed'
    with pytest.raises(ValueError, match=r'^--logp-mode processed: SGLang never renormalises its log-probs over top-k '
                                         r'/ top-p / min-p \(log_softmax\(logits / T\) by default: scaled; '
                                         r'SGLANG_RETURN_ORIGINAL_LOGPROB set: raw\); pass --logp-mode scaled or raw$'):
        server_logp_mode('sglang', 'processed', spec)
    with pytest.raises(ValueError, match=r'^--logp-mode raw: SGLang takes its original log-probs'):
        server_logp_mode('sglang', 'raw', SamplingSpec(temperature=0.7, repetition_penalty=1.1))
    with pytest.raises(ValueError, match=r'^--logp-mode scaled: vLLM has no such mode \(--logprobs-mode '
                                         r'processed_logprobs are renormalised over top-k / top-p: processed\); pass '
                                         r'--logp-mode raw or processed$'):
        server_logp_mode('vllm', 'scaled', spec)
    with pytest.raises(ValueError, match=r"^the log-prob mode of 'llamacpp' responses is not known; pass --logp-mode "):
        server_logp_mode('llamacpp', None, spec)
