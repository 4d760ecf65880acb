"""Recorded engine fixtures: read a run's stored records, write them as canonical JSON, compare exactly.

Shared by ``tests/test_engine_fixtures.py`` (TinyAgent, HF, the HF gateway) and
``tests/live_vllm/test_vllm_fixtures.py`` (vLLM). Only public surfaces are used: the CLI
(``python -m agentrl ...``), the gateway over plain HTTP, and the stored Parquet files read back
with pyarrow, so the comparison holds whatever the engines look like inside.

A fixture file (``tests/golden/engines/NAME.json``) is one JSON object: ``command`` (the argv that
made it, paths as ``{placeholders}``), ``excluded`` (each field left out of the comparison, with its
reason), ``calls`` (for the gateway: the deterministic part of each HTTP response) and ``records``
(one object per stored row, in stored order, one column per line, sorted keys). Every stored column
is kept; ``info`` is kept as the JSON object it stores, in its stored key order, so
``json.dumps(record['info'])`` is the stored cell byte for byte. A float is compared by its
``repr`` (exact for float32 and float64, and tells -0.0 and NaN apart), or within :data:`FLOAT_ULPS`
relative (a float32 log-prob's last bits differ between CPU kernels: one machine's AVX-512 sums in
another order than another's AVX2); a record whose floats differ only so is not held to its
``digest``, which covers those bits. Ids, owners, masks and every other field stay exact.

Regenerate (on today's code only, never to make a failing test pass without knowing why) with
``AGENTRL_REGEN_FIXTURES=1 python -m pytest tests/test_engine_fixtures.py``; with ``CI=true`` that is
refused.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
GOLDEN = ROOT / 'tests' / 'golden' / 'engines'
EXCLUDED = '<excluded>'


def cli_env() -> dict:
    """The environment of every ``python -m agentrl`` child: this tree's ``src``, CPU only, offline."""
    return dict(os.environ, PYTHONPATH=str(ROOT / 'src'), CUDA_VISIBLE_DEVICES='', HF_HUB_OFFLINE='1',
                TOKENIZERS_PARALLELISM='false')


def agentrl(*args, cwd=None, timeout=600) -> subprocess.CompletedProcess:
    """Run ``python -m agentrl ARGS`` (``sys.executable``) and assert it exits 0 (stderr in the message)."""
    p = subprocess.run([sys.executable, '-m', 'agentrl', *map(str, args)], capture_output=True, text=True,
                       env=cli_env(), cwd=cwd, timeout=timeout)
    assert p.returncode == 0, f'agentrl {" ".join(map(str, args))} exited {p.returncode}:\n{p.stderr[-3000:]}'
    return p


# ---------------------------------------------------------------------------------------------- records
def stored_rows(trajectories: Path) -> list[dict]:
    """Every stored row of ``trajectories`` (a folder of ``part-*.parquet``), in stored order.

    Returns:
        One dict per row: every column as pyarrow gives it, except ``info``, which is parsed (key
        order kept). Asserts that the parse dumps back to the stored cell byte for byte.
    """
    import pyarrow.parquet as pq
    rows = []
    for part in sorted(trajectories.glob('part-*.parquet')):
        for row in pq.read_table(part).to_pylist():
            raw = row['info']
            row['info'] = None if raw is None else json.loads(raw)
            assert raw is None or json.dumps(row['info']) == raw, f'{part.name}: info does not round-trip as JSON'
            rows.append(row)
    return rows


def mask(obj, path: tuple):
    """Replace the value at ``path`` (keys into nested dicts; ``'*'`` = every item of a list or every value
    of a dict) with :data:`EXCLUDED`, in place, when it is there."""
    if not path:
        return
    key, rest = path[0], path[1:]
    if key == '*':
        pairs = list(enumerate(obj)) if isinstance(obj, list) else list(obj.items()) if isinstance(obj, dict) else []
        for k, v in pairs:
            if rest:
                mask(v, rest)
            else:
                obj[k] = EXCLUDED
        return
    if isinstance(obj, dict) and key in obj:
        if rest:
            mask(obj[key], rest)
        else:
            obj[key] = EXCLUDED


def excluded_paths(excluded: dict) -> list[tuple]:
    """``{'info.gateway.session': reason}`` -> ``[('info', 'gateway', 'session')]``."""
    return [tuple(name.split('.')) for name in excluded]


def substitute(obj, names: dict):
    """``obj`` with each string that holds a key of ``names`` rewritten to hold its value instead
    (e.g. a session id made at random -> ``'<session 0>'``); dict keys are kept."""
    if isinstance(obj, str):
        for old, new in names.items():
            obj = obj.replace(old, new)
        return obj
    if isinstance(obj, list):
        return [substitute(v, names) for v in obj]
    if isinstance(obj, dict):
        return {k: substitute(v, names) for k, v in obj.items()}
    return obj


