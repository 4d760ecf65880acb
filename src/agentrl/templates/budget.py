"""L2: the render budget of a chat template: rendered characters and wall time per render call.

A chat template is code from the tokenizer's author (Jinja, sandboxed by transformers): nested loops
can run for ever and a loop can write hundreds of megabytes. :func:`bounded_render` runs one render
call under two bounds (docs/design.md#bounds) and turns a breach into a one-line ``ValueError`` naming
the template:

* characters: the compiled template's output is joined by a counting ``concat`` (the Jinja
  environment's own hook: ``Template.render`` returns ``environment.concat(chunks)``) that stops at
  ``AGENTRL_TEMPLATE_MAX_CHARS`` (default :data:`MAX_RENDER_CHARS`);
* time: a watchdog thread raises :class:`RenderTimeout` in the rendering thread
  (``PyThreadState_SetAsyncExc``, delivered between two Python bytecodes, in any thread) once
  ``AGENTRL_TEMPLATE_SECONDS`` (default :data:`RENDER_SECONDS`) have passed. Loops that write nothing
  are stopped too. One C-level operation (``'x' * 10**9``) is not interrupted; its output is still counted.

Source: Jinja ``Environment.concat`` and ``Template.render``; CPython ``PyThreadState_SetAsyncExc``.
"""
from __future__ import annotations

import ctypes
import math
import threading
import time
from typing import Callable

from ..io import env_bound

__all__ = ['MAX_RENDER_CHARS', 'RENDER_SECONDS', 'RenderTimeout', 'TemplateTimeoutError', 'bounded_render']

#: Default of ``AGENTRL_TEMPLATE_MAX_CHARS``: characters one render call may write.
MAX_RENDER_CHARS = 16 << 20
#: Default of ``AGENTRL_TEMPLATE_SECONDS``: wall-clock seconds one render call may take.
RENDER_SECONDS = 10.0


class RenderTimeout(BaseException):
    """Raised inside a render call past its time (a BaseException: no ``except Exception`` in Jinja swallows it)."""


class TemplateTimeoutError(ValueError):
    """A render call past ``AGENTRL_TEMPLATE_SECONDS`` (one line naming the template and the variable).

    A ValueError like every bad-template error, but never taken for "this template cannot render that
    shape": callers that probe shapes and note a ValueError as a finding re-raise this one, so a
    command stops at the first render that runs past its time instead of paying it once per probe.
    """


class _OverChars(BaseException):
    """Raised by the counting concat past the character bound."""


class _Watchdog:
    """One daemon thread watching every armed deadline; it raises :class:`RenderTimeout` in a late thread.

    The rendering thread takes no lock the watchdog holds: an entry is claimed by whichever side pops
    it from ``armed`` first (``dict.pop`` is atomic), so an exception is sent only to a thread that has
    not finished, and a thread that finds its entry claimed waits until the exception is sent, then
    drops it if it was not raised yet. Arming wakes the watchdog only when it would otherwise wake after
    the new deadline (``until``), so a render does not pay a thread switch; the watchdog sleeps until the
    nearest deadline it saw, and a stale one (its render finished) costs one wake and a rescan.
    """

    def __init__(self):
        self.armed: dict = {}           # token -> (deadline, thread id)
        self.sent: set = set()          # tokens whose thread was sent RenderTimeout
        self.wake = threading.Event()
        self.thread = None
        self.start_lock = threading.Lock()
        self.until = -math.inf          # when the watchdog wakes next (inf: never); -inf while it scans

    def arm(self, seconds: float) -> object:
        token = object()
        deadline = time.monotonic() + seconds
        self.armed[token] = (deadline, threading.get_ident())
        if self.thread is None or not self.thread.is_alive():
            with self.start_lock:
                if self.thread is None or not self.thread.is_alive():
                    self.thread = threading.Thread(target=self._run, name='agentrl-template-watchdog', daemon=True)
                    self.thread.start()
        if deadline < self.until:       # it would wake after this deadline, or is scanning: wake it (else it
            self.wake.set()             # wakes first and sees this entry; a render pays no thread switch)
        return token

    def finish(self, token) -> bool:
        """Called by the rendering thread after its render; True when its deadline had passed."""
        if self.armed.pop(token, None) is not None:
            return False
        try:                            # the watchdog claimed it: its exception is being sent
            while token not in self.sent:
                time.sleep(0)
            _drain_pending()
        except RenderTimeout:           # raised here rather than in the render: consumed
            pass
        self.sent.discard(token)
        return True

    def _run(self) -> None:
        while True:
            self.wake.clear()
            self.until = -math.inf      # an entry armed from here on wakes the wait below, or is seen by the scan
            now, nearest = time.monotonic(), None
            for token, (deadline, tid) in list(self.armed.items()):
                if deadline <= now:
                    if self.armed.pop(token, None) is not None:
                        ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(tid), ctypes.py_object(RenderTimeout))
                        self.sent.add(token)
                elif nearest is None or deadline < nearest:
                    nearest = deadline
            self.until = math.inf if nearest is None else nearest
            self.wake.wait(None if nearest is None else nearest - now)


