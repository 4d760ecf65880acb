"""Bounded, no hangs: every reader, renderer and allocator has a documented bound
(docs/design.md#bounds) and refuses past it in one line, naming the file, row group, template or flag."""
import os
import subprocess
import sys

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from agentrl import store
from agentrl.record import Provenance, SamplingSpec, Trajectory
from agentrl.store.schema import to_table

AGENTRL = [sys.executable, '-m', 'agentrl']


def record(k: int = 0) -> Trajectory:
    ids = [1, 10 + k, 11 + k, 20, 21, 30]
    owner = ['template', 'prompt', 'prompt', 'policy', 'policy', 'tool']
    p = Provenance(policy='model', tokenizer='tokfp', template='tplfp', sampling=SamplingSpec(0.7), model='tiny',
                   group_id='g0', rollout_id=f'r{k}', attempt=1, seed=k)
    return Trajectory.from_tokens(ids, owner, [-1, -1, -1, 0, 0, 0], [0, 0, 0, -0.1, -0.2, 0], 1.0,
                                  {'task': 'clamp', 'stop': 'solved'}, provenance=p)


def bomb(path, column: str, values) -> None:
    """A trajectory file (agentrl schema and metadata) whose ``column`` row 0 is replaced by ``values``, zstd."""
    t = to_table([record(0), record(1)])
    col = t.column(column)
    if pa.types.is_list(col.type):
        arr = pa.array(values, col.type.value_type)
        new = pa.ListArray.from_arrays(pa.array([0, len(arr), len(arr)], pa.int32()), arr).cast(col.type)
    else:
        new = pa.array(values, col.type)
    t = t.set_column(t.schema.get_field_index(column), t.schema.field(column), new)
    pq.write_table(t, path, compression='zstd')


# ------------------------------------------------------------------------------ Parquet: decoded bytes per row group

def test_zip_bomb_shard_is_refused_from_its_footer_before_it_is_read(tmp_path, monkeypatch):
    f = tmp_path / 'bomb.parquet'
    bomb(f, 'ids', np.zeros(20_000_000, dtype=np.int32))     # 80 MB of zeros: about 1 KB on disk
    assert f.stat().st_size < 20_000
    monkeypatch.setenv('AGENTRL_MAX_ROW_GROUP_BYTES', str(10 << 20))
    with pytest.raises(ValueError, match=r"^'.*bomb.parquet' row group 0 \(2 rows\) decodes to 8000\d{4} bytes "
                                         r"\(column 'ids' the most\), over the bound of 10485760 bytes per row group "
                                         r'\(AGENTRL_MAX_ROW_GROUP_BYTES\): a compression bomb'):
        next(store.scan(f))
    with pytest.raises(ValueError, match='row group 0 .* over the bound'):
        store.read_trajectories(f)


def test_zip_bomb_within_the_row_group_bound_is_refused_by_its_cell(tmp_path, monkeypatch):
    """80 MB of zeros in one cell: under the row-group bound, over the cell bound; refused before conversion."""
    f = tmp_path / 'bomb.parquet'
    bomb(f, 'ids', np.zeros(20_000_000, dtype=np.int32))
    monkeypatch.delenv('AGENTRL_MAX_ROW_GROUP_BYTES', raising=False)
    monkeypatch.delenv('AGENTRL_MAX_CELL_BYTES', raising=False)
    msg = (f"'{f}' row 0 (row group 0): column 'ids' decodes to 80000000 bytes in one cell, over the bound of "
           '67108864 bytes per cell (AGENTRL_MAX_CELL_BYTES): a compression bomb or a damaged file; remove it, or '
           'raise AGENTRL_MAX_CELL_BYTES if you trust it')
    with pytest.raises(ValueError) as e:
        next(store.scan(f))
    assert str(e.value) == msg
    monkeypatch.setenv('AGENTRL_MAX_CELL_BYTES', str(10 << 20))      # the footer's mean cell (40 MB) is over it (its footer counts 20000001 values)
    with pytest.raises(ValueError) as e:
        store.read_trajectories(f)
    assert str(e.value) == (f"'{f}' row group 0 (2 rows): column 'ids' decodes to 40000002 bytes per cell on average "
                            '(its footer), over the bound of 10485760 bytes per cell (AGENTRL_MAX_CELL_BYTES): a compression bomb or a '
                            'damaged file; remove it, or raise AGENTRL_MAX_CELL_BYTES if you trust it')


