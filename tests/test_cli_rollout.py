"""`agentrl rollout`, the main job, run for real on a small budget."""
import json
import subprocess
import sys

import pyarrow.parquet as pq
import pytest

import agentrl as arl

AGENTRL = [sys.executable, '-m', 'agentrl']


def run(*args, check=True):
    p = subprocess.run([*AGENTRL, *args], capture_output=True, text=True, timeout=300)
    if check:
        assert p.returncode == 0, p.stderr
    return p


def test_rollout_writes_parquet_and_summary(tmp_path):
    out = tmp_path / 'run'
    p = run('rollout', '--policy', 'oracle,hacker,model', '--split', 'heldout', '--repeats', '2', '--seed', '0',
            '--out', str(out))
    assert 'wrote 36 episodes to' in p.stdout and 'oracle' in p.stdout
    table = pq.read_table(out / 'trajectories')
    assert table.num_rows == 36
    for col in ['ids', 'owner', 'turn', 'action_mask', 'sample_logp', 'reward', 'task', 'policy', 'info']:
        assert col in table.column_names
    rows = table.to_pylist()
    oracle = [r for r in rows if r['policy'] == 'oracle']
    assert [r['reward'] for r in oracle] == [1.0] * 12 and {r['task'] for r in oracle} == {
        'decrement', 'is_positive', 'triangle', 'count_to', 'double', 'halve'}
    for r in rows:
        assert len(r['action_mask']) == len(r['sample_logp']) == len(r['ids']) - 1
        assert r['action_mask'] == [int(o == 2) for o in r['owner'][1:]]
        assert json.loads(r['info'])['stop'] in ('submitted', 'budget', 'truncated')
    summary = json.loads((out / 'summary.json').read_text())
    assert summary['episodes'] == 36 and summary['vocab_size'] == 316
    assert summary['policies']['oracle']['mean_reward'] == 1.0
    assert summary['policies']['model']['mean_reward'] == 0.0
    assert summary['policies']['model']['stops'] == {'budget': 12}
    # the records read back equal what the library would produce, and pass `agentrl check` with replay
    trajs = arl.read_trajectories(out / 'trajectories')
    assert sum(int(t.action_mask.sum()) for t in trajs if t.provenance.policy == 'oracle') == 12 * 13
    c = run('check', str(out / 'trajectories'), '--model', str(out / 'model.pt'), '--max-ratio-dev', '1e-5')
    assert 'result: OK' in c.stdout


def test_rollout_help_documents_every_flag():
    text = run('rollout', '--help').stdout
    for flag in ['--policy', '--split', '--repeats', '--seed', '--out', '--checkpoint', '--temperature',
                 '--max-turns', '--reward-tests', '--no-batch']:
        assert flag in text


