"""Token-by-token streaming through ``agentrl serve`` and the HF engine in a child process.

* :class:`agentrl.gateway.stream.ReplyStream` never sends what a later token could change: for
  texts built from the pieces that matter (think tags, tool-call blocks, newlines, stop strings),
  cut at every position, what it sent is a prefix of the final ``parse_reply`` and ``finish``
  completes it exactly (hypothesis).
* Through the real openai SDK: the first deltas arrive while the engine is still sampling (the
  engine is slowed after each token), and the concatenated deltas equal the non-streaming message
  for the same seed: content, reasoning, tool calls (ids, names, arguments), finish reason, ids.
* ``HFProcessEngine`` samples the same ids and log-probs as ``HFEngine`` for the same seed,
  streams, and its records replay with ``agentrl check``.
"""
import threading

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from _tokenizers import tokenizer_path

pytest.importorskip('transformers')
pytest.importorskip('starlette')
openai = pytest.importorskip('openai')
try:                       # openai >= 3 ships httpx2; older versions use httpx
    import httpx2 as httpx
except ImportError:
    httpx = pytest.importorskip('httpx')

from _gateway import ForcingHF  # noqa: E402
from agentrl.gateway import Gateway, parse_reply  # noqa: E402
from agentrl.gateway.server import Server  # noqa: E402
from agentrl.families import QWEN3  # noqa: E402
from agentrl.gateway.parse import wire_calls  # noqa: E402
from agentrl.gateway.stream import ReplyStream  # noqa: E402
from agentrl.gym import TOOL_SCHEMAS  # noqa: E402
from agentrl.templates.chat import function_tools  # noqa: E402

TOOLS = function_tools(TOOL_SCHEMAS)
USER = [{'role': 'user', 'content': 'Fix clamp.'}]
CALL = '<tool_call>\n{"name": "read", "arguments": {"path": "clamp.py"}}\n</tool_call>'
PIECES = ['<think>', '</think>', '\n', '\n\n', 'a', 'hm ', ' ', '<', '</', '<tool_', CALL,
          '<tool_call>{bad}</tool_call>', '<tool_call>\n{"name": "edit", "arguments": {"x": [1, 2]}}\n</tool_call>',
          'STOP', 'ST', 'é', '</tool_call>']


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from(PIECES), max_size=12), st.booleans(), st.booleans())
def test_stable_parts_are_prefixes_of_the_final_reply_at_every_cut(pieces, think, tools):
    text = ''.join(pieces)
    final = parse_reply(text, QWEN3, id_seed='s/0', tools=tools, think_open=think)
    calls = final.get('tool_calls') or []
    for k in range(len(text) + 1):
        r, c, cs = QWEN3.stable_parts(text[:k], think, tools)
        cs = wire_calls(cs, 's/0')
        assert (final.get('reasoning_content') or '').startswith(r or ''), (text, k)
        assert (final['content'] or '').startswith(c), (text, k)
        assert cs == calls[:len(cs)], (text, k)


class _Chars:
    """A template stand-in for ReplyStream: one id per character (decode joins them), stop id -1."""
    stop_ids = frozenset({-1})

    @staticmethod
    def decode(ids):
        return ''.join(chr(i) for i in ids)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.sampled_from(PIECES), max_size=12), st.booleans(), st.booleans())
def test_reply_stream_concatenates_to_the_final_reply(pieces, think, tools):
    text = ''.join(pieces)
    cut = text.find('STOP')
    final = parse_reply(text if cut < 0 else text[:cut], QWEN3, id_seed='s/0', tools=tools, think_open=think)
    rs = ReplyStream(_Chars, QWEN3, think, tools, 's/0', stops=['STOP'])
    ids, deltas = [ord(ch) for ch in text] + [-1], []
    for k in range(1, len(ids) + 1):
        deltas += rs.feed(ids[:k])
    deltas += rs.finish(final)
    assert not rs.mismatch
    got = {'reasoning': ''.join(d.get('reasoning_content', '') for d in deltas),
           'content': ''.join(d.get('content', '') for d in deltas),
           'calls': [(c['id'], c['function']['name']) for d in deltas for c in d.get('tool_calls', ()) if 'id' in c],
           'args': ''.join(c['function'].get('arguments', '') for d in deltas for c in d.get('tool_calls', ()))}
    assert got == {'reasoning': final.get('reasoning_content') or '', 'content': final['content'] or '',
                   'calls': [(c['id'], c['function']['name']) for c in final.get('tool_calls', [])],
                   'args': ''.join(c['function']['arguments'] for c in final.get('tool_calls', []))}


def test_parse_reply_think_open_forms():
    assert parse_reply('plan\n</think>\n\nok', QWEN3, think_open=True) == {'role': 'assistant', 'content': 'ok',
                                                                    'reasoning_content': 'plan'}
    assert parse_reply('plan</think>ok', QWEN3, think_open=False) == {'role': 'assistant', 'content': 'plan</think>ok'}
    assert parse_reply('plan</think>ok', QWEN3) == {'role': 'assistant', 'content': 'ok', 'reasoning_content': 'plan'}
    assert parse_reply('<think>\ncut in its reasoning', QWEN3, think_open=False) == {
        'role': 'assistant', 'content': '', 'reasoning_content': 'cut in its reasoning'}
    assert parse_reply('\n\nhi', QWEN3, think_open=False)['content'] == 'hi'
    assert parse_reply('\n\nhi', QWEN3)['content'] == '\n\nhi'


