"""Hugging Face engine: cross-turn KV cache vs re-prefill vs ``transformers.generate``, side by side.

``run(quick)`` returns rows ``{name, value, unit, notes[, target, ok]}`` for ``bench/run.py``; run
this file directly to print them::

    .venv/bin/python bench/bench_engine_hf.py [--quick] [--model DIR] [--small DIR] [--episodes 32]
        [--turns 6] [--new-tokens 32] [--repeat 1] [--scaling 2,4,8,16] [--scaling-episodes 8]
        [--threads 1] [--json OUT]

Everything runs in one process on one torch thread (the machine is shared), variant after
variant on the same model, prompts and seeds:

* **multi-turn** (``--model``: default the 96.5M Qwen3 of ``make-test-model --layers 8 --hidden 512
  --heads 8 --kv-heads 4``, built in a temporary folder): ``--episodes`` BugFix episodes through
  real function calling, ``--turns`` turns of at most ``--new-tokens`` tokens, temperature 1.

  - ``agentrl``: :func:`agentrl.jobs.bugfix.bugfix_rollouts` (each episode keeps its KV cache row
    across turns; continuous batching);
  - ``agentrl_reprefill``: the same with ``reuse_cache=False`` (each turn prefills the whole
    conversation; same records);
  - ``generate``: the loop a user writes: each turn, the live episodes' prompts (the same
    recorder ids) go left-padded through ``model.generate(do_sample=True, output_scores=True,
    return_dict_in_generate=True)`` and ``compute_transition_scores(normalize_logits=True)``,
    torch seeded from the run seed; the same recorder, parser and gym.

  Rows: wall seconds of each, the speed-up over ``generate``, total time over the engine's own
  forward passes, and tokens fed through the model per episode against the record length.
* **scaling in turns** (same model, ``--scaling-episodes`` episodes, scripted tool observations
  that keep every episode going): wall time at 2, 4, 8, 16 turns with and without the cross-turn
  cache, and the log-log slope of time against turns (least squares).
* **single turn** (``--small``: the 2-layer hidden-64 test model): 16 prompts of ~300 ids, 64 new
  tokens: :class:`HFSampler` against ``model.generate`` and ``generate`` + transition scores.

``quick`` runs the 2-layer model everywhere with 8 episodes and short turns.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BIG = {'layers': 8, 'hidden': 512, 'heads': 8, 'kv_heads': 4}
#: glibc settings of ``--malloc keep``: freed blocks up to 64 MiB stay in the heap (trimmed past 1 GiB).
KEEP_MALLOC = {'MALLOC_MMAP_THRESHOLD_': '67108864', 'MALLOC_TRIM_THRESHOLD_': '1073741824'}


def _tokenizer_dir() -> Path | None:
    for d in ([Path(os.environ['AGENTRL_TOKENIZERS']) / 'qwen3'] if os.environ.get('AGENTRL_TOKENIZERS') else []) + \
             [ROOT.parent / 'shared' / 'tokenizers' / 'qwen3', ROOT.parents[1] / 'shared' / 'tokenizers' / 'qwen3']:
        if (d / 'tokenizer_config.json').is_file():
            return d
    return None


class _ForwardClock:
    """Seconds spent inside ``model.forward`` (hooks), for the generate loop's own forward time."""

    def __init__(self, model):
        self.seconds, self.calls, self._t0 = 0.0, 0, None
        self._h = [model.register_forward_pre_hook(self._pre), model.register_forward_hook(self._post)]

    def _pre(self, *a):
        self._t0 = time.perf_counter()

    def _post(self, *a):
        self.seconds += time.perf_counter() - self._t0
        self.calls += 1

    def close(self):
        for h in self._h:
            h.remove()


def _generate_sampler(hf, seed: int):
    """An HFSampler whose ``sample`` is ``model.generate`` + ``compute_transition_scores`` (the user's loop)."""
    import torch

    class GenerateSampler(hf.HFSampler):
        calls = 0

        def sample(self, prompts, generators=None, *, max_new_tokens=None, teacher=None):
            prompts = [list(p) for p in prompts]
            budgets = self._budgets(prompts, max_new_tokens, None)
            ids, mask, _ = self._left_pad(prompts)
            torch.manual_seed(seed * 1000 + self.calls)
            self.calls += 1
            out = self.model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=max(budgets), do_sample=True,
                                      temperature=1.0, top_k=0, top_p=1.0, output_scores=True,
                                      return_dict_in_generate=True, eos_token_id=sorted(self.stop_ids),
                                      pad_token_id=self.pad_id)
            scores = self.model.compute_transition_scores(out.sequences, out.scores, normalize_logits=True)
            turns = []
            for b, p in enumerate(prompts):
                gen = out.sequences[b, ids.shape[1]:].tolist()
                n = budgets[b]
                for j, t in enumerate(gen[:n]):
                    if t in self.stop_ids:
                        n = j + 1
                        break
                turn = hf.SampledTurn(ids=gen[:n], logp=scores[b, :n].double().tolist(), prompt_len=len(p))
                turn.truncated = not (turn.ids and turn.ids[-1] in self.stop_ids)
                turns.append(turn)
            return turns

    return GenerateSampler


