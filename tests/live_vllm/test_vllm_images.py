"""Images through the vLLM engine: token ids plus the images' bytes to ``/inference/v1/generate``, every path.

One vLLM server over a tiny Qwen2.5-VL (``make_test_model(vision=True)`` at a head size vLLM CPU attention runs,
TRL's Qwen3-VL chat template: it renders tools and images in tool results), started with ``--enable-scale-out``
(VLLMServer adds it for a folder with ``preprocessor_config.json``). Image sides are multiples of 28 px (patch 14
times merge 2), so the processor keeps their size: vLLM's processor resizes with torchvision and the HF replay's
with PIL, and those resamplings differ in the pixels they give (docs/design.md#images). The images are
tests/_images.py's gradients.

Skips when the vLLM python cannot import torchvision (vLLM's Qwen2-VL processor needs it): build the vLLM venv with
the Makefile, whose ``vllm-torchvision`` step installs and patches it.
"""
import json
import os
import subprocess
from types import SimpleNamespace

import pytest

from _families import trl_template
from _tokenizers import tokenizer_path

pytest.importorskip('transformers')
pytest.importorskip('starlette')
pytest.importorskip('uvicorn')
openai = pytest.importorskip('openai')
try:
    import httpx2 as httpx
except ImportError:
    httpx = pytest.importorskip('httpx')
pytest.importorskip('PIL')                          # the HF replay of `agentrl check` decodes the images

from _gateway import finish, new_session, policy_turns, records_of  # noqa: E402
from _images import PAD, check_images, png  # noqa: E402
from agentrl.engines.contract import RequestRefused, TurnRequest, TurnResult  # noqa: E402
from agentrl.engines.vllm.client import generate_body, request_body, turn_path  # noqa: E402
from agentrl.engines.vllm.engine import VLLMEngine  # noqa: E402
from agentrl.engines.vllm.errors import VLLMError  # noqa: E402
from agentrl.engines.vllm.http import post  # noqa: E402
from agentrl.images import encode_image_url, image_digest, image_path, load_image  # noqa: E402
from agentrl.record import SamplingSpec  # noqa: E402

H = httpx.Client(timeout=600)
CALL = '<tool_call>\n{"name": "screenshot", "arguments": {}}\n</tool_call><|im_end|>'
TOOL = {'type': 'function', 'function': {'name': 'screenshot', 'description': 'Take a screenshot.',
                                         'parameters': {'type': 'object', 'properties': {}}}}


class ForcingVLLM(VLLMEngine):
    """VLLMEngine whose next turns can be forced: the text's ids, scored by the served model with the images.

    ``force`` is a list of texts; each ``sample`` pops the first (empty: samples as usual). A forced turn's
    log-probs are vLLM's prompt log-probs of its ids after the prompt (the same request, images included, with
    the ids appended); they are the sampler's at temperature 1 without filters, so the records replay at ratio 1.
    """

    def __init__(self, *a, **k):
        super().__init__(*a, **k)
        self.force = []

    def sample(self, request: TurnRequest) -> TurnResult:
        if not self.force:
            return super().sample(request)
        ids = self.tokenizer(self.force.pop(0), add_special_tokens=False)['input_ids']
        s = request.spec
        assert (s.temperature, s.top_p, s.top_k, s.min_p) == (1.0, 1.0, 0, 0.0), s
        url = self.urls[0]
        body = dict(request_body(self.endpoints[0].model, list(request.prompt_ids) + ids, s, max_tokens=1,
                                 stop_ids=(), seed=0), prompt_logprobs=0)
        sent = generate_body(body, request.images, self.placeholder_id()) if request.images else body
        raw = json.loads(post(url, turn_path(sent), sent, timeout=600))
        rows = raw['prompt_logprobs'] if request.images else raw['choices'][0]['prompt_logprobs']
        logp = [row[str(t)]['logprob'] for row, t in zip(rows[-len(ids):], ids)]
        return TurnResult(ids=ids, logp=logp, truncated=False, seed=request.seed, server=url)


