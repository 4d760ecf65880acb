"""Images in the record: stored once per run by digest, loaded back verified, and gated by ``agentrl check``.

Records are built here with Qwen's vision ids (``<|vision_start|>`` 151652, ``<|image_pad|>`` 151655,
``<|vision_end|>`` 151653 in /work/shared/tokenizers/qwen3); images are PNGs made in tests/_images.py.
"""
from __future__ import annotations

import json
import os

import pytest

from agentrl import images, store
from agentrl.checks.images import image_problems
from agentrl.jobs.check import CheckOptions, run_check
from agentrl.record import OWNER, Provenance, SamplingSpec, Trajectory
from _images import png

PAD, VS, VE = 151655, 151652, 151653
PROC = {'class': 'Qwen2VLImageProcessor', 'patch_size': 14, 'merge_size': 2, 'temporal_patch_size': 2,
        'min_pixels': 3136, 'max_pixels': 12845056, 'image_mean': [0.48145466, 0.4578275, 0.40821073],
        'image_std': [0.26862954, 0.26130258, 0.27577711]}


def test_qwen_placeholder_id_is_image_pad():
    vocab = json.load(open('/work/shared/tokenizers/qwen3/tokenizer.json'))['added_tokens']
    assert {t['content']: t['id'] for t in vocab}['<|image_pad|>'] == PAD == images.IMAGE_TOKEN_IDS[PROC['class']]


def image_record(data: bytes, *, rid='r0', grid=(1, 4, 6), n_pads=None, length=None, owner='prompt', start=None,
                 pad_owner=None, extra_info=None):
    """``[text 5, 9] [vision_start] [PAD x n_pads] [vision_end] [text 11] [policy 40, 41, 42]``; info['images'] lists
    the image with ``length`` (default: the grid's) at ``start`` (default 3)."""
    need = grid[0] * grid[1] * grid[2] // 4
    n_pads = need if n_pads is None else n_pads
    ids = [5, 9, VS] + [PAD] * n_pads + [VE, 11, 40, 41, 42]
    own = ['template', 'prompt', 'template'] + [pad_owner or owner] * n_pads + ['template', 'prompt'] + ['policy'] * 3
    ref = {'digest': images.image_digest(data), 'start': 3 if start is None else start,
           'length': need if length is None else length, 'grid': list(grid), 'owner': owner, 'processor': dict(PROC)}
    prov = Provenance(policy='hf', tokenizer='qwen3', template='tpl', sampling=SamplingSpec(), group_id='g',
                      rollout_id=rid)
    return Trajectory.from_tokens(ids, own, [-1] * len(ids), [0.0] * (len(ids) - 3) + [-0.5, -0.25, -0.125], 1.0,
                                  {'stop': 'submitted', 'images': [ref], **(extra_info or {})}, provenance=prov)


@pytest.fixture()
def img():
    return png(64, 48, seed=1)


def written_run(tmp_path, recs, imgs):
    run = tmp_path / 'run'
    with store.ShardWriter(run / 'trajectories') as w:
        w.write(recs, images=imgs)
    return run


def check(run, **kw):
    rep = run_check(CheckOptions(path=str(run / 'trajectories'), examples=20, **kw))
    return rep


# ----------------------------------------------------------------------------- storage

def test_store_image_once_by_digest(tmp_path, img):
    d, written = images.store_image(tmp_path, img)
    f = tmp_path / 'images' / f'{d[7:]}.png'
    assert d == 'sha256:' + __import__('hashlib').sha256(img).hexdigest() and written and f.read_bytes() == img
    before = os.stat(f)
    assert images.store_image(tmp_path, img) == (d, False)            # the second store writes nothing
    after = os.stat(f)
    assert (before.st_ino, before.st_mtime_ns) == (after.st_ino, after.st_mtime_ns)
    assert sorted(os.listdir(tmp_path / 'images')) == [f.name]        # no temporary file left
    assert images.load_image(tmp_path, d) == img


