"""A vLLM server that dies mid-run: one line naming it; the episodes that ended are kept. Runs last (kills the server)."""
import os
import signal

import pytest

import agentrl as arl
from agentrl.engines import vllm
from agentrl.record import SamplingSpec


def test_a_server_killed_mid_run_is_one_line_naming_it_and_finished_episodes_are_kept(server, lm):
    """Last: kills the session's server."""
    template, tasks, done = vllm.bugfix_template(lm[1]), arl.make_tasks('all'), []

    def on_done(i, rec):
        done.append(i)
        if len(done) == 1:
            os.killpg(server.pid, signal.SIGKILL)

    with pytest.raises(vllm.ServerDied, match=rf'^vllm server {server.url} died mid-run \(\d+ of 12 episodes lost'
                                              r'.*finished episodes are kept') as err:
        vllm.bugfix_vllm_rollouts([server.endpoint], template, tasks[:12], seeds=list(range(12)), spec=SamplingSpec(),
                                  max_new_tokens=24, max_turns=6, on_done=on_done)
    assert '\n' not in str(err.value)
    assert sorted(err.value.finished) == sorted(done) and done
    assert all(r.info['tool_calls'] is not None for r in err.value.finished.values())
    line = str(server.died(wait=30))
    assert line.startswith(f'vllm server {server.url} (tiny) died (exit code -9)') and '\n' not in line
