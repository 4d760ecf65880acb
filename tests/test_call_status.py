"""Tool-call statuses per turn: stored by the gateway and the BugFix rollouts, checked, counted, masked on export."""
import json
import re
from collections import Counter
from dataclasses import replace

import pytest
import torch

from _tokenizers import load

from agentrl import checks, store
from agentrl.checks.calls import (call_counts, calls_line, malformed_call_rows, mask_malformed_calls,
                                  records_calls_line)
from agentrl.checks.errors import CallSpanError
from agentrl.families import QWEN3
from agentrl.families.base import CALL_STATUSES
from agentrl.families.record_calls import record_calls, turn_calls
from agentrl.record import Provenance, SamplingSpec

TOOLS = [{'type': 'function', 'function': {'name': n, 'description': f'{n} the file', 'parameters': {
    'type': 'object', 'properties': {}}}} for n in ('read', 'test')]
THINK_CALL = '<tool_call>\n{"name": "test"}\n</tool_call>'
OK_CALL = '<tool_call>\n{"name": "read", "arguments": {}}\n</tool_call>'
BAD_JSON = '<tool_call>\n{"name": read}\n</tool_call>'
UNKNOWN = '<tool_call>\n{"name": "nope", "arguments": {}}\n</tool_call>'
UNCLOSED = '<tool_call>\n{"name": "read"'
#: three turns: a call inside the reasoning then an ok one; invalid JSON and an unknown tool; cut in an open block
TURNS = [f'<think>\nmaybe {THINK_CALL}\n</think>\n\n{OK_CALL}', f'{BAD_JSON}\n{UNKNOWN}', f'done {UNCLOSED}']
BLOCKS = [[('in_reasoning', 'test', THINK_CALL), ('ok', 'read', OK_CALL)],
          [('invalid_json', None, BAD_JSON), ('unknown_tool', 'nope', UNKNOWN)], [('unclosed_block', None, UNCLOSED)]]


@pytest.fixture(scope='module')
def qwen():
    from agentrl.templates import ChatTemplate
    tok = load('qwen3')
    return tok, ChatTemplate(tok, tools=TOOLS)


def episode(tok, template, turns=TURNS, rollout='r'):
    """A recorded chat episode: each turn's text sampled (the last one cut: no end-of-turn), a tool result after."""
    from agentrl.templates import ChatRecorder
    eot = tok.convert_tokens_to_ids('<|im_end|>')
    rec = ChatRecorder(template, [{'role': 'user', 'content': 'Fix clamp.'}])
    for k, text in enumerate(turns):
        ids = tok.encode(text, add_special_tokens=False) + ([eot] if k < len(turns) - 1 else [])
        rec.add_turn(ids, [-0.5] * len(ids))
        if k < len(turns) - 1:
            rec.add_messages([{'role': 'tool', 'content': f'result {k}'}])
    return rec.finish(reward=1.0, provenance=Provenance(policy='hf', sampling=SamplingSpec(), group_id='g',
                                                        rollout_id=rollout))


def find(ids: list, sub: list, start: int) -> int:
    """The first position >= start where ``sub`` occurs in ``ids`` (independent of the span search)."""
    for i in range(start, len(ids) - len(sub) + 1):
        if ids[i:i + len(sub)] == sub:
            return i
    raise AssertionError(f'{sub} not in ids')


def expected_calls(tok, traj) -> list:
    """``info['turn_calls']`` found by locating each block's own encoding in the record's ids."""
    ids, out, at = traj.ids.tolist(), [], 0
    for per in BLOCKS:
        row = []
        for status, name, text in per:
            sub = tok.encode(text, add_special_tokens=False)
            at = find(ids, sub, at)
            row.append({'status': status, 'name': name, 'tokens': [at, at + len(sub)]})
            at += len(sub)
        out.append(row)
    return out


