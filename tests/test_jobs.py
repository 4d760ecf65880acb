"""The one rollout job (agentrl.jobs): one layout, streaming, interrupts, resume, run folders never damaged.

Same records at any scale for TinyAgent are in tests/test_ray.py; the HF engine's are here (a
2-layer random Qwen3 on Ray actors started in this process, 1 CPU each).
"""
import errno
import importlib.util
import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch

import agentrl as arl
from agentrl import checks, store
from agentrl.jobs import plan as jp
from agentrl.jobs import rollout as jr
from agentrl.jobs.plan import RolloutOptions
from agentrl.sampling import episode_seed

AGENTRL = [sys.executable, '-m', 'agentrl']
HAS_RAY = importlib.util.find_spec('ray') is not None


def agentrl(*args, check=True, timeout=300):
    p = subprocess.run([*AGENTRL, *map(str, args)], capture_output=True, text=True, timeout=timeout)
    if check:
        assert p.returncode == 0, p.stdout + p.stderr
    return p


def by_id(path):
    """Records of a store keyed by (group_id, rollout_id); each episode must appear once."""
    out = {}
    for t in arl.read_trajectories(path):
        key = (t.provenance.group_id, t.provenance.rollout_id)
        assert key not in out, f'{key} stored twice'
        out[key] = t
    return out


def assert_same(a, b):
    assert torch.equal(a.ids, b.ids) and torch.equal(a.owner, b.owner) and torch.equal(a.turn, b.turn)
    assert a.sample_logp.numpy().tobytes() == b.sample_logp.numpy().tobytes()
    assert a.reward == b.reward and checks.record_digest(a) == checks.record_digest(b)
    assert (a.provenance.seed, a.provenance.attempt, a.provenance.model) == \
        (b.provenance.seed, b.provenance.attempt, b.provenance.model)


def files(folder):
    return {str(p.relative_to(folder)): p.read_bytes() for p in Path(folder).rglob('*') if p.is_file()}


# ----------------------------------------------------------------------------- plan and options

def test_options_are_declared_once_and_range_checked():
    import argparse

    from agentrl.cli.options import add_fields
    p = argparse.ArgumentParser()
    add_fields(p, RolloutOptions)
    flags = {a.option_strings[0] for a in p._actions if a.option_strings and a.dest != 'help'}
    assert len(flags) == len(jp.fields(RolloutOptions)) == 27 and '--no-batch' in flags
    assert {'--tool-choice', '--response-format'} <= flags           # the grammar constraint (docs/grammar.md)
    assert '--screenshots' in flags                                  # read results as images (docs/design.md#images)
    for f in jp.fields(RolloutOptions):
        assert f.metadata['help'], f.name
    with pytest.raises(ValueError, match=r'^--max-new-tokens applies to --engine hf, not --engine tinyagent'):
        RolloutOptions(max_new_tokens=8).validate()
    RolloutOptions(top_p=0.5, top_k=5, min_p=0.05).validate()      # TinyAgent samples under a full spec too
    with pytest.raises(ValueError, match=r'^--temperature must be a finite number, got nan'):
        RolloutOptions(temperature=float('nan')).validate()
    with pytest.raises(ValueError, match=r'^--chunk-size must be >= 1 and <= 100000, got 0'):
        RolloutOptions(chunk_size=0).validate()
    assert RolloutOptions(engine='hf').policy == ['model'] and len(RolloutOptions().policy) == 5


@pytest.mark.parametrize('argv, message', [
    (['rollout', '--top-p', '2'], '--top-p must be in (0, 1] (got 2); 1 turns it off'),
    (['rollout', '--max-new-tokens', '5'], '--max-new-tokens applies to --engine hf, not --engine tinyagent'),
    (['rollout', '--temperature', 'inf'], '--temperature must be a finite number, got inf'),
    (['rollout', '--workers', '-1'], '--workers must be >= 0 and <= 4096, got -1'),
    (['rollout', '--seed', '-3'], '--seed must be >= 0'),
    (['train', '--kl-coef', 'nan'], '--kl-coef must be a finite number, got nan'),
    (['check', '{tmp}', '--max-ratio-dev', 'nan'], '--max-ratio-dev must be a finite number, got nan'),
    (['train', '--sft-lr', 'inf'], '--sft-lr must be a finite number, got inf'),
    (['train', '--clip-eps', '0'], '--clip-eps must be > 0.0 and <= 10.0, got 0.0'),
    (['make-test-model', '{tmp}/m', '--layers', '0'], '--layers must be >= 1 and <= 256, got 0'),
])
def test_every_numeric_flag_is_range_checked_before_anything_runs(argv, message, tmp_path):
    argv = [a.replace('{tmp}', str(tmp_path)) for a in argv]
    if argv[0] in ('rollout', 'train'):
        argv += ['--out', str(tmp_path / 'out')]
    p = agentrl(*argv, check=False)
    assert p.returncode == 2 and message in p.stderr and 'Traceback' not in p.stderr
    assert len(p.stderr.strip().splitlines()) == 1
    assert not (tmp_path / 'out').exists() and not (tmp_path / 'm').exists()


def test_help_imports_no_heavy_library():
    """``--help`` starts fast because it imports none of torch, ray, transformers, pyarrow (their import is the cost;
    the time itself is measured in bench/, never asserted here: a timed test fails on a loaded machine)."""
    for args in (['--help'], ['rollout', '--help'], ['train', '--help'], ['check', '--help'], ['serve', '--help']):
        r = subprocess.run([sys.executable, '-X', 'importtime', '-m', 'agentrl', *args], capture_output=True, text=True)
        assert r.returncode == 0 and r.stdout.startswith('usage: agentrl'), r.stderr[-400:]
        top = {line.split('|')[-1].strip().split('.')[0] for line in r.stderr.splitlines() if line.startswith('import time:')}
        assert not top & {'torch', 'ray', 'transformers', 'pyarrow', 'numpy'}, (args, sorted(top & {'torch', 'ray', 'transformers', 'pyarrow', 'numpy'}))


