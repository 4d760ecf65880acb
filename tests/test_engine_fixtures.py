"""Recorded records per engine: `agentrl rollout` and `agentrl serve` store what they stored when recorded.

Each test runs the CLI in a child process (``python -m agentrl``, CPU only) with fixed seeds,
reads the stored rows back with pyarrow and compares every column of every row with
``tests/golden/engines/NAME.json`` exactly (token lists, float bits by ``repr``, the ``info`` JSON
byte for byte, provenance, digests), except the fields in each test's ``EXCLUDED`` map, each with
its reason. A failure names the fixture, the row (index and ``rollout_id``) and the field, with
both values. ``tests/_engine_fixtures.py`` describes the file format.

- ``rollout_tiny``: TinyAgent (the default engine, batched; out of turns) and the oracle (solves), 12 episodes.
- ``rollout_tiny_nobatch``: TinyAgent one episode at a time (``--no-batch``; its log-probs differ
  from the batched ones in the last bits, so it has its own fixture).
- ``rollout_hf``: ``--engine hf`` on ``agentrl make-test-model``'s 2-layer Qwen3, 6 short episodes.
- ``serve_hf``: ``agentrl serve`` (HF in process, then ``--engine-process``: both must give these
  records) driven over HTTP by :func:`_engine_fixtures.drive_gateway` (plain turns, an echoed
  reply extended by a tool result, a streamed turn, a retry fork, a harness-written tool call,
  stop strings); the HTTP responses are compared too.

The vLLM fixtures are in ``tests/live_vllm/test_vllm_fixtures.py``.

Regenerate, on a tree whose records are known good and only when a change of records is meant
(say why in the commit)::

    AGENTRL_REGEN_FIXTURES=1 python -m pytest -p no:cacheprovider tests/test_engine_fixtures.py

``CI=true`` refuses that (the test fails). Running it twice must leave ``git diff`` empty; a
difference is nondeterminism to fix, not to exclude.
"""
import copy
import json
import struct

import pytest

from _engine_fixtures import (GOLDEN, Serve, agentrl, canonical, check_fixture, compare_records, drive_gateway,
                              dump_fixture, stored_rows)
from _tokenizers import tokenizer_path

#: Fields a rollout stores that may differ run to run: none (two runs give the same bytes).
ROLLOUT_EXCLUDED = {}

#: Fields the gateway stores that differ run to run. The session id (32 hex of sha256 of a random
#: token) is substituted by ``<session K>`` wherever it appears (info.gateway.session, the default
#: group_id and rollout_id, the finish response), so only what hashes it is left out.
SERVE_EXCLUDED = {
    'digest.row': 'the row part of the digest hashes info, which holds the random session id',
}

TINY_ROLLOUT = ['rollout', '--policy', 'oracle,model', '--split', 'heldout', '--repeats', '1', '--max-turns', '4',
                '--seed', '7', '--out', '{out}']
HF_ROLLOUT = ['rollout', '--engine', 'hf', '--model', '{model}', '--split', 'heldout', '--repeats', '1',
              '--max-new-tokens', '6', '--max-turns', '2', '--seed', '1', '--out', '{out}']
SERVE_HF = ['serve', '--out', '{out}', '--model', '{model}', '--max-new-tokens', '8']


def _argv(command, **paths):
    return [a.format(**paths) for a in command]


def _rollout(tmp_path, command, model=None):
    out = tmp_path / 'run'
    agentrl(*_argv(command, out=out, model=model))
    return {'command': command, 'excluded': ROLLOUT_EXCLUDED,
            'records': canonical(stored_rows(out / 'trajectories'), ROLLOUT_EXCLUDED)}


@pytest.fixture(scope='module')
def model_dir(tmp_path_factory):
    """``agentrl make-test-model`` (seed 0, the real Qwen3 tokenizer) in a folder named ``tiny-qwen3``:
    the records name the model ``tiny-qwen3@<fingerprint of config and weights>``."""
    pytest.importorskip('transformers')
    out = tmp_path_factory.mktemp('fixture-model') / 'tiny-qwen3'
    agentrl('make-test-model', out, '--tokenizer', tokenizer_path('qwen3'), '--seed', '0')
    return out


def test_rollout_tiny(tmp_path):
    check_fixture('rollout_tiny', _rollout(tmp_path, TINY_ROLLOUT))


def test_rollout_tiny_nobatch(tmp_path):
    check_fixture('rollout_tiny_nobatch', _rollout(tmp_path, ['rollout', '--no-batch', '--policy', 'model',
                                                              *TINY_ROLLOUT[3:]]))


def test_rollout_hf(model_dir, tmp_path):
    check_fixture('rollout_hf', _rollout(tmp_path, HF_ROLLOUT, model=model_dir))


def _serve(tmp_path, model_dir, *extra):
    pytest.importorskip('starlette')
    pytest.importorskip('uvicorn')
    out = tmp_path / 'run'
    with Serve(*_argv(SERVE_HF[1:], out=out, model=model_dir), *extra) as server:
        calls = drive_gateway(server.url)
    sessions = [c['session'] for c in calls if 'session' in c]
    names = {s: f'<session {k}>' for k, s in enumerate(sessions)}
    return {'command': SERVE_HF, 'excluded': SERVE_EXCLUDED, 'calls': canonical(calls, {}, names),
            'records': canonical(stored_rows(out / 'trajectories'), SERVE_EXCLUDED, names)}


def test_serve_hf_in_process(model_dir, tmp_path):
    check_fixture('serve_hf', _serve(tmp_path, model_dir))


def test_serve_hf_engine_process(model_dir, tmp_path):
    """The engine in a child process gives the in-process records (docs/gateway.md#engines)."""
    check_fixture('serve_hf', _serve(tmp_path, model_dir, '--engine-process'), regen=False)


