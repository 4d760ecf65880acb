"""Every model family end to end: ``agentrl serve`` over a test model with the family's template and tokenizer.

Per family (:data:`CASES`): a small random model is built on the family's test tokenizer
(``tests/_families.py``), served by the recording gateway, and driven by the ``openai`` SDK through a
three-turn tool loop (two tool-call turns, then an answer). A random model cannot write a tool call,
so each turn is teacher-forced through the real engine (``tests/_gateway.ForcingHF``: the ids are
given, the log-probs are the model's). The gateway must parse each forced call in the family's own
format into ``tool_calls``, the stored record must hold exactly the forced ids as its policy turns,
and ``agentrl check RUN --model M`` must pass.
"""
import json
from dataclasses import dataclass

import pytest

pytest.importorskip('transformers')
pytest.importorskip('starlette')
pytest.importorskip('uvicorn')
openai = pytest.importorskip('openai')

from _families import kit_dir  # noqa: E402
from _gateway import ForcingHF  # noqa: E402
from agentrl import store  # noqa: E402
from agentrl.cli.main import main as agentrl  # noqa: E402
from agentrl.gateway import Gateway  # noqa: E402
from agentrl.gateway.server import Server  # noqa: E402
from agentrl.gym import TOOL_SCHEMAS  # noqa: E402
from agentrl.templates.chat import function_tools  # noqa: E402

try:                       # openai >= 3 ships httpx2; older versions use httpx
    import httpx2 as httpx
except ImportError:
    httpx = pytest.importorskip('httpx')

TOOLS = function_tools(TOOL_SCHEMAS)
USER = [{'role': 'user', 'content': 'Fix clamp in clamp.py.'}]
#: the loop's two calls and their results, the same for every family
CALLS = [('read', {'path': 'clamp.py'}), ('edit', {'op': 'swap_minmax'})]
RESULTS = ['def clamp(x, lo, hi):\n    return max(lo, x)', '1 failed: test_upper']


@dataclass(frozen=True)
class Case:
    """One family's loop.

    Attributes:
        kit: the ``tests/_families.KITS`` entry. family: the family name the gateway must pick.
        turns: the three forced turn texts (two calls in the family's format, then an answer), each
            ending with the stop token the model would sample.
        answer: the ``content`` the answer turn must come back as.
        template_options: the gateway's ``template_options``.
        tools: send the tool schemas (False for a template that does not render them: the tools are then
            described in a system message, as the family's model card says).
        call_ids: the ``id`` each tool-call turn's call must come back with (a format that writes its own
            ids); empty: any id.
    """
    kit: str
    family: str
    turns: tuple
    answer: str
    template_options: tuple = ()
    tools: bool = True
    call_ids: tuple = ()


def _hermes(name, args):
    return f'<tool_call>\n{json.dumps({"name": name, "arguments": args})}\n</tool_call><|im_end|>'


def _harmony(name, args, reasoning, constrain=False):
    """A gpt-oss call turn as the model samples it after ``<|start|>assistant``: analysis, then the call message
    (the recipient in the role header, or after the channel with ``<|constrain|>``), stopped at ``<|call|>``."""
    head = (f'<|channel|>commentary to=functions.{name} <|constrain|>json' if constrain
            else f' to=functions.{name}<|channel|>commentary json')
    return (f'<|channel|>analysis<|message|>{reasoning}<|end|><|start|>assistant{head}<|message|>'
            f'{json.dumps(args)}<|call|>')


def _glm(name, args, reasoning):
    """A GLM-4.5 tool-call turn as the model samples it after ``<|assistant|>``: its ``<|observation|>`` stop
    is the tool results' header, which GLM's ``generation_config.json`` lists as an eos."""
    pairs = ''.join(f'<arg_key>{k}</arg_key>\n<arg_value>{v}</arg_value>\n' for k, v in args.items())
    return f'\n<think>{reasoning}</think>\n<tool_call>{name}\n{pairs}</tool_call><|observation|>'


def _xml(name, args):
    body = ''.join(f'<parameter={k}>\n{v}\n</parameter>\n' for k, v in args.items())
    return f'<tool_call>\n<function={name}>\n{body}</function>\n</tool_call><|im_end|>'