def test_store_refuses_wrong_key_and_unknown_format(tmp_path, img):
    other = images.image_digest(b'x')
    with pytest.raises(ValueError, match=rf"images\['{other}'\]: the bytes given hash to '{images.image_digest(img)}'"):
        images.store_images(tmp_path, {other: img})
    with pytest.raises(ValueError, match=r"image bytes start with b'GIF89a\\x00\\x00', neither PNG nor JPEG"):
        images.store_image(tmp_path, b'GIF89a\0\0')
    jpeg = b'\xff\xd8\xff\xe0jpeg'
    assert images.store_image(tmp_path, jpeg)[1] and (tmp_path / 'images' / f'{images.image_digest(jpeg)[7:]}.jpg').is_file()


def test_shard_writer_stores_images_before_the_shard_and_reads_them_back(tmp_path, img):
    img2 = png(32, 32, seed=2)
    a, b = image_record(img, rid='r0'), image_record(img2, rid='r1')
    run = tmp_path / 'run'
    w = store.ShardWriter(run / 'trajectories')
    w.write([a, b], images={images.image_digest(img): img, images.image_digest(img2): img2})
    assert sorted(os.listdir(run / 'images')) == sorted(f'{images.image_digest(x)[7:]}.png' for x in (img, img2))
    assert w.write([image_record(img, rid='r2')], images={images.image_digest(img): img}) is not None
    assert len(os.listdir(run / 'images')) == 2                      # each image once
    recs = store.read_trajectories(run / 'trajectories')
    assert [images.record_images(r, run / 'trajectories') for r in recs] == [[img], [img2], [img]]
    assert recs[0].info['images'] == a.info['images']
    # a record naming an image neither given nor stored: refused before its shard is written
    img3 = png(8, 8, seed=3)
    with pytest.raises(ValueError, match=rf"record 0 info.images\[0\].digest '{images.image_digest(img3)}' is neither "
                                         r'in images= nor stored in'):
        w.write([image_record(img3, rid='r3')])
    assert len(store.data_files(run / 'trajectories')) == 2


def test_records_without_images_are_unchanged(tmp_path):
    rec = Trajectory.from_tokens([5, 9, 40], ['template', 'prompt', 'policy'], [-1, -1, 0], [0.0, 0.0, -0.5], 1.0,
                                 {'stop': 'submitted'}, provenance=Provenance(policy='hf', sampling=SamplingSpec()))
    a, b = tmp_path / 'a.parquet', tmp_path / 'b' / 'a.parquet'
    store.write_trajectories(a, [rec], fsync=False)
    store.write_trajectories(b, [rec], fsync=False, images={})
    import pyarrow.parquet as pq
    assert pq.read_table(a).equals(pq.read_table(b)) and not (tmp_path / 'images').exists()
    assert 'images' not in json.loads(pq.read_table(a).column('info')[0].as_py())
    assert image_problems(rec, tmp_path) == []


def test_load_image_refuses_changed_or_missing_bytes(tmp_path, img):
    d, _ = images.store_image(tmp_path, img)
    f = tmp_path / 'images' / f'{d[7:]}.png'
    changed = img[:-1] + b'\0'
    f.write_bytes(changed)
    with pytest.raises(ValueError, match=rf"its bytes hash to '{images.image_digest(changed)}', not '{d}'"):
        images.load_image(tmp_path, d)
    f.unlink()
    with pytest.raises(FileNotFoundError, match=rf"image '{d}' is not in"):
        images.load_image(tmp_path, d)


# ----------------------------------------------------------------------------- the gate

def test_check_accepts_a_good_record(tmp_path, img):
    run = written_run(tmp_path, [image_record(img)], {images.image_digest(img): img})
    rep = check(run)
    assert (rep.n, rep.refused, rep.examples) == (1, 0, [])


