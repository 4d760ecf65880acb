"""A vLLM server that dies mid-run: one line naming it; the episodes that ended are kept. Runs last (kills the server)."""
import os
import signal

import pytest

import agentrl as arl
from agentrl.engines import vllm
from agentrl.record import SamplingSpec
from agentrl.jobs.bugfix import BugFixOptions, bugfix_server_rollouts, bugfix_template


def test_a_server_killed_mid_run_is_one_line_naming_it_and_finished_episodes_are_kept(server, lm):
    """Last: kills the session's server."""
    template, tasks, done = bugfix_template(lm[1]), arl.make_tasks('all'), []

    def on_done(i, rec):
        done.append(i)
        if len(done) == 1:
            os.killpg(server.pid, signal.SIGKILL)

    with pytest.raises(vllm.ServerDied, match=rf'^vllm server {server.url} died mid-run \(\d+ of 12 episodes lost'
                                              r'.*finished episodes are kept') as err:
        bugfix_server_rollouts('vllm', [server.endpoint], template, tasks[:12], BugFixOptions(spec=SamplingSpec(), max_new_tokens=24, max_turns=6), seeds=list(range(12)), on_done=on_done)
    assert '\n' not in str(err.value)
    assert sorted(err.value.finished) == sorted(done) and done
    assert all(r.info['tool_calls'] is not None for r in err.value.finished.values())
    line = str(server.died(wait=30))
    assert line.startswith(f'vllm server {server.url} (tiny) died (exit code -9)') and '\n' not in line


def test_rollout_whose_server_dies_is_one_line_keeps_its_shards_and_resume_finishes_it(model_dir, vllm_py, tmp_path,
                                                                                      capsys):
    """After the test above (the session server is dead: one server at a time). A short-lived server is
    killed after the first chunk; ``--resume --model`` finishes the run on a local server it starts itself."""
    from agentrl import store
    from agentrl.cli.main import main
    from agentrl.jobs.plan import RolloutOptions
    from agentrl.jobs.rollout import rollout_job
    out = tmp_path / 'run'
    options = vllm.VLLMServerOptions(name='short', cpus=os.environ.get('AGENTRL_VLLM_CPUS', '1'), ready_timeout=600)
    srv = vllm.VLLMServer(model_dir, options, python=vllm_py, log_path=tmp_path / 'short.log')
    with srv:
        opts = RolloutOptions(engine='vllm', server=[srv.url], model=str(model_dir), split='heldout', repeats=1,
                              max_turns=2, max_new_tokens=16, chunk_size=2, seed=5, out=str(out))
        with pytest.raises(vllm.ServerDied) as err:
            rollout_job(opts, progress=False, handle_signals=False,
                        on_chunk=lambda state: os.killpg(srv.pid, signal.SIGKILL) if state.done == 2 else None)
    line = str(err.value)
    assert '\n' not in line
    assert line.startswith(f'vllm server {srv.url} died mid-run (2 of 2 episodes lost')
    assert line.endswith(f"; 2 of 6 episodes are stored in {str(out)!r}; fix: restart the server (see its log), then "
                         f'finish the run with: agentrl rollout --resume {out} --model {model_dir} --server {srv.url}')
    assert sorted(p.name for p in (out / 'trajectories').iterdir()) == ['part-000000.parquet']
    assert not (out / 'summary.json').exists() and not (out / '.lock').exists()
    capsys.readouterr()
    assert main(['rollout', '--resume', str(out), '--model', str(model_dir), '--vllm-python', str(vllm_py),
                 '--vllm-cpus', os.environ.get('AGENTRL_VLLM_CPUS', '1')]) == 0
    assert 'wrote 6 episodes' in capsys.readouterr().out
    recs = [r.record for rows in store.scan(out / 'trajectories') for r in rows]
    assert len(recs) == 6 and {r.provenance.policy for r in recs} == {'vllm'}
    assert main(['check', str(out)]) == 0