@pytest.fixture(scope='module')
def vlm_dir(tmp_path_factory):
    from agentrl.engines.hf import make_test_model
    return make_test_model(tmp_path_factory.mktemp('vllm-vlm') / 'm', tokenizer_path('qwen3'), hidden=64, heads=2,
                           kv_heads=2, vision=True, chat_template=trl_template('qwen3_vl'))


@pytest.fixture(scope='module')
def vision_python(vllm_py):
    """The vLLM python, or a skip naming the Makefile step when it cannot import torchvision."""
    if subprocess.run([str(vllm_py), '-c', 'import torchvision.transforms'], capture_output=True,
                      timeout=600).returncode:
        pytest.skip(f'{vllm_py} cannot import torchvision, which vLLM\'s Qwen2-VL processor needs: run `make '
                    'vllm-torchvision` (the Makefile installs torchvision and patches its nms registrations) or set '
                    'AGENTRL_VLLM_PYTHON to a vLLM python that has it')
    return vllm_py


@pytest.fixture(scope='module')
def vserver(vision_python, vlm_dir, tmp_path_factory):
    from agentrl.engines.vllm import VLLMServer, VLLMServerOptions
    log = tmp_path_factory.mktemp('vllm-vlm-log') / 'server.log'
    options = VLLMServerOptions(name='tinyvl', cpus=os.environ.get('AGENTRL_VLLM_CPUS', '1'), max_model_len=2048,
                                max_num_seqs=8, ready_timeout=900)
    srv = VLLMServer(vlm_dir, options, python=vision_python, log_path=log)
    assert srv.command()[-1] == '--enable-scale-out'
    with srv:
        yield srv


@pytest.fixture(scope='module')
def upstream(vserver, vlm_dir):
    return ForcingVLLM([vserver.url], vlm_dir, max_new_tokens=12, concurrency=4)


def opening(engine, *images):
    """A recorder whose user message holds ``images`` (PNG bytes)."""
    from agentrl.templates import ChatRecorder, ChatTemplate
    parts = [{'type': 'text', 'text': 'What is on my screen?'}]
    parts += [{'type': 'image_url', 'image_url': {'url': encode_image_url(x)}} for x in images]
    return ChatRecorder(ChatTemplate(engine.tokenizer), [{'role': 'user', 'content': parts}], history='sampled')