def test_check_refuses_one_placeholder_too_few(tmp_path, img):
    d = images.image_digest(img)
    # the template rendered 5 placeholders but the grid [1, 4, 6] needs 6; info says 6: the run covers vision_end
    run = written_run(tmp_path, [image_record(img, n_pads=5)], {d: img})
    assert check(run).examples == [
        f'g/r0#1: ImageRunError: ids[8]: is {VE}, not the image placeholder {PAD}, inside the run of image 0 '
        f'({d[:19]}) (ids[3:9], 6 ids). Fix: the run must hold exactly the placeholder ids the template rendered '
        'for the image']
    # ... and the length recorded as rendered (5): it disagrees with the grid
    run = written_run(tmp_path / 'b', [image_record(img, n_pads=5, length=5)], {d: img})
    assert check(run).examples == [
        f'g/r0#1: ImageRunError: info.images[0].length: of image 0 ({d[:19]}) is 5 but its grid [1, 4, 6] with '
        'merge_size 2 needs 1*4*6 // 2**2 = 6 placeholder ids. Fix: render one placeholder id per merged patch '
        '(t*h*w // merge_size**2)']


def test_check_refuses_grid_not_multiple_and_run_past_ids(tmp_path, img):
    d = images.image_digest(img)
    rec = image_record(img)
    rec.info['images'][0]['grid'] = [1, 3, 3]
    rec.info['images'][0]['start'] = 20
    assert [str(p) for p in image_problems(rec, None)] == [
        f'info.images[0].grid: of image 0 ({d[:19]}) is [1, 3, 3]: 1*3*3 = 9 patches is not a multiple of '
        'merge_size**2 = 4. Fix: record the grid the processor returned',
        f'info.images[0].start: of image 0 ({d[:19]}) runs over ids[20:26] but the record has 14 ids. Fix: record '
        "where the image's placeholder ids sit in ids",
        f"ids[3]: is the image placeholder {PAD} but lies in no image's run (runs [20:26]) (and 5 more positions). "
        'Fix: list every image in info.images with the start and length of its placeholder run']


def test_check_refuses_stray_placeholder_and_overlap(tmp_path, img):
    d = images.image_digest(img)
    rec = image_record(img, n_pads=7)            # one more placeholder than listed, at ids[9]
    assert [str(p) for p in image_problems(rec, None)] == [
        f"ids[9]: is the image placeholder {PAD} but lies in no image's run (runs [3:9]). Fix: list every image in "
        'info.images with the start and length of its placeholder run']
    img2 = png(16, 16, seed=5)
    rec = image_record(img)
    rec.info['images'].append(dict(rec.info['images'][0], digest=images.image_digest(img2), start=5, length=1,
                                    grid=[1, 2, 2]))
    d2 = images.image_digest(img2)
    assert [str(p) for p in image_problems(rec, None)] == [
        f'info.images[1].start: of image 1 ({d2[:19]}) runs over ids[5:6], overlapping image 0 ({d[:19]}) at '
        'ids[3:9]. Fix: each image has its own run of placeholder ids']


def test_check_refuses_missing_and_changed_images(tmp_path, img):
    d = images.image_digest(img)
    run = written_run(tmp_path, [image_record(img)], {d: img})
    f = run / 'images' / f'{d[7:]}.png'
    f.write_bytes(b'\x89PNG\r\n\x1a\nchanged')
    bad = images.image_digest(b'\x89PNG\r\n\x1a\nchanged')
    assert check(run).examples == [
        f"g/r0#1: MissingImageError: info.images[0].digest: {d} of image 0 is stored as '{f.name}', whose bytes hash "
        f"to '{bad}'. Fix: store the image with its records (ShardWriter.write(records, images={{digest: bytes}})) "
        'or restore RUN/images from the run']
    f.unlink()
    assert check(run).examples == [
        f"g/r0#1: MissingImageError: info.images[0].digest: {d} of image 0 is not in '{run / 'images'}'. Fix: store "
        'the image with its records (ShardWriter.write(records, images={digest: bytes})) or restore RUN/images from '
        'the run']