def _llama(name, args):
    return f'{json.dumps({"name": name, "parameters": args})}<|eot_id|>'



def _deepseek_v3(name, args):
    return (f'<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>{name}\n```json\n{json.dumps(args)}\n```'
            '<｜tool▁call▁end｜><｜tool▁calls▁end｜><｜end▁of▁sentence｜>')


def _deepseek_v31(name, args):
    return (f'<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>{name}<｜tool▁sep｜>{json.dumps(args)}<｜tool▁call▁end｜>'
            '<｜tool▁calls▁end｜><｜end▁of▁sentence｜>')


def _kimi(k, name, args):
    return (f'<think>Call {name}.</think><|tool_calls_section_begin|><|tool_call_begin|>functions.{name}:{k}'
            f'<|tool_call_argument_begin|>{json.dumps(args)}<|tool_call_end|><|tool_calls_section_end|><|im_end|>')


def _lfm2(name, args, reasoning):
    """An LFM2.5 call turn as the model samples it after ``<|im_start|>assistant\n``: its own ``<think>`` block, then
    the calls as a Python list (strings single-quoted, as ``lfm2_2_5.jinja`` writes them), stopped at ``<|im_end|>``."""
    kw = ', '.join(f'{k}={v!r}' for k, v in args.items())
    return f'<think>{reasoning}</think><|tool_call_start|>[{name}({kw})]<|tool_call_end|><|im_end|>'


#: One entry per family; a family's helper adds its case here.
CASES = {
    'qwen3': Case('qwen3', 'qwen3', (_hermes(*CALLS[0]), _hermes(*CALLS[1]), 'Fixed: use min(hi, ...).<|im_end|>'),
                  'Fixed: use min(hi, ...).', (('enable_thinking', False),)),
    'gpt-oss': Case('gpt-oss', 'gpt-oss',
                    (_harmony(*CALLS[0], 'Read it first.'), _harmony(*CALLS[1], 'max and min are swapped.', True),
                     '<|channel|>analysis<|message|>Tests pass.<|end|><|start|>assistant<|channel|>final<|message|>'
                     'Fixed: use min(hi, ...).<|return|>'),
                    'Fixed: use min(hi, ...).', (('reasoning_effort', 'low'),)),
    # GLM-4.5 in thinking mode: the generation prompt is '<|assistant|>', the model writes '\n<think>...'; a call
    # turn stops at '<|observation|>', an answer at '<|user|>' (the next header; eos only ends a conversation)
    'glm-4.5': Case('glm-4.5', 'glm', (_glm(*CALLS[0], 'Read it first.'), _glm(*CALLS[1], 'Swap them.'),
                                       '\n<think>Tests pass.</think>\nFixed: use min(hi, ...).<|user|>'),
                    'Fixed: use min(hi, ...).'),
    'qwen3.5': Case('qwen3.5', 'qwen3_coder', (_xml(*CALLS[0]), _xml(*CALLS[1]), 'Fixed: use min(hi, ...).<|im_end|>'),
                    'Fixed: use min(hi, ...).', (('enable_thinking', False),)),
    'qwen3.6': Case('qwen3.6', 'qwen3_coder', ('Read it first.\n</think>\n\n' + _xml(*CALLS[0]),
                                               'Now swap.\n</think>\n\n' + _xml(*CALLS[1]),
                                               'Done.\n</think>\n\nFixed: use min(hi, ...).<|im_end|>'),
                    'Fixed: use min(hi, ...).', (('enable_thinking', True),)),
    'llama3.1': Case('llama3.1', 'llama3', (_llama(*CALLS[0]), _llama(*CALLS[1]), 'Fixed: use min(hi, ...).<|eot_id|>'),
                     'Fixed: use min(hi, ...).'),
    'llama3.2': Case('llama3.2', 'llama3', (_llama(*CALLS[0]), _llama(*CALLS[1]), 'Fixed: use min(hi, ...).<|eot_id|>'),
                     'Fixed: use min(hi, ...).'),
    'deepseek-v3': Case('deepseek-v3', 'deepseek-v3', (_deepseek_v3(*CALLS[0]), _deepseek_v3(*CALLS[1]),
                                                       'Fixed: use min(hi, ...).<｜end▁of▁sentence｜>'),
                        'Fixed: use min(hi, ...).', tools=False),
    'deepseek-v3.1': Case('deepseek-v3.1', 'deepseek-v3.1', (_deepseek_v31(*CALLS[0]), _deepseek_v31(*CALLS[1]),
                                                             'Fixed: use min(hi, ...).<｜end▁of▁sentence｜>'),
                          'Fixed: use min(hi, ...).', tools=False),
    'kimi-k2': Case('kimi-k2', 'kimi-k2', (_kimi(0, *CALLS[0]), _kimi(1, *CALLS[1]),
                                           '<think>Done.</think>Fixed: use min(hi, ...).<|im_end|>'),
                    'Fixed: use min(hi, ...).', call_ids=('functions.read:0', 'functions.edit:1')),
    'lfm2.5': Case('lfm2.5', 'lfm2', (_lfm2(*CALLS[0], 'Read it first.'), _lfm2(*CALLS[1], 'Swap them.'),
                                      '<think>Tests pass.</think>Fixed: use min(hi, ...).<|im_end|>'),
                   'Fixed: use min(hi, ...).'),
}