# ---------------------------------------------------------------------------- through the server
@pytest.fixture(scope='module')
def model_dir(tmp_path_factory):
    from agentrl.engines import hf
    return hf.make_test_model(tmp_path_factory.mktemp('gw-stream-model'), tokenizer_path('qwen3'))


class SlowForcing(ForcingHF):
    """ForcingHF that, while ``hold`` is an Event, does not return from ``sample`` until the test sets it (after
    the client got a chunk; at most 60 s): ``held`` notes, per sample, whether the client got one before the end."""

    def __init__(self, *a, **k):
        super().__init__(*a, **k)
        self.hold, self.held = None, []

    def sample(self, request, teacher=None):
        s = super().sample(request, teacher)
        if self.hold is not None:
            self.held.append(self.hold.wait(600))
        return s


@pytest.fixture(scope='module')
def upstream(model_dir):
    return SlowForcing(model_dir, device='cpu', max_new_tokens=16)


@pytest.fixture(scope='module')
def server(upstream, tmp_path_factory):
    srv = Server(Gateway(upstream, tmp_path_factory.mktemp('gw-stream') / 'run')).start()
    yield srv
    srv.stop()


def _session(srv):
    r = httpx.post(srv.url + '/sessions', json={}, timeout=60)
    assert r.status_code == 201
    return openai.OpenAI(api_key='unused', base_url=r.json()['base_url'])


THINK_CALL = ('<think>\nI should read the file first, then edit it.\n</think>\n\nReading.\n' + CALL.replace(
    '"clamp.py"', '"clamp.py", "lines": [1, 2, 3]') + '<|im_end|>')


@pytest.mark.parametrize('forced', [None, THINK_CALL])
def test_sdk_stream_arrives_while_sampling_and_equals_the_message(server, upstream, forced):
    got = []
    for stream in (False, True):
        if forced:
            upstream.force.append(forced)
        c = _session(server)
        kw = dict(model='m', messages=USER, tools=TOOLS, seed=5, max_tokens=16, extra_body={'return_token_ids': True})
        if not stream:
            r = c.chat.completions.create(**kw).choices[0]
            got.append((r.message.content or '', r.message.model_extra.get('reasoning_content') or '',
                        [(t.function.name, t.function.arguments) for t in r.message.tool_calls or ()],
                        r.finish_reason, r.model_extra['token_ids']))
            continue
        arrivals, content, reasoning, calls, last = [], '', '', {}, None
        upstream.hold, upstream.held = threading.Event(), []
        for p in c.chat.completions.create(stream=True, **kw):
            if not p.choices:
                continue
            d = p.choices[0].delta
            if d.content or d.model_extra.get('reasoning_content') or d.tool_calls:
                arrivals.append(len(content) + len(reasoning))
                upstream.hold.set()
            content += d.content or ''
            reasoning += d.model_extra.get('reasoning_content') or ''
            for t in d.tool_calls or ():
                e = calls.setdefault(t.index, ['', ''])
                e[0] += t.function.name or ''
                e[1] += t.function.arguments or ''
            last = p.choices[0]
        got.append((content, reasoning, [tuple(e) for _, e in sorted(calls.items())], last.finish_reason,
                    last.model_extra['token_ids']))
        upstream.hold = None
        assert len(arrivals) >= 3 and upstream.held == [True]     # a chunk reached the client before sampling ended
    assert got[0] == got[1]
    if forced:
        assert got[0][:4] == ('Reading.', 'I should read the file first, then edit it.',
                              [('read', '{"path": "clamp.py", "lines": [1, 2, 3]}')], 'tool_calls')


def test_process_engine_samples_what_the_in_process_engine_samples(model_dir, upstream, tmp_path):
    from agentrl.engines.contract import TurnRequest
    from agentrl.engines.hf.engine import HFEngine
    from agentrl.engines.hf.process import HFProcessEngine
    from agentrl.record import SamplingSpec
    proc = HFProcessEngine(model_dir, device='cpu', max_new_tokens=16, threads=1)
    try:
        prompt = upstream.tokenizer('<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n')['input_ids']
        spec, stop = SamplingSpec(temperature=0.9, top_p=0.95), frozenset({151645})
        seen = []
        a = proc.sample(TurnRequest(prompt, spec, 12, 7, stop, on_token=lambda ids: seen.append(list(ids))))
        b = HFEngine.sample(upstream, TurnRequest(prompt, spec, 12, 7, stop))
        assert (a.ids, a.logp, a.truncated) == (b.ids, b.logp, b.truncated)
        assert seen == [a.ids[:k] for k in range(1, len(a.ids) + 1)]
        assert a.span[0] <= a.span[1] and proc.max_context == upstream.max_context
        assert proc.model_name == upstream.model_name
        srv = Server(Gateway(proc, tmp_path / 'run')).start()
        try:
            sess = httpx.post(srv.url + '/sessions', json={}, timeout=120).json()
            c = openai.OpenAI(api_key='unused', base_url=sess['base_url'])
            parts = list(c.chat.completions.create(model='m', messages=USER, seed=3, max_tokens=8, stream=True))
            assert parts[-1].choices[0].finish_reason in ('stop', 'length')
            assert httpx.post(f'{srv.url}/sessions/{sess["token"]}/finish', json={'reward': 1.0}, timeout=120).json()['records'] == 1
        finally:
            srv.stop()
    finally:
        proc.close()
    from agentrl.jobs.check import CheckOptions, run_check
    rep = run_check(CheckOptions(path=str(tmp_path / 'run'), model=str(model_dir), max_ratio_dev=1e-4))
    assert rep.refused == 0 and rep.n == 1 and rep.code == 0, rep.format()
    assert not proc._proc.is_alive()