_WATCHDOG = _Watchdog()


def _drain_pending() -> None:
    """Let a :class:`RenderTimeout` sent to this thread but not yet raised be raised here (the caller catches it).

    A pending asynchronous exception is raised at the next backward jump of the eval loop, so a short loop
    delivers it. It is not cleared with ``PyThreadState_SetAsyncExc(tid, NULL)``: on CPython 3.11 that
    signals the eval breaker with no exception to deliver, and the flag is never reset (only a thread that
    raises an async exception resets it), so every later call of the thread takes the slow path and a
    thread with a trace function set (``sys.settrace``) spins in it for ever.
    """
    for _ in range(10_000):
        pass


def _counting_concat(limit: int):
    def concat(chunks) -> str:
        out, n = [], 0
        for c in chunks:
            n += len(c)
            if n > limit:
                raise _OverChars(n)
            out.append(c)
        return ''.join(out)
    return concat


def _bound_output(source: str | None, limit: int) -> None:
    """Give the compiled template transformers renders ``source`` with a counting ``concat`` (idempotent).

    transformers compiles each template string once (``_compile_jinja_template``, cached) into a
    ``Template`` with its own environment; setting ``concat`` there bounds what ``render`` joins.
    Without that function (another transformers) only the time bound applies.
    """
    if not source:
        return
    try:
        from transformers.utils.chat_template_utils import _compile_jinja_template
        env = _compile_jinja_template(source).environment
    except Exception:  # noqa: BLE001 - not this transformers' layout, or a template that does not compile
        return
    if getattr(env.concat, 'agentrl_limit', None) != limit:
        env.concat = _counting_concat(limit)
        env.concat.agentrl_limit = limit


def bounded_render(render: Callable[[], str], source: str | None, name: str) -> str:
    """``render()`` under the template bounds; its text.

    Args:
        render: the render call (``tokenizer.apply_chat_template(..., tokenize=False)``).
        source: the Jinja source it renders (to bound its output); None: time bound only.
        name: the template as error messages name it (``"the chat template of 'Qwen/Qwen3-8B'"``).

    Returns:
        the rendered text (str), at most ``AGENTRL_TEMPLATE_MAX_CHARS`` characters.

    Raises:
        ValueError: ``NAME wrote more than N characters in one render call (AGENTRL_TEMPLATE_MAX_CHARS) ...``.
        TemplateTimeoutError: ``NAME took more than S s to render one call (AGENTRL_TEMPLATE_SECONDS) ...``
            (a ValueError), one line.
    """
    limit = env_bound('AGENTRL_TEMPLATE_MAX_CHARS', MAX_RENDER_CHARS)
    seconds = env_bound('AGENTRL_TEMPLATE_SECONDS', RENDER_SECONDS, kind=float)
    _bound_output(source, limit)
    late = False
    token = _WATCHDOG.arm(seconds)
    try:
        try:
            text = render()
        finally:
            late = _WATCHDOG.finish(token)
    except RenderTimeout:                    # raised in the render (or on the way into finish)
        late = True
        _WATCHDOG.sent.discard(token)
    except _OverChars as e:
        raise ValueError(f'{name} wrote more than {limit} characters in one render call ({e.args[0]} so far; '
                         'AGENTRL_TEMPLATE_MAX_CHARS): a loop in the template, or messages far too long; fix the '
                         'template, or raise AGENTRL_TEMPLATE_MAX_CHARS if you trust it') from None
    if late:
        raise TemplateTimeoutError(f'{name} took more than {seconds:g} s to render one call (AGENTRL_TEMPLATE_SECONDS): a '
                         'loop in the template that does not end; fix the template, or raise '
                         'AGENTRL_TEMPLATE_SECONDS if you trust it')
    if len(text) > limit:                    # a transformers whose template could not be given the counting concat
        raise ValueError(f'{name} wrote {len(text)} characters in one render call, over {limit} '
                         '(AGENTRL_TEMPLATE_MAX_CHARS); fix the template, or raise AGENTRL_TEMPLATE_MAX_CHARS')
    return text
