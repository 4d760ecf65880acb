"""Write throughput of the streamed job's shards against the old in-memory path's one-file write.

Run each way in its own process, alternating, with the package of that tree on PYTHONPATH:
    git worktree add /tmp/old86 86ff427
    PYTHONPATH=/tmp/old86/src python bench/bench_write_vs_old.py one old-86ff427
    PYTHONPATH=src            python bench/bench_write_vs_old.py shards new
1,920 untrained-TinyAgent records (8 batches of the 30 tasks x 8), best of 5.
"""
import time, torch, tempfile, os, sys, shutil
torch.set_num_threads(1)
import agentrl as arl
from agentrl import store
tasks = arl.make_tasks('all'); tok = arl.build_tokenizer(tasks)
torch.manual_seed(0)
net = arl.TinyAgent(tok.vocab_size).eval()
recs = []
for k in range(8):
    recs += arl.rollout_batch(net, [arl.BugFixEnv() for _ in tasks*8], tasks*8, tok, generator=torch.Generator().manual_seed(k))
tokens = sum(len(t.ids) for t in recs)
chunks = [recs[i:i+256] for i in range(0, len(recs), 256)]
d = tempfile.mkdtemp(); best = 1e9
for r in range(5):
    t = time.perf_counter()
    if sys.argv[1] == 'one':
        store.write_trajectories(os.path.join(d, f'x{r}.parquet'), recs)
    else:
        w = store.ShardWriter(os.path.join(d, f's{r}'))
        for c in chunks: w.write(c)
    best = min(best, time.perf_counter() - t)
shutil.rmtree(d)
print(sys.argv[1], sys.argv[2], len(recs), tokens, 'Mtok/s %.3f' % (tokens / best / 1e6))
