"""The package's one HTTP client (:mod:`agentrl.engines.vllm.http`) against a real local HTTP server.

A small Starlette app on 127.0.0.1 (uvicorn in a thread, started once for the module) answers like
a vLLM server per ``model`` of the body: a turn, a refusal (400), a dead engine (500), an SSE stream,
a stream cut mid-body and one that stalls. The blocking calls (gateway), the async ones (episode
runner) and the readiness probe go through the same module and raise the same errors.
"""
import ast
import asyncio
import json
import re
import socket
import threading
from pathlib import Path

import pytest

starlette = pytest.importorskip('starlette')
uvicorn = pytest.importorskip('uvicorn')
pytest.importorskip('httpx2')

from starlette.applications import Starlette  # noqa: E402
from starlette.responses import JSONResponse, PlainTextResponse, StreamingResponse  # noqa: E402
from starlette.routing import Route  # noqa: E402

import agentrl  # noqa: E402
from agentrl.engines.vllm import ServerDied, VLLMError, connect  # noqa: E402
from agentrl.engines.vllm.client import complete, session  # noqa: E402
from agentrl.engines.vllm.http import post, send, split_lines, stream_lines  # noqa: E402
from agentrl.engines.vllm.engine import complete_ids, stream_ids  # noqa: E402

PROMPT = [5, 6, 7]
TURN = {'choices': [{'token_ids': [11, 12, 2], 'logprobs': {'token_logprobs': [-0.5, -1.25, -0.125]},
                     'finish_reason': 'stop', 'stop_reason': 2, 'prompt_token_ids': PROMPT}]}


def _sse(*events):
    return [f'data: {json.dumps(e)}\n\n'.encode() for e in events]


#: a streamed turn: two token chunks (the first with the prompt), the usage chunk, [DONE]
STREAM = _sse({'choices': [{'token_ids': [11], 'logprobs': {'token_logprobs': [-0.5]}, 'finish_reason': None,
                            'prompt_token_ids': PROMPT}]},
              {'choices': [{'token_ids': [12, 2], 'logprobs': {'token_logprobs': [-1.25, -0.125]},
                            'finish_reason': 'stop', 'stop_reason': 2}]},
              {'choices': [], 'usage': {'completion_tokens': 3}}) + [b'data: [DONE]\n\n']


async def _completions(request):
    body = json.loads(await request.body())
    model = body['model']
    if model == 'bad':
        return PlainTextResponse("This model's maximum context length is 8 tokens", status_code=400)
    if model == 'dead':
        return PlainTextResponse('EngineDeadError: engine core died', status_code=500)
    if model == 'echo':
        return JSONResponse({'headers': request.headers.get('content-type'), 'bytes': (await request.body()).decode()})
    if model in ('stream', 'cut', 'stall'):
        async def chunks():
            yield STREAM[0]
            if model == 'cut':
                raise RuntimeError('the engine process was killed')
            if model == 'stall':
                await asyncio.sleep(3600)             # never resumes: only the read timeout ends the stream
            for c in STREAM[1:]:
                yield c
        return StreamingResponse(chunks(), media_type='text/event-stream')
    return JSONResponse(TURN)


async def _models(request):
    return JSONResponse({'data': [{'id': 'served', 'max_model_len': 64}]})


@pytest.fixture(scope='module')
def url():
    app = Starlette(routes=[Route('/v1/completions', _completions, methods=['POST']),
                            Route('/v1/models', _models, methods=['GET'])])
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(('127.0.0.1', 0))
    server = uvicorn.Server(uvicorn.Config(app, log_level='critical', access_log=False, timeout_graceful_shutdown=1))
    thread = threading.Thread(target=server.run, kwargs={'sockets': [sock]}, daemon=True)
    thread.start()
    while not server.started:
        assert thread.is_alive(), 'the test server stopped while starting'
        threading.Event().wait(0.02)
    yield f'http://127.0.0.1:{sock.getsockname()[1]}'
    server.should_exit = True
    thread.join(10)
    sock.close()


