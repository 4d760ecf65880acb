"""The dependency direction is one way: a module imports agentrl modules of its own layer or below.

Layers (docs/design.md): L0 record, constraints, io, _version, fields, _lazy; L1 tokenizer, gym, model, sampling, kv_cache,
checkpoint;
L2 rollouts, batching (collate), packing (collate_packed), templates, families; L3 checks, stats; L4 store, viz, engines, train, interop;
L5 jobs, gateway; L6 cli. The gym never imports torch.
"""
import ast
from pathlib import Path

import agentrl

SRC = Path(agentrl.__file__).parent
LAYER = {'record': 0, 'constraints': 0, 'io': 0, '_version': 0, 'fields': 0, '_lazy': 0,
         'tokenizer': 1, 'gym': 1, 'model': 1, 'sampling': 1, 'kv_cache': 1, 'checkpoint': 1,
         'rollouts': 2, 'batching': 2, 'packing': 2, 'templates': 2, 'families': 2,
         'checks': 3, 'stats': 3,
         'store': 4, 'viz': 4, 'engines': 4, 'train': 4, 'interop': 4,
         'jobs': 5, 'gateway': 5, 'cli': 6}


def _top(path: Path) -> str:
    return path.relative_to(SRC).parts[0].removesuffix('.py')


def _imports(path: Path):
    """Yield (top-level agentrl module, line) for every agentrl import in ``path``."""
    rel = path.relative_to(SRC)
    pkg_parts = ['agentrl', *rel.parts[:-1]]
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = pkg_parts[:len(pkg_parts) - node.level + 1]
                target = base + (node.module.split('.') if node.module else [])
            else:
                target = (node.module or '').split('.')
            if target[0] != 'agentrl':
                continue
            names = [target[1]] if len(target) > 1 else [a.name for a in node.names]
            for n in names:
                yield n, node.lineno
        elif isinstance(node, ast.Import):
            for a in node.names:
                parts = a.name.split('.')
                if parts[0] == 'agentrl' and len(parts) > 1:
                    yield parts[1], node.lineno


def test_every_module_has_a_layer():
    tops = {_top(p) for p in SRC.rglob('*.py')} - {'__init__', '__main__'}
    assert tops <= set(LAYER), f'modules without a layer: {tops - set(LAYER)}; add them to LAYER and design notes'


def test_imports_point_down():
    bad = []
    for path in SRC.rglob('*.py'):
        me = _top(path)
        if me in ('__init__', '__main__'):
            continue
        for name, line in _imports(path):
            if name in LAYER and LAYER[name] > LAYER[me]:
                bad.append(f'{path.relative_to(SRC)}:{line} ({me}, L{LAYER[me]}) imports {name} (L{LAYER[name]})')
    assert not bad, '\n'.join(bad)


def test_gym_has_no_torch():
    for path in (SRC / 'gym').rglob('*.py'):
        for node in ast.walk(ast.parse(path.read_text())):
            mods = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ''] if isinstance(node, ast.ImportFrom) else []
            assert not any(m.split('.')[0] == 'torch' for m in mods), f'{path} imports torch'


def test_design_doc_lists_exactly_the_layers_of_this_test():
    import re
    text = (SRC.parents[1] / 'docs' / 'design.md').read_text()
    section = text.split('## layers', 1)[1].split('\n## ', 1)[0]
    documented = {}
    for level, names in re.findall(r'L(\d) ((?:`\w+`(?:,\s*)?)+)', section):
        for name in re.findall(r'`(\w+)`', names):
            documented[name] = int(level)
    assert documented == LAYER, 'docs/design.md#layers and LAYER disagree: ' + str(
        sorted(set(documented.items()) ^ set(LAYER.items())))
