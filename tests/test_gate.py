"""The gate: acceptance rules, `agentrl check` refusals, row validation on read, checkpoint bounds,
the sandbox's hard deadline, terminal escaping."""
import importlib
import math

import pytest
import torch

from agentrl import checks
from agentrl.record import Provenance, SamplingSpec, Trajectory


def sampled_record(ids=(11, 12, 21, 22, 6), reward=1.0):
    return Trajectory.from_tokens(list(ids), ['prompt', 'prompt', 'policy', 'policy', 'policy'],
                                  [-1, -1, 0, 0, 0], [0.0, 0.0, -0.5, -0.25, -0.125], reward, {},
                                  provenance=Provenance(policy='model', tokenizer='tokA', template='tplA',
                                                        sampling=SamplingSpec()))


# ------------------------------------------------------------------------------ acceptance rules

def test_acceptance_module_is_not_shadowed():
    mod = importlib.import_module('agentrl.checks.acceptance')
    assert mod.__name__ == 'agentrl.checks.acceptance'
    assert checks.validate is mod.validate and checks.find_problems is mod.find_problems
    import agentrl as arl
    assert arl.validate is mod.validate and arl.find_problems is mod.find_problems
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module('agentrl.checks.validate')
    names = [r.name for r in checks.RULES]
    assert names[:3] == ['fields_present', 'lengths_agree', 'owner_codes_known']
    assert len(set(names)) == len(names) and all(callable(r.check) for r in checks.RULES)
    assert {r.stage for r in checks.RULES} == {'shape', 'position', 'record'}


def test_ids_outside_vocabulary_refused():
    t = sampled_record()
    t.ids[0] = -7
    with pytest.raises(checks.TokenIdError, match=r'^ids\[0\]: is -7, not a token id \(ids are >= 0\)'):
        checks.validate(t)
    t = sampled_record()
    t.ids[3] = 10**6
    checks.validate(t)                                    # vocabulary unknown: any id >= 0
    with pytest.raises(checks.TokenIdError, match=r'^ids\[3\]: is 1000000, not a token id \(ids are in \[0, 316\)'):
        checks.validate(t, checks.Expected(vocab_size=316))
    assert [p.kind for p in checks.find_problems(t, {'vocab_size': 316})] == ['TokenIdError']


@pytest.mark.parametrize('reward', [float('nan'), float('inf'), None, 'x'])
def test_non_finite_reward_refused(reward):
    t = sampled_record()
    t.reward = reward
    with pytest.raises(checks.NonFiniteRewardError, match=r'^reward: is .*not a finite number'):
        checks.validate(t)
    assert checks.validate(sampled_record(reward=0.0)) is None
    assert math.isfinite(sampled_record().reward)


def test_rules_run_in_order_and_can_be_selected():
    t = sampled_record()
    t.reward = float('nan')
    t.action_mask[0] = 1.0
    assert [p.kind for p in checks.find_problems(t)] == ['MaskOnNonPolicyError', 'NonFiniteRewardError']
    only = tuple(r for r in checks.RULES if r.name == 'reward_finite')
    assert [p.kind for p in checks.find_problems(t, rules=only)] == ['NonFiniteRewardError']


# ------------------------------------------------------------------------------ `agentrl check` on a real run

import json  # noqa: E402
import random  # noqa: E402
import re  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402

import pyarrow as pa  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402

from agentrl import store  # noqa: E402
from agentrl.cli.main import main  # noqa: E402


@pytest.fixture(scope='module')
def run_dir(tmp_path_factory):
    """`agentrl rollout --policy model --split heldout --repeats 1 --out d` (the folder of the refusal cases)."""
    torch.set_num_threads(1)
    d = tmp_path_factory.mktemp('gate') / 'd'
    assert main(['rollout', '--policy', 'model', '--split', 'heldout', '--repeats', '1', '--out', str(d)]) == 0
    return d


def traj(run_dir):
    """The run's records: its shard folder ``d/trajectories/``."""
    return run_dir / 'trajectories'