def test_cli_modules_import_no_heavy_library():
    code = ('import sys; from agentrl.cli.main import build_parser; build_parser(); '
            'print(sorted(m for m in ("torch", "ray", "transformers", "pyarrow", "rich") if m in sys.modules))')
    out = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == '[]'


# ----------------------------------------------------------------------------- one layout, one seed rule

def test_in_process_run_streams_shards_and_names_no_local_path(tmp_path):
    out = tmp_path / 'run'
    summary = jr.rollout_job(RolloutOptions(policy=['random', 'model'], split='heldout', repeats=3, seed=4,
                                            chunk_size=5, out=str(out)), progress=False)
    shards = sorted(p.name for p in (out / 'trajectories').iterdir())
    assert shards == [f'part-{i:06d}.parquet' for i in range(8)]        # 4 chunks per policy: 5+5+5+3
    assert summary['episodes'] == 36 and summary['trajectories'] == 'trajectories'
    assert summary['model'] == {'name': 'model.pt', 'fingerprint': jr.model_fingerprint(out / 'model.pt')}
    recs = by_id(out / 'trajectories')
    for (g, r), t in recs.items():
        assert t.provenance.seed == episode_seed(4, g, r) and t.provenance.attempt == 1
    assert {t.provenance.model for t in recs.values() if t.provenance.policy == 'model'} == \
        {f"model.pt@{summary['model']['fingerprint']}"}
    text = (out / 'summary.json').read_text()
    assert str(tmp_path) not in text and json.loads(text)['policies']['model']['episodes'] == 18
    assert all(str(tmp_path) not in (t.provenance.model + t.provenance.tokenizer) for t in recs.values())
    manifest = json.loads((out / 'run.json').read_text())
    assert manifest['episodes'] == 36 and manifest['chunk_size'] == 5 and manifest['plan']['seed'] == 4
    # check, report and show read the folder (and still a single file)
    assert 'result: OK' in agentrl('check', out / 'trajectories', '--model', out / 'model.pt').stdout
    assert 'records          36' in agentrl('check', out).stdout            # the run folder reads its shards
    assert agentrl('report', out).returncode == 0 and (out / 'report.html').is_file()
    arl.write_trajectories(tmp_path / 'one.parquet', list(recs.values()))
    assert 'records          36' in agentrl('check', tmp_path / 'one.parquet').stdout


def test_tinyagent_samples_under_a_full_spec_and_check_replays_it(tmp_path):
    out = tmp_path / 'run'
    jr.rollout_job(RolloutOptions(policy=['model'], split='heldout', repeats=2, seed=1, top_k=40, top_p=0.9,
                                  min_p=0.01, temperature=0.8, out=str(out)), progress=False)
    recs = list(by_id(out / 'trajectories').values())
    assert len(recs) == 12
    assert {t.provenance.sampling for t in recs} == {arl.SamplingSpec(temperature=0.8, top_k=40, top_p=0.9,
                                                                        min_p=0.01)}
    res = agentrl('check', out, '--model', out / 'model.pt')
    assert 'result: OK' in res.stdout, res.stdout


def test_scripted_policies_sample_from_their_episode_seed(tmp_path):
    """A scripted episode's record depends only on its own seed, not on its chunk."""
    a = jr.rollout_job(RolloutOptions(policy=['random'], split='heldout', repeats=4, seed=1, chunk_size=3,
                                      out=str(tmp_path / 'a')), progress=False)
    b = jr.rollout_job(RolloutOptions(policy=['random'], split='heldout', repeats=4, seed=1, chunk_size=24,
                                      out=str(tmp_path / 'b')), progress=False)
    assert a['policies'] == b['policies']
    ra, rb = by_id(tmp_path / 'a' / 'trajectories'), by_id(tmp_path / 'b' / 'trajectories')
    assert ra.keys() == rb.keys() and len(ra) == 24
    for k in ra:
        assert_same(ra[k], rb[k])


# ----------------------------------------------------------------------------- kill -9, Ctrl-C, resume

_KILL_AT = textwrap.dedent('''
    import json, os, signal, sys
    from agentrl.jobs.plan import RolloutOptions
    from agentrl.jobs.rollout import rollout_job

    def die(state):
        if state.done >= int(sys.argv[2]):
            os.kill(os.getpid(), signal.SIGKILL)

    rollout_job(RolloutOptions(**json.loads(sys.argv[1])), on_chunk=die, progress=False)
''')


def _kill_then_resume(opts: dict, kill_at: int, ref: Path, resume: dict | None = None):
    p = subprocess.run([sys.executable, '-c', _KILL_AT, json.dumps(opts), str(kill_at)], capture_output=True,
                       text=True, timeout=300)
    out = Path(opts['out'])
    assert p.returncode == -signal.SIGKILL, p.stderr
    before = store.stored_identities(out / 'trajectories')
    assert kill_at <= len(before) < len(by_id(ref)) and not (out / 'summary.json').exists()
    s = jr.rollout_job(RolloutOptions(resume=str(out), **(resume or {})), progress=False)
    assert (s['engine']['skipped_by_resume'], s['engine']['written']) == (len(before), len(by_id(ref)) - len(before))
    a, b = by_id(ref), by_id(out / 'trajectories')
    assert a.keys() == b.keys()                       # every episode exactly once (by_id refuses a second copy)
    for k in a:
        assert_same(a[k], b[k])
    return s