def multi_turn(model, tok, episodes: int, turns: int, new_tokens: int, seed: int = 0, reprefill: bool = True) -> dict:
    """The three BugFix variants side by side (see the module docstring); returns their numbers."""
    import torch

    import agentrl as arl
    from agentrl.engines import hf
    from agentrl.jobs.bugfix import BugFixOptions, bugfix_rollouts
    tasks_all = arl.make_tasks('all')
    tasks = [tasks_all[i % len(tasks_all)] for i in range(episodes)]
    template = arl.ChatTemplate(tok, tools=arl.TOOL_SCHEMAS)
    spec = arl.SamplingSpec()
    kw = dict(seed=seed, max_turns=turns, batch_size=episodes)
    pad = hf.pad_token_id(tok, model)
    bugfix_rollouts(model, tok, tasks[:2], BugFixOptions(spec=spec, max_new_tokens=4, max_turns=2), template=template)  # warm-up
    out = {}
    for name, reuse in (('agentrl', True), ('agentrl_reprefill', False))[:2 if reprefill else 1]:
        prof: dict = {}
        s = hf.HFSampler(model, template.stop_ids, spec, max_new_tokens=new_tokens, pad_id=pad)
        t0 = time.perf_counter()
        trajs = bugfix_rollouts(model, tok, tasks, BugFixOptions(reuse_cache=reuse, **kw), template=template, sampler=s,
                                profile=prof)
        wall = time.perf_counter() - t0
        tot = prof['totals']
        out[name] = {'wall_s': wall, 'forward_s': tot['forward_s'], 'sample_s': tot['sample_s'],
                     'template_s': tot['template_s'], 'gym_s': tot['gym_s'],
                     'fed_per_episode': (tot['prefill_tokens'] + tot['decode_tokens']) / episodes,
                     'record_per_episode': tot['record_tokens'] / episodes,
                     'rebuilt_per_episode': tot['rebuilt_tokens'] / episodes,
                     'sampled': sum(int(t.action_mask.sum()) for t in trajs),
                     'turns': sum(len(t.info['turn_tokens']) for t in trajs), 'profile': prof, 'trajs': trajs}
    if reprefill:
        a, b = out['agentrl']['trajs'], out['agentrl_reprefill']['trajs']
        same = [torch.equal(x.ids, y.ids) for x, y in zip(a, b)]
        out['same_ids'] = sum(same)
        out['max_logp_diff'] = max((float((x.sample_logp - y.sample_logp).abs().max())
                                    for x, y, s in zip(a, b, same) if s), default=float('nan'))
    Gen = _generate_sampler(hf, seed)
    g = Gen(model, template.stop_ids, spec, max_new_tokens=new_tokens, pad_id=pad)
    clock = _ForwardClock(model)
    t0 = time.perf_counter()
    trajs = bugfix_rollouts(model, tok, tasks, BugFixOptions(**kw), template=template, sampler=g)
    wall = time.perf_counter() - t0
    clock.close()
    out['generate'] = {'wall_s': wall, 'forward_s': clock.seconds, 'sampled': sum(int(t.action_mask.sum()) for t in trajs),
                       'turns': sum(len(t.info['turn_tokens']) for t in trajs),
                       'record_per_episode': sum(len(t.ids) for t in trajs) / episodes}
    for v in ('agentrl', 'agentrl_reprefill'):
        if v in out:
            out[v].pop('trajs')
    return out


