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
    (['--repeats', '0'], 'agentrl: error: --repeats must be >= 1, got 0'),
    (['--checkpoint', '/nonexistent/model.pt'], "agentrl: error: --checkpoint '/nonexistent/model.pt' does not exist"),
])
def test_rollout_bad_input_is_one_line(tmp_path, args, message):
    p = run('rollout', '--out', str(tmp_path / 'x'), *args, check=False)
    assert p.returncode == 2 and p.stderr.startswith(message) and 'Traceback' not in p.stderr
    assert len(p.stderr.strip().splitlines()) == 1


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
