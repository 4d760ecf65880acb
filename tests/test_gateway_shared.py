"""Shared fork prefixes are trained once: ``agentrl.gateway.records.train_shared_once`` and ``agentrl export``.

A session whose harness removes a turn, then compacts, then edits a tool result forks three times
(the test_gateway scenario): branch 2 replays branch 0's first turn and branch 3 replays branch
2's. Stored, that turn is policy-owned in three rows; exported, it is trained in branch 0's row
only, and the rows' trainable tokens add up to exactly the session's sampled tokens.
"""
import json

import pytest
import torch

from _tokenizers import tokenizer_path

pytest.importorskip('transformers')

from _gateway import ForcingHF  # noqa: E402
from agentrl import store  # noqa: E402
from agentrl.gateway import Gateway, parse_request  # noqa: E402
from agentrl.gateway.records import train_shared_once  # noqa: E402
from agentrl.record import OWNER  # noqa: E402

USER = [{'role': 'user', 'content': 'Fix clamp.'}]


def call(gw, s, messages, **fields):
    req, _ = parse_request(json.dumps(dict({'messages': messages, 'max_tokens': 4}, **fields)).encode(), 1 << 20)
    return gw.chat(s, req, 'd', 0)[0]


def reply(resp):
    return {k: v for k, v in resp['choices'][0]['message'].items() if v is not None}


@pytest.fixture(scope='module')
def session_run(tmp_path_factory):
    from agentrl.engines import hf
    model = hf.make_test_model(tmp_path_factory.mktemp('gw-shared-model'), tokenizer_path('qwen3'))
    gw = Gateway(ForcingHF(model, device='cpu', max_new_tokens=8), tmp_path_factory.mktemp('gw-shared') / 'run')
    _, s = gw.open_session({'rollout_id': 'r0'})
    msgs = list(USER)
    for k in range(3):
        msgs += [reply(call(gw, s, msgs, seed=40 + k)), {'role': 'tool', 'content': f'obs {k}'}]
    call(gw, s, [msgs[0]] + msgs[3:5], seed=50)                                   # turn 0 and its result removed
    call(gw, s, msgs[:3] + [{'role': 'user', 'content': 'Summary: read clamp.'}], seed=51)
    call(gw, s, msgs[:3] + [{'role': 'tool', 'content': 'obs 0, edited'}], seed=52)
    gw.finish(s, 1.0, {})
    gw.pool.shutdown()
    gw.journal.close()
    return gw, s, model


def _trained(rec) -> int:
    return int(torch.as_tensor(rec.action_mask).sum())


def test_a_shared_sampled_prefix_is_trained_in_one_row_only(session_run):
    gw, s, _ = session_run
    recs = sorted(store.read_trajectories(gw.out / 'trajectories'), key=lambda r: r.info['gateway']['branch'])
    first = len(s.branches[0].turns[0].ids)
    own = [sum(len(t.ids) for t in b.turns) for b in s.branches]          # sampled tokens held by each branch
    assert [f['parent'] for f in s.forks] == [0, 0, 2] and [f['shared_sampled_tokens'] for f in s.forks] == [
        0, first, first]
    assert [_trained(r) for r in recs] == own                            # stored: the shared turn in 3 rows
    out = train_shared_once(recs)
    assert [_trained(r) for r in out] == [own[0], own[1], own[2] - first, own[3] - first]
    assert sum(_trained(r) for r in out) == s.out_tokens                 # every sampled token exactly once
    assert [r.info['gateway'].get('shared_untrained') for r in out] == [None, None, first, first]
    assert out[0] is recs[0] and out[1] is recs[1] and _trained(recs[2]) == own[2]     # inputs unchanged
    owner = torch.as_tensor(out[2].owner)
    relabelled = (torch.as_tensor(recs[2].owner) == OWNER['policy']) & (owner != OWNER['policy'])
    assert int(relabelled.sum()) == first
    ids = torch.as_tensor(out[2].ids)[relabelled]
    want = torch.where(ids >= 151643, OWNER['template'], OWNER['prompt'])     # Qwen3's control ids: template
    assert torch.equal(owner[relabelled], want)
    assert train_shared_once([recs[0], recs[3]])[1] is recs[3]           # parent row (branch 2) absent: kept


def test_agentrl_export_trains_each_sampled_token_once(session_run, tmp_path):
    from agentrl.cli.main import main
    from agentrl.interop import load_export
    gw, s, _ = session_run
    assert main(['export', str(gw.out), '--to', 'verl', '--out', str(tmp_path / 'verl')]) == 0
    batch = load_export(tmp_path / 'verl', 'verl')['batch']
    assert int(batch['response_mask'].sum()) == s.out_tokens


def test_a_fork_whose_prefix_was_edited_is_refused(session_run):
    import dataclasses
    gw, _, _ = session_run
    recs = sorted(store.read_trajectories(gw.out / 'trajectories'), key=lambda r: r.info['gateway']['branch'])
    ids = torch.as_tensor(recs[2].ids).clone()
    j = int((torch.as_tensor(recs[2].owner) == OWNER['policy']).nonzero()[0])
    ids[j] = ids[j] + 1
    with pytest.raises(ValueError, match=r"record 2 \(rollout 'r0/b2'\): its first \d+ sampled tokens are not those "
                                         r"of its parent branch 0"):
        train_shared_once([recs[0], recs[1], dataclasses.replace(recs[2], ids=ids)])