def scaling(model, tok, episodes: int, turn_counts, new_tokens: int, seed: int = 0) -> dict:
    """Wall time against turns, with and without the cross-turn cache, scripted tool observations."""
    import agentrl as arl
    from agentrl.engines import hf
    from agentrl.jobs.bugfix import bugfix_opening
    from agentrl.templates import ChatRecorder
    template = arl.ChatTemplate(tok, tools=arl.TOOL_SCHEMAS)
    tasks = arl.make_tasks('all')
    pad = hf.pad_token_id(tok, model)

    listing = arl.compact_source(arl.CLAMP_BUGGY)

    def respond(i, turn, text):          # a source listing (~100 tokens) every turn, never done
        return hf.Reply(messages=[{'role': 'tool', 'content': f'{listing}\ntests: {i % 5} of 5 pass'}])

    res = {'turns': list(turn_counts), 'agentrl': [], 'agentrl_reprefill': [], 'fed_agentrl': [], 'fed_reprefill': []}
    for n_turns in turn_counts:
        for name, reuse in (('agentrl', True), ('agentrl_reprefill', False)):
            recs = [ChatRecorder(template, bugfix_opening(tasks[i % len(tasks)].issue)) for i in range(episodes)]
            s = hf.HFSampler(model, template.stop_ids, arl.SamplingSpec(), max_new_tokens=new_tokens, pad_id=pad)
            prof: dict = {}
            t0 = time.perf_counter()
            hf.run_chat_episodes(s, recs, respond, seeds=[seed + i for i in range(episodes)], max_turns=n_turns,
                                 batch_size=episodes, reuse_cache=reuse, profile=prof)
            res[name].append(time.perf_counter() - t0)
            fed = (prof['totals']['prefill_tokens'] + prof['totals']['decode_tokens']) / episodes
            res['fed_agentrl' if reuse else 'fed_reprefill'].append(fed)
    for name in ('agentrl', 'agentrl_reprefill'):
        res[f'slope_{name}'] = _slope(res['turns'], res[name])
    return res


def _slope(x, y) -> float:
    lx, ly = [math.log(v) for v in x], [math.log(v) for v in y]
    mx, my = sum(lx) / len(lx), sum(ly) / len(ly)
    return sum((a - mx) * (b - my) for a, b in zip(lx, ly)) / sum((a - mx) ** 2 for a in lx)


def single_turn(model, tok, prompts: int = 16, prompt_len: int = 300, new_tokens: int = 64, seed: int = 0) -> dict:
    """One turn for 16 prompts: HFSampler vs model.generate vs generate + compute_transition_scores."""
    import torch

    import agentrl as arl
    from agentrl.engines import hf
    template = arl.ChatTemplate(tok)
    g = torch.Generator().manual_seed(seed)
    ps = []
    for i in range(prompts):
        n = prompt_len - 20 + i * 3
        body = torch.randint(1000, 100000, (n,), generator=g).tolist()
        ps.append(template.encode(template.render([{'role': 'user', 'content': 'Fix it.'}], True)) + body)
    stop = template.stop_ids
    s = hf.HFSampler(model, (), arl.SamplingSpec(), max_new_tokens=new_tokens)   # no stop: every row 64 tokens
    s.sample(ps[:2], max_new_tokens=2)
    t0 = time.perf_counter()
    s.sample(ps, [torch.Generator().manual_seed(seed + i) for i in range(prompts)])
    ours = time.perf_counter() - t0
    ids, mask, _ = s._left_pad(ps)
    res = {'agentrl': ours}
    for name, scores in (('generate', False), ('generate_scores', True)):
        torch.manual_seed(seed)
        t0 = time.perf_counter()
        out = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=new_tokens, min_new_tokens=new_tokens,
                             do_sample=True, temperature=1.0, top_k=0, top_p=1.0, output_scores=scores,
                             return_dict_in_generate=True, pad_token_id=s.pad_id)
        if scores:
            model.compute_transition_scores(out.sequences, out.scores, normalize_logits=True)
        res[name] = time.perf_counter() - t0
    del stop
    return res


def _models(tmp: str, quick: bool, model_dir, small_dir):
    from agentrl.engines import hf
    tdir = _tokenizer_dir()
    if small_dir is None:
        if tdir is None:
            return None, None
        small_dir = hf.make_test_model(Path(tmp) / 'small', tdir)
    if quick:
        return small_dir, small_dir
    if model_dir is None:
        if tdir is None:
            return None, None
        model_dir = hf.make_test_model(Path(tmp) / 'big', tdir, **BIG)
    return model_dir, small_dir