def shard(run_dir):
    """The run's one shard file (6 records)."""
    (f,) = store.data_files(traj(run_dir))
    return f


def table(run_dir):
    return pq.read_table(shard(run_dir))


def write(path, t: pa.Table):
    pq.write_table(t, path)
    return str(path)


def set_cell(t: pa.Table, name: str, row: int, value, type_=None) -> pa.Table:
    col = t.column(name).to_pylist()
    col[row] = value
    i = t.schema.get_field_index(name)
    return t.set_column(i, t.schema.field(i).with_type(type_) if type_ else t.schema.field(i),
                        pa.array(col, type=type_ or t.schema.field(i).type))


def check(capsys, *argv):
    code = main(['check', *map(str, argv)])
    cap = capsys.readouterr()
    return code, cap.out, cap.err


def test_check_passes_the_run(run_dir, capsys):
    code, out, _ = check(capsys, traj(run_dir), '--model', run_dir / 'model.pt')
    assert code == 0 and out.rstrip().endswith('result: OK'), out


def test_check_refuses_a_file_concatenated_with_itself(run_dir, tmp_path, capsys):
    t = table(run_dir)
    n = t.num_rows
    code, out, _ = check(capsys, write(tmp_path / 'twice.parquet', pa.concat_tables([t, t])))
    assert code == 1
    assert f'records          {2 * n}  (refused {n}, scripted 0)' in out
    assert re.search(rf'^  DuplicateRecordError +{n}$', out, re.M), out
    assert f"repeats '{tmp_path / 'twice.parquet'}' row 0 (same identity and content" in out
    assert f'result: FAILED ({n} of {2 * n} records refused)' in out


def test_check_refuses_one_identity_with_two_contents(run_dir, tmp_path, capsys):
    recs = store.read_trajectories(traj(run_dir))
    other = store.read_trajectories(traj(run_dir))[0]
    other.reward = 1.0 - other.reward                         # same (group, rollout, attempt), other content
    store.write_trajectories(tmp_path / 'conflict.parquet', recs + [other])
    code, out, _ = check(capsys, tmp_path / 'conflict.parquet')
    assert code == 1 and re.search(r'^  IdentityConflictError +1$', out, re.M), out
    key = recs[0].provenance
    assert key.rollout_id.startswith(f'{key.group_id}/')           # printed once, not as group/group/k
    assert f'identity {key.rollout_id}#1 is already taken by' in out and f'{key.group_id}/{key.rollout_id}' not in out


@pytest.mark.parametrize('value', [-7, 10**6])
def test_check_refuses_ids_outside_the_vocabulary(run_dir, tmp_path, capsys, value):
    recs = store.read_trajectories(traj(run_dir))
    recs[1].ids[0] = value
    store.write_trajectories(tmp_path / 'ids.parquet', recs)
    code, out, _ = check(capsys, tmp_path / 'ids.parquet')
    assert code == 1 and re.search(r'^  TokenIdError +1$', out, re.M), out
    assert re.search(rf'TokenIdError: ids\[0\]: is {value}, not a token id \(ids are in \[0, 316\), the vocabulary', out), out


@pytest.mark.parametrize('argv, err', [
    (['--pad-id', '99999'], "--pad-id 99999 is outside the vocabulary of the records' tokenizer (ids 0..315); pass an "
                            'id of that tokenizer or drop --pad-id'),
    (['--eot-id', '316'], "--eot-id 316 is outside the vocabulary of the records' tokenizer (ids 0..315); pass an "
                          'id of that tokenizer or drop --eot-id'),
])
def test_check_refuses_a_flag_id_outside_the_vocabulary(run_dir, capsys, argv, err):
    code, out, e = check(capsys, traj(run_dir), *argv)
    assert (code, out, e) == (2, '', f'agentrl: error: {err}\n')


