"""agentrl.engines.vllm against one real vLLM CPU server (conftest): token-in/token-out records, bit for bit.

The server is started once (about 30-160 s on a busy 2-core machine); the tests then take seconds.
test_vllm_server_death.py (last, by name) kills it.
"""
import asyncio
import json
import sys
import struct

import pytest
import torch

import agentrl as arl
from agentrl import checks
from agentrl.engines import vllm
from agentrl.engines.vllm import client as vclient
from agentrl.record import OWNER, SamplingSpec
from agentrl.jobs.bugfix import BugFixOptions, bugfix_server_rollouts, bugfix_template

IM_END = 151645
T1 = SamplingSpec()


def f32(x: float) -> float:
    return struct.unpack('f', struct.pack('f', x))[0]


@pytest.fixture(scope='session')
def template(lm):
    return bugfix_template(lm[1])


@pytest.fixture(scope='session')
def tasks():
    return arl.make_tasks('all')


@pytest.fixture(scope='session')
def run(server, template, tasks):
    """6 BugFix episodes (T=1, 24 tokens a turn, 3 turns) and every request/response pair."""
    responses = []
    seeds = [11, 12, 13, 14, 15, 16]
    recs = bugfix_server_rollouts('vllm', [server.endpoint], template, tasks[:6], BugFixOptions(spec=T1, max_new_tokens=24, max_turns=3), seeds=seeds, responses=responses)
    return recs, responses, seeds


def policy_turns(rec):
    """{turn k: [positions of its policy tokens]}."""
    out = {}
    for j, (o, k) in enumerate(zip(rec.owner.tolist(), rec.turn.tolist())):
        if o == OWNER['policy']:
            out.setdefault(k, []).append(j)
    return out


# ---------------------------------------------------------------------------- without a server
def test_a_head_dim_vllm_cpu_cannot_run_is_refused_with_the_fix(tmp_path):
    cfg = {'hidden_size': 64, 'num_attention_heads': 4, 'head_dim': 16}
    (tmp_path / 'config.json').write_text(json.dumps(cfg))
    with pytest.raises(vllm.VLLMError, match=r'head_dim=16, which vLLM CPU attention does not support .*'
                                             r'agentrl make-test-model OUT --heads 2 --kv-heads 1'):
        vllm.VLLMServer(tmp_path, python=sys.executable).start()
    with pytest.raises(vllm.VLLMError, match=r'no python at .*nope.*make test-vllm.*--vllm-python'):
        vllm.VLLMServer(tmp_path, python=tmp_path / 'nope').start()


@pytest.mark.parametrize('line, cause', [
    ('RuntimeError: Unsupported CPU attention configuration: head_dim=16', 'head size 16 is not supported'),
    ('OSError: [Errno 98] Address already in use', 'the port is already in use'),
    ('RuntimeError: CPU Generator does not use offset', 'a seeded request was prefilled in chunks'),
    ('ValueError: No available memory for the cache blocks.', 'not enough memory'),
    ("ModuleNotFoundError: No module named 'vllm'", 'vllm is not installed'),
])
def test_server_logs_are_read_into_one_cause(line, cause):
    assert vllm.diagnose_log(f'INFO start\n(Worker pid=1) ERROR {line}\n').__getitem__(0).startswith(cause)


def test_turn_seed_is_a_stable_function_of_episode_seed_and_turn():
    assert vllm.turn_seed(7, 0) == 5900736432091606141 and vllm.turn_seed(7, 1) == 7100972255623165257
    assert all(0 <= vllm.turn_seed(s, k) < 2 ** 63 for s in (0, 2 ** 63 - 1) for k in (0, 5))


# ---------------------------------------------------------------------------- with the server
def test_every_request_sends_every_sampling_field(run):
    _, responses, seeds = run
    i, k, body, _ = responses[0]
    assert body['prompt'] and all(isinstance(x, int) for x in body['prompt'])
    for f in ('temperature', 'top_p', 'top_k', 'min_p', 'repetition_penalty', 'presence_penalty', 'frequency_penalty',
              'max_tokens', 'stop_token_ids', 'seed', 'skip_special_tokens', 'ignore_eos', 'min_tokens', 'n'):
        assert f in body, f
    assert body['stop_token_ids'] == [IM_END] and body['seed'] == vllm.turn_seed(seeds[i], k)
    assert (body['temperature'], body['top_p'], body['top_k'], body['min_p']) == (1.0, 1.0, 0, 0.0)


