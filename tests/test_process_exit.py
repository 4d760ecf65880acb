"""An ``agentrl`` process ends when its command is done: no thread, child or interpreter teardown keeps it alive.

The command runs as the ``agentrl`` script runs it (``main()`` with no arguments) under a harness that
prints, once ``main`` returned, the non-daemon threads and the child processes left, and registers an exit
handler before agentrl's: agentrl's :func:`~agentrl.cli.main.end_process` runs after every handler
registered later, then ends the process, so the harness's handler (and the teardown after it) never runs.
"""
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

HARNESS = '''
import atexit, multiprocessing, os, sys, threading
atexit.register(print, 'interpreter teardown reached', flush=True)
from agentrl.cli.main import main
sys.argv = ['agentrl'] + sys.argv[1:]
try:
    code = main()
finally:                    # also when the command ends by SystemExit (argparse, a signal handler)
    me = os.getpid()
    kids = [p for p in os.listdir('/proc')
            if p.isdigit() and open(f'/proc/{p}/stat').read().rsplit(')', 1)[1].split()[1] == str(me)]
    print('left:', [t.name for t in threading.enumerate() if not t.daemon and t is not threading.main_thread()],
          multiprocessing.active_children(), kids, flush=True)
sys.exit(code)
'''


def _harness(*argv) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=str(ROOT / 'src'), HF_HUB_OFFLINE='1')
    return subprocess.Popen([sys.executable, '-c', HARNESS, *map(str, argv)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env)


@pytest.mark.skipif(not os.path.isdir('/proc/self'), reason='lists child processes through /proc')
def test_check_with_a_model_ends_with_no_thread_child_or_teardown_left(tmp_path):
    from agentrl.cli.main import main
    run = tmp_path / 'run'
    assert main(['rollout', '--policy', 'model', '--split', 'heldout', '--repeats', '1', '--out', str(run)]) == 0
    p = _harness('check', run, '--model', run / 'model.pt')
    out, err = p.communicate(timeout=600)
    assert p.returncode == 0, err
    assert out.endswith('result: OK\nleft: [] [] []\n'), out[-500:]     # the whole report, flushed; nothing left
    assert 'teardown reached' not in out and err == ''
    p = _harness('check', tmp_path / 'missing')
    out, err = p.communicate(timeout=600)
    assert (p.returncode, out) == (2, 'left: [] [] []\n') and err.startswith('agentrl: error: ')   # the code kept
    p = _harness('check', '--help')                                          # argparse's SystemExit(0)
    out, err = p.communicate(timeout=600)
    assert p.returncode == 0 and out.startswith('usage: agentrl check') and out.endswith('left: [] [] []\n')
    assert err == ''


@pytest.mark.skipif(not os.path.isdir('/proc/self'), reason='lists child processes through /proc')
def test_serve_after_sigterm_ends_with_no_thread_child_or_teardown_left(tmp_path):
    pytest.importorskip('starlette')
    pytest.importorskip('uvicorn')
    try:
        import httpx2 as httpx
    except ImportError:
        httpx = pytest.importorskip('httpx')
    from _tokenizers import tokenizer_path

    from agentrl.engines import hf
    model_dir = hf.make_test_model(tmp_path / 'm', tokenizer_path('qwen3'))
    p = _harness('serve', '--out', tmp_path / 'run', '--model', model_dir, '--device', 'cpu', '--max-new-tokens', 2,
                 '--no-conformance', '--port', 0)
    try:
        line = p.stdout.readline()
        assert line.startswith('serving on http://127.0.0.1:'), (line, p.stderr.read() if p.poll() else '')
        url = line.split()[2]
        base = httpx.post(url + '/sessions', json={}, timeout=120).json()['base_url']
        r = httpx.post(base + '/chat/completions', json={'messages': [{'role': 'user', 'content': 'hi'}], 'seed': 1},
                       timeout=120)
        assert r.status_code == 200, r.text
        p.send_signal(signal.SIGTERM)
        out, err = p.communicate(timeout=600)
    finally:
        if p.poll() is None:
            p.kill()
    assert p.returncode == 0 and out.splitlines()[-1:] == ['left: [] [] []'], (out, err)
    assert 'teardown reached' not in out
    assert err.splitlines()[-1] == 'agentrl serve: stopped (SIGTERM)', err
    assert json.loads((tmp_path / 'run' / 'journal.jsonl').read_text().splitlines()[0])['ev']
