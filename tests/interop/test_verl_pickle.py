"""With verl installed: a .dp file is read through verl's DataProto loader only with --trust-pickle."""
import pytest
import torch

pytest.importorskip('verl.protocol', reason='verl is not in this venv; `make test-interop` runs these tests in .venv-interop')

from agentrl import interop, store  # noqa: E402
from agentrl.cli.main import main  # noqa: E402


def test_import_of_a_dp_file_needs_trust_pickle_then_reads_it_with_verls_loader(records, lm, tmp_path, capsys):
    interop.export(records, 'verl', tmp_path / 'exp', pad_id=lm[2].pad_token_id, trim=False)
    dp = tmp_path / 'exp' / 'gen_batch.dp'
    assert main(['import', str(dp), '--from', 'verl', '--out', str(tmp_path / 'no')]) == 2
    assert 'is a pickle (verl\'s DataProto.save_to_disk): unpickling runs any code' in capsys.readouterr().err
    assert not (tmp_path / 'no').exists()
    assert main(['import', str(dp), '--from', 'verl', '--out', str(tmp_path / 'yes'), '--trust-pickle']) == 0
    back = store.read_trajectories(tmp_path / 'yes' / 'trajectories.parquet')
    assert len(back) == len(records)
    for a, b in zip(records, back):
        assert torch.equal(a.ids, b.ids) and torch.equal(a.action_mask, b.action_mask)
