"""Rollout throughput (issue 7): KV-cached ``rollout_batch`` against the KV-free paths, with targets.

``run(quick)`` returns rows ``{name, value, unit, target, ok, notes}`` for ``bench/run.py``; run
this file directly to print them, or to draw the scaling curves::

    .venv/bin/python bench/bench_rollout.py [--quick] [--scaling] [--threads 1] [--clock wall|cpu]

What is measured (untrained TinyAgent, BugFix gym, temperature 1; every ratio is taken side by
side in one process, each variant timed in turn and the best of ``repeats`` rounds kept, so
load from other processes on the shared machine hits all variants alike):

* ``rollout_64_*``: 64 episodes one by one with :func:`rollout` (KV-free, the book's loop)
  against ``rollout_batch`` with and without the cache (the chapter reports about 7.5x batched).
* ``rollout_256_*``: the targets: cached ``rollout_batch`` >= 30x faster than ``rollout`` one by
  one without cache, and >= 4x faster than ``rollout_batch`` without cache.
* ``overhead_256``: total cached rollout time / time of the model forward passes alone for the
  same tokens. The forward passes are recorded during a rollout (every ``extend`` call with its
  inputs and every change of the cache's rows) and replayed on a fresh cache with nothing else
  (no sampling, env, episode bookkeeping or records); only the ``extend`` calls are timed.
* ``collate_4096``: ``collate`` of 4,096 trajectories of 224-288 tokens against
  ``torch.nn.utils.rnn.pad_sequence`` over the same four per-token fields (ids, action_mask,
  sample_logp, turn_ids).
* ``peak_mem_1024_*``: peak memory of a 1,024-episode rollout, measured in a fresh subprocess:
  the kernel's resident-set high-water mark (``VmHWM``, reset through ``/proc/self/clear_refs``
  after imports and a warm-up) minus the resident set before the rollout. It sees every
  allocation (torch's CPU allocator and Python objects alike), unlike ``tracemalloc``. "live"
  rows run with glibc told to unmap and trim freed blocks (:data:`LIVE_MALLOC`) after a warm-up
  rollout; "malloc" rows are the first large rollout with default malloc. Compared with the size
  of the returned trajectories (tensor storage plus their Python objects, walked object by
  object) plus the model's parameters, for several ``max_active`` (live rows) settings.
* ``--scaling``: rollout time against the number of episodes (64 to 1024) and against the context
  length (``max_len`` 128 to 1024), saved as ``bench/scaling.png`` (``scaling.svg`` when
  matplotlib is missing). The untrained policy's episodes stop after 6 turns (about 73 tokens), so
  for the context axis the env and rollout turn budgets are lifted and each episode runs until
  it no longer fits ``max_len`` (truncation): every episode then has about ``max_len`` tokens.

Torch runs on one thread by default (``--threads``): the machine has 2 cores shared with other
jobs, and a second OpenMP thread waiting for a busy core makes small ops 5-10x slower.
"""
from __future__ import annotations

import argparse
import gc
import json
import math
import os
import subprocess
import sys
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
#: The clock of every measurement: wall time (default) or, with ``--clock cpu``, this process's
#: CPU time (steadier on a loaded machine when torch runs on one thread).
_clock = time.perf_counter


# ----------------------------------------------------------------------------- set-up
def _setup(max_len: int = 256):
    import agentrl as arl
    tasks = arl.make_tasks('all')
    tok = arl.build_tokenizer(tasks)
    torch.manual_seed(0)
    model = arl.TinyAgent(tok.vocab_size, max_len=max_len).eval()
    return arl, tasks, tok, model


def _tasks(tasks, n):
    return [tasks[i % len(tasks)] for i in range(n)]


def _batch(arl, model, tok, ts, cache, seed=0, turns=6, max_active=None):
    """Seconds for one ``rollout_batch`` (envs built outside the clock) and its trajectories."""
    envs = [arl.BugFixEnv(max_turns=turns) for _ in ts]
    gen = torch.Generator().manual_seed(seed)
    t0 = _clock()
    trajs = arl.rollout_batch(model, envs, ts, tok, generator=gen,
                              options=arl.RolloutBatchOptions(max_turns=turns, cache=cache, max_active=max_active))
    return _clock() - t0, trajs


