"""Images through the model half: the vision test model, the template layer's expansion, sampling and replay.

The test model is ``make_test_model(vision=True)``: a tiny random Qwen2.5-VL with the real Qwen3 tokenizer,
Qwen2-VL's PIL image processor and TRL's Qwen2.5-VL chat template. Images are PNGs made here with Pillow.
"""
import base64
import io
import json

import pytest

from _tokenizers import tokenizer_path

torch = pytest.importorskip('torch')
pytest.importorskip('transformers')
PIL = pytest.importorskip('PIL')
np = pytest.importorskip('numpy')

from agentrl.images import ImageRef, decode_image_url, image_digest, vision_grid  # noqa: E402
from agentrl.record import OWNER, Provenance, SamplingSpec  # noqa: E402

PROC = {'patch_size': 14, 'merge_size': 2, 'temporal_patch_size': 2, 'min_pixels': 56 * 56, 'max_pixels': 28 * 28 * 64}


def png(w: int, h: int, seed: int = 0) -> bytes:
    from PIL import Image
    a = (np.random.RandomState(seed).rand(h, w, 3) * 255).astype('uint8')
    buf = io.BytesIO()
    Image.fromarray(a).save(buf, format='PNG')
    return buf.getvalue()


def url(data: bytes) -> str:
    return 'data:image/png;base64,' + base64.b64encode(data).decode()


def image_part(data: bytes) -> dict:
    return {'type': 'image_url', 'image_url': {'url': url(data)}}


@pytest.fixture(scope='module')
def vlm_dir(tmp_path_factory):
    """``agentrl make-test-model --vision OUT`` (make_test_model(..., vision=True) underneath)."""
    from agentrl.cli.main import main
    out = tmp_path_factory.mktemp('vlm') / 'm'
    assert main(['make-test-model', '--vision', '--tokenizer', str(tokenizer_path('qwen3')), str(out)]) == 0
    return out


@pytest.fixture(scope='module')
def template(vlm_dir):
    from agentrl.templates import ChatTemplate, load_tokenizer
    return ChatTemplate(load_tokenizer(str(vlm_dir)))


@pytest.fixture(scope='module')
def lm(vlm_dir):
    from agentrl.engines.hf.models import load_model
    from agentrl.engines.hf.vlm import load_image_processor
    model, tok = load_model(vlm_dir)
    return model, tok, load_image_processor(vlm_dir)


def test_vision_grid_is_the_processors_grid():
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil
    from PIL import Image
    proc = Qwen2VLImageProcessorPil(**PROC)
    sizes = [(90, 50), (200, 120), (20, 20), (400, 300), (13, 700), (57, 29), (300, 7), (640, 480)]
    want = [proc(images=[Image.new('RGB', (w, h))], return_tensors='pt')['image_grid_thw'][0].tolist()
            for w, h in sizes]
    assert [vision_grid(w, h, PROC) for w, h in sizes] == want
    assert want[:3] == [[1, 4, 6], [1, 8, 14], [1, 4, 4]]


def test_data_urls_are_decoded_and_other_urls_refused_by_name():
    data = png(8, 8)
    assert decode_image_url(url(data)) == (data, 'png')
    assert image_digest(data).startswith('sha256:') and len(image_digest(data)) == 71
    with pytest.raises(ValueError, match=r'image_url\["url"\] is an http\(s\) URL: agentrl does not fetch images'):
        decode_image_url('https://example.com/cat.png')
    with pytest.raises(ValueError, match="has MIME type 'image/gif'"):
        decode_image_url('data:image/gif;base64,R0lGOD')
    with pytest.raises(ValueError, match='bad base64'):
        decode_image_url('data:image/png;base64,@@@')


def test_make_test_model_vision_saves_a_loadable_qwen25_vl(vlm_dir, lm):
    import transformers
    model, tok, proc = lm
    cfg = json.loads((vlm_dir / 'config.json').read_text())
    assert cfg['architectures'] == ['Qwen2_5_VLForConditionalGeneration']
    assert [cfg[k] for k in ('image_token_id', 'vision_start_token_id', 'vision_end_token_id')] == \
        tok.convert_tokens_to_ids(['<|image_pad|>', '<|vision_start|>', '<|vision_end|>']) == [151655, 151652, 151653]
    assert type(model).__name__ == 'Qwen2_5_VLForConditionalGeneration'
    assert type(proc).__name__ in ('Qwen2VLImageProcessorPil', 'Qwen2VLImageProcessor')
    assert (proc.patch_size, proc.merge_size) == (14, 2)
    assert tok.chat_template == (vlm_dir / 'chat_template.jinja').read_text()
    assert '<|vision_start|><|image_pad|><|vision_end|>' in tok.chat_template
    again = transformers.Qwen2_5_VLForConditionalGeneration.from_pretrained(str(vlm_dir), local_files_only=True)
    assert torch.equal(again.lm_head.weight, model.lm_head.weight)
    note = json.loads((vlm_dir / 'agentrl_test_model.json').read_text())
    assert note['vision']['processor'] == PROC and note['vision']['chat_template'] == 'qwen2_5_vl'
    assert note['parameters'] == sum(p.numel() for p in model.parameters()) == 9_864_736