def test_kill_9_halfway_then_resume_stores_every_episode_once(tmp_path):
    opts = dict(policy=['model', 'blind'], split='heldout', repeats=4, seed=3, chunk_size=5)
    ref = jr.rollout_job(RolloutOptions(**opts, out=str(tmp_path / 'ref')), progress=False)
    s = _kill_then_resume(dict(opts, out=str(tmp_path / 'cut')), 10, tmp_path / 'ref' / 'trajectories')
    assert s['policies'] == ref['policies'] and s['episodes'] == 48


def _catches(pid: int, sig: int) -> bool:
    """True when process ``pid`` runs a handler of its own for ``sig`` (Linux: SigCgt of /proc/PID/status)."""
    status = Path(f'/proc/{pid}/status')
    if not Path('/proc/self/status').exists():
        return True                                  # no /proc: rely on the marker alone
    for line in status.read_text().splitlines():
        if line.startswith('SigCgt:'):
            return bool(int(line.split()[1], 16) >> (sig - 1) & 1)
    return False


def _wait_until_ready(proc, ready, what: str, timeout: float = 900.0) -> None:
    """Wait until ``ready()``: a marker the child writes after it installs its signal handlers.

    Never signals on a deadline: a child that exits first, or shows no marker within ``timeout``,
    fails the test with its output (a signal sent before the handler is installed would kill it).
    """
    deadline = time.monotonic() + timeout
    while not ready():
        if proc.poll() is not None:
            raise AssertionError(f'the child exited with {proc.returncode} before {what}: {proc.communicate()}')
        if time.monotonic() > deadline:
            raise AssertionError(f'no {what} within {timeout:.0f} s')
        time.sleep(0.05)


#: ``agentrl rollout ARGS`` held after its first shard until the test's signal has reached the job's handler
#: (jobs.rollout._Signals): the job cannot finish first, however loaded the machine is
_HELD_ROLLOUT = textwrap.dedent('''
    import signal, sys, time
    from pathlib import Path
    from agentrl import store
    from agentrl.cli.main import main
    write, marker = store.ShardWriter.write, Path(sys.argv[1])

    def held(self, recs):
        path = write(self, recs)
        if not marker.exists():
            job = signal.getsignal(signal.SIGTERM).__self__          # the job's _Signals, installed by now
            marker.write_text(str(path))
            while not job.stop:                                      # until the test's signal has landed
                time.sleep(0.01)
        return path
    store.ShardWriter.write = held
    sys.exit(main(sys.argv[2:]))
''')