def _sequential(arl, model, tok, ts, cache, seed=0):
    """Seconds for ``rollout`` one episode after another (one generator, as the book)."""
    envs = [arl.BugFixEnv() for _ in ts]
    gen = torch.Generator().manual_seed(seed)
    t0 = _clock()
    trajs = [arl.rollout(model, env, t, tok, generator=gen, cache=cache) for env, t in zip(envs, ts)]
    return _clock() - t0, trajs


def _best_of(variants: dict, repeats: int) -> dict:
    """Run every variant once per round, round after round; keep each one's best time."""
    best = {k: math.inf for k in variants}
    for _ in range(repeats):
        for k, fn in variants.items():
            best[k] = min(best[k], fn())
    return best


def _row(name, value, unit, notes='', target=None, ok=None):
    row = {'name': name, 'value': value, 'unit': unit, 'notes': notes}
    if target is not None:
        row['target'], row['ok'] = target, ok
    return row


# ----------------------------------------------------------------------------- forward-only replay
class _Recorder:
    """Stands in for a cached model during one rollout and logs what the model was asked to do."""

    def __init__(self, model):
        self.model, self.max_len, self.log = model, model.max_len, []

    def new_cache(self, batch):
        self.log.append(('new', batch))
        cache = self.model.new_cache(batch)
        keep, drop = cache.keep, cache.drop

        def logged_keep(rows, extra=0):
            self.log.append(('keep', list(rows), extra))
            keep(rows, extra)

        def logged_drop(rows):
            self.log.append(('drop', list(rows)))
            return drop(rows)
        cache.keep, cache.drop = logged_keep, logged_drop
        return cache

    def extend(self, cache, ids, n_new=None):
        self.log.append(('extend', ids.clone(), None if n_new is None else n_new.clone()))
        return self.model.extend(cache, ids, n_new)


def _replay(model, log) -> tuple[float, int]:
    """Seconds spent in ``model.extend`` replaying ``log`` on a fresh cache; tokens fed."""
    spent, tokens, cache = 0.0, 0, None
    with torch.no_grad():
        for op in log:
            if op[0] == 'new':
                cache = model.new_cache(op[1])
            elif op[0] == 'keep':
                cache.keep(op[1], op[2])
            elif op[0] == 'drop':
                cache.drop(op[1])
            else:
                _, ids, n_new = op
                t0 = _clock()
                model.extend(cache, ids, n_new)
                spent += _clock() - t0
                tokens += int(n_new.sum()) if n_new is not None else ids.numel()
    return spent, tokens


def _breakdown(arl, model, tok, ts) -> dict:
    """Seconds of one cached rollout spent in each part (functions wrapped with a clock)."""
    import agentrl.rollouts as R
    from agentrl.model import KVCache
    spent = {}

    def clocked(owner, name, key):
        fn = getattr(owner, name)

        def wrapper(*a, **k):
            t0 = _clock()
            try:
                return fn(*a, **k)
            finally:
                spent[key] = spent.get(key, 0.0) + _clock() - t0
        setattr(owner, name, wrapper)
        return fn

    env_cls = type(arl.BugFixEnv())
    saved = [(R, 'sample', clocked(R, 'sample', 'sampling')),
             (R, 'make_trajectory', clocked(R, 'make_trajectory', 'records')),
             (KVCache, 'keep', clocked(KVCache, 'keep', 'cache_rows')),
             (KVCache, 'drop', clocked(KVCache, 'drop', 'cache_rows')),
             (env_cls, 'step', clocked(env_cls, 'step', 'env')),
             (R.Episode, 'act', clocked(R.Episode, 'act', 'act'))]
    model.extend = lambda *a, _f=type(model).extend, **k: _timed(spent, 'forward', _f, model, *a, **k)
    try:
        total, _ = _batch(arl, model, tok, ts, True)
    finally:
        for owner, name, fn in saved:
            setattr(owner, name, fn)
        del model.extend
    spent['episode'] = spent.pop('act', 0.0) - spent.get('env', 0.0)      # act minus the env's step
    spent['driver'] = total - sum(spent.values())
    spent['total'] = total
    return spent


def _timed(spent, key, fn, *a, **k):
    t0 = _clock()
    try:
        return fn(*a, **k)
    finally:
        spent[key] = spent.get(key, 0.0) + _clock() - t0