def test_check_refuses_placeholders_in_the_loss(tmp_path, img):
    d = images.image_digest(img)
    rec = image_record(img, pad_owner='policy')      # owner policy: from_tokens puts them in the mask too
    assert [(p.kind, str(p)) for p in image_problems(rec, None)] == [
        ('ImageInLossError', f"owner[3]: is policy on a placeholder id of image 0 ({d[:19]}, owner 'prompt'): the "
                             "policy never samples an image (and 5 more positions). Fix: record the placeholder ids "
                             "with owner 'prompt', outside the action mask"),
        ('ImageInLossError', f"action_mask[2]: is 1 on ids[3], a placeholder id of image 0 ({d[:19]}, owner "
                             "'prompt'): image tokens are never trained (and 5 more positions). Fix: derive the mask "
                             'from the owners (Trajectory.from_tokens): placeholder ids are not policy')]
    rec = image_record(img, owner='tool', pad_owner='prompt')
    assert [str(p) for p in image_problems(rec, None)] == [
        f"owner[3]: is 'prompt' on a placeholder id of image 0 ({d[:19]}, owner 'tool'); placeholder ids belong to "
        "whoever supplied the image (and 5 more positions). Fix: record the placeholder ids with owner 'tool' "
        '(vision delimiters stay template)']
    rec = image_record(img)
    rec.action_mask[4] = 1.0                          # the mask alone, owners right
    run = written_run(tmp_path, [rec], {d: img})
    rep = check(run)
    assert rep.examples[-1] == (
        f"g/r0#1: ImageInLossError: action_mask[4]: is 1 on ids[5], a placeholder id of image 0 ({d[:19]}, owner "
        "'prompt'): image tokens are never trained. Fix: derive the mask from the owners (Trajectory.from_tokens): "
        'placeholder ids are not policy')
    assert rep.kinds['MaskOnNonPolicyError'] == 1    # the general rule fires too


def test_check_refuses_malformed_entries_and_unknown_processor(img):
    rec = image_record(img)
    rec.info['images'][0].pop('grid')
    assert [str(p) for p in image_problems(rec, None)] == [
        'info.images[0].grid: is missing. Fix: write each image entry as {digest, start, length, grid, owner, '
        'processor} (agentrl.images.ImageRef.to_dict)']
    rec = image_record(img)
    rec.info['images'][0]['processor']['class'] = 'LlavaImageProcessor'
    assert [str(p) for p in image_problems(rec, None)] == [
        "info.images[0].processor.class: 'LlavaImageProcessor' has no known image placeholder id (known: "
        "['Qwen2VLImageProcessor', 'Qwen2VLImageProcessorFast', 'Qwen2VLImageProcessorPil']); pass the model's placeholder id with "
        "--image-token-id ID. Fix: pass the model's image placeholder id: agentrl check --image-token-id ID"]
    assert image_problems(rec, None, token_id=PAD) == []


def test_check_verifies_each_stored_image_once(tmp_path, img, monkeypatch):
    d = images.image_digest(img)
    run = written_run(tmp_path, [image_record(img, rid=f'r{k}') for k in range(5)], {d: img})
    calls = []
    real = images.verify_image
    monkeypatch.setattr('agentrl.checks.images.verify_image', lambda r, dg: calls.append(dg) or real(r, dg))
    rep = check(run)
    assert (rep.n, rep.refused, calls) == (5, 0, [d])


def test_cli_check_names_the_record(tmp_path, img, capsys):
    from agentrl.cli.main import main
    d = images.image_digest(img)
    run = written_run(tmp_path, [image_record(img, rid='r7', n_pads=5, length=5)], {d: img})
    assert main(['check', str(run / 'trajectories')]) == 1
    out = capsys.readouterr().out
    assert f'g/r7#1: ImageRunError: info.images[0].length: of image 0 ({d[:19]}) is 5 but its grid [1, 4, 6]' in out


# ----------------------------------------------------------------------------- export

