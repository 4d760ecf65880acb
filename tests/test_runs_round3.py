"""Issue 25, items 5-7: run folders say what they hold, words that fit, pickle stays out (exact cases)."""
import json
import shutil
from pathlib import Path

import pytest

from agentrl import store
from agentrl.cli.main import main
from agentrl.jobs import rollout as jr
from agentrl.jobs.plan import RolloutOptions


def _run(folder: Path, **kw) -> Path:
    opts = dict(policy=['oracle'], split='heldout', repeats=1, chunk_size=2, out=str(folder))
    jr.rollout_job(RolloutOptions(**{**opts, **kw}), progress=False)
    return folder


def _cli(capsys, *argv) -> tuple[int, str, str]:
    code = main([str(a) for a in argv])
    got = capsys.readouterr()
    return code, got.out, got.err


# ----------------------------------------------------------------------------- 5. run folders say what they hold

def test_resume_refuses_a_stray_copy_of_a_shard_naming_both_files(tmp_path, capsys):
    out = _run(tmp_path / 'run')
    shards = out / 'trajectories'
    first, *rest = sorted(shards.glob('part-*.parquet'))
    rest[-1].unlink()                                        # an unfinished run: its last shard is missing...
    (out / 'summary.json').unlink()
    shutil.copy(first, shards / 'copy.parquet')              # ...and a stray copy of its first one
    before = sorted(p.name for p in shards.iterdir())
    code, _, err = _cli(capsys, 'rollout', '--resume', out)
    assert code == 2
    assert err == (f"agentrl: error: --resume {str(out)!r}: {str(shards / 'part-000000.parquet')!r} row 0 repeats "
                   f"the same record {str(shards / 'copy.parquet')!r} row 0 (episode 0/oracle/decrement/0 attempt 1 is "
                   f"stored twice: a copy of a shard?); move one of the two files out of {str(shards)!r} (the "
                   'episodes only it held then run again), then resume; nothing was run\n')
    assert sorted(p.name for p in shards.iterdir()) == before and not (out / 'summary.json').exists()
    assert not (out / '.lock').exists()
    (shards / 'copy.parquet').unlink()                       # the fix the line names
    code, _, err = _cli(capsys, 'rollout', '--resume', out)
    assert code == 0, err
    code, _, err = _cli(capsys, 'check', out / 'trajectories')
    assert code == 0, err


def test_export_of_an_unfinished_run_says_incomplete_in_the_manifest_and_on_stderr(tmp_path, capsys):
    out = _run(tmp_path / 'run')
    done = json.loads((out / 'summary.json').read_text())['episodes']
    code, _, err = _cli(capsys, 'export', out, '--to', 'sft', '--out', tmp_path / 'whole')
    assert code == 0 and err == ''
    assert 'incomplete' not in json.loads((tmp_path / 'whole' / 'manifest.json').read_text())
    last = sorted((out / 'trajectories').glob('part-*.parquet'))[-1]
    n_last = len(store.read_trajectories(last))
    last.unlink()
    (out / 'summary.json').unlink()                          # as while the job is still writing
    (out / '.lock').write_text('12345')
    note = (f'incomplete: {done - n_last} of {done} episodes stored, no summary.json, OUT/.lock held (a job may '
            f'still be writing it); resume with `agentrl rollout --resume {out}`')
    for run in (out, out / 'trajectories'):
        dest = tmp_path / f'part-{run.name}'
        code, printed, err = _cli(capsys, 'export', run, '--to', 'sft', '--out', dest)
        assert code == 0
        assert err == f'agentrl: warning: {str(run)!r} is {note}; the export holds only those records ' \
                      '(manifest.json says "incomplete")\n'
        m = json.loads((dest / 'manifest.json').read_text())
        assert m['incomplete'] == note and m['records'] == done - n_last
        assert printed.startswith(f'wrote {done - n_last} records for sft to {dest}')


# ----------------------------------------------------------------------------- 7. pickle stays out

def test_import_refuses_a_pickled_verl_file_without_trust_pickle(tmp_path, capsys):
    import importlib.util
    import pickle
    dp = tmp_path / 'gen_batch.dp'
    dp.write_bytes(pickle.dumps({'never': 'read'}))
    code, _, err = _cli(capsys, 'import', dp, '--from', 'verl', '--out', tmp_path / 'imp')
    assert code == 2 and not (tmp_path / 'imp').exists()
    assert err == (f"agentrl: error: PATH {str(dp)!r} is a pickle (verl's DataProto.save_to_disk): unpickling runs "
                   'any code the file holds, so it is not read; pass --trust-pickle if you trust the file, or import '
                   'the verl_batch.pt `agentrl export --to verl` writes (tensors only)\n')
    js = tmp_path / 'x.jsonl'
    js.write_text('{}\n')
    code, _, err = _cli(capsys, 'import', js, '--from', 'prime-rl', '--out', tmp_path / 'imp', '--trust-pickle')
    assert code == 2 and err == (f'agentrl: error: --trust-pickle applies to a verl .dp file (--from verl); '
                                 f'{str(js)!r} is read without unpickling code; drop --trust-pickle\n')
    if importlib.util.find_spec('verl') is None:            # the main venv: the fix is named (tests/interop reads one)
        code, _, err = _cli(capsys, 'import', dp, '--from', 'verl', '--out', tmp_path / 'imp', '--trust-pickle')
        assert code == 2 and err == (f"agentrl: error: PATH {str(dp)!r} is a verl DataProto pickle, read only by "
                                     "verl's DataProto.load_from_disk, and verl is not installed; pip install verl, "
                                     'or import the verl_batch.pt `agentrl export --to verl` writes (no verl needed)\n')
