"""Benchmark: a run with screenshots in its records: disk (each image stored once) and the check's peak memory.

1. N distinct 1024x768 RGB PNG "screenshots" (flat bands, a seeded stripe and a 256x256 block of noise, so each
   one is about 200 KB and unlike the others) are made with numpy + zlib.
2. N records, each naming two images (its own and the next one, two turns of one episode: every image is named
   twice), are written with ``ShardWriter.write(records, images=...)`` in shards of ``--shard`` records. Each
   image run is Qwen2-VL's for a 1008x756 resize: grid [1, 54, 72], merge 2, 972 placeholder ids.
3. ``agentrl check RUN/trajectories`` runs in a fresh subprocess: wall time and peak RSS (the child's own
   ``VmHWM`` from ``/proc/self/status``, which starts anew at exec; ``ru_maxrss`` would count this process's
   images, held at the fork), against the bytes of the images it verified (each hashed in 1 MiB blocks).

Usage: ``python bench/bench_images.py [--n 1000] [--shard 100] [--keep DIR]``; prints a table (copy it into
bench/RESULTS.md). The run lives in a temporary folder, deleted at the end unless ``--keep``.
"""
from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
import zlib
from pathlib import Path

import numpy as np

PAD, VS, VE = 151655, 151652, 151653
_CHECK = ("import sys\n"
          "from agentrl.cli.main import main\n"
          "code = main(sys.argv[1:])\n"
          "hwm = [l for l in open('/proc/self/status') if l.startswith('VmHWM')][0].split()[1]\n"
          "print('VMHWM', hwm, 'TORCH', 'torch' in sys.modules, file=sys.stderr)\n"
          "sys.exit(code)\n")
GRID = [1, 54, 72]
PROC = {'class': 'Qwen2VLImageProcessor', 'patch_size': 14, 'merge_size': 2, 'temporal_patch_size': 2,
        'min_pixels': 3136, 'max_pixels': 12845056, 'image_mean': [0.48145466, 0.4578275, 0.40821073],
        'image_std': [0.26862954, 0.26130258, 0.27577711]}


def screenshot(seed: int, width: int = 1024, height: int = 768) -> bytes:
    """PNG bytes of one distinct screenshot-like image (numpy pixels, zlib level 1)."""
    rng = np.random.default_rng(seed)
    y = np.arange(height, dtype=np.uint16)[:, None]
    x = np.arange(width, dtype=np.uint16)[None, :]
    img = np.empty((height, width, 3), dtype=np.uint8)
    img[..., 0] = ((y // 24) * 37 + seed) & 0xff
    img[..., 1] = ((x // 64) * 53) & 0xff
    img[..., 2] = 240
    oy, ox = rng.integers(0, height - 256), rng.integers(0, width - 256)
    img[oy:oy + 256, ox:ox + 256] = rng.integers(0, 256, size=(256, 256, 3), dtype=np.uint8)
    raw = np.concatenate([np.zeros((height, 1), dtype=np.uint8), img.reshape(height, width * 3)], axis=1)

    def chunk(kind: bytes, data: bytes) -> bytes:
        return len(data).to_bytes(4, 'big') + kind + data + (zlib.crc32(kind + data) & 0xffffffff).to_bytes(4, 'big')
    ihdr = width.to_bytes(4, 'big') + height.to_bytes(4, 'big') + bytes([8, 2, 0, 0, 0])
    return (b'\x89PNG\r\n\x1a\n' + chunk(b'IHDR', ihdr) + chunk(b'IDAT', zlib.compress(raw.tobytes(), 1))
            + chunk(b'IEND', b''))


def record(k: int, digests: list):
    """Record ``k``: a prompt with image k, a policy turn, a tool result with image k+1, a policy turn."""
    from agentrl.record import Provenance, SamplingSpec, Trajectory
    n = GRID[0] * GRID[1] * GRID[2] // 4
    ids, own, refs = [5, 9], ['template', 'prompt'], []
    for j, who in ((k, 'prompt'), ((k + 1) % len(digests), 'tool')):
        ids.append(VS)
        own.append('template')
        refs.append({'digest': digests[j], 'start': len(ids), 'length': n, 'grid': list(GRID), 'owner': who,
                     'processor': dict(PROC)})
        ids += [PAD] * n + [VE, 40, 41, 42]
        own += [who] * n + ['template'] + ['policy'] * 3
    logp = [0.0 if o != 'policy' else -0.5 for o in own]
    prov = Provenance(policy='hf', tokenizer='qwen3', template='tpl', sampling=SamplingSpec(), group_id='g',
                      rollout_id=f'r{k}')
    return Trajectory.from_tokens(ids, own, [-1] * len(ids), logp, 1.0, {'stop': 'submitted', 'images': refs},
                                  provenance=prov)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument('--n', type=int, default=1000)
    ap.add_argument('--shard', type=int, default=100)
    ap.add_argument('--keep', default=None)
    a = ap.parse_args(argv)
    from agentrl import store
    from agentrl.images import image_digest
    tmp = Path(a.keep) if a.keep else Path(tempfile.mkdtemp(prefix='bench_images_'))
    run = tmp / 'run'
    try:
        t0 = time.perf_counter()
        pngs = [screenshot(s) for s in range(a.n)]
        t_make = time.perf_counter() - t0
        digests = [image_digest(p) for p in pngs]
        t0 = time.perf_counter()
        with store.ShardWriter(run / 'trajectories', fsync=False) as w:
            for s in range(0, a.n, a.shard):
                ks = range(s, min(a.n, s + a.shard))
                need = {digests[j] for k in ks for j in (k, (k + 1) % a.n)}
                w.write([record(k, digests) for k in ks], images={d: pngs[digests.index(d)] for d in need})
        t_write = time.perf_counter() - t0
        files = sorted((run / 'images').iterdir())
        disk = sum(f.stat().st_size for f in files)
        shards = sum(f.stat().st_size for f in (run / 'trajectories').iterdir())
        env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[1] / 'src'))
        t0 = time.perf_counter()
        p = subprocess.run([sys.executable, '-c', _CHECK, 'check', str(run / 'trajectories')], env=env,
                           capture_output=True, text=True)
        t_check = time.perf_counter() - t0
        words = p.stderr.split('VMHWM')[-1].split()
        rss, torch_loaded = int(words[0]), words[2]
        ok = p.returncode == 0
        print('| name | value | notes |\n|---|---|---|')
        print(f'| images made | {a.n} | distinct 1024x768 PNGs, {t_make:.1f} s |')
        print(f'| image files on disk | {len(files)} | each image named by 2 records, stored once |')
        print(f'| image bytes on disk | {disk / 2**20:.1f} MiB | mean {disk / len(files) / 1024:.0f} KiB per image |')
        print(f'| shard bytes | {shards / 2**20:.2f} MiB | {a.n} records, {a.n // a.shard} shards, written in '
              f'{t_write:.1f} s (images included) |')
        print(f'| check exit code | {p.returncode} | {"passed" if ok else p.stdout[-400:]} |')
        print(f'| check wall | {t_check:.1f} s | every image hashed once, {a.n} records through the image gate |')
        print(f'| check peak RSS | {rss / 1024:.0f} MiB | the check process\'s VmHWM (torch imported: {torch_loaded}); '
              f'images verified: {disk / 2**20:.0f} MiB |')
        return 0 if ok else 1
    finally:
        if not a.keep:
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == '__main__':
    sys.exit(main())