# ---------------------------------------------------------------------------------------------- the net itself
def test_every_fixture_file_is_canonical_and_says_what_it_leaves_out():
    """Each committed fixture is the canonical dump of itself, names its command and its excluded fields."""
    names = sorted(p.stem for p in GOLDEN.glob('*.json'))
    assert {'rollout_hf', 'rollout_tiny', 'rollout_tiny_nobatch', 'serve_hf'} <= set(names)
    for name in names:
        text = (GOLDEN / f'{name}.json').read_text()
        data = json.loads(text)
        assert dump_fixture(data) == text, f'{name}.json is not in canonical form; regenerate it'
        assert data['command'][0] in ('rollout', 'serve') and '{out}' in data['command'], name
        assert all(isinstance(why, str) and why for why in data['excluded'].values()), name
        assert data['records'] and all(len(r['action_mask']) == len(r['ids']) - 1 for r in data['records']), name


def test_a_changed_float_is_reported_with_fixture_record_field_and_both_values():
    data = json.loads((GOLDEN / 'rollout_tiny.json').read_text())
    changed = copy.deepcopy(data['records'])
    j = changed[7]['action_mask'].index(1)
    x = changed[7]['sample_logp'][j]
    # its last bit flipped (what another CPU's kernels give): the same value, and the digest is not held to it
    changed[7]['sample_logp'][j] = struct.unpack('<f', struct.pack('<i', struct.unpack('<i', struct.pack('<f', x))[0]
                                                                   + 1))[0]
    changed[7]['digest'] = 'v2:other'
    compare_records('rollout_tiny', data['records'], changed)
    changed[7]['sample_logp'][j] = x + 1e-4 * max(1.0, abs(x))
    with pytest.raises(pytest.fail.Exception) as e:
        compare_records('rollout_tiny', data['records'], changed)
    y = changed[7]['sample_logp'][j]
    assert str(e.value).splitlines()[:3] == [
        f"fixture rollout_tiny, record 7 (rollout_id {data['records'][7]['rollout_id']!r}), field sample_logp[{j}]:",
        f'  fixture: {x!r}', f'  now:     {y!r}']
    compare_records('rollout_tiny', data['records'], copy.deepcopy(data['records']))       # itself: no failure


@pytest.mark.parametrize('edit, message', [
    (lambda r: r[2]['info'].update(n_turns=9), "fixture f, record 2 (rollout_id '7/oracle/triangle/0'), field "
                                               "info.n_turns:\n  fixture: 4\n  now:     9"),
    (lambda r: r[0]['info'].update(stop=r[0]['info'].pop('stop')),
     "fixture f, record 0 (rollout_id '7/oracle/decrement/0'), field info key order:"),
    (lambda r: r[7].update(reward=-0.0), "fixture f, record 7 (rollout_id '7/model/is_positive/0'), field "
                                         "reward:\n  fixture: 0.0\n  now:     -0.0"),
    (lambda r: r[1]['ids'].append(3), "fixture f, record 1 (rollout_id '7/oracle/is_positive/0'), field ids length:"),
    (lambda r: r[3].pop('digest'), "fixture f, record 3 (rollout_id '7/oracle/count_to/0'): column 'digest' is "
                                   'missing now'),
    (lambda r: r.pop(), 'fixture f: 12 records in the fixture, 11 now'),
], ids=['info-value', 'info-key-order', 'negative-zero', 'ids-length', 'column-missing', 'record-missing'])
def test_every_kind_of_change_is_named(edit, message):
    records = json.loads((GOLDEN / 'rollout_tiny.json').read_text())['records']
    changed = copy.deepcopy(records)
    edit(changed)
    with pytest.raises(pytest.fail.Exception) as e:
        compare_records('f', records, changed)
    assert str(e.value).startswith(message), str(e.value)


def test_regenerating_is_refused_under_ci(monkeypatch):
    monkeypatch.setenv('AGENTRL_REGEN_FIXTURES', '1')
    monkeypatch.setenv('CI', 'true')
    data = json.loads((GOLDEN / 'rollout_tiny.json').read_text())
    with pytest.raises(pytest.fail.Exception, match='AGENTRL_REGEN_FIXTURES=1 under CI=true: fixtures are '
                                                    'regenerated by hand'):
        check_fixture('rollout_tiny', data)


def test_a_missing_fixture_says_how_to_record_it(monkeypatch):
    monkeypatch.delenv('AGENTRL_REGEN_FIXTURES', raising=False)
    with pytest.raises(pytest.fail.Exception, match=r'fixture tests/golden/engines/nothing_here.json is missing; '
                                                    r'record it on a known-good tree with AGENTRL_REGEN_FIXTURES=1 '
                                                    r'python -m pytest tests/test_engine_fixtures.py'):
        check_fixture('nothing_here', {'command': ['rollout'], 'excluded': {}, 'records': []})


def test_substitute_and_exclusions():
    rows = [{'group_id': 'abc', 'rollout_id': 'abc/b1', 'digest': 'v2:c:r', 'info': {'gateway': {'session': 'abc'},
                                                                                      'x': [{'t': 1.5}]}}]
    out = canonical(rows, {'digest.row': 'why', 'info.x.*.t': 'why'}, {'abc': '<session 0>'})
    assert out == [{'group_id': '<session 0>', 'rollout_id': '<session 0>/b1', 'digest': 'v2:c:<excluded>',
                    'info': {'gateway': {'session': '<session 0>'}, 'x': [{'t': '<excluded>'}]}}]
    assert rows[0]['group_id'] == 'abc'                                     # a copy
