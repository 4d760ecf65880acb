"""A real agent framework nobody here wrote, through ``agentrl serve``: the OpenAI Agents SDK (``openai-agents``).

An ``agents.Agent`` gets the BugFix gym's tools (``agentrl.gym.TOOL_SCHEMAS``) as ``FunctionTool`` s
whose calls step a real ``BugFixEnv``, and the gateway's session ``base_url`` as its model
(``OpenAIChatCompletionsModel``: the chat-completions API the gateway serves, not the Responses API).
The tiny random test model cannot solve a task, so the oracle's four tool calls (read, edit
swap_minmax, test, submit) are teacher-forced through ``ForcingHF`` (tests/_gateway.py): the ids are
given, the log-probs are the real model's. The agent stops at ``submit`` (``StopAtTools``); the
session is finished with the episode's reward and ``agentrl check RUN --model DIR`` replays the record.
"""
import asyncio
import json

import pytest

from _tokenizers import tokenizer_path

pytest.importorskip('transformers')
pytest.importorskip('starlette')
pytest.importorskip('uvicorn')
agents = pytest.importorskip('agents')
openai = pytest.importorskip('openai')
try:                       # openai >= 3 ships httpx2; older versions use httpx
    import httpx2 as httpx
except ImportError:
    httpx = pytest.importorskip('httpx')

from _gateway import ForcingHF  # noqa: E402
from agentrl.gateway import Gateway  # noqa: E402
from agentrl.gateway.server import Server  # noqa: E402
from agentrl.gym import TOOL_SCHEMAS, BugFixEnv, make_tasks  # noqa: E402


def _forced(name, args):
    call = json.dumps({'name': name, 'arguments': args})
    return f'<tool_call>\n{call}\n</tool_call><|im_end|>'


ORACLE = [('read', {}), ('edit', {'op': 'swap_minmax'}), ('test', {}), ('submit', {})]


def gym_tools(env, called):
    """The gym's tools as Agents SDK function tools; each call steps ``env`` and is noted in ``called``."""
    def invoker(name):
        async def invoke(ctx, args_json):
            args = json.loads(args_json or '{}')
            called.append((name, args))
            obs, reward, done, info = env.step(f'<call> {name} {args["op"]} </call>' if name == 'edit'
                                               else f'<call> {name} </call>')
            env.last = (reward, done)
            return obs
        return invoke
    return [agents.FunctionTool(name=s['name'], description=s['description'], params_json_schema=s['inputSchema'],
                                on_invoke_tool=invoker(s['name']), strict_json_schema=False) for s in TOOL_SCHEMAS]


def test_openai_agents_sdk_solves_clamp_through_the_gateway(tmp_path):
    from agentrl import store
    from agentrl.cli.main import main as agentrl
    from agentrl.engines import hf
    model_dir = hf.make_test_model(tmp_path / 'm', tokenizer_path('qwen3'))
    up = ForcingHF(model_dir, device='cpu', max_new_tokens=48)
    run = tmp_path / 'run'
    srv = Server(Gateway(up, run)).start()
    try:
        task = make_tasks('all')[0]
        assert task.name == 'clamp' and task.fix == 'swap_minmax'
        sess = httpx.post(srv.url + '/sessions', json={'group_id': 'clamp', 'rollout_id': 'agents-0',
                                                       'task': 'clamp'}, timeout=60).json()
        env, called = BugFixEnv(max_turns=6), []
        issue = env.reset(task)
        agents.set_tracing_disabled(True)
        model = agents.OpenAIChatCompletionsModel(
            model='policy', openai_client=openai.AsyncOpenAI(api_key='unused', base_url=sess['base_url']))
        agent = agents.Agent(name='bugfix', instructions='Fix the function with the tools, then submit.',
                             model=model, tools=gym_tools(env, called),
                             model_settings=agents.ModelSettings(max_tokens=48, extra_args={'seed': 7}),
                             tool_use_behavior=agents.StopAtTools(stop_at_tool_names=['submit']))
        texts = [_forced(n, a) for n, a in ORACLE]
        up.force.extend(texts)
        result = asyncio.run(agents.Runner.run(agent, issue, max_turns=6))
        assert up.force == []
        assert called == ORACLE
        reward, done = env.last
        assert (reward, done) == (1.0, True)
        assert result.final_output == 'submitted'
        r = httpx.post(f'{srv.url}/sessions/{sess["token"]}/finish', json={'reward': reward, 'info': {'done': done}},
                       timeout=60)
        assert r.status_code == 200 and r.json()['records'] == 1, r.text
    finally:
        srv.stop()
    [t] = store.read_trajectories(run / 'trajectories')
    assert (t.reward, t.provenance.group_id, t.provenance.rollout_id) == (1.0, 'clamp', 'agents-0')
    assert t.info['gateway']['calls'] == [0, 1, 2, 3]
    assert (t.info['gateway']['branch'], t.info['gateway']['leaves'], t.info['gateway']['fork']) == (0, 1, None)
    ids, mask = t.ids.tolist(), t.action_mask.tolist()
    turns, cur = [], []
    for j, m in enumerate(mask):                  # the policy turns: runs of trained ids (mask over ids[1:])
        if m:
            cur.append(ids[j + 1])
        elif cur:
            turns, cur = turns + [cur], []
    turns += [cur] if cur else []
    assert len(turns) == 4 and turns == [up.tokenizer(x, add_special_tokens=False)['input_ids'] for x in texts]
    assert agentrl(['check', str(run), '--model', str(model_dir)]) == 0