def test_records_hold_the_servers_token_ids_and_logprobs_bit_for_bit(run, server):
    recs, responses, seeds = run
    by_turn = {(i, k): json.loads(raw)['choices'][0] for i, k, _, raw in responses}
    n_turns = 0
    for i, rec in enumerate(recs):
        for k, pos in policy_turns(rec).items():
            ch = by_turn[(i, k)]
            assert rec.ids[pos].tolist() == ch['token_ids']
            got = rec.sample_logp[[p - 1 for p in pos]].tolist()
            assert got == [f32(x) for x in ch['logprobs']['token_logprobs']]
            assert [float(torch.tensor(x, dtype=torch.float32)) for x in got] == ch['logprobs']['token_logprobs']
            assert rec.action_mask[[p - 1 for p in pos]].tolist() == [1.0] * len(pos)
            n_turns += 1
        p = rec.provenance
        assert p.policy == 'vllm' and p.sampling == T1 and p.model == 'tiny' and p.seed == seeds[i]
        assert rec.info['vllm']['server'] == server.url and rec.info['vllm']['logp_mode'] == 'processed'
        assert rec.info['vllm']['turn_seeds'] == [vllm.turn_seed(seeds[i], k) for k in range(rec.info['template']['n_turns'])]
    assert n_turns == len(responses)
    reasons = [r for rec in recs for r in rec.info['vllm']['finish_reasons']]
    assert 'stop' in reasons and 'length' in reasons, reasons


def test_records_pass_check_and_replay_with_the_hf_model(run, lm, tmp_path, capsys):
    from agentrl.cli.main import main
    from agentrl.engines.scorer import hf_scorer
    recs = run[0]
    for rec in recs:
        arl.validate(rec, {'tokenizer': rec.provenance.tokenizer, 'template': rec.provenance.template,
                           'eot_ids': (IM_END,)})
    arl.write_trajectories(tmp_path / 'trajectories', recs)
    assert main(['check', str(tmp_path / 'trajectories')]) == 0, capsys.readouterr().out
    rep = checks.replay_records(recs, hf_scorer(lm[0]), tol=1e-4)
    trained = sum(int(r.action_mask.sum()) for r in recs)
    print(f'replay: {rep.overall.n} tokens, max |ratio - 1| {rep.overall.max_abs_dev:.3g}')
    assert rep.ok and rep.overall.n == trained and rep.overall.max_abs_dev < 1e-4, rep.overall


def test_the_same_seeds_give_the_same_records(run, server, template, tasks):
    recs, _, seeds = run
    again = bugfix_server_rollouts('vllm', [server.endpoint], template, tasks[:6][::-1], BugFixOptions(spec=T1, max_new_tokens=24, max_turns=3), seeds=seeds[::-1])[::-1]
    for a, b in zip(recs, again):
        assert torch.equal(a.ids, b.ids) and torch.equal(a.sample_logp, b.sample_logp)
        assert a.info['vllm'] == b.info['vllm']


def test_stop_token_ids_and_length(server):
    async def go():
        async with vclient.session() as http:
            ep = server.endpoint
            prompt = list(range(1000, 1040))
            body = vllm.request_body(ep.model, prompt, T1, max_tokens=8, stop_ids=(), seed=5)
            free = await vclient.complete(http, ep.url, body)
            stop = next(x for j, x in enumerate(free.ids) if j >= 2 and x not in free.ids[:j])
            cut = free.ids[:free.ids.index(stop) + 1]
            body = vllm.request_body(ep.model, prompt, T1, max_tokens=8, stop_ids=(stop,), seed=5)
            stopped = await vclient.complete(http, ep.url, body)
            return free, stop, cut, stopped, await vclient.probe_logp_mode(http, ep.url, ep.model, prompt)
    free, stop, cut, stopped, mode = asyncio.run(go())
    assert free.finish_reason == 'length' and len(free.ids) == 8 and free.stop_reason is None
    assert stopped.ids == cut and stopped.finish_reason == 'stop' and stopped.stop_reason == stop     # the stop id is kept
    assert stopped.logp == free.logp[:len(cut)]
    assert mode == 'processed'


def test_32_concurrent_seeded_long_prompts_do_not_kill_the_engine(server):
    """The chunked-prefill crash (docs/vllm.md#chunked-prefill) cannot happen with the server's flags."""
    async def go():
        async with vclient.session() as http:
            ep = server.endpoint
            bodies = [vllm.request_body(ep.model, [(1000 + 7 * i + 13 * j) % 150000 for j in range(1500)], T1,
                                        max_tokens=4, stop_ids=(), seed=100 + i) for i in range(32)]
            return await asyncio.gather(*[vclient.complete(http, ep.url, b) for b in bodies])
    out = asyncio.run(go())
    assert len(out) == 32 and all(len(c.ids) == 4 for c in out) and server.alive()
    assert '--no-enable-chunked-prefill' in server.command()
