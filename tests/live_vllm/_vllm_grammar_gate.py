"""Run under the vLLM venv's python: where vLLM's structured-output gate applies the grammar in a turn.

Reads one JSON object on stdin: ``{"tokenizer": DIR, "reasoning_parser": NAME, "cases": [{"prompt": [ids],
"turn": [ids], "chat_template_kwargs": {...}}]}``; writes one JSON list on stdout, one ``{"masked": [bool per
step], "fed": [ids]}`` per case: whether vLLM masks the logits of each step of the turn with the grammar, and the
turn's ids it feeds to the grammar. It drives vLLM's own ``StructuredOutputManager`` gate
(``_get_constraint_bounds`` before each step, ``accept_tokens`` after it: one token per step, no speculative
decoding) with a recording stand-in for the compiled grammar. Used through
``tests/live_vllm/vllm_parsers.vllm_grammar_gate``; it never imports agentrl.
"""
import json
import sys
from types import SimpleNamespace


class _Recorder:
    """Stands in for the compiled grammar: accepts every token and records it."""

    def __init__(self):
        self.fed = []

    def accept_tokens(self, request_id, ids):
        self.fed.extend(int(i) for i in ids)
        return True


def main():
    job = json.load(sys.stdin)
    from transformers import AutoTokenizer
    from vllm.reasoning import ReasoningParserManager
    from vllm.v1.structured_output import StructuredOutputManager
    from vllm.v1.structured_output.request import StructuredOutputRequest
    tok = AutoTokenizer.from_pretrained(job['tokenizer'])
    manager = StructuredOutputManager.__new__(StructuredOutputManager)     # the gate only: no engine config
    manager.enable_in_reasoning = False
    manager.reasoner_cls = ReasoningParserManager.get_reasoning_parser(job['reasoning_parser'])
    manager.tokenizer = tok
    out = []
    for case in job['cases']:
        grammar = _Recorder()
        sor = StructuredOutputRequest.__new__(StructuredOutputRequest)
        sor.reasoning_ended, sor.reasoner, sor._grammar = None, None, grammar
        sor.reasoning_parser_kwargs = {'chat_template_kwargs': case.get('chat_template_kwargs') or {}}
        request = SimpleNamespace(request_id='r', use_structured_output=True, structured_output_request=sor,
                                  prompt_token_ids=list(case['prompt']), all_token_ids=list(case['prompt']))
        masked = []
        for t in case['turn']:
            masked.append(manager._get_constraint_bounds(request, ()).constraint_start == 0)
            request.all_token_ids.append(int(t))
            manager.accept_tokens(request, [int(t)])
        out.append({'masked': masked, 'fed': grammar.fed})
    json.dump(out, sys.stdout)


if __name__ == '__main__':
    main()
