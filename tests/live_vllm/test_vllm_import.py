"""agentrl.interop.from_openai on real vLLM /v1/completions responses (the session's server).

A harness that appends ``<|im_end|>`` itself after a turn cut at ``finish_reason: "length"``; penalties read
with vLLM semantics (top level and SGLang ``sampling_params``); ``chat_template_kwargs`` from the requests.
"""
import asyncio
import json

import pytest
import torch

import agentrl as arl
from agentrl import checks, interop
from agentrl.engines import vllm
from agentrl.engines.vllm import client as vclient
from agentrl.record import OWNER, SamplingSpec
from agentrl.templates import ChatRecorder

IM_END = 151645


def exchanges(server, turns):
    """Send ``turns`` = [(prompt ids, request body extras)] in order; [(request, response JSON)]."""
    async def go():
        out = []
        async with vclient.session() as http:
            for prompt, extra in turns(out):
                body = dict(vllm.request_body(server.endpoint.model, prompt, SamplingSpec(), max_tokens=8,
                                              stop_ids=(IM_END,), seed=3), **extra)
                c = await vclient.complete(http, server.url, body)
                out.append((body, json.loads(c.raw)))
        return out
    return asyncio.run(go())


def test_a_harness_appended_end_of_turn_after_length_is_not_trained(server, lm):
    tok = lm[1]
    p0 = ChatRecorder(tok, [{'role': 'user', 'content': 'Fix clamp.'}]).prompt_ids
    tail = tok.encode('\n<|im_start|>user\nGo on.<|im_end|>\n<|im_start|>assistant\n', add_special_tokens=False)

    def turns(out):
        yield p0, {'max_tokens': 3}
        ids = out[0][1]['choices'][0]['token_ids']
        yield p0 + ids + [IM_END] + tail, {}
    ex = exchanges(server, turns)
    assert ex[0][1]['choices'][0]['finish_reason'] == 'length' and IM_END not in ex[0][1]['choices'][0]['token_ids']
    ep = {'exchanges': [{'request': q, 'response': r} for q, r in ex], 'reward': 1.0}
    [rec] = interop.from_openai([ep], tok, logp_mode='processed', source='vllm')
    j = len(p0) + 3                                                     # the appended <|im_end|>
    assert rec.ids[j] == IM_END and rec.owner[j] != OWNER['policy'] and rec.action_mask[j - 1] == 0
    cut = [k for k, (_, r) in enumerate(ex) if r['choices'][0]['finish_reason'] == 'length']
    assert cut[0] == 0 and rec.info['template']['unterminated_turns'] == cut
    arl.validate(rec, {'eot_ids': (IM_END,)})                          # no EndOfTurnNotTrainedError
    lp = [x for _, r in ex for x in r['choices'][0]['logprobs']['token_logprobs']]
    assert rec.sample_logp[rec.action_mask == 1].tolist() == [float(torch.tensor(x)) for x in lp]
    from agentrl.engines.scorer import hf_scorer
    assert checks.replay_records([rec], hf_scorer(lm[0])).ok


def test_penalties_are_read_with_vllm_semantics_and_replay(server, lm):
    tok = lm[1]
    p0 = ChatRecorder(tok, [{'role': 'user', 'content': 'Fix clamp.'}]).prompt_ids
    pen = {'repetition_penalty': 1.3, 'presence_penalty': 0.5, 'frequency_penalty': 0.25, 'temperature': 0.8,
           'max_tokens': 24}
    ex = exchanges(server, lambda out: iter([(p0, pen)]))
    ep = {'exchanges': [{'request': q, 'response': r} for q, r in ex]}
    [rec] = interop.from_openai([ep], tok, logp_mode='processed', source='vllm')
    want = SamplingSpec(temperature=0.8, repetition_penalty=1.3, presence_penalty=0.5, frequency_penalty=0.25,
                        penalty_semantics='vllm', logp_mode='processed')
    assert rec.provenance.sampling == want
    sglang = {'input_ids': p0, 'sampling_params': {k: v for k, v in pen.items() if k != 'max_tokens'}}
    assert interop.spec_from_request(sglang, 'processed') == want
    from agentrl.engines.scorer import hf_scorer
    rep = checks.replay_records([rec], hf_scorer(lm[0]))
    assert rep.ok, rep.overall


def test_chat_template_kwargs_are_read_from_the_requests(lm):
    tok = lm[1]
    msgs = [{'role': 'user', 'content': 'Fix clamp.'}]
    ref = ChatRecorder(tok, msgs, history='sampled', enable_thinking=False)
    assert ref.prompt_ids != ChatRecorder(tok, msgs, history='sampled').prompt_ids
    turn = tok.encode('Done.', add_special_tokens=False) + [IM_END]
    resp = {'prompt_token_ids': ref.prompt_ids, 'choices': [{'message': {'role': 'assistant', 'content': 'Done.'},
            'token_ids': turn, 'finish_reason': 'stop', 'logprobs': {'content': [{'logprob': -0.5}] * len(turn)}}]}
    req = {'messages': msgs, 'temperature': 1.0, 'chat_template_kwargs': {'enable_thinking': False}}
    [rec] = interop.from_openai([{'exchanges': [{'request': req, 'response': resp}]}], tok, strict_sampling=False)
    assert rec.info['import']['chat_template_kwargs'] == {'enable_thinking': False}
    assert rec.info['import']['context_drift'] == [] and rec.ids[:len(ref.prompt_ids)].tolist() == ref.prompt_ids
    req2 = dict(req, messages=msgs + [{'role': 'assistant', 'content': 'Done.'}, {'role': 'user', 'content': 'Go.'}],
                chat_template_kwargs={'enable_thinking': True})
    with pytest.raises(ValueError, match=r"episode 0 exchange 1: chat_template_kwargs \{'enable_thinking': True\} "
                                         r"differ from exchange 0's \{'enable_thinking': False\}"):
        interop.from_openai([{'exchanges': [{'request': req, 'response': resp}, {'request': req2, 'response': resp}]}],
                            tok, strict_sampling=False)


