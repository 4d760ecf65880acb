"""agentrl's family parsers against vLLM's own (``vllm/tool_parsers``, ``vllm/reasoning``) on the same texts.

Each case is a family, the vLLM parsers that serve it, the tokenizer, and reply texts (as a model
samples them, without the stop token). vLLM's parsers run in the vLLM venv
(``vllm_parsers.vllm_parse``); ours run here. Both must give the same calls (name, arguments parsed),
the same reasoning and the same content. One entry per family; a family's helper adds its case.
"""
import json

import pytest

pytest.importorskip('transformers')

from _families import kit_dir, kit_tokenizer  # noqa: E402
from .vllm_parsers import vllm_parse  # noqa: E402
from agentrl.families import family_for  # noqa: E402
from agentrl.gym import TOOL_SCHEMAS  # noqa: E402
from agentrl.templates.chat import as_template  # noqa: E402
from agentrl.templates.chat import function_tools  # noqa: E402

TOOLS = function_tools(TOOL_SCHEMAS)


def _hermes(name, args):
    return f'<tool_call>\n{json.dumps({"name": name, "arguments": args})}\n</tool_call>'


def _glm(name, args, sep='\n'):
    """A GLM call block: GLM-4.5/4.6 write ``sep='\\n'`` after the name and each pair, GLM-4.7 ``''``."""
    pairs = ''.join(f'<arg_key>{k}</arg_key>{sep}<arg_value>{v}</arg_value>{sep}' for k, v in args.items())
    return f'<tool_call>{name}{sep}{pairs}</tool_call>'


#: GLM's arguments are text typed by the tool's schema: a tool with typed parameters
GLM_TOOLS = TOOLS + function_tools([{'name': 'goto', 'description': 'Go to a line.', 'inputSchema': {
    'type': 'object', 'properties': {'line': {'type': 'integer'}, 'strict': {'type': 'boolean'},
                                     'scale': {'type': 'number'}, 'opts': {'type': 'object'},
                                     'tag': {'type': ['null', 'string']}, 'note': {'type': 'string'}}}}])

def _xml(name, params):
    body = ''.join(f'<parameter={k}>\n{v}\n</parameter>\n' for k, v in params.items())
    return f'<tool_call>\n<function={name}>\n{body}</function>\n</tool_call>'


#: a tool whose parameters have every JSON type (Qwen3-Coder's XML values are typed by it)
GREP = {'type': 'function', 'function': {'name': 'grep', 'description': 'Search.', 'parameters': {
    'type': 'object', 'properties': {'pattern': {'type': 'string'}, 'max': {'type': 'integer'},
                                     'case': {'type': 'boolean'}, 'paths': {'type': 'array'},
                                     'opts': {'type': 'object'}, 'frac': {'type': 'number'},
                                     'note': {'type': ['string', 'null']}, 'none': {'type': ['null', 'integer']}}}}}

#: family -> (kit, vLLM tool parser, vLLM reasoning parser, texts[, tools (default TOOLS)])


def _deepseek_v3(calls):
    body = '\n'.join(f'<｜tool▁call▁begin｜>function<｜tool▁sep｜>{n}\n```json\n{json.dumps(a)}\n```<｜tool▁call▁end｜>'
                     for n, a in calls)
    return f'<｜tool▁calls▁begin｜>{body}<｜tool▁calls▁end｜>'


def _deepseek_v31(calls):
    body = ''.join(f'<｜tool▁call▁begin｜>{n}<｜tool▁sep｜>{json.dumps(a)}<｜tool▁call▁end｜>' for n, a in calls)
    return f'<｜tool▁calls▁begin｜>{body}<｜tool▁calls▁end｜>'


def _kimi(calls, start=0):
    body = ''.join(f'<|tool_call_begin|>functions.{n}:{start + k}<|tool_call_argument_begin|>{json.dumps(a)}'
                   '<|tool_call_end|>' for k, (n, a) in enumerate(calls))
    return f'<|tool_calls_section_begin|>{body}<|tool_calls_section_end|>'


def _lfm2(calls):
    """An LFM2 call block: ``calls`` are ``NAME(k=v, ...)`` texts, written as the model writes them."""
    return f'<|tool_call_start|>[{", ".join(calls)}]<|tool_call_end|>'


