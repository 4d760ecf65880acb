"""agentrl.engines.contract and .factory: one turn-level contract, one registry that knows engines by name.

The HF backends run on a small random Qwen3 with the real tokenizer (CPU, fp32), in process and in a
child process; the vLLM backend is exercised by tests/live_vllm. The last test reads every module's
syntax tree: no module outside the factory compares an engine name with a string literal.
"""
import ast
import dataclasses
from pathlib import Path

import pytest

from _tokenizers import tokenizer_path

import agentrl
from agentrl.engines import contract
from agentrl.engines.contract import (BudgetExceeded, EngineDied, EngineError, EngineUnreachable, RequestRefused,
                                      TurnRequest, TurnResult)
from agentrl.engines.factory import BACKENDS, ENGINES, backend, open_engine, start_server
from agentrl.engines.vllm import ServerDied, VLLMError
from agentrl.record import SamplingSpec

IM_END = 151645
SPEC = SamplingSpec(temperature=0.9, top_p=0.95)


def test_error_types_share_one_base_and_keep_the_old_ones():
    assert [issubclass(t, EngineError) for t in (EngineUnreachable, EngineDied, BudgetExceeded, RequestRefused,
                                                   VLLMError, ServerDied)] == [True] * 6
    assert issubclass(EngineError, RuntimeError) and issubclass(ServerDied, EngineDied)
    assert issubclass(BudgetExceeded, ValueError) and issubclass(RequestRefused, ValueError)
    assert not issubclass(VLLMError, EngineDied)
    e = ServerDied('http://a:1', 'HTTP 500: boom')
    assert (e.url, e.detail, isinstance(e, EngineDied)) == ('http://a:1', 'HTTP 500: boom', True)


def test_check_request_refuses_an_empty_prompt_and_a_budget_below_one():
    with pytest.raises(RequestRefused, match=r'^X: prompt_ids is empty; pass the ids the template renders$'):
        contract.check_request(TurnRequest((), SPEC, 4, 0), 'X')
    with pytest.raises(BudgetExceeded, match=r'^X: a token budget of 0; every turn needs at least one token '):
        contract.check_request(TurnRequest((1, 2), SPEC, 0, 0), 'X')
    contract.check_request(TurnRequest((1,), SPEC, 1, 0), 'X')


def test_turn_request_is_frozen_and_result_names_its_stop_reason():
    r = TurnRequest((1, 2), SPEC, 4, 7, frozenset({IM_END}), on_token=print, key='s')
    with pytest.raises(dataclasses.FrozenInstanceError):
        r.seed = 8
    assert r == dataclasses.replace(r, on_token=None)          # the callback is no part of the request's value
    assert (TurnResult(ids=[5, IM_END]).stop_reason, TurnResult(ids=[5], truncated=True).stop_reason) == \
        ('stop', 'length')


def test_registry_declares_the_facts_callers_act_on():
    assert ENGINES == ('tinyagent', 'hf', 'vllm')
    facts = {n: (b.policy, b.model_dir, b.servers, b.chat, b.model_only, b.grammar) for n, b in BACKENDS.items()}
    assert facts == {'tinyagent': ('model', False, False, False, False, False),
                     'hf': ('hf', True, False, True, True, True),
                     'vllm': ('vllm', True, True, True, True, True)}
    with pytest.raises(ValueError, match=r"^--engine 'sglang' is not known; choose from tinyagent, hf, vllm$"):
        backend('sglang')
    with pytest.raises(ValueError, match=r'^--engine tinyagent has no turn-level engine \(it runs its own batched '
                                         r'loop\); choose one of hf, vllm$'):
        open_engine('tinyagent', model='.')
    with pytest.raises(ValueError, match=r'^--engine-process is for an in-process engine; --engine vllm is already '
                                         r'another process$'):
        open_engine('vllm', model='.', process=True)
    with pytest.raises(ValueError, match=r'^--engine hf starts no server; drop --server$'):
        start_server('hf', '.')


# ---------------------------------------------------------------------------------------- the HF backends
@pytest.fixture(scope='module')
def model_dir(tmp_path_factory):
    pytest.importorskip('transformers')
    from agentrl.engines import hf
    return hf.make_test_model(tmp_path_factory.mktemp('contract-model'), tokenizer_path('qwen3'),
                              token_rates={'</think>': 0.05})


@pytest.fixture(scope='module')
def engine(model_dir):
    e = open_engine('hf', model=model_dir, device='cpu', max_new_tokens=16)
    yield e
    e.close()