def test_label_owners_expands_an_image_and_gives_its_placeholders_to_the_user(template):
    from agentrl.templates.labels import label_owners
    data = png(90, 50)
    msgs = [{'role': 'user', 'content': [{'type': 'text', 'text': 'What is this? '}, image_part(data)]},
            {'role': 'assistant', 'content': 'A cat.'}]
    lab = label_owners(template, msgs)
    toks = template.tokens(lab.ids)
    assert toks[19:27] == ['<|vision_start|>'] + ['<|image_pad|>'] * 6 + ['<|vision_end|>']
    assert lab.owner_names()[14:27] == ['prompt'] * 5 + ['template'] + ['prompt'] * 6 + ['template']
    assert [im.to_dict() for im in lab.images] == [{
        'digest': image_digest(data), 'start': 20, 'length': 6, 'grid': [1, 4, 6], 'owner': 'prompt',
        'processor': {'class': 'Qwen2VLImageProcessor', **PROC, 'image_mean': [0.48145466, 0.4578275, 0.40821073],
                      'image_std': [0.26862954, 0.26130258, 0.27577711]}}]
    assert lab.image_data == {image_digest(data): data}
    from agentrl.engines.hf.vlm import load_image_processor, processor_settings
    assert processor_settings(load_image_processor(template.tokenizer.name_or_path)) == lab.images[0].processor
    assert ImageRef.from_dict(lab.images[0].to_dict()) == lab.images[0]


def test_images_refused_where_they_cannot_be_recorded(template, vlm_dir):
    from agentrl.templates import ChatTemplate, load_tokenizer
    from agentrl.templates.labels import label_owners
    http = [{'role': 'user', 'content': [{'type': 'image_url', 'image_url': {'url': 'http://x/cat.png'}}]}]
    with pytest.raises(ValueError, match=r'messages\[0\]\["content"\]\[0\]\["image_url"\]\["url"\] is an http\(s\) URL'):
        label_owners(template, http)
    forged = [{'role': 'user', 'content': 'see <|image_pad|>'}]
    with pytest.raises(ValueError, match=r"holds the image control text '<\|image_pad\|>': send an image as an "
                                         'image_url part'):
        label_owners(template, forged)
    system = [{'role': 'system', 'content': [image_part(png(8, 8))]}, {'role': 'user', 'content': 'Hi'}]
    with pytest.raises(ValueError, match="is an image in a 'system' message; images go in user messages or tool"):
        label_owners(template, system)
    text_only = ChatTemplate(load_tokenizer(str(vlm_dir)), vision=None)     # no processor: images refused as before
    with pytest.raises(ValueError, match=r"is a 'image_url' part: agentrl records text only"):
        label_owners(text_only, [{'role': 'user', 'content': [image_part(png(8, 8))]}])
    assert label_owners(text_only, forged).owner_names().count('prompt') > 3    # plain text there, as before


def _tool_image_episode(template, sampler=None, seed=0):
    """A scripted agent: the user shows a picture, the policy answers, the tool returns a screenshot, the policy
    answers again. With ``sampler`` the turns are sampled; else they are fixed ids."""
    from agentrl.templates.recorder import ChatRecorder
    first, shot = png(90, 50), png(200, 120, seed=1)
    opening = [{'role': 'user', 'content': [{'type': 'text', 'text': 'What is this? '}, image_part(first)]}]
    rec = ChatRecorder(template, opening)
    fixed = template.encode('Let me look.<|im_end|>')
    gen = torch.Generator().manual_seed(seed)
    for k in range(2):
        if sampler is None:
            ids, logp = fixed, [-1.0] * len(fixed)
        else:
            t = sampler.sample([rec.prompt_ids], [gen], images=[rec.images])[0]
            ids, logp = t.ids, t.logp
        rec.add_turn(ids, logp)
        if k == 0:
            rec.add_messages([{'role': 'tool', 'content': [image_part(shot), {'type': 'text', 'text': 'screenshot'}]}])
    spec = sampler.spec if sampler is not None else None
    return rec, rec.finish(1.0, provenance=Provenance(policy='hf', sampling=spec, seed=seed)), (first, shot)


