"""Findings of a fresh-clone new-user test: each mistake gets one line naming the file or flag and a safe fix."""
import importlib.util
import shutil

import pytest
import torch

from agentrl.cli.main import main


def _cli(capsys, *argv) -> tuple[int, str, str]:
    """``(exit code, stdout, stderr)`` of ``agentrl ARGV``."""
    capsys.readouterr()
    code = main([str(a) for a in argv])
    got = capsys.readouterr()
    return code, got.out, got.err


def _error(capsys, *argv) -> tuple[int, str]:
    """``(exit code, the one stderr line)``: exactly one line, no blank line before it."""
    code, _, err = _cli(capsys, *argv)
    assert 'internal error' not in err and len(err.splitlines()) == 1 and err.endswith('\n'), repr(err)
    return code, err[:-1]


@pytest.fixture(scope='module')
def scripted(tmp_path_factory):
    """A complete run of two scripted policies on the heldout tasks: 12 episodes in 4 shards."""
    run = tmp_path_factory.mktemp('scripted') / 'run'
    assert main(['rollout', '--policy', 'oracle,blind', '--split', 'heldout', '--repeats', '1', '--chunk-size', '4',
                 '--out', str(run)]) == 0
    return run


def _copy(run, tmp_path):
    dst = tmp_path / 'run'
    shutil.copytree(run, dst)
    return dst


# 1, 7: rollout flags that do not apply, named before anything is written

@pytest.mark.parametrize('engine', ['hf', 'vllm'])
def test_rollout_engine_with_only_scripted_policies_is_refused(tmp_path, capsys, engine):
    out = tmp_path / 'x'
    code, line = _error(capsys, 'rollout', '--engine', engine, '--model', tmp_path, '--policy', 'oracle', '--out', out)
    assert code == 2 and line == (f'agentrl: error: --engine {engine} samples only --policy model (got oracle); drop '
                                  '--engine/--model for scripted policies, or add model to --policy')
    assert not out.exists()


def test_rollout_checkpoint_with_only_scripted_policies_is_refused(tmp_path, capsys):
    out = tmp_path / 'x'
    code, line = _error(capsys, 'rollout', '--checkpoint', tmp_path / 'model.pt', '--policy', 'oracle,blind',
                        '--out', out)
    assert code == 2 and line == ('agentrl: error: --checkpoint is the TinyAgent of --policy model (got oracle,blind); '
                                  'drop --checkpoint for scripted policies, or add model to --policy')
    assert not out.exists()


def test_rollout_engine_hf_without_model(tmp_path, capsys):
    code, line = _error(capsys, 'rollout', '--engine', 'hf', '--out', tmp_path / 'x')
    assert code == 2 and line == ('agentrl: error: --engine hf needs --model DIR with config.json (a save_pretrained '
                                  'folder); `agentrl make-test-model OUT` builds a small one')


@pytest.mark.parametrize('flag,value,message', [
    ('--top-p', '2', '--top-p must be in (0, 1] (got 2); 1 turns it off'),
    ('--top-p', '0', '--top-p must be in (0, 1] (got 0); 1 turns it off'),
    ('--min-p', '1', '--min-p must be in [0, 1) (got 1); 0 turns it off'),
    ('--min-p', '-0.5', '--min-p must be in [0, 1) (got -0.5); 0 turns it off')])
def test_rollout_sampling_flags_are_named(tmp_path, capsys, flag, value, message):
    out = tmp_path / 'x'
    code, line = _error(capsys, 'rollout', flag, value, '--out', out)
    assert code == 2 and line == f'agentrl: error: {message}'
    assert not out.exists()


# 2: a truncated .pt is damaged, never "load it with weights_only=False"