def test_export_refuses_a_pad_id_outside_the_vocabulary(run_dir, tmp_path, capsys):
    assert main(['export', str(run_dir), '--to', 'sft', '--out', str(tmp_path / 'x'), '--pad-id', '316']) == 2
    assert capsys.readouterr().err == ("agentrl: error: --pad-id 316 is outside the vocabulary of the records' "
                                       'tokenizer (ids 0..315); pass its pad id (0) or drop --pad-id\n')
    assert not (tmp_path / 'x').exists()


def test_check_fails_a_record_the_model_cannot_replay(run_dir, tmp_path, capsys):
    recs = store.read_trajectories(traj(run_dir))
    r = recs[0]
    n = 300 - len(r.ids)                                        # longer than the model's 256 positions
    pad = torch.full((n,), int(r.ids[1]))
    r.ids, r.owner = torch.cat([r.ids, pad]), torch.cat([r.owner, torch.full((n,), 1)])
    r.turn = torch.cat([r.turn, torch.full((n,), int(r.turn[-1]))])
    r.action_mask, r.sample_logp = torch.cat([r.action_mask, torch.zeros(n)]), torch.cat([r.sample_logp, torch.zeros(n)])
    assert checks.find_problems(r, {'vocab_size': 316}) == []
    store.write_trajectories(tmp_path / 'long.parquet', recs)
    code, out, _ = check(capsys, tmp_path / 'long.parquet', '--model', run_dir / 'model.pt')
    assert code == 1 and re.search(r'^  NotReplayableError +1$', out, re.M), out
    assert "has 300 tokens, more than the model's context of 256" in out and 'not replayed' not in out


def test_check_refuses_a_nan_reward(run_dir, tmp_path, capsys):
    recs = store.read_trajectories(traj(run_dir))
    recs[2].reward = float('nan')
    store.write_trajectories(tmp_path / 'nan.parquet', recs)
    code, out, _ = check(capsys, tmp_path / 'nan.parquet')
    assert code == 1 and re.search(r'^  NonFiniteRewardError +1$', out, re.M), out
    prov = recs[2].provenance
    assert (prov.group_id, prov.rollout_id) == ('0/model/triangle', '0/model/triangle/0')
    assert ('  e.g. 0/model/triangle/0#1: NonFiniteRewardError: reward: is nan, not a finite number; it would poison '
            'every advantage of its group. Fix: score the episode again, or drop it before training') in out.splitlines()
    assert checks.record_key(recs[2]) == '0/model/triangle/0#1'
    prov.group_id, prov.rollout_id = 'g', 'r7'                       # a rollout id of its own: group/rollout#attempt
    assert checks.record_key(recs[2]) == 'g/r7#1'


def test_check_refuses_a_row_edited_after_writing(run_dir, tmp_path, capsys):
    t = table(run_dir)
    rewards = t.column('reward').to_pylist()
    row = rewards.index(0.0)
    path = write(tmp_path / 'edited.parquet', set_cell(t, 'reward', row, 1.0).replace_schema_metadata(t.schema.metadata))
    code, out, _ = check(capsys, path)
    assert code == 1 and re.search(r'^  DigestMismatchError +1$', out, re.M), out
    what = (r"digest: the stored digest v2:[0-9a-f]{9}\.\.\. does not match the row's content \(ids, owner, turn, "
            r'action_mask, sample_logp, reward, provenance, task, info, turn_contexts\): the row was edited after '
            r'writing\. Fix: re-run the rollout for this episode; never edit a stored record in place')
    where = re.escape(f"'{path}' row {row}")                       # the row is named once, then the kind
    assert re.search(rf'^  e\.g\. {where}: DigestMismatchError: {what}$', out, re.M), out
    assert main(['export', str(path), '--to', 'verl', '--out', str(tmp_path / 'v')]) == 1       # refused by check
    err = capsys.readouterr().err
    assert re.fullmatch(rf'agentrl: error: {where}: DigestMismatchError: {what} \(1 of {t.num_rows} records '
                        rf'refused; `agentrl check {re.escape(str(path))}` lists them all\)\n', err), err
    with pytest.raises(checks.DigestMismatchError, match=rf"^'{re.escape(path)}' row {row}: digest: "):
        store.read_trajectories(path)
    assert len(store.read_trajectories(path, verify=False)) == t.num_rows