# ----------------------------------------------------------------------------- collate
def _collate_inputs(n: int = 4096, seed: int = 0):
    from agentrl.record import OWNER, Trajectory
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(224, 289, (n,), generator=g).tolist()
    out = []
    for i, T in enumerate(lengths):
        owner = torch.full((T,), OWNER['tool'], dtype=torch.long)
        owner[0] = OWNER['template']
        owner[1:7] = OWNER['prompt']
        owner[7::12] = OWNER['policy']
        mask = (owner[1:] == OWNER['policy']).float()
        out.append(Trajectory(ids=torch.randint(8, 316, (T,), generator=g), action_mask=mask,
                              sample_logp=-torch.rand(T - 1, generator=g) * mask, reward=float(i % 2), info={},
                              owner=owner, turn=torch.arange(T) // 12 - 1))
    return out


def bench_collate(repeats: int) -> list[dict]:
    from agentrl.batching import collate
    from torch.nn.utils.rnn import pad_sequence
    trajs = _collate_inputs()
    n_tok = sum(len(t.ids) for t in trajs)

    def ours():
        t0 = _clock()
        collate(trajs, 0)
        return _clock() - t0

    def reference():
        t0 = _clock()
        pad_sequence([t.ids for t in trajs], batch_first=True, padding_value=0)
        pad_sequence([t.action_mask for t in trajs], batch_first=True, padding_value=0.0)
        pad_sequence([t.sample_logp for t in trajs], batch_first=True, padding_value=0.0)
        pad_sequence([t.turn[1:] for t in trajs], batch_first=True, padding_value=-1)
        return _clock() - t0

    ours(), reference()
    best = _best_of({'collate': ours, 'pad_sequence': reference}, repeats)
    ratio = best['collate'] / best['pad_sequence']
    return [
        _row('collate_4096_s', round(best['collate'], 4), 's', f'{len(trajs)} trajectories, {n_tok} tokens'),
        _row('pad_sequence_4096_s', round(best['pad_sequence'], 4), 's', 'ids, action_mask, sample_logp, turn_ids'),
        _row('collate_vs_pad_sequence', round(ratio, 2), 'x', 'collate time / pad_sequence time', '<= 1.5',
             ratio <= 1.5),
    ]


# ----------------------------------------------------------------------------- memory (subprocess)
def _status(key: str) -> int:
    with open('/proc/self/status') as f:
        for line in f:
            if line.startswith(key + ':'):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f'{key} not in /proc/self/status')


def _deep_size(obj, seen=None) -> int:
    """Bytes of ``obj`` and everything it references (tensor storage included), each object once."""
    seen = set() if seen is None else seen
    if id(obj) in seen or obj is None or isinstance(obj, int) and -5 <= obj <= 256:   # shared singletons
        return 0
    seen.add(id(obj))
    size = sys.getsizeof(obj)
    if torch.is_tensor(obj):
        st = obj.untyped_storage()
        if st.data_ptr() not in seen:
            seen.add(st.data_ptr())
            size += st.nbytes()
        return size
    if isinstance(obj, dict):
        size += sum(_deep_size(k, seen) + _deep_size(v, seen) for k, v in obj.items())
    elif isinstance(obj, (list, tuple, set, frozenset)):
        size += sum(_deep_size(x, seen) for x in obj)
    elif hasattr(obj, '__dict__'):
        size += _deep_size(vars(obj), seen)
    return size


def _memory_child(n: int, max_active: int | None, cache: bool, warm: bool) -> dict:
    arl, tasks, tok, model = _setup()
    ts = _tasks(tasks, n)
    with torch.no_grad():     # warm-up: the same rollout on up to 4 x max_active episodes (warm), or 4
        k = (n if max_active is None else min(n, 4 * max_active)) if warm else 4
        arl.rollout_batch(model, [arl.BugFixEnv() for _ in range(k)], ts[:k], tok,
                          generator=torch.Generator().manual_seed(1),
                          options=arl.RolloutBatchOptions(cache=cache, max_active=max_active))
    envs = [arl.BugFixEnv() for _ in ts]
    gc.collect()
    base = _status('VmRSS')
    with open('/proc/self/clear_refs', 'w') as f:           # reset the high-water mark to now
        f.write('5')
    t0 = time.perf_counter()
    trajs = arl.rollout_batch(model, envs, ts, tok, generator=torch.Generator().manual_seed(0),
                              options=arl.RolloutBatchOptions(cache=cache, max_active=max_active))
    seconds = time.perf_counter() - t0
    peak = _status('VmHWM')
    tensor_bytes = sum(t.ids.nbytes + t.action_mask.nbytes + t.sample_logp.nbytes + t.owner.nbytes + t.turn.nbytes
                       for t in trajs)
    return dict(n=n, max_active=max_active, cache=cache, warm=warm, seconds=seconds, peak_increase=peak - base,
                traj_bytes=_deep_size(trajs), traj_tensor_bytes=tensor_bytes,
                model_bytes=sum(p.nbytes for p in model.parameters()),
                tokens=sum(len(t.ids) for t in trajs))


#: glibc settings of the "live" measurement: blocks >= 128 KB are mapped and unmapped one by one
#: and the heap is trimmed, so the resident set follows live memory instead of what malloc keeps.
LIVE_MALLOC = {'MALLOC_MMAP_THRESHOLD_': '131072', 'MALLOC_TRIM_THRESHOLD_': '131072'}


def _memory(n: int, max_active: int | None, live: bool, warm: bool, cache: bool = True) -> dict:
    cmd = [sys.executable, os.path.abspath(__file__), '--memory-child', str(n), str(max_active or 0),
           str(int(cache)), str(int(warm)), '--threads', str(torch.get_num_threads())]
    env = {k: v for k, v in os.environ.items() if not k.startswith('MALLOC_')}   # "malloc": glibc as is
    env.update(LIVE_MALLOC if live else {})
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env)
    if out.returncode != 0:
        raise RuntimeError(f'memory child failed: {out.stderr[-2000:]}')
    return json.loads(out.stdout.strip().splitlines()[-1])


