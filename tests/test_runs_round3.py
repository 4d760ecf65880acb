"""Run folders say what they hold, words that fit, pickle stays out (exact cases)."""
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


# ----------------------------------------------------------------------------- 6. words that fit

def _server_episode(logprobs: bool) -> dict:
    """Two completions exchanges of a vLLM server: the first cut at max_tokens, the second stopped."""
    def choice(ids, prompt, finish, lps):
        c = {'text': 'x', 'token_ids': ids, 'prompt_token_ids': prompt, 'finish_reason': finish}
        if logprobs:
            c['logprobs'] = {'token_logprobs': lps}
        return c
    req = {'temperature': 0.8, 'top_p': 1.0, 'top_k': 0, 'min_p': 0.0, 'repetition_penalty': 1.0,
           'presence_penalty': 0.0, 'frequency_penalty': 0.0, 'model': 'm'}
    return {'exchanges': [
        {'request': dict(req, prompt=[1, 2, 3], max_tokens=2),
         'response': {'choices': [choice([10, 11], [1, 2, 3], 'length', [-0.5, -0.25])]}},
        {'request': dict(req, prompt=[1, 2, 3, 10, 11, 60, 61]),
         'response': {'choices': [choice([12, 7], [1, 2, 3, 10, 11, 60, 61], 'stop', [-1.0, -2.0])]}}],
        'reward': 1.0, 'group_id': 'q1'}


def test_check_of_records_without_log_probs_says_so_and_speaks_of_finish_reasons(tmp_path, capsys):
    import torch

    from agentrl.checkpoint import save_checkpoint
    from agentrl.model import TinyAgent
    (tmp_path / 'ep.jsonl').write_text(json.dumps(_server_episode(logprobs=False)) + '\n')
    code, _, err = _cli(capsys, 'import', tmp_path / 'ep.jsonl', '--from', 'vllm', '--out', tmp_path / 'imp')
    assert code == 0, err
    code, out, _ = _cli(capsys, 'check', tmp_path / 'imp')
    lines = out.splitlines()
    assert code == 0 and lines[0] == 'records          1  (refused 0, scripted 0, no sampling log-probs 1)'
    assert lines[4] == 'stops            finish_reason stop 1'        # the server's words, not the gym's 'submitted'
    assert lines[5].startswith('truncation rate  1.000  ')                 # turn 0 was cut at max_tokens
    assert lines[6] == ('sampling logps   none in 1 records: their source stored none (a server called without '
                        'logprobs); fine for SFT, but RL trainers and the replay need them: sample again with '
                        'log-probs (vLLM chat: "logprobs": true; SGLang: "return_logprob": true)')
    torch.manual_seed(0)
    save_checkpoint(TinyAgent(64).eval(), str(tmp_path / 'model.pt'))
    code, out, _ = _cli(capsys, 'check', tmp_path / 'imp', '--model', tmp_path / 'model.pt')
    assert code == 1                                       # the RL-readiness check fails on them
    assert '  not replayed: 1 no sampling log-probs (their source stored none)' in out
    assert out.rstrip().endswith('result: FAILED (1 records have no sampling log-probs (the replay and RL trainers '
                                 'need them))')
    (tmp_path / 'ep2.jsonl').write_text(json.dumps(_server_episode(logprobs=True)) + '\n')
    _cli(capsys, 'import', tmp_path / 'ep2.jsonl', '--from', 'vllm', '--out', tmp_path / 'imp2')
    code, out, _ = _cli(capsys, 'check', tmp_path / 'imp2')
    assert code == 0 and out.splitlines()[0] == 'records          1  (refused 0, scripted 0)'


def test_replay_with_a_model_of_another_tokenizer_says_so_before_any_ratio(tmp_path, capsys):
    pytest.importorskip('transformers')
    import sys
    sys.path.insert(0, str(Path(__file__).parent))
    from _tokenizers import TINY

    from agentrl.engines import hf
    from agentrl.record import Provenance, SamplingSpec, Trajectory
    model = hf.make_test_model(tmp_path / 'm', TINY)
    rec = Trajectory.from_tokens([5, 6, 7, 8], ['prompt', 'prompt', 'policy', 'policy'], [-1, -1, 0, 0],
                                 [0.0, 0.0, -0.5, -0.25], 1.0, {'stop': 'stop'},
                                 provenance=Provenance(policy='vllm', tokenizer='0123456789abcdef',
                                                       sampling=SamplingSpec(1.0), group_id='g', rollout_id='r'))
    store.write_trajectories(tmp_path / 'r.parquet', [rec])
    code, out, _ = _cli(capsys, 'check', tmp_path / 'r.parquet', '--model', model)
    assert code == 1
    assert (f"  e.g. g/r#1: TokenizerMismatchError: provenance.tokenizer: is '0123456789abcdef' but the tokenizer of "
            f"--model m is ") in out
    assert "the model reads these ids as other words, so no replay ratio is computed" in out
    assert 'replay under the declared sampler (model ' in out and ', 0 records):' in out


