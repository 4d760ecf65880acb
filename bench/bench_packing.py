"""Packed vs padded: scoring a length-skewed batch with the HF test model, and collate_packed vs collate.

    PYTHONPATH=src AGENTRL_SHARED=../shared .venv/bin/python bench/bench_packing.py [n_score_records] [n_collate]

The model is ``make_test_model`` on the 588-token test tokenizer (tests/assets/tiny-chat): with the real
Qwen3 vocabulary the output head and log-softmax over 151,669 logits per action token dominate both paths
equally and hide the decoder, which is what packing changes. Records are synthetic (random ids,
alternating policy / tool runs), lengths uniform in [100, 2000]
tokens (seed 0); their content does not change the cost. Scoring: the padded path is what the HF
replay scorer does (``collate`` then ``engines.hf.score_rows`` on the action positions), in
micro-batches of ``MB`` records in the records' order; the packed path is ``collate_packed(max_tokens=2048)``
then ``engines.packed.packed_token_logp``, micro-batches of rows of about the same token budget
chosen by ``balance_micro_batches``. Both run in one process, alternating, best of ``ROUNDS``; one
torch thread; fp32 sdpa. The log-prob agreement on every action token is printed too.
"""
import sys
import tempfile
import time
from pathlib import Path

import torch

MB = 4           # padded records per forward
TINY = Path(__file__).resolve().parents[1] / 'tests' / 'assets' / 'tiny-chat'
ROUNDS = 2


def _records(n, seed=0, vocab=150000, lo=100, hi=2000):
    import agentrl as arl
    g = torch.Generator().manual_seed(seed)
    lens = torch.randint(lo, hi + 1, (n,), generator=g).tolist()
    out = []
    for n_tok in lens:
        ids = torch.randint(1, vocab, (n_tok,), generator=g)
        owner = torch.full((n_tok,), arl.OWNER['tool'])
        owner[1:] = torch.where((torch.arange(n_tok - 1) // 50) % 2 == 0, arl.OWNER['policy'], arl.OWNER['tool'])
        owner[0] = arl.OWNER['prompt']
        out.append(arl.Trajectory.from_tokens(ids, owner, [-1] + [0] * (n_tok - 1), [0.0] * n_tok, 0.0, {}))
    return out


def _padded(model, recs):
    from agentrl.batching import collate
    from agentrl.engines.hf.models import score_rows
    out, slots = [], 0
    for i in range(0, len(recs), MB):
        part = recs[i:i + MB]
        b = collate(part, 0)
        slots += b.ids.numel()
        rows = [t.action_mask.nonzero().squeeze(1) for t in part]
        for t, r, lg in zip(part, rows, score_rows(model, b.ids, b.attention_mask, rows)):
            out.append(torch.log_softmax(lg, -1).gather(-1, t.ids[r + 1, None]).squeeze(-1))
    return out, slots


def _packed(model, recs, max_tokens=2048):
    from agentrl.engines.packed import packed_token_logp
    from agentrl.packing import balance_micro_batches, collate_packed, unpack_rows
    p = collate_packed(recs, max_tokens)
    n_micro = max(1, round(p.ids.shape[0] * max_tokens / (MB * 2000)))
    lp = torch.zeros(p.action_mask.shape)
    for rows in balance_micro_batches(p.attention_mask.sum(1), n_micro):
        sub = _rows(p, rows)
        with torch.no_grad():
            lp[rows] = packed_token_logp(model, sub)
    return [x[t.action_mask > 0] for x, t in zip(unpack_rows(lp, p), recs)], p


def _rows(p, rows):
    from dataclasses import replace
    idx = torch.tensor(rows)
    return replace(p, ids=p.ids[idx], position_ids=p.position_ids[idx], action_mask=p.action_mask[idx])


def score(n):
    from agentrl.engines import hf
    with tempfile.TemporaryDirectory() as d:
        path = hf.make_test_model(d, TINY, max_positions=4096)        # 2 layers, hidden 64, vocab 588
        model, _ = hf.load_model(path, attn_implementation='sdpa')
    recs = _records(n, vocab=588)
    real = sum(len(t.ids) for t in recs)
    t_pad, t_pack = [], []
    for _ in range(ROUNDS):
        t = time.perf_counter()
        with torch.no_grad():
            a, slots = _padded(model, recs)
        t_pad.append(time.perf_counter() - t)
        t = time.perf_counter()
        b, p = _packed(model, recs)
        t_pack.append(time.perf_counter() - t)
    dev = max(float((x - y).abs().max()) for x, y in zip(a, b))
    print(f'score {n} records, {real} tokens ({sum(int(t.action_mask.sum()) for t in recs)} action):')
    whole = len(recs) * max(len(t.ids) for t in recs)
    print(f'  padded: {min(t_pad):.2f} s, micro-batches of {MB} records, padding share {1 - real / slots:.3f} '
          f'(one collate of all: {1 - real / whole:.3f})')
    print(f'  packed: {min(t_pack):.2f} s, {p.ids.shape[0]} rows x {p.ids.shape[1]}, '
          f'padding share {p.padding_share:.3f}')
    print(f'  max |packed - padded| log-prob over action tokens: {dev:.2e}')


def collate_time(n, rounds=3):
    from agentrl.batching import collate
    from agentrl.packing import collate_packed
    recs = _records(n, seed=1, vocab=316)
    tc, tp = [], []
    for _ in range(rounds):
        t = time.perf_counter()
        b = collate(recs, 0)
        tc.append(time.perf_counter() - t)
        t = time.perf_counter()
        p = collate_packed(recs, 4096)
        tp.append(time.perf_counter() - t)
    real = sum(len(t.ids) for t in recs)
    print(f'collate {n} records ({real} tokens): collate {min(tc) * 1e3:.0f} ms ({tuple(b.ids.shape)}, padding '
          f'{1 - real / b.ids.numel():.3f}); collate_packed(max_tokens=4096) {min(tp) * 1e3:.0f} ms '
          f'({tuple(p.ids.shape)}, padding {p.padding_share:.3f})')


if __name__ == '__main__':
    torch.set_num_threads(1)
    collate_time(int(sys.argv[2]) if len(sys.argv) > 2 else 4096)
    score(int(sys.argv[1]) if len(sys.argv) > 1 else 256)
