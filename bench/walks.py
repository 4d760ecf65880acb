"""The walks through the code: which agentrl files a call enters, and how often it returns to one it had left.

Every module is imported first, so import-time code does not count; then ``sys.setprofile`` (all threads)
notes the file of each call and return. ``files`` is the number of distinct files, ``returns`` the number
of times the walk came back to a file it had left.

    PYTHONPATH=<tree>/src .venv/bin/python bench/walks.py check|gateway WORKDIR OUT.json

``check``: a model-free ``agentrl check`` of a 30-record rollout. ``gateway``: one chat call and the
finish of a session on the HF engine in process (the tiny test model, the Qwen3 tokenizer).
Results of 9949170 and of the engine-contract tree are in the closing note of that change.
"""
import json, os, subprocess, sys, threading
from pathlib import Path

import agentrl
SRC = str(Path(agentrl.__file__).parent)
seq = []
mods = set()
lock = threading.Lock()
ON = [False]


def _prof(frame, event, arg):
    if not ON[0] or frame is None:
        return
    if frame.f_code.co_name == '<module>':
        f = frame.f_code.co_filename
        if event == 'call' and f.startswith(SRC):
            mods.add(f[len(SRC) + 1:])
        return
    if event == 'call':
        f = frame.f_code.co_filename
    elif event == 'return':
        b = frame.f_back
        f = b.f_code.co_filename if b else None
    else:
        return
    if not f or not f.startswith(SRC):
        return
    rel = f[len(SRC) + 1:]
    with lock:
        if not seq or seq[-1] != rel:
            seq.append(rel)


def install():
    threading.setprofile(_prof); sys.setprofile(_prof)


def preimport():
    import importlib, pkgutil
    for m in pkgutil.walk_packages(agentrl.__path__, 'agentrl.'):
        if m.name != 'agentrl.__main__':
            try:
                importlib.import_module(m.name)
            except Exception:
                pass


def start():
    preimport()
    seq.clear(); mods.clear(); install(); ON[0] = True


def stop():
    ON[0] = False
    sys.setprofile(None); threading.setprofile(None)
    s = list(seq)
    return {'files': len(set(s)), 'returns': len(s) - len(set(s)), 'set': sorted(set(s)),
            'modules_imported': sorted(mods)}


def build_engine(model_dir):
    try:
        from agentrl.engines.factory import open_engine
        return open_engine('hf', model=model_dir, device='cpu', max_new_tokens=16)
    except ImportError:
        from agentrl.gateway import HFUpstream
        return HFUpstream(model_dir, device='cpu', max_new_tokens=16)


def gateway(out):
    import httpx2
    from agentrl.engines import hf
    sys.path.insert(0, str(Path(SRC).parents[1] / 'tests'))
    from _tokenizers import tokenizer_path
    from agentrl.gateway import Gateway
    from agentrl.gateway.server import Server
    model_dir = hf.make_test_model(Path(out) / 'm', tokenizer_path('qwen3'))
    install()
    eng = build_engine(model_dir)
    srv = Server(Gateway(eng, Path(out) / 'run'), stream_interval=0.02, pause_wait=0.5).start()
    H = httpx2.Client(timeout=120)
    try:
        sess = H.post(srv.url + '/sessions', json={}).json()
        body = {'model': 'm', 'messages': [{'role': 'user', 'content': 'Fix clamp.'}], 'max_tokens': 8, 'temperature': 1.0}
        H.post(sess['base_url'] + '/chat/completions', json=body)          # warm: the session's first call
        r = H.post(sess['base_url'] + '/chat/completions', json=body | {'messages': body['messages'] + [
            {'role': 'assistant', 'content': 'ok'}, {'role': 'user', 'content': 'go on'}]})
        start()
        r = H.post(sess['base_url'] + '/chat/completions', json=body)
        H.post(f'{srv.url}/sessions/{sess["token"]}/finish', json={'reward': 1.0})
        res = stop()
    finally:
        srv.stop()
    return res


def check(out):
    run = Path(out) / 'run'
    subprocess.run([sys.executable, '-m', 'agentrl', 'rollout', '--out', str(run), '--split', 'heldout',
                    '--repeats', '1'], check=True, capture_output=True)
    from agentrl.cli.main import main
    start()
    try:
        main(['check', str(run / 'trajectories')])
    except SystemExit:
        pass
    return stop()


if __name__ == '__main__':
    res = globals()[sys.argv[1]](sys.argv[2])
    Path(sys.argv[3]).write_text(json.dumps(res, indent=1))