def test_recorder_expands_a_tool_image_mid_episode_as_the_full_render_does(template):
    from agentrl.templates.labels import label_owners
    rec, tr, (first, shot) = _tool_image_episode(template)
    imgs = tr.info['images']
    assert [(d['digest'], d['start'], d['length'], d['grid'], d['owner']) for d in imgs] == [
        (image_digest(first), 20, 6, [1, 4, 6], 'prompt'), (image_digest(shot), 42, 28, [1, 8, 14], 'tool')]
    ids, owner = tr.ids.tolist(), tr.owner.tolist()
    for d in imgs:
        s, n = d['start'], d['length']
        assert ids[s - 1:s + n + 1] == [151652] + [151655] * n + [151653]
        assert owner[s - 1:s + n + 1] == [OWNER['template']] + [OWNER[d['owner']]] * n + [OWNER['template']]
        assert not tr.action_mask[s - 1:s + n].any()
    assert tr.info['template']['render_matches'] is True and tr.info['template']['prefix_stable'] is True
    opening = [{'role': 'user', 'content': [{'type': 'text', 'text': 'What is this? '}, image_part(first)]}]
    full = label_owners(template, opening + [
        {'role': 'assistant', 'content': 'Let me look.'},
        {'role': 'tool', 'content': [image_part(shot), {'type': 'text', 'text': 'screenshot'}]},
        {'role': 'assistant', 'content': 'Let me look.'}])
    assert full.ids[:len(ids)] == ids
    assert rec.image_data == {image_digest(first): first, image_digest(shot): shot}


def test_a_record_without_images_has_no_images_key(template):
    from agentrl.templates.recorder import ChatRecorder
    rec = ChatRecorder(template, [{'role': 'user', 'content': 'Hi'}])
    rec.add_turn(template.encode('Yo<|im_end|>'))
    assert 'images' not in rec.finish().info


def test_a_placeholder_count_the_processor_disagrees_with_is_an_error_naming_both(lm, template):
    from types import SimpleNamespace
    from agentrl.engines.hf.vlm import pixel_inputs
    from agentrl.templates.vision import PendingImage, image_spans, vision_facts
    _, _, proc = lm
    data = png(90, 50)
    with pytest.raises(ValueError, match=rf'image 0 \({image_digest(data)}\): the record holds 7 placeholder ids, '
                                         r'the processor computes 6 \(grid \[1, 4, 6\], merge 2\)'):
        pixel_inputs(proc, [SimpleNamespace(digest=image_digest(data), data=data, length=7)])
    facts = vision_facts(template)
    ids = [1, 151652] + [151655] * 5 + [151653]
    owner = [0, 0] + [OWNER['prompt']] * 5 + [0]
    with pytest.raises(ValueError, match=r'the rendering holds 5 placeholder ids .* the processor computes 6'):
        image_spans(ids, owner, [PendingImage(image_digest(data), data, 'png', [1, 4, 6], 6, 'prompt', 0)], facts)


def test_sampled_vision_record_replays_to_ratio_one(lm, template, vlm_dir):
    from agentrl.checks.replay import replay_records
    from agentrl.engines.hf.sampler import HFSampler
    from agentrl.engines.hf.vlm import pixel_inputs, vision_logits
    from agentrl.engines.scorer import hf_scorer
    from types import SimpleNamespace
    model, tok, proc = lm
    sampler = HFSampler(model, template.stop_ids, SamplingSpec(temperature=1.0), max_new_tokens=24,
                        image_processor=proc)
    rec, tr, (first, shot) = _tool_image_episode(template, sampler, seed=3)
    assert [d['owner'] for d in tr.info['images']] == ['prompt', 'tool']
    rows = tr.action_mask.nonzero().flatten()
    assert len(rows) >= 4
    imgs = [SimpleNamespace(digest=d['digest'], data=rec.image_data[d['digest']], length=d['length'])
            for d in tr.info['images']]
    logits = vision_logits(model, tr.ids, pixel_inputs(proc, imgs), rows)
    logp = torch.log_softmax(logits.double(), -1).gather(1, tr.ids[rows + 1][:, None]).squeeze(1)
    assert (logp - tr.sample_logp[rows].double()).abs().max().item() < 1e-5
    blind = vision_logits(model, tr.ids, pixel_inputs(proc, imgs[:1] + [SimpleNamespace(
        digest=image_digest(png(200, 120, seed=9)), data=png(200, 120, seed=9), length=28)]), rows)
    assert (torch.log_softmax(blind.double(), -1) - torch.log_softmax(logits.double(), -1)).abs().max() > 1e-4
    scorer = hf_scorer(model, image_processor=proc)
    scorer.image_data.update(rec.image_data)
    report = replay_records([tr], scorer)
    assert report.ok and report.records[0].log_ratio.abs().max().item() < 1e-5
    with pytest.raises(Exception, match=r"holds images and the scorer takes none"):
        replay_records([tr], hf_scorer(model))
    tr.info['images'][1]['processor']['max_pixels'] = 28 * 28 * 1280
    with pytest.raises(Exception, match=r"image 1 \(sha256:[0-9a-f]{64}\) was sized with processor settings "
                                        r"\{'max_pixels': 1003520\}, the model's processor has \{'max_pixels': 50176\}"):
        replay_records([tr], scorer)