# ---------------------------------------------------------------------------- the gateway, end to end
def test_screenshot_tool_episode_through_the_gateway_replays_and_exports(upstream, vserver, vlm_dir, tmp_path):
    """The openai SDK: a user photo, a forced screenshot call, a tool result carrying the screenshot, then an answer
    vLLM samples streamed with both images; the record carries them, replays at ratio 1 and exports."""
    from agentrl.cli.main import main as agentrl
    from agentrl.gateway import Gateway
    from agentrl.gateway.server import Server
    from agentrl.jobs.check import CheckOptions, run_check
    run_dir = tmp_path / 'run'
    srv = Server(Gateway(upstream, run_dir), pause_wait=0.5).start()
    try:
        sess = new_session(H, srv, group_id='img', rollout_id='screen', task='look')
        c = openai.OpenAI(api_key='unused', base_url=sess['base_url'], max_retries=0)
        photo, shot = png(56, 84, seed=3), png(112, 84, seed=11)           # 6 and 12 placeholder ids
        msgs = [{'role': 'user', 'content': [{'type': 'text', 'text': 'What is on my screen? A photo: '},
                                             {'type': 'image_url', 'image_url': {'url': encode_image_url(photo)}}]}]
        upstream.force.append(CALL)
        r = c.chat.completions.create(model='m', messages=msgs, tools=[TOOL], seed=1, max_tokens=32)
        [call] = r.choices[0].message.tool_calls
        assert (call.function.name, r.choices[0].finish_reason) == ('screenshot', 'tool_calls')
        msgs += [r.choices[0].message.model_dump(exclude_none=True),
                 {'role': 'tool', 'tool_call_id': call.id,
                  'content': [{'type': 'image_url', 'image_url': {'url': encode_image_url(shot)}},
                              {'type': 'text', 'text': 'the screen'}]}]
        chunks = list(c.chat.completions.create(model='m', messages=msgs, tools=[TOOL], seed=2, max_tokens=12,
                                                stream=True))
        assert upstream.force == [] and chunks[-1].choices[0].finish_reason in ('stop', 'length', 'tool_calls')
        state = H.get(f'{srv.url}/sessions/{sess["token"]}').json()
        assert (state['calls'], state['branches'], state['forks']) == (2, 1, [])
        assert finish(H, srv, sess)['records'] == 1
        stop_ids = srv.gateway.template([TOOL]).stop_ids
    finally:
        srv.stop()
    [t] = records_of(run_dir, sess['session'])
    check_images(t, [photo, shot], ['prompt', 'tool'])
    turns = policy_turns(t)
    assert turns[0] == upstream.tokenizer(CALL, add_special_tokens=False)['input_ids'] and len(turns) == 2
    assert t.provenance.policy == 'vllm' and t.info['gateway']['servers'] == [vserver.url] * 2
    # the streamed answer is the unstreamed request's, id for id and log-prob for log-prob (float32 in the record)
    mask = t.action_mask.tolist()
    start = [j + 1 for j, m in enumerate(mask) if m][len(turns[0])]          # the answer's first id
    images = [SimpleNamespace(digest=e['digest'], length=e['length'], data=load_image(run_dir, e['digest']))
              for e in t.info['images']]
    again = upstream.sample(TurnRequest(t.ids.tolist()[:start], t.provenance.sampling, 12,
                                        t.info['gateway']['seeds'][1], stop_ids, images=images))
    assert again.ids == turns[1]
    stored = [t.sample_logp.tolist()[j] for j in range(len(mask)) if mask[j]][-len(turns[1]):]
    import torch
    assert stored == torch.tensor(again.logp, dtype=torch.float32).tolist()
    rep = run_check(CheckOptions(path=str(run_dir), model=str(vlm_dir), max_ratio_dev=1e-4))
    assert (rep.n, rep.refused, rep.code) == (1, 0, 0), rep.format()
    print(f'vllm images replay: max |ratio - 1| = {rep.replay.overall.max_abs_dev:.3e} '
          f'over {rep.replay.overall.n} tokens')
    assert rep.replay.overall.n == sum(map(len, turns)) and rep.replay.overall.max_abs_dev <= 1e-4
    assert agentrl(['check', str(run_dir), '--model', str(vlm_dir), '--max-ratio-dev', '1e-4']) == 0
    assert agentrl(['export', str(run_dir / 'trajectories'), '--to', 'verl', '--out', str(tmp_path / 'verl')]) == 0
    d = torch.load(tmp_path / 'verl' / 'verl_batch.pt', weights_only=False)
    assert d['non_tensor_batch']['multi_modal_data'][0]['images'] == [photo, shot]
    assert agentrl(['export', str(run_dir / 'trajectories'), '--to', 'trl', '--out', str(tmp_path / 'trl')]) == 0
    row = json.loads((tmp_path / 'trl' / 'trl_rollout.json').read_text())
    assert row['images'][0] == [f'images/{image_digest(x)[7:]}.png' for x in (photo, shot)]
    assert (run_dir / 'images' / f'{image_digest(shot)[7:]}.png').read_bytes() == shot
    assert image_path(run_dir, image_digest(photo)) is not None