def bench_memory(configs) -> list[dict]:
    """Peak memory rows of a 1,024-episode cached rollout for ``(max_active, live, warm)`` settings.

    live: glibc returns freed blocks (:data:`LIVE_MALLOC`), so the resident set follows live
    memory; otherwise default malloc, whose kept free blocks count too. warm: measured after a
    warm-up rollout of up to 4 x max_active episodes (one-off caches excluded); otherwise after 4.
    """
    rows = []
    for max_active, live, warm in configs:
        m = _memory(1024, max_active, live, warm)
        size = m['traj_bytes'] + m['model_bytes']
        label = f"{'all' if max_active is None else max_active}_{'live' if live else 'malloc'}"
        how = ('glibc returning freed blocks (live memory)' if live else 'default malloc (what the OS sees)') + \
            (', after a warm-up rollout' if warm else ', first large rollout of a fresh process')
        rows.append(_row(f'peak_mem_1024_active_{label}_MB', round(m['peak_increase'] / 2**20, 1), 'MB',
                         f"{how}; max_active={max_active}; {m['tokens']} tokens in {m['seconds']:.2f} s; "
                         f"returned trajectories {m['traj_bytes'] / 2**20:.1f} MB "
                         f"({m['traj_tensor_bytes'] / 2**20:.1f} MB tensor data) + "
                         f"model {m['model_bytes'] / 2**20:.2f} MB",
                         f'<= {2 * size / 2**20:.1f} MB (2x)', m['peak_increase'] <= 2 * size))
        rows.append(_row(f'peak_mem_1024_active_{label}_ratio', round(m['peak_increase'] / size, 2), 'x',
                         'peak increase / (trajectories + model)'))
    return rows


