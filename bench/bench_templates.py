"""Benchmark agentrl.templates.ChatRecorder: recording a long tool episode must cost O(total tokens).

Builds a Qwen3 thinking-mode tool episode (default 50 turns, about 30k tokens: each turn a short
reasoning block and a ``<tool_call>``, each observation ~500 tokens of source text), then times,
best of ``--repeat`` (interleaved):

- ``encode``: one ``tokenizer(final_text)`` of the final rendering (the yardstick);
- ``ChatRecorder``: recording the episode token-in/token-out (owners, bridges, contexts, the
  final verification render and ``Trajectory.from_tokens``), with the ``ChatTemplate`` reused
  across episodes (``warm``) and built fresh for the episode (``cold``: probes and bridge shapes);
- ``re-render``: the O(T^2) way: ``apply_chat_template(messages so far, tokenize=True)`` before
  every turn.

It checks that the recorder's ids equal ``apply_chat_template`` of the whole conversation and
prints a table (``--scaling`` adds 10/25/50/100-turn rows). Source: issue 3, "Benchmark (bench/)":
recording must cost at most 2x one encode of the final text.

``--audit`` times ``agentrl template audit qwen3 --messages n.json`` instead (the command's work,
:func:`agentrl.templates.audit_template`, in process) on tool-loop conversations of 1k, 4k and 16k
messages (a system message, a user message, then assistant calls and tool results), and checks that
the time grows near-linearly: log-log slope from the smallest to the largest size <= 1.2.

Usage:
    .venv/bin/python bench/bench_templates.py [--turns 50] [--repeat 7] [--scaling] [--tokenizer DIR]
    .venv/bin/python bench/bench_templates.py --audit [--sizes 1000 4000 16000] [--repeat 3]
"""
from __future__ import annotations

import argparse
import os
import random
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
WORDS = ('def return value lower upper clamp min max assert self if else for in range index item total '
         'count result left right mid x y z n i j k = + - * ( ) : , [ ] 0 1 2 3 10 100').split()


def tokenizer_dir(arg: str | None) -> Path:
    if arg:
        return Path(arg)
    from agentrl.templates.chat import find_tokenizer_dir
    try:
        return find_tokenizer_dir('qwen3', hub=False)
    except FileNotFoundError:
        return ROOT.parent / 'shared' / 'tokenizers' / 'qwen3'


def audit_messages(n: int) -> list:
    """A tool-loop conversation of ``n`` messages (the shape of a long agent log)."""
    msgs = [{'role': 'system', 'content': 'You fix bugs.'}, {'role': 'user', 'content': 'Fix clamp.'}]
    k = 0
    while len(msgs) < n:
        msgs.append({'role': 'assistant', 'content': f'read(path="f{k}.py")'})
        msgs.append({'role': 'tool', 'content': f'def f{k}(x): return x'})
        k += 1
    return msgs[:n]


def run_audit(tok, sizes, repeat: int) -> int:
    """Time audit_template on each size; print the table and the log-log slope; 0 when slope <= 1.2."""
    import math

    import agentrl.templates as tt
    rows = []
    for n in sizes:
        msgs = audit_messages(n)
        best, wall = float('inf'), float('inf')
        for _ in range(repeat):
            t, w = time.process_time(), time.perf_counter()
            report = tt.audit_template(tok, msgs)
            best, wall = min(best, time.process_time() - t), min(wall, time.perf_counter() - w)
        rows.append((n, best, wall, report.prefix.audited, sum(report.owner_counts.values())))
    print(f'agentrl template audit qwen3 --messages n.json (audit_template in process, best of {repeat}; '
          'CPU seconds of this process, wall seconds beside)')
    print(f'{"messages":>8} {"tokens":>8} {"cpu s":>8} {"wall s":>8} {"audited":>8}')
    for n, sec, wall, audited, tokens in rows:
        print(f'{n:>8} {tokens:>8} {sec:>8.2f} {wall:>8.2f} {audited if audited is not None else n:>8}')
    (n0, t0, *_), (n1, t1, *_) = rows[0], rows[-1]
    slope = math.log(t1 / t0) / math.log(n1 / n0)
    print(f'log-log slope {n0} -> {n1} messages: {slope:.2f} (target <= 1.2) -> {"PASS" if slope <= 1.2 else "FAIL"}')
    return 0 if slope <= 1.2 else 1