CASES = {
    'qwen3': ('qwen3', 'hermes', 'qwen3', [
        '<think>\nread first\n</think>\n\n' + _hermes('read', {'path': 'clamp.py'}),
        '<think>\n\n</think>\n\nAll done.',
        '<think>\nx\n</think>\n\nI will run them.\n' + _hermes('test', {}) + '\n' + _hermes('read', {'path': 'a b.py'}),
    ]),
    'qwen3_coder': ('qwen3.5', 'qwen3_coder', 'qwen3', [
        '<think>\nread first\n</think>\n\n' + _xml('read', {'path': 'clamp.py'}),
        '<think>\n\n</think>\n\nAll done.',
        '<think>\nx\n</think>\n\nI will look.\n\n' + _xml('grep', {'pattern': 'a b\n  c', 'max': '3', 'case': 'True',
                                                                   'paths': '["x", "y"]', 'opts': '{"z": 1}',
                                                                   'frac': '0.5', 'note': '12'})
        + '\n' + _xml('grep', {'max': '-4', 'frac': '2.0', 'case': '0', 'none': 'null'}),
    ], TOOLS + [GREP]),
    'llama3': ('llama3.1', 'llama3_json', None, [
        '{"name": "read", "parameters": {"path": "clamp.py"}}',
        '<|python_tag|>{"name": "edit", "arguments": {"op": "swap_minmax"}}',
        'All done.',
        '{"name": "grep", "parameters": {"max": 3, "paths": ["x"]}}; {"name": "test", "parameters": {}}',
    ], TOOLS + [GREP]),
    # GLM-4.5 samples '\n<think>...</think>\n' after '<|assistant|>' in thinking mode (its stop, the next role
    # token, is not part of the text); GLM-4.7 writes no newlines inside a call block
    'glm': ('glm-4.5', 'glm45', 'glm45', [
        '\n<think>read first</think>\n' + _glm('read', {'path': 'clamp.py'}),
        '\n<think>Tests pass.</think>\nAll done.',
        '\n<think>x</think>\nI will run them.\n' + _glm('test', {}) + '\n' + _glm('read', {'path': 'a b.py'}),
        '<think>x</think>' + _glm('edit', {'op': 'swap_minmax'}, sep=''),
        '\n<think>jump</think>\n' + _glm('goto', {'line': '12', 'strict': 'true', 'scale': '2.5',
                                                   'opts': '{"a": [1, 2]}', 'tag': 'null', 'note': '7'}),
        '\n<think>typed</think>\n' + _glm('goto', {'line': 'twelve', 'strict': '0', 'scale': '3.0',
                                                    'tag': 'v1', 'note': ' spaced \n'}),
    ], GLM_TOOLS),
    'deepseek-v3': ('deepseek-v3', 'deepseek_v3', 'deepseek_r1', [
        'read first\n</think>\n\n' + _deepseek_v3([('read', {'path': 'clamp.py'})]),
        'Let me look.\n</think>\n\nI will run both.' + _deepseek_v3([('test', {}), ('read', {'path': 'a b.py'})]),
        'All done.\n</think>\n\nFixed: use min(hi, ...).',
    ]),
    'deepseek-v3.1': ('deepseek-v3.1', 'deepseek_v31', 'deepseek_r1', [
        'read first</think>' + _deepseek_v31([('read', {'path': 'clamp.py'})]),
        'two</think>Running.' + _deepseek_v31([('test', {}), ('read', {'path': 'é.py'})]),
        'done</think>Fixed.',
    ]),
    'kimi-k2': ('kimi-k2', 'kimi_k2', 'kimi_k2', [
        '<think>read first</think>' + _kimi([('read', {'path': 'clamp.py'})]),
        '<think>two</think>Running.' + _kimi([('test', {}), ('read', {'path': 'a b.py'})], start=3),
        '<think>done</think>Fixed: use min(hi, ...).',
    ]),
    # LFM2.5 writes its own <think> block (vLLM serves it with the qwen3 reasoning parser); strings single-quoted
    # and unescaped (lfm2_2_5.jinja), raw newlines, zero-padded ints and keyword-named parameters as models write
    'lfm2': ('lfm2.5', 'lfm2', 'qwen3', [
        "<think>read first</think>" + _lfm2(["read(path='clamp.py')"]),
        "<think>two</think>I will run them." + _lfm2(['test()', "read(path='a b.py')"]),
        '<think>done</think>Fixed: use min(hi, ...).',
        "<think>x</think>" + _lfm2(["edit(op='it's, (x)', n=3)"]),
        "<think>x</think>" + _lfm2(["edit(op=\"sed -n '1,9p' f.py\", opts={\"k\": [1, \"y\"]}, flag=true, "
                                    "none=null, neg=-2, t=(1, 2))"]),
        "<think>x</think>" + _lfm2(["edit(op='a\nb', n=07, from=1)", 'submit(),']),
        "<think>x</think>" + _lfm2(["edit(op='sed -n '1,9p' f.py')"]),
        "<think>x</think>Trying." + _lfm2(['edit(op=)']),
    ]),
}