def test_string_cell_bomb_is_refused_by_its_cell(tmp_path, monkeypatch):
    f = tmp_path / 'info.parquet'
    bomb(f, 'info', ['{}', '{"a": "' + 'x' * 3000 + '"}'])
    monkeypatch.setenv('AGENTRL_MAX_CELL_BYTES', '2000')
    rows = store.scan(f, batch_size=1, verify=False)
    assert [r.row for r in next(rows)] == [0]                          # row 1 is counted when its batch decodes
    with pytest.raises(ValueError, match=rf"^'{f}' row 1 \(row group 0\): column 'info' decodes to 3009 bytes in one "
                                         r'cell, over the bound of 2000 bytes per cell \(AGENTRL_MAX_CELL_BYTES\)'):
        next(rows)
    monkeypatch.setenv('AGENTRL_MAX_CELL_BYTES', '3009')
    assert [r.row for r in next(store.scan(f, verify=False))] == [0, 1]


def test_string_dictionary_bomb_is_counted_as_it_decodes(tmp_path, monkeypatch):
    """One 1 MB string repeated: the footer holds 1 MB, the rows decode to 300 MB; read as a dictionary, refused."""
    f = tmp_path / 'strings.parquet'
    t = to_table([record(k) for k in range(300)])
    i = t.schema.get_field_index('info')
    t = t.set_column(i, t.schema.field('info'), pa.array(['x' * (1 << 20)] * 300, pa.string()))
    pq.write_table(t, f, compression='zstd')
    assert f.stat().st_size < 100_000
    monkeypatch.setenv('AGENTRL_MAX_ROW_GROUP_BYTES', str(50 << 20))
    with pytest.raises(ValueError, match=r"row group 0 \(300 rows\) decodes to \d+ bytes \(column 'info' the most\), "
                                         'over the bound of 52428800 bytes per row group'):
        for _ in store.scan(f, batch_size=16):
            pass


def test_files_within_the_bound_read_as_before(tmp_path, monkeypatch):
    f = tmp_path / 'ok.parquet'
    recs = [record(k) for k in range(40)]
    store.write_trajectories(f, recs)
    monkeypatch.setenv('AGENTRL_MAX_ROW_GROUP_BYTES', '30000')      # forces dictionary reads of the string columns
    got = store.read_trajectories(f)
    assert [r.ids.tolist() for r in got] == [r.ids.tolist() for r in recs]
    assert [r.info for r in got] == [r.info for r in recs] and got[3].provenance == recs[3].provenance
    monkeypatch.setenv('AGENTRL_MAX_ROW_GROUP_BYTES', 'lots')
    with pytest.raises(ValueError, match=r"^AGENTRL_MAX_ROW_GROUP_BYTES='lots' is not a positive integer"):
        store.read_trajectories(f)


def test_writer_keeps_row_groups_small(tmp_path, monkeypatch):
    import agentrl.store.write as w
    monkeypatch.setattr(w, '_ROW_GROUP_TARGET', 4000)
    f = store.write_trajectories(tmp_path / 'many.parquet', [record(k) for k in range(50)])
    md = pq.ParquetFile(f).metadata
    assert md.num_row_groups > 1 and md.num_rows == 50
    assert len(store.read_trajectories(f)) == 50


def test_check_cli_refuses_the_bomb_in_one_line(tmp_path):
    f = tmp_path / 'bomb.parquet'
    bomb(f, 'ids', np.zeros(20_000_000, dtype=np.int32))
    env = dict(os.environ, AGENTRL_MAX_ROW_GROUP_BYTES=str(10 << 20))
    p = subprocess.run([*AGENTRL, 'check', str(f)], capture_output=True, text=True, env=env, timeout=300)
    assert p.returncode == 2, p.stderr
    assert p.stderr.count('\n') == 1 and 'row group 0 (2 rows) decodes to' in p.stderr
    assert 'is damaged' not in p.stderr


