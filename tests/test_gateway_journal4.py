"""The gateway's journal keeps what was served equal to what is trained, across failures and restarts.

A call whose journal line cannot be written leaves no trace; a call is trained only once its
response was handed to the connection; a finish whose records could not be stored can be sent
again; identities that could clash in the store are refused at open; a restart refuses another
model, template or option and does not replay committed sessions; a damaged journal is refused
line by line. The engine is ``make_test_model``'s 2-layer Qwen3 with the real Qwen3 tokenizer.
"""
import errno
import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from _tokenizers import tokenizer_path

pytest.importorskip('transformers')

from _gateway import ForcingHF  # noqa: E402
from agentrl import store  # noqa: E402
from agentrl.gateway import Gateway, GatewayError, Session, parse_request, read_journal  # noqa: E402
from agentrl.gateway.protocol import body_digest  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
USER = [{'role': 'user', 'content': 'Fix clamp.'}]


@pytest.fixture(scope='module')
def model_dir(tmp_path_factory):
    from agentrl.engines import hf
    return hf.make_test_model(tmp_path_factory.mktemp('gw-journal-model'), tokenizer_path('qwen3'))


@pytest.fixture(scope='module')
def upstream(model_dir):
    return ForcingHF(model_dir, device='cpu', max_new_tokens=6)


def _close(gw):
    gw.pool.shutdown()
    gw.engine_pool.shutdown()
    gw.journal.close()


def _request(messages, **fields):
    body = json.dumps(dict({'messages': messages, 'max_tokens': 4}, **fields)).encode()
    req, _ = parse_request(body, 1 << 20)
    return req, body_digest(body)


def call(gw, s, messages, retry=0, **fields):
    req, digest = _request(messages, **fields)
    return gw.chat(s, req, digest, retry)[0]


def served_not_delivered(gw, s, messages, **fields):
    """What the HTTP app does up to the response: plan, sample, journal; the bytes never leave (a kill)."""
    req, digest = _request(messages, **fields)
    p = gw.prepare(s, req, digest, 0)
    return gw.complete(p, gw.sample(p))[0]


def reply(resp):
    return {k: v for k, v in resp['choices'][0]['message'].items() if v is not None}


def rows(out):
    return list(store.read_trajectories(Path(out) / 'trajectories')) if (Path(out) / 'trajectories').is_dir() else []