def test_a_mistyped_local_tokenizer_path_is_not_sent_to_the_hub(tmp_path, monkeypatch):
    import socket

    from agentrl.templates import load_tokenizer
    (tmp_path / 'runs').mkdir()
    monkeypatch.chdir(tmp_path)
    dialled = []
    monkeypatch.setattr(socket.socket, 'connect', lambda self, addr: dialled.append(addr) or (_ for _ in ()).throw(
        OSError('no network in this test')))
    for name in ('./qwen3-tok', '~/no-such-tokenizer', str(tmp_path / 'tok'), 'runs/tok', 'a/b/c'):
        with pytest.raises(ValueError) as e:
            load_tokenizer(name)
        assert dialled == []                     # the hub was not asked
        assert str(e.value) == (f'TOKENIZER {name!r} is not a folder (no such folder); it looks like a local path, so '
                                'the Hugging Face hub is not asked: check the path, or pass a hub id such as '
                                'Qwen/Qwen3-0.6B')


def test_report_on_a_shard_folder_names_the_run_folder(tmp_path, capsys, monkeypatch):
    _run(tmp_path / 'run')
    monkeypatch.chdir(tmp_path)
    for arg in ('run/trajectories', 'run/trajectories/'):
        code, _, err = _cli(capsys, 'report', arg)
        assert code == 2 and err == (f"agentrl: error: {arg!r} is the shard folder of the run 'run'; pass the run "
                                     'folder: `agentrl report run`\n')
    code, _, err = _cli(capsys, 'report', 'run/trajectories/part-000000.parquet')
    assert code == 2 and err == ("agentrl: error: 'run/trajectories/part-000000.parquet' is a file; pass the run "
                                 'folder that holds it (`agentrl report run`)\n')
    Path('loose').mkdir()
    shutil.copy('run/trajectories/part-000000.parquet', 'loose/')
    code, _, err = _cli(capsys, 'report', 'loose')
    assert code == 2 and err == ("agentrl: error: 'loose' holds trajectory files but is not a run folder (no "
                                 'trajectories/ or trajectories.parquet in it); `agentrl check` and `agentrl show` '
                                 'read such a folder, `agentrl report` reads the run folder that holds trajectories/\n')
    Path('run/summary.json').write_text('{"policies": 5}')
    code, _, err = _cli(capsys, 'report', 'run')
    assert code == 2 and err == ("agentrl: error: 'run/summary.json': policies is a number, not a JSON object, so "
                                 'this is not a run summary; delete it or rerun `agentrl rollout`\n')


def test_no_internal_error_lines_for_a_device_or_a_malformed_server_log(tmp_path, capsys):
    import torch

    from agentrl.checkpoint import save_checkpoint
    from agentrl.model import TinyAgent
    out = _run(tmp_path / 'run')
    save_checkpoint(TinyAgent(316).eval(), str(tmp_path / 'm.pt'))
    code, _, err = _cli(capsys, 'check', out / 'trajectories', '--model', tmp_path / 'm.pt', '--device', 'bogus')
    assert code == 2 and err.startswith("agentrl: error: --device 'bogus' cannot be used here (Expected one of ")
    assert err.endswith('); pass --device cpu, or cuda / cuda:N on a machine with that GPU\n')
    if not torch.cuda.is_available():
        code, _, err = _cli(capsys, 'check', out / 'trajectories', '--model', tmp_path / 'm.pt', '--device', 'cuda')
        assert code == 2 and err == ("agentrl: error: --device 'cuda' cannot be used here (Torch not compiled with "
                                     'CUDA enabled); pass --device cpu, or cuda / cuda:N on a machine with that GPU\n')
    log = tmp_path / 'h.json'
    log.write_text('[{"exchanges": [{"request": {"prompt": [1]}, "response": {"choices": 5}}]}]')
    code, _, err = _cli(capsys, 'import', log, '--from', 'vllm', '--out', tmp_path / 'imp', '--temperature', '1')
    assert code == 2 and not (tmp_path / 'imp').exists()
    assert err == (f"agentrl: error: PATH {str(log)!r} holds a value agentrl cannot read as vllm exchanges "
                   "(TypeError: 'int' object is not subscriptable); log each exchange as the request and response "
                   'bodies the server sent and received\n')
    assert 'internal error' not in err