def make_episode(tok, turns: int, obs_words: int = 400, seed: int = 0):
    """(opening, [(sampled turn ids, logp)], [observation message], full messages)."""
    rng = random.Random(seed)

    def words(n):
        lines, line = [], []
        for _ in range(n):
            line.append(rng.choice(WORDS))
            if len(line) >= rng.randint(6, 12):
                lines.append(' '.join(line))
                line = []
        return '\n'.join(lines + [' '.join(line)]).strip()

    opening = [{'role': 'user', 'content': 'clamp(value, lower, upper) returns the wrong value. Fix it.'}]
    sampled, observations, messages = [], [], list(opening)
    for k in range(turns):
        text = (f'<think>\n{words(28)}\n</think>\n\n<tool_call>\n{{"name": "read", "arguments": {{}}}}\n'
                '</tool_call>')
        ids = tok(text + '<|im_end|>', add_special_tokens=False)['input_ids']
        sampled.append((ids, [-0.5] * len(ids)))
        obs = {'role': 'tool', 'content': words(obs_words)}
        observations.append(obs)
        messages += [{'role': 'assistant', 'content': text}, obs]
    return opening, sampled, observations, messages


def record(template_or_tok, opening, sampled, observations, tools=None):
    import agentrl.templates as tt
    rec = tt.ChatRecorder(template_or_tok, opening, tools=tools)
    for (ids, logp), obs in zip(sampled, observations):
        rec.add_turn(ids, logp)
        rec.add_messages([obs])
    return rec.finish(reward=1.0)


def rerender_each_turn(tok, tools, messages):
    """The O(T^2) way: re-render and re-tokenize the whole conversation before every turn."""
    out = None
    for i in range(1, len(messages) + 1):
        if i == len(messages) or messages[i]['role'] == 'assistant':
            out = tok.apply_chat_template(messages[:i], tools=tools, add_generation_prompt=True,
                                          return_dict=True)['input_ids']
    return out


def best_of(fns: dict, repeat: int) -> dict:
    """Best wall time (s) of each function, runs interleaved."""
    best = {k: float('inf') for k in fns}
    for _ in range(repeat):
        for k, f in fns.items():
            t = time.perf_counter()
            f()
            best[k] = min(best[k], time.perf_counter() - t)
    return best


def run_one(tok, turns: int, repeat: int, tools) -> dict:
    import agentrl.templates as tt
    opening, sampled, observations, messages = make_episode(tok, turns)
    template = tt.ChatTemplate(tok, tools=tools)
    traj = record(template, opening, sampled, observations)
    full = tok.apply_chat_template(messages, tools=template.tools, add_generation_prompt=True,
                                   return_dict=True)['input_ids']
    assert traj.ids.tolist() == full, 'recorder ids differ from apply_chat_template'
    assert traj.info['template']['render_matches'] and traj.turn_contexts is None
    final_text = template.render(messages, True)
    fns = {'encode': lambda: tok(final_text),
           'warm': lambda: record(template, opening, sampled, observations),
           'cold': lambda: record(tok, opening, sampled, observations, tools=tools)}
    if turns <= 100:
        fns['rerender'] = lambda: rerender_each_turn(tok, template.tools, messages)
    t = best_of(fns, repeat)
    t.update(turns=turns, tokens=len(full))
    return t