@pytest.mark.parametrize('sig', [signal.SIGINT, signal.SIGTERM])
def test_ctrl_c_and_sigterm_keep_finished_shards_and_say_how_to_resume(tmp_path, sig):
    out, marker = tmp_path / 'run', tmp_path / 'first-shard'
    env = dict(os.environ, PYTHONPATH=str(Path(arl.__file__).parents[1]))
    # the child restores the default SIGINT handler: a parent that ignores SIGINT must not make it hang
    proc = subprocess.Popen([sys.executable, '-c', _HELD_ROLLOUT, str(marker), 'rollout', '--policy', 'model',
                             '--split', 'heldout', '--repeats', '80', '--no-batch', '--chunk-size', '4', '--out',
                             str(out)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        # the marker is written after the first shard, inside the job's signal-handling block, and the
        # job then waits for the signal: it is sent at that known point, never after a sleep
        _wait_until_ready(proc, marker.exists, 'the first shard')
        assert _catches(proc.pid, signal.SIGTERM)          # _Signals installs SIGINT and SIGTERM together
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, err
    kept = store.stored_identities(out / 'trajectories')
    assert len(kept) == 4                                        # the chunk in hand when the signal came, whole
    assert f'agentrl: interrupted: {len(kept)} of 480 episodes are stored in {str(out)!r}' in err
    assert f'finish the run with: agentrl rollout --resume {out}' in err
    assert not (out / 'summary.json').exists() and not list(out.rglob('.*.tmp-*'))
    assert not (out / '.lock').exists()
    if sig == signal.SIGINT:
        p = agentrl('rollout', '--resume', out)
        assert 'wrote 480 episodes to' in p.stdout
        recs = by_id(out / 'trajectories')
        assert len(recs) == 480 and {t.provenance.attempt for t in recs.values()} == {1}
        assert all(t.provenance.seed == episode_seed(0, *k) for k, t in recs.items())


def test_resume_refuses_another_plan_or_model(tmp_path):
    out = tmp_path / 'run'
    jr.rollout_job(RolloutOptions(policy=['model'], split='heldout', repeats=1, out=str(out)), progress=False)
    with pytest.raises(ValueError, match='the run was planned with --seed 0, this command says --seed 5; drop the flag'):
        jr.rollout_job(RolloutOptions(resume=str(out), seed=5), progress=False)
    torch.manual_seed(9)
    arl.save_checkpoint(arl.TinyAgent(316), str(out / 'model.pt'))
    with pytest.raises(ValueError, match=r'the run was sampled from model\.pt@[0-9a-f]{12}, the model there now'):
        jr.rollout_job(RolloutOptions(resume=str(out)), progress=False)


def test_resume_refuses_every_given_flag_that_differs_from_the_plan(tmp_path, capsys):
    """On resume a flag given on the command line must equal the plan, even when it equals the default."""
    from agentrl.cli.main import main
    out = tmp_path / 'run'
    jr.rollout_job(RolloutOptions(policy=['oracle', 'model'], split='heldout', repeats=1, temperature=0.5,
                                  chunk_size=4, out=str(out)), progress=False)
    (out / 'summary.json').unlink()
    before = files(out)
    fix = 'drop the flag (resume keeps the plan) or start a new --out'
    for argv, planned, says in [
            (['--temperature', '1.0'], '--temperature 0.5', '--temperature 1.0'),
            (['--policy', 'oracle,blind,random,hacker,model'], '--policy oracle,model',
             '--policy oracle,blind,random,hacker,model'),
            (['--repeats', '3'], '--repeats 1', '--repeats 3'),
            (['--split', 'all'], '--split heldout', '--split all'),
            (['--chunk-size', '32'], '--chunk-size 4', '--chunk-size 32'),
            (['--reward-tests', 'public'], '--reward-tests hidden', '--reward-tests public')]:
        assert main(['rollout', '--resume', str(out), *argv]) == 2
        assert capsys.readouterr().err == (f"agentrl: error: --resume {str(out)!r}: the run was planned with {planned}, "
                                           f"this command says {says}; {fix}\n")
    assert main(['rollout', '--resume', str(out), '--no-batch']) == 2
    assert capsys.readouterr().err == (f"agentrl: error: --resume {str(out)!r}: the run was planned without --no-batch, "
                                       f"this command says with --no-batch; {fix}\n")
    assert main(['rollout', '--resume', str(out), '--out', str(out)]) == 2
    assert capsys.readouterr().err == (f"agentrl: error: --resume {str(out)!r} writes into that run folder; drop --out "
                                       "(or drop --resume to start a new run in --out)\n")
    assert files(out) == before                                     # nothing written by a refused resume
    # flags equal to the plan and the scale-out flags are accepted
    assert main(['rollout', '--resume', str(out), '--temperature', '0.5', '--chunk-size', '4', '--workers', '0',
                 '--policy', 'oracle,model']) == 0
    capsys.readouterr()


@pytest.mark.parametrize('field, value, msg', [
    ('repeats', 1_000_000_000, 'repeats must be >= 1 and <= 100000, got 1000000000'),
    ('chunk_size', 0, 'chunk_size must be >= 1 and <= 100000, got 0'),
    ('split', 'everything', "split 'everything' is not known; choose from train,heldout,all"),
    ('temperature', 'hot', "temperature must be a float, got 'hot'"),
    ('policy', ['oracle', ''], "policy must list policies from oracle,blind,random,hacker,model, got ['oracle', '']"),
])
def test_resume_refuses_a_hand_edited_plan_out_of_range(tmp_path, field, value, msg):
    out = tmp_path / 'run'
    jr.rollout_job(RolloutOptions(policy=['oracle'], split='heldout', repeats=1, out=str(out)), progress=False)
    m = json.loads((out / 'run.json').read_text())
    if field == 'chunk_size':
        m['chunk_size'] = value
    else:
        m['plan'][field] = value
    (out / 'run.json').write_text(json.dumps(m))
    with pytest.raises(ValueError) as e:
        jr.rollout_job(RolloutOptions(resume=str(out)), progress=False)
    assert str(e.value) == f"{str(out / 'run.json')!r}: plan field {msg}; restore run.json or start a new --out"


def test_resume_refuses_shards_of_another_run(tmp_path):
    """A shard dropped into a run folder from another run (same episodes, other sampler or model) is refused."""
    import shutil
    plan = dict(policy=['model'], split='heldout', repeats=1, chunk_size=4)
    jr.rollout_job(RolloutOptions(**plan, out=str(tmp_path / 'a')), progress=False)
    jr.rollout_job(RolloutOptions(**plan, temperature=0.5, out=str(tmp_path / 'hot')), progress=False)
    shutil.copy(tmp_path / 'a' / 'model.pt', tmp_path / 'other.pt')       # the same weights under another name
    jr.rollout_job(RolloutOptions(**plan, checkpoint=str(tmp_path / 'other.pt'), out=str(tmp_path / 'ckpt')),
                   progress=False)
    a = tmp_path / 'a'
    (a / 'summary.json').unlink()                                        # as if interrupted after its shards
    fp = jr.model_fingerprint(a / 'model.pt')
    shard = a / 'trajectories' / 'part-000001.parquet'
    fix = f"move part-000001.parquet out of {str(a / 'trajectories')!r} (its episodes then run again), or start a new --out"
    for src, field, got, want in [
            ('hot', 'sampling', {'temperature': 0.5, 'top_k': 0, 'top_p': 1.0, 'min_p': 0.0, 'logp_mode': 'processed'},
             {'temperature': 1.0, 'top_k': 0, 'top_p': 1.0, 'min_p': 0.0, 'logp_mode': 'processed'}),
            ('ckpt', 'model', f'other.pt@{fp}', f'model.pt@{fp}')]:
        shutil.copy(tmp_path / src / 'trajectories' / 'part-000001.parquet', shard)
        before = files(a)
        with pytest.raises(ValueError) as e:
            jr.rollout_job(RolloutOptions(resume=str(a)), progress=False)
        assert str(e.value) == (f"--resume {str(a)!r}: {str(shard)!r} row 0: provenance.{field} is {got!r} but "
                                f"run.json fixes {want!r} (a shard of another run); {fix}")
        assert files(a) == before and not (a / '.lock').exists()           # nothing written
    jr.rollout_job(RolloutOptions(**plan, seed=5, out=str(tmp_path / 'seeded')), progress=False)
    shutil.copy(tmp_path / 'seeded' / 'trajectories' / 'part-000001.parquet', shard)
    rid = store.read_trajectories(shard)[0].provenance.rollout_id
    assert rid.startswith('5/model/') and rid.count('/model/') == 1
    with pytest.raises(ValueError) as e:
        jr.rollout_job(RolloutOptions(resume=str(a)), progress=False)
    assert str(e.value) == (f"--resume {str(a)!r}: {str(shard)!r} row 0: provenance.group_id: episode {rid} is not in "
                            f"the plan of run.json (a shard of another run); {fix}")
    shard.unlink()                                                       # the fix: its episodes run again
    s = jr.rollout_job(RolloutOptions(resume=str(a)), progress=False)
    assert (s['engine']['skipped_by_resume'], s['engine']['written']) == (4, 2)
    p = agentrl('rollout', '--resume', tmp_path / 'ckpt', check=False)   # run.json names the checkpoint, not its path
    assert p.returncode == 2 and p.stderr == (f"agentrl: error: --resume {str(tmp_path / 'ckpt')!r}: run.json names "
                                              f"the model other.pt@{fp}, not its path; pass --checkpoint FILE (that "
                                              "model) again\n")


def test_resume_of_a_complete_run_writes_nothing(tmp_path):
    out = tmp_path / 'run'
    agentrl('rollout', '--policy', 'oracle,model', '--split', 'heldout', '--repeats', '1', '--out', out)
    before = {p: (p.stat().st_mtime_ns, p.read_bytes()) for p in out.rglob('*') if p.is_file()}
    listing = sorted(str(p) for p in out.rglob('*'))
    mtime = out.stat().st_mtime_ns
    p = agentrl('rollout', '--resume', out)
    assert p.stdout == f"{str(out)!r} is already complete: 12 of 12 episodes are stored and summary.json is written; " \
                       "nothing to run\n" and p.stderr == ''
    assert {p: (p.stat().st_mtime_ns, p.read_bytes()) for p in out.rglob('*') if p.is_file()} == before
    assert sorted(str(p) for p in out.rglob('*')) == listing and out.stat().st_mtime_ns == mtime
    with pytest.raises(jr.RunComplete, match=r"already complete: 12 of 12 episodes"):
        jr.rollout_job(RolloutOptions(resume=str(out)), progress=False)


# ----------------------------------------------------------------------------- run folders never damaged

def test_second_rollout_into_a_locked_folder_refuses(tmp_path):
    out = tmp_path / 'run'
    out.mkdir()
    with jr.run_lock(out):
        p = agentrl('rollout', '--policy', 'oracle', '--split', 'heldout', '--repeats', '1', '--out', out, check=False)
        assert sorted(os.listdir(out)) == ['.lock']          # the refused job leaves the holder's lock alone
    assert p.returncode == 2 and 'is being written by another agentrl job' in p.stderr
    assert os.listdir(out) == []                             # the holder removes it when it is done


def test_a_finished_or_failed_job_leaves_no_lock_file(tmp_path):
    out = tmp_path / 'run'
    jr.rollout_job(RolloutOptions(policy=['oracle'], split='heldout', repeats=1, chunk_size=4, out=str(out)),
                   progress=False)
    assert sorted(os.listdir(out)) == ['run.json', 'summary.json', 'trajectories']

    class Crash(Exception):
        pass

    def crash(state):
        raise Crash
    cut = tmp_path / 'cut'                                    # fails after its first shard: the shard is kept
    with pytest.raises(Crash):
        jr.rollout_job(RolloutOptions(policy=['oracle'], split='heldout', repeats=1, chunk_size=4, out=str(cut)),
                       on_chunk=crash, progress=False)
    assert sorted(os.listdir(cut)) == ['run.json', 'trajectories']
    with pytest.raises(ValueError, match=r"already holds a run \(run.json, trajectories/\); pass --resume"):
        jr.rollout_job(RolloutOptions(policy=['oracle'], split='heldout', repeats=1, out=str(cut)), progress=False)
    assert sorted(os.listdir(cut)) == ['run.json', 'trajectories']
    jr.rollout_job(RolloutOptions(resume=str(cut)), progress=False)
    assert sorted(os.listdir(cut)) == ['run.json', 'summary.json', 'trajectories']
    # a lock left by a killed job (flock dies with its process) is taken over, then removed
    (out / '.lock').write_text('99999999')
    with jr.run_lock(out) as lock:
        assert lock.read_text() == str(os.getpid())
    assert not lock.exists()


def test_train_refuses_a_locked_or_finished_folder(tmp_path):
    from agentrl.train import TrainConfig, train
    out = tmp_path / 't'
    out.mkdir()
    with jr.run_lock(out):
        with pytest.raises(ValueError, match='is being written by another agentrl job'):
            train(TrainConfig(sft_steps=1, grpo_steps=0, eval_repeats=1, out=str(out)))
        assert sorted(os.listdir(out)) == ['.lock']
    assert os.listdir(out) == []
    (out / 'model.pt').write_bytes(b'x')
    with pytest.raises(ValueError, match=r"already holds a training run \(model.pt\)"):
        train(TrainConfig(sft_steps=1, grpo_steps=0, eval_repeats=1, out=str(out)))


def _enospc(monkeypatch, name):
    """Make the atomic write of a file called ``name`` fail as a full disk does (after a partial write)."""
    from agentrl import io
    real = io.atomic_path

    import contextlib

    @contextlib.contextmanager
    def full(final, **kw):
        with real(final, **kw) as tmp:
            yield tmp
            if Path(final).name == name:
                Path(tmp).write_bytes(b'partial')
                raise OSError(errno.ENOSPC, 'No space left on device', str(tmp))
    monkeypatch.setattr(io, 'atomic_path', full)


def test_full_disk_while_saving_the_model_leaves_no_run(tmp_path, monkeypatch):
    _enospc(monkeypatch, 'model.pt')
    out = tmp_path / 'run'
    with pytest.raises(OSError, match='No space left on device'):
        jr.rollout_job(RolloutOptions(policy=['model'], split='heldout', repeats=1, out=str(out)), progress=False)
    assert not out.exists()                       # a run is complete or absent; no temporary file left
    (out).mkdir()
    (out / 'notes.txt').write_text('mine')
    with pytest.raises(OSError):
        jr.rollout_job(RolloutOptions(policy=['model'], split='heldout', repeats=1, out=str(out)), progress=False)
    assert sorted(os.listdir(out)) == ['notes.txt']


def test_full_disk_after_some_shards_says_how_to_resume(tmp_path, monkeypatch):
    _enospc(monkeypatch, 'part-000001.parquet')
    from agentrl import io
    monkeypatch.setattr(store, 'atomic_path', io.atomic_path)          # the shard writer's own reference
    out = tmp_path / 'run'
    ckpt = tmp_path / 'ck.pt'
    arl.save_checkpoint(arl.TinyAgent(316), str(ckpt))
    with pytest.raises(ValueError) as e:
        jr.rollout_job(RolloutOptions(policy=['model'], split='heldout', repeats=1, chunk_size=4, checkpoint=str(ckpt),
                                      out=str(out)), progress=False)
    part = out / 'trajectories' / 'part-000001.parquet'
    tmp = re.search(r"No space left on device: '([^']+)'", str(e.value)).group(1)
    assert tmp.startswith(str(part.parent)) and not Path(tmp).exists()
    assert str(e.value) == (f"No space left on device: {tmp!r}; the finished shards are kept in {str(out)!r}: free "
                            f'some space, then finish the run with: agentrl rollout --resume {out} --checkpoint {ckpt}')
    assert len(store.stored_identities(out / 'trajectories')) == 4
    monkeypatch.undo()
    s = jr.rollout_job(RolloutOptions(resume=str(out), checkpoint=str(ckpt)), progress=False)     # the fix works
    assert (s['engine']['skipped_by_resume'], s['engine']['written']) == (4, 2)


def test_interrupt_message_names_the_model_flag_resume_needs(tmp_path, monkeypatch):
    ckpt = tmp_path / 'my model.pt'
    arl.save_checkpoint(arl.TinyAgent(316), str(ckpt))
    real = jr.run_chunks
    monkeypatch.setattr(jr, 'run_chunks', lambda *a, **k: real(*a, **{**k, 'should_stop': lambda: True}))
    out = tmp_path / 'run'
    with pytest.raises(jr.RunInterrupted) as e:
        jr.rollout_job(RolloutOptions(policy=['model'], split='heldout', repeats=1, chunk_size=4, checkpoint=str(ckpt),
                                      out=str(out)), progress=False)
    assert str(e.value).endswith(f"; finish the run with: agentrl rollout --resume {out} --checkpoint '{ckpt}'")
    assert jr.resume_command('r', model='m dir') == "agentrl rollout --resume r --model 'm dir'"
    assert jr.resume_command('r') == 'agentrl rollout --resume r'


def test_full_disk_while_training_leaves_no_run(tmp_path, monkeypatch):
    from agentrl.train import TrainConfig, train
    _enospc(monkeypatch, 'summary.json')
    out = tmp_path / 't'
    with pytest.raises(OSError, match='No space left on device'):
        train(TrainConfig(sft_steps=2, grpo_steps=1, group=2, tasks_per_step=1, eval_repeats=1, out=str(out)))
    assert not out.exists()
    out.mkdir()
    (out / 'notes.txt').write_text('mine')
    with pytest.raises(OSError, match='No space left on device'):
        train(TrainConfig(sft_steps=1, grpo_steps=0, eval_repeats=1, out=str(out)))
    assert os.listdir(out) == ['notes.txt']                 # no .lock, no staging folder


def _tmpfs(path: Path, size: str):
    path.mkdir()
    p = subprocess.run(['mount', '-t', 'tmpfs', '-o', f'size={size}', 'tmpfs', str(path)], capture_output=True)
    if p.returncode != 0:
        pytest.skip(f'cannot mount a tmpfs here ({p.stderr.decode().strip()[:80]}); the ENOSPC tests above '
                    'simulate a full disk')
    return path


def test_a_real_full_disk_gives_one_line_and_leaves_the_folder_as_it_was(tmp_path):
    disk = _tmpfs(tmp_path / 'disk', '1000k')
    try:
        (disk / 'filler').write_bytes(b'\0' * 600_000)        # room for the records, not for model.pt
        out = disk / 'run'
        p = agentrl('rollout', '--policy', 'model', '--split', 'heldout', '--repeats', '1', '--out', out, check=False)
        assert p.returncode == 2 and p.stderr.startswith('agentrl: error: No space left on device')
        assert len(p.stderr.strip().splitlines()) == 1 and sorted(os.listdir(disk)) == ['filler']
    finally:
        subprocess.run(['umount', str(disk)], check=False)


def test_make_test_model_refuses_an_existing_model_folder(tmp_path):
    m = tmp_path / 'm'
    m.mkdir()
    (m / 'config.json').write_text('{}')
    for force in ([], ['--force']):         # not a folder make-test-model wrote: refused even with --force
        p = agentrl('make-test-model', m, *force, check=False)
        assert p.returncode == 2 and p.stderr == (f"agentrl: error: OUT {str(m)!r} is not empty and is not a "
                                                  'make-test-model folder (no agentrl_test_model.json); choose a new '
                                                  'or empty folder\n')
    assert (m / 'config.json').read_text() == '{}'


def test_show_and_report_into_a_folder_leave_no_temp_file(tmp_path):
    out = tmp_path / 'run'
    jr.rollout_job(RolloutOptions(policy=['oracle'], split='heldout', repeats=1, out=str(out)), progress=False)
    target = tmp_path / 'existing'
    target.mkdir()
    for args in (['show', out / 'trajectories', '--format', 'html'], ['report', out]):
        p = agentrl(*args, '--out', target, check=False)
        assert p.returncode == 2 and f'--out {str(target)!r} is a folder; pass a file name' in p.stderr
    assert not list(tmp_path.glob('*.tmp-*')) and not list(tmp_path.glob('.*tmp*')) and not os.listdir(target)


# ----------------------------------------------------------------------------- the HF engine, any scale

@pytest.fixture(scope='module')
def hf_model(tmp_path_factory):
    pytest.importorskip('transformers')
    from _tokenizers import tokenizer_path

    from agentrl.engines import hf
    return hf.make_test_model(tmp_path_factory.mktemp('tiny-qwen3'), tokenizer_path('qwen3'))


HF_PLAN = dict(engine='hf', split='heldout', repeats=1, seed=2, chunk_size=3, max_turns=2, max_new_tokens=12)


@pytest.fixture(scope='module')
def hf_ref(hf_model, tmp_path_factory):
    out = tmp_path_factory.mktemp('hf') / 'w0'
    jr.rollout_job(RolloutOptions(**HF_PLAN, model=str(hf_model), out=str(out)), progress=False)
    return out


def test_hf_kill_9_halfway_then_resume(hf_model, hf_ref, tmp_path):
    _kill_then_resume(dict(HF_PLAN, model=str(hf_model), out=str(tmp_path / 'cut')), 3, hf_ref / 'trajectories',
                      resume=dict(model=str(hf_model)))


def test_hf_run_json_names_the_model_not_its_path(hf_model, hf_ref, tmp_path):
    text = (hf_ref / 'run.json').read_text()
    fp = jr.model_fingerprint(hf_model)
    manifest = json.loads(text)
    assert manifest['plan']['model'] == f'{hf_model.name}@{fp}' and str(hf_model) not in text
    assert manifest['model'] == {'name': hf_model.name, 'fingerprint': fp}
    with pytest.raises(ValueError, match=rf"^--resume {re.escape(repr(str(hf_ref)))}: run.json names the model "
                                         rf"{re.escape(hf_model.name)}@{fp}, not its path; pass --model DIR \(that "
                                         r"model\) again$"):
        jr.rollout_job(RolloutOptions(resume=str(hf_ref)), progress=False)
    with pytest.raises(jr.RunComplete):                   # --model given again (no --engine needed): nothing to run
        jr.rollout_job(RolloutOptions(resume=str(hf_ref), model=str(hf_model)), progress=False)


_HF_ON_RAY = textwrap.dedent('''
    import json, sys
    import ray
    from agentrl.jobs.plan import RolloutOptions
    from agentrl.jobs.rollout import rollout_job
    ray.init(address='local', num_cpus=2, include_dashboard=False, log_to_driver=False, _node_ip_address='127.0.0.1')
    try:
        for workers in (1, 2):
            opts = dict(json.loads(sys.argv[1]), workers=workers, out=sys.argv[2] + f'/w{workers}')
            s = rollout_job(RolloutOptions(**opts), progress=False)
            print(json.dumps([workers, s['engine']['workers_started'], s['engine']['written']]))
    finally:
        ray.shutdown()
''')


@pytest.mark.skipif(not HAS_RAY, reason="Ray is not installed (pip install 'agentrl[ray]')")
def test_hf_records_are_the_same_on_0_1_and_2_ray_workers(hf_model, hf_ref, tmp_path):
    """HF episodes on Ray actors (each loads the model once): the records of --workers 0, bit for bit.

    Ray runs in a child process with a token of its own (a Ray started in the test process would keep
    its auth state and break the cluster tests of test_ray.py).
    """
    import uuid
    env = dict(os.environ, RAY_USAGE_STATS_ENABLED='0', RAY_AUTH_MODE='token', RAY_AUTH_TOKEN=uuid.uuid4().hex,
               RAY_memory_monitor_refresh_ms='0')   # other jobs' memory must not kill the test's actors
    p = subprocess.run([sys.executable, '-c', _HF_ON_RAY, json.dumps(dict(HF_PLAN, model=str(hf_model))),
                        str(tmp_path)], capture_output=True, text=True, timeout=1800, env=env)   # a hang guard only
    assert p.returncode == 0, p.stderr[-2000:]
    assert [json.loads(line) for line in p.stdout.strip().splitlines()[-2:]] == [[1, 1, 6], [2, 2, 6]]
    ref = by_id(hf_ref / 'trajectories')
    assert len(ref) == 6 and all(t.provenance.policy == 'hf' for t in ref.values())
    for workers in (1, 2):
        got = by_id(tmp_path / f'w{workers}' / 'trajectories')
        assert got.keys() == ref.keys()
        for k in ref:
            assert_same(ref[k], got[k])
            assert ref[k].provenance.seed == episode_seed(2, *k)


_KILL_TRAIN = textwrap.dedent('''
    import os, signal, sys
    from agentrl.train import TrainConfig, train

    def die(row):
        if row['phase'] == 'sft' and row['step'] == 2:
            os.kill(os.getpid(), signal.SIGKILL)

    train(TrainConfig(sft_steps=4, grpo_steps=0, eval_repeats=1, out=sys.argv[1]), on_event=die)
''')


def test_train_killed_mid_run_leaves_no_run_and_the_next_run_cleans_up(tmp_path):
    out = tmp_path / 't'
    p = subprocess.run([sys.executable, '-c', _KILL_TRAIN, str(out)], capture_output=True, text=True, timeout=300)
    assert p.returncode == -signal.SIGKILL, p.stderr
    visible = [n for n in os.listdir(out) if not n.startswith('.')]
    assert visible == [] and len(list(out.glob('.train-tmp-*'))) == 1      # only the dead run's staging folder
    from agentrl.train import TrainConfig, train
    s = train(TrainConfig(sft_steps=2, grpo_steps=0, eval_repeats=1, out=str(out)))
    assert sorted(n for n in os.listdir(out) if not n.startswith('.')) == \
        ['metrics.jsonl', 'model.pt', 'reward.svg', 'sft.pt', 'summary.json']
    assert not list(out.glob('.train-tmp-*')) and s['files']['checkpoint'] == 'model.pt'
    assert not (out / '.lock').exists()                      # the killed run's lock is taken over, then removed
    assert json.loads((out / 'summary.json').read_text())['sft']['steps'] == 2


#: ``agentrl train`` (its own SIGTERM handler) held at SFT step 2 until the signal ends it
_HELD_TRAIN = textwrap.dedent('''
    import sys, time
    from pathlib import Path
    import agentrl.train.loop as loop
    from agentrl.cli.main import main
    train, marker = loop.train, Path(sys.argv[1])

    def held(cfg, on_event=None):
        def hook(row):
            on_event(row)
            if row['phase'] == 'sft' and row['step'] == 2:
                marker.write_text('at sft step 2')
                while True:                  # the SIGTERM handler of `agentrl train` raises SystemExit here
                    time.sleep(0.01)
        return train(cfg, hook)
    loop.train = held
    sys.exit(main(['train', '--sft-steps', '4', '--grpo-steps', '0', '--out', sys.argv[2]]))
''')


def test_sigterm_during_train_leaves_no_run(tmp_path):
    out, marker = tmp_path / 'tc', tmp_path / 'at-step-2'
    env = dict(os.environ, PYTHONPATH=str(Path(arl.__file__).parents[1]))
    p = subprocess.Popen([sys.executable, '-c', _HELD_TRAIN, str(marker), str(out)], env=env, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    try:
        # the child writes the marker at SFT step 2 (after `agentrl train` installed its SIGTERM handler)
        # and then waits there: train cannot finish before the signal lands, however loaded the machine is
        _wait_until_ready(p, lambda: marker.exists() and _catches(p.pid, signal.SIGTERM), 'SFT step 2')
        assert list(out.glob('.train-tmp-*/metrics.jsonl'))
        p.send_signal(signal.SIGTERM)
        _, err = p.communicate(timeout=300)
    finally:
        if p.poll() is None:
            p.kill()
    assert p.returncode == 143, err
    assert not out.exists() or not list(out.glob('.train-tmp-*')) and not (out / 'summary.json').exists()


# ----------------------------------------------------------------------------- the pieces the job is built of

def test_deduper_tells_new_resend_and_conflict_apart():
    from agentrl.record import Provenance, Trajectory

    def rec(reward, group='g'):
        return Trajectory.from_tokens([1, 2, 3], ['template', 'prompt', 'policy'], [-1, -1, 0], [0.0, 0.0, -0.5],
                                      reward, {}, provenance=Provenance(group_id=group, rollout_id='r'))
    for compact in (False, True):
        d = checks.Deduper(compact=compact)
        assert d.see(rec(1.0), where=('a.parquet', 0)) == ('new', ('a.parquet', 0))
        assert d.see(rec(1.0), where=('a.parquet', 1)) == ('resend', ('a.parquet', 0))
        assert d.see(rec(0.0), where=('b.parquet', 4)) == ('conflict', ('a.parquet', 0))
        assert d.see(rec(1.0, group='h'))[0] == 'new' and d.repeats == 2
    d = checks.Deduper()
    assert len(d.unique([rec(1.0), rec(1.0), rec(0.0), rec(1.0, 'h')])) == 2 and d.repeats == 2


def test_the_rollout_job_is_its_three_phases(tmp_path):
    from agentrl.jobs import resume
    opts = RolloutOptions(policy=['oracle'], split='heldout', repeats=1, out=str(tmp_path / 'run'))
    p = jr.prepare(opts)
    assert not (tmp_path / 'run').exists() and len(p.jobs) == 6 and p.spec.options is p.opts
    assert p.spec.sampling == opts.sampling_spec() and p.model is None
    summary = jr.rollout_summary(opts, progress=False)
    on_disk = json.loads((tmp_path / 'run' / 'summary.json').read_text())
    assert summary.to_dict() == on_disk and list(on_disk) == ['options', 'tasks', 'episodes', 'seconds',
                                                              'trajectories', 'tokenizer', 'vocab_size', 'policies',
                                                              'model', 'engine']
    assert summary.policies['oracle'].episodes == 6 and summary.engine.planned == 6
    assert callable(resume.manifest_of) and not hasattr(jp, 'manifest_of')   # one home: jobs.resume (no circle)
    with pytest.raises(jr.RunComplete):
        jr.prepare(RolloutOptions(resume=str(tmp_path / 'run')))
