"""``agentrl rollout --screenshots``: BugFix ``read`` results as PNG pictures for a vision-language model.

The model is ``make_test_model(vision=True)`` with TRL's Qwen3-VL chat template (it renders tools and tool images):
a tiny random Qwen2.5-VL that cannot write a ``read`` call, so the first turn of every episode is teacher-forced
as one through the real sampler (``HFSampler.sample(..., teacher=)``, as tests/_gateway.ForcingHF does; the forced
ids are scored by the model) and the later turns are sampled. Built once for the module; one run of 6 episodes.
"""
import json
import shutil

import pytest

from _families import trl_template
from _tokenizers import tokenizer_path

torch = pytest.importorskip('torch')
pytest.importorskip('transformers')
pytest.importorskip('PIL')

from agentrl import gym, store  # noqa: E402
from agentrl.cli.main import main  # noqa: E402
from agentrl.images import image_digest, image_size, vision_grid  # noqa: E402
from agentrl.record import OWNER  # noqa: E402

PAD, VS, VE = 151655, 151652, 151653
READ = '<tool_call>\n{"name": "read", "arguments": {}}\n</tool_call><|im_end|>'
ARGS = ['--split', 'heldout', '--repeats', '1', '--max-turns', '2', '--max-new-tokens', '8', '--chunk-size', '3']


@pytest.fixture(scope='module')
def vlm_dir(tmp_path_factory):
    from agentrl.engines.hf import make_test_model
    return make_test_model(tmp_path_factory.mktemp('shots-vlm') / 'm', tokenizer_path('qwen3'), vision=True,
                           chat_template=trl_template('qwen3_vl'))


@pytest.fixture(scope='module')
def template(vlm_dir):
    from agentrl.jobs.bugfix import bugfix_template
    return bugfix_template(str(vlm_dir))


def _forcing_read(template):
    """An ``HFSampler.sample`` that teacher-forces a ``read`` call for every prompt without an image yet (each
    episode's first turn) and samples the others as usual."""
    from agentrl.engines.hf.sampler import HFSampler
    real = HFSampler.sample
    read = template.tokenizer(READ, add_special_tokens=False)['input_ids']

    def sample(self, prompts, generators=None, *, max_new_tokens=None, teacher=None, images=None, **kw):
        rows = range(len(prompts))
        forced = [b for b in rows if teacher is None and not (images and images[b])]
        if not forced:
            return real(self, prompts, generators, max_new_tokens=max_new_tokens, teacher=teacher, images=images, **kw)
        pick = lambda xs, bs: None if xs is None else [xs[b] for b in bs]  # noqa: E731
        free = [b for b in rows if b not in forced]
        out = dict(zip(forced, real(self, pick(prompts, forced), pick(generators, forced), max_new_tokens=len(read),
                                    teacher=[read] * len(forced))))
        if free:
            budget = pick(max_new_tokens, free) if isinstance(max_new_tokens, list) else max_new_tokens
            out.update(zip(free, real(self, pick(prompts, free), pick(generators, free), max_new_tokens=budget,
                                      images=pick(images, free), **kw)))
        return [out[b] for b in rows]
    return sample


def _rollout(template, argv):
    from agentrl.engines.hf.sampler import HFSampler
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(HFSampler, 'sample', _forcing_read(template))
        return main(['rollout', *argv])


@pytest.fixture(scope='module')
def run_dir(vlm_dir, template, tmp_path_factory):
    out = tmp_path_factory.mktemp('shots-run') / 'run'
    assert _rollout(template, ['--engine', 'hf', '--model', str(vlm_dir), '--screenshots', *ARGS,
                               '--out', str(out)]) == 0
    return out


def _expected_png(template, task_name: str) -> bytes:
    from agentrl.gym.screenshot import render_screenshot
    from agentrl.jobs.bugfix import screenshot_settings
    task = {t.name: t for t in gym.make_tasks('all')}[task_name]
    return render_screenshot(gym.compact_source(task.source), **screenshot_settings(template))


