"""Ownership pictures (book Figures 5.1/5.2), `agentrl show`, `agentrl report`, and a real browser.

The browser tests drive Debian's headless Chromium over the DevTools protocol on a pipe
(``--remote-debugging-pipe``, stdlib only). They skip, saying why, only when no Chromium binary
is installed; CI installs it (``apt-get install chromium``).

Regenerate the golden SVG on purpose with ``AGENTRL_REGEN_GOLDEN=1 pytest tests/test_viz.py``.
"""
import base64
import fcntl
import json
import os
import queue
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import xml.etree.ElementTree as ET
from html import escape
from pathlib import Path

import pytest
import torch

import agentrl as arl
from agentrl import store, viz
from agentrl.cli.main import main
from agentrl.record import Provenance, Trajectory

from _tokenizers import tokenizer_path

GOLDEN = Path(__file__).parent / 'golden' / 'oracle_clamp.svg'
REGEN = os.environ.get('AGENTRL_REGEN_GOLDEN') == '1'
ANSI = re.compile(r'\x1b\[[0-9;]*m')


# ----------------------------------------------------------------------------- fixtures

@pytest.fixture(scope='module')
def oracle_clamp(tasks, tok):
    return arl.scripted_rollout(arl.scripted_policy('oracle'), arl.BugFixEnv(), tasks[0], tok)


@pytest.fixture(scope='module')
def run_dir(tmp_path_factory, tasks, tok):
    """A small run folder: oracle and blind on four tasks, written as `agentrl rollout` writes it."""
    out = tmp_path_factory.mktemp('run')
    rc = main(['rollout', '--policy', 'oracle,blind', '--split', 'heldout', '--repeats', '1', '--out', str(out)])
    assert rc == 0
    return out


def _long_record(n_tool=120, long_token=False):
    """A hand-built record with a long tool run (folds) and an optional very long token."""
    ids = [1] + [10] * 5 + [5, 20, 6] + [3] + [30 + (k % 50) for k in range(n_tool)] + [4] + [5, 21, 6]
    owner = (['template'] + ['prompt'] * 5 + ['policy'] * 3 + ['template'] + ['tool'] * n_tool + ['template']
             + ['policy'] * 3)
    turn = [-1] * 6 + [0] * (5 + n_tool) + [1] * 3
    logp = [0.0 if o != 'policy' else -0.25 for o in owner]
    t = Trajectory.from_tokens(ids, owner, turn, logp, 0.0, {'stop': 'budget', 'task': 'synthetic'},
                               provenance=Provenance(policy='model'))
    words = {i: f'w{i}' for i in set(ids)}
    if long_token:
        words[30] = 'x' * 200

    def dec(xs):
        return [words[int(i)] for i in xs]
    dec.name = 'test words'
    return t, dec


# ----------------------------------------------------------------------------- strip model

def test_strip_alignment(oracle_clamp, tok):
    s = viz.build_strip(oracle_clamp)
    t = oracle_clamp
    assert s.decoded == 'word tokenizer'
    assert [c.text for c in s.cells] == [tok.itos[int(i)] for i in t.ids]
    assert s.cells[0].mask is None and s.cells[0].logp is None
    for c in s.cells[1:]:
        assert c.mask == int(t.action_mask[c.pos - 1]) and c.logp == float(t.sample_logp[c.pos - 1])
    assert (len(s.cells), s.n_policy, s.mask_sum) == (76, 13, 13)
    assert not any(c.mask_mismatch for c in s.cells)
    # segments tile the record; turn boundaries before each call; nothing folds at the default
    assert [(g.start, g.stop) for g in s.segments][0] == (0, 1) and s.segments[-1].stop == 76
    assert sum(len(g) for g in s.segments) == 76
    assert [g.start for g in s.segments if g.turn_start] == [7, 35, 42, 73]
    assert not any(g.folded for g in s.segments)
    # folding is a view choice: fold=20 folds the 23- and 26-token tool observations only
    folded = viz.build_strip(oracle_clamp, fold=20)
    assert [(g.owner, len(g)) for g in folded.segments if g.folded] == [('tool', 23), ('tool', 26)]


