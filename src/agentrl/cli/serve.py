"""``agentrl serve --out RUN``: an OpenAI-compatible gateway that records harness calls token-exactly.

The first line printed is the bound address (``serving on http://HOST:PORT``); it is also in
``RUN/serve.json``. Restarting on the same ``--out`` resumes the open sessions from the journal.

Engines: ``--engine hf --model DIR`` (in this process), ``--server URL[,URL...] --model DIR``
(running vLLM servers; DIR is the served model's folder, for its tokenizer), ``--engine vllm
--model DIR`` (starts a local vLLM server, stopped when the gateway stops).
"""
from __future__ import annotations

import argparse
import os
import sys

from ..engines.factory import BACKENDS
from ..io import folder_lock
from .options import UserError


def register(sub) -> None:
    """Add this subcommand's parser (every flag documented) to ``sub`` and set ``func=run``."""
    p = sub.add_parser('serve', help='serve an OpenAI-compatible gateway that records harness traffic',
                       description='Serve POST /sessions, POST /s/TOKEN/v1/chat/completions and POST '
                                   '/sessions/TOKEN/finish in front of an engine; every call is journalled to '
                                   'RUN/journal.jsonl before its response is sent, and each finished session\'s '
                                   'branch leaves are stored in RUN/trajectories (check them with `agentrl check '
                                   'RUN --model DIR`). See docs/gateway.md.')
    p.add_argument('--out', required=True, metavar='RUN', help='run folder (created; an existing gateway run resumes)')
    p.add_argument('--engine', choices=[n for n, b in BACKENDS.items() if b.engine], default=None,
                   help='engine: hf (a Hugging Face model in this process, the default) or vllm (starts a local vLLM '
                        'server from --vllm-python; stopped on exit). With --server: vllm')
    p.add_argument('--engine-process', action='store_true',
                   help='--engine hf: sample in a child process over a pipe, so the engine\'s Python loop does not '
                        'hold the gateway\'s GIL (bench/RESULTS.md, "Recording gateway")')
    p.add_argument('--model', metavar='DIR', help='model folder (e.g. from `agentrl make-test-model`): the model of '
                                                  '--engine hf/vllm, or the tokenizer of the --server model')
    p.add_argument('--server', metavar='URL[,URL...]',
                   help='running vLLM server(s) (http://HOST:PORT); each session sticks to one server')
    p.add_argument('--vllm-python', metavar='PATH', default=None,
                   help='python of the vLLM venv for --engine vllm (default $AGENTRL_VLLM_PYTHON or '
                        '.venv-vllm/bin/python)')
    p.add_argument('--vllm-cpus', metavar='LIST', default=None, help='taskset -c core list for --engine vllm\'s server')
    p.add_argument('--concurrency', type=int, default=64,
                   help='vLLM requests in flight at once, all sessions together (--engine hf samples one at a time)')
    p.add_argument('--host', default='127.0.0.1', help='address to listen on (default 127.0.0.1)')
    p.add_argument('--port', type=int, default=0, help='port (0: a free port; printed and in RUN/serve.json)')
    p.add_argument('--device', default=None, help='torch device for --engine hf (default cuda if available)')
    p.add_argument('--max-new-tokens', type=int, default=256, help='default turn budget when a call sets no max_tokens')
    p.add_argument('--session-timeout', type=float, default=600.0,
                   help='seconds idle after which a session is committed as aborted')
    p.add_argument('--max-turns', type=int, default=256, help='calls per session (0: no limit)')
    p.add_argument('--max-prompt-tokens', type=int, default=0, help='prompt tokens per call (0: no limit)')
    p.add_argument('--max-output-tokens', type=int, default=0, help='sampled tokens per session (0: no limit)')
    p.add_argument('--max-body-bytes', type=int, default=8 << 20, help='request body size')
    p.add_argument('--max-concurrent', type=int, default=4, help='requests of one session in flight (0: no limit)')
    p.add_argument('--max-wall-s', type=float, default=0.0, help='session wall time in seconds (0: no limit)')
    p.add_argument('--pause-wait', type=float, default=30.0,
                   help='seconds a call is held while /admin/pause is on before it gets 429 + Retry-After')
    p.add_argument('--no-thinking', action='store_true', help='render with enable_thinking=False (Qwen3)')
    p.add_argument('--family', metavar='NAME', default=None,
                   help='model family that parses the replies (qwen3, generic ...; default: picked from the '
                        'tokenizer\'s chat template; docs/design.md#families)')
    p.add_argument('--no-conformance', action='store_true',
                   help='skip the start-up gate that records a fixture corpus bridge by bridge and compares it '
                        'with the full render')
    p.add_argument('--stream-interval', type=float, default=0.0, help=argparse.SUPPRESS)   # tests: pace SSE
    p.set_defaults(func=run)