def measure(quick: bool = False, model_dir=None, small_dir=None, episodes=None, turns=None, new_tokens=None,
            turn_counts=None, scaling_episodes=None, repeat: int = 1, reprefill: bool = True) -> dict:
    """All three sections; ``repeat`` repeats the multi-turn section (each repeat side by side)."""
    from agentrl.engines import hf
    episodes = episodes or (8 if quick else 32)
    turns = turns or (3 if quick else 6)
    new_tokens = new_tokens or (16 if quick else 32)
    turn_counts = turn_counts or ((2, 4, 8) if quick else (2, 4, 8, 16))
    scaling_episodes = scaling_episodes or 4
    with tempfile.TemporaryDirectory() as tmp:
        big_dir, small_dir = _models(tmp, quick, model_dir, small_dir)
        if big_dir is None:
            return {'skipped': 'no qwen3 tokenizer (set AGENTRL_TOKENIZERS)'}
        model, tok = hf.load_model(big_dir)
        params = sum(p.numel() for p in model.parameters())
        runs = [multi_turn(model, tok, episodes, turns, new_tokens, reprefill=reprefill and k == 0)
                for k in range(repeat)]
        sc = scaling(model, tok, scaling_episodes, turn_counts, 16)
        small, stok = hf.load_model(small_dir)
        st = single_turn(small, stok, new_tokens=16 if quick else 64)
    return {'params': params, 'episodes': episodes, 'turns': turns, 'new_tokens': new_tokens, 'multi_turn': runs,
            'scaling': sc, 'single_turn': st, 'scaling_episodes': scaling_episodes}


def rows(m: dict, quick: bool) -> list[dict]:
    """Bench rows (name, value, unit, notes, target, ok) from :func:`measure`."""
    if 'skipped' in m:
        return [{'name': 'engine_hf', 'value': None, 'unit': '', 'notes': f'skipped: {m["skipped"]}'}]
    out = []
    setup = (f'{m["episodes"]} BugFix episodes, {m["turns"]} turns of <= {m["new_tokens"]} tokens, '
             f'{m["params"] / 1e6:.1f}M-parameter Qwen3, T=1, 1 thread')
    for k, r in enumerate(m['multi_turn']):
        a, p, g = r['agentrl'], r.get('agentrl_reprefill'), r['generate']
        tag = f'_{k}' if len(m['multi_turn']) > 1 else ''
        speed = (g['wall_s'] / g['sampled']) / (a['wall_s'] / a['sampled'])
        out += [
            {'name': f'hf_agentrl_s{tag}', 'value': round(a['wall_s'], 2), 'unit': 's',
             'notes': f'{setup}; cross-turn cache; {a["sampled"]} sampled tokens in {a["turns"]} turns; forward '
                      f'{a["forward_s"]:.2f} s, sampling {a["sample_s"]:.2f} s, template {a["template_s"]:.2f} s, '
                      f'gym {a["gym_s"]:.3f} s'},
            {'name': f'hf_generate_s{tag}', 'value': round(g['wall_s'], 2), 'unit': 's',
             'notes': f'model.generate(output_scores) + compute_transition_scores per turn; {g["sampled"]} sampled '
                      f'tokens in {g["turns"]} turns; its forward {g["forward_s"]:.2f} s'},
            {'name': f'hf_speedup_vs_generate{tag}', 'value': round(speed, 2), 'unit': 'x', 'target': '>= 3',
             'ok': speed >= 3, 'notes': f'per sampled token (wall): {g["wall_s"]:.2f} s / {g["sampled"]} vs '
                                        f'{a["wall_s"]:.2f} s / {a["sampled"]}; wall ratio '
                                        f'{g["wall_s"] / a["wall_s"]:.2f}x'},
            {'name': f'hf_wall_over_forward{tag}', 'value': round(a['wall_s'] / a['forward_s'], 3), 'unit': 'x',
             'target': '<= 1.3', 'ok': a['wall_s'] / a['forward_s'] <= 1.3,
             'notes': f'agentrl wall {a["wall_s"]:.2f} s / its forward passes {a["forward_s"]:.2f} s'},
            {'name': f'hf_fed_tokens_per_episode{tag}', 'value': round(a['fed_per_episode'], 1), 'unit': 'tok',
             'target': '== record length - 1 + rebuilt',
             'ok': abs(a['fed_per_episode'] - (a['record_per_episode'] - 1 + a['rebuilt_per_episode'])) < 1e-9,
             'notes': f'record length {a["record_per_episode"]:.1f}, rebuilt {a["rebuilt_per_episode"]:.1f}'
                      + (f'; re-prefill feeds {p["fed_per_episode"]:.1f} per episode' if p else '')},
        ]
        if p:
            out.insert(len(out) - 5, {
                'name': f'hf_reprefill_s{tag}', 'value': round(p['wall_s'], 2), 'unit': 's',
                'notes': f'same, reuse_cache=False; forward {p["forward_s"]:.2f} s; same ids in {r["same_ids"]}/'
                         f'{m["episodes"]} episodes (fp32: a draw within rounding of a CDF boundary may pick a '
                         f'neighbour), max |logp diff| {r["max_logp_diff"]:.2e}'})
    sc = m['scaling']
    for name, key in (('agentrl', 'agentrl'), ('reprefill', 'agentrl_reprefill')):
        slope = sc[f'slope_{key}']
        row = {'name': f'hf_turn_slope_{name}', 'value': round(slope, 3), 'unit': '',
               'notes': f'{m["scaling_episodes"]} episodes, turns {sc["turns"]}: '
                        + ', '.join(f'{t:.2f}' for t in sc[key]) + ' s; fed tokens per episode '
                        + ', '.join(f'{f:.0f}' for f in sc['fed_agentrl' if key == 'agentrl' else 'fed_reprefill'])}
        if key == 'agentrl':
            row.update(target='<= 1.2', ok=slope <= 1.2)
        out.append(row)
    st = m['single_turn']
    out += [{'name': 'hf_single_turn_s', 'value': round(st['agentrl'], 2), 'unit': 's',
             'notes': f'16 prompts of ~300 ids, {16 if quick else 64} new tokens, 2-layer test model: HFSampler; '
                      f'generate {st["generate"]:.2f} s, + scores {st["generate_scores"]:.2f} s'},
            {'name': 'hf_single_turn_lead', 'value': round(st['generate_scores'] / st['agentrl'], 2), 'unit': 'x',
             'target': '>= 1.7 (generate+scores / HFSampler)', 'ok': st['generate_scores'] / st['agentrl'] >= 1.7,
             'notes': f'over plain generate: {st["generate"] / st["agentrl"]:.2f}x'}]
    return out