# ------------------------------------------------------------------------------ import: regular files, byte caps

@pytest.mark.parametrize('framework', ['vllm', 'prime-rl', 'skyrl', 'verl', 'trl'])
def test_import_of_a_fifo_is_refused_without_blocking(tmp_path, framework):
    from agentrl import interop
    fifo = tmp_path / 'pipe'
    os.mkfifo(fifo)                         # nobody writes it: opening it for reading would block forever
    with pytest.raises(ValueError, match=rf"^'{fifo}' is a FIFO, not a regular file; agentrl reads .* only from "
                                         'regular files: copy the data into a file and pass that$'):
        interop.import_records(fifo, framework)


@pytest.mark.parametrize('framework', ['vllm', 'slime'])
def test_import_of_dev_zero_is_refused(framework):
    from agentrl import interop
    with pytest.raises(ValueError, match=r"^'/dev/zero' is a character device, not a regular file"):
        interop.import_records('/dev/zero', framework)


def test_json_inputs_have_a_byte_cap(tmp_path, monkeypatch):
    from agentrl import interop
    from agentrl.io import read_json
    f = tmp_path / 'episodes.jsonl'
    f.write_text('{"exchanges": []}\n' * 100)
    monkeypatch.setenv('AGENTRL_MAX_INPUT_BYTES', '1000')
    with pytest.raises(ValueError, match=rf"^'{f}' holds 1800 bytes, over the bound of 1000 bytes for a JSON input "
                                         r'\(AGENTRL_MAX_INPUT_BYTES\); split the file, or raise'):
        interop.import_records(f, 'vllm')
    assert read_json(f, fix='', lines=True, max_bytes=1800) == [{'exchanges': []}] * 100