def run(args) -> int:
    """Run the subcommand for parsed ``args``; return the exit code (errors raise ``UserError``, one line)."""
    from ..engines.factory import backend
    engine = args.engine or ('vllm' if args.server else 'hf')
    if args.server and not backend(engine).servers:
        raise UserError(f'--server is a vLLM server: drop --engine {engine} (or pass --engine vllm)')
    if not args.model:
        if args.server:
            raise UserError('--server needs --model DIR: the served model\'s folder (its tokenizer and fingerprint)')
        raise UserError(f'--engine {engine} needs --model DIR (make one with `agentrl make-test-model DIR`)')
    for name in ('port', 'max_new_tokens', 'max_turns', 'max_prompt_tokens', 'max_output_tokens', 'max_body_bytes',
                 'max_concurrent', 'concurrency'):
        v = getattr(args, name)
        if v < 0 or (name in ('max_new_tokens', 'max_body_bytes', 'concurrency') and v < 1) or \
                (name == 'port' and v > 65535):
            raise UserError(f'--{name.replace("_", "-")} is out of range: {v}')
    if not args.session_timeout > 0 or args.max_wall_s < 0:
        raise UserError('--session-timeout must be > 0 and --max-wall-s >= 0')
    try:
        import starlette  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError as e:
        raise ImportError(f'agentrl serve needs starlette and uvicorn ({e}); pip install agentrl[serve]') from None
    import contextlib
    import signal
    import threading

    def term(*_):                 # uvicorn hands SIGTERM back after its graceful stop; unwind, stop the engine
        raise _Stopped
    main = threading.current_thread() is threading.main_thread()
    old = signal.signal(signal.SIGTERM, term) if main else None
    try:
        with contextlib.ExitStack() as stack:
            return _serve(args, _upstream(args, engine, stack))
    except _Stopped:
        print('agentrl serve: stopped (SIGTERM)', file=sys.stderr)
        return 0
    finally:
        if main:
            signal.signal(signal.SIGTERM, old)


class _Stopped(BaseException):
    """SIGTERM arrived: stop serving, stop a local vLLM server, exit 0."""


def _upstream(args, engine: str, stack):
    """The engine of ``--engine`` (:func:`~agentrl.engines.factory.open_engine`); a local server it starts and
    a child process are stopped by ``stack``."""
    from ..engines.contract import EngineError
    from ..engines.factory import backend, open_engine, start_server
    b = backend(engine)
    if args.engine_process and b.child is None:
        raise UserError(f'--engine-process is for --engine hf (a {engine} server is already another process)')
    urls = [u.strip() for u in (args.server or '').split(',') if u.strip()]
    try:
        if b.servers and not urls:
            py = args.vllm_python or os.environ.get('AGENTRL_VLLM_PYTHON') or None
            os.makedirs(args.out, exist_ok=True)
            srv = stack.enter_context(start_server(engine, args.model, cpus=args.vllm_cpus, python=py,
                                                   log_path=os.path.join(args.out, f'{engine}-server.log')))
            print(f'agentrl serve: {engine} server {srv.url} (pid {srv.pid}) started', file=sys.stderr, flush=True)
            urls = [srv.url]
        up = open_engine(engine, model=args.model, device=args.device, max_new_tokens=args.max_new_tokens,
                         process=bool(args.engine_process), urls=urls, concurrency=args.concurrency)
    except (EngineError, ValueError) as e:
        if not b.servers:
            raise
        raise UserError(str(e)) from None
    stack.callback(up.close)
    return up


def _serve(args, upstream) -> int:
    from ..gateway import Gateway, Limits
    from ..gateway.server import Server
    limits = Limits(max_turns=args.max_turns, max_prompt_tokens=args.max_prompt_tokens,
                    max_output_tokens=args.max_output_tokens, max_body_bytes=args.max_body_bytes,
                    max_concurrent=args.max_concurrent, max_wall_s=args.max_wall_s)
    os.makedirs(args.out, exist_ok=True)
    with folder_lock(args.out):
        gw = Gateway(upstream, args.out, limits=limits, session_timeout=args.session_timeout,
                     template_options={'enable_thinking': False} if args.no_thinking else None,
                     conformance=not args.no_conformance, family=args.family)
        srv = Server(gw, args.host, args.port, stream_interval=args.stream_interval, pause_wait=args.pause_wait)
        open_ = sum(s.state == 'open' for s in gw.sessions.values())
        mode = f'; vllm log-probs {upstream.logp_mode}' if getattr(upstream, 'logp_mode', None) else ''
        for report in gw.conformance_report.values():        # the start-up gate's finding
            print(report['found'], file=sys.stderr, flush=True)
        print(f'serving on {srv.url} (sessions: POST {srv.url}/sessions; run {args.out}; '
              f'{open_} open sessions resumed{mode})', flush=True)
        srv.run()
    print('agentrl serve: stopped', file=sys.stderr)
    return 0
