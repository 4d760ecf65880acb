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


def _xml(name, params):
    body = ''.join(f'<parameter={k}>\n{v}\n</parameter>\n' for k, v in params.items())
    return f'<tool_call>\n<function={name}>\n{body}</function>\n</tool_call>'


#: a tool whose parameters have every JSON type (Qwen3-Coder's XML values are typed by it)
GREP = {'type': 'function', 'function': {'name': 'grep', 'description': 'Search.', 'parameters': {
    'type': 'object', 'properties': {'pattern': {'type': 'string'}, 'max': {'type': 'integer'},
                                     'case': {'type': 'boolean'}, 'paths': {'type': 'array'},
                                     'opts': {'type': 'object'}, 'frac': {'type': 'number'},
                                     'note': {'type': ['string', 'null']}, 'none': {'type': ['null', 'integer']}}}}}

#: family -> (kit, vLLM tool parser, vLLM reasoning parser, texts[, tools: default TOOLS])
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
}


def _ours(family, text, tools):
    r = family.for_tools(tools).parse_text(text, tool_names=[t['function']['name'] for t in tools])
    return {'reasoning': r.reasoning, 'content': r.content or None,
            'calls': [{'name': c.name, 'arguments': c.arguments} for c in r.ok_calls]}


@pytest.mark.parametrize('name', sorted(CASES))
def test_family_parses_as_vllm_does(name):
    kit, tool_parser, reasoning_parser, texts, *tools = CASES[name]
    tools = tools[0] if tools else TOOLS
    template = as_template(kit_tokenizer(kit))
    family = family_for(template)
    assert family.name == name
    theirs = vllm_parse(kit_dir(kit), texts, tool_parser=tool_parser, reasoning_parser=reasoning_parser, tools=tools)
    for text, t in zip(texts, theirs):
        mine = _ours(family, text, tools)
        # vLLM keeps the newlines around reasoning and content that the template writes; ours drops them
        t['content'] = (t['content'] or '').strip('\n') or None
        t['reasoning'] = t['reasoning'].strip('\n') if t['reasoning'] is not None else None
        assert mine == t, text