def test_in_reasoning_is_a_status_and_reasoning_calls_are_found_in_the_text():
    assert CALL_STATUSES == ('ok', 'invalid_json', 'unclosed_block', 'missing_name', 'unknown_tool', 'in_reasoning')
    text = TURNS[0]
    reply = QWEN3.parse_text(text, think_open=False)
    assert [c.status for c in reply.calls] == ['ok']          # the parse itself is unchanged
    inner = QWEN3.reasoning_calls(reply, False)
    assert [(c.status, c.name, c.text) for c in inner] == [('in_reasoning', 'test', THINK_CALL)]
    assert text[inner[0].chars[0]:inner[0].chars[1]] == THINK_CALL and inner[0].chars[0] == len('<think>\nmaybe ')
    opened = QWEN3.parse_text('a ' + THINK_CALL + '\n</think>\n\nok', think_open=True)
    assert [c.chars for c in QWEN3.reasoning_calls(opened, True)] == [(2, 2 + len(THINK_CALL))]
    assert QWEN3.reasoning_calls(QWEN3.parse_text(OK_CALL), None) == []


def test_record_calls_gives_each_status_and_the_exact_token_span(qwen):
    tok, template = qwen
    traj = episode(tok, template)
    got = record_calls(traj, QWEN3, template, {'read', 'test'})
    assert got == expected_calls(tok, traj)
    for per, blocks in zip(got, BLOCKS):
        for c, (_, _, text) in zip(per, blocks):
            assert tok.decode(traj.ids[c['tokens'][0]:c['tokens'][1]].tolist()) == text
    # relative to the turn's own ids; the stop id is not part of the text
    ids = tok.encode(TURNS[1], add_special_tokens=False) + [tok.convert_tokens_to_ids('<|im_end|>')]
    n_bad = len(tok.encode(BAD_JSON, add_special_tokens=False))
    assert turn_calls(QWEN3, template, ids, think_open=False)[0] == {'status': 'invalid_json', 'name': None,
                                                                     'tokens': [0, n_bad]}
    assert [c['status'] for c in turn_calls(QWEN3, template, ids, think_open=False)] == ['invalid_json', 'ok']


def test_stored_statuses_are_counted_checked_and_masked(qwen):
    tok, template = qwen
    traj = episode(tok, template)
    traj.info['turn_calls'] = record_calls(traj, QWEN3, template, {'read', 'test'})
    assert checks.find_problems(traj) == []
    assert call_counts(traj) == Counter(ok=1, invalid_json=1, unknown_tool=1, unclosed_block=1, in_reasoning=1)
    assert calls_line(call_counts(traj)) == ('1 ok, 1 invalid_json, 1 unclosed_block, 1 unknown_tool, '
                                             '1 call inside the reasoning')
    assert calls_line(Counter(ok=41, invalid_json=2, unclosed_block=1, in_reasoning=1)) == \
        '41 ok, 2 invalid_json, 1 unclosed_block, 1 call inside the reasoning'
    old = replace(traj, info={k: v for k, v in traj.info.items() if k != 'turn_calls'})
    assert records_calls_line([traj, old]) == ('1 ok, 1 invalid_json, 1 unclosed_block, 1 unknown_tool, '
                                               '1 call inside the reasoning (in 1 record)')
    assert records_calls_line([old]) == '' and call_counts(old) == Counter()
    # the mask: rows a-1 .. b-2 of every call that is not ok; the record itself unchanged
    spans = [c['tokens'] for per in traj.info['turn_calls'] for c in per if c['status'] != 'ok']
    want = sorted(j for a, b in spans for j in range(a - 1, b - 1))
    masked, n = mask_malformed_calls(traj)
    assert n == len(want) == sum(b - a for a, b in spans)
    assert (traj.action_mask - masked.action_mask).nonzero().flatten().tolist() == want
    assert malformed_call_rows(traj).nonzero().flatten().tolist() == want
    assert bool((masked.ids == traj.ids).all()) and int(traj.action_mask.sum()) - int(masked.action_mask.sum()) == n
    assert mask_malformed_calls(old) == (old, 0) and not bool(malformed_call_rows(old).any())


