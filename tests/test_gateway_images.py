"""Images through the gateway: chat completions (openai SDK), Anthropic Messages (anthropic SDK) and Responses.

One gateway server (uvicorn in a thread, tests/_gateway.py's ``ForcingHF``) over ``make_test_model(vision=True)``:
a tiny random Qwen2.5-VL with the real Qwen3 tokenizer and TRL's Qwen3-VL chat template (it renders tools and
images in tool results). Each episode teacher-forces a tool call, answers it with a tool result carrying a PNG
made here with Pillow, then forces the answer; the forced turns are scored with the pixels, so
``agentrl check RUN --model M`` replays the records with ratio 1.
"""
import base64
import io
import json

import pytest

from _families import trl_template
from _tokenizers import tokenizer_path

torch = pytest.importorskip('torch')
pytest.importorskip('transformers')
pytest.importorskip('starlette')
pytest.importorskip('uvicorn')
PIL = pytest.importorskip('PIL')
openai = pytest.importorskip('openai')
anthropic = pytest.importorskip('anthropic')
try:                       # the SDKs ship httpx2; older versions use httpx
    import httpx2 as httpx
except ImportError:
    httpx = pytest.importorskip('httpx')
H = httpx.Client(timeout=120)

from _gateway import ForcingHF, finish, new_session, policy_turns, records_of  # noqa: E402
from _images import check_images  # noqa: E402
from agentrl.gateway import Gateway, GatewayError  # noqa: E402
from agentrl.gateway.limits import Limits  # noqa: E402
from agentrl.gateway.server import Server  # noqa: E402
from agentrl.images import image_digest, image_path  # noqa: E402
from agentrl.record import OWNER  # noqa: E402

CALL = '<tool_call>\n{"name": "screenshot", "arguments": {}}\n</tool_call><|im_end|>'
ANSWER = 'A blue square on red.<|im_end|>'
TOOL = {'type': 'function', 'function': {'name': 'screenshot', 'description': 'Take a screenshot.',
                                         'parameters': {'type': 'object', 'properties': {}}}}
PAD, VS, VE = 151655, 151652, 151653