# ---------------------------------------------------------------------------- the rollout driver's batch
def test_run_vllm_episodes_sends_each_turns_images_and_the_records_replay(upstream, vserver, vlm_dir, tmp_path):
    from agentrl import store
    from agentrl.engines.episode import Reply
    from agentrl.engines.vllm import run_vllm_episodes
    from agentrl.jobs.check import CheckOptions, run_check
    shots = [png(56, 56, seed=1), png(84, 56, seed=2)]
    recs = [opening(upstream, x) for x in shots]
    responses, sent = [], [list(r.prompt_ids) for r in recs]
    out = run_vllm_episodes([vserver.endpoint], recs, lambda i, turn, text: Reply(done=True, reward=1.0),
                            seeds=[5, 6], spec=SamplingSpec(temperature=1.0), max_new_tokens=8, responses=responses,
                            logp_mode='processed')
    assert [[e['digest'] for e in t.info['images']] for t in out] == [[image_digest(x)] for x in shots]
    assert [[e['length'] for e in t.info['images']] for t in out] == [[4], [6]]
    assert sorted((i, k) for i, k, _, _ in responses) == [(0, 0), (1, 0)]
    for i, _, body, raw in responses:                       # vLLM ran the expanded prompt, id for id
        assert body['prompt'] == json.loads(raw)['prompt_token_ids'] == sent[i]
        assert sent[i].count(PAD) == out[i].info['images'][0]['length']
    store.write_trajectories(tmp_path / 'run' / 'trajectories.parquet', out,
                             images={image_digest(x): x for x in shots})
    rep = run_check(CheckOptions(path=str(tmp_path / 'run'), model=str(vlm_dir), max_ratio_dev=1e-4))
    assert (rep.n, rep.refused, rep.code) == (2, 0, 0), rep.format()
    assert rep.replay.overall.max_abs_dev <= 1e-4


# ---------------------------------------------------------------------------- refusals
def test_images_that_do_not_match_the_placeholder_runs_are_refused_by_name(upstream, vserver):
    rec = opening(upstream, png(56, 84, seed=4))
    [img] = rec.images
    stop = rec.template.stop_ids

    def ask(images):
        upstream.sample(TurnRequest(rec.prompt_ids, SamplingSpec(), 4, 1, stop, images=images))
    with pytest.raises(RequestRefused) as e:                       # two images for one run of placeholders
        ask([img, img])
    assert str(e.value) == ('VLLMEngine.sample: the prompt holds 1 runs of placeholder ids 151655 for 2 images; send '
                            'each image with the prompt its template expanded')
    big = png(112, 112, seed=4)                                    # 16 ids in vLLM's processor, 6 in the prompt
    with pytest.raises(VLLMError) as e:
        ask([SimpleNamespace(digest=image_digest(big), data=big, length=6)])
    assert str(e.value) == (f"vllm server {vserver.url}: image 0 ({image_digest(big)}) has 6 placeholder ids 151655 "
                            "in the prompt but vLLM's processor expands it to 16; fix: serve the model folder whose "
                            'preprocessor_config.json the template read (same min/max_pixels, patch and merge sizes)')
    with pytest.raises(VLLMError) as e:                            # the same through the streamed request
        upstream.sample(TurnRequest(rec.prompt_ids, SamplingSpec(), 4, 1, stop, on_token=lambda ids: None,
                                    images=[SimpleNamespace(digest=image_digest(big), data=big, length=6)]))
    assert 'expands it to 16' in str(e.value)


def test_a_text_prompt_gets_the_same_turn_from_both_endpoints(upstream, vserver):
    """The generate body carries the completions body's sampling fields as they are: same ids, same log-probs."""
    from agentrl.engines.vllm.client import parse_completion
    from agentrl.engines.vllm.engine import complete_ids
    rec = opening(upstream)
    body = upstream.body(rec.prompt_ids, SamplingSpec(temperature=0.9, top_p=0.95), 8, 3, rec.template.stop_ids,
                         vserver.url)
    sent = generate_body(body, [], PAD)
    assert turn_path(sent) == '/inference/v1/generate' and sent['token_ids'] == body['prompt']
    assert {k: v for k, v in body.items() if k in sent['sampling_params']} == sent['sampling_params']
    direct = complete_ids(vserver.url, body)
    got = parse_completion(vserver.url, post(vserver.url, turn_path(sent), sent, timeout=600), body['prompt'])
    assert (got.ids, got.logp, got.finish_reason) == (direct['ids'], direct['logp'], direct['finish_reason'])