# ----------------------------------------------------------------------------- rollout targets
def bench_rollouts(quick: bool, repeats: int) -> list[dict]:
    arl, tasks, tok, model = _setup()
    rows = []
    _batch(arl, model, tok, _tasks(tasks, 8), True)                      # warm-up
    _batch(arl, model, tok, _tasks(tasks, 8), False)
    _sequential(arl, model, tok, _tasks(tasks, 2), False)

    # 64 episodes: the book's comparison
    ts = _tasks(tasks, 64)
    best = _best_of({'seq': lambda: _sequential(arl, model, tok, ts, False)[0],
                     'batch': lambda: _batch(arl, model, tok, ts, False)[0],
                     'cached': lambda: _batch(arl, model, tok, ts, True)[0]}, 1 if quick else repeats)
    rows += [_row('rollout_64_sequential_kvfree_s', round(best['seq'], 3), 's', '64 x rollout(cache=False)'),
             _row('rollout_64_batch_kvfree_s', round(best['batch'], 3), 's', 'rollout_batch(cache=False)'),
             _row('rollout_64_batch_cached_s', round(best['cached'], 3), 's', 'rollout_batch(cache=True)'),
             _row('rollout_64_batch_kvfree_speedup', round(best['seq'] / best['batch'], 1), 'x',
                  'sequential / batched KV-free (book: about 7.5x)'),
             _row('rollout_64_batch_cached_speedup', round(best['seq'] / best['cached'], 1), 'x',
                  'sequential / batched cached')]

    # 256 episodes: the targets (quick: one round, the sequential time scaled from the 64 above)
    ts = _tasks(tasks, 256)
    seq64 = best['seq']
    variants = {'batch': lambda: _batch(arl, model, tok, ts, False)[0],
                'cached': lambda: _batch(arl, model, tok, ts, True)[0]}
    if not quick:
        variants['seq'] = lambda: _sequential(arl, model, tok, ts, False)[0]
    best = _best_of(variants, 1 if quick else repeats)
    if quick:
        best['seq'] = seq64 * 4
    seq_note = '256 x rollout(cache=False)' if not quick else 'the 64 sequential episodes above, times 4'
    _, trajs = _batch(arl, model, tok, ts, True)
    n_tok = sum(len(t.ids) for t in trajs)
    n_act = int(sum(t.action_mask.sum() for t in trajs))
    r_seq, r_batch = best['seq'] / best['cached'], best['batch'] / best['cached']
    rows += [_row('rollout_256_sequential_kvfree_s', round(best['seq'], 3), 's', seq_note),
             _row('rollout_256_batch_kvfree_s', round(best['batch'], 3), 's', 'rollout_batch(cache=False)'),
             _row('rollout_256_batch_cached_s', round(best['cached'], 3), 's',
                  f'rollout_batch(cache=True): {n_tok} tokens, {n_act} sampled, '
                  f'{n_act / best["cached"]:.0f} sampled tokens/s'),
             _row('rollout_256_cached_vs_sequential', round(r_seq, 1), 'x', 'sequential KV-free / batched cached',
                  '>= 30', r_seq >= 30),
             _row('rollout_256_cached_vs_batch_kvfree', round(r_batch, 1), 'x', 'batched KV-free / batched cached',
                  '>= 4', r_batch >= 4)]

    # overhead: the whole rollout against its forward passes alone, interleaved round by round
    rounds = 1 if quick else repeats
    total, fwd, n_ext, fed = _overhead(arl, model, tok, ts, rounds)
    parts = min((_breakdown(arl, model, tok, ts) for _ in range(rounds)), key=lambda d: d['total'])
    order = ['forward', 'sampling', 'env', 'episode', 'records', 'cache_rows', 'driver']
    rows += [_row('rollout_256_breakdown_forward_share', round(parts['forward'] / parts['total'], 2), '',
                  'one instrumented cached rollout: ' + ', '.join(f'{k} {parts[k]:.3f} s' for k in order) +
                  f" (total {parts['total']:.3f} s; sampling = sampling.sample, env = BugFixEnv.step, episode = "
                  'Episode.act minus env, records = make_trajectory, cache_rows = KVCache.keep and drop)'),
             _row('forward_alone_256_s', round(fwd, 3), 's',
                  f'{n_ext} recorded extend calls replayed, {fed} tokens fed; '
                  f'rollout {total:.3f} s in the same rounds'),
             _row('overhead_256', round(total / fwd, 2), 'x', 'cached rollout time / its forward passes alone',
                  '<= 1.3', total / fwd <= 1.3)]
    if not quick:             # the same machinery around a model 16x wider in compute
        torch.manual_seed(0)
        big = arl.TinyAgent(tok.vocab_size, d_model=256, n_layers=4, n_heads=8).eval()
        total, fwd, _, _ = _overhead(arl, big, tok, ts, repeats)
        rows.append(_row('overhead_256_d256_4layers', round(total / fwd, 2), 'x',
                         f'same rollout with TinyAgent(d_model=256, n_layers=4, n_heads=8): rollout {total:.3f} s, '
                         f'forward alone {fwd:.3f} s (the non-model cost is fixed)'))
    return rows


def _overhead(arl, model, tok, ts, repeats):
    """Best cached rollout time and best forward-alone replay time, measured in alternating rounds."""
    rec = _Recorder(model)
    arl.rollout_batch(rec, [arl.BugFixEnv() for _ in ts], ts, tok, generator=torch.Generator().manual_seed(0))
    total = fwd = math.inf
    for _ in range(repeats):
        total = min(total, _batch(arl, model, tok, ts, True)[0])
        spent, fed = _replay(model, rec.log)
        fwd = min(fwd, spent)
    return total, fwd, sum(op[0] == 'extend' for op in rec.log), fed


