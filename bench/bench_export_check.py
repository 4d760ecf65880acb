"""What `agentrl export` now pays first: check's no-model rules (jobs.check.require_accepted) vs reading the file.

    PYTHONPATH=src .venv/bin/python bench/bench_export_check.py

960 untrained-TinyAgent records (4 batches of the 30 tasks x 8) in one Parquet file, one torch
thread; best of 3 rounds of each, alternating.
"""
import os
import tempfile
import time

import torch


def measure(batches: int = 4, rounds: int = 3) -> dict:
    import agentrl as arl
    from agentrl import store
    from agentrl.jobs.check import require_accepted
    torch.set_num_threads(1)
    tasks = arl.make_tasks('all')
    tok = arl.build_tokenizer(tasks)
    torch.manual_seed(0)
    net = arl.TinyAgent(tok.vocab_size).eval()
    recs = []
    for k in range(batches):
        recs += arl.rollout_batch(net, [arl.BugFixEnv() for _ in tasks * 8], tasks * 8, tok,
                                  generator=torch.Generator().manual_seed(k))
    with tempfile.TemporaryDirectory() as d:
        f = os.path.join(d, 'r.parquet')
        store.write_trajectories(f, recs)
        read, check = [], []
        for _ in range(rounds):
            t = time.perf_counter()
            store.read_trajectories(f)
            read.append(time.perf_counter() - t)
            t = time.perf_counter()
            require_accepted(f)
            check.append(time.perf_counter() - t)
    return {'records': len(recs), 'read_s': min(read), 'check_s': min(check)}


def run(quick: bool) -> list[dict]:
    """Rows for bench/run.py."""
    m = measure(2 if quick else 4)
    note = f"{m['records']} records, best of 3"
    return [{'name': 'export_read_s', 'value': round(m['read_s'], 3), 'unit': 's', 'notes': note},
            {'name': 'export_check_rules_s', 'value': round(m['check_s'], 3), 'unit': 's', 'notes': note},
            {'name': 'export_check_per_record_ms', 'value': round(m['check_s'] / m['records'] * 1e3, 3), 'unit': 'ms',
             'notes': 'added to every export by the pre-check'}]


if __name__ == '__main__':
    m = measure()
    print(f"{m['records']} records: read {m['read_s']:.3f} s, check rules {m['check_s']:.3f} s "
          f"({m['check_s'] / m['records'] * 1e3:.2f} ms per record)")
