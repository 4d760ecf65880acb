"""`agentrl check --model` on a length-skewed set: packed replay (the default) vs `--no-packed`, side by side.

    PYTHONPATH=src AGENTRL_SHARED=../shared .venv/bin/python bench/bench_replay_packed.py [n_records] [rounds]

Records are synthetic (random ids of the 588-token test tokenizer, alternating 50-token policy / tool runs),
lengths uniform in [100, 2000] (seed 0), with the test model's own log-probs stored (so every token matches and
the per-token classification is skipped on both paths: the replay's forward is what differs). The model is
``make_test_model`` (2 layers, hidden 64, fp32, sdpa). Each round runs the check job
(:func:`agentrl.jobs.check.run_check`, what ``agentrl check RUN --model M`` runs) once packed and once padded,
alternating, one process, one torch thread; best of ``rounds``. The check replays its records 8 at a time, so the
padding share is that of those calls: padded, 8 records right-padded to their longest; packed, the same 8 laid
end to end by first-fit decreasing into rows as wide as their longest.
"""
import sys
import tempfile
import time
from pathlib import Path

import torch

TINY = Path(__file__).resolve().parents[1] / 'tests' / 'assets' / 'tiny-chat'
CHUNK = 8                     # records per replay call in the check job (jobs.check._replay)


def _records(n, model, tok, name, seed=0, lo=100, hi=2000):
    import agentrl as arl
    from agentrl import checks
    from agentrl.engines.scorer import hf_scorer
    from agentrl.record import Provenance, SamplingSpec
    from agentrl.templates.chat import tokenizer_fingerprint
    g = torch.Generator().manual_seed(seed)
    lens = torch.randint(lo, hi + 1, (n,), generator=g).tolist()
    fp, spec = tokenizer_fingerprint(tok), SamplingSpec()
    out = []
    for i, n_tok in enumerate(lens):
        ids = torch.randint(1, len(tok), (n_tok,), generator=g)
        owner = torch.where((torch.arange(n_tok) // 50) % 2 == 0, arl.OWNER['policy'], arl.OWNER['tool'])
        owner[0] = arl.OWNER['prompt']
        out.append(arl.Trajectory.from_tokens(ids, owner, [-1] + [0] * (n_tok - 1), [0.0] * n_tok, 0.0, {},
                                              provenance=Provenance(policy='hf', tokenizer=fp, sampling=spec,
                                                                    model=name, group_id=f'g{i}', rollout_id='0')))
    rows = [(t.action_mask > 0).nonzero().flatten() for t in out]
    logits = checks.score_sequences([t.ids for t in out], rows, hf_scorer(model), packed=False)
    for t, r, lg in zip(out, rows, logits):                 # the model's own log-probs: every ratio is 1
        t.sample_logp[r] = checks.replay_logp(lg.double(), t.ids[r + 1], spec).float()
    return out


def _shares(lens):
    from agentrl.packing import pack_order
    real = sum(lens)
    pad = packed = 0
    for i in range(0, len(lens), CHUNK):
        part = lens[i:i + CHUNK]
        pad += len(part) * max(part)
        bins = pack_order(part, max(part))
        packed += len(bins) * max(sum(part[j] for j in b) for b in bins)
    return 1 - real / pad, 1 - real / packed


def main(n=256, rounds=2):
    from agentrl import store
    from agentrl.engines import hf
    from agentrl.jobs.check import CheckOptions, run_check
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as d:
        path = hf.make_test_model(Path(d) / 'm', TINY, max_positions=2048)
        model, tok = hf.load_model(path)
        recs = _records(n, model, tok, path.name)
        store.write_trajectories(Path(d) / 't.parquet', recs)
        times = {False: [], True: []}
        for _ in range(rounds):
            for flag in (False, True):
                t = time.perf_counter()
                rep = run_check(CheckOptions(path=str(Path(d) / 't.parquet'), model=str(path), no_packed=flag))
                times[flag].append(time.perf_counter() - t)
                assert rep.code == 0, rep.format()
                dev = rep.replay.overall.max_abs_dev
        lens = [len(t.ids) for t in recs]
        pad_share, pack_share = _shares(lens)
        print(f'check --model, {n} records, {sum(lens)} tokens ({sum(int(t.action_mask.sum()) for t in recs)} action), '
              f'best of {rounds}:')
        print(f'  padded (--no-packed): {min(times[True]):.2f} s  padding share {pad_share:.3f}')
        print(f'  packed (default):     {min(times[False]):.2f} s  padding share {pack_share:.3f}')
        print(f'  speed-up {min(times[True]) / min(times[False]):.2f}x; max |ratio - 1| of the last run {dev:.2e}')


if __name__ == '__main__':
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 256, int(sys.argv[2]) if len(sys.argv) > 2 else 2)