def test_strip_shows_a_shifted_mask():
    """A mask that is off by one is drawn where it is stored, and flagged on both ends."""
    t, dec = _long_record(n_tool=4)
    bad = Trajectory(ids=t.ids, action_mask=torch.roll(t.action_mask, -1), sample_logp=t.sample_logp,
                     reward=t.reward, info=t.info, owner=t.owner, turn=t.turn, provenance=t.provenance)
    s = viz.build_strip(bad, dec)
    assert [c.pos for c in s.cells if c.mask_mismatch] == [5, 8, 14, 17]
    assert ' mx"' in viz.to_html(s) and 'class="mx"' in viz.to_svg(s)


def test_strip_marks_and_errors():
    t, dec = _long_record(n_tool=4)
    t.info['drift_spans'] = [[10, 12]]
    s = viz.build_strip(t, dec, marks={3: 'refused: X'})
    assert {c.pos: c.mark for c in s.cells if c.mark} == {3: 'refused: X', 10: 'drift', 11: 'drift'}
    no_owner = Trajectory(ids=t.ids, action_mask=t.action_mask, sample_logp=t.sample_logp, reward=0.0, info={},
                          owner=None, turn=None)
    with pytest.raises(ValueError, match='no owner array'):
        viz.build_strip(no_owner, dec)


def test_display_text():
    assert [viz.display_text(x) for x in ['<nl>', ' clamp', '\n\n', '', 'a\tb', '\x00']] == \
        ['⏎', '·clamp', '⏎⏎', '∅', 'a⇥b', '\\x00']


def test_hf_decoder_on_shared_qwen3(monkeypatch):
    pytest.importorskip('transformers')
    qdir = tokenizer_path('qwen3')          # $AGENTRL_TOKENIZERS, ../shared/tokenizers, the hub; else a skip
    root = qdir.parent
    monkeypatch.setenv('AGENTRL_TOKENIZERS', str(root))
    qtok = viz.decoders._load_hf(str(qdir))
    text = '<|im_start|>user\nclamp(3, 0, 5) returns 0<|im_end|>\n<|im_start|>assistant\n<think>'
    ids = qtok(text, add_special_tokens=False).input_ids
    owner = ['template'] * 3 + ['prompt'] * (len(ids) - 7) + ['template'] * 3 + ['policy']
    t = Trajectory.from_tokens(ids, owner, [-1] * len(ids), [0.0] * len(ids), 0.0, {},
                               provenance=Provenance(policy='hf', model='Qwen/Qwen3-0.6B', tokenizer='f' * 16))
    assert viz.build_strip(t).decoded == 'ids'          # the model's tokenizer is not the one of the fingerprint
    t.provenance.tokenizer = ''                          # no fingerprint: the model name is trusted
    s = viz.build_strip(t)
    assert s.decoded.startswith('hf:') and ''.join(c.text for c in s.cells) == text
    assert s.cells[-1].text == '<think>' and s.cells[-1].mask == 1
    # no model name: the tokenizer digest in the provenance finds the shared folder
    try:
        from agentrl.templates.chat import tokenizer_fingerprint
    except ImportError:
        return
    t.provenance = Provenance(policy='hf', tokenizer=tokenizer_fingerprint(qtok))
    assert ''.join(c.text for c in viz.build_strip(t).cells) == text


def _qwen3_run(tmp_path):
    """A file of one HF record tokenized with the shared Qwen3 tokenizer, its model folder gone; or skip."""
    pytest.importorskip('transformers')
    from agentrl.templates.chat import find_tokenizer_dir, tokenizer_fingerprint
    try:
        folder = find_tokenizer_dir('qwen3', hub=False)
    except FileNotFoundError as e:
        pytest.skip(str(e))
    qtok = viz.decoders._load_hf(str(folder))
    ids = qtok('<|im_start|>user\nclamp<|im_end|>\n', add_special_tokens=False).input_ids
    t = Trajectory.from_tokens(ids, ['template'] + ['prompt'] * (len(ids) - 3) + ['template'] * 2, [-1] * len(ids),
                               [0.0] * len(ids), 0.0, {}, provenance=Provenance(
                                   policy='hf', model=str(tmp_path / 'gone'), tokenizer=tokenizer_fingerprint(qtok)))
    path = tmp_path / 'hf.parquet'
    store.write_trajectories(path, [t])
    return path, tokenizer_fingerprint(qtok)