def canonical(rows: list[dict], excluded: dict, names: dict | None = None) -> list[dict]:
    """``rows`` with the strings of ``names`` substituted (:func:`substitute`) and every excluded field
    replaced by :data:`EXCLUDED`; ``'digest.row'`` excludes only the row part of a ``v2:`` digest.

    Args:
        rows: stored rows (:func:`stored_rows`) or response facts.
        excluded: ``{'dotted.path': reason}``; ``'*'`` in a path is every item.
        names: ``{varying string: placeholder}`` or None.
    """
    out = substitute(json.loads(json.dumps(rows)), names or {})     # a deep copy: key order, exact floats
    for row in out:
        for path in excluded_paths(excluded):
            if path == ('digest', 'row'):
                if isinstance(row.get('digest'), str) and row['digest'].startswith('v2:'):
                    row['digest'] = row['digest'].rsplit(':', 1)[0] + ':' + EXCLUDED
                continue
            mask(row, path)
    return out


# ---------------------------------------------------------------------------------------------- files
def _dump_record(rec: dict) -> str:
    lines = [f' {json.dumps(k)}: {json.dumps(rec[k], sort_keys=k != "info", separators=(",", ":"))}'
             for k in sorted(rec)]
    return '{\n' + ',\n'.join(lines) + '\n}'


def dump_fixture(data: dict) -> str:
    """The fixture's canonical text: top-level keys sorted; each record (and each HTTP response fact of
    ``calls``) one object with one field per line, sorted keys (``info`` in its stored key order, which
    is compared too)."""
    head = {k: v for k, v in data.items() if k not in ('records', 'calls')}
    parts = [f' {json.dumps(k)}: {json.dumps(v, sort_keys=True)}' for k, v in sorted(head.items())]
    for key in ('calls', 'records'):
        if key in data:
            objs = ',\n'.join(_dump_record(r) for r in data[key])
            parts.append(f' {json.dumps(key)}: [\n{objs}\n]')
    return '{\n' + ',\n'.join(sorted(parts)) + '\n}\n'


#: relative difference under which two floats of a record are the same value computed by other CPU kernels
FLOAT_ULPS = 1e-6


def first_difference(a, b, where: str = '', ordered: bool = False, exact: bool = False) -> tuple[str, str, str] | None:
    """The first place where ``a`` and ``b`` differ: ``(where, repr in a, repr in b)``, or None.

    Lists are compared item by item (then by length), dicts key by key (then, when ``ordered``, by key
    order), floats by ``repr`` (bit-exact with ``exact``, else within :data:`FLOAT_ULPS` relative),
    anything else by ``repr`` and type.
    """
    if isinstance(a, float) and isinstance(b, float) and not exact and repr(a) != repr(b):
        if a != b and abs(a - b) <= FLOAT_ULPS * max(1.0, abs(a), abs(b)):     # not NaN, not -0.0 vs 0.0
            return None
    if isinstance(a, list) and isinstance(b, list):
        for i, (x, y) in enumerate(zip(a, b)):
            d = first_difference(x, y, f'{where}[{i}]', ordered, exact)
            if d:
                return d
        if len(a) != len(b):
            return f'{where} length', str(len(a)), str(len(b))
        return None
    if isinstance(a, dict) and isinstance(b, dict):
        for k in a:
            if k not in b:
                return f'{where}.{k}', repr(a[k])[:300], '(absent)'
            d = first_difference(a[k], b[k], f'{where}.{k}', ordered, exact)
            if d:
                return d
        for k in b:
            if k not in a:
                return f'{where}.{k}', '(absent)', repr(b[k])[:300]
        if ordered and list(a) != list(b):
            return f'{where} key order', repr(list(a)), repr(list(b))
        return None
    if type(a) is not type(b) or repr(a) != repr(b):
        return where, repr(a)[:300], repr(b)[:300]
    return None