def run(quick: bool) -> list[dict]:
    """bench/run.py entry: a 50-turn Qwen3 tool episode, recorder vs one encode vs re-render each turn."""
    os.environ.setdefault('HF_HUB_OFFLINE', '1')
    path = tokenizer_dir(None)
    if not (path / 'tokenizer_config.json').is_file():
        return [{'name': 'ChatRecorder 50 turns', 'value': None, 'unit': 'x encode',
                 'notes': f'skipped: no Qwen3 tokenizer at {path}'}]
    try:
        import transformers
    except ImportError:
        return [{'name': 'ChatRecorder 50 turns', 'value': None, 'unit': 'x encode',
                 'notes': 'skipped: transformers not installed (pip install agentrl[hf])'}]
    transformers.logging.set_verbosity_error()
    tok = transformers.AutoTokenizer.from_pretrained(str(path))
    from agentrl.gym import TOOL_SCHEMAS as tools
    r = run_one(tok, 50, 2 if quick else 7, tools)
    notes = f"{r['tokens']:,} tokens, encode {r['encode'] * 1e3:.1f} ms"
    return [{'name': 'ChatRecorder (warm) / one encode, 50 turns', 'value': round(r['warm'] / r['encode'], 2),
             'unit': 'x', 'target': '<= 2', 'ok': r['warm'] / r['encode'] <= 2, 'notes': notes},
            {'name': 'ChatRecorder (cold) / one encode, 50 turns', 'value': round(r['cold'] / r['encode'], 2),
             'unit': 'x', 'notes': notes},
            {'name': 're-render every turn (O(T^2)) / one encode', 'value': round(r['rerender'] / r['encode'], 2),
             'unit': 'x', 'notes': notes}]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    ap.add_argument('--turns', type=int, default=50, help='turns of the episode (default 50)')
    ap.add_argument('--repeat', type=int, default=7, help='runs per timing, best kept (default 7)')
    ap.add_argument('--scaling', action='store_true', help='also time 10, 25, 50 and 100 turns')
    ap.add_argument('--tokenizer', default=None, help='Qwen3 tokenizer folder (default ../shared/tokenizers/qwen3)')
    ap.add_argument('--audit', action='store_true', help='time template audit on 1k/4k/16k-message conversations')
    ap.add_argument('--sizes', type=int, nargs='+', default=[1000, 4000, 16000], help='--audit sizes (messages)')
    args = ap.parse_args(argv)
    os.environ.setdefault('HF_HUB_OFFLINE', '1')
    path = tokenizer_dir(args.tokenizer)
    if not (path / 'tokenizer_config.json').is_file():
        print(f'no Qwen3 tokenizer at {path}; pass --tokenizer DIR or set AGENTRL_TOKENIZERS', file=sys.stderr)
        return 2
    import transformers
    transformers.logging.set_verbosity_error()
    tok = transformers.AutoTokenizer.from_pretrained(str(path))
    if args.audit:
        return run_audit(tok, args.sizes, args.repeat if args.repeat != 7 else 3)
    try:
        from agentrl.gym import TOOL_SCHEMAS as tools
    except ImportError:
        tools = [{'name': 'read', 'description': 'Read the source.',
                  'inputSchema': {'type': 'object', 'properties': {}}}]
    rows = [run_one(tok, n, args.repeat, tools) for n in ((10, 25, 50, 100) if args.scaling else (args.turns,))]
    print(f'ChatRecorder vs one encode of the final text (Qwen3, thinking, {len(tools)} tools, best of {args.repeat})')
    print(f'{"turns":>5} {"tokens":>7} {"encode ms":>9} {"warm ms":>8} {"x enc":>6} {"cold ms":>8} {"x enc":>6}'
          f' {"re-render ms":>12} {"x enc":>6}')
    for r in rows:
        rr = (f'{r["rerender"] * 1e3:>12.1f} {r["rerender"] / r["encode"]:>6.2f}' if 'rerender' in r
              else f'{"-":>12} {"-":>6}')
        print(f'{r["turns"]:>5} {r["tokens"]:>7} {r["encode"] * 1e3:>9.1f} {r["warm"] * 1e3:>8.1f} '
              f'{r["warm"] / r["encode"]:>6.2f} {r["cold"] * 1e3:>8.1f} {r["cold"] / r["encode"]:>6.2f} {rr}')
    target = [r for r in rows if r['turns'] >= 50]
    if not target:
        return 0
    worst = max(r['warm'] / r['encode'] for r in target)
    print(f'target (>= 50 turns): warm recording <= 2.00x encode; worst {worst:.2f}x -> '
          f'{"PASS" if worst <= 2 else "FAIL"}')
    return 0 if worst <= 2 else 1


if __name__ == '__main__':
    sys.exit(main())