@pytest.mark.parametrize('name, value', [('sampling', '{"temperature": 0.5}'), ('group_id', 'g-edited'),
                                         ('policy', 'other')])
def test_check_refuses_edited_provenance(run_dir, tmp_path, capsys, name, value):
    t = table(run_dir)
    path = write(tmp_path / 'prov.parquet', set_cell(t, name, 3, value).replace_schema_metadata(t.schema.metadata))
    code, out, _ = check(capsys, path)
    assert code == 1 and re.search(r'^  DigestMismatchError +1$', out, re.M) and 'result: OK' not in out, out
    assert (f"'{path}' row 3: DigestMismatchError: digest: the stored digest {t.column('digest')[3].as_py()[:12]}... "
            "does not match the row's content (ids, owner, turn, action_mask, sample_logp, reward, provenance, task, info, "
            'turn_contexts): the row was edited after writing') in out


def test_check_fails_non_finite_ratios_and_thresholds(run_dir, tmp_path, capsys):
    state = torch.load(run_dir / 'model.pt', weights_only=True)
    state['state_dict'] = {k: torch.full_like(v, float('nan')) for k, v in state['state_dict'].items()}
    torch.save(state, tmp_path / 'nan.pt')
    code, out, _ = check(capsys, traj(run_dir), '--model', tmp_path / 'nan.pt')
    assert code == 1 and 'non-finite replay ratios' in out and 'is not finite' in out, out
    code, out, err = check(capsys, traj(run_dir), '--model', run_dir / 'model.pt',
                           '--max-ratio-dev', 'nan')
    assert code == 2 and out == '' and err.count('\n') == 1
    assert err.startswith('agentrl: error: --max-ratio-dev must be a ') and 'got nan' in err
    with pytest.raises(ValueError, match=r'--max-ratio-dev must be a number >= 0 .*got nan; a NaN threshold'):
        from agentrl.jobs.check import CheckOptions, run_check
        run_check(CheckOptions(path=str(traj(run_dir)), max_ratio_dev=float('nan')))
    code, _, err = check(capsys, traj(run_dir), '--tol', 'inf')
    assert code == 2 and err.startswith('agentrl: error: --tol must be a finite number >= 0 (nats), got inf')


# ------------------------------------------------------------------------------ malformed rows, every reader

MALFORMED = {   # column -> (value, arrow type or None, the field the message names)
    'reward': (None, None, 'reward: is None, not a number'),
    'ids': (None, None, 'ids: is null'),
    'info': ('[1, 2]', None, 'info: is a JSON list, not an object'),
    'sampling': ('{"temperature": 1.0, "bogus": 2}', None, "sampling: has unknown keys ['bogus']"),
    'turn_contexts': ('[[3, "x"]]', None, 'turn_contexts: entry 0 is not [start in'),
}


def readers(path, run):
    """argv of every reader of a trajectory file (run: a run folder holding it)."""
    return [['check', path], ['show', path, '-o', str(run / 'x.html')], ['report', str(run)],
            ['drift', '--records', path]]