def prompt(engine) -> list:
    return engine.tokenizer('<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n')['input_ids']


def test_hf_in_process_samples_streams_and_reproduces(engine, model_dir):
    from agentrl.engines.fingerprint import model_fingerprint
    from agentrl.engines.hf import HFSampler
    import torch
    seen = []
    req = TurnRequest(tuple(prompt(engine)), SPEC, 12, 7, frozenset({IM_END}), on_token=seen.append)
    a = engine.sample(req)
    assert (engine.policy, engine.concurrency, engine.streams) == ('hf', 1, True)
    assert engine.model_name == f'{Path(model_dir).name}@{model_fingerprint(model_dir)}'
    assert engine.record_spec(SPEC) is SPEC
    assert 1 <= len(a.ids) <= 12 and len(a.logp) == len(a.ids) and a.seed == 7 and a.server is None
    assert a.truncated == (a.ids[-1] != IM_END) and a.span[0] <= a.span[1]
    assert seen == [a.ids[:k] for k in range(1, len(a.ids) + 1)]
    b = engine.sample(dataclasses.replace(req, on_token=None))
    assert (b.ids, b.logp, b.truncated) == (a.ids, a.logp, a.truncated)
    t = HFSampler(engine.model, {IM_END}, SPEC).sample([prompt(engine)], [torch.Generator().manual_seed(7)],
                                                       max_new_tokens=12)[0]
    assert (t.ids, t.logp) == (a.ids, a.logp)         # the contract adds nothing to the sampler's draw
    with pytest.raises(BudgetExceeded, match=r'^HFEngine.sample: a token budget of 0;'):
        engine.sample(dataclasses.replace(req, max_new_tokens=0))
    with pytest.raises(RequestRefused, match=r'^HFEngine.sample: prompt_ids is empty;'):
        engine.sample(dataclasses.replace(req, prompt_ids=()))


def test_hf_child_process_samples_what_the_in_process_engine_samples(engine, model_dir):
    child = open_engine('hf', model=model_dir, device='cpu', max_new_tokens=16, process=True)
    try:
        seen = []
        req = TurnRequest(tuple(prompt(engine)), SPEC, 12, 7, frozenset({IM_END}))
        a = child.sample(dataclasses.replace(req, on_token=seen.append))
        b = engine.sample(req)
        assert (a.ids, a.truncated, a.seed) == (b.ids, b.truncated, 7)
        assert a.logp == pytest.approx(b.logp, abs=1e-6)          # the child's torch threads round differently
        assert seen == [a.ids[:k] for k in range(1, len(a.ids) + 1)]
        assert (child.model_name, child.max_context, child.policy) == (engine.model_name, engine.max_context, 'hf')
        with pytest.raises(BudgetExceeded):
            child.sample(dataclasses.replace(req, max_new_tokens=0))
        child._proc.kill()
        child._proc.join(timeout=120)
        with pytest.raises(EngineDied, match=rf'^the HF engine process \(pid {child.pid}\) stopped \('):
            child.sample(req)
    finally:
        child.close()


# ---------------------------------------------------------------------------------------- static facts
SRC = Path(agentrl.__file__).parent


def _engine_name_tests(tree) -> list:
    """Lines where a name or attribute called ``engine`` is compared with a string (or a tuple of strings)."""
    def named_engine(n):
        return (isinstance(n, ast.Name) and n.id == 'engine') or (isinstance(n, ast.Attribute) and n.attr == 'engine')

    def literal(n):
        if isinstance(n, ast.Constant):
            return isinstance(n.value, str)
        return isinstance(n, (ast.Tuple, ast.List, ast.Set)) and any(literal(e) for e in n.elts)
    bad = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            if any(named_engine(s) for s in sides) and any(literal(s) for s in sides):
                bad.append(node.lineno)
    return bad


def test_no_module_outside_the_factory_tests_an_engine_name():
    found = {str(p.relative_to(SRC)): lines for p in sorted(SRC.rglob('*.py'))
             if p.name != 'factory.py' and (lines := _engine_name_tests(ast.parse(p.read_text())))}
    assert found == {}


def test_the_engine_name_check_can_fail():
    tree = ast.parse("if opts.engine == 'hf': pass\nif engine in ('hf', 'vllm'): pass\nif engine != x: pass\n")
    assert _engine_name_tests(tree) == [1, 2]


def test_the_gateway_holds_no_engine_code():
    gw = {p.name for p in (SRC / 'gateway').glob('*.py')}
    assert {'engine.py', 'engine_proc.py', 'vllm.py'} & gw == set()
