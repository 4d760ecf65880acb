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


#: family -> (kit, vLLM tool parser, vLLM reasoning parser, texts)
CASES = {
    'qwen3': ('qwen3', 'hermes', 'qwen3', [
        '<think>\nread first\n</think>\n\n' + _hermes('read', {'path': 'clamp.py'}),
        '<think>\n\n</think>\n\nAll done.',
        '<think>\nx\n</think>\n\nI will run them.\n' + _hermes('test', {}) + '\n' + _hermes('read', {'path': 'a b.py'}),
    ]),
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
}


def _ours(family, template, text):
    r = family.parse_text(text, tool_names=[t['function']['name'] for t in TOOLS])
    return {'reasoning': r.reasoning, 'content': r.content or None,
            'calls': [{'name': c.name, 'arguments': c.arguments} for c in r.ok_calls]}


@pytest.mark.parametrize('name', sorted(CASES))
def test_family_parses_as_vllm_does(name):
    kit, tool_parser, reasoning_parser, texts = CASES[name]
    template = as_template(kit_tokenizer(kit))
    family = family_for(template)
    assert family.name == name
    theirs = vllm_parse(kit_dir(kit), texts, tool_parser=tool_parser, reasoning_parser=reasoning_parser, tools=TOOLS)
    for text, t in zip(texts, theirs):
        mine = _ours(family, template, text)
        # vLLM keeps the newlines around reasoning and content that the template writes; ours drops them
        t['content'] = (t['content'] or '').strip('\n') or None
        t['reasoning'] = t['reasoning'].strip('\n') if t['reasoning'] is not None else None
        assert mine == t, text