def test_import_cli_refuses_a_fifo_in_one_line(tmp_path):
    fifo = tmp_path / 'pipe'
    os.mkfifo(fifo)
    p = subprocess.run([*AGENTRL, 'import', str(fifo), '--from', 'prime-rl', '--out', str(tmp_path / 'run')],
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 2 and p.stderr == (f"agentrl: error: '{fifo}' is a FIFO, not a regular file; agentrl reads "
                                              'imports only from regular files: copy the data into a file and pass '
                                              'that\n')
    assert not (tmp_path / 'run').exists()


# ------------------------------------------------------------------------------ export: widths against the records

def test_export_width_past_the_cap_is_refused_before_allocating(tmp_path):
    from agentrl import interop
    out = tmp_path / 'verl'
    with pytest.raises(ValueError, match=r'^to_verl: prompt_length 100000000 is over the cap of 16777216 tokens; the '
                                         'longest prompt of these records is 3 tokens and the longest response 2: pass '
                                         r'widths near those \(or none: the longest\)$'):
        interop.export([record(0), record(1)], 'verl', out, prompt_length=100_000_000)
    assert not out.exists() and os.listdir(tmp_path) == []


def test_export_tensors_past_the_byte_bound_are_refused(tmp_path, monkeypatch):
    from agentrl import interop
    monkeypatch.setenv('AGENTRL_MAX_EXPORT_BYTES', str(1 << 20))
    out = tmp_path / 'verl'
    out.mkdir()                                             # an empty --out stays as it was
    with pytest.raises(ValueError, match=r'^to_verl: prompt_length 10000 \+ response_length 2 for 2 records would '
                                         r'allocate about 1120224 bytes of padded tensors, over the bound of 1048576 '
                                         r'bytes \(AGENTRL_MAX_EXPORT_BYTES\); the longest prompt'):
        interop.export([record(0), record(1)], 'verl', out, prompt_length=10_000)
    assert os.listdir(out) == [] and os.listdir(tmp_path) == ['verl']
    m = interop.export([record(0), record(1)], 'verl', out, prompt_length=16)
    assert m['records'] == 2 and sorted(os.listdir(out))[-1] == 'verl_batch.pt' and os.listdir(tmp_path) == ['verl']


def test_export_cli_refuses_the_flag_in_one_line(tmp_path):
    f = store.write_trajectories(tmp_path / 'trajectories.parquet', [record(0), record(1)])
    p = subprocess.run([*AGENTRL, 'export', str(f), '--to', 'verl', '--out', str(tmp_path / 'o'),
                        '--prompt-length', '100000000'], capture_output=True, text=True, timeout=300)
    assert p.returncode == 2 and p.stderr == ('agentrl: error: to_verl: prompt_length 100000000 is over the cap of '
                                              '16777216 tokens; the longest prompt of these records is 3 tokens and '
                                              'the longest response 2: pass widths near those (or none: the '
                                              'longest)\n'), p.stderr
    assert not (tmp_path / 'o').exists()


def test_export_killed_mid_write_leaves_no_out(tmp_path):
    """SIGKILL after the first file is written (a known point): --out never appears, empty or partial."""
    out = tmp_path / 'verl'
    script = f'''
import os, signal, sys
sys.path.insert(0, {os.path.dirname(__file__)!r})
from test_bounds import record
from agentrl.interop import files
real = files._save_pt
def save_then_die(obj, path):
    real(obj, path)
    os.kill(os.getpid(), signal.SIGKILL)
files._save_pt = save_then_die
files.export([record(0), record(1)], 'verl', {str(out)!r})
'''
    p = subprocess.run([sys.executable, '-c', script], capture_output=True, text=True, timeout=300)
    assert p.returncode == -9, p.stderr
    assert not out.exists()
    assert [n.startswith('.verl.tmp-') for n in os.listdir(tmp_path)] == [True]   # hidden, like every temporary


# ------------------------------------------------------------------------------ sandbox: source size, result size

def test_sandbox_refuses_a_huge_source_before_parsing_it(monkeypatch):
    from agentrl.gym import sandbox
    source = 'def f():\n    return 1\n' + 'x = 1\n' * 2_000_000           # 12 MB
    parsed = []
    real_parse = sandbox.ast.parse
    monkeypatch.setattr(sandbox.ast, 'parse', lambda src, *a, **k: parsed.append(len(src)) or real_parse(src, *a, **k))
    r = sandbox.run_tests(source, [((), 1)], 'f')
    assert parsed == []                                             # refused before it was parsed (or sent anywhere)
    assert r == [sandbox.TestResult(False, None, f'refused: the source is {len(source)} characters, over '
                                                 'MAX_SOURCE_CHARS (100000)')]
    assert sandbox.check_source(source) == r[0].error
    assert sandbox.run_tests('def f():\n    return 1\n', [((), 1)], 'f')[0].passed


def test_sandbox_result_whose_repr_never_ends_comes_back_as_a_summary():
    from agentrl.gym import sandbox
    source = 'def f():\n    t = (1, 2)\n    for i in range(60):\n        t = (t, t)\n    return t\n'
    r = sandbox.run_tests(source, [((), 0)], 'f')[0]
    assert not r.passed and r.error is None and isinstance(r.got, sandbox.Opaque)
    assert repr(r.got) == '<tuple whose repr is over MAX_RESULT_CHARS (10000) characters>'
    assert repr(r) == ("TestResult(passed=False, got=<tuple whose repr is over MAX_RESULT_CHARS (10000) characters>, "
                       'error=None)')
    small = sandbox.run_tests('def f():\n    return ((1, 2), 3)\n', [((), ((1, 2), 3))], 'f')[0]
    assert small.passed and small.got == ((1, 2), 3)


# ------------------------------------------------------------------------------ chat templates: characters and time

NESTED_LOOPS = ('{% for m in messages %}{% for a in range(100000) %}{% for b in range(100000) %}'
                '{% endfor %}{% endfor %}{{ m.content }}{% endfor %}')
HUGE_OUTPUT = ('{% for m in messages %}{% for a in range(100000) %}{% for b in range(100000) %}xxxxxxxxxx'
               '{% endfor %}{% endfor %}{% endfor %}')
HI = [{'role': 'user', 'content': 'Hi'}]


def tiny():
    pytest.importorskip('transformers')
    from _tokenizers import load
    return load('tiny')


def test_template_with_nested_loops_is_stopped_in_time(monkeypatch):
    import agentrl.templates as tt
    tok = tiny()
    monkeypatch.setenv('AGENTRL_TEMPLATE_SECONDS', '0.3')
    with pytest.raises(ValueError, match=r"^the chat template passed as chat_template= for '.*tiny-chat' took more "
                                         r'than 0.3 s to render one call \(AGENTRL_TEMPLATE_SECONDS\): a loop in the '
                                         'template that does not end; fix the template, or raise'):
        tt.ChatTemplate(tok, chat_template=NESTED_LOOPS).render(HI)
    ok = tt.ChatTemplate(tok)                                       # the thread renders normally afterwards
    assert ok.render(HI) == tok.apply_chat_template(HI, tokenize=False)


def test_a_timed_out_render_leaves_the_thread_as_it_was(tmp_path):
    """After a RenderTimeout, the rendering thread runs traced code normally (no eval breaker left set: a
    ``PyThreadState_SetAsyncExc(tid, NULL)`` clear made every later traced call spin for ever on 3.11)."""
    from _tokenizers import tokenizer_path
    path = tokenizer_path('tiny')
    code = (
        'import os, sys\n'
        "os.environ['AGENTRL_TEMPLATE_SECONDS'] = '0.3'\n"
        'import transformers\nimport agentrl.templates as tt\n'
        f'tok = transformers.AutoTokenizer.from_pretrained({str(path)!r})\n'
        'try:\n'
        f'    tt.ChatTemplate(tok, chat_template={NESTED_LOOPS!r}).render([{{"role": "user", "content": "Hi"}}])\n'
        'except ValueError as e:\n    print("refused", "took more than 0.3 s" in str(e))\n'
        'def f(x):\n    return x + 1\n'
        'sys.settrace(lambda *a: None)\n'
        'total = sum(f(i) for i in range(1000))\n'
        'sys.settrace(None)\n'
        'print("traced", total)\n')
    res = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True, timeout=120,
                         env={**os.environ, 'HF_HUB_OFFLINE': '1', 'TRANSFORMERS_OFFLINE': '1'})
    assert res.returncode == 0, res.stderr[-2000:]
    assert res.stdout.split('\n')[-3:] == ['refused True', 'traced 500500', '']