def test_sampling_fields_the_request_leaves_out_are_refused_by_name_unless_supplied(server, lm, tmp_path):
    tok = lm[1]
    p0 = ChatRecorder(tok, [{'role': 'user', 'content': 'Fix clamp.'}]).prompt_ids
    [(req, resp)] = exchanges(server, lambda out: iter([(p0, {})]))
    [rec] = interop.from_openai([{'exchanges': [{'request': req, 'response': resp}]}], tok, strict_sampling=True)
    assert set(rec.info['import']['sampling_sources'].values()) == {'request'}     # our client sends them all
    bare = {k: v for k, v in req.items() if k not in ('top_p', 'top_k', 'min_p')}
    ep = {'exchanges': [{'request': bare, 'response': resp}]}
    with pytest.raises(ValueError, match=r'^episode 0 exchange 0: request: has no top_p, top_k, min_p; the server '
                                         r'filled them from its defaults.*--generation-config'):
        interop.from_openai([ep], tok, strict_sampling=True)
    gen = tmp_path / 'generation_config.json'
    gen.write_text(json.dumps({'temperature': 0.6, 'top_k': 20, 'top_p': 0.95, 'min_p': 0.0, 'eos_token_id': IM_END}))
    [rec] = interop.from_openai([ep], tok, strict_sampling=True, generation_config=gen)
    assert rec.provenance.sampling == SamplingSpec(temperature=1.0, top_k=20, top_p=0.95, logp_mode='raw')
    src = rec.info['import']['sampling_sources']
    assert (src['temperature'], src['top_k'], src['top_p'], src['min_p']) == ('request', 'generation_config',
                                                                              'generation_config', 'generation_config')
    [rec] = interop.from_openai([ep], tok, strict_sampling=True, spec=SamplingSpec(top_k=20))
    assert set(rec.info['import']['sampling_sources'].values()) == {'request', 'spec'}


def chat_episode(server, seed, turns=3):
    """One episode on the server's /v1/chat/completions (history sent as text), as [{'request', 'response'}]."""
    import urllib.request
    msgs, out = [{'role': 'user', 'content': 'Fix clamp.'}], []
    for k in range(turns):
        body = {'model': server.endpoint.model, 'messages': list(msgs), 'max_tokens': 12, 'temperature': 1.0,
                'top_p': 1.0, 'top_k': 0, 'min_p': 0.0, 'repetition_penalty': 1.0, 'presence_penalty': 0.0,
                'frequency_penalty': 0.0, 'seed': seed * 10 + k, 'logprobs': True, 'top_logprobs': 0,
                'return_token_ids': True, 'skip_special_tokens': False}
        req = urllib.request.Request(server.url + '/v1/chat/completions', data=json.dumps(body).encode(),
                                     headers={'Content-Type': 'application/json'})
        with urllib.request.urlopen(req, timeout=120) as r:
            resp = json.loads(r.read())
        out.append({'request': body, 'response': resp})
        msgs += [{'role': 'assistant', 'content': resp['choices'][0]['message']['content']},
                 {'role': 'user', 'content': f'Go on ({k}).'}]
    return out


def test_a_chat_endpoint_record_that_drifted_is_reported_by_check_with_its_turn_and_first_token(server, lm, model_dir,
                                                                                              tmp_path):
    from agentrl import store
    from agentrl.jobs.check import CheckOptions, run_check
    tok = lm[1]
    eps = [{'exchanges': chat_episode(server, s), 'group_id': 'chat', 'rollout_id': str(s)} for s in range(4)]
    recs = interop.from_openai(eps, tok, spec=SamplingSpec(logp_mode='processed'), source='vllm')
    drifted = {r.provenance.rollout_id: r for r in recs if r.info['import']['context_drift']}
    assert drifted, 'no chat episode drifted (the server re-rendered every turn as sampled)'
    store.write_trajectories(tmp_path / 'chat.parquet', recs)
    rep = run_check(CheckOptions(path=str(tmp_path / 'chat.parquet'), model=str(model_dir)))
    assert len(rep.drift) == len(drifted)
    text = rep.format()
    assert f'context drift    {len(drifted)} records ({sum(len(d) for _, d in rep.drift)} turns)' in text
    for key, turns in rep.drift:
        rec = drifted[key.split('/')[-1].split('#')[0]]
        assert [d.turn for d in turns] == rec.info['import']['context_drift']
        for d in turns:                          # the first differing token, from the server's own prompt ids
            server_ids = eps[int(rec.provenance.rollout_id)]['exchanges'][d.turn]['response']['prompt_token_ids']
            mine = rec.ids.tolist()
            j = next(i for i, (a, b) in enumerate(zip(mine, server_ids)) if a != b)
            assert (d.position, d.record_id, d.server_id) == (j, mine[j], server_ids[j])
    assert rep.replay.overall.n > 0 and rep.mismatch.max_abs < 1e-4   # the drifted turns replay in the server's context