def run(quick: bool, model_dir: str | None = None) -> list[dict]:
    """Rows for bench/run.py."""
    try:
        import jinja2  # noqa: F401
        import transformers  # noqa: F401
    except ImportError as e:
        return [{'name': 'engine_hf', 'value': None, 'unit': '', 'notes': f'skipped: needs agentrl[hf] ({e})'}]
    os.environ.setdefault('HF_HUB_OFFLINE', '1')
    return rows(measure(quick, model_dir), quick)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    ap.add_argument('--quick', action='store_true', help='the 2-layer model everywhere, 8 episodes, short turns')
    ap.add_argument('--model', default=None, help='multi-turn model folder (default: build the 96.5M test model)')
    ap.add_argument('--small', default=None, help='single-turn model folder (default: build the 2-layer test model)')
    ap.add_argument('--episodes', type=int, default=None, help='episodes (default 32; 8 with --quick)')
    ap.add_argument('--turns', type=int, default=None, help='turns per episode (default 6)')
    ap.add_argument('--new-tokens', type=int, default=None, help='token budget of a turn (default 32)')
    ap.add_argument('--repeat', type=int, default=1, help='repeat the multi-turn comparison (default 1)')
    ap.add_argument('--scaling', default=None, help='turn counts of the scaling run (default 2,4,8,16)')
    ap.add_argument('--scaling-episodes', type=int, default=None, help='episodes of the scaling run (default 8)')
    ap.add_argument('--threads', type=int, default=1, help='torch threads (default 1)')
    ap.add_argument('--no-reprefill', action='store_true', help='skip the reuse_cache=False variant')
    ap.add_argument('--malloc', choices=('default', 'keep'), default='default',
                    help='keep: re-run with glibc keeping freed blocks up to 64 MiB ([32, V] float64 sampling '
                         'buffers are 39 MiB) instead of returning them to the OS (bench/run.py --malloc keep)')
    ap.add_argument('--json', default=None, help='also write the raw numbers here')
    args = ap.parse_args(argv)
    if args.malloc == 'keep' and any(os.environ.get(k) != v for k, v in KEEP_MALLOC.items()):
        os.execve(sys.executable, [sys.executable, os.path.abspath(__file__), *(sys.argv[1:] if argv is None else argv)],
                  dict(os.environ, **KEEP_MALLOC))
    import torch
    torch.set_num_threads(args.threads)
    os.environ.setdefault('HF_HUB_OFFLINE', '1')
    counts = tuple(int(x) for x in args.scaling.split(',')) if args.scaling else None
    m = measure(args.quick, args.model, args.small, args.episodes, args.turns, args.new_tokens, counts,
                args.scaling_episodes, args.repeat, not args.no_reprefill)
    m['malloc'] = args.malloc
    if args.json:
        Path(args.json).write_text(json.dumps(m, indent=1, default=str))
    for r in rows(m, args.quick):
        v = '-' if r['value'] is None else r['value']
        ok = '' if 'ok' not in r else (' ok' if r['ok'] else ' MISSED')
        print(f"{r['name']:<28} {v!s:>9} {r['unit']:<4}{ok:<7} {r['notes']}")
    return 0


if __name__ == '__main__':
    sys.exit(main())