def test_check_refuses_a_span_outside_the_ids_or_over_non_policy_tokens(qwen):
    tok, template = qwen
    traj = episode(tok, template)
    calls = record_calls(traj, QWEN3, template, {'read', 'test'})
    T = len(traj.ids)
    a, b = calls[2][0]['tokens']

    def problems(turn_calls):
        return [p for p in checks.find_problems(replace(traj, info=dict(traj.info, turn_calls=turn_calls)))
                if isinstance(p, CallSpanError)]

    out = problems(calls[:2] + [[dict(calls[2][0], tokens=[a, T + 3])]])
    assert [(p.field, p.what) for p in out] == [
        ('info.turn_calls[2][0].tokens', f"is [{a}, {T + 3}], not a non-empty span of the record's ids [0, {T})")]
    a0, b0 = calls[1][0]['tokens']
    out = problems([calls[0], [dict(calls[1][0], tokens=[a0 - 2, b0])] + calls[1][1:], calls[2]])
    assert str(out[0]).startswith(f'info.turn_calls[1][0].tokens: is [{a0 - 2}, {b0}], but ids[{a0 - 2}] is owned '
                                  'by template, not sampled by the policy. Fix: ')
    out = problems([calls[1], [], calls[2]])               # turn 1's calls stored as turn 0's
    assert out[0].field == 'info.turn_calls[0][0].tokens' and out[0].count == 2
    assert 'belongs to turn 1, not turn 0' in out[0].what
    out = problems([[{'status': 'broken', 'tokens': [1, 2]}]])
    assert out[0].field == 'info.turn_calls[0][0].status'
    assert problems('nope')[0].what == 'is str, not a list with one list of calls per turn'
    with pytest.raises(CallSpanError, match=re.escape('info.turn_calls[2][0].tokens: is')):
        malformed_call_rows(replace(traj, info=dict(traj.info, turn_calls=calls[:2] + [[dict(calls[2][0],
                                                                                             tokens=[a, T + 3])]])))


def test_cli_check_counts_statuses_and_names_the_row_and_field_of_a_bad_span(qwen, tmp_path, capsys):
    from agentrl.cli.main import main
    tok, template = qwen
    good = episode(tok, template, rollout='r0')
    good.info['turn_calls'] = record_calls(good, QWEN3, template, {'read', 'test'})
    old = episode(tok, template, rollout='r1')              # written before statuses were stored
    store.write_trajectories(tmp_path / 'ok.parquet', [good, old])
    assert main(['check', str(tmp_path / 'ok.parquet')]) == 0
    out = capsys.readouterr().out
    assert ('tool calls       1 ok, 1 invalid_json, 1 unclosed_block, 1 unknown_tool, 1 call inside the reasoning'
            '  (stored in 1 record)') in out.splitlines()
    store.write_trajectories(tmp_path / 'old.parquet', [old])
    assert main(['check', str(tmp_path / 'old.parquet')]) == 0
    assert 'tool calls' not in capsys.readouterr().out
    bad = episode(tok, template, rollout='r2')
    calls = record_calls(bad, QWEN3, template, None)
    T = len(bad.ids)
    calls[0][1]['tokens'] = [T - 1, T + 5]
    bad.info['turn_calls'] = calls
    store.write_trajectories(tmp_path / 'bad.parquet', [good, bad])
    assert main(['check', str(tmp_path / 'bad.parquet')]) == 1
    out = capsys.readouterr().out
    lines = [x for x in out.splitlines() if 'CallSpanError:' in x]
    assert lines == [f"  e.g. g/r2#1: CallSpanError: info.turn_calls[0][1].tokens: is [{T - 1}, {T + 5}], not a "
                     f"non-empty span of the record's ids [0, {T}). Fix: store what agentrl.families.record_calls "
                     'gives for the record as written (spans index the ids of the turn the policy sampled), or '
                     'drop info.turn_calls']
    assert '  CallSpanError                1' in out and 'result: FAILED (1 of 2 records refused)' in out
    assert '1 ok, 1 invalid_json, 1 unclosed_block, 2 ok' not in out


