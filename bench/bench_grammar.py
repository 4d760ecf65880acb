"""Grammar-constrained replay (issue 26): ``check --model``'s replay with the xgrammar mask hook vs without, same records.

    PYTHONPATH=src .venv/bin/python bench/bench_grammar.py [--episodes 6] [--rounds 5]

A small random Qwen3 (the real tokenizer, 151,936 logits) samples BugFix episodes under ``tool_choice:
required`` (the hermes structural tag). The same records are then replayed two ways, alternating in one
process on one torch thread (timed in process CPU seconds, which a shared machine's load does not inflate the way
it does wall time; wall medians are printed beside them): "constrained" replays them as stored (the grammar rebuilt over each record's
ids, the mask applied to every action row's logits); "unconstrained" replays the same ids and rows with the
constraint removed and each stored log-prob set to its unconstrained replay, so both runs match every token
and neither pays for mismatch classification. The difference is the grammar's cost: matcher steps, bitmask
fills, unpacking and masking. The first constrained replay (compiling the grammar) is reported apart.
"""
import argparse
import dataclasses
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / 'tests'))


def _records(episodes: int):
    import agentrl as arl
    from agentrl.constraints import tool_call_constraint
    from agentrl.jobs.bugfix import BugFixOptions, bugfix_rollouts
    from agentrl.engines import hf
    from agentrl.record import SamplingSpec
    from agentrl.templates import ChatTemplate
    from agentrl.templates.chat import find_tokenizer_dir
    d = hf.make_test_model(Path(tempfile.mkdtemp()) / 'm', find_tokenizer_dir('qwen3'))
    model, tok = hf.load_model(d)
    template = ChatTemplate(tok, tools=arl.TOOL_SCHEMAS)
    spec = SamplingSpec(constraint=tool_call_constraint(arl.TOOL_SCHEMAS, 'required', template.stop_ids))
    tasks = arl.make_tasks('all')[:episodes]
    recs = bugfix_rollouts(model, tok, tasks, BugFixOptions(spec=spec, max_new_tokens=32, max_turns=3, seed=11), template=template)
    return model, tok, recs


def _bare(recs, rep):
    """The records without their constraint, each stored log-prob replaced by its unconstrained replay."""
    out = []
    for r, rr in zip(recs, rep.records):
        lp = r.sample_logp.clone()
        lp[rr.rows] = (lp[rr.rows].double() + rr.log_ratio).float()
        sp = dataclasses.replace(r.provenance.sampling, constraint=None)
        out.append(dataclasses.replace(r, sample_logp=lp, provenance=dataclasses.replace(r.provenance, sampling=sp)))
    return out


def measure(episodes: int = 6, rounds: int = 5) -> dict:
    """Seconds per replay of both ways (lists over rounds), the cold first replay, and the token counts."""
    from agentrl import checks
    from agentrl.checks import constrained
    from agentrl.engines.scorer import hf_scorer
    torch.set_num_threads(1)
    model, tok, recs = _records(episodes)
    scorer = hf_scorer(model)
    constrained._GRAMMARS.clear()
    t0 = time.perf_counter()
    first = checks.replay_records(recs, scorer, tokenizer=tok)
    cold = time.perf_counter() - t0
    assert first.ok, first.table()
    stripped = [dataclasses.replace(r, provenance=dataclasses.replace(r.provenance, sampling=dataclasses.replace(
        r.provenance.sampling, constraint=None))) for r in recs]
    bare_recs = _bare(recs, checks.replay_records(stripped, scorer))
    times = {'constrained': [], 'unconstrained': []}
    wall = {'constrained': [], 'unconstrained': []}
    for _ in range(rounds):
        for name, rs in (('constrained', recs), ('unconstrained', bare_recs)):
            t0, c0 = time.perf_counter(), time.process_time()
            rep = checks.replay_records(rs, scorer, tokenizer=tok)
            times[name].append(time.process_time() - c0)
            wall[name].append(time.perf_counter() - t0)
            assert rep.ok
    return {'times': times, 'wall': wall, 'cold_s': cold, 'tokens': first.overall.n, 'forced': first.forced,
            'max_abs_dev': first.overall.max_abs_dev, 'records': len(recs)}


def run(quick: bool) -> list[dict]:
    """Rows for bench/run.py."""
    m = measure(episodes=3 if quick else 6, rounds=2 if quick else 5)
    c, u = statistics.median(m['times']['constrained']), statistics.median(m['times']['unconstrained'])
    note = (f"{m['records']} tool_choice=required records, {m['tokens']} action tokens ({m['forced']} forced), "
            'median process CPU s')
    return [{'name': 'grammar_replay_constrained_s', 'value': round(c, 3), 'unit': 's', 'notes': note},
            {'name': 'grammar_replay_unconstrained_s', 'value': round(u, 3), 'unit': 's', 'notes': note},
            {'name': 'grammar_replay_cost_ratio', 'value': round(c / u, 2), 'unit': 'x', 'notes': 'goal <= 1.5'},
            {'name': 'grammar_replay_cold_s', 'value': round(m['cold_s'], 3), 'unit': 's',
             'notes': 'first constrained replay, grammar compiled'}]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    ap.add_argument('--episodes', type=int, default=6)
    ap.add_argument('--rounds', type=int, default=5)
    a = ap.parse_args()
    m = measure(a.episodes, a.rounds)
    c, u = m['times']['constrained'], m['times']['unconstrained']
    print(f"{m['records']} records, {m['tokens']} action tokens, {m['forced']} forced, "
          f"constrained replay max|r-1| {m['max_abs_dev']:.2e}")
    print(f"{'replay':<14} {'CPU best s':>10} {'CPU median s':>12} {'wall median s':>13}")
    for name, t in (('constrained', c), ('unconstrained', u)):
        print(f"{name:<14} {min(t):>10.3f} {statistics.median(t):>12.3f} {statistics.median(m['wall'][name]):>13.3f}")
    print(f"ratio constrained / unconstrained: best {min(c) / min(u):.2f}x, median "
          f"{statistics.median(c) / statistics.median(u):.2f}x; cold first replay {m['cold_s']:.3f} s")


if __name__ == '__main__':
    main()