# ----------------------------------------------------------------------------- scaling curves
def scaling(quick: bool, repeats: int = 1, out: str | None = None) -> list[dict]:
    """Time against episodes (64..1024) and against context length (max_len 128..1024)."""
    arl, tasks, tok, model = _setup()
    rows, curves = [], {}
    ns = [64, 128, 256] if quick else [64, 128, 256, 512, 1024]
    kvfree_max_n = 128 if quick else 256
    for n in ns:
        ts = _tasks(tasks, n)
        t = _best_of({'c': lambda: _batch(arl, model, tok, ts, True)[0]}, repeats)['c']
        curves.setdefault('episodes_cached', []).append((n, t))
        if n <= kvfree_max_n:
            tk = _best_of({'k': lambda: _batch(arl, model, tok, ts, False)[0]}, repeats)['k']
            curves.setdefault('episodes_kvfree', []).append((n, tk))
    lens = [128, 256] if quick else [128, 256, 512, 1024]
    kvfree_max_len = 128 if quick else 256
    n_ctx = 16 if quick else 32
    big = 10 ** 6
    for L in lens:
        _, _, _, mL = _setup(L)
        ts = _tasks(tasks, n_ctx)
        t, trajs = _batch(arl, mL, tok, ts, True, turns=big)
        for _ in range(repeats - 1):
            t = min(t, _batch(arl, mL, tok, ts, True, turns=big)[0])
        toks = sum(len(x.ids) for x in trajs)
        curves.setdefault('context_cached', []).append((L, t, toks))
        if L <= kvfree_max_len:
            tk, _ = _batch(arl, mL, tok, ts, False, turns=big)
            curves.setdefault('context_kvfree', []).append((L, tk, toks))

    def slope(points):
        xs, ys = [math.log(p[0]) for p in points], [math.log(p[1]) for p in points]
        mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
        return sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)

    for key, unit in [('episodes_cached', 'episodes'), ('episodes_kvfree', 'episodes'),
                      ('context_cached', 'max_len'), ('context_kvfree', 'max_len')]:
        pts = curves.get(key, [])
        if len(pts) < 2:
            continue
        desc = ', '.join(f'{p[0]}: {p[1]:.2f} s' for p in pts)
        if key.startswith('context'):
            desc += f' ({n_ctx} episodes filled to max_len; {pts[-1][2] / pts[-1][1]:.0f} tokens/s at the longest)'
        rows.append(_row(f'scaling_{key}_loglog_slope', round(slope(pts), 2), '',
                         f'time ~ {unit}^slope (1 = linear, 2 = quadratic); {desc}'))
    if out:
        rows.append(_row('scaling_plot', None, '', _plot(curves, out, n_ctx)))
    return rows


def _plot(curves, out: str, n_ctx: int) -> str:
    """Save the curves (linear axes) with matplotlib, or as a hand-written SVG without it."""
    try:
        import matplotlib
        matplotlib.use('Agg')
        import matplotlib.pyplot as plt
    except ImportError:
        path = os.path.splitext(out)[0] + '.svg'
        _svg(curves, path, n_ctx)
        return f'wrote {os.path.relpath(path)} (matplotlib not installed)'
    fig, axes = plt.subplots(1, 2, figsize=(9, 3.6))
    for ax, prefix, xlabel, title in [
            (axes[0], 'episodes', 'episodes (6-turn untrained, max_len 256)', 'rollout_batch time vs episodes'),
            (axes[1], 'context', f'max_len ({n_ctx} episodes filled to max_len)', 'rollout_batch time vs context')]:
        for kind, style in [('cached', 'o-'), ('kvfree', 's--')]:
            pts = curves.get(f'{prefix}_{kind}', [])
            if pts:
                ax.plot([p[0] for p in pts], [p[1] for p in pts], style, label=f'cache={kind == "cached"}')
        pts = curves.get(f'{prefix}_cached', [])
        if pts:           # least-squares line through the origin fitted to the cached points
            k = sum(p[0] * p[1] for p in pts) / sum(p[0] ** 2 for p in pts)
            xs = [0] + [p[0] for p in pts]
            ax.plot(xs, [k * x for x in xs], ':', color='gray', label='linear fit (cache=True)')
        ax.set_xlim(left=0)
        ax.set_ylim(bottom=0)
        ax.set_xlabel(xlabel)
        ax.set_ylabel('seconds')
        ax.set_title(title, fontsize=10)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=80)
    plt.close(fig)
    return f'wrote {os.path.relpath(out)}'