def test_verl_export_with_images(tmp_path, img):
    from agentrl import interop
    d = images.image_digest(img)
    run = written_run(tmp_path, [image_record(img)], {d: img})
    rec = store.read_trajectories(run / 'trajectories')[0]
    plain = Trajectory.from_tokens([5, 9, 40, 41], ['template', 'prompt', 'policy', 'policy'], [-1] * 4,
                                   [0.0, 0.0, -0.5, -0.5], 0.0, {}, provenance=rec.provenance)
    out = interop.to_verl([rec, plain], pad_id=0, images=run)
    nt, b = out['non_tensor_batch'], out['batch']
    assert [x for x in nt['multi_modal_data']] == [{'images': [img]}, {}]
    mmi = nt['multi_modal_inputs']
    assert mmi[0]['image_grid_thw'].tolist() == [[1, 4, 6]] and mmi[0]['images_seqlens'].tolist() == [24]
    assert mmi[1] == {}
    # the record: ids [5, 9, VS, PAD x6, VE, 11 | 40, 41, 42]; prompt 11 tokens, response 3; widths 11 and 3
    assert b['position_ids'].shape == (2, 4, 14)
    assert b['position_ids'][0].tolist() == [
        list(range(14)),
        [0, 1, 2, 3, 3, 3, 3, 3, 3, 6, 7, 8, 9, 10],       # temporal: one frame
        [0, 1, 2, 3, 3, 3, 4, 4, 4, 6, 7, 8, 9, 10],       # height: 2 merged rows
        [0, 1, 2, 3, 4, 5, 3, 4, 5, 6, 7, 8, 9, 10]]       # width: 3 merged columns; text goes on at the max + 1
    # the plain row: left-padded prompt of 2 in a width of 11: 1 on padding, then 0, 1, ... in every row
    assert b['position_ids'][1].tolist() == [[1] * 9 + [0, 1, 2, 3, 1]] * 4
    with pytest.raises(ValueError, match=r"to_verl: record 0 \(g/r0#1\) lists images \(info.images\) but no images= "
                                         'was given; pass the run folder'):
        interop.to_verl([rec], pad_id=0)
    assert interop.from_verl(out)[0].info == rec.info        # the image list travels with the record


def test_trl_export_with_images(tmp_path, img):
    from agentrl import interop
    d = images.image_digest(img)
    img2 = png(32, 32, seed=9)
    a, c = image_record(img), image_record(img2, rid='r1')
    r = interop.to_trl_rollout([a, c], images={d: img, images.image_digest(img2): img2})
    assert r['images'] == [[img], [img2]] and r['image_grid_thw'] == [[[1, 4, 6]], [[1, 4, 6]]]
    assert r['prompt_ids'][0] == [5, 9, VS] + [PAD] * 6 + [VE, 11]
    t = interop.to_trl([a, c], pad_id=0, images={d: img, images.image_digest(img2): img2})
    assert t['num_images'] == [1, 1] and t['image_grid_thw'].tolist() == [[1, 4, 6], [1, 4, 6]]
    with pytest.raises(ValueError, match=rf"to_trl: record 0 \(g/r0#1\) image {d} is not in images="):
        interop.to_trl_rollout([a], images={})


@pytest.mark.parametrize('name, fn, target', [
    ('openrlhf', lambda i, r: i.to_openrlhf([r], pad_id=0), 'OpenRLHF'),
    ('skyrl', lambda i, r: i.to_skyrl([r]), 'SkyRL'),
    ('slime', lambda i, r: i.to_slime([r]), 'slime'),
    ('prime-rl', lambda i, r: i.to_prime_rl([r]), 'prime-rl'),
    ('sft', lambda i, r: i.to_sft([r]), 'an SFT row (input_ids and a mask)')])
def test_trainers_without_images_refuse_them(img, name, fn, target):
    from agentrl import interop
    caller = {'prime-rl': 'to_prime_rl'}.get(name, f'to_{name}')
    with pytest.raises(ValueError) as e:
        fn(interop, image_record(img))
    assert str(e.value) == (
        f'{caller}: record 0 (g/r0#1) has 1 image(s) (info.images); {target} has no image input in its batch, so '
        'their placeholder ids would train as text with no pixels behind them. Fix: export to verl or trl, or leave '
        'the records with images out')