def test_audit_stops_at_the_first_render_past_its_time(monkeypatch):
    """Probes that note a bad render as a finding (end-of-turn, owners, prefix, bridges) re-raise a timeout: a
    looping template costs one render budget, not one per probe."""
    import agentrl.templates as tt
    from agentrl.templates.budget import TemplateTimeoutError
    tok = tiny()
    calls = []
    real = tok.apply_chat_template
    monkeypatch.setattr(tok, 'apply_chat_template', lambda *a, **k: calls.append(1) or real(*a, **k), raising=False)
    monkeypatch.setenv('AGENTRL_TEMPLATE_SECONDS', '0.2')
    monkeypatch.setattr(tok, 'chat_template', NESTED_LOOPS)
    with pytest.raises(TemplateTimeoutError) as e:
        tt.audit_template(tok, HI + [{'role': 'assistant', 'content': 'Hello'}])
    assert str(e.value) == (f"the chat template of {tok.name_or_path!r} took more than 0.2 s to render one call "
                            '(AGENTRL_TEMPLATE_SECONDS): a loop in the template that does not end; fix the template, '
                            'or raise AGENTRL_TEMPLATE_SECONDS if you trust it')
    assert len(calls) == 1


def test_template_writing_too_much_is_stopped_at_the_character_bound(monkeypatch):
    import agentrl.templates as tt
    tok = tiny()
    monkeypatch.setenv('AGENTRL_TEMPLATE_MAX_CHARS', '100000')
    with pytest.raises(ValueError, match=r"^the chat template passed as chat_template= for '.*' wrote more than "
                                         r'100000 characters in one render call \(100010 so far; '
                                         r'AGENTRL_TEMPLATE_MAX_CHARS\)'):
        tt.ChatTemplate(tok, chat_template=HUGE_OUTPUT).render(HI)
    monkeypatch.setenv('AGENTRL_TEMPLATE_MAX_CHARS', '1000000000')
    monkeypatch.setenv('AGENTRL_TEMPLATE_SECONDS', '0.3')           # the time bound stops it where the characters do not
    with pytest.raises(ValueError, match='took more than 0.3 s'):
        tt.ChatTemplate(tok, chat_template=HUGE_OUTPUT).render(HI)