def _svg(curves, path: str, n_ctx: int) -> None:
    """A minimal log-log SVG of the same curves, for machines without matplotlib."""
    W, H, pad = 420, 300, 45
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{2 * W}" height="{H}" font-size="11">']
    for k, prefix in enumerate(['episodes', 'context']):
        series = {kind: curves.get(f'{prefix}_{kind}', []) for kind in ('cached', 'kvfree')}
        pts = [p for s in series.values() for p in s]
        if not pts:
            continue
        lx = [math.log(p[0]) for p in pts]
        ly = [math.log(p[1]) for p in pts]
        x0, x1, y0, y1 = min(lx), max(lx) + 1e-9, min(ly), max(ly) + 1e-9
        X = lambda v: k * W + pad + (math.log(v) - x0) / (x1 - x0) * (W - 2 * pad)
        Y = lambda v: H - pad - (math.log(v) - y0) / (y1 - y0) * (H - 2 * pad)
        parts.append(f'<text x="{k * W + pad}" y="20">rollout_batch seconds vs {prefix} (log-log)</text>')
        for kind, color in [('cached', 'blue'), ('kvfree', 'red')]:
            s = series[kind]
            if s:
                parts.append('<polyline fill="none" stroke="%s" points="%s"/>' % (
                    color, ' '.join(f'{X(p[0]):.1f},{Y(p[1]):.1f}' for p in s)))
                for p in s:
                    parts.append(f'<text x="{X(p[0]):.1f}" y="{Y(p[1]) - 4:.1f}" fill="{color}">{p[1]:.2f}</text>')
    parts.append('</svg>')
    with open(path, 'w') as f:
        f.write('\n'.join(parts))


# ----------------------------------------------------------------------------- entry points
def run(quick: bool = False) -> list[dict]:
    """All rollout benchmarks of issue 7 with their targets.

    Args:
        quick: fewer repeats, the sequential 256-episode baseline extrapolated from 64 episodes,
            one memory configuration (about 15 s in all on the 2-core machine; the full run
            takes about 100 s).

    Returns:
        list of rows ``{'name', 'value', 'unit', 'notes'}`` plus ``'target'`` and ``'ok'`` where
        the issue sets a target.
    """
    threads = torch.get_num_threads()
    repeats = 2 if quick else 5
    rows = bench_rollouts(quick, repeats)
    rows += bench_collate(1 if quick else repeats)
    rows += bench_memory([(32, True, False)] if quick else
                         [(None, True, True), (256, True, True), (64, True, True), (32, True, True),
                          (16, True, True), (None, False, False), (32, False, False)])
    for r in rows:
        r['notes'] = (r['notes'] + f'; {threads} thread(s)') if r['notes'] else f'{threads} thread(s)'
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument('--quick', action='store_true', help='the short version (under half a minute)')
    ap.add_argument('--scaling', action='store_true', help='only the scaling curves, saved to bench/scaling.png')
    ap.add_argument('--threads', type=int, default=1, help='torch threads (default 1)')
    ap.add_argument('--clock', choices=['wall', 'cpu'], default='wall',
                    help='wall time (default) or this process\'s CPU time (steadier on a busy machine)')
    ap.add_argument('--memory-child', nargs=4, type=int, metavar=('N', 'MAX_ACTIVE', 'CACHE', 'WARM'),
                    help=argparse.SUPPRESS)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    global _clock
    _clock = time.process_time if args.clock == 'cpu' else time.perf_counter
    if args.memory_child:
        n, max_active, cache, warm = args.memory_child
        print(json.dumps(_memory_child(n, max_active or None, bool(cache), bool(warm))))
        return
    if args.scaling:
        rows = scaling(args.quick, repeats=1 if args.quick else 2, out=os.path.join(HERE, 'scaling.png'))
    else:
        rows = run(args.quick)
    sys.path.insert(0, HERE)
    from run import format_table
    print(format_table([dict(r, bench='rollout') for r in rows]))


if __name__ == '__main__':
    main()