def _gpt_oss_call(name, args, reasoning=None, constrain=False):
    head = (f'<|start|>assistant<|channel|>commentary to=functions.{name} <|constrain|>json' if constrain
            else f'<|start|>assistant to=functions.{name}<|channel|>commentary json')
    pre = f'<|channel|>analysis<|message|>{reasoning}<|end|>' if reasoning is not None else ''
    return f'{pre}{head}<|message|>{json.dumps(args)}<|call|>'


CASES['gpt-oss'] = ('gpt-oss', 'openai', 'openai_gptoss', [
    _gpt_oss_call('read', {'path': 'clamp.py'}, 'read first'),
    _gpt_oss_call('edit', {'op': 'swap_minmax'}, 'swap them', constrain=True),
    '<|channel|>analysis<|message|>x<|end|><|start|>assistant<|channel|>final<|message|>All done.<|return|>',
    '<|channel|>final<|message|>No reasoning.<|return|>',
    _gpt_oss_call('test', {})[len('<|start|>assistant'):],
    '<|channel|>analysis<|message|>call to=functions.read {"path": "a"}?<|end|><|start|>assistant<|channel|>final'
    '<|message|>Not yet.<|return|>',
    '<|channel|>commentary<|message|>Reading it.<|end|>' + _gpt_oss_call('read', {'path': 'a b.py'}),
    '<|channel|>analysis<|message|>one<|end|><|start|>assistant<|channel|>analysis<|message|>two<|end|>'
    '<|start|>assistant<|channel|>final<|message|>Done.<|return|>',
])
#: Families vLLM parses from harmony-encoding ids (``vllm_parse(harmony=True)``): their texts keep the stop mark
#: the model sampled (vLLM reads it); ours parse them without it, as the gateway does.
HARMONY = {'gpt-oss'}


def _ours(family, template, text, tools=TOOLS):
    r = family.for_tools(tools).parse_text(
        text, tool_names={t['function']['name']: t['function'].get('parameters') for t in tools})
    return {'reasoning': r.reasoning, 'content': r.content or None,
            'calls': [{'name': c.name, 'arguments': c.arguments} for c in r.ok_calls]}


@pytest.mark.parametrize('name', sorted(CASES))
def test_family_parses_as_vllm_does(name):
    kit, tool_parser, reasoning_parser, texts, *more = CASES[name]
    tools = more[0] if more else TOOLS
    template = as_template(kit_tokenizer(kit))
    family = family_for(template)
    assert family.name == name
    harmony = name in HARMONY
    theirs = vllm_parse(kit_dir(kit), texts, tool_parser=tool_parser, reasoning_parser=reasoning_parser, tools=tools,
                        harmony=harmony)
    stops = [template.decode([i]) for i in family.stop_ids(template)] if harmony else []
    for text, t in zip(texts, theirs):
        stop = next((s for s in stops if text.endswith(s)), '')
        mine = _ours(family, template, text[:len(text) - len(stop)], tools)
        # vLLM keeps the newlines around reasoning and content that the template writes; ours drops them
        t['content'] = (t['content'] or '').strip('\n') or None
        t['reasoning'] = t['reasoning'].strip('\n') if t['reasoning'] is not None else None
        assert mine == t, text