def test_cli_export_masks_malformed_calls_and_report_counts_them(qwen, tmp_path, capsys):
    import pyarrow.parquet as pq

    from agentrl.cli.main import main
    tok, template = qwen
    traj = episode(tok, template, rollout='r0')
    traj.info['turn_calls'] = record_calls(traj, QWEN3, template, {'read', 'test'})
    old = episode(tok, template, rollout='r1')
    store.write_trajectories(tmp_path / 'run' / 'trajectories.parquet', [traj, old])
    assert main(['export', str(tmp_path / 'run'), '--to', 'sft', '--out', str(tmp_path / 'plain')]) == 0
    assert main(['export', str(tmp_path / 'run'), '--to', 'sft', '--out', str(tmp_path / 'sft'),
                 '--mask-malformed-calls']) == 0
    out = capsys.readouterr().out
    spans = [c['tokens'] for per in traj.info['turn_calls'] for c in per if c['status'] != 'ok']
    n = sum(b - a for a, b in spans)
    assert (f'  --mask-malformed-calls: {n} action tokens of 4 calls not ok, in 1 records, left out of the loss'
            in out.splitlines())
    plain = pq.read_table(tmp_path / 'plain' / 'sft.parquet').column('assistant_masks').to_pylist()
    masked = pq.read_table(tmp_path / 'sft' / 'sft.parquet').column('assistant_masks').to_pylist()
    assert plain[0] == [0] + traj.action_mask.long().tolist() and masked[1] == plain[1]
    assert [t for t, (p, m) in enumerate(zip(plain[0], masked[0])) if p != m] == \
        sorted(t for a, b in spans for t in range(a, b))
    manifest = json.loads((tmp_path / 'sft' / 'manifest.json').read_text())
    assert manifest['mask_malformed_calls'] == {'records': 1, 'calls': 4, 'action_tokens': n}
    assert 'mask_malformed_calls' not in json.loads((tmp_path / 'plain' / 'manifest.json').read_text())
    from agentrl import interop                             # an RL target: verl's response_mask
    for out, flag in (('v0', []), ('v1', ['--mask-malformed-calls'])):
        assert main(['export', str(tmp_path / 'run'), '--to', 'verl', '--out', str(tmp_path / out), '--no-trim',
                     *flag]) == 0
    v0, v1 = (interop.load_export(tmp_path / out, 'verl')['batch']['response_mask'] for out in ('v0', 'v1'))
    assert int(v0[0].sum()) - int(v1[0].sum()) == n and torch.equal(v0[1], v1[1])
    assert store.read_trajectories(tmp_path / 'run' / 'trajectories.parquet')[0].action_mask.tolist() == \
        traj.action_mask.tolist()                           # the record itself is unchanged
    from agentrl.jobs.report import ReportOptions, write_report
    res = write_report(ReportOptions(str(tmp_path / 'run')))
    assert res.calls == ('1 ok, 1 invalid_json, 1 unclosed_block, 1 unknown_tool, 1 call inside the reasoning '
                         '(in 1 record)')
    html = (tmp_path / 'run' / 'report.html').read_text()
    assert ('tool calls <b>1 ok, 1 invalid_json, 1 unclosed_block, 1 unknown_tool, 1 call inside the reasoning '
            '(in 1 record)</b>') in html


def test_gateway_records_store_each_turns_call_statuses(qwen):
    from agentrl.engines.contract import TurnResult
    from agentrl.gateway.parse import parse_reply
    from agentrl.gateway.records import session_records
    from agentrl.gateway.sessions import Session
    tok, template = qwen
    eot = tok.convert_tokens_to_ids('<|im_end|>')
    tools_key = json.dumps(TOOLS, sort_keys=True)
    s = Session('sid', {'group_id': 'g', 'rollout_id': 'r'})
    s.spec = SamplingSpec()
    msgs = [{'role': 'user', 'content': 'Fix clamp.'}]
    for k, text in enumerate(TURNS[:2]):
        plan = s.plan(msgs, tools_key, template, QWEN3)
        ids = tok.encode(text, add_special_tokens=False) + [eot]
        message = parse_reply(text, QWEN3, id_seed=f'sid/{k}', think_open=False)
        s.commit(plan, TurnResult(ids=ids, logp=[-0.5] * len(ids), truncated=False, seed=k), message,
                 {'index': k, 'digest': str(k), 'seed': k, 'response': {}, 'version': '0'})
        msgs = msgs + [message, {'role': 'tool', 'content': f'result {k}'}]
    (traj,) = session_records(s, 'm', family=QWEN3)
    ids = traj.ids.tolist()
    at, want = 0, []
    for per in BLOCKS[:2]:
        row = []
        for status, name, text in per:
            sub = tok.encode(text, add_special_tokens=False)
            at = find(ids, sub, at)
            row.append({'status': status, 'name': name, 'tokens': [at, at + len(sub)]})
            at += len(sub)
        want.append(row)
    assert traj.info['turn_calls'] == want
    assert checks.find_problems(traj) == []