def test_cli_export_trl_copies_images(tmp_path, img, capsys):
    from agentrl.cli.main import main
    d = images.image_digest(img)
    run = written_run(tmp_path, [image_record(img)], {d: img})
    out = tmp_path / 'out'
    assert main(['export', str(run / 'trajectories'), '--to', 'trl', '--out', str(out)]) == 0
    r = json.loads((out / 'trl_rollout.json').read_text())
    assert r['images'] == [[f'images/{d[7:]}.png']] and (out / r['images'][0][0]).read_bytes() == img
    assert json.loads((out / 'manifest.json').read_text())['files'][-1] == f'images/{d[7:]}.png'
    assert main(['export', str(run / 'trajectories'), '--to', 'openrlhf', '--out', str(tmp_path / 'o2')]) != 0


# ----------------------------------------------------------------------------- show and report

def test_strip_draws_an_image_run_as_one_cell_with_a_thumbnail(tmp_path, img):
    import base64
    import re

    from agentrl import viz
    from agentrl.viz.term import term_lines
    d = images.image_digest(img)
    run = written_run(tmp_path, [image_record(img)], {d: img})
    rec = store.read_trajectories(run / 'trajectories')[0]
    strip = viz.build_strip(rec, viz.id_decoder, images=run / 'trajectories')
    segs = [(s.owner, s.start, s.stop, s.image is not None) for s in strip.segments]
    assert segs == [('template', 0, 1, False), ('prompt', 1, 2, False), ('template', 2, 3, False),
                    ('prompt', 3, 9, True), ('template', 9, 10, False), ('prompt', 10, 11, False),
                    ('policy', 11, 14, False)]
    im = strip.segments[3].image
    assert (im['index'], im['digest'], im['grid'], im['length']) == (0, d, [1, 4, 6], 6)
    html = viz.to_html(strip)
    assert html.count(f'data-id="{PAD}"') == 1                       # one cell, not 6 pad tokens
    cell = re.search(r'<span class="tok img o-prompt m0"[^>]*>.*?</span></span>', html).group(0)
    src = re.search(r'<img src="data:image/png;base64,([^"]+)"', cell).group(1)
    thumb = base64.b64decode(src)
    assert thumb[:8] == b'\x89PNG\r\n\x1a\n' and len(thumb) <= images.THUMB_MAX_BYTES
    assert 'image 0 \u00b7 6 tokens (pos 3\u20138)' in cell and f'data-digest="{d}" data-n="6"' in cell
    assert "img-src data:" in html and 'http' not in cell
    text = '\n'.join(line.plain for line in term_lines(strip, 120))
    assert f'[image 0 \u00b7 6 prompt tokens \u00b7 {d[:19]}\u2026]' in text and str(PAD) not in text
    assert '<text class="t-prompt"' in viz.to_svg(strip) and 'image 0 \u00d7 6' in viz.to_svg(strip)
    # without the run folder: the same cell, no thumbnail
    bare = viz.to_html(viz.build_strip(rec, viz.id_decoder))
    assert bare.count(f'data-id="{PAD}"') == 1 and '<img' not in bare


def test_show_and_report_draw_the_thumbnail(tmp_path, img):
    from agentrl import viz
    from agentrl.jobs.show import ShowOptions, Shown, draw
    d = images.image_digest(img)
    run = written_run(tmp_path, [image_record(img)], {d: img})
    rec = store.read_trajectories(run / 'trajectories')[0]
    strip = draw(ShowOptions(path=str(run / 'trajectories')), Shown(rec, 1, 0, viz.id_decoder))
    assert strip.segments[3].image['thumb'].startswith('data:image/png;base64,')
    html = viz.report_html([rec], run_dir=str(run), decoder=viz.id_decoder)
    assert html.count('<img src="data:image/png;base64,') == 1 and html.count(f'data-id="{PAD}"') == 1


def test_gateway_keeps_a_calls_images_when_received(tmp_path, img):
    from types import SimpleNamespace

    from agentrl.gateway.service import Gateway
    from agentrl.gateway.sessions import Session
    s = Session('sid', {'group_id': 'g', 'rollout_id': 'r0'})
    d = images.image_digest(img)
    Gateway.keep_images(SimpleNamespace(out=tmp_path), s, {d: img})
    assert s.images == {d: img} and images.load_image(tmp_path, d) == img