@pytest.fixture(scope='module', params=sorted(CASES))
def served(request, tmp_path_factory):
    from agentrl.engines import hf
    case = CASES[request.param]
    tok_dir = kit_dir(case.kit)
    model_dir = hf.make_test_model(tmp_path_factory.mktemp(f'{case.kit}-model'), tok_dir)
    up = ForcingHF(model_dir, device='cpu', max_new_tokens=24)
    run = tmp_path_factory.mktemp(f'{case.kit}-run') / 'run'
    gw = Gateway(up, run, template_options=dict(case.template_options))
    srv = Server(gw, stream_interval=0.02, pause_wait=0.5).start()
    yield case, gw, up, srv, run, model_dir
    srv.stop()


def test_three_turn_tool_loop_is_recorded_and_checks(served):
    case, gw, up, srv, run, model_dir = served
    assert gw.family.name == case.family
    h = httpx.Client(timeout=120)
    r = h.post(srv.url + '/sessions', json={'group_id': case.kit, 'rollout_id': 'r0'})
    assert r.status_code == 201, r.text
    sess = r.json()
    c = openai.OpenAI(api_key='unused', base_url=sess['base_url'])
    msgs = list(USER)
    for k, text in enumerate(case.turns):
        up.force.append(text)
        resp = c.chat.completions.create(model='m', messages=msgs, seed=k, **({'tools': TOOLS} if case.tools else {}))
        m = resp.choices[0].message
        if k < len(CALLS):
            name, args = CALLS[k]
            assert resp.choices[0].finish_reason == 'tool_calls', (k, m)
            assert [(t.function.name, json.loads(t.function.arguments)) for t in m.tool_calls] == [(name, args)]
            if case.call_ids:                     # the format's own id, which the template renders back
                assert m.tool_calls[0].id == case.call_ids[k]
            msgs.append(m.model_dump(exclude_none=True))
            msgs.append({'role': 'tool', 'tool_call_id': m.tool_calls[0].id, 'content': RESULTS[k]})
        else:
            assert (resp.choices[0].finish_reason, m.content, m.tool_calls) == ('stop', case.answer, None)
    r = h.post(f'{srv.url}/sessions/{sess["token"]}/finish', json={'reward': 1.0})
    assert r.status_code == 200 and r.json()['records'] == 1, r.text
    [t] = [t for t in store.read_trajectories(run / 'trajectories')
           if t.info['gateway']['session'] == sess['session']]
    ids, mask = t.ids.tolist(), t.action_mask.tolist()
    turns, cur = [], []
    for j, on in enumerate(mask):                 # the policy turns: runs of trained ids (mask over ids[1:])
        if on:
            cur.append(ids[j + 1])
        elif cur:
            turns, cur = turns + [cur], []
    turns += [cur] if cur else []
    assert turns == [up.tokenizer(x, add_special_tokens=False)['input_ids'] for x in case.turns]
    assert agentrl(['check', str(run), '--model', str(model_dir)]) == 0
