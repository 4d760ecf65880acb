"""At library level: ``interop.load_export`` / ``import_records`` never unpickle a verl ``.dp``
file unless ``trust_pickle=True``; the refusal comes before anything is unpickled (a hostile pickle that would
create a marker file leaves none)."""
import importlib.util
import pathlib
import pickle
import re

import pytest
import torch

from agentrl import interop


class _Touch:
    """Unpickling this runs ``Path(marker).touch()``: the code a hostile pickle would run."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return pathlib.Path.touch, (pathlib.Path(self.marker),)


def _hostile(tmp_path, name: str) -> tuple[pathlib.Path, pathlib.Path]:
    marker = tmp_path / 'unpickled.marker'
    path = tmp_path / name
    path.write_bytes(pickle.dumps({'batch': _Touch(marker)}))
    return path, marker


REFUSED = ("{path} is a pickle (verl's DataProto.save_to_disk): unpickling runs any code the file holds, so it is "
           'not read; pass trust_pickle=True (CLI: --trust-pickle) if you trust the file, or import the '
           'verl_batch.pt `agentrl export --to verl` writes (tensors only)')


@pytest.mark.parametrize('call', ['load_export', 'import_records'])
def test_a_dp_file_is_refused_before_anything_is_unpickled(tmp_path, call):
    dp, marker = _hostile(tmp_path, 'gen_batch.dp')
    fn = getattr(interop, call)
    with pytest.raises(ValueError, match=f'^{re.escape(REFUSED.format(path=repr(str(dp))))}$'):
        fn(dp, 'verl')
    with pytest.raises(ValueError, match=re.escape('pass trust_pickle=True')):
        fn(str(dp), 'verl', trust_pickle=False)
    assert not marker.exists()
    pickle.loads(dp.read_bytes())                   # the file is hostile indeed: loading it runs its code
    assert marker.exists()


@pytest.mark.skipif(importlib.util.find_spec('verl') is not None, reason='verl is installed (tests/interop reads .dp)')
def test_a_trusted_dp_file_without_verl_names_the_fix_and_unpickles_nothing(tmp_path):
    dp, marker = _hostile(tmp_path, 'gen_batch.dp')
    with pytest.raises(ValueError, match=f"^{re.escape(repr(str(dp)))} is a verl DataProto pickle, read only by "
                                         r"verl's DataProto\.load_from_disk, and verl is not installed; pip install "
                                         r'verl, or import the verl_batch\.pt `agentrl export --to verl` writes '
                                         r'\(no verl needed\)$'):
        interop.import_records(dp, 'verl', trust_pickle=True)
    assert not marker.exists()


@pytest.mark.parametrize('framework,name', [('verl', 'verl_batch.pt'), ('trl', 'trl_batch.pt'),
                                            ('openrlhf', 'experience.pt'), ('slime', '0.pt')])
def test_pt_files_are_read_as_data_only_whatever_trust_pickle_says(tmp_path, framework, name):
    """A torch .pt file is read with weights_only=True: its pickled code never runs, trusted or not."""
    marker = tmp_path / 'unpickled.marker'
    torch.save({'batch': _Touch(marker)}, tmp_path / name)
    for trust in (False, True):
        with pytest.raises(ValueError, match=re.escape(f"{str(tmp_path / name)!r} holds objects beyond tensors, "
                                                       'lists and dicts (UnpicklingError); agentrl loads .pt files '
                                                       'with weights_only=True')):
            interop.import_records(tmp_path / name, framework, trust_pickle=trust)
    assert not marker.exists()