def compare_records(name: str, expected: list[dict], actual: list[dict]) -> None:
    """Fail naming the fixture, the row (index and rollout_id), the field and both values at the first
    difference; the rows are compared in stored order, every column (``info`` with its key order, which
    is part of the stored cell)."""
    where = f'fixture {name}'
    if len(expected) != len(actual):
        ids = [r.get('rollout_id') for r in expected], [r.get('rollout_id') for r in actual]
        pytest.fail(f'{where}: {len(expected)} records in the fixture, {len(actual)} now\n'
                    f'  fixture rollout_ids: {ids[0]}\n  now:                 {ids[1]}')
    for i, (e, a) in enumerate(zip(expected, actual)):
        # floats that differ only in their last bits (another CPU's kernels) change the digest that covers them
        noisy = any(f in a and first_difference(e[f], a[f], f, exact=True) for f in e if f != 'digest')
        for field in sorted(set(e) | set(a)):
            if field == 'digest' and noisy:
                continue
            if field not in a or field not in e:
                pytest.fail(f'{where}, record {i} (rollout_id {e.get("rollout_id")!r}): column {field!r} is '
                            f'{"missing now" if field not in a else "not in the fixture"}')
            d = first_difference(e[field], a[field], field, ordered=field == 'info')
            if d:
                at, x, y = d
                full = ''
                if at != field:
                    full = (f'\n  whole field in the fixture: {json.dumps(e[field])[:1500]}'
                            f'\n  whole field now:            {json.dumps(a[field])[:1500]}')
                pytest.fail(f'{where}, record {i} (rollout_id {e.get("rollout_id")!r}), field {at}:\n'
                            f'  fixture: {x}\n  now:     {y}{full}')


def check_fixture(name: str, data: dict, regen: bool = True) -> None:
    """Compare ``data`` (``command``, ``excluded``, ``records`` already canonical, maybe ``calls``) with
    ``tests/golden/engines/NAME.json``, or write it there when ``AGENTRL_REGEN_FIXTURES=1`` and ``regen``
    (a second way to the same records passes ``regen=False``: it always compares).

    Raises:
        pytest.fail: a difference (fixture, record, field, both values), a missing fixture, or a
            regeneration asked for under ``CI=true``.
    """
    path = GOLDEN / f'{name}.json'
    text = dump_fixture(data)
    assert json.loads(text) == json.loads(json.dumps(data)), 'dump_fixture lost something'
    if os.environ.get('AGENTRL_REGEN_FIXTURES') == '1' and regen:
        if os.environ.get('CI', '').lower() == 'true':
            pytest.fail(f'AGENTRL_REGEN_FIXTURES=1 under CI=true: fixtures are regenerated by hand on a known-good '
                        f'tree and reviewed, never in CI (unset AGENTRL_REGEN_FIXTURES)')
        GOLDEN.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        return
    if not path.is_file():
        pytest.fail(f'fixture {path.relative_to(ROOT)} is missing; record it on a known-good tree with '
                    f'AGENTRL_REGEN_FIXTURES=1 python -m pytest {_module_of(name)}')
    want = json.loads(path.read_text())
    assert want.get('command') == data.get('command'), \
        f'fixture {name}: recorded with {want.get("command")}, the test now runs {data.get("command")}; regenerate'
    assert want.get('excluded') == data.get('excluded'), \
        f'fixture {name}: its excluded fields {want.get("excluded")} differ from the test\'s {data.get("excluded")}'
    if 'calls' in want or 'calls' in data:
        compare_records(f'{name} (HTTP responses)', want.get('calls', []), data.get('calls', []))
    compare_records(name, want['records'], data['records'])


def _module_of(name: str) -> str:
    return 'tests/live_vllm/test_vllm_fixtures.py' if 'vllm' in name else 'tests/test_engine_fixtures.py'


# ---------------------------------------------------------------------------------------------- the gateway
def post(url: str, body: dict, timeout: float = 300) -> dict:
    """POST ``body`` as JSON; the JSON answer (asserting a 2xx status)."""
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={'Content-Type': 'application/json'})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.loads(r.read())


def post_stream(url: str, body: dict, timeout: float = 300) -> list[dict]:
    """POST a ``stream: true`` body; the SSE ``data:`` chunks, parsed, up to ``[DONE]`` (asserted)."""
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={'Content-Type': 'application/json'})
    chunks = []
    with urllib.request.urlopen(req, timeout=timeout) as r:
        for line in r:
            line = line.decode().strip()
            if not line.startswith('data:'):
                continue
            data = line[5:].strip()
            if data == '[DONE]':
                return chunks
            chunks.append(json.loads(data))
    raise AssertionError(f'{url}: the stream ended without [DONE] after {len(chunks)} chunks')


class Serve:
    """``python -m agentrl serve ARGS`` in a child process; ``url`` from its first stdout line.

    Use as a context manager: SIGTERM and a wait on exit (SIGKILL if it does not stop in 60 s).
    Its stderr goes to a temporary file (``stderr()`` reads it), so a chatty server never blocks.
    """

    def __init__(self, *args):
        self.args = [str(a) for a in args]
        self.proc = None
        self.url = None
        self.log = None

    def stderr(self) -> str:
        """What the gateway printed to stderr so far."""
        self.log.seek(0)
        return self.log.read().decode(errors='replace')

    def __enter__(self):
        self.log = tempfile.TemporaryFile()
        self.proc = subprocess.Popen([sys.executable, '-m', 'agentrl', 'serve', *self.args], stdout=subprocess.PIPE,
                                     stderr=self.log, text=True, env=cli_env())
        line = self.proc.stdout.readline()
        if not line.startswith('serving on http://'):
            self.proc.kill()
            self.proc.wait()
            raise AssertionError(f'agentrl serve did not start: {line!r}\n{self.stderr()[-3000:]}')
        self.url = line.split()[2]
        return self

    def __exit__(self, *exc):
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.proc.stdout.close()
        self.log.close()