@pytest.mark.parametrize('args, message', [
    (['--policy', 'oracle,wizard'], 'agentrl: error: --policy wizard is not known; choose from oracle,blind,random,hacker,model'),
    (['--repeats', '0'], 'agentrl: error: --repeats must be >= 1 and <= 100000, got 0'),
    (['--checkpoint', '/nonexistent/model.pt'], "agentrl: error: --checkpoint '/nonexistent/model.pt' does not exist"),
])
def test_rollout_bad_input_is_one_line(tmp_path, args, message):
    p = run('rollout', '--out', str(tmp_path / 'x'), *args, check=False)
    assert p.returncode == 2 and p.stderr.startswith(message) and 'Traceback' not in p.stderr
    assert len(p.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize('argv, err', [
    ([], 'agentrl: error: the following arguments are required: COMMAND (see agentrl --help)'),
    (['rollout', '--bogus', '1'], 'agentrl rollout: error: unrecognized arguments: --bogus 1 (see agentrl rollout --help)'),
    (['rollout', '--repeats', 'x'],
     "agentrl rollout: error: argument --repeats: invalid int value: 'x' (see agentrl rollout --help)"),
    (['rollout', '--engine', 'sglang'], "agentrl rollout: error: argument --engine: invalid choice: 'sglang' (choose "
                                        "from 'tinyagent', 'hf', 'vllm') (see agentrl rollout --help)"),
    (['show'], 'agentrl show: error: the following arguments are required: path (see agentrl show --help)'),
    (['check', 'x', '--max-ratio-dev'],
     'agentrl check: error: argument --max-ratio-dev: expected one argument (see agentrl check --help)'),
    (['template', 'audit'], 'agentrl template audit: error: the following arguments are required: TOKENIZER '
                            '(see agentrl template audit --help)'),
    (['template', 'audit', 'tok', '--thinking'], 'agentrl template audit: error: unrecognized arguments: --thinking '
                                                 '(see agentrl template audit --help)'),
    (['export', 'run', '--to', 'megatron'], "agentrl export: error: argument --to: invalid choice: 'megatron' (choose "
                                            "from 'verl', 'trl', 'slime', 'openrlhf', 'skyrl', 'prime-rl', 'sft', "
                                            "'skyrl-sft') (see agentrl export --help)"),
    (['bogus'], "agentrl: error: argument COMMAND: invalid choice: 'bogus' (choose from 'rollout', 'check', 'show', "
                "'report', 'train', 'template', 'drift', 'make-test-model', 'export', 'import', 'serve') (see agentrl "
                "--help)"),
    (['rollout', '--policy', '\x1b[2J'], None),            # not argparse's: checked by the job, also one line
])
def test_usage_errors_are_one_line(argv, err, capsys):
    """argparse's usage errors: one line naming the (sub)command and where its help is, exit code 2."""
    from agentrl.cli.main import main
    if err is None:
        assert main(argv + ['--out', '/nonexistent/x']) == 2
        assert capsys.readouterr().err == "agentrl: error: --policy \\x1b[2J is not known; choose from " \
                                          'oracle,blind,random,hacker,model\n'
        return
    with pytest.raises(SystemExit) as e:
        main(argv)
    cap = capsys.readouterr()
    assert e.value.code == 2 and cap.out == '' and cap.err == err + '\n'


@pytest.mark.parametrize('argv, err', [
    (['rollout', '--out', ''], '--out is empty; pass a path (`.` for the current folder)'),
    (['rollout', '--out', '  '], '--out is empty; pass a path (`.` for the current folder)'),
    (['rollout', '--resume', ''], '--resume is empty; pass a path (`.` for the current folder)'),
    (['rollout', '--checkpoint', ' '], '--checkpoint is empty; pass a path (`.` for the current folder)'),
    (['rollout', '--engine', 'hf', '--model', ''], '--model is empty; pass a path (`.` for the current folder)'),
    (['rollout', '--address', ''], '--address is empty; pass a value or drop the flag'),
    (['show', ''], 'PATH is empty; pass a path (`.` for the current folder)'),
    (['report', 'x', '--out', ''], '--out is empty; pass a path (`.` for the current folder)'),
    (['drift', '--model', 'x', '--tokenizer', ''], '--tokenizer is empty; pass a path (`.` for the current folder)'),
    (['template', 'audit', ''], 'TOKENIZER is empty; pass a path (`.` for the current folder)'),
    (['make-test-model', ' '], 'OUT is empty; pass a path (`.` for the current folder)'),
    (['export', 'r', '--to', 'sft', '--out', ''], '--out is empty; pass a path (`.` for the current folder)'),
    (['import', 'p', '--out', '', '--tokenizer', 't'], '--out is empty; pass a path (`.` for the current folder)'),
    (['train', '--out', ''], '--out is empty; pass a path (`.` for the current folder)'),
    (['rollout', '--repeats', '100000000'], '--repeats must be >= 1 and <= 100000, got 100000000'),
    (['rollout', '--policy', 'oracle,,blind'],
     "--policy 'oracle,,blind' has an empty name; separate the names by single commas, e.g. oracle,model"),
    (['drift', '--model', '/nonexistent', '--samples', '0'], None),
])
def test_empty_paths_and_unbounded_counts_are_refused(argv, err, capsys, tmp_path, monkeypatch):
    """An empty path (any command, any path flag) is refused before anything runs; nothing is written."""
    from agentrl.cli.main import main
    monkeypatch.chdir(tmp_path)
    if err is None:             # a non-empty bad path still gets its own message
        assert main(argv) == 2 and 'Traceback' not in capsys.readouterr().err
        return
    assert main(argv) == 2
    assert capsys.readouterr().err == f'agentrl: error: {err}\n'
    assert list(tmp_path.iterdir()) == []


def test_report_of_a_run_stopped_before_its_first_shard_says_what_works(tmp_path, capsys, monkeypatch):
    """`agentrl report D` on a run killed before any shard suggests --resume (D exists, `--out D` is refused)."""
    from agentrl.cli.main import main
    monkeypatch.chdir(tmp_path)
    (tmp_path / 'D' / 'trajectories').mkdir(parents=True)
    (tmp_path / 'D' / 'run.json').write_text(json.dumps({'plan': {'checkpoint': 'ck.pt@0123456789ab'}, 'chunk_size': 4}))
    assert main(['report', 'D']) == 2
    assert capsys.readouterr().err.strip() == ('agentrl: error: D/trajectories holds no records; finish the run with '
                                               '`agentrl rollout --resume D --checkpoint FILE`')    # after the progress line
    (tmp_path / 'D' / 'run.json').unlink()
    assert main(['report', 'D']) == 2
    assert capsys.readouterr().err.strip() == ("agentrl: error: D/trajectories holds no records; remove 'D' and run "
                                               '`agentrl rollout --out D`, or pass the folder of a run with records')


def test_usage_error_in_a_real_process():
    p = run('drift', '--samples', 'many', check=False)
    assert p.returncode == 2 and p.stdout == ''
    assert p.stderr == "agentrl drift: error: argument --samples: invalid int value: 'many' (see agentrl drift --help)\n"


def _policy_summary(unk):
    return {'episodes': 2, 'mean_reward': 0.5, 'stops': {'submitted': 2}, 'truncation_rate': 0.0, 'length_mean': 40.0,
            'length_max': 44, 'action_tokens_mean': 12.5, 'unknown_obs_tokens': unk, 'prompt_length': 30,
            'first_context_lengths': [30, 52]}


def test_summary_table_shows_unknown_observations_only_where_counted(capsys):
    """The hf engine's model counts no <unk> observation tokens: no `None` in its row, no column when none counted."""
    from agentrl.cli.rollout import print_summary
    from agentrl.jobs.rollout import RunSummary
    from agentrl.stats import PolicySummary
    run_summary = RunSummary(options={}, tasks=1, episodes=2, seconds=1.25, trajectories='trajectories', tokenizer='',
                             vocab_size=0, policies={'model': PolicySummary(**_policy_summary(None))}, model=None,
                             engine=None)
    print_summary(run_summary, 'run')
    lines = capsys.readouterr().out.splitlines()
    assert lines[2] == ('┃ policy ┃ episodes ┃ reward ┃ stops       ┃ trunc ┃ len mean ┃ len max ┃ action ┃ '
                        'context/turn (ep. 0) ┃')
    assert lines[4] == ('│ model  │        2 │  0.500 │ submitted:2 │  0.00 │     40.0 │      44 │   12.5 │ '
                        '            30:30,52 │')
    run_summary.policies['oracle'] = PolicySummary(**_policy_summary(3))
    print_summary(run_summary, 'run')
    lines = capsys.readouterr().out.splitlines()
    assert lines[2].endswith('┃ action ┃ unk obs ┃ context/turn (ep. 0) ┃')
    assert lines[4].endswith('│   12.5 │       - │             30:30,52 │') and lines[4].startswith('│ model ')
    assert lines[5].endswith('│   12.5 │       3 │             30:30,52 │') and lines[5].startswith('│ oracle ')


def test_version():
    assert run('--version').stdout.strip() == f'agentrl {arl.__version__}'


def test_check_fails_on_tampered_logp_and_empty_input(tmp_path):
    out = tmp_path / 'run'
    run('rollout', '--policy', 'model', '--split', 'heldout', '--repeats', '1', '--out', str(out))
    trajs = arl.read_trajectories(out / 'trajectories')
    trajs[0].sample_logp = trajs[0].sample_logp + 0.5 * trajs[0].action_mask     # stored under another sampler
    arl.write_trajectories(tmp_path / 'tampered.parquet', trajs)
    c = run('check', str(tmp_path / 'tampered.parquet'), '--model', str(out / 'model.pt'), check=False)
    assert c.returncode == 1 and 'result: FAILED (replay ratio off by' in c.stdout
    assert run('check', str(tmp_path / 'tampered.parquet'), '--model', str(out / 'model.pt'),
               '--max-ratio-dev', 'inf').returncode == 0
    (tmp_path / 'empty').mkdir()
    e = run('check', str(tmp_path / 'empty'), check=False)
    assert e.returncode == 1 and 'result: FAILED (no records)' in e.stdout


def test_a_refused_rollout_leaves_the_run_folder_untouched(tmp_path):
    """A second rollout into a run folder is refused before anything is written (model.pt included)."""
    out = tmp_path / 'run'
    run('rollout', '--policy', 'model', '--split', 'heldout', '--repeats', '1', '--out', str(out))
    before = {p.name: p.read_bytes() for p in out.rglob('*') if p.is_file()}
    p = run('rollout', '--policy', 'model', '--split', 'heldout', '--repeats', '1', '--seed', '7', '--out', str(out),
            check=False)
    assert p.returncode == 2 and p.stderr.startswith(f"agentrl: error: --out {str(out)!r} already holds a run")
    assert '--resume' in p.stderr and len(p.stderr.strip().splitlines()) == 1
    assert {p.name: p.read_bytes() for p in out.rglob('*') if p.is_file()} == before
    c = run('check', str(out / 'trajectories'), '--model', str(out / 'model.pt'), '--max-ratio-dev', '1e-5')
    assert 'result: OK' in c.stdout


def test_debug_flag_after_the_subcommand_shows_the_traceback(tmp_path):
    p = run('rollout', '--checkpoint', '/nonexistent/model.pt', '--out', str(tmp_path / 'x'), '--debug', check=False)
    assert p.returncode != 0 and 'Traceback' in p.stderr and "UserError: --checkpoint '/nonexistent/model.pt'" in p.stderr


def test_show_refuses_image_output(tmp_path):
    out = tmp_path / 'run'
    run('rollout', '--policy', 'oracle', '--split', 'heldout', '--repeats', '1', '--out', str(out))
    p = run('show', str(out / 'trajectories'), '-o', str(tmp_path / 'x.png'), check=False)
    assert p.returncode == 2 and 'agentrl show writes html, svg or terminal text, not png' in p.stderr
    assert not (tmp_path / 'x.png').exists()


def test_engine_vllm_flags_are_checked_before_anything_runs(tmp_path, capsys):
    """--engine vllm: --server is repeatable and comma-separated; a head size vLLM CPU cannot run is refused
    (rollout and make-test-model --for-vllm), naming the fix; no server is started, nothing is written."""
    import json

    from agentrl.cli.main import build_parser, main
    args = build_parser().parse_args(['rollout', '--engine', 'vllm', '--server', 'http://a:1', '--server',
                                      'http://b:2,http://c:3'])
    assert args.server == ['http://a:1', 'http://b:2', 'http://c:3']
    model = tmp_path / 'hd16'
    model.mkdir()
    (model / 'config.json').write_text(json.dumps({'hidden_size': 64, 'num_attention_heads': 4, 'head_dim': 16}))
    assert main(['rollout', '--engine', 'vllm', '--model', str(model), '--out', str(tmp_path / 'run')]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"agentrl: error: --model '{model}': vllm: {model / 'config.json'} has head_dim=16, which "
                          'vLLM CPU attention does not support') and err.count('\n') == 1
    assert not (tmp_path / 'run').exists()
    assert main(['rollout', '--engine', 'vllm', '--model', str(model), '--server', 'http://a:1', '--profile',
                 '--out', str(tmp_path / 'run')]) == 2
    assert '--profile applies to --engine hf, not --engine vllm' in capsys.readouterr().err
    assert main(['make-test-model', str(tmp_path / 'm'), '--heads', '4', '--for-vllm']) == 2
    assert capsys.readouterr().err == ('agentrl: error: --for-vllm: head_dim 16 (--hidden 64 / --heads 4) is not one '
                                       'vLLM CPU attention runs (32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512); '
                                       'fix: --heads 2 --kv-heads 1 (head_dim 32)\n')
    assert not (tmp_path / 'm').exists()


def test_make_test_model_for_vllm_picks_a_head_size_vllm_runs(tmp_path):
    """Without --heads, --for-vllm picks the most heads whose head_dim vLLM CPU attention runs (64 / 2 = 32)."""
    import json

    from _tokenizers import tokenizer_path

    from agentrl.cli.main import main
    from agentrl.cli.make_test_model import MakeTestModelOptions
    for hidden, kv_heads, heads in ((None, 1, 2), (128, 1, 4), (96, 1, 3), (None, 2, 2)):
        opts = MakeTestModelOptions(out=str(tmp_path / 'none'), hidden=hidden, kv_heads=kv_heads, for_vllm=True)
        opts.validate()
        assert (opts.hidden, opts.heads) == (hidden or 64, heads)
    opts = MakeTestModelOptions(out=str(tmp_path / 'none'))
    opts.validate()
    assert (opts.hidden, opts.heads, opts.kv_heads) == (64, 4, 2)            # without --for-vllm: as before
    out = tmp_path / 'm'
    assert main(['make-test-model', str(out), '--tokenizer', str(tokenizer_path('qwen3')), '--for-vllm']) == 0
    cfg = json.loads((out / 'config.json').read_text())
    assert (cfg['hidden_size'], cfg['num_attention_heads'], cfg['num_key_value_heads'], cfg['head_dim']) == (64, 2, 2, 32)