def test_the_check_jobs_scorer_reads_a_runs_images_folder(lm, template, vlm_dir, tmp_path):
    """What ``agentrl check RUN --model M`` replays with: the model folder's scorer, its images from RUN/images."""
    from agentrl import store
    from agentrl.checks.replay import replay_records
    from agentrl.engines.hf.sampler import HFSampler
    from agentrl.images import ImageFolder, images_folder
    from agentrl.jobs.check import load_model as load_check_model
    model, tok, proc = lm
    sampler = HFSampler(model, template.stop_ids, SamplingSpec(temperature=1.0), max_new_tokens=24,
                        image_processor=proc)
    rec, tr, _ = _tool_image_episode(template, sampler, seed=5)
    run = tmp_path / 'run'
    store.write_trajectories(run / 'trajectories.parquet', [tr], images=rec.image_data)     # RUN/images first
    assert images_folder(run / 'trajectories.parquet') == run / 'images'
    back = store.read_trajectories(run / 'trajectories.parquet')[0]
    assert back.info['images'] == tr.info['images']
    scorer = load_check_model(str(vlm_dir))
    scorer.image_data = ImageFolder(run)
    report = replay_records([back], scorer)
    assert report.ok and report.records[0].log_ratio.abs().max().item() < 1e-5
    gone = tr.info['images'][1]['digest']
    (run / 'images' / f"{gone.removeprefix('sha256:')}.png").unlink()
    with pytest.raises(Exception, match=rf"the bytes of image {gone} are not in the scorer's image_data "
                                        rf"\(.*image '{gone}' is not in .*images"):
        replay_records([back], scorer)


def test_run_chat_episodes_samples_vision_episodes_with_their_images(lm, template):
    from agentrl.checks.replay import replay_records
    from agentrl.engines.episode import Reply
    from agentrl.engines.hf import run_chat_episodes
    from agentrl.engines.hf.sampler import HFSampler
    from agentrl.engines.scorer import hf_scorer
    from agentrl.templates.recorder import ChatRecorder
    model, tok, proc = lm
    sampler = HFSampler(model, template.stop_ids, SamplingSpec(temperature=1.0), max_new_tokens=16,
                        image_processor=proc)
    shots = [png(60 + 30 * i, 40, seed=10 + i) for i in range(2)]

    def respond(i, turn, text):
        if len(turn_log[i]) == 0:
            turn_log[i].append(text)
            return Reply(messages=[{'role': 'tool', 'content': [image_part(shots[i]), {'type': 'text', 'text': 'ok'}]}])
        return Reply(done=True, reward=1.0, info={})

    turn_log = [[], []]
    recs = [ChatRecorder(template, [{'role': 'user', 'content': [image_part(png(90, 50, seed=i)),
                                                                 {'type': 'text', 'text': 'Go.'}]}]) for i in range(2)]
    out = run_chat_episodes(sampler, recs, respond, seeds=[7, 8], max_turns=2)
    assert [[d['owner'] for d in t.info['images']] for t in out] == [['prompt', 'tool'], ['prompt', 'tool']]
    assert [t.info['images'][1]['digest'] for t in out] == [image_digest(s) for s in shots]
    scorer = hf_scorer(model, image_processor=proc)
    for r in recs:
        scorer.image_data.update(r.image_data)
    report = replay_records(out, scorer)
    assert report.ok and max(r.log_ratio.abs().max().item() for r in report.records) < 1e-5