@pytest.mark.parametrize('column', list(MALFORMED))
def test_malformed_row_is_one_line_in_every_reader(run_dir, tmp_path, capsys, column):
    value, type_, message = MALFORMED[column]
    run = tmp_path / 'run'
    run.mkdir()
    t = table(run_dir)
    bad = set_cell(t, column, 0, value, type_).replace_schema_metadata(t.schema.metadata)
    path = write(run / 'trajectories.parquet', bad)
    where = f"'{path}' row 0: {message}"
    with pytest.raises(checks.MalformedRowError) as e:
        store.read_trajectories(path)
    assert str(e.value).startswith(where) and '\n' not in str(e.value)
    with pytest.raises(checks.MalformedRowError):
        next(store.iter_batches(path, 4))
    code, out, _ = check(capsys, path)
    named = f"'{path}' row 0: MalformedRowError: {message}"          # check and export name the row once
    assert code == 1 and re.search(r'^  MalformedRowError +1$', out, re.M) and f'  e.g. {named}' in out, out
    assert main(['export', str(path), '--to', 'verl', '--out', str(tmp_path / 'v')]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f'agentrl: error: {named}') and err.count("row 0") == 1 and err.count('\n') == 1, err
    for argv in readers(path, run)[1:]:
        code, out, err = main(argv), *capsys.readouterr()
        err = err.strip()                        # report's transient progress display may leave a blank line
        assert code == 1 and err.startswith(f'agentrl: error: {where}') and '\n' not in err, (argv, err)


def test_bad_checkpoint_config_is_one_line(run_dir, tmp_path, capsys):
    from agentrl.checkpoint import load_checkpoint
    torch.save({'config': {'vocab_size': 316, 'bogus': 1}, 'state_dict': {}}, tmp_path / 'bogus.pt')
    big = {'vocab_size': 100000, 'max_len': 65536, 'd_model': 4096, 'n_layers': 64, 'n_heads': 8}
    torch.save({'config': big, 'state_dict': {}}, tmp_path / 'big.pt')
    assert (tmp_path / 'big.pt').stat().st_size < 2000
    with pytest.raises(ValueError, match=r"config has unknown keys \['bogus'\]"):
        load_checkpoint(str(tmp_path / 'bogus.pt'))
    with pytest.raises(ValueError, match=r'config asks for 13,976,\d{3},\d{3} parameters \(52\.\d GiB\), more than'):
        load_checkpoint(str(tmp_path / 'big.pt'))
    for ckpt in ('bogus.pt', 'big.pt'):
        code, out, err = check(capsys, traj(run_dir), '--model', tmp_path / ckpt)
        assert code == 2 and err.count('\n') == 1 and 'config ' in err and 'Traceback' not in err, err
        code = main(['rollout', '--policy', 'model', '--split', 'heldout', '--repeats', '1', '--checkpoint',
                     str(tmp_path / ckpt), '--out', str(tmp_path / f'r-{ckpt}')])
        err = capsys.readouterr().err
        assert code == 2 and err.count('\n') == 1 and 'config ' in err, err


def test_unexpected_errors_are_one_line_unless_debug(monkeypatch, capsys, run_dir):
    from agentrl.jobs import check as job

    def boom(*a, **k):
        raise KeyError('deep inside')
    monkeypatch.setattr(job, 'run_check', boom)
    assert main(['check', str(traj(run_dir))]) == 1
    err = capsys.readouterr().err
    assert err == "agentrl: error: KeyError: 'deep inside' (an internal error; rerun with --debug for the traceback)\n"
    with pytest.raises(KeyError):
        main(['check', str(traj(run_dir)), '--debug'])


# ------------------------------------------------------------------------------ terminal escapes

EVIL = '\x1b[2J\x1b[31mEVIL'


def test_escape_sequences_in_data_never_reach_the_terminal(run_dir, tmp_path, capsys):
    from agentrl.io import printable
    assert printable(EVIL) == '\\x1b[2J\\x1b[31mEVIL'
    assert printable('a\u202eb\x9b\x07\n', newlines=True) == 'a\\u202eb\\x9b\\x07\n'
    recs = store.read_trajectories(traj(run_dir))
    for r in recs:
        r.provenance.policy = EVIL
    recs[0].info['stop'] = EVIL
    recs[0].provenance.group_id = EVIL
    recs[0].reward = float('nan')                               # a refusal message that names the record
    path = tmp_path / 'evil.parquet'
    store.write_trajectories(path, recs)
    code, out, err = check(capsys, path)
    assert code == 1 and '\x1b' not in out + err
    assert f'policies         \\x1b[2J\\x1b[31mEVIL {len(recs)}' in out
    assert 'e.g. \\x1b[2J\\x1b[31mEVIL/' in out
    assert main(['show', str(path), '--format', 'term', '--width', '100', '-o', str(tmp_path / 'ep.txt')]) == 0
    shown = (tmp_path / 'ep.txt').read_text()
    assert '\\x1b[2J\\x1b[31mEVIL' in shown and '\x1b[2J' not in shown and '\x1b[31mEVIL' not in shown
    assert '\x1b' not in capsys.readouterr().out


