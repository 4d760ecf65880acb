"""L5: the servers of an ``agentrl rollout --engine vllm`` job: started (or connected) once, probed once.

``--server URL ...`` uses running servers (sticky routing: an episode stays on one); without it a
local :class:`~agentrl.engines.vllm.VLLMServer` is started from ``--model`` for the job and stopped
by pid when the job ends, fails or is interrupted. The servers' log-prob mode is probed once
(:func:`~agentrl.engines.vllm.check_logp_mode`) and declared by every record. Source: docs/vllm.md.
"""
from __future__ import annotations

import contextlib
from dataclasses import replace

from ..engines.factory import backend

__all__ = ['vllm_run_spec', 'server_died_line']


@contextlib.contextmanager
def vllm_run_spec(prepared):
    """Yield the :class:`~agentrl.jobs.runner.RunSpec` to run ``prepared`` with (its own for other engines).

    For ``engine='vllm'`` with the ``model`` policy: ``options.server`` = the servers' URLs (the
    local server's once it is ready) and ``logp_mode`` = the probed mode. The local server lives
    for the block.

    Raises:
        VLLMError: a server that does not start or answer (one line: cause, fix, log), servers in
            different or logits log-prob modes. ValueError: a URL given twice.
    """
    opts = prepared.opts
    if not backend(opts.engine).servers or 'model' not in opts.policy:
        yield prepared.spec
        return
    from ..engines.vllm import VLLMServer, VLLMServerOptions, check_logp_mode, connect
    from .bugfix import BugFixAdapter, bugfix_template
    from ..templates import ChatRecorder
    with contextlib.ExitStack() as stack:
        urls = list(opts.server or [])
        if not urls:
            options = VLLMServerOptions(cpus=opts.vllm_cpus, name=prepared.model['name'] if prepared.model else None)
            srv = stack.enter_context(VLLMServer(opts.model, options, python=opts.vllm_python))
            urls = [srv.url]
        endpoints = connect(urls)
        opening = BugFixAdapter(prepared.tasks[:1]).openings()[0]
        mode = check_logp_mode(endpoints, ChatRecorder(bugfix_template(opts.model), opening).prompt_ids)
        yield replace(prepared.spec, options=replace(opts, server=urls), logp_mode=mode)


def server_died_line(err, out: str, total: int, command: str) -> str:
    """The one line of a server that died mid-run: which one, what is stored, the command that finishes the run."""
    head = str(err).split('; fix:')[0]
    stored = getattr(err, 'stored', None)
    kept = f'{stored} of {total} episodes are stored in {out!r}' if stored is not None else 'the finished shards are kept'
    return f'{head}; {kept}; fix: restart the server (see its log), then finish the run with: {command}'
