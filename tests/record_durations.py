"""Merge the durations of pytest runs into tests/durations.json; optionally bring tests/slow_tests.txt in line.

Usage (from the repository root):
    python -m pytest -p no:cacheprovider --durations=0 -vv > run.log       # the whole suite, on a quiet machine
    python tests/record_durations.py run.log [more.log ...] [--update-slow-list]

The same file is written directly by ``python -m pytest --record-durations tests/durations.json``.
Tests a log does not mention keep their recorded seconds; tests whose function no longer exists are dropped.
With ``--update-slow-list`` every function over 3 s is added to the slow list and every listed one
under 2 s removed (tests/_durations.py: the band); tests/test_markers.py checks that they agree.
"""
import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _durations import DURATIONS, SLOW_LIST, load, merge, parse_durations_output, update_slow_list, write  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument('logs', nargs='*', help='outputs of `pytest --durations=0 -vv` (none: only --update-slow-list)')
    ap.add_argument('--out', default=str(DURATIONS), help='the durations file (default tests/durations.json)')
    ap.add_argument('--update-slow-list', action='store_true', help=f'rewrite {SLOW_LIST.name} to agree')
    args = ap.parse_args(argv)
    new: dict = {}
    for log in args.logs:
        new.update(parse_durations_output(Path(log).read_text(errors='replace')))     # a later log wins
    out = Path(args.out)
    durations = merge(load(out), new)
    if new:
        write(durations, out)
        print(f'{out}: {len(new)} tests from {len(args.logs)} log(s), {len(durations)} recorded')
    if args.update_slow_list:
        added, removed = update_slow_list(durations)
        print(f'{SLOW_LIST}: added {added or "none"}; removed {removed or "none"}')
    return 0


if __name__ == '__main__':
    sys.exit(main())
