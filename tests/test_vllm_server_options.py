"""VLLMServer's options without a server: the argv and environment they give, and the fields they refuse."""
import sys
from pathlib import Path

import pytest

from agentrl.engines.vllm import VLLMServer, VLLMServerOptions


def test_default_options_give_the_documented_command(tmp_path):
    srv = VLLMServer(tmp_path, python=sys.executable)
    srv.port = 8123
    assert srv.command() == [
        sys.executable, '-m', 'vllm.entrypoints.openai.api_server', '--model', str(Path(tmp_path).resolve()),
        '--host', '127.0.0.1', '--port', '8123', '--dtype', 'float32', '--max-model-len', '2048',
        '--max-num-seqs', '32', '--no-enable-chunked-prefill', '--max-num-batched-tokens', '2048', '--enforce-eager',
        '--max-logprobs', '20', '--logprobs-mode', 'processed_logprobs', '--generation-config', 'vllm',
        '--served-model-name', tmp_path.name]
    assert (srv.name, srv.port, srv.logp_mode, srv.log_path, srv.options) == (
        tmp_path.name, 8123, 'processed', None, VLLMServerOptions())
    env = srv.environment()
    assert (env['VLLM_CPU_KVCACHE_SPACE'], env['HF_HUB_OFFLINE'], 'PYTHONPATH' in env) == ('1', '1', False)


def test_options_reach_the_command_and_the_environment(tmp_path):
    o = VLLMServerOptions(name='m', port=9000, max_model_len=512, max_num_seqs=1024, logprobs_mode='raw_logprobs',
                          kv_cache_gib=3, cpus='0-1', tools=True, extra_args=['--seed', 7])
    srv = VLLMServer(tmp_path, o, python='/py', log_path=tmp_path / 'log')
    cmd = srv.command()
    assert cmd[:4] == ['taskset', '-c', '0-1', '/py'] and cmd[-6:] == [
        'm', '--enable-auto-tool-choice', '--tool-call-parser', 'hermes', '--seed', '7']
    assert cmd[cmd.index('--max-num-batched-tokens') + 1] == '1024'        # max(max_model_len, max_num_seqs)
    assert (srv.url, srv.logp_mode, o.extra_args, srv.log_path) == ('http://127.0.0.1:9000', 'raw', ('--seed', '7'),
                                                                     tmp_path / 'log')
    assert srv.environment()['VLLM_CPU_KVCACHE_SPACE'] == '3'
    assert VLLMServerOptions(chunked_prefill=True, max_num_batched_tokens=256).max_num_batched_tokens == 256


@pytest.mark.parametrize('kw, message', [
    ({'logprobs_mode': 'raw_logits'}, "VLLMServerOptions.logprobs_mode = 'raw_logits': must be one of "
                                      "['processed_logprobs', 'raw_logprobs']; pass a recordable log-prob mode"),
    ({'max_model_len': 0}, 'VLLMServerOptions.max_model_len = 0: must be an int >= 1; pass the server flag of that '
                           'name'),
    ({'port': 70000}, 'VLLMServerOptions.port = 70000: must be None or an int in [1, 65535]; pass None to take a '
                      'free port'),
    ({'ready_timeout': 0}, 'VLLMServerOptions.ready_timeout = 0: must be > 0 seconds; pass how long to wait for the '
                           'first completion, e.g. 300'),
    ({'max_num_batched_tokens': 512}, 'VLLMServerOptions.max_num_batched_tokens = 512: must be >= max_model_len=2048 '
                                      'without chunked prefill; raise it to at least max_model_len'),
], ids=['logprobs_mode', 'max_model_len', 'port', 'ready_timeout', 'max_num_batched_tokens'])
def test_bad_options_are_refused_by_field(kw, message):
    with pytest.raises(ValueError) as e:
        VLLMServerOptions(**kw)
    assert str(e.value) == message


def test_the_server_takes_options_not_keywords(tmp_path):
    with pytest.raises(ValueError, match=r'^VLLMServer: options must be an agentrl.engines.vllm.VLLMServerOptions, '
                                         r'got dict$'):
        VLLMServer(tmp_path, {'name': 'm'})
    with pytest.raises(TypeError, match="unexpected keyword argument 'name'"):
        VLLMServer(tmp_path, name='m')
