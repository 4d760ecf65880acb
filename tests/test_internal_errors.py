"""Inputs that reached the CLI's "internal error; rerun with --debug" line now get a
one-line message naming what is wrong (found by feeding every command hostile files and flag values)."""
import json
import shutil
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import torch

from agentrl import interop, store
from agentrl.cli.main import main

ROOT = Path(__file__).resolve().parents[1]


def _cli(capsys, *argv) -> tuple[int, str]:
    capsys.readouterr()
    code = main([str(a) for a in argv])
    err = capsys.readouterr().err
    assert 'internal error' not in err and len(err.splitlines()) == 1, err
    return code, err


@pytest.fixture(scope='module')
def sampled(tmp_path_factory):
    """A TinyAgent run's records (sampled log-probs: every trainer export takes them)."""
    out = tmp_path_factory.mktemp('run') / 'run'
    assert main(['rollout', '--policy', 'model', '--split', 'heldout', '--repeats', '1', '--out', str(out)]) == 0
    return out, store.read_trajectories(out / 'trajectories')[:2]


@pytest.mark.parametrize('body,err', [
    ("{% for a in range(200000) %}x{% endfor %}",
     'OverflowError: Range too big. The sandbox blocks ranges larger than MAX_RANGE (100000).'),
    ('{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}',
     'RecursionError: maximum recursion depth exceeded')])
def test_template_audit_of_a_range_bomb_or_endless_recursion(tmp_path, capsys, body, err):
    pytest.importorskip('jinja2')
    pytest.importorskip('transformers')
    tok = tmp_path / 'tok'
    shutil.copytree(ROOT / 'tests' / 'assets' / 'tiny-chat', tok)
    (tok / 'chat_template.jinja').write_text(body)
    cfg = json.loads((tok / 'tokenizer_config.json').read_text())
    if 'chat_template' in cfg:
        cfg['chat_template'] = body
        (tok / 'tokenizer_config.json').write_text(json.dumps(cfg))
    code, line = _cli(capsys, 'template', 'audit', tok)
    assert code == 2 and line.startswith(f'agentrl: error: the chat template could not render these messages ({err}')


def test_an_integer_flag_no_c_long_holds_is_refused_by_name(sampled, capsys):
    run, _ = sampled
    code, line = _cli(capsys, 'check', run, '--batch-size', '99999999999999999999')
    assert code == 2 and line == ('agentrl: error: --batch-size must be a 64-bit integer (below 2**63 in size), got '
                                  '99999999999999999999\n')


@pytest.mark.parametrize('framework,key', [('trl', 'agentrl_provenance'), ('openrlhf', 'agentrl_info')])
def test_import_of_a_tensor_where_a_list_belongs(sampled, tmp_path, capsys, framework, key):
    _, recs = sampled
    interop.export(recs, framework, tmp_path / 'ex', pad_id=0)
    name = {'trl': 'trl_batch.pt', 'openrlhf': 'experience.pt'}[framework]
    d = torch.load(tmp_path / 'ex' / name, weights_only=True)
    d[key] = torch.zeros(2, 2, dtype=torch.long)
    torch.save(d, tmp_path / name)
    code, line = _cli(capsys, 'import', tmp_path / name, '--from', framework, '--out', tmp_path / 'imp')
    assert code == 2 and line == (f"agentrl: error: PATH {str(tmp_path / name)!r} holds a value agentrl cannot read as "
                                  f'{framework} data (RuntimeError: Boolean value of Tensor with more than one value is '
                                  f'ambiguous); pass a file `agentrl export --to {framework}` or {framework} wrote\n')
    assert not (tmp_path / 'imp').exists()


def test_turn_policy_versions_that_is_not_a_list_is_a_malformed_row(sampled, tmp_path, capsys):
    run, _ = sampled
    shard = sorted((run / 'trajectories').glob('part-*.parquet'))[0]
    t = pq.read_table(shard)
    rows = t.to_pylist()
    rows[0]['turn_policy_versions'] = '5'
    import pyarrow as pa
    pq.write_table(pa.Table.from_pylist(rows, schema=t.schema), tmp_path / 'x.parquet')
    capsys.readouterr()
    assert main(['check', str(tmp_path / 'x.parquet')]) == 1
    out = capsys.readouterr().out
    assert (f"  e.g. {str(tmp_path / 'x.parquet')!r} row 0: MalformedRowError: turn_policy_versions: is a JSON int, not a "
            'list of policy versions (one per turn). Fix: rewrite the file from its records with '
            'agentrl.store.write_trajectories') in out
    assert 'internal error' not in out


def test_import_of_a_skyrl_reward_too_large_for_a_float(tmp_path, capsys):
    data = {'prompt_token_ids': [[1, 2]], 'response_ids': [[3, 4]], 'rewards': [10 ** 400], 'loss_masks': [[1, 1]],
            'stop_reasons': ['stop'], 'rollout_logprobs': [[-0.1, -0.2]],
            'trajectory_ids': [{'instance_id': 'g', 'repetition_id': 0}]}
    f = tmp_path / 'generator_output.json'
    f.write_text(json.dumps(data))
    code, line = _cli(capsys, 'import', f, '--from', 'skyrl', '--out', tmp_path / 'imp')
    assert code == 1 and line == ('agentrl: error: rewards: from_skyrl row 0: is an integer of 401 digits, too large '
                                  'for a float64 reward. Fix: store rewards as numbers within +-1.8e308 (a float64), '
                                  'e.g. rescale them\n')
    assert not (tmp_path / 'imp').exists()


@pytest.mark.parametrize('vocab', [100, 400])
def test_rollout_checkpoint_of_another_vocabulary(tmp_path, capsys, vocab):
    from agentrl.checkpoint import save_checkpoint
    from agentrl.model import TinyAgent
    ckpt = tmp_path / 'other.pt'
    save_checkpoint(TinyAgent(vocab), str(ckpt))
    code, line = _cli(capsys, 'rollout', '--policy', 'model', '--split', 'heldout', '--repeats', '1', '--checkpoint',
                      ckpt, '--out', tmp_path / 'run')
    assert code == 2 and line == (f"agentrl: error: --checkpoint '{ckpt}': the model's vocab_size is {vocab} but the "
                                  'BugFix tokenizer has 316 entries; pass a checkpoint of a TinyAgent built for this '
                                  'tokenizer (the model.pt that `agentrl rollout` or `agentrl train` wrote)\n')
    assert not (tmp_path / 'run').exists()


@pytest.mark.parametrize('sizes,err', [
    (['--hidden', '65536', '--heads', '1024', '--layers', '256'],
     'make_test_model: layers 256 x hidden 65536 with the 151,669-token vocabulary make 8,810,361,421,824 parameters '
     '(32821.2 GiB of float32), over the bound of 1,000,000,000 for a test model; lower hidden (--hidden) or layers '
     '(--layers): hidden 64 and 2 layers make about 9.8M'),
    (['--hidden', '6', '--heads', '2', '--kv-heads', '1'],
     '--hidden 6 / --heads 2 gives head_dim 3, which is odd; rotary position embeddings rotate pairs of channels: '
     'pass --hidden and --heads whose quotient is even (e.g. --hidden 64 --heads 4)')])
def test_make_test_model_of_absurd_sizes(tmp_path, capsys, sizes, err):
    from _tokenizers import tokenizer_path
    tok = tokenizer_path('qwen3')
    code, line = _cli(capsys, 'make-test-model', tmp_path / 'm', '--tokenizer', tok, *sizes)
    assert code == 2 and line == f'agentrl: error: {err}\n'
    assert not (tmp_path / 'm').exists()