# ---------------------------------------------------------------------------- (a) a failed journal write
def test_a_call_whose_journal_line_fails_leaves_no_trace_and_its_resend_continues(upstream, tmp_path, monkeypatch):
    out = tmp_path / 'run'
    gw = Gateway(upstream, out)
    token, s = gw.open_session({'rollout_id': 'enospc'})
    r0 = call(gw, s, USER, seed=1)
    msgs = USER + [reply(r0), {'role': 'user', 'content': 'Again.'}]
    journal = out / 'journal.jsonl'
    size, steps = journal.stat().st_size, list(s.branches[0].steps)
    real, state = os.write, {'armed': True}

    def write(fd, data):             # the call's line: half of it is written, then the disk is full
        if state['armed'] and bytes(data[:12]) == b'{"ev":"call"':
            state['fd'] = fd
            return real(fd, bytes(data[:len(data) // 2]))
        if state.get('fd') == fd:
            state.pop('fd')
            state['armed'] = False
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real(fd, data)
    monkeypatch.setattr(os, 'write', write)
    upstream.force.append('FAILED TURN<|im_end|>')
    with pytest.raises(GatewayError) as e:
        call(gw, s, msgs, seed=2)
    assert (e.value.status, e.value.code) == (503, 'journal_unwritable')
    assert e.value.message == (f'the journal {journal} could not be written (OSError: No space left on device); '
                               'nothing of this request was kept: free space on that disk and send it again')
    assert state == {'armed': False} and upstream.force == []
    assert journal.stat().st_size == size                     # the half line was cut off
    assert len(s.calls) == 1 and len(s.branches) == 1 and s.branches[0].steps == steps and s.forks == []
    monkeypatch.undo()
    call(gw, s, msgs, seed=2)                                  # the resend extends branch 0: no fork
    assert len(s.branches) == 1 and s.forks == [] and [c['branch'] for c in s.calls] == [0, 0]
    _close(gw)
    assert [e['index'] for e in read_journal(journal) if e['ev'] == 'call'] == [0, 1]
    again = Gateway(upstream, out)
    assert again.finish(again.session(token), 1.0, {})['records'] == 1
    _close(again)
    [t] = rows(out)
    assert t.info['gateway']['calls'] == [0, 1] and t.provenance.rollout_id == 'enospc'
    text = again.template(None).decode(t.ids.tolist())
    assert 'FAILED TURN' not in text and text.count('Again.') == 1


_FSIZE = r'''
import importlib.util, json, resource, signal, sys
spec = importlib.util.spec_from_file_location('journal', sys.argv[1])
mod = importlib.util.module_from_spec(spec)
spec.loader.exec_module(mod)
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)     # over the limit: EFBIG, not a kill
j = mod.Journal(sys.argv[2])
j.append({'ev': 'policy', 'version': 'a'})
soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
resource.setrlimit(resource.RLIMIT_FSIZE, (j.path.stat().st_size + 40, hard))
try:
    j.append({'ev': 'policy', 'version': 'b' * 200})
except OSError as e:
    print(e.errno)
resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
j.append({'ev': 'policy', 'version': 'c'})
j.close()
'''


def test_a_journal_line_over_the_file_size_limit_is_written_whole_or_not_at_all(tmp_path):
    path = tmp_path / 'journal.jsonl'
    p = subprocess.run([sys.executable, '-c', _FSIZE, str(ROOT / 'src' / 'agentrl' / 'gateway' / 'journal.py'),
                        str(path)], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    assert p.stdout.split() == [str(errno.EFBIG)]
    assert path.read_bytes() == b'{"ev":"policy","version":"a"}\n{"ev":"policy","version":"c"}\n'


# ---------------------------------------------------------------------------- (b) trained once delivered
def test_a_call_killed_before_its_response_left_is_not_trained_after_a_restart(upstream, tmp_path):
    out = tmp_path / 'run'
    gw = Gateway(upstream, out)
    token, s = gw.open_session({'rollout_id': 'killed'})
    served_not_delivered(gw, s, USER, seed=3)                 # journalled; SIGKILL before the bytes left
    assert [e['ev'] for e in read_journal(out / 'journal.jsonl')] == ['session', 'call']
    retry_token, r = gw.open_session({'rollout_id': 'marked'})
    lost = served_not_delivered(gw, r, USER, seed=4)
    _close(gw)
    again = Gateway(upstream, out)
    s2 = again.session(token)
    assert s2.calls[0]['delivered'] is False and s2.undelivered == {0}
    call(again, s2, USER, seed=3)                              # resent without the SDK's retry mark
    assert again.finish(s2, 1.0, {})['records'] == 1
    req, digest = _request(USER, seed=4)                       # a marked retry is still replayed
    r2 = again.session(retry_token)
    got, index, replayed = again.chat(r2, req, digest, 1)
    assert (index, replayed, len(r2.calls)) == (0, True, 1) and r2.calls[0]['delivered'] is True
    assert again.finish(r2, 1.0, {})['records'] == 1
    _close(again)
    by = {t.provenance.rollout_id: t for t in rows(out)}
    assert sorted(by) == ['killed', 'marked']                  # the undelivered first sample is trained nowhere
    assert by['killed'].info['gateway']['calls'] == [1] and by['marked'].info['gateway']['calls'] == [0]
    assert got == lost


def test_the_app_journals_delivered_once_every_byte_was_handed_over(upstream, tmp_path):
    pytest.importorskip('uvicorn')
    try:                              # openai >= 3 ships httpx2; older versions use httpx
        import httpx2 as httpx
    except ImportError:
        httpx = pytest.importorskip('httpx')
    from agentrl.gateway.server import Server
    out = tmp_path / 'run'
    srv = Server(Gateway(upstream, out)).start()
    try:
        sess = httpx.post(srv.url + '/sessions', json={}, timeout=60).json()
        r = httpx.post(sess['base_url'] + '/chat/completions', json={'messages': USER, 'max_tokens': 3}, timeout=60)
        assert r.status_code == 200
        for _ in range(15000):                                   # the mark follows the last byte
            evs = [e['ev'] for e in read_journal(out / 'journal.jsonl')]
            if 'delivered' in evs:
                break
            threading.Event().wait(0.02)
        assert evs == ['session', 'call', 'delivered']
    finally:
        srv.stop()


def test_a_journal_written_before_delivery_marks_counts_its_calls_delivered(upstream, tmp_path):
    out = tmp_path / 'run'
    gw = Gateway(upstream, out)
    token, s = gw.open_session({'rollout_id': 'old'})
    served_not_delivered(gw, s, USER, seed=5)
    _close(gw)
    journal = out / 'journal.jsonl'
    evs = read_journal(journal)
    assert evs[0]['v'] == 2
    del evs[0]['v']                                             # as a gateway before format 2 wrote it
    journal.write_text(''.join(json.dumps(e) + '\n' for e in evs))
    again = Gateway(upstream, out)
    s2 = again.session(token)
    assert s2.calls[0]['delivered'] is True and s2.undelivered == set()
    assert again.finish(s2, 1.0, {})['records'] == 1
    _close(again)


# ---------------------------------------------------------------------------- (c) a finish that failed to store
def test_a_finish_whose_records_could_not_be_stored_can_be_sent_again(upstream, tmp_path, monkeypatch):
    gw = Gateway(upstream, tmp_path / 'run')
    token, s = gw.open_session({'rollout_id': 'store'})
    call(gw, s, USER, seed=6)
    writer = gw.writer()
    real = writer.write

    def fail_once(recs, images=None):
        monkeypatch.setattr(writer, 'write', real)
        raise OSError(errno.EIO, os.strerror(errno.EIO))
    monkeypatch.setattr(writer, 'write', fail_once)
    with pytest.raises(GatewayError) as e:
        gw.finish(s, 1.0, {'try': 1})
    assert (e.value.status, e.value.code) == (503, 'store_failed')
    assert e.value.message == (f'the records of session {s.sid} could not be stored (OSError: [Errno 5] '
                               'Input/output error); the session stays finished: fix that and send the finish again')
    assert s.state == 'finished' and rows(tmp_path / 'run') == []
    assert gw.finish(s, 0.5, {'try': 2})['records'] == 1
    with pytest.raises(GatewayError, match='the session is committed') as e:
        gw.session(token)
    assert e.value.code == 'session_closed'
    _close(gw)
    [t] = rows(tmp_path / 'run')
    assert (t.reward, t.info['try']) == (0.5, 2)


# ---------------------------------------------------------------------------- identities
def test_an_identity_clashing_with_a_fork_leaf_or_a_default_identity_is_refused_at_open(upstream, tmp_path):
    out = tmp_path / 'run'
    gw = Gateway(upstream, out)
    _, a = gw.open_session({'group_id': 'g', 'rollout_id': 'x'})
    fix = 'give each session its own rollout_id, not another session\'s plus "/bK" (its fork leaves)'
    cases = [({'group_id': 'g', 'rollout_id': 'x/b1'},
              f"rollout_id='x/b1' is the id of fork leaf 1 of another session in group_id='g' (rollout_id='x'); {fix}"),
             ({'group_id': 'g', 'rollout_id': 'x'},
              f"another session already records group_id='g' rollout_id='x'; {fix}")]
    gw.open_session({'group_id': 'h', 'rollout_id': 'y/b12'})
    cases.append(({'group_id': 'h', 'rollout_id': 'y'},
                  f"another session in group_id='h' has rollout_id='y/b12', the id this session's fork leaf 12 "
                  f"would get; {fix}"))
    _, d = gw.open_session({})                                  # stored as (its session id, its session id)
    cases.append(({'group_id': d.sid, 'rollout_id': d.sid},
                  f'another session already records group_id={d.sid!r} rollout_id={d.sid!r}; {fix}'))
    for ident, message in cases:
        with pytest.raises(GatewayError) as e:
            gw.open_session(ident)
        assert (e.value.status, e.value.code, e.value.message) == (409, 'identity_conflict', message)
    gw.open_session({'group_id': 'g', 'rollout_id': 'x/b0'})    # never a leaf id (leaves count from 1)
    gw.open_session({'group_id': 'other', 'rollout_id': 'x/b1'})
    call(gw, a, USER, seed=7)
    gw.finish(a, 1.0, {})
    _close(gw)
    again = Gateway(upstream, out)                              # stored sessions still hold their ids
    with pytest.raises(GatewayError, match="fork leaf 3 of another session in group_id='g'") as e:
        again.open_session({'group_id': 'g', 'rollout_id': 'x/b3'})
    assert e.value.status == 409
    _close(again)


# ---------------------------------------------------------------------------- restart: what it was started with
def test_a_restart_with_another_template_option_template_or_model_is_refused_naming_them(upstream, tmp_path):
    out = tmp_path / 'run'
    _close(Gateway(upstream, out, conformance=False))
    run = json.loads((out / 'run.json').read_text())
    assert sorted(run['fingerprint']) == ['family', 'model', 'options', 'template', 'tokenizer']
    assert run['fingerprint']['options'] == {} and run['fingerprint']['family'] == 'qwen3'
    fix = 'restart with what it was started with, or serve into a new --out'
    with pytest.raises(ValueError) as e:
        Gateway(upstream, out, template_options={'enable_thinking': False}, conformance=False)
    assert str(e.value) == (f'--out {str(out)!r} was started with options.enable_thinking=unset and this start has '
                            f'options.enable_thinking=false; {fix}')
    other = upstream.tokenizer.chat_template + '{#- edited #}'
    with pytest.raises(ValueError, match=r"was started with template=\"[0-9a-f]{16}\" and this start has "
                                         r"template=\"[0-9a-f]{16}\"; restart with"):
        Gateway(upstream, out, template_options={'chat_template': other}, conformance=False)
    (out / 'run.json').write_text(json.dumps({'kind': 'gateway', 'model': upstream.model_name}))   # an older run
    _close(Gateway(upstream, out, conformance=False))
    assert json.loads((out / 'run.json').read_text()) == run
    (out / 'run.json').write_text(json.dumps({'kind': 'gateway', 'model': 'other@0123'}))
    with pytest.raises(ValueError) as e:
        Gateway(upstream, out, conformance=False)
    assert str(e.value) == (f'--out {str(out)!r} was started with model="other@0123" and this start has '
                            f'model={json.dumps(upstream.model_name)}; {fix}')


def test_a_restart_with_another_tokenizer_is_refused_naming_it(upstream, tmp_path, monkeypatch):
    from _tokenizers import load
    from agentrl.templates import tokenizer_fingerprint
    out = tmp_path / 'run'
    _close(Gateway(upstream, out, conformance=False))
    started = tokenizer_fingerprint(upstream.tokenizer)
    tiny = load('tiny')                                        # the same model served with another tokenizer
    monkeypatch.setattr(upstream, 'tokenizer', tiny)
    with pytest.raises(ValueError) as e:
        Gateway(upstream, out, conformance=False)
    assert str(e.value) == (f'--out {str(out)!r} was started with tokenizer="{started}" and this start has '
                            f'tokenizer="{tokenizer_fingerprint(tiny)}"; restart with what it was started with, or '
                            'serve into a new --out')
    assert started != tokenizer_fingerprint(tiny)


def test_cli_serve_refuses_another_option_and_a_damaged_journal_in_one_line(model_dir, tmp_path, capsys):
    from agentrl.cli.main import main
    out = tmp_path / 'run'
    base = ['serve', '--out', str(out), '--model', str(model_dir), '--device', 'cpu', '--no-conformance']
    gw = Gateway(ForcingHF(model_dir, device='cpu', max_new_tokens=4), out, conformance=False)
    gw.open_session({})
    _close(gw)
    assert main(base + ['--no-thinking']) == 2
    err = capsys.readouterr().err
    assert err == (f'agentrl: error: --out {str(out)!r} was started with options.enable_thinking=unset and this start '
                   'has options.enable_thinking=false; restart with what it was started with, or serve into a new '
                   '--out\n')
    with open(out / 'journal.jsonl', 'a') as f:
        f.write('{"ev": "undelivered", "sid": "s", "index": "0"}\n{"ev": "policy", "version": "1"}\n')
    assert main(base) == 2
    assert capsys.readouterr().err == (
        f"agentrl: error: {out / 'journal.jsonl'}: line 2 is not a journal event (event 'undelivered': field 'index' "
        "is str, not an integer); the journal was edited or damaged: restore it or serve into a new --out\n")


# ---------------------------------------------------------------------------- restart: committed sessions stay out
def test_committed_sessions_leave_memory_and_are_not_replayed_at_a_restart(upstream, tmp_path, monkeypatch):
    out = tmp_path / 'run'
    gw = Gateway(upstream, out)
    tokens = []
    for k in range(3):
        token, s = gw.open_session({'rollout_id': f'done-{k}'})
        call(gw, s, USER, seed=10 + k)
        gw.finish(s, 1.0, {})
        tokens.append(token)
    open_token, o = gw.open_session({'rollout_id': 'open'})
    call(gw, o, USER, seed=20)
    assert list(gw.sessions) == [o.sid] and len(gw.closed) == 3
    summary = gw.write_summary()
    assert (summary['sessions'], summary['committed'], summary['records'], summary['calls']) == (4, 3, 3, 4)
    _close(gw)
    planned = []
    real_plan = Session.plan

    def plan(self, *a, **k):
        planned.append(self.sid)
        return real_plan(self, *a, **k)
    monkeypatch.setattr(Session, 'plan', plan)
    again = Gateway(upstream, out)
    assert planned == [o.sid] and list(again.sessions) == [o.sid] and len(again.closed) == 3
    assert again.write_summary() == summary
    req, digest = _request(USER, seed=10)
    with pytest.raises(GatewayError, match=r'^the session is committed \(1 records stored\); open a new one$') as e:
        again.chat(again.session(tokens[0]), req, digest, 1)  # a marked retry to a committed session
    assert (e.value.status, e.value.code) == (409, 'session_closed')
    assert again.describe(tokens[0])['state'] == 'committed' and again.describe(tokens[0])['records'] == 1
    _close(again)
    journal = out / 'journal.jsonl'                            # an older journal: committed lines without stats
    evs = [{k: v for k, v in e.items() if k not in ('stats', 'describe')} for e in read_journal(journal)]
    journal.write_text(''.join(json.dumps(e) + '\n' for e in evs))
    planned.clear()
    old = Gateway(upstream, out)
    assert sorted(planned) == sorted([o.sid] + list(old.closed)) and len(planned) == 4
    assert list(old.sessions) == [o.sid] and old.write_summary() == summary
    _close(old)


# ---------------------------------------------------------------------------- the reader
def test_read_journal_refuses_a_damaged_or_duplicated_line_by_name(upstream, tmp_path):
    out = tmp_path / 'run'
    gw = Gateway(upstream, out)
    _, s = gw.open_session({})
    call(gw, s, USER, seed=8)
    _close(gw)
    lines = (out / 'journal.jsonl').read_text().splitlines(keepends=True)
    assert [json.loads(x)['ev'] for x in lines] == ['session', 'call', 'delivered']
    path = tmp_path / 'j.jsonl'
    tail = '; the journal was edited or damaged: restore it or serve into a new --out'
    call_ev = json.loads(lines[1])
    no_ids = json.dumps({k: v for k, v in call_ev.items() if k != 'ids'}) + '\n'
    bad_index = json.dumps(dict(call_ev, index=True)) + '\n'
    cases = [(lines[:2] + [lines[1]] + lines[2:],
              f'line 3 is not a journal event (a duplicated line: it repeats call 0 of session {s.sid})'),
             ([lines[0], no_ids] + lines[2:], "line 2 is not a journal event (event 'call': no field 'ids')"),
             ([lines[0], bad_index], "line 2 is not a journal event (event 'call': field 'index' is bool, not an "
                                     "integer)"),
             ([lines[0], '[1, 2]\n', lines[1]], 'line 2 is not a journal event (a JSON list, not an object)'),
             ([lines[0], '{"ev": "kill"}\n', lines[1]], "line 2 is not a journal event (ev='kill' is not one of "
                                                         "['call', 'committed', 'delivered', 'finish', 'policy', "
                                                         "'session', 'undelivered'])"),
             ([lines[0], lines[1].replace('"index":0', '"index":1')],
              f'line 2 is not a journal event (call 1 of session {s.sid}, but only 0 calls of it come before)')]
    for content, message in cases:
        path.write_text(''.join(content))
        with pytest.raises(ValueError) as e:
            read_journal(path)
        assert str(e.value) == f'{path}: {message}{tail}'
    path.write_text(''.join(lines) + lines[1][:40])            # a torn last line is still dropped
    assert [e['ev'] for e in read_journal(path)] == ['session', 'call', 'delivered']
