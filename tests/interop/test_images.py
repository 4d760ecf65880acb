"""Records with images exported to verl and TRL, checked against their own code (verl 0.9.1's DataProto,
transformers' Qwen2-VL rope index that verl calls, TRL's ``images`` column read as PIL images)."""
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

pytest.importorskip('verl.protocol', reason='verl is not in this venv; `make test-interop` runs these tests in .venv-interop')
pytest.importorskip('PIL')

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))     # tests/_images.py, tests/test_images_record.py

from _images import png  # noqa: E402
from test_images_record import PAD, image_record  # noqa: E402

from agentrl import images, interop  # noqa: E402


def test_verl_dataproto_with_images_and_qwen2vl_rope_positions():
    from PIL import Image
    from transformers.models.qwen2_vl.modeling_qwen2_vl import Qwen2VLModel
    from verl.protocol import DataProto
    a, b = png(64, 48, seed=1), png(40, 40, seed=2)
    ra = image_record(a)
    rb = image_record(b, rid='r1', grid=(1, 6, 4))
    imgs = {images.image_digest(a): a, images.image_digest(b): b}
    dp = interop.to_verl_dataproto([ra, rb], pad_id=0, images=imgs, image_form='pil')
    assert isinstance(dp, DataProto)
    dp.check_consistency()
    got = dp.non_tensor_batch['multi_modal_data']
    assert [type(x['images'][0]) for x in got] == [Image.Image, Image.Image]
    assert [x['images'][0].size for x in got] == [(64, 48), (40, 40)]
    pos = dp.batch['position_ids']
    attn = dp.batch['attention_mask']
    ids = dp.batch['input_ids']
    fake = SimpleNamespace(config=SimpleNamespace(vision_config=SimpleNamespace(spatial_merge_size=2)))
    fake.get_vision_position_ids = lambda *a, **k: Qwen2VLModel.get_vision_position_ids(fake, *a, **k)
    grids = torch.cat([x['image_grid_thw'] for x in dp.non_tensor_batch['multi_modal_inputs']])
    want, _ = Qwen2VLModel.get_rope_index(fake, ids, (ids == PAD).int(), image_grid_thw=grids, attention_mask=attn)
    real = attn.bool()
    for r in range(2):        # transformers leaves padding 0, verl sets it to 1: compare the real tokens
        assert torch.equal(pos[r, 1:, real[r]], want[:, r, real[r]])
        assert pos[r, 0, real[r]].tolist() == list(range(int(real[r].sum())))


def test_trl_rollout_images_as_pil():
    from PIL import Image
    a = png(64, 48, seed=1)
    r = interop.to_trl_rollout([image_record(a)], images={images.image_digest(a): a}, image_form='pil')
    assert isinstance(r['images'][0][0], Image.Image) and r['images'][0][0].mode == 'RGB'
    assert r['images'][0][0].tobytes() == Image.open(__import__('io').BytesIO(a)).convert('RGB').tobytes()