def test_show_finds_the_records_tokenizer_and_refuses_another(tmp_path, capsys, monkeypatch):
    path, fp = _qwen3_run(tmp_path)
    monkeypatch.delenv('AGENTRL_TOKENIZERS', raising=False)
    assert main(['show', str(path), '--width', '120']) == 0          # found from the fingerprint (shared/tokenizers)
    cap = capsys.readouterr()
    assert 'clamp' in ANSI.sub('', cap.out) and '#151644' not in cap.out and 'note:' not in cap.err
    tiny = Path(__file__).parent / 'assets' / 'tiny-chat'
    from agentrl.templates.chat import tokenizer_fingerprint
    tiny_fp = tokenizer_fingerprint(viz.decoders._load_hf(str(tiny)))
    assert main(['show', str(path), '--tokenizer', str(tiny)]) == 2
    assert capsys.readouterr().err == (
        f"agentrl: error: --tokenizer {str(tiny)!r} has fingerprint {tiny_fp} but the record was tokenized with "
        f'{fp}, so its token text would be wrong; pass the tokenizer the record was sampled with, or none (it is '
        'then found from the provenance)\n')


def test_show_notes_a_tokenizer_it_cannot_find(tmp_path, capsys, monkeypatch):
    pytest.importorskip('transformers')
    t = Trajectory.from_tokens([151644, 872, 151645], ['template', 'prompt', 'template'], [-1] * 3, [0.0] * 3, 0.0,
                               {}, provenance=Provenance(policy='hf', model=str(tmp_path / 'gone'),
                                                         tokenizer='f' * 16))
    store.write_trajectories(tmp_path / 'hf.parquet', [t])
    assert main(['show', str(tmp_path / 'hf.parquet'), '--width', '120']) == 0
    cap = capsys.readouterr()
    assert '#151645' in ANSI.sub('', cap.out)
    assert cap.err == ("note: no tokenizer with the record's fingerprint ffffffffffffffff was found "
                       '($AGENTRL_TOKENIZERS, ../shared/tokenizers, the hub); showing ids: pass --tokenizer DIR (the '
                       'tokenizer the records were sampled with) for token text\n')


# ----------------------------------------------------------------------------- SVG

def _svg(traj, title='oracle \u00b7 clamp'):
    """The figure of a record; the golden fixes the title so provenance naming cannot move it."""
    return viz.to_svg(viz.build_strip(traj, title=title))


def test_svg_oracle_clamp(oracle_clamp):
    svg = _svg(oracle_clamp)
    root = ET.fromstring(svg.encode())                     # well-formed XML
    ns = '{http://www.w3.org/2000/svg}'
    cells = [r for r in root.iter(f'{ns}rect') if r.get('class', '').split()[:1] == ['cell']]
    assert len(cells) == 76
    assert sum('o-policy' in r.get('class') for r in cells) == 13
    assert sum(r.get('class') == 'm1' for r in root.iter(f'{ns}line')) == 13      # mask rule under 13 cells
    assert svg == _svg(oracle_clamp)                       # deterministic
    assert 'http://www.w3.org/2000/svg' in svg and 'href' not in svg and 'url(' not in svg


def test_svg_matches_golden(oracle_clamp):
    svg = _svg(oracle_clamp)
    if REGEN:
        GOLDEN.parent.mkdir(exist_ok=True)
        GOLDEN.write_text(svg, encoding='utf-8')
    assert GOLDEN.exists(), f'{GOLDEN} is missing; create it with AGENTRL_REGEN_GOLDEN=1 pytest tests/test_viz.py'
    assert svg == GOLDEN.read_text(encoding='utf-8'), \
        'SVG differs from the golden file; if the change is intended, rerun with AGENTRL_REGEN_GOLDEN=1'


def test_svg_folds_long_runs():
    t, dec = _long_record(n_tool=120)
    svg = viz.to_svg(viz.build_strip(t, dec))
    assert svg.count('class="cell ') == len(t) - 120 and 'tool \u00d7 120 (folded)' in svg
    assert viz.to_svg(viz.build_strip(t, dec, fold=0)).count('class="cell ') == len(t)


# ----------------------------------------------------------------------------- terminal

