"""Recording cost: after a template's first episode, an episode makes no tokenizer-wide call (counted, not timed)."""
import json
from collections import Counter

import pytest

from _tokenizers import tokenizer_path

TOOLS = [{'type': 'function', 'function': {'name': 'read', 'description': 'read the file', 'parameters': {
    'type': 'object', 'properties': {}}}}]
TEXT = '<think>\nlook\n</think>\n\n<tool_call>\n{"name": "read", "arguments": {}}\n</tool_call>'


@pytest.fixture(scope='module')
def counting():
    """A fresh Qwen3 tokenizer whose ``len()`` and ``get_vocab()`` (each a walk over the vocabulary) are counted."""
    transformers = pytest.importorskip('transformers')
    tok = transformers.AutoTokenizer.from_pretrained(str(tokenizer_path('qwen3')))
    calls = Counter()
    base = type(tok)

    class Counting(base):
        def __len__(self):
            calls['len'] += 1
            return base.__len__(self)

        def get_vocab(self):
            calls['get_vocab'] += 1
            return base.get_vocab(self)

    Counting.__name__ = base.__name__          # the tokenizer fingerprint names the class
    tok.__class__ = Counting
    return tok, calls


def chat_episode(template, tok, user: str, turns: int = 6):
    from agentrl.templates import ChatRecorder
    eot = tok.convert_tokens_to_ids('<|im_end|>')
    rec = ChatRecorder(template, [{'role': 'system', 'content': 'You fix bugs.'}, {'role': 'user', 'content': user}])
    ids = tok.encode(TEXT, add_special_tokens=False) + [eot]
    for k in range(turns):
        rec.add_turn(ids, [-0.25] * len(ids))
        if k < turns - 1:
            rec.add_messages([{'role': 'tool', 'content': f'def f(x):\n    return x + {k}\n'}])
    return rec.finish(reward=1.0)


def gateway_episode(template, tok, user: str, turns: int = 6):
    from agentrl.engines.contract import TurnResult
    from agentrl.families import QWEN3
    from agentrl.gateway.parse import parse_reply
    from agentrl.gateway.records import session_records
    from agentrl.gateway.sessions import Session
    eot = tok.convert_tokens_to_ids('<|im_end|>')
    ids = tok.encode(TEXT, add_special_tokens=False) + [eot]
    s = Session('sid', {})
    msgs = [{'role': 'user', 'content': user}]
    for k in range(turns):
        plan = s.plan(msgs, json.dumps(TOOLS, sort_keys=True), template, QWEN3)
        message = parse_reply(TEXT, QWEN3, id_seed=f'sid/{k}', think_open=False)
        s.commit(plan, TurnResult(ids=ids, logp=[-0.25] * len(ids), truncated=False, seed=k), message,
                 {'index': k, 'digest': str(k), 'seed': k, 'response': {}, 'version': '0'})
        msgs = msgs + [message, {'role': 'tool', 'content': f'result {k}'}]
    return session_records(s, 'm')


def test_an_episode_makes_no_tokenizer_wide_call_once_the_template_is_warm(counting):
    from agentrl.templates import ChatTemplate
    tok, calls = counting
    template = ChatTemplate(tok, tools=TOOLS)
    first = chat_episode(template, tok, 'Fix clamp.')
    gateway_episode(template, tok, 'Fix clamp.')
    assert calls['len'] == 1                   # once per template: the vocabulary bound of add_turn
    calls.clear()
    again = chat_episode(template, tok, 'Fix clamp.')
    chat_episode(template, tok, 'Fix sort.')   # another opening
    (rec,) = gateway_episode(template, tok, 'Fix sort.')
    assert calls == Counter()
    assert again.ids.tolist() == first.ids.tolist() and again.owner.tolist() == first.owner.tolist()
    assert [c['status'] for per in rec.info['turn_calls'] for c in per] == ['ok'] * 6