@pytest.fixture
def refused():
    """The URL of a port that is bound but not listening: every connection is refused."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(('127.0.0.1', 0))
    yield f'http://127.0.0.1:{sock.getsockname()[1]}'
    sock.close()


def _body(model):
    return {'model': model, 'prompt': PROMPT, 'max_tokens': 4}


def _died(url, detail):
    return (f'vllm server {url} died mid-run ({detail}); finished episodes are kept; fix: see the server log, '
            'restart it and rerun with --resume')


def test_a_turn_is_read_blocking_and_async(url):
    assert complete_ids(url, _body('ok')) == {'ids': [11, 12, 2], 'logp': [-0.5, -1.25, -0.125],
                                              'finish_reason': 'stop', 'stop_reason': 2}

    async def go():
        async with session(limit=2) as http:
            return await complete(http, url, _body('ok'))
    c = asyncio.run(go())
    assert (c.ids, c.logp, c.finish_reason, c.stop_reason, c.url) == ([11, 12, 2], [-0.5, -1.25, -0.125], 'stop', 2,
                                                                       url)
    assert json.loads(c.raw) == TURN


def test_the_body_is_sent_as_json_dumps_bytes(url):
    body = dict(_body('echo'), temperature=0.7, seed=None)
    got = json.loads(post(url, '/v1/completions', body, timeout=30))
    assert got == {'headers': 'application/json', 'bytes': json.dumps(body)}


def test_http_4xx_is_vllm_error_with_the_servers_text(url):
    msg = (f"vllm server {url}: /v1/completions answered HTTP 400: This model's maximum context length is 8 tokens; "
           'fix: see the message')
    for call in (lambda: complete_ids(url, _body('bad')), lambda: stream_ids(url, _body('bad'), print)):
        with pytest.raises(VLLMError) as err:
            call()
        assert type(err.value) is VLLMError and str(err.value) == msg

    async def go():
        async with session() as http:
            await complete(http, url, _body('bad'))
    with pytest.raises(VLLMError) as err:
        asyncio.run(go())
    assert type(err.value) is VLLMError and str(err.value) == msg


def test_http_5xx_and_a_refused_connection_are_server_died(url, refused):
    for call in (lambda: complete_ids(url, _body('dead')), lambda: stream_ids(url, _body('dead'), print)):
        with pytest.raises(ServerDied) as err:
            call()
        assert str(err.value) == _died(url, 'HTTP 500: EngineDeadError: engine core died')
        assert (err.value.url, err.value.detail) == (url, 'HTTP 500: EngineDeadError: engine core died')
    for call in (lambda: complete_ids(refused, _body('ok')), lambda: stream_ids(refused, _body('ok'), print)):
        with pytest.raises(ServerDied) as err:
            call()
        assert str(err.value) == _died(refused, 'ConnectError: [Errno 111] Connection refused')

    async def go():
        async with session() as http:
            await complete(http, refused, _body('ok'))
    with pytest.raises(ServerDied) as err:
        asyncio.run(go())
    assert err.value.detail == 'ConnectError: All connection attempts failed'        # anyio's words for a refusal


def test_an_sse_stream_calls_on_token_per_chunk_and_equals_the_turn(url):
    seen = []
    assert stream_ids(url, _body('stream'), seen.append) == complete_ids(url, _body('ok'))
    assert seen == [[11], [11, 12, 2]]
    with stream_lines(url, '/v1/completions', _body('stream'), timeout=30) as lines:
        assert list(lines) == [line for event in STREAM for line in event.splitlines(keepends=True)]


def test_a_stream_cut_or_stalled_mid_body_is_server_died(url):
    seen = []
    with pytest.raises(ServerDied) as err:
        stream_ids(url, _body('cut'), seen.append)
    assert err.value.detail == ('RemoteProtocolError mid-stream: peer closed connection without sending complete '
                                'message body (incomplete chunked read)')
    assert seen == [[11]]
    seen = []
    with pytest.raises(ServerDied) as err:
        stream_ids(url, _body('stall'), seen.append, timeout=0.5)
    assert err.value.detail == 'ReadTimeout mid-stream: timed out' and seen == [[11]]


def test_the_readiness_probe_reads_the_model_and_refuses_a_dead_one(url, refused):
    assert [tuple(vars(e).values()) for e in connect([url + '/v1/'])] == [(url, 'served', 64)]
    with pytest.raises(VLLMError) as err:
        connect([refused])
    assert str(err.value) == (f'vllm server {refused} is not ready (ConnectError: [Errno 111] Connection refused); '
                              'fix: start it, or pass the URL of a running `vllm.entrypoints.openai.api_server`')
    assert send(url, '/v1/completions', _body('dead'), timeout=30) == (500, b'EngineDeadError: engine core died')


def test_split_lines_keeps_line_ends_across_chunk_borders():
    assert list(split_lines([b'data: 1\n\nda', b'ta: 2\n', b'\n', b'end'])) == [b'data: 1\n', b'\n', b'data: 2\n',
                                                                                 b'\n', b'end']
    assert list(split_lines([])) == [] and list(split_lines([b'', b'x'])) == [b'x']


#: HTTP client modules no module of the package may import: every request goes through agentrl.engines.vllm.http
OTHER_HTTP = ('urllib.request', 'urllib.error', 'http.client', 'aiohttp', 'requests', 'httpx', 'urllib3')
#: the import lines that may name an HTTP library (only those files are parsed: parsing all takes ~1 s)
MAY_IMPORT_HTTP = re.compile(r'^\s*(?:import|from)\s[^\n]*\b(?:urllib|http|aiohttp|requests|httpx)', re.M)


def _imported(tree):
    """``(line, module)`` of every absolute import in ``tree`` (``from urllib import request``: ``urllib.request``)."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from ((node.lineno, a.name) for a in node.names)
        elif isinstance(node, ast.ImportFrom) and not node.level:
            yield from ((node.lineno, f'{node.module}.{a.name}') for a in node.names)


def test_the_package_has_one_http_library():
    src = Path(agentrl.__file__).parent
    bad, httpx2_users = [], []
    for path in sorted(src.rglob('*.py')):
        rel, text = str(path.relative_to(src)), path.read_text()
        for line, name in _imported(ast.parse(text)) if MAY_IMPORT_HTTP.search(text) else ():
            bad += [f'{rel}:{line} imports {name}' for m in OTHER_HTTP if name == m or name.startswith(m + '.')]
            httpx2_users += [rel] if name.split('.')[0] == 'httpx2' else []
    assert bad == []
    assert httpx2_users == ['engines/vllm/http.py']