def test_template_budget_holds_in_any_thread(monkeypatch):
    import concurrent.futures

    import agentrl.templates as tt
    tok = tiny()
    monkeypatch.setenv('AGENTRL_TEMPLATE_SECONDS', '0.3')
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        bad = pool.submit(lambda: tt.ChatTemplate(tok, chat_template=NESTED_LOOPS).render(HI))
        good = pool.submit(lambda: [tt.ChatTemplate(tok).render(HI) for _ in range(20)])
        with pytest.raises(ValueError, match='took more than 0.3 s'):
            bad.result(timeout=300)
        assert good.result(timeout=300)[0] == tok.apply_chat_template(HI, tokenize=False)


def test_template_audit_cli_ends_on_a_hanging_template(tmp_path):
    import shutil
    from _tokenizers import tokenizer_path
    tiny()
    folder = tmp_path / 'tok'
    shutil.copytree(tokenizer_path('tiny'), folder)
    for f in folder.glob('chat_template.jinja'):
        f.unlink()
    import json
    cfg = json.loads((folder / 'tokenizer_config.json').read_text())
    cfg['chat_template'] = NESTED_LOOPS
    (folder / 'tokenizer_config.json').write_text(json.dumps(cfg))
    env = dict(os.environ, AGENTRL_TEMPLATE_SECONDS='0.5', HF_HUB_OFFLINE='1')
    p = subprocess.run([*AGENTRL, 'template', 'audit', str(folder)], capture_output=True, text=True, env=env,
                       timeout=300)
    assert p.returncode != 0 and p.stderr.count('\n') == 1, p.stderr
    assert f"the chat template of '{folder}' took more than 0.5 s to render one call" in p.stderr


# ------------------------------------------------------------------------------ SIGTERM ends a job within seconds

def _catches_sigterm(pid: int) -> bool:
    """True once process ``pid`` runs its own SIGTERM handler (Linux: SigCgt of /proc/PID/status)."""
    import signal
    for line in open(f'/proc/{pid}/status').read().splitlines():
        if line.startswith('SigCgt:'):
            return bool(int(line.split()[1], 16) >> (signal.SIGTERM - 1) & 1)
    return False


@pytest.mark.skipif(not os.path.exists('/proc/self/status'), reason='needs /proc to see the handler installed')
def test_sigterm_stops_a_rollout_in_the_middle_of_a_long_chunk(tmp_path):
    """One chunk of 60,000 episodes (minutes): SIGTERM, sent once the job's handler is installed, ends it at once."""
    import signal
    import time
    out = tmp_path / 'run'
    proc = subprocess.Popen([*AGENTRL, 'rollout', '--policy', 'model', '--split', 'heldout', '--repeats', '10000',
                             '--no-batch', '--chunk-size', '60000', '--out', str(out)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        while not _catches_sigterm(proc.pid):
            assert proc.poll() is None, proc.communicate()
            time.sleep(0.05)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=300)       # a hang guard only: the chunk alone would take far longer
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130 and err == 'agentrl: interrupted\n', err
    assert not out.exists()          # stopped inside the chunk: no shard was written, OUT is left as it was (absent)


def test_an_interrupt_right_after_model_pt_is_renamed_still_leaves_out_as_it_was(tmp_path, monkeypatch):
    """The race behind a once-failed SIGTERM test: the signal landed in ``atomic_write``'s folder fsync, after the
    rename of ``model.pt`` but before the job had noted the file, so the undo missed it and OUT was left behind."""
    import agentrl.jobs.rollout as jr
    from agentrl.jobs.plan import RolloutOptions
    real = jr.atomic_write

    def late(final, data, **kw):
        path = real(final, data, **kw)
        if path.name == 'model.pt':
            raise KeyboardInterrupt             # as a signal handler raising between the rename and the return
        return path
    monkeypatch.setattr(jr, 'atomic_write', late)
    out = tmp_path / 'run'
    with pytest.raises(KeyboardInterrupt):
        jr.rollout_job(RolloutOptions(policy=['model'], split='heldout', repeats=1, out=str(out)), progress=False)
    assert not out.exists()
