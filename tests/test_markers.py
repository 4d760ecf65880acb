"""The 'slow' list names tests that exist and agrees with the recorded durations (tests/durations.json).

The durations are recorded from a run of the whole suite on the 2-core machine, then the slow list is brought in line
(tests/_durations.py holds the band: listed if over 3 s, unlisted if under 2 s, either in between)::

    python -m pytest -p no:cacheprovider --record-durations tests/durations.json
    python tests/record_durations.py --update-slow-list LOG      # or from `pytest --durations=0 -vv > LOG`

A run of some files (``pytest --record-durations tests/durations.json tests/test_x.py``) replaces the entries of
those files only; record whole files (a run narrowed with ``-k`` charges a shared fixture to the first test it runs).
"""
from pathlib import Path

import pytest

from _durations import (DURATIONS, FAST_S, SLOW_FILES, SLOW_S, by_function, disagreements, exists, function_id,
                        load, merge, parse_durations_output, read_slow_list)

ROOT = Path(__file__).resolve().parents[1]


def test_every_slow_entry_names_a_test_function():
    listed = read_slow_list()
    stale = [entry for entry in listed if not exists(entry)]
    assert len(listed) > 40 and stale == [], f'tests/slow_tests.txt names tests that do not exist: {stale}'


def test_every_recorded_duration_names_a_test_function():
    recorded = load()
    stale = sorted({f for f in map(function_id, recorded) if not exists(f)})
    assert len(recorded) > 100 and stale == [], (f'tests/durations.json names tests that do not exist: {stale}; '
                                               'rerun with --record-durations (it drops them)')


def test_the_slow_list_agrees_with_the_recorded_durations():
    """Every recorded function over 3 s is listed, every listed one under 2 s is not, and a file with any recorded
    test has all its listed tests recorded. Fix: record the durations again and run
    ``python tests/record_durations.py --update-slow-list LOG`` (see the module docstring)."""
    durations, listed = load(), read_slow_list()
    to_list, to_unlist = disagreements(durations, listed)
    assert to_list == [], f'over {SLOW_S} s in {DURATIONS.name} but not in slow_tests.txt: {to_list}'
    assert to_unlist == [], f'in slow_tests.txt but under {FAST_S} s in {DURATIONS.name}: {to_unlist}'
    recorded = set(by_function(durations))
    files = {f.split('::')[0] for f in recorded}
    missing = [f for f in listed if f.split('::')[0] in files and f not in recorded]
    assert missing == [], f'listed in slow_tests.txt, their file recorded, but they were not: {missing}'
    assert not any(f.startswith(SLOW_FILES) for f in listed), 'a test of SLOW_FILES is slow by its file; unlist it'


def test_the_band_and_the_readers_on_literal_input(tmp_path):
    text = ('0.50s setup    tests/test_a.py::test_f[x]\n4.00s call     tests/test_a.py::test_f[x]\n'
            '1.00s call     tests/test_a.py::test_f[y]\n2.50s call     tests/test_a.py::test_g\n'
            '1.90s call     tests/test_a.py::test_h\n9.00s call     tests/live_vllm/test_v.py::test_v\n'
            '0.10s teardown tests/test_a.py::Test::test_k\n0.20s setup    tests/test_a.py::test_s\n'
            'tests/test_a.py::test_s SKIPPED (no venv)                                 [ 50%]\n')
    got = parse_durations_output(text)
    assert got == {'tests/test_a.py::test_f[x]': 4.5, 'tests/test_a.py::test_f[y]': 1.0,
                   'tests/test_a.py::test_g': 2.5, 'tests/test_a.py::test_h': 1.9,
                   'tests/live_vllm/test_v.py::test_v': 9.0, 'tests/test_a.py::Test::test_k': 0.1}
    assert by_function(got)['tests/test_a.py::test_f'] == 4.5 and function_id('a.py::C::t[1]') == 'a.py::t'
    listed = ['tests/test_a.py::test_g', 'tests/test_a.py::test_h']
    assert disagreements(got, listed) == (['tests/test_a.py::test_f'], ['tests/test_a.py::test_h'])
    assert disagreements(got, ['tests/test_a.py::test_f', 'tests/test_a.py::test_g']) == ([], [])   # 2.5: either
    with pytest.raises(ValueError, match='^no duration lines'):
        parse_durations_output('1 passed in 0.1s')
    (tmp_path / 'tests').mkdir()
    (tmp_path / 'tests' / 'test_a.py').write_text('def test_f():\n    pass\n')
    (tmp_path / 'tests' / 'test_b.py').write_text('def test_b():\n    pass\n\ndef test_c():\n    pass\n')
    old = {'tests/test_a.py::test_f[old-id]': 1.0, 'tests/test_b.py::test_b': 2.0, 'tests/test_b.py::test_gone': 5.0,
           'tests/test_b.py::test_c': 0.5}
    assert merge(old, {'tests/test_a.py::test_f[new-id]': 1.234}, tmp_path) == {
        'tests/test_a.py::test_f[new-id]': 1.23, 'tests/test_b.py::test_b': 2.0, 'tests/test_b.py::test_c': 0.5}