@pytest.mark.parametrize('framework,name', [('slime', '0.pt'), ('trl', 'trl_batch.pt')])
def test_import_of_a_truncated_pt_file(tmp_path, capsys, framework, name):
    whole = tmp_path / 'whole.pt'
    torch.save({'samples': [{'tokens': list(range(500))}]}, whole)
    data = whole.read_bytes()
    cut = tmp_path / name
    cut.write_bytes(data[:len(data) // 2])
    code, line = _error(capsys, 'import', cut, '--from', framework, '--out', tmp_path / 'imp')
    assert code == 2 and line == (f'agentrl: error: {str(cut)!r} is truncated or damaged, not a readable torch .pt '
                                  'file (RuntimeError: PytorchStreamReader failed reading zip archive: failed finding '
                                  'central directory); write it again or pass an intact copy')
    assert 'weights_only' not in line and not (tmp_path / 'imp').exists()


def test_import_of_an_empty_pt_file(tmp_path, capsys):
    empty = tmp_path / '0.pt'
    empty.write_bytes(b'')
    code, line = _error(capsys, 'import', empty, '--from', 'slime', '--out', tmp_path / 'imp')
    assert code == 2 and line == (f'agentrl: error: {str(empty)!r} is truncated or damaged, not a readable torch .pt '
                                  'file (EOFError); write it again or pass an intact copy')


# 3: a shard cut in half

def test_a_cut_shard_is_named_once_with_the_resume_fix(scripted, tmp_path, capsys):
    run = _copy(scripted, tmp_path)
    shard = run / 'trajectories' / 'part-000000.parquet'
    data = shard.read_bytes()
    shard.write_bytes(data[:len(data) // 2])
    line = (f"agentrl: error: {str(shard)!r} is truncated or damaged: a Parquet file whose footer cannot be read "
            f"(Parquet magic bytes not found in footer); move it aside and run `agentrl rollout --resume {run}` to "
            'rerun its episodes')
    for argv in (['check', run], ['show', run], ['show', shard], ['report', run], ['drift', '--records', run],
                 ['rollout', '--resume', run]):
        code, got = _error(capsys, *argv)
        assert code == 2 and got == line, argv
    loose = tmp_path / 'x.parquet'
    shutil.copy(shard, loose)
    code, got = _error(capsys, 'show', loose)
    assert code == 2 and got == (f"agentrl: error: {str(loose)!r} is truncated or damaged: a Parquet file whose "
                                 'footer cannot be read (Parquet magic bytes not found in footer); write it again '
                                 '(rerun the command that wrote it) or remove it')
    shard.rename(shard.with_suffix('.parquet.bad'))          # the fix: aside, then resume reruns its episodes
    code, out, _ = _cli(capsys, 'rollout', '--resume', run)
    assert code == 0 and main(['check', str(run)]) == 0


def test_a_text_file_is_still_not_a_parquet_file(tmp_path, capsys):
    notes = tmp_path / 'notes.parquet'
    notes.write_text('not parquet at all, just some words\n' * 4)
    code, got = _error(capsys, 'show', notes)
    assert code == 2 and got.startswith(f"agentrl: error: {str(notes)!r} is not a Parquet file (")


# 4: a folder that is not a run

def test_report_of_a_folder_that_is_not_a_run(tmp_path, capsys):
    docs = tmp_path / 'docs'
    docs.mkdir()
    (docs / 'design.md').write_text('# design\n')
    code, line = _error(capsys, 'report', docs)
    assert code == 2 and line == (f'agentrl: error: {str(docs)!r} is not a run folder (no run.json, trajectories/ or '
                                  'trajectories.parquet in it); pass a run folder written by `agentrl rollout`, '
                                  '`agentrl serve` or `agentrl import`')
    assert sorted(p.name for p in docs.iterdir()) == ['design.md']


# 5: make-test-model without a Qwen3 tokenizer, before torch builds anything

def test_make_test_model_without_a_tokenizer_names_every_way_to_give_one(tmp_path, capsys, monkeypatch):
    from agentrl.templates import loading
    monkeypatch.setattr(loading, 'tokenizer_roots', lambda: [tmp_path / 'none'])
    monkeypatch.setattr(loading, '_from_hub', lambda repo_id: None)       # offline, nothing in the hub cache
    hub = 'or go online so agentrl fetches Qwen/Qwen3-0.6B from the Hugging Face hub'
    if importlib.util.find_spec('huggingface_hub') is None:
        hub += ' (pip install huggingface_hub)'
    code, line = _error(capsys, 'make-test-model', tmp_path / 'm')
    assert code == 2 and line == (
        f"agentrl: error: make-test-model needs a Qwen3 tokenizer and found none (tried {tmp_path / 'none' / 'qwen3'});"
        ' pass --tokenizer DIR (a folder with tokenizer.json and tokenizer_config.json), set AGENTRL_TOKENIZERS to a '
        f'folder holding qwen3/, or AGENTRL_SHARED to one holding tokenizers/qwen3, {hub}')
    assert not (tmp_path / 'm').exists()


# 6: check of an interrupted run says it is incomplete

def test_check_of_an_incomplete_run_says_so(scripted, tmp_path, capsys):
    run = _copy(scripted, tmp_path)
    (run / 'summary.json').unlink()
    (run / 'trajectories' / 'part-000003.parquet').unlink()
    code, out, err = _cli(capsys, 'check', run)
    assert code == 0 and 'result: OK' in out
    assert err == (f"agentrl: warning: {str(run)!r} is incomplete: 10 of 12 episodes stored, no summary.json; resume "
                   f'with `agentrl rollout --resume {run}`; the check covers only the stored records\n')
    code, out, err = _cli(capsys, 'check', scripted)
    assert code == 0 and 'result: OK' in out and err == ''


# 8: export of scripted records for an RL trainer

def test_export_of_scripted_records_names_file_row_and_the_sft_flag(scripted, tmp_path, capsys):
    code, line = _error(capsys, 'export', scripted, '--to', 'trl', '--out', tmp_path / 'ex')
    shard = scripted / 'trajectories' / 'part-000000.parquet'
    assert code == 1 and line == (f"agentrl: error: {str(shard)!r} row 0: sample_logp: the record carries placeholder "
                                  'log-probs (scripted policy); --to trl would hand them to the trainer as the '
                                  'behaviour policy. Fix: export scripted records with `--to sft`, or pass a run '
                                  'sampled by a model (agentrl rollout --policy model)')
    assert not (tmp_path / 'ex').exists()
    assert main(['export', str(scripted), '--to', 'sft', '--out', str(tmp_path / 'sft')]) == 0