def _strip_words(out: str):
    """Token words of the strip part of `show --format term` output, plus every line's width."""
    from rich.cells import cell_len
    lines = ANSI.sub('', out).splitlines()
    start = next(i for i, line in enumerate(lines) if 'turn k' in line) + 1
    words, widths = [], [cell_len(line) for line in lines]
    body = lines[start:]
    assert len(body) % 2 == 0, 'token lines and mask-rule lines alternate'
    for top, rule in zip(body[::2], body[1::2]):
        m = re.match(r'^\s*(\d+) (.*)$', top)
        assert m, top
        words += [w for w in m.group(2).split(' ') if not re.fullmatch('\u2502\\d+', w)]
        assert set(rule) <= {' ', '\u2500', '\u2501'}, rule
    return words, widths


def test_show_term_fits_80_columns(oracle_clamp, tmp_path):
    path = tmp_path / 'oracle.parquet'
    store.write_trajectories(path, [oracle_clamp])
    env = dict(os.environ, COLUMNS='80', TERM='dumb')
    env.pop('FORCE_COLOR', None)
    proc = subprocess.run([sys.executable, '-m', 'agentrl', 'show', str(path), '--format', 'term'],
                          capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr
    words, widths = _strip_words(proc.stdout)
    assert max(widths) <= 80
    strip = viz.build_strip(oracle_clamp)
    assert words == [viz.display_text(c.text) for c in strip.cells]   # every token whole, in order


def test_term_never_breaks_a_token():
    t, dec = _long_record(n_tool=30, long_token=True)
    strip = viz.build_strip(t, dec)
    for width in (20, 33, 80):
        lines = [line.plain for line in viz.term_lines(strip, width)]
        assert max(len(line) for line in lines) <= width
        words = [w for top in lines[::2] for w in top.split()[1:] if not w.startswith('\u2502')]
        assert len(words) == len(t)
        assert all(w == viz.display_text(c.text) or w.endswith('\u2026') for w, c in zip(words, strip.cells))
    folded = [line.plain for line in viz.term_lines(viz.build_strip(t, dec, fold=10), 80)]
    assert any('[\u2026 30 tool tokens]' in line for line in folded)


# ----------------------------------------------------------------------------- CLI

def test_show_cli_formats(oracle_clamp, tmp_path, capsys):
    path = tmp_path / 'recs.parquet'
    other, _ = _long_record()
    store.write_trajectories(path, [other, oracle_clamp])
    svg, html = tmp_path / 'a.svg', tmp_path / 'a.html'
    assert main(['show', str(path), '--episode', '1', '--out', str(svg)]) == 0       # format from suffix
    assert svg.read_text() == _svg(oracle_clamp, title=None)
    assert main(['show', str(path), '--policy', oracle_clamp.provenance.policy, '-f', 'html', '-o', str(html)]) == 0
    page = html.read_text()
    assert page.count('class="tok o-') == 76 and page.count('class="tok o-policy') == 13
    out = capsys.readouterr().out
    assert 'wrote' in out and '76 tokens, 13 policy, mask sum 13' in out
    for bad in ('http://', 'https://', 'src=', 'href=', '@import', 'url('):
        assert bad not in page


def test_show_cli_errors(tmp_path, oracle_clamp, capsys):
    path = tmp_path / 'one.parquet'
    store.write_trajectories(path, [oracle_clamp])
    cases = [(['show', str(tmp_path / 'nope.parquet')], 'does not exist; pass a trajectories.parquet'),
             (['show', str(path), '--episode', '5'], '--episode 5 is out of range: ' + str(path) + ' has 1 record;'),
             (['show', str(path), '--policy', 'blind'], "no records of policy 'blind'"),
             (['report', str(tmp_path / 'norun')], 'does not exist; create it with `agentrl rollout --out')]
    for argv, msg in cases:
        assert main(argv) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith('agentrl: error: ') and msg in err and '\n' not in err
    (tmp_path / 'bad.parquet').write_text('not parquet')
    assert main(['show', str(tmp_path / 'bad.parquet')]) == 2
    assert 'agentrl: error:' in capsys.readouterr().err


def test_show_template_audit_json(tmp_path, capsys):
    audit = {'records': [{'ids': [1, 7, 8, 9, 4], 'owner': ['template', 'prompt', 'prompt', 'policy', 'template'],
                          'turn': [-1, -1, -1, 0, 0], 'drift_spans': [[3, 4]], 'model': ''}]}
    path = tmp_path / 'audit.json'
    path.write_text(json.dumps(audit))
    out = tmp_path / 'audit.svg'
    assert main(['show', str(path), '--out', str(out)]) == 0
    assert out.read_text().count('class="cell ') == 5 and 'cell o-policy marked' in out.read_text()


AUDIT_FIX = 'a template audit .json lists records {"ids": [int, ...], "owner": [name or code, ...], ...}'
OWNER_WANT = 'owner name or code (template, prompt, policy, tool or 0-3)'


@pytest.mark.parametrize('content, message', [
    (b'{"ids": [1, 2', "is not valid JSON (Expecting ',' delimiter at line 1 column 14); " + AUDIT_FIX),
    (b'\xff\xfe{}', 'is not UTF-8 text (byte 0xff at offset 0); ' + AUDIT_FIX),
    (b'{"records": 3}', ': records: is a number, not a list; ' + AUDIT_FIX),
    (b'[1]', ' entry 0: is a number, not an object with "ids" and "owner"; ' + AUDIT_FIX),
    (b'{"owner": ["prompt"]}', ' entry 0: ids: is missing; ' + AUDIT_FIX),
    (b'{"ids": 5, "owner": ["prompt"]}',
     ' entry 0: ids: is a number, not a list; give one token id (int >= 0) per token; ' + AUDIT_FIX),
    (b'{"ids": [1, -2], "owner": ["prompt", "policy"]}',
     ' entry 0: ids[1]: is -2, not a valid token id (int >= 0); ' + AUDIT_FIX),
    (b'{"ids": [1, 2], "owner": ["prompt", "bogus"]}',
     f" entry 0: owner[1]: is 'bogus', not a valid {OWNER_WANT}; " + AUDIT_FIX),
    (b'{"ids": [1, 2], "owner": ["prompt", [2]]}', f' entry 0: owner[1]: is [2], not a valid {OWNER_WANT}; ' + AUDIT_FIX),
    (b'{"ids": [1, 2], "owner": ["prompt", "policy"], "turn": [0]}',
     ' entry 0: turn: has 1 entries, ids has 2; give one per token; ' + AUDIT_FIX),
    (b'{"ids": [1, 2], "owner": ["prompt", "policy"], "reward": "x"}', " entry 0: reward: is 'x', not a number; " + AUDIT_FIX),
    (b'{"ids": [1, 2], "owner": ["prompt", "policy"], "info": [1]}', ' entry 0: info: is a list, not an object; ' + AUDIT_FIX),
    (b'{"ids": [], "owner": []}', ' entry 0: ids is empty: a trajectory needs at least its first context token'),
])
def test_show_malformed_audit_is_one_line(tmp_path, capsys, content, message):
    """A template audit that is not UTF-8 JSON of records: one line naming the file, the entry and the field."""
    path = tmp_path / 'audit.json'
    path.write_bytes(content)
    sep = '' if message.startswith((':', ' ')) else ' '
    want = f'agentrl: error: {str(path)!r}{sep}{message}\n'
    assert main(['show', str(path), '-o', str(tmp_path / 'a.svg')]) == 2
    assert capsys.readouterr().err == want
    assert not (tmp_path / 'a.svg').exists()
    with pytest.raises(ValueError) as e:
        viz.load_audit(str(path))
    assert f'agentrl: error: {e.value}\n' == want


def test_report_names_a_damaged_summary(run_dir, tmp_path, capsys):
    run = tmp_path / 'run'
    shutil.copytree(run_dir / 'trajectories', run / 'trajectories')
    summary = run / 'summary.json'
    fix = 'delete it or rerun `agentrl rollout`'
    for content, why in [(b'{"episodes": ', 'is not valid JSON (Expecting value at line 1 column 14)'),
                         (b'{"x": "\xe9"}', 'is not UTF-8 text (byte 0xe9 at offset 7)')]:
        summary.write_bytes(content)
        assert main(['report', str(run)]) == 2
        assert capsys.readouterr().err.strip() == f'agentrl: error: {str(summary)!r} {why}; {fix}'
    summary.write_text('[1, 2]')
    assert main(['report', str(run)]) == 2
    assert capsys.readouterr().err.strip() == (f'agentrl: error: {str(summary)!r} is not a run summary (a JSON '
                                               f'object); {fix}')
    assert not (run / 'report.html').exists()


def test_report_cli(run_dir, capsys):
    assert main(['report', str(run_dir)]) == 0
    line = capsys.readouterr().out.strip().splitlines()[-1]
    recs = store.read_trajectories(run_dir / 'trajectories')
    policies = sorted({t.provenance.policy for t in recs})          # oracle, blind
    assert line.startswith(f'wrote {run_dir}/report.html: 12 episodes, {len(policies)} policies')
    page = (run_dir / 'report.html').read_text()
    assert page.count('class="tok o-') == len(recs[0])
    for word in (*policies, 'Stop reasons', 'Context length after each turn', 'Episode length',
                 'Action tokens per episode', 'Truncation rate', 'First episode'):
        assert word in page
    for bad in ('https://', 'src=', 'href=', '@import', 'url('):
        assert bad not in page
    assert 'class="notice"' not in page and 'incomplete' not in line       # a complete run


def test_report_says_a_run_is_incomplete(tmp_path, capsys):
    out = tmp_path / 'run'
    assert main(['rollout', '--policy', 'oracle', '--split', 'heldout', '--repeats', '1', '--chunk-size', '4',
                 '--out', str(out)]) == 0
    (out / 'trajectories' / 'part-000001.parquet').unlink()              # 4 of the 6 episodes are left
    resume = f'resume with `agentrl rollout --resume {out}`'
    for note in (f'incomplete: 4 of 6 episodes stored; {resume}',
                 f'incomplete: 4 of 6 episodes stored, no summary.json; {resume}'):
        capsys.readouterr()
        assert main(['report', str(out)]) == 0
        line = capsys.readouterr().out
        assert re.fullmatch(rf'wrote {re.escape(str(out))}/report\.html: 4 episodes, 1 policy, \d+ KB in '
                            rf'\d+\.\d s; {re.escape(note)}\n', line), line
        page = (out / 'report.html').read_text()
        assert f'</h1><p class="notice">{escape(note)}</p><p class="meta">' in page
        (out / 'summary.json').unlink(missing_ok=True)                   # then: interrupted before its summary


def test_report_and_show_say_a_run_holds_duplicates(run_dir, tmp_path, capsys):
    """A shard copied under another name: report counts unique episodes and says check refuses the repeats."""
    run = tmp_path / 'run'
    shutil.copytree(run_dir, run)
    shard = sorted((run / 'trajectories').glob('part-*.parquet'))[0]
    n = len(store.read_trajectories(shard))
    shutil.copy(shard, run / 'trajectories' / 'part-000009.parquet')
    note = f'{n} duplicate records (same identity) — `agentrl check {run}` refuses them'
    capsys.readouterr()
    assert main(['report', str(run)]) == 0
    line = capsys.readouterr().out
    assert re.fullmatch(rf'wrote {re.escape(str(run))}/report\.html: 12 episodes, 2 policies, \d+ KB in '
                        rf'\d+\.\d s; {re.escape(note)}\n', line), line
    assert f'</h1><p class="notice">{escape(note)}</p><p class="meta">' in (run / 'report.html').read_text()
    assert main(['show', str(run), '-o', str(tmp_path / 'a.svg')]) == 0
    assert f'episode 0 ({12 + n} in file; {note}), ' in capsys.readouterr().out


# ----------------------------------------------------------------------------- browser

CHROMIUM_FLAGS = ['--headless', '--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run',
                  '--disable-background-networking', '--disable-component-update', '--disable-sync',
                  '--disable-default-apps', '--disable-extensions', '--mute-audio', '--hide-scrollbars',
                  '--remote-debugging-pipe']


def find_chromium():
    for name in ('chromium', 'chromium-browser', 'google-chrome', 'google-chrome-stable'):
        if shutil.which(name):
            return shutil.which(name)
    return None


class Browser:
    """Headless Chromium over the DevTools protocol on a pipe (fds 3 and 4): stdlib only."""

    def __init__(self, binary, width=1280, height=900, timeout=180.0):
        self.timeout = timeout
        self.profile = tempfile.mkdtemp(prefix='agentrl-chromium-')
        cmd_r, self._cmd_w = os.pipe()
        self._res_r, res_w = os.pipe()

        def child():                      # the protocol reads commands on fd 3, answers on fd 4
            a, b = fcntl.fcntl(cmd_r, fcntl.F_DUPFD, 10), fcntl.fcntl(res_w, fcntl.F_DUPFD, 10)
            os.dup2(a, 3)
            os.dup2(b, 4)

        self.proc = subprocess.Popen([binary, *CHROMIUM_FLAGS, f'--user-data-dir={self.profile}',
                                      f'--window-size={width},{height}', 'about:blank'],
                                     stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL, preexec_fn=child, pass_fds=(3, 4))
        os.close(cmd_r)
        os.close(res_w)
        self._id, self._replies, self._events = 0, {}, queue.Queue()
        self._cond = threading.Condition()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        buf = b''
        while True:
            try:
                chunk = os.read(self._res_r, 1 << 16)
            except OSError:
                chunk = b''
            if not chunk:
                with self._cond:
                    self._replies[None] = 'closed'
                    self._cond.notify_all()
                return
            buf += chunk
            while b'\0' in buf:
                raw, buf = buf.split(b'\0', 1)
                msg = json.loads(raw)
                if 'id' in msg:
                    with self._cond:
                        self._replies[msg['id']] = msg
                        self._cond.notify_all()
                else:
                    self._events.put(msg)

    def send(self, method, params=None, session=None):
        self._id += 1
        msg = {'id': self._id, 'method': method, 'params': params or {}}
        if session:
            msg['sessionId'] = session
        os.write(self._cmd_w, json.dumps(msg).encode() + b'\0')
        deadline = time.monotonic() + self.timeout
        with self._cond:
            while self._id not in self._replies:
                if None in self._replies:
                    raise RuntimeError(f'chromium exited while waiting for {method}')
                if time.monotonic() > deadline:
                    raise TimeoutError(f'chromium did not answer {method} within {self.timeout} s')
                self._cond.wait(0.1)
            reply = self._replies.pop(self._id)
        if 'error' in reply:
            raise RuntimeError(f'{method}: {reply["error"]}')
        return reply.get('result', {})

    def drain(self, into):
        while True:
            try:
                into.append(self._events.get_nowait())
            except queue.Empty:
                return into

    def wait_event(self, method, session, into):
        deadline = time.monotonic() + self.timeout
        while time.monotonic() < deadline:
            try:
                ev = self._events.get(timeout=0.1)
            except queue.Empty:
                continue
            into.append(ev)
            if ev.get('method') == method and ev.get('sessionId') == session:
                return ev
        raise TimeoutError(f'no {method} within {self.timeout} s')

    def open(self, path, width=1280, height=900):
        """Load a local file in a new tab; return a :class:`Page`."""
        target = self.send('Target.createTarget', {'url': 'about:blank'})['targetId']
        session = self.send('Target.attachToTarget', {'targetId': target, 'flatten': True})['sessionId']
        for domain in ('Page', 'Runtime', 'Log', 'Network'):
            self.send(f'{domain}.enable', session=session)
        self.send('Emulation.setDeviceMetricsOverride',
                  {'width': width, 'height': height, 'deviceScaleFactor': 1, 'mobile': False}, session=session)
        page = Page(self, session, 'file://' + os.path.abspath(path))
        self.drain([])
        self.send('Page.navigate', {'url': page.url}, session=session)
        self.wait_event('Page.loadEventFired', session, page.events)
        return page

    def close(self):
        try:
            self.send('Browser.close')
        except Exception:  # noqa: BLE001 - closing anyway
            pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        for fd in (self._cmd_w, self._res_r):
            try:
                os.close(fd)
            except OSError:
                pass
        shutil.rmtree(self.profile, ignore_errors=True)


class Page:
    def __init__(self, browser, session, url):
        self.browser, self.session, self.url, self.events = browser, session, url, []

    def eval(self, expr):
        res = self.browser.send('Runtime.evaluate', {'expression': expr, 'returnByValue': True},
                                session=self.session)
        if 'exceptionDetails' in res:
            raise RuntimeError(f'JS error in {expr!r}: {res["exceptionDetails"]}')
        return res['result'].get('value')

    def mouse(self, x, y, kind='mouseMoved', **extra):
        self.browser.send('Input.dispatchMouseEvent', {'type': kind, 'x': x, 'y': y, **extra}, session=self.session)

    def click_selector(self, selector):
        x, y = self.eval(f'(function(){{var r=document.querySelector({json.dumps(selector)}).getBoundingClientRect();'
                         'return [r.left + r.width / 2, r.top + r.height / 2];})()')
        self.mouse(x, y)
        self.mouse(x, y, 'mousePressed', button='left', clickCount=1)
        self.mouse(x, y, 'mouseReleased', button='left', clickCount=1)

    def screenshot(self, path, width=None):
        w, h = self.eval('[document.documentElement.scrollWidth, document.documentElement.scrollHeight]')
        data = self.browser.send('Page.captureScreenshot', {
            'format': 'png', 'captureBeyondViewport': True,
            'clip': {'x': 0, 'y': 0, 'width': width or w, 'height': h, 'scale': 1}}, session=self.session)['data']
        Path(path).write_bytes(base64.b64decode(data))
        return path

    def problems(self):
        """(console errors, URLs requested other than the page itself)."""
        self.browser.drain(self.events)
        errors, fetched = [], []
        for ev in self.events:
            if ev.get('sessionId') != self.session:
                continue
            m, p = ev.get('method'), ev.get('params', {})
            if m == 'Runtime.consoleAPICalled' and p.get('type') in ('error', 'assert', 'warning'):
                errors.append(' '.join(str(a.get('value', a.get('description', ''))) for a in p.get('args', [])))
            elif m == 'Runtime.exceptionThrown':
                errors.append(json.dumps(p.get('exceptionDetails', {}))[:300])
            elif m == 'Log.entryAdded' and p.get('entry', {}).get('level') in ('error', 'warning'):
                errors.append(p['entry'].get('text', ''))
            elif m == 'Network.requestWillBeSent' and p.get('request', {}).get('url') != self.url:
                fetched.append(p['request']['url'])
        return errors, fetched


@pytest.fixture(scope='module')
def browser():
    binary = find_chromium()
    if binary is None:
        pytest.skip('headless Chromium is not installed (apt-get install chromium); CI installs it')
    b = Browser(binary)
    yield b
    b.close()


def _check_page(page, n_tokens, n_policy, png):
    counts = page.eval("[document.querySelectorAll('.strip .tok').length,"
                       " document.querySelectorAll('.strip .tok.o-policy').length,"
                       " document.querySelectorAll('.strip .tok.m1').length]")
    assert counts == [n_tokens, n_policy, n_policy]
    page.screenshot(png)
    assert png.read_bytes()[:8] == b'\x89PNG\r\n\x1a\n' and png.stat().st_size > 5000
    errors, fetched = page.problems()
    assert errors == [] and fetched == []


def test_browser_show_html(browser, oracle_clamp, tmp_path):
    path, html = tmp_path / 'recs.parquet', tmp_path / 'show.html'
    store.write_trajectories(path, [oracle_clamp])
    assert main(['show', str(path), '--format', 'html', '--out', str(html)]) == 0
    page = browser.open(html)
    _check_page(page, len(oracle_clamp), int(oracle_clamp.action_mask.sum()), tmp_path / 'show.png')
    # hovering a policy cell shows its details in the tooltip
    x, y = page.eval("(function(){var r=document.querySelector('.strip .tok.o-policy').getBoundingClientRect();"
                     "return [r.left + 4, r.top + 4];})()")
    page.mouse(x, y)
    tip = page.eval("[document.getElementById('tip').hidden, document.getElementById('tip').textContent]")
    assert tip[0] is False and '"<call>"' in tip[1] and 'owner  policy   turn 0' in tip[1] and 'pos 7' in tip[1]
    assert page.problems() == ([], [])


def test_browser_fold_toggle(browser, tmp_path):
    t, dec = _long_record(n_tool=120)
    html = tmp_path / 'fold.html'
    html.write_text(viz.to_html(viz.build_strip(t, dec), episode=0))
    page = browser.open(html)
    visible = "Array.from(document.querySelectorAll('.strip .tok')).filter(e => e.offsetParent !== null).length"
    assert page.eval("document.querySelectorAll('.strip .tok').length") == len(t)
    assert page.eval(visible) == len(t) - 120
    page.click_selector('.strip .fold > button')
    assert page.eval(visible) == len(t)
    assert page.problems() == ([], [])


def test_browser_report_html(browser, run_dir, tmp_path):
    assert main(['report', str(run_dir)]) == 0
    first = store.read_trajectories(run_dir / 'trajectories')[0]
    page = browser.open(run_dir / 'report.html')
    _check_page(page, len(first), int(first.action_mask.sum()), tmp_path / 'report.png')
    assert page.eval("document.querySelectorAll('svg').length") >= 6
