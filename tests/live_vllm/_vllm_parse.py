"""Run under the vLLM venv's python: parse reply texts with vLLM's own tool and reasoning parsers.

Reads one JSON object on stdin: ``{"tokenizer": DIR, "tool_parser": NAME or null, "reasoning_parser":
NAME or null, "tools": [openai tool schemas], "texts": [str]}``; writes one JSON list on stdout, one
``{"reasoning": str|null, "content": str|null, "calls": [{"name": str, "arguments": obj|str}]}`` per text
(arguments parsed from JSON where they parse). The reasoning parser runs first and the tool parser
reads what it leaves, as vLLM's chat-completions server does. Used through
``tests/live_vllm/vllm_parsers.vllm_parse``; it never imports agentrl.
"""
import json
import sys


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
                    try:
                        args = json.loads(c.function.arguments)
                    except ValueError:
                        args = c.function.arguments
                    calls.append({'name': c.function.name, 'arguments': args})
        out.append({'reasoning': reasoning, 'content': content, 'calls': calls})
    json.dump(out, sys.stdout)


if __name__ == '__main__':
    main()
