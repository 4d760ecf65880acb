"""The 'slow' list names tests that exist (a renamed test would silently leave the quick loop slow)."""
import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_every_slow_entry_names_a_test_function():
    listed = [line.strip() for line in (ROOT / 'tests' / 'slow_tests.txt').read_text().splitlines()
              if line.strip() and not line.startswith('#')]
    stale = []
    for entry in listed:
        path, name = entry.split('::')
        file = ROOT / path
        names = {n.name for n in ast.walk(ast.parse(file.read_text()))
                 if isinstance(n, ast.FunctionDef)} if file.exists() else set()
        if name not in names:
            stale.append(entry)
    assert len(listed) > 40 and stale == [], f'tests/slow_tests.txt names tests that do not exist: {stale}'
