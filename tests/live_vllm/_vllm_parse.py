"""Run under the vLLM venv's python: parse reply texts with vLLM's own tool and reasoning parsers.

Reads one JSON object on stdin: ``{"tokenizer": DIR, "tool_parser": NAME or null, "reasoning_parser":
NAME or null, "tools": [openai tool schemas], "texts": [str]}``; writes one JSON list on stdout, one
``{"reasoning": str|null, "content": str|null, "calls": [{"name": str, "arguments": obj|str}]}`` per text
(arguments parsed from JSON where they parse). The reasoning parser runs first and the tool parser
reads what it leaves, as vLLM's chat-completions server does. With ``"harmony": true`` (gpt-oss) the two
run as vLLM runs them for a harmony model: its ``HarmonyParser`` over the ids of each text in the harmony
encoding (``openai_harmony``; the text then ends with the stop mark the model sampled). Used through
``tests/live_vllm/vllm_parsers.vllm_parse``; it never imports agentrl.
"""
import json
import sys


def _args(text):
    """Call arguments parsed from JSON where they parse, else the text."""
    try:
        return json.loads(text)
    except ValueError:
        return text


def main():
    job = json.load(sys.stdin)
    from transformers import AutoTokenizer
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
    from vllm.reasoning import ReasoningParserManager
    from vllm.tool_parsers import ToolParserManager
    tok = AutoTokenizer.from_pretrained(job['tokenizer'])
    request = ChatCompletionRequest(model='m', messages=[{'role': 'user', 'content': 'x'}],
                                    tools=job.get('tools') or None)
    out = []
    if job.get('harmony'):
        from vllm.entrypoints.openai.parser.harmony_utils import get_encoding
        from vllm.parser.parser_manager import ParserManager
        cls = ParserManager.get_parser(job.get('tool_parser'), job.get('reasoning_parser'), enable_auto_tools=True,
                                       is_harmony=True)
        for text in job['texts']:
            ids = get_encoding().encode(text, allowed_special='all')
            reasoning, content, calls = cls(tok, request.tools).parse(text, request, True, ids)
            calls = [{'name': c.name, 'arguments': _args(c.arguments)} for c in calls or ()]
            out.append({'reasoning': reasoning, 'content': content, 'calls': calls})
        json.dump(out, sys.stdout)
        return
    for text in job['texts']:
        reasoning, content = None, text
        if job.get('reasoning_parser'):
            rp = ReasoningParserManager.get_reasoning_parser(job['reasoning_parser'])(tok)
            reasoning, content = rp.extract_reasoning(text, request)
        calls = []
        if job.get('tool_parser') and content is not None:
            tp = ToolParserManager.get_tool_parser(job['tool_parser'])(tok, request.tools)
            info = tp.extract_tool_calls(content, request)
            if info.tools_called:
                content = info.content
                for c in info.tool_calls:
                    calls.append({'name': c.function.name, 'arguments': _args(c.function.arguments)})
        out.append({'reasoning': reasoning, 'content': content, 'calls': calls})
    json.dump(out, sys.stdout)


if __name__ == '__main__':
    main()