#: The tools of every gateway fixture session (one function, so the system prompt stays short).
TOOLS = [{'type': 'function', 'function': {
    'name': 'read', 'description': 'Return the source.', 'parameters': {'type': 'object', 'properties': {}}}}]


def response_facts(body: dict) -> dict:
    """The deterministic part of a chat completion: finish_reason, message, token ids, usage."""
    c = body['choices'][0]
    return {'finish_reason': c['finish_reason'], 'message': c['message'], 'token_ids': c.get('token_ids'),
            'prompt_token_ids': body.get('prompt_token_ids'), 'usage': body.get('usage')}


def stream_facts(chunks: list[dict]) -> dict:
    """The deterministic part of a streamed completion: the deltas joined, finish_reason, token ids, usage."""
    text = {'content': '', 'reasoning_content': ''}
    calls, finish, token_ids, usage, prompt_ids = [], None, None, None, None
    for ch in chunks:
        usage = ch.get('usage') or usage
        prompt_ids = ch.get('prompt_token_ids') or prompt_ids
        for c in ch.get('choices', []):
            d = c.get('delta') or {}
            for k in text:
                text[k] += d.get(k) or ''
            calls += d.get('tool_calls') or []
            finish = c.get('finish_reason') or finish
            token_ids = c.get('token_ids') or token_ids
    return {'finish_reason': finish, 'content': text['content'], 'reasoning_content': text['reasoning_content'],
            'tool_calls': calls, 'token_ids': token_ids, 'prompt_token_ids': prompt_ids, 'usage': usage}


def drive_gateway(url: str) -> list[dict]:
    """A fixed script of calls through a gateway at ``url``; the deterministic facts of each response.

    Session A (identity given): a plain first turn; the reply echoed back with a tool result (the
    branch extends); the next turn streamed; the second call's history sent again (a ``retry``
    fork: a second branch and a second record); finish with reward 0.5. Session B (default
    identity): a history the harness wrote, holding an assistant tool call and its result (the
    prompt renders the tool call), a call with ``stop`` strings; finish with reward 0.
    """
    facts = []
    a = post(url + '/sessions', {'group_id': 'fixture-g', 'rollout_id': 'fixture-a', 'task': 'clamp'})
    base = a['base_url']
    msgs = [{'role': 'system', 'content': 'You fix bugs.'}, {'role': 'user', 'content': 'Fix clamp.'}]
    common = {'tools': TOOLS, 'max_tokens': 8, 'return_token_ids': True}
    r = post(base + '/chat/completions', {'messages': msgs, 'seed': 11, **common})
    facts.append(response_facts(r))
    msgs2 = msgs + [r['choices'][0]['message'], {'role': 'tool', 'tool_call_id': 'x', 'content': 'def clamp(): pass'}]
    r2 = post(base + '/chat/completions', {'messages': msgs2, 'seed': 12, **common})
    facts.append(response_facts(r2))
    msgs3 = msgs2 + [r2['choices'][0]['message'], {'role': 'user', 'content': 'Go on.'}]
    chunks = post_stream(base + '/chat/completions', {'messages': msgs3, 'seed': 13, 'stream': True,
                                                      'stream_options': {'include_usage': True}, **common})
    facts.append(stream_facts(chunks))
    r4 = post(base + '/chat/completions', {'messages': msgs2, 'seed': 14, **common})        # a retry fork
    facts.append(response_facts(r4))
    facts.append(post(f'{url}/sessions/{a["token"]}/finish', {'reward': 0.5, 'info': {'by': 'fixture'}}))
    b = post(url + '/sessions', {})
    history = [{'role': 'user', 'content': 'Read it.'},
               {'role': 'assistant', 'content': None, 'tool_calls': [
                   {'id': 'call_1', 'type': 'function', 'function': {'name': 'read', 'arguments': '{}'}}]},
               {'role': 'tool', 'tool_call_id': 'call_1', 'content': 'def clamp(x): return x'}]
    r5 = post(b['base_url'] + '/chat/completions', {'messages': history, 'seed': 15, 'stop': ['\n', 'a'],
                                                    'temperature': 0.8, 'top_p': 0.95, **common})
    facts.append(response_facts(r5))
    facts.append(post(f'{url}/sessions/{b["token"]}/finish', {'reward': 0.0}))
    return facts