def png(w: int, h: int, seed: int = 0) -> bytes:
    """A PNG drawn with Pillow: a red field with a blue square placed by ``seed``."""
    from PIL import Image, ImageDraw
    im = Image.new('RGB', (w, h), (200, 30, 30))
    ImageDraw.Draw(im).rectangle([seed % (w // 2), 4, seed % (w // 2) + w // 3, 4 + h // 3], fill=(20, 40, 220))
    buf = io.BytesIO()
    im.save(buf, format='PNG')
    return buf.getvalue()


def data_url(data: bytes) -> str:
    return 'data:image/png;base64,' + base64.b64encode(data).decode()


@pytest.fixture(scope='module')
def vlm_dir(tmp_path_factory):
    from agentrl.engines.hf import make_test_model
    return make_test_model(tmp_path_factory.mktemp('gw-vlm') / 'm', tokenizer_path('qwen3'), vision=True,
                           chat_template=trl_template('qwen3_vl'))


@pytest.fixture(scope='module')
def upstream(vlm_dir):
    engine = ForcingHF(vlm_dir, device='cpu', max_new_tokens=24)
    assert engine.image_processor is not None
    return engine


@pytest.fixture(scope='module')
def run_dir(tmp_path_factory):
    return tmp_path_factory.mktemp('gw-img-run') / 'run'


@pytest.fixture(scope='module')
def server(upstream, run_dir):
    srv = Server(Gateway(upstream, run_dir), pause_wait=0.5).start()
    yield srv
    srv.stop()


def forced_ids(upstream):
    return [upstream.tokenizer(x, add_special_tokens=False)['input_ids'] for x in (CALL, ANSWER)]


# ---------------------------------------------------------------------------- the SDKs, end to end
def test_chat_completions_tool_image_episode_is_one_branch_and_check_passes(server, upstream, run_dir, vlm_dir):
    from agentrl.cli.main import main as agentrl
    sess = new_session(H, server, group_id='img', rollout_id='chat', task='look')
    c = openai.OpenAI(api_key='unused', base_url=sess['base_url'], max_retries=0)
    photo, shot = png(90, 50, seed=3), png(200, 120, seed=11)
    msgs = [{'role': 'user', 'content': [
        {'type': 'text', 'text': 'What is on my screen? Here is a photo: '},
        {'type': 'image_url', 'image_url': {'url': data_url(photo), 'detail': 'low'}}]}]
    upstream.force.append(CALL)
    r = c.chat.completions.create(model='m', messages=msgs, tools=[TOOL], seed=1, max_tokens=32)
    [call] = r.choices[0].message.tool_calls
    assert (call.function.name, r.choices[0].finish_reason) == ('screenshot', 'tool_calls')
    msgs[0]['content'][1] = {'type': 'image_url', 'image_url': data_url(photo)}    # echoed in another spelling
    msgs += [r.choices[0].message.model_dump(exclude_none=True),
             {'role': 'tool', 'tool_call_id': call.id,
              'content': [{'type': 'image_url', 'image_url': {'url': data_url(shot)}},
                          {'type': 'text', 'text': 'the screen'}]}]
    upstream.force.append(ANSWER)
    r2 = c.chat.completions.create(model='m', messages=msgs, tools=[TOOL], seed=2, max_tokens=32)
    assert upstream.force == [] and r2.choices[0].message.content == 'A blue square on red.'
    state = H.get(f'{server.url}/sessions/{sess["token"]}').json()
    assert (state['calls'], state['branches'], state['forks']) == (2, 1, [])    # the echoed images continue it
    assert finish(H, server, sess)['records'] == 1
    [t] = records_of(run_dir, sess['session'])
    check_images(t, [photo, shot], ['prompt', 'tool'])
    assert policy_turns(t) == forced_ids(upstream)
    assert {f'{image_digest(x)[7:]}.png' for x in (photo, shot)} <= {p.name for p in (run_dir / 'images').iterdir()}
    assert agentrl(['check', str(run_dir), '--model', str(vlm_dir)]) == 0


def test_anthropic_tool_result_image_episode_is_one_branch(server, upstream, run_dir):
    sess = new_session(H, server, group_id='img', rollout_id='anthropic', task='look')
    c = anthropic.Anthropic(api_key='unused', base_url=sess['base_url'][:-len('/v1')], max_retries=0)
    shot = png(120, 80, seed=5)
    tools = [{'name': 'screenshot', 'description': 'Take a screenshot.',
              'input_schema': {'type': 'object', 'properties': {}}}]
    msgs = [{'role': 'user', 'content': 'What is on my screen?'}]
    upstream.force.append(CALL)
    r = c.messages.create(model='m', max_tokens=32, messages=msgs, tools=tools)
    [use] = [b for b in r.content if b.type == 'tool_use']
    assert (use.name, r.stop_reason) == ('screenshot', 'tool_use')
    msgs += [{'role': 'assistant', 'content': [b.model_dump(exclude_none=True) for b in r.content]},
             {'role': 'user', 'content': [{'type': 'tool_result', 'tool_use_id': use.id, 'content': [
                 {'type': 'image', 'source': {'type': 'base64', 'media_type': 'image/png',
                                              'data': base64.b64encode(shot).decode()}},
                 {'type': 'text', 'text': 'the screen'}]}]}]
    counted = c.messages.count_tokens(model='m', messages=msgs, tools=tools).input_tokens
    upstream.force.append(ANSWER)
    r2 = c.messages.create(model='m', max_tokens=32, messages=msgs, tools=tools)
    assert upstream.force == [] and r2.content[0].text == 'A blue square on red.'
    assert r2.usage.input_tokens == counted
    state = H.get(f'{server.url}/sessions/{sess["token"]}').json()
    assert (state['calls'], state['branches'], state['forks']) == (2, 1, [])
    assert finish(H, server, sess)['records'] == 1
    [t] = records_of(run_dir, sess['session'])
    check_images(t, [shot], ['tool'])
    assert t.info['gateway']['dialects'] == ['anthropic'] * 2
    assert policy_turns(t) == forced_ids(upstream)


def test_responses_function_call_output_image_episode_is_one_branch(server, upstream, run_dir):
    sess = new_session(H, server, group_id='img', rollout_id='responses', task='look')
    c = openai.OpenAI(api_key='unused', base_url=sess['base_url'], max_retries=0)
    photo, shot = png(64, 64, seed=2), png(150, 90, seed=8)
    tools = [{'type': 'function', 'name': 'screenshot', 'description': 'Take a screenshot.',
              'parameters': {'type': 'object', 'properties': {}}}]
    items = [{'role': 'user', 'content': [{'type': 'input_text', 'text': 'Compare: '},
                                          {'type': 'input_image', 'image_url': data_url(photo), 'detail': 'auto'}]}]
    upstream.force.append(CALL)
    r = c.responses.create(model='m', input=items, tools=tools, store=False)
    [fc] = [o for o in r.output if o.type == 'function_call']
    items += [o.model_dump(exclude_none=True) for o in r.output]
    items.append({'type': 'function_call_output', 'call_id': fc.call_id, 'output': [
        {'type': 'input_image', 'image_url': data_url(shot)}, {'type': 'input_text', 'text': 'the screen'}]})
    upstream.force.append(ANSWER)
    r2 = c.responses.create(model='m', input=items, tools=tools, store=False)
    assert upstream.force == [] and r2.output_text == 'A blue square on red.'
    state = H.get(f'{server.url}/sessions/{sess["token"]}').json()
    assert (state['calls'], state['branches'], state['forks']) == (2, 1, [])
    assert finish(H, server, sess)['records'] == 1
    [t] = records_of(run_dir, sess['session'])
    check_images(t, [photo, shot], ['prompt', 'tool'])
    assert policy_turns(t) == forced_ids(upstream)


def test_export_and_a_record_one_placeholder_short_is_refused(server, run_dir, vlm_dir, tmp_path, capsys):
    """Runs after the episodes above: verl and TRL get the multimodal layout; an edited record is refused by name."""
    from agentrl import store
    from agentrl.cli.main import main as agentrl
    from agentrl.jobs.check import CheckOptions, run_check
    recs = store.read_trajectories(run_dir / 'trajectories')
    assert len(recs) >= 3 and all(r.info.get('images') for r in recs)
    rep = run_check(CheckOptions(path=str(run_dir), model=str(vlm_dir), max_ratio_dev=1e-5))
    assert (rep.n, rep.refused, rep.code) == (len(recs), 0, 0), rep.format()
    assert max(x.stats.max_abs_dev for x in rep.replays if x.stats.n) <= 1e-5       # forced turns saw the pixels
    out = tmp_path / 'verl'
    assert agentrl(['export', str(run_dir / 'trajectories'), '--to', 'verl', '--out', str(out)]) == 0
    d = torch.load(out / 'verl_batch.pt', weights_only=False)
    mm = d['non_tensor_batch']['multi_modal_data']
    assert [len(x['images']) for x in mm] == [len(r.info['images']) for r in recs]
    assert mm[0]['images'][0] == image_path(run_dir, recs[0].info['images'][0]['digest']).read_bytes()
    grids = d['non_tensor_batch']['multi_modal_inputs'][0]['image_grid_thw'].tolist()
    assert grids == [e['grid'] for e in recs[0].info['images']]
    assert d['batch']['position_ids'].shape[:2] == (len(recs), 4)          # mrope: text + t/h/w rows
    out = tmp_path / 'trl'
    assert agentrl(['export', str(run_dir / 'trajectories'), '--to', 'trl', '--out', str(out)]) == 0
    r = json.loads((out / 'trl_rollout.json').read_text())
    assert r['images'][0] == [f"images/{e['digest'][7:]}.png" for e in recs[0].info['images']]
    assert all((out / p).is_file() for row in r['images'] for p in row)
    capsys.readouterr()
    # one placeholder too few: the tool image's run shortened by one id (the ids, owners, mask and log-probs too)
    t = recs[0]
    e = t.info['images'][-1]
    cut = e['start'] + e['length'] - 1
    keep = [j for j in range(len(t.ids)) if j != cut]
    from agentrl.record import Trajectory
    logp = [0.0] + t.sample_logp.tolist()             # aligned to ids, as from_tokens takes them
    bad = Trajectory.from_tokens(t.ids[keep], t.owner[keep], t.turn[keep], [logp[j] for j in keep], t.reward,
                                 t.info, provenance=t.provenance)
    store.write_trajectories(tmp_path / 'bad' / 'trajectories.parquet', [bad],
                             images={x['digest']: image_path(run_dir, x['digest']).read_bytes()
                                     for x in t.info['images']})
    assert agentrl(['check', str(tmp_path / 'bad'), '--model', str(vlm_dir)]) == 1
    text = capsys.readouterr().out
    assert f"ImageRunError: ids[{cut}]: is {VE}, not the image placeholder {PAD}, inside the run of image " \
        f"{len(t.info['images']) - 1} ({e['digest'][:19]}) (ids[{e['start']}:{cut + 1}], {e['length']} ids)" in text


# ---------------------------------------------------------------------------- refusals
def test_refusals_name_the_part_and_the_limit_and_a_restart_keeps_the_images(upstream, vlm_dir, tmp_path):
    from agentrl import store
    from agentrl.gateway.protocol import parse_request
    gw = Gateway(upstream, tmp_path / 'run', limits=Limits(max_image_bytes=4000, max_images_per_request=2,
                                                         max_images_per_session=3))
    _, s = gw.open_session({})

    def ask(*parts, role='user'):
        body = {'messages': [{'role': role, 'content': list(parts)}], 'max_tokens': 2}
        req, _ = parse_request(json.dumps(body).encode(), 1 << 24)
        return gw.prepare(s, req, 'd', 0)

    def refused(*parts, role='user'):
        with pytest.raises(GatewayError) as e:
            p = ask(*parts, role=role)
            gw.drop(p)
        return e.value.status, e.value.code, e.value.param, e.value.message

    small = [{'type': 'image_url', 'image_url': {'url': data_url(png(16 + i, 16, seed=i))}} for i in range(4)]
    big = {'type': 'image_url', 'image_url': {'url': data_url(png(300, 300, seed=1) + b'\0' * 5000)}}
    assert refused({'type': 'image_url', 'image_url': {'url': 'https://example.com/cat.png'}})[2:] == (
        'messages[0].content[0]', 'messages[0].content[0]["url"] is an http(s) URL: agentrl does not fetch images '
        '(the record must hold the bytes the model saw); send the image as data:image/png;base64,...')
    st, code, param, msg = refused(big)
    assert (st, code, param) == (413, 'max_image_bytes', 'messages[0].content[0]')
    assert msg.startswith('messages[0].content[0] is an image of ')
    assert msg.endswith('bytes, over the limit of 4000 (max_image_bytes); send a smaller image')
    assert refused(*small[:3])[:2] == (400, 'max_images_per_request')
    p = ask(*small[:2])
    sample = gw.sample(p)
    gw.delivered(s, gw.complete(p, sample)[1])
    assert set(s.images) == {image_digest(png(16 + i, 16, seed=i)) for i in range(2)}
    assert image_path(tmp_path / 'run', image_digest(png(16, 16, seed=0))) is not None     # kept when journalled
    st, code, _, msg = refused(*small[2:4])
    assert (st, code) == (400, 'max_images_per_session') and 'would hold 4 images, over the limit of 3' in msg
    again = Gateway(upstream, tmp_path / 'run')           # a restart: the journalled call is planned again
    assert again.finish(again.sessions[s.sid], 1.0, {})['records'] == 1
    [t] = store.read_trajectories(tmp_path / 'run' / 'trajectories')
    assert [d['digest'] for d in t.info['images']] == [image_digest(png(16 + i, 16, seed=i)) for i in range(2)]
    assert refused(small[0], role='system')[2:] == ('messages', 'messages[0]["content"][0] is an image in a \'system\' '
                                                    'message; images go in user messages or tool results')


def test_a_text_model_refuses_image_parts_by_name(tmp_path):
    from agentrl.engines import hf
    from agentrl.gateway.protocol import parse_request
    model = hf.make_test_model(tmp_path / 'text', tokenizer_path('qwen3'))
    gw = Gateway(ForcingHF(model, device='cpu', max_new_tokens=4), tmp_path / 'run')
    _, s = gw.open_session({})
    body = {'messages': [{'role': 'user', 'content': [{'type': 'text', 'text': 'see'}, {
        'type': 'image_url', 'image_url': {'url': data_url(png(16, 16))}}]}]}
    req, _ = parse_request(json.dumps(body).encode(), 1 << 24)
    with pytest.raises(GatewayError) as e:
        gw.prepare(s, req, 'd', 0)
    assert (e.value.status, e.value.param, e.value.message) == (
        400, 'messages[0].content[1]', 'messages[0].content[1] is an image_url part and this model has no image '
        'processor; serve a vision-language model (its folder holds preprocessor_config.json), or send text')
