"""The vLLM engine's image requests without a server: the ``/inference/v1/generate`` body, its answers, the flag.

The answers are written here in the shape vLLM 0.32's ``/inference/v1/generate`` sends (``output_mode`` tokens,
``logprobs.content``, ``prompt_token_ids`` and ``mm_placeholders`` at the top level); tests/live_vllm/
test_vllm_images.py runs the same code against a real server.
"""
import json
import sys
from types import SimpleNamespace

import pytest

from agentrl.engines.vllm import VLLMServer
from agentrl.engines.vllm.client import (GENERATE_PATH, generate_body, image_runs, parse_completion, parse_stream,
                                         request_body, stream_body, turn_path)
from agentrl.engines.vllm.errors import VLLMError
from agentrl.images import image_digest
from agentrl.record import SamplingSpec

PAD, VS, VE = 151655, 151652, 151653
URL = 'http://127.0.0.1:8000'
PNG = b'\x89PNG\r\n\x1a\n' + b'\x00' * 16           # only its first bytes are read (the MIME type)
IMG = SimpleNamespace(digest=image_digest(PNG), data=PNG, length=3)
PROMPT = [1, 2, VS, PAD, PAD, PAD, VE, 3, VS, PAD, PAD, PAD, VE, 4]


def body(prompt=PROMPT):
    return request_body('m', prompt, SamplingSpec(temperature=0.9, top_p=0.95), max_tokens=4, stop_ids={7}, seed=5)


def answer(prompt_ids, ids=(10, 7), logp=(-1.5, -0.25)) -> bytes:
    content = [{'token_id': i, 'logprob': x, 'rank': 3, 'top_logprobs': [{'token_id': i, 'logprob': x, 'rank': 3}]}
               for i, x in zip(ids, logp)]
    return json.dumps({'request_id': 'generate-tokens-1', 'model': 'm', 'prompt_token_ids': prompt_ids,
                       'mm_placeholders': {'image': [{'offset': 3, 'length': 3}, {'offset': 9, 'length': 3}]},
                       'output_mode': 'tokens', 'choices': [{'index': 0, 'finish_reason': 'stop', 'stop_reason': 7,
                                                             'token_ids': list(ids),
                                                             'logprobs': {'content': content}}]}).encode()


def test_each_run_goes_as_one_placeholder_with_the_images_bytes_and_the_same_sampling_fields():
    b = body()
    sent = generate_body(b, [IMG, IMG], PAD)
    assert sent['token_ids'] == [1, 2, VS, PAD, VE, 3, VS, PAD, VE, 4]
    assert sent['content_parts'] == [{'type': 'image_url', 'url': 'data:image/png;base64,iVBORw0KGgo' + 'A' * 21}] * 2
    sp = sent['sampling_params']
    assert sp == {k: v for k, v in b.items() if k not in ('model', 'prompt', 'use_beam_search', 'return_token_ids',
                                                          'echo', 'stream')}
    assert (sp['seed'], sp['temperature'], sp['stop_token_ids'], sp['logprobs'], sp['ignore_eos']) == (5, 0.9, [7], 0,
                                                                                                       True)
    assert (sent['model'], sent['return_token_ids'], sent['stream'], turn_path(sent)) == ('m', True, False,
                                                                                          GENERATE_PATH)
    assert turn_path(b) == '/v1/completions' and 'stream_options' not in sent
    streamed = generate_body(stream_body(b), [IMG, IMG], PAD)
    assert (streamed['stream'], streamed['stream_options']) == (True, {'include_usage': True})
    assert 'stream_options' not in streamed['sampling_params']


def test_images_that_do_not_match_the_runs_are_refused_by_name():
    assert image_runs(PROMPT, [IMG, IMG], PAD) == [(3, 3), (9, 3)]
    with pytest.raises(ValueError, match=r'^the prompt holds 2 runs of placeholder ids 151655 for 1 images; '):
        generate_body(body(), [IMG], PAD)
    short = SimpleNamespace(digest=IMG.digest, data=PNG, length=4)
    with pytest.raises(ValueError) as e:
        image_runs(PROMPT, [IMG, short], PAD)
    assert str(e.value) == (f'image 1 ({IMG.digest}): the prompt holds 3 placeholder ids 151655 for it, the image '
                            'needs 4; send the ids its template expanded')


def test_the_answer_reads_as_a_completion_and_the_prompt_vllm_ran_is_checked():
    c = parse_completion(URL, answer(PROMPT), PROMPT, ([IMG, IMG], PAD))
    assert (c.ids, c.logp, c.finish_reason, c.stop_reason) == ([10, 7], [-1.5, -0.25], 'stop', 7)
    ran = PROMPT[:9] + [PAD] + PROMPT[9:]                  # vLLM expanded the second image to 4
    with pytest.raises(VLLMError) as e:
        parse_completion(URL, answer(ran), PROMPT, ([IMG, IMG], PAD))
    assert str(e.value) == (f"vllm server {URL}: image 1 ({IMG.digest}) has 3 placeholder ids 151655 in the prompt "
                            "but vLLM's processor expands it to 4; fix: serve the model folder whose "
                            'preprocessor_config.json the template read (same min/max_pixels, patch and merge sizes)')
    with pytest.raises(VLLMError, match=r'answered without prompt_token_ids; fix: '):
        parse_completion(URL, answer(None), PROMPT, ([IMG, IMG], PAD))


def test_the_streamed_answer_is_the_unstreamed_one():
    first = {'request_id': 'r', 'prompt_token_ids': PROMPT, 'output_mode': 'tokens', 'choices': [
        {'index': 0, 'finish_reason': None, 'token_ids': [10], 'logprobs': {'content': [
            {'token_id': 10, 'logprob': -1.5, 'top_logprobs': []}]}}]}
    last = {'request_id': 'r', 'output_mode': 'tokens', 'choices': [
        {'index': 0, 'finish_reason': 'stop', 'stop_reason': 7, 'token_ids': [7], 'logprobs': {'content': [
            {'token_id': 7, 'logprob': -0.25, 'top_logprobs': []}]}}]}
    usage = {'request_id': 'r', 'choices': [], 'usage': {'prompt_tokens': 14, 'completion_tokens': 2}}
    raw = b''.join(b'data: ' + json.dumps(e).encode() + b'\n\n' for e in (first, last, usage)) + b'data: [DONE]\n\n'
    seen = []
    c = parse_stream(URL, raw.splitlines(keepends=True), PROMPT, seen.append, ([IMG, IMG], PAD))
    w = parse_completion(URL, answer(PROMPT), PROMPT, ([IMG, IMG], PAD))
    assert (c.ids, c.logp, c.finish_reason, c.stop_reason) == (w.ids, w.logp, w.finish_reason, w.stop_reason)
    assert seen == [[10], [10, 7]]
    bad = raw.replace(json.dumps(PROMPT).encode(), json.dumps(PROMPT[:9] + [PAD] + PROMPT[9:]).encode())
    with pytest.raises(VLLMError, match=r"image 1 \(sha256:\w+\) has 3 placeholder ids 151655 in the prompt but "
                                        r"vLLM's processor expands it to 4"):
        parse_stream(URL, bad.splitlines(keepends=True), PROMPT, None, ([IMG, IMG], PAD))


def test_a_vision_model_folder_starts_its_server_with_the_generate_endpoint(tmp_path):
    srv = VLLMServer(tmp_path, python=sys.executable)
    assert '--enable-scale-out' not in srv.command()
    (tmp_path / 'preprocessor_config.json').write_text('{}')
    assert srv.command()[-1] == '--enable-scale-out'