def test_screenshot_rollout_records_tool_images_stored_once(run_dir, template, vlm_dir):
    recs = store.read_trajectories(run_dir / 'trajectories')
    assert len(recs) == 6 and json.loads((run_dir / 'run.json').read_text())['plan']['screenshots'] is True
    heldout = [t.name for t in gym.make_tasks('heldout')]
    assert [r.info['task'] for r in recs] == heldout
    digests = []
    for r in recs:
        png = _expected_png(template, r.info['task'])
        [img] = r.info['images']
        w, h = image_size(png)
        assert w % 28 == 0 and h % 28 == 0 and w <= 448 and h <= 448
        assert img['digest'] == image_digest(png) and img['owner'] == 'tool'
        assert img['grid'] == vision_grid(w, h, template.vision) == [1, h // 14, w // 14]   # no resampling
        assert img['length'] == (h // 28) * (w // 28)
        ids, owner, turn = r.ids.tolist(), r.owner.tolist(), r.turn.tolist()
        s, n = img['start'], img['length']
        assert ids[s - 1:s + n + 1] == [VS] + [PAD] * n + [VE]
        assert owner[s:s + n] == [OWNER['tool']] * n and owner[s - 1] == owner[s + n] == OWNER['template']
        assert set(turn[s:s + n]) == {0} and not r.action_mask[s - 1:s + n + 1].any()
        assert ids.count(PAD) == n and len(ids) < 4096           # one picture, well inside the model's context
        assert r.info['actions'][0] == '<call> read </call>'
        assert (run_dir / 'images' / f'{img["digest"][7:]}.png').read_bytes() == png
        digests.append(img['digest'])
    assert len(set(digests)) == 6
    assert sorted(p.name for p in (run_dir / 'images').iterdir()) == sorted(f'{d[7:]}.png' for d in digests)


def test_the_run_replays_with_its_pixels_and_exports_to_verl_and_trl(run_dir, vlm_dir, tmp_path, capsys):
    assert main(['check', str(run_dir / 'trajectories'), '--model', str(vlm_dir), '--max-ratio-dev', '1e-5']) == 0
    out = capsys.readouterr().out
    assert 'result: OK' in out and 'records: match 6' in out
    assert main(['export', str(run_dir / 'trajectories'), '--to', 'verl', '--out', str(tmp_path / 'verl')]) == 0
    batch = torch.load(tmp_path / 'verl' / 'verl_batch.pt', weights_only=False)
    assert [len(m['images']) for m in batch['non_tensor_batch']['multi_modal_data']] == [1] * 6
    assert main(['export', str(run_dir / 'trajectories'), '--to', 'trl', '--out', str(tmp_path / 'trl')]) == 0
    r = json.loads((tmp_path / 'trl' / 'trl_rollout.json').read_text())
    for paths, rec in zip(r['images'], store.read_trajectories(run_dir / 'trajectories')):
        assert paths == [f'images/{rec.info["images"][0]["digest"][7:]}.png']
        assert image_digest((tmp_path / 'trl' / paths[0]).read_bytes()) == rec.info['images'][0]['digest']


def test_resume_keeps_screenshots_and_gives_the_same_records(run_dir, vlm_dir, template, tmp_path):
    """Second chunk and summary removed: ``--resume`` (no ``--screenshots`` flag) runs it again from the plan."""
    again = tmp_path / 'again'
    shutil.copytree(run_dir, again)
    (again / 'summary.json').unlink()
    (again / 'trajectories' / 'part-000001.parquet').unlink()
    for f in (again / 'images').iterdir():
        f.unlink()
    assert _rollout(template, ['--resume', str(again), '--model', str(vlm_dir)]) == 0
    want, got = (store.read_trajectories(d / 'trajectories') for d in (run_dir, again))
    assert [r.ids.tolist() for r in got] == [r.ids.tolist() for r in want]
    assert [r.sample_logp.tolist() for r in got] == [r.sample_logp.tolist() for r in want]
    assert [r.info['images'] for r in got] == [r.info['images'] for r in want]
    assert sorted(p.name for p in (again / 'images').iterdir()) == sorted(
        f'{r.info["images"][0]["digest"][7:]}.png' for r in want[3:])


def test_the_same_text_gives_the_same_picture_sized_for_the_processor(template):
    from agentrl.gym.screenshot import render_screenshot, screenshot_size
    from agentrl.jobs.bugfix import screenshot_settings
    clamp = _expected_png(template, 'clamp')
    assert clamp == _expected_png(template, 'clamp') and image_size(clamp) == (280, 56)
    assert image_digest(clamp) != image_digest(_expected_png(template, 'sum_to'))
    s = screenshot_settings(template)
    assert s == {'max_pixels': 28 * 28 * 64, 'min_pixels': 56 * 56, 'factor': 28}
    long = '\n'.join(f'line {k} ' + 'x' * 120 for k in range(60))
    w, h, lines = screenshot_size(long, **s)
    assert (w, h) == (448, 112) and w * h <= s['max_pixels'] and len(lines) == 8 and lines[1] == 'x' * 54
    assert screenshot_size('a', max_pixels=12845056, min_pixels=3136) == (56, 56, ['a'])
    assert image_size(render_screenshot(long, max_pixels=12845056, min_pixels=3136)) == (448, 448)


@pytest.mark.parametrize('argv, message', [
    (['--screenshots'], 'agentrl: error: --screenshots shows read results as images to a vision-language model of '
                        '--engine hf or vllm; add --engine hf --model DIR (a folder with preprocessor_config.json) '
                        'or drop --screenshots'),
    (['--engine', 'hf', '--model', '{text}', '--screenshots'],
     "agentrl: error: --screenshots needs a vision-language --model (got '{text}', which has no "
     'preprocessor_config.json); pass a folder with its image processor (`agentrl make-test-model --vision OUT` '
     'builds one) or drop --screenshots'),
    (['--engine', 'hf', '--model', '{vlm}', '--screenshots', '--workers', '2'],
     'agentrl: error: --screenshots stores the images from this process (Ray actors do not send them back); drop '
     '--workers'),
])
def test_screenshots_refused_before_anything_is_written(argv, message, vlm_dir, tmp_path, capsys):
    text = tmp_path / 'text-model'
    text.mkdir()
    shutil.copy(vlm_dir / 'config.json', text / 'config.json')     # a model folder without an image processor
    fill = lambda a: a.format(text=text, vlm=vlm_dir)  # noqa: E731
    out = tmp_path / 'out'
    assert main(['rollout', *map(fill, argv), '--out', str(out)]) == 2
    assert capsys.readouterr().err.strip() == fill(message)
    assert not out.exists()


def test_a_batch_that_does_not_feed_images_refuses_them_in_one_line(template):
    """The vLLM batch feeds images (``handles_images``: ``--engine vllm --screenshots`` runs, tests/live_vllm); a
    batch that does not is refused at the first turn that brings one with :func:`check_request`'s line."""
    import base64

    from agentrl.engines.contract import RequestRefused, TurnRequest, check_request
    from agentrl.engines.vllm.episodes import VLLMBatch
    from agentrl.record import SamplingSpec
    from agentrl.templates import ChatRecorder
    assert VLLMBatch.handles_images is True
    url = 'data:image/png;base64,' + base64.b64encode(_expected_png(template, 'clamp')).decode()
    rec = ChatRecorder(template, [{'role': 'user', 'content': [{'type': 'image_url', 'image_url': {'url': url}}]}])
    req = TurnRequest(rec.prompt_ids, SamplingSpec(), 8, 1, template.stop_ids, images=rec.images)
    with pytest.raises(RequestRefused) as e:
        check_request(req, 'run_vllm_episodes', images=False)
    assert str(e.value).startswith('run_vllm_episodes: the request brings 1 images and this engine does not feed '
                                   'images to its model; ')


def test_screenshots_without_an_image_processor_or_vision_settings_are_refused(template):
    from agentrl.jobs.bugfix import BugFixAdapter, BugFixOptions, bugfix_rollouts
    from agentrl.templates import ChatTemplate
    tasks = gym.make_tasks('heldout')[:1]
    with pytest.raises(ValueError) as e:
        bugfix_rollouts(None, None, tasks, BugFixOptions(screenshots=True), template=template)
    assert str(e.value) == ('bugfix_rollouts: options.screenshots sends images, which the sampler feeds only with the '
                            "model's image processor; pass image_processor=load_image_processor(model_dir)")
    text_only = ChatTemplate(template.tokenizer, tools=gym.TOOL_SCHEMAS, vision=False)
    with pytest.raises(ValueError) as e:
        BugFixAdapter(tasks, template=text_only, screenshots=True)
    assert str(e.value) == ('screenshots: the chat template has no image processor settings (no '
                            'preprocessor_config.json beside the tokenizer); pass a vision-language model folder')