def test_engines_refuse_images_they_cannot_feed_and_the_hf_engine_samples_them(lm, template, vlm_dir):
    from agentrl.engines.contract import RequestRefused, TurnRequest, check_request
    from agentrl.engines.hf.engine import HFEngine
    from agentrl.engines.hf.sampler import HFSampler
    from agentrl.engines.hf import run_chat_episodes
    from agentrl.engines.episode import Reply
    from agentrl.templates.recorder import ChatRecorder
    rec = ChatRecorder(template, [{'role': 'user', 'content': [image_part(png(90, 50))]}])
    spec = SamplingSpec(temperature=1.0)
    req = TurnRequest(rec.prompt_ids, spec, 8, 3, template.stop_ids, images=rec.images)
    with pytest.raises(RequestRefused, match=r"HFProcessEngine.sample: the request brings 1 images and this engine "
                                             'does not feed images'):
        check_request(req, 'HFProcessEngine.sample')
    model, tok, proc = lm
    text_sampler = HFSampler(model, template.stop_ids, spec, max_new_tokens=8)
    with pytest.raises(ValueError, match='episode 0 brings images but the sampler has no image_processor'):
        run_chat_episodes(text_sampler, [rec], lambda i, t, x: Reply(done=True), seeds=[1])
    engine = HFEngine(vlm_dir, device='cpu', max_new_tokens=8)
    got = engine.sample(req)
    want = HFSampler(model, template.stop_ids, spec, max_new_tokens=8, image_processor=proc).sample(
        [rec.prompt_ids], [torch.Generator().manual_seed(3)], images=[rec.images])[0]
    assert got.ids == want.ids and max(abs(a - b) for a, b in zip(got.logp, want.logp)) < 1e-6


def test_vision_settings_read_a_qwen2_vl_processor_and_leave_others_text_only(vlm_dir, tmp_path):
    from agentrl.templates.vision import vision_settings
    got = vision_settings(vlm_dir)
    assert {k: got[k] for k in PROC} == PROC and got['image_token_id'] == 151655
    assert got['class'] == 'Qwen2VLImageProcessor'
    (tmp_path / 'preprocessor_config.json').write_text(json.dumps({
        'image_processor_type': 'SiglipImageProcessor', 'size': {'height': 224, 'width': 224}}))
    assert vision_settings(tmp_path) is None and vision_settings(tmp_path / 'nothing') is None
    assert vision_settings(None) is None and vision_settings(False) is None
    with pytest.raises(ValueError, match="vision=: image processor setting 'merge_size' is None; it must be a "
                                         'positive int'):
        vision_settings({'patch_size': 14, 'min_pixels': 1, 'max_pixels': 2})
    (tmp_path / 'preprocessor_config.json').write_text('{not json')
    with pytest.raises(ValueError, match=r'preprocessor_config.json is not a JSON file'):
        vision_settings(tmp_path)


def test_cli_check_passes_a_sampled_vision_record_and_refuses_a_stray_placeholder(lm, template, vlm_dir, tmp_path,
                                                                                 capsys):
    """``agentrl check RUN --model M`` on a record the HF engine sampled with a prompt image and a tool image: the
    placeholder runs listed in ``info['images']`` are not control ids in content; one outside every run is."""
    from agentrl import store
    from agentrl.cli.main import main
    from agentrl.engines.hf.sampler import HFSampler
    model, tok, proc = lm
    sampler = HFSampler(model, template.stop_ids, SamplingSpec(temperature=1.0), max_new_tokens=24,
                        image_processor=proc)
    rec, tr, _ = _tool_image_episode(template, sampler, seed=5)
    store.write_trajectories(tmp_path / 'run' / 'trajectories.parquet', [tr], images=rec.image_data)
    assert main(['check', str(tmp_path / 'run'), '--model', str(vlm_dir)]) == 0
    out = capsys.readouterr().out
    assert 'ControlTokenInContent' not in out
    tr.ids[16] = 151655                              # a prompt token turned into the placeholder, outside every run
    assert tr.owner[16].item() == OWNER['prompt']
    store.write_trajectories(tmp_path / 'bad' / 'trajectories.parquet', [tr], images=rec.image_data)
    assert main(['check', str(tmp_path / 'bad'), '--model', str(vlm_dir)]) == 1
    out = capsys.readouterr().out
    runs = ', '.join(f"[{d['start']}:{d['start'] + d['length']}]" for d in tr.info['images'])
    assert runs.startswith('[20:26], [') and runs.endswith(':90]')
    assert f"ImageRunError: ids[16]: is the image placeholder 151655 but lies in no image's run (runs {runs})" in out
    assert 'ControlTokenInContentError: ids[16]: is the control id 151655, owned by prompt content: message text ' \
        'became a control token (a forged turn boundary or role header). Fix:' in out     # that one only, no "more"
