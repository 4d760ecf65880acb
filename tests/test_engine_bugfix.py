"""The engine-agnostic episode parts: engines/episode.py and the BugFix adapter (jobs/bugfix.py), torch-free."""
import json
import subprocess
import sys
from types import SimpleNamespace

import pytest

from agentrl.jobs.bugfix import MALFORMED, BugFixAdapter, bugfix_opening, gym_call, parse_tool_calls
from agentrl.engines.episode import EpisodeState, Reply
from agentrl.gym import TOOL_SCHEMAS, scripted_policy
from agentrl.record import StopReason


def test_episode_and_bugfix_modules_import_without_torch():
    code = ('import sys\n'
            'import agentrl.engines.episode, agentrl.jobs.bugfix\n'
            'bad = sorted(m for m in ("torch", "transformers") if m in sys.modules)\n'
            'assert not bad, bad\n'
            'print("ok")\n')
    out = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout == 'ok\n'


def _qwen3_call(call_text: str) -> str:
    """A gym call ('<call> edit swap_minmax </call>') as the Qwen3 <tool_call> JSON a model writes."""
    words = call_text.split()[1:-1]
    args = {'op': words[1]} if words[0] == 'edit' else {}
    return '<tool_call>\n' + json.dumps({'name': words[0], 'arguments': args}) + '\n</tool_call>'


def test_adapter_on_the_oracle_texts_solves_clamp(tasks):
    assert tasks[0].fn_name == 'clamp'
    adapter = BugFixAdapter([tasks[0], tasks[1]], max_turns=6, reward_tests='hidden')
    assert adapter.tools is TOOL_SCHEMAS
    openings = adapter.openings()
    assert openings == [bugfix_opening(tasks[0].issue), bugfix_opening(tasks[1].issue)]
    assert openings[0] == [{'role': 'user', 'content': tasks[0].issue}]
    oracle = scripted_policy('oracle', tasks=tasks)
    observations, turn, replies = [tasks[0].issue], SimpleNamespace(truncated=False), []
    while not (replies and replies[-1].done):
        text = _qwen3_call(oracle(observations))
        replies.append(adapter.respond(0, turn, text))
        observations.append(replies[-1].messages[0]['content'])
    assert [r.action for r in replies] == ['<call> read </call>', '<call> edit swap_minmax </call>',
                                           '<call> test </call>', '<call> submit </call>']
    assert replies[-1].reward == 1.0 and replies[-1].info['stop'] == StopReason.SUBMITTED
    assert replies[-1].info['solved'] is True and replies[-1].info['task'] == 'clamp'
    assert all(r.messages[0]['role'] == 'tool' for r in replies)
    # episode 1: a turn cut at its budget is a malformed call whatever its text
    cut = adapter.respond(1, SimpleNamespace(truncated=True), _qwen3_call('<call> read </call>'))
    assert cut.action == '' and cut.messages == [{'role': 'tool', 'content': 'error : malformed call'}]
    assert adapter.tool_calls[0][1] == [{'name': 'edit', 'arguments': {'op': 'swap_minmax'}}]
    assert adapter.tool_calls[1] == [None]
    recs = [SimpleNamespace(info=dict(replies[-1].info)), SimpleNamespace(info={'stop': StopReason.TRUNCATED})]
    assert adapter.finish(recs) is recs
    assert recs[0].info['tool_calls'] == adapter.tool_calls[0] and len(recs[0].info['tool_calls']) == 4
    assert recs[1].info['task'] == tasks[1].name and recs[1].info['stop'] == 'truncated'   # the gym's final info
    assert recs[1].info['solved'] is False and recs[1].info['n_invalid'] == 1
    with pytest.raises(ValueError, match=r'^BugFixAdapter.finish: 1 records for 2 tasks; pass the records of every'):
        adapter.finish(recs[:1])
    assert adapter.openings() and adapter.tool_calls == [[], []]          # a reset starts fresh books


def test_parse_and_map_malformed_calls():
    assert MALFORMED == ''
    assert parse_tool_calls('<tool_call>{"name": "read"}') is None          # left open
    assert gym_call(parse_tool_calls('no call')) is None
    assert gym_call([('edit', {'op': 'swap minmax'})]) is None
    assert gym_call([('read', {}), ('test', {})]) is None


def test_episode_state_books():
    st = EpisodeState()
    st.add_turn(0, 5, False)
    assert st.apply(Reply(messages=[{'role': 'tool', 'content': 'ok'}], action='a'), 0, 3) is True
    st.add_turn(1, 7, True)
    with pytest.raises(ValueError, match=r'^drv: respond returned no messages for running episode 4 \(turn 1\)'):
        st.apply(Reply(action='b'), 1, 3, episode=4, caller='drv')
    assert st.apply(Reply(info={'x': 1}, action='c'), 2, 3) is False          # the turn limit
    assert st.done and st.reward == 0.0 and st.info == {'x': 1, 'stop': StopReason.TRUNCATED}
    assert st.final_info() == {'x': 1, 'stop': 'truncated', 'actions': ['a', 'b', 'c'], 'truncated_turns': [1],
                               'turn_tokens': [5, 7]}
    done = EpisodeState()
    assert done.apply(Reply(done=True, reward=1.0, info={'stop': 'submitted'}), 0, 1) is False
    assert (done.reward, done.info) == (1.0, {'stop': 'submitted'})
