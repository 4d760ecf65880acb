"""Benchmark recording speed per turn: agentrl, the naive re-render, and a peer's bridges, on the same episodes.

Builds ``--episodes`` Qwen3 tool episodes of ``--turns`` turns (each turn a short reasoning block and a Hermes
``<tool_call>``, every fifth one malformed; each observation a tool message of 40-160 code words), with the
sampled ids being the turn text's own encoding plus ``<|im_end|>``. Each episode ends with a tool result, so
every way ends at the same next prompt. Then times, best of ``--repeat``, the recording of all episodes:

- ``agentrl ChatRecorder``: ``ChatRecorder(template, opening)``, ``add_turn`` / ``add_messages`` per turn,
  ``finish()`` (the verification render, ``Trajectory.from_tokens``) and the per-turn call statuses
  (:func:`agentrl.families.record_calls.record_calls`), the template built once outside the timing;
- ``agentrl gateway record path``: the gateway's sessions (``Session.plan`` / ``commit``: the reply parsed
  by the family) and :func:`agentrl.gateway.records.session_records` (one recorder per branch and record,
  statuses stored), without HTTP or an engine; its session ends at its last call (no final tool result);
- ``naive re-render``: ``tokenizer.apply_chat_template(messages so far, tools, add_generation_prompt=True,
  tokenize=True)`` before every turn (the O(T^2) way; it keeps no ownership);
- ``renderers 0.1.12 (verifiers)``: PrimeIntellect's ``Qwen3Renderer``: ``render_ids`` of the opening, then per
  turn ``parse_response`` of the sampled ids and ``bridge_to_next_turn`` (a full ``render_ids`` when it
  declines). It runs in another interpreter (``--peer-python``, a throwaway venv with ``renderers`` and
  ``transformers``; never a dependency of agentrl), in this same file with ``--leg renderers``.

Prints CPU and wall ms per turn, each way's CPU ratio to agentrl's ChatRecorder, and whether the final prompt
ids of every episode agree across the ways. Usage (bench/RESULTS.md):

    python3 -m venv .venv-bench && .venv-bench/bin/pip install renderers==0.1.12 transformers==5.25.0
    PYTHONPATH=src .venv/bin/python bench/bench_recording.py [--episodes 16] [--turns 6] [--repeat 5] \\
        [--peer-python .venv-bench/bin/python] [--tokenizer DIR]
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
WORDS = ('def return value lower upper clamp min max assert self if else for in range index item total '
         'count result left right mid x y z n i j k = + - * ( ) : , [ ] 0 1 2 3 10 100').split()
TOOL_NAMES = ('read', 'test', 'edit', 'submit')
TOOLS = [{'type': 'function', 'function': {'name': n, 'description': f'{n} the source file',
                                           'parameters': {'type': 'object', 'properties': {
                                               'path': {'type': 'string', 'description': 'file path'}}}}}
         for n in TOOL_NAMES]


def tokenizer_dir(arg: str | None) -> Path:
    if arg:
        return Path(arg)
    return Path(os.environ.get('AGENTRL_TOKENIZERS', ROOT.parent / 'shared' / 'tokenizers')) / 'qwen3'


def load_tokenizer(path: Path):
    os.environ.setdefault('HF_HUB_OFFLINE', '1')
    from transformers import AutoTokenizer
    return AutoTokenizer.from_pretrained(str(path))


def build_episodes(tok, n: int, turns: int, seed: int = 0) -> list:
    """``[{'opening': [msg], 'turns': [(text, ids)], 'observations': [str]}]``, the same in every interpreter."""
    rng = random.Random(seed)
    eot = tok.convert_tokens_to_ids('<|im_end|>')
    out = []
    for e in range(n):
        opening = [{'role': 'system', 'content': 'You fix bugs in Python functions. Use the tools.'},
                   {'role': 'user', 'content': f'Fix the bug in task {e}: ' + ' '.join(rng.choices(WORDS, k=30))}]
        ts, obs = [], []
        for k in range(turns):
            think = ' '.join(rng.choices(WORDS, k=rng.randint(10, 30)))
            name = rng.choice(TOOL_NAMES)
            args = f'{{"path": "src/f{e}_{k}.py"}}' if (e + k) % 5 else '{"path": src/broken.py}'
            text = f'<think>\n{think}\n</think>\n\n<tool_call>\n{{"name": "{name}", "arguments": {args}}}\n</tool_call>'
            ts.append((text, tok.encode(text, add_special_tokens=False) + [eot]))
            obs.append(' '.join(rng.choices(WORDS, k=rng.randint(40, 160))))
        out.append({'opening': opening, 'turns': ts, 'observations': obs})
    return out


def digest(ids) -> str:
    return hashlib.sha256(json.dumps([int(i) for i in ids]).encode()).hexdigest()[:12]


def best_of(run, repeat: int) -> tuple:
    """``((best CPU seconds, best wall seconds), the run's result)`` over ``repeat`` runs (CPU: this process's
    ``time.process_time``, steady on a shared machine; wall: ``time.perf_counter``)."""
    cpu = wall = float('inf')
    result = None
    for _ in range(repeat):
        c0, t0 = time.process_time(), time.perf_counter()
        result = run()
        cpu, wall = min(cpu, time.process_time() - c0), min(wall, time.perf_counter() - t0)
    return (cpu, wall), result


# ---------------------------------------------------------------------------- the ways
def agentrl_recorder(tok, episodes: list) -> callable:
    from agentrl.families import QWEN3
    from agentrl.families.record_calls import record_calls, tool_names
    from agentrl.templates import ChatRecorder, ChatTemplate
    template = ChatTemplate(tok, tools=TOOLS)
    names = tool_names(TOOLS)

    def run():
        finals = []
        for ep in episodes:
            rec = ChatRecorder(template, ep['opening'])
            for (text, ids), obs in zip(ep['turns'], ep['observations']):
                rec.add_turn(ids, [-0.5] * len(ids))
                rec.add_messages([{'role': 'tool', 'content': obs}])
            finals.append(digest(rec.prompt_ids))
            traj = rec.finish(reward=1.0)
            traj.info['turn_calls'] = record_calls(traj, QWEN3, template, names)
        return finals
    return run


def agentrl_gateway(tok, episodes: list) -> callable:
    from agentrl.engines.contract import TurnResult
    from agentrl.families import QWEN3
    from agentrl.gateway.parse import parse_reply
    from agentrl.gateway.records import session_records
    from agentrl.gateway.sessions import Session
    from agentrl.record import SamplingSpec
    from agentrl.templates import ChatTemplate
    from agentrl.templates.messages import function_tools
    template = ChatTemplate(tok, tools=TOOLS)
    tools_key = json.dumps(function_tools(TOOLS), sort_keys=True)

    def run():
        finals = []
        for e, ep in enumerate(episodes):
            s = Session(f's{e}', {})
            s.spec = SamplingSpec()
            msgs = list(ep['opening'])
            for k, ((text, ids), obs) in enumerate(zip(ep['turns'], ep['observations'])):
                plan = s.plan(msgs, tools_key, template, QWEN3)
                message = parse_reply(text, QWEN3, id_seed=f's{e}/{k}', think_open=False)
                s.commit(plan, TurnResult(ids=ids, logp=[-0.5] * len(ids), truncated=False, seed=k), message,
                         {'index': k, 'digest': str(k), 'seed': k, 'response': {}, 'version': '0'})
                msgs = msgs + [message, {'role': 'tool', 'content': obs}]
            (traj,) = session_records(s, 'bench', family=QWEN3)   # the session ends after its last call
            finals.append(None)
        return finals
    return run


def naive(tok, episodes: list) -> callable:
    def run():
        finals = []
        for ep in episodes:
            msgs = list(ep['opening'])
            for (text, ids), obs in zip(ep['turns'], ep['observations']):
                tok.apply_chat_template(msgs, tools=TOOLS, add_generation_prompt=True, tokenize=True)
                msgs = msgs + [{'role': 'assistant', 'content': text}, {'role': 'tool', 'content': obs}]
            out = tok.apply_chat_template(msgs, tools=TOOLS, add_generation_prompt=True, tokenize=True)
            finals.append(digest(out['input_ids'] if isinstance(out, dict) or hasattr(out, 'keys') else out))
        return finals
    return run


def renderers_way(tok, episodes: list) -> callable:
    from renderers.configs import Qwen3RendererConfig
    from renderers.qwen3 import Qwen3Renderer
    r = Qwen3Renderer(tok, Qwen3RendererConfig())
    specs = TOOLS                          # written as given: the OpenAI form is what the Jinja template writes
    stats = {'rerendered': 0, 'bridged': 0, 'calls': 0}

    def run():
        finals = []
        for ep in episodes:
            msgs = list(ep['opening'])
            prompt = r.render_ids(msgs, tools=specs, add_generation_prompt=True)
            for (text, ids), obs in zip(ep['turns'], ep['observations']):
                parsed = r.parse_response(ids, tools=specs, prompt_ids=prompt)
                stats['calls'] += len(parsed.tool_calls or ())
                tool = {'role': 'tool', 'content': obs}
                ext = r.bridge_to_next_turn(prompt, ids, [tool], tools=specs)
                msgs = msgs + [{'role': 'assistant', 'content': text}, tool]
                if ext is None:
                    stats['rerendered'] += 1
                    prompt = r.render_ids(msgs, tools=specs, add_generation_prompt=True)
                else:
                    stats['bridged'] += 1
                    prompt = ext.token_ids
            finals.append(digest(prompt))
        return finals
    return run, stats


# ---------------------------------------------------------------------------- main
def peer_leg(args) -> None:
    """``--leg renderers``: time the peer here (its own interpreter) and print one JSON line."""
    import renderers
    tok = load_tokenizer(tokenizer_dir(args.tokenizer))
    episodes = build_episodes(tok, args.episodes, args.turns)
    run, stats = renderers_way(tok, episodes)
    run()
    stats.update(rerendered=0, bridged=0, calls=0)
    sec, finals = best_of(run, args.repeat)
    print(json.dumps({'seconds': sec, 'finals': finals, 'version': renderers.__version__,
                      'stats': {k: v // args.repeat for k, v in stats.items()}}))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument('--episodes', type=int, default=16)
    p.add_argument('--turns', type=int, default=6)
    p.add_argument('--repeat', type=int, default=5)
    p.add_argument('--tokenizer', default=None, help='Qwen3 tokenizer folder (default ../shared/tokenizers/qwen3)')
    p.add_argument('--peer-python', default=str(ROOT / '.venv-bench' / 'bin' / 'python'),
                   help="an interpreter with renderers and transformers installed ('' skips the peer)")
    p.add_argument('--leg', choices=('renderers',), default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.leg:
        peer_leg(args)
        return 0
    tok = load_tokenizer(tokenizer_dir(args.tokenizer))
    episodes = build_episodes(tok, args.episodes, args.turns)
    n_turns = args.episodes * args.turns
    rows = []
    for name, make in (('agentrl ChatRecorder', agentrl_recorder), ('agentrl gateway record path', agentrl_gateway),
                       ('naive re-render (apply_chat_template per turn)', naive)):
        run = make(tok, episodes)
        run()                                            # warm: template probes and caches, Jinja compiled
        sec, finals = best_of(run, args.repeat)
        rows.append((name, sec, finals, ''))
    if args.peer_python:
        if not Path(args.peer_python).exists():
            print(f'peer skipped: {args.peer_python} does not exist (see the module docstring)', file=sys.stderr)
        else:
            env = dict(os.environ, PYTHONPATH='')
            out = subprocess.run([args.peer_python, __file__, '--leg', 'renderers', '--episodes', str(args.episodes),
                                  '--turns', str(args.turns), '--repeat', str(args.repeat),
                                  '--tokenizer', str(tokenizer_dir(args.tokenizer))],
                                 capture_output=True, text=True, env=env, check=True)
            res = json.loads(out.stdout.strip().splitlines()[-1])
            note = f"bridged {res['stats']['bridged']}, re-rendered {res['stats']['rerendered']}"
            rows.append((f"renderers {res['version']} (verifiers' bridges)", tuple(res['seconds']), res['finals'],
                         note))
    base = rows[0][1][0]
    lengths = [len(ep['turns']) for ep in episodes]
    print(f'{args.episodes} Qwen3 episodes x {args.turns} turns ({sum(lengths)} turns), best of {args.repeat}')
    print(f'{"way":<48} {"CPU ms/turn":>11} {"vs agentrl":>10} {"wall ms/turn":>12}  same final ids')
    for name, (cpu, wall), finals, note in rows:
        same = sum(a == b for a, b in zip(finals, rows[0][2]))
        shown = f'{same}/{len(finals)}' if finals[0] is not None else 'n/a (ends at its last call)'
        print(f'{name:<48} {cpu / n_turns * 1000:11.3f} {cpu / base:9.2f}x {wall / n_turns * 1000:12.3f}  {shown}'
              + (f'  ({note})' if note else ''))
    return 0


if __name__ == '__main__':
    sys.exit(main())