# ------------------------------------------------------------------------------ sandbox: hard deadline

def test_sandbox_c_level_work_cannot_hang():
    from agentrl.gym import sandbox
    src = ("def f():\n    a = (0,) * 1\n    b = (0,) * 1\n    for i in range(60):\n"
           "        a = (a, a)\n        b = (b, b)\n    return a == b\n")
    res = sandbox.run_tests(src, [((), True)], 'f')
    assert res == [sandbox.TestResult(False, None, 'SandboxLimit: time limit exceeded (hard deadline, worker killed)')]
    # the next call gets a fresh worker and the right answer
    assert sandbox.run_tests('def f(x):\n    return x + 1\n', [((1,), 2)], 'f') == [sandbox.TestResult(True, 2, None)]
    assert sandbox.run_tests('def f(x):\n    return range(x)\n', [((2,), 2)], 'f')[0].got == sandbox.Opaque('range(0, 2)')


def test_sandbox_worker_limits_and_no_torch():
    code = ("import sys, resource, os\n"
            "from agentrl.gym import sandbox\n"
            "assert sandbox.run_tests('def f(x):\\n    return x\\n', [((3,), 3)], 'f')[0].passed\n"
            "w = sandbox._WORKER\n"
            "lim = open(f'/proc/{w.proc.pid}/limits').read()\n"
            "print('torch' in sys.modules, w.proc.pid != os.getpid())\n"
            "print([l for l in lim.splitlines() if l.startswith(('Max address space', 'Max cpu time'))])\n")
    p = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    first, limits = p.stdout.splitlines()
    assert first == 'False True'
    cpu = re.search(r'Max cpu time +(\d+) +unlimited', limits)
    mem = re.search(r'Max address space +(\d+) +(\d+)', limits)
    assert cpu and int(cpu.group(1)) in (4, 5), limits          # used (0 s) + 1 + WORKER_CPU_S (3), per call
    assert mem and mem.groups() == (str(1 << 30), str(1 << 30)), limits


# ------------------------------------------------------------------------------ fuzz: every reader

def _corruptions(t: pa.Table, rng: random.Random):
    """Random value-level corruptions of a valid trajectory table (the file stays Parquet)."""
    n = t.num_rows
    row = rng.randrange(n)
    kind = rng.choice(['null', 'json', 'nan', 'id', 'owner', 'mask', 'sampling_range', 'digest', 'tc', 'attempt'])
    if kind == 'null':
        col = rng.choice(['ids', 'action_mask', 'sample_logp', 'reward'])
        return kind, set_cell(t, col, row, None)
    if kind == 'json':
        col = rng.choice(['info', 'sampling', 'turn_contexts'])
        return kind, set_cell(t, col, row, rng.choice(['{', '"x"', '3', '[[1]]', 'null}', '\x1b[2J']))
    if kind == 'nan':
        return kind, set_cell(t, 'reward', row, rng.choice([float('nan'), float('inf'), -float('inf')]))
    if kind == 'id':
        ids = t.column('ids').to_pylist()[row]
        ids[rng.randrange(len(ids))] = rng.choice([-1, -7, 316, 10**6, 2**31 - 1])
        return kind, set_cell(t, 'ids', row, ids)
    if kind == 'owner':
        own = t.column('owner').to_pylist()[row]
        own[rng.randrange(len(own))] = rng.choice([-1, 4, 127])
        return kind, set_cell(t, 'owner', row, own)
    if kind == 'mask':
        m = t.column('action_mask').to_pylist()[row]
        return kind, set_cell(t, 'action_mask', row, m[:-1] if rng.random() < 0.5 else [1 - v for v in m])
    if kind == 'sampling_range':
        return kind, set_cell(t, 'sampling', row, json.dumps({'temperature': -1.0, 'top_p': 2.0}))
    if kind == 'digest':
        return kind, set_cell(t, 'digest', row, '0' * 32)
    if kind == 'tc':
        return kind, set_cell(t, 'turn_contexts', row, rng.choice(['[[999999, [1]]]', '[[1, [-1]]]', '[1]', '{}']))
    return kind, set_cell(t, 'attempt', row, None)              # no provenance: refused by the acceptance rules