def test_a_forks_shared_turn_keeps_its_calls_in_the_parent_row_only(qwen):
    from agentrl.engines.contract import TurnResult
    from agentrl.gateway.parse import parse_reply
    from agentrl.gateway.records import session_records, train_shared_once
    from agentrl.gateway.sessions import Session
    tok, template = qwen
    eot = tok.convert_tokens_to_ids('<|im_end|>')
    tools_key = json.dumps(TOOLS, sort_keys=True)
    s = Session('sid', {'group_id': 'g', 'rollout_id': 'r'})
    s.spec = SamplingSpec()
    user = [{'role': 'user', 'content': 'Fix clamp.'}]

    def turn(msgs, text, k):
        plan = s.plan(msgs, tools_key, template, QWEN3)
        ids = tok.encode(text, add_special_tokens=False) + [eot]
        message = parse_reply(text, QWEN3, id_seed=f'sid/{k}', think_open=False)
        s.commit(plan, TurnResult(ids=ids, logp=[-0.5] * len(ids), truncated=False, seed=k), message,
                 {'index': k, 'digest': str(k), 'seed': k, 'response': {}, 'version': '0'})
        return message

    m0 = turn(user, TURNS[0], 0)
    turn(user + [m0, {'role': 'tool', 'content': 'result 0'}], TURNS[1], 1)
    turn(user + [m0, {'role': 'tool', 'content': 'result 0, edited'}], OK_CALL, 2)     # forks, replaying turn 0
    parent, fork = session_records(s, 'm', family=QWEN3)
    assert fork.info['gateway']['fork']['shared_sampled_tokens'] > 0
    assert [[c['status'] for c in per] for per in fork.info['turn_calls']] == [['in_reasoning', 'ok'], ['ok']]
    shared = train_shared_once([parent, fork])
    assert shared[1].info['turn_calls'] == [[], fork.info['turn_calls'][1]]
    assert shared[0].info['turn_calls'] == parent.info['turn_calls']
    assert [checks.find_problems(r) for r in shared] == [[], []]


def test_bugfix_adapter_stores_statuses_when_given_the_template(qwen, tasks):
    from agentrl.jobs.bugfix import BugFixAdapter, bugfix_template
    from agentrl.templates import ChatRecorder
    tok, _ = qwen
    template = bugfix_template(tok)
    eot = tok.convert_tokens_to_ids('<|im_end|>')
    turns = [OK_CALL, BAD_JSON]
    trajs = []
    for with_template in (True, False):
        adapter = BugFixAdapter(tasks[:1], template=template if with_template else None)
        rec = ChatRecorder(template, adapter.openings()[0])
        for k, text in enumerate(turns):
            ids = tok.encode(text, add_special_tokens=False) + [eot]
            rec.add_turn(ids, [-0.5] * len(ids))
            reply = adapter.respond(0, type('T', (), {'truncated': False})(), text)
            rec.add_messages(reply.messages)
        trajs.append(adapter.finish([rec.finish(reward=0.0)])[0])
    ids = trajs[0].ids.tolist()
    a = find(ids, tok.encode(OK_CALL, add_special_tokens=False), 0)
    b = find(ids, tok.encode(BAD_JSON, add_special_tokens=False), a)
    assert trajs[0].info['turn_calls'] == [
        [{'status': 'ok', 'name': 'read', 'tokens': [a, a + len(tok.encode(OK_CALL, add_special_tokens=False))]}],
        [{'status': 'invalid_json', 'name': None, 'tokens': [b, b + len(tok.encode(BAD_JSON,
                                                                                   add_special_tokens=False))]}]]
    assert trajs[0].info['tool_calls'] == [[{'name': 'read', 'arguments': {}}], None]
    assert 'turn_calls' not in trajs[1].info
