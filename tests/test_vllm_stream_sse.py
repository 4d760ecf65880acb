"""The streamed ``/v1/completions`` parser on bytes a real vLLM 0.32 CPU server sent.

``tests/assets/vllm-stream/stream.sse`` and ``whole.json``: the same request (the head_dim-32 test model,
seed 4, 24 tokens, temperature 0.9, top_p 0.95; a 7-token turn that stops on ``<|im_end|>``) streamed
(:func:`agentrl.engines.vllm.client.stream_body`) and not, captured from the server of
``tests/live_vllm`` (which checks the same equality live).
"""
import json
from pathlib import Path

import pytest

from agentrl.engines.vllm.client import ServerDied, parse_completion, parse_stream, stream_body
from agentrl.engines.vllm.server import VLLMError

ASSETS = Path(__file__).resolve().parent / 'assets' / 'vllm-stream'
RAW = (ASSETS / 'stream.sse').read_bytes()
WHOLE = (ASSETS / 'whole.json').read_bytes()
PROMPT = [151644, 872, 198, 25958, 41904, 13, 151645, 198, 151644, 77091, 198]
URL = 'http://127.0.0.1:8000'


def lines(raw: bytes):
    return raw.splitlines(keepends=True)


def test_the_stream_is_the_unstreamed_answer_bit_for_bit():
    seen = []
    c = parse_stream(URL, lines(RAW), PROMPT, seen.append)
    w = parse_completion(URL, WHOLE, PROMPT)
    assert (c.ids, c.logp, c.finish_reason, c.stop_reason) == (w.ids, w.logp, w.finish_reason, w.stop_reason)
    assert c.ids == [144722, 134876, 138740, 135395, 10417, 58684, 151645] and c.stop_reason == 151645
    assert c.logp[0] == -12.10346508026123 and c.logp[-1] == -1.855205774307251
    assert seen == [c.ids[:k] for k in range(1, 8)]            # one chunk per token
    assert c.raw == RAW and c.url == URL


def test_stream_body_asks_for_chunks_and_usage():
    body = {'prompt': [1], 'stream': False, 'return_token_ids': True}
    assert stream_body(body) == {'prompt': [1], 'stream': True, 'return_token_ids': True,
                                 'stream_options': {'include_usage': True}}
    assert body['stream'] is False


def _cut(n_events: int) -> bytes:
    return b''.join(e + b'\n\n' for e in RAW.split(b'\n\n')[:n_events])


def test_a_body_that_ends_mid_turn_is_server_died():
    with pytest.raises(ServerDied, match=rf'^vllm server {URL} died mid-run \(the stream ended after 3 tokens without '
                                         r'a finish_reason or \[DONE\]\); finished episodes are kept'):
        parse_stream(URL, lines(_cut(3)), PROMPT)


def test_done_without_a_finish_reason_is_a_vllm_error():
    with pytest.raises(VLLMError, match=rf'^vllm server {URL}: the stream ended \(\[DONE\]\) without a finish_reason '
                                        r'after 3 tokens; fix: '):
        parse_stream(URL, lines(_cut(3) + b'data: [DONE]\n\n'), PROMPT)
    c = parse_stream(URL, lines(_cut(8)), PROMPT)               # the finish and usage chunks, no [DONE]: complete
    assert c.finish_reason == 'stop' and len(c.ids) == 7


def test_error_events_keep_the_servers_message():
    err = b'data: {"error": {"message": "bad things", "type": "BadRequestError", "code": 400}}\n\n'
    with pytest.raises(VLLMError, match=rf'^vllm server {URL}: /v1/completions stream error 400: bad things; fix: '):
        parse_stream(URL, lines(_cut(2) + err), PROMPT)
    died = b'data: {"error": {"message": "Internal server error", "type": "InternalServerError", "code": 500}}\n\n'
    with pytest.raises(ServerDied, match=rf'^vllm server {URL} died mid-run \(stream error 500: Internal server error'):
        parse_stream(URL, lines(_cut(2) + died), PROMPT)


def test_bad_chunks_are_one_line_errors():
    with pytest.raises(VLLMError, match=r'prompt_token_ids differ from the prompt sent; fix: send token ids'):
        parse_stream(URL, lines(RAW), PROMPT[:-1])
    with pytest.raises(VLLMError, match=r'a stream chunk that is not JSON \(b\'\{oops\'\)'):
        parse_stream(URL, lines(_cut(1) + b'data: {oops\n\n'), PROMPT)
    ev = json.loads(RAW.split(b'\n\n')[1][5:])
    del ev['choices'][0]['token_ids']
    with pytest.raises(VLLMError, match=r'a stream chunk without choices\[0\]\.token_ids / logprobs\.token_logprobs'):
        parse_stream(URL, lines(b'data: ' + json.dumps(ev).encode() + b'\n\n'), PROMPT)
    ev = json.loads(RAW.split(b'\n\n')[1][5:])
    ev['choices'][0]['logprobs']['token_logprobs'] = [None]
    with pytest.raises(VLLMError, match=r'a stream chunk of 1 token_ids but log-probs \[None\]; fix: '):
        parse_stream(URL, lines(b'data: ' + json.dumps(ev).encode() + b'\n\n'), PROMPT)
    usage = RAW.split(b'\n\n')[7].replace(b'"completion_tokens":7', b'"completion_tokens":9')
    with pytest.raises(VLLMError, match=r'the stream usage has 9 completion tokens but its chunks 7 token_ids'):
        parse_stream(URL, lines(_cut(7) + usage + b'\n\n'), PROMPT)
