"""L5: the servers of an ``agentrl rollout`` job on a server backend: started (or connected) once, probed once.

``--server URL ...`` uses running servers (sticky routing: an episode stays on one); without it the
backend's rollout kit (:func:`~agentrl.engines.factory.rollout_kit`) starts a local server from
``--model`` for the job, stopped when the job ends, fails or is interrupted. The servers' log-prob
mode is probed once and declared by every record. Source: docs/design.md#engines, docs/vllm.md.
"""
from __future__ import annotations

import contextlib
from dataclasses import replace

from ..engines.factory import backend, rollout_kit

__all__ = ['server_run_spec', 'server_died_line']


@contextlib.contextmanager
def server_run_spec(prepared):
    """Yield the :class:`~agentrl.jobs.runner.RunSpec` to run ``prepared`` with (its own for other engines).

    For a backend with ``servers`` and the ``model`` policy: ``options.server`` = the servers' URLs
    (the local server's once it is ready) and ``logp_mode`` = the probed mode. The local server lives
    for the block.

    Raises:
        EngineError: a server that does not start or answer (one line: cause, fix, log), servers in
            different or logits log-prob modes. ValueError: a URL given twice.
    """
    opts = prepared.opts
    if not backend(opts.engine).servers or 'model' not in opts.policy:
        yield prepared.spec
        return
    from ..templates import ChatRecorder
    from .bugfix import BugFixAdapter, bugfix_template
    kit = rollout_kit(opts.engine)
    with contextlib.ExitStack() as stack:
        urls = list(opts.server or [])
        if not urls:
            srv = stack.enter_context(kit.start(opts.model, cpus=opts.vllm_cpus, python=opts.vllm_python,
                                                name=prepared.model['name'] if prepared.model else None))
            urls = [srv.url]
        endpoints = kit.connect(urls)
        opening = BugFixAdapter(prepared.tasks[:1]).openings()[0]
        mode = kit.probe(endpoints, ChatRecorder(bugfix_template(opts.model), opening).prompt_ids)
        yield replace(prepared.spec, options=replace(opts, server=urls), logp_mode=mode)


def server_died_line(err, out: str, total: int, command: str) -> str:
    """The one line of a server that died mid-run: which one, what is stored, the command that finishes the run."""
    head = str(err).split('; fix:')[0]
    stored = getattr(err, 'stored', None)
    kept = f'{stored} of {total} episodes are stored in {out!r}' if stored is not None else 'the finished shards are kept'
    return f'{head}; {kept}; fix: restart the server (see its log), then finish the run with: {command}'