def test_fuzz_every_reader_gives_one_line_and_exit_1(run_dir, tmp_path, capsys):
    """Random corruptions of a valid file: each reader refuses with one line (or a FAILED report) and exit 1."""
    rng = random.Random(16)
    t = table(run_dir)
    meta = t.schema.metadata
    seen = set()
    for k in range(24):
        kind, bad = _corruptions(t, rng)
        seen.add(kind)
        run = tmp_path / f'fuzz{k}'
        run.mkdir()
        path = write(run / 'trajectories.parquet', bad.replace_schema_metadata(meta))
        code, out, err = check(capsys, path)
        assert code == 1 and 'result: FAILED' in out and err == '', (kind, out, err)
        try:
            store.read_trajectories(path)
            read_ok = True
        except checks.RecordError as e:
            read_ok = False
            assert '\n' not in str(e) and str(e).startswith(f"'{path}' row "), (kind, str(e))
        for argv in readers(path, run)[1:]:
            if read_ok and argv[0] == 'drift':  # drift then needs a tokenizer folder: not a reader question
                continue
            code = main(argv)
            err = capsys.readouterr().err.strip()
            if read_ok:                        # a readable row refused only by the acceptance rules
                assert code == 0, (kind, argv, err)
            else:
                assert code == 1 and '\n' not in err and err.startswith(f"agentrl: error: '{path}' row "), \
                    (kind, argv, err)
                assert 'Traceback' not in err and '\x1b' not in err
    assert len(seen) >= 6


def test_fuzz_damaged_bytes_are_one_line(run_dir, tmp_path, capsys):
    """Flipped and truncated bytes: one line, never a traceback (exit 1 or 2: the file is not readable)."""
    rng = random.Random(6)
    raw = open(shard(run_dir), 'rb').read()
    digests = [checks.record_digest(r) for r in store.read_trajectories(traj(run_dir))]
    for k in range(12):
        data = bytearray(raw)
        if k % 3 == 0:
            data = data[:rng.randrange(len(data))]
        else:
            for _ in range(rng.randint(1, 8)):
                data[rng.randrange(len(data))] = rng.randrange(256)
        path = tmp_path / f'b{k}.parquet'
        path.write_bytes(bytes(data))
        code, out, err = check(capsys, path)
        assert code in (0, 1, 2) and 'Traceback' not in err, err
        if code == 2 or err:
            assert err.count('\n') == 1 and err.startswith('agentrl: error: '), err
        if code == 0:            # the flips missed every digested byte (footer statistics, info text ...)
            assert [checks.record_digest(r) for r in store.read_trajectories(path)] == digests


def test_check_progress_on_a_pipe(run_dir, monkeypatch, capsys):
    import io

    from agentrl.cli import check as cli_check
    buf = io.StringIO()
    bar = cli_check.Progress(1000, buf, every_s=0.0)
    bar(250)
    bar(1000)
    bar.close()
    lines = buf.getvalue().splitlines()
    assert [re.sub(r', \d+ s$', '', x) for x in lines] == ['check: 250 of 1000 records read (25%)',
                                                            'check: 1000 of 1000 records read (100%)']
    monkeypatch.setattr(cli_check, 'PROGRESS_MIN_ROWS', 1)
    monkeypatch.setattr(cli_check, 'PROGRESS_EVERY_S', 0.0)
    monkeypatch.setattr(cli_check.Progress.__init__, '__defaults__', (None, 0.0))
    code, out, err = check(capsys, traj(run_dir), '--batch-size', '2')
    assert code == 0 and re.findall(r'check: (\d+) of 6 records read', err) == ['2', '4', '6'], err


