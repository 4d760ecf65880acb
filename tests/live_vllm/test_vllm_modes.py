"""vLLM server modes: raw log-probs caught by ``check``, tools with the hermes parser, Ray workers.

A second server (core 0; the session's runs on core 1) serves raw log-probs with
``--enable-auto-tool-choice --tool-call-parser hermes``; the Ray test uses the session's server.
"""
import json
import os
import subprocess
import sys
import urllib.request
from dataclasses import replace

import pytest
import torch

import agentrl as arl
from agentrl import interop, store
from agentrl.cli.main import main
from agentrl.engines import vllm
from agentrl.gym import TOOL_SCHEMAS
from agentrl.record import SamplingSpec
from agentrl.templates.chat import function_tools
from agentrl.jobs.bugfix import BugFixOptions, bugfix_server_rollouts, bugfix_template

T07 = SamplingSpec(temperature=0.7)


@pytest.fixture(scope='module')
def raw_server(model_dir, vllm_py, tmp_path_factory):
    log = tmp_path_factory.mktemp('vllm-raw-log') / 'server.log'
    options = vllm.VLLMServerOptions(name='tiny-raw', cpus='0', logprobs_mode='raw_logprobs', tools=True,
                                     max_model_len=2048, max_num_seqs=8, ready_timeout=600)
    srv = vllm.VLLMServer(model_dir, options, python=vllm_py, log_path=log)
    with srv:
        yield srv


@pytest.fixture(scope='module')
def raw_recs(raw_server, lm):
    """3 BugFix episodes at T=0.7 (raw != processed), the mode probed at start-up."""
    template = bugfix_template(lm[1])
    return bugfix_server_rollouts('vllm', [raw_server.endpoint], template, arl.make_tasks('all')[:3], BugFixOptions(spec=T07, max_new_tokens=16, max_turns=2), seeds=[21, 22, 23])


def test_the_probe_answers_raw_on_a_raw_logprobs_server(raw_server, lm):
    prompt = lm[1].encode('Fix clamp.', add_special_tokens=False)
    assert vllm.check_logp_mode([raw_server.endpoint], prompt) == 'raw'
    assert '--logprobs-mode' in raw_server.command() and 'raw_logprobs' in raw_server.command()


def test_raw_logprobs_declared_processed_are_a_logp_mode_mismatch(raw_recs, model_dir, tmp_path, capsys):
    assert {r.provenance.sampling.logp_mode for r in raw_recs} == {'raw'}
    assert {r.info['vllm']['logp_mode'] for r in raw_recs} == {'raw'}
    store.write_trajectories(tmp_path / 'raw.parquet', raw_recs)
    assert main(['check', str(tmp_path / 'raw.parquet'), '--model', str(model_dir)]) == 0
    out = capsys.readouterr().out
    assert 'logp_mode_mismatch' not in out and out.rstrip().endswith('result: OK'), out
    lying = [replace(r, provenance=replace(r.provenance, sampling=replace(r.provenance.sampling,
                                                                          logp_mode='processed')))
             for r in raw_recs]
    store.write_trajectories(tmp_path / 'lying.parquet', lying)
    assert main(['check', str(tmp_path / 'lying.parquet'), '--model', str(model_dir)]) == 1
    out = capsys.readouterr().out
    assert 'logp_mode_mismatch' in out and 'result: FAILED' in out, out
    from agentrl.jobs.check import CheckOptions, run_check
    rep = run_check(CheckOptions(path=str(tmp_path / 'lying.parquet'), model=str(model_dir)))
    assert not rep.ok and len(rep.replays) == 3 and {r.kind for r in rep.replays} == {'logp_mode_mismatch'}


def test_a_chat_request_with_tools_is_accepted_by_the_hermes_parser_and_imports(raw_server, lm, model_dir, tmp_path,
                                                                                capsys):
    tools = function_tools(TOOL_SCHEMAS)
    body = {'model': raw_server.endpoint.model, 'messages': [{'role': 'user', 'content': 'Fix clamp.'}],
            'tools': tools, 'max_tokens': 24, 'temperature': 1.0, 'top_p': 1.0, 'top_k': 0, 'min_p': 0.0,
            'repetition_penalty': 1.0, 'presence_penalty': 0.0, 'frequency_penalty': 0.0, 'seed': 7,
            'logprobs': True, 'top_logprobs': 0, 'return_token_ids': True, 'skip_special_tokens': False}
    req = urllib.request.Request(raw_server.url + '/v1/chat/completions', data=json.dumps(body).encode(),
                                 headers={'Content-Type': 'application/json'})
    with urllib.request.urlopen(req, timeout=120) as r:
        assert r.status == 200
        resp = json.loads(r.read())
    assert resp['choices'][0]['token_ids'] and resp['prompt_token_ids']
    ep = {'exchanges': [{'request': body, 'response': resp}], 'group_id': 'tools', 'rollout_id': '0'}
    [rec] = interop.from_openai([ep], lm[1], spec=SamplingSpec(logp_mode='raw'), source='vllm')
    assert rec.ids[:len(resp['prompt_token_ids'])].tolist() == resp['prompt_token_ids']   # tools rendered as served
    assert rec.provenance.sampling.logp_mode == 'raw'
    store.write_trajectories(tmp_path / 'tools.parquet', [rec])
    assert main(['check', str(tmp_path / 'tools.parquet')]) == 0
    assert main(['check', str(tmp_path / 'tools.parquet'), '--model', str(model_dir)]) == 0
    assert capsys.readouterr().out.rstrip().endswith('result: OK')


def by_id(path):
    out = {}
    for t in arl.read_trajectories(path):
        key = (t.provenance.group_id, t.provenance.rollout_id)
        assert key not in out, f'{key} stored twice'
        out[key] = t
    return out


def test_ray_workers_2_give_the_records_of_workers_0(server, model_dir, tmp_path):
    pytest.importorskip('ray')
    args = ['rollout', '--engine', 'vllm', '--server', server.url, '--model', str(model_dir), '--split', 'heldout',
            '--repeats', '1', '--max-turns', '2', '--max-new-tokens', '8', '--chunk-size', '2', '--seed', '9']
    assert main([*args, '--workers', '0', '--out', str(tmp_path / 'w0')]) == 0
    env = dict(os.environ, RAY_USAGE_STATS_ENABLED='0', RAY_worker_niceness='0')
    p = subprocess.run([sys.executable, '-m', 'agentrl', *args, '--workers', '2', '--out', str(tmp_path / 'w2')],
                       capture_output=True, text=True, timeout=600, env=env)
    assert p.returncode == 0, p.stdout + p.stderr
    a, b = by_id(tmp_path / 'w0' / 'trajectories'), by_id(tmp_path / 'w2' / 'trajectories')
    assert len(a) == 6 and a.keys() == b.keys()
    for k in a:
        assert a[k].ids.tolist() == b[k].ids.tolist()
        assert a[k].sample_logp.numpy().tobytes() == b[k].sample_logp.numpy().tobytes()
        assert a[k].provenance.seed == b[k].provenance.seed and a[k].info['vllm'] == b[k].info['vllm']
    assert json.loads((tmp_path / 'w2' / 'summary.json').read_text())['engine']['workers'] == 2