# ------------------------------------------------------------------------------ check --model on HF-engine records

@pytest.fixture(scope='module')
def hf_model_dir(tmp_path_factory):
    pytest.importorskip('transformers')
    from _tokenizers import tokenizer_path
    from agentrl.engines import hf
    path = tokenizer_path('qwen3')
    if not (path / 'tokenizer_config.json').is_file():
        pytest.skip(f'no qwen3 tokenizer at {path} (set AGENTRL_TOKENIZERS to the tokenizers folder)')
    return hf.make_test_model(tmp_path_factory.mktemp('gate-hf'), path, token_rates={'</think>': 0.05})


def _max_dev(out: str) -> float:
    return float(re.search(r'^  all +\d+ +\S+ +\S+ +\S+ +(\S+)$', out, re.M).group(1))


@pytest.mark.parametrize('flags', [[], ['--temperature', '0.7', '--top-p', '0.9']], ids=['T1', 'T0.7-top_p0.9'])
def test_check_replays_hf_engine_records_under_a_model_folder(hf_model_dir, tmp_path, monkeypatch, capsys, flags):
    monkeypatch.setattr(torch.cuda, 'is_available', lambda: False)
    out = tmp_path / 'run'
    assert main(['rollout', '--engine', 'hf', '--model', str(hf_model_dir), '--split', 'heldout', '--repeats', '1',
                 '--max-new-tokens', '8', '--max-turns', '2', '--out', str(out), *flags]) == 0
    capsys.readouterr()
    code, text, _ = check(capsys, out / 'trajectories', '--model', hf_model_dir, '--max-ratio-dev', '1e-5')
    assert code == 0 and text.rstrip().endswith('result: OK') and 'records: match' in text, text
    assert _max_dev(text) <= 1e-5


def test_check_replays_per_turn_context_records(hf_model_dir, tmp_path, capsys):
    from agentrl.engines import hf
    from agentrl.templates import ChatRecorder, ChatTemplate
    model, tok = hf.load_model(hf_model_dir)
    template = ChatTemplate(tok)
    sampler = hf.HFSampler(model, template.stop_ids, SamplingSpec(0.7, top_p=0.9), max_new_tokens=24)
    recs = [ChatRecorder(template, [{'role': 'user', 'content': f'Question {i}?'}]) for i in range(4)]
    trajs = hf.run_chat_episodes(
        sampler, recs, lambda i, turn, text: hf.Reply(messages=[{'role': 'user', 'content': 'And then?'}], action=text),
        seeds=range(4), max_turns=3)
    assert any(t.turn_contexts is not None for t in trajs)     # thinking stripped from history: turns have contexts
    store.write_trajectories(tmp_path / 'turns.parquet', trajs)
    code, text, _ = check(capsys, tmp_path / 'turns.parquet', '--model', hf_model_dir, '--max-ratio-dev', '1e-5')
    assert code == 0 and text.rstrip().endswith('result: OK') and 'not replayed' not in text, text
    assert _max_dev(text) <= 1e-5


def test_a_row_without_its_digest_is_refused(run_dir, tmp_path, capsys):
    t = pq.read_table(next(iter(sorted((run_dir / 'trajectories').glob('part-*.parquet')))))
    nulled = write(tmp_path / 'nulled.parquet', set_cell(t, 'digest', 0, None))
    code, out, err = check(capsys, nulled)
    assert code == 1 and 'digest' in (out + err) and 'is missing' in (out + err)
