"""``agentrl report`` speaks of stop reasons, not BugFix words, for imported and gateway records
(as ``agentrl check`` does); its truncation rate counts turns cut at ``max_tokens`` (``unterminated_turns``).
Gym runs keep their page (``solved``, ``submitted``)."""
import json
import re
from pathlib import Path

import pytest

from agentrl import store
from agentrl.cli.main import main

ROOT = Path(__file__).resolve().parents[1]
#: words of the BugFix gym that must not describe an imported record
GYM_WORDS = ('solved', 'submitted', 'budget', 'scripted', 'truncated')
HEAD = ('<table class="stats"><tr><th>policy</th><th>episodes</th><th>mean reward</th><th>stop reasons</th>'
        '<th>truncation</th><th>length mean</th><th>length max</th><th>action tokens</th><th>mask = policy</th>'
        '<th>context after each turn (1st ep.)</th></tr>')


def _report(capsys, run: Path) -> str:
    capsys.readouterr()
    assert main(['report', str(run)]) == 0
    assert re.fullmatch(rf'wrote {re.escape(str(run))}/report\.html: 1 episodes, 1 policy, \d+ KB in \d+\.\d s\n',
                        capsys.readouterr().out)
    return (run / 'report.html').read_text()


def _import(capsys, path: Path, out: Path) -> None:
    assert main(['import', str(path), '--from', 'vllm', '--out', str(out)]) == 0, capsys.readouterr().err


def test_report_of_the_vllm_example_speaks_of_finish_reasons(tmp_path, capsys):
    _import(capsys, ROOT / 'docs' / 'examples' / 'vllm_completions.jsonl', tmp_path / 'imp')
    page = _report(capsys, tmp_path / 'imp')
    assert (HEAD + '<tr><td>vllm</td><td>1</td><td>1.000</td><td>finish_reason stop 1</td><td>0%</td><td>10.0</td>'
            '<td>10</td><td>5.0</td><td>1/1</td><td>3 \u2192 [8, 10]</td></tr></table>') in page
    assert '<b>1</b> policies &middot; imported from <b>vllm_completions.jsonl</b> (vllm)</p>' in page
    assert ' &middot; stop <b>finish_reason stop</b> &middot; ' in page
    chart = page.split('<h3>Stop reasons (share of episodes)</h3>', 1)[1].split('</svg>', 1)[0]
    assert 'finish_reason stop' in chart
    for word in GYM_WORDS:
        assert word not in page, word


def test_report_counts_a_turn_cut_at_max_tokens_and_names_missing_log_probs(tmp_path, capsys):
    """Two exchanges: the first cut at max_tokens (finish_reason length), the last stopped; no logprobs."""
    req = {'temperature': 0.8, 'top_p': 1.0, 'top_k': 0, 'min_p': 0.0, 'repetition_penalty': 1.0,
           'presence_penalty': 0.0, 'frequency_penalty': 0.0, 'model': 'm'}

    def choice(ids, prompt, finish):
        return {'choices': [{'text': 'x', 'token_ids': ids, 'prompt_token_ids': prompt, 'finish_reason': finish}]}
    ep = {'exchanges': [{'request': dict(req, prompt=[1, 2, 3], max_tokens=2), 'response': choice([10, 11], [1, 2, 3], 'length')},
                        {'request': dict(req, prompt=[1, 2, 3, 10, 11, 60, 61]),
                         'response': choice([12, 7], [1, 2, 3, 10, 11, 60, 61], 'stop')}],
          'reward': 0.5, 'group_id': 'q1'}
    (tmp_path / 'ep.jsonl').write_text(json.dumps(ep) + '\n')
    _import(capsys, tmp_path / 'ep.jsonl', tmp_path / 'imp')
    rec, = store.read_trajectories(tmp_path / 'imp' / 'trajectories.parquet')
    assert rec.info['stop'] == 'submitted' and rec.info['template']['unterminated_turns'] == [0]   # the gym's word
    page = _report(capsys, tmp_path / 'imp')
    assert (HEAD + '<tr><td>vllm</td><td>1</td><td>0.500</td><td>finish_reason stop 1</td><td>100%</td><td>9.0</td>'
            '<td>9</td><td>4.0</td><td>1/1</td><td>3 \u2192 [7, 9]</td></tr></table>') in page
    assert ' &middot; logp <b>none (no sampling log-probs)</b> &middot; ' in page
    from agentrl.viz import build_strip, id_decoder
    [rec] = store.read_trajectories(tmp_path / 'imp')
    assert build_strip(rec, id_decoder).meta['logp'] == 'none (no sampling log-probs)'      # agentrl show's strip, the same words
    for word in GYM_WORDS:
        assert word not in page, word
    capsys.readouterr()
    assert main(['check', str(tmp_path / 'imp')]) == 0           # the same words as check
    out = capsys.readouterr().out.splitlines()
    assert out[4] == 'stops            finish_reason stop 1' and out[5].startswith('truncation rate  1.000  ')


def test_report_of_a_gateway_run_has_no_gym_words(tmp_path, capsys):
    """A real ``agentrl serve`` gateway (in process) over a small HF model: one turn cut at max_tokens."""
    pytest.importorskip('transformers')
    from _tokenizers import tokenizer_path
    from agentrl.engines import hf
    from agentrl.engines.hf.engine import HFEngine
    from agentrl.gateway import Gateway, parse_request
    model = hf.make_test_model(tmp_path / 'model', tokenizer_path('tiny'))
    gw = Gateway(HFEngine(model, device='cpu', max_new_tokens=24), tmp_path / 'run')
    try:
        _, s = gw.open_session({})
        body = {'messages': [{'role': 'user', 'content': 'Fix clamp.'}], 'max_tokens': 3, 'seed': 1}
        req, _ = parse_request(json.dumps(body).encode(), 1 << 20)
        assert gw.chat(s, req, 'd', 0)[0]['choices'][0]['finish_reason'] == 'length'
        assert gw.finish(s, 1.0, {'by': 'test'})['records'] == 1
    finally:
        gw.pool.shutdown()
        gw.journal.close()
    rec, = store.read_trajectories(tmp_path / 'run' / 'trajectories')
    page = _report(capsys, tmp_path / 'run')
    cells = re.search(r'<tr><td>hf</td>(.*?)</tr>', page).group(1)
    assert rec.info['gateway']['finish_reasons'] == ['length'] and rec.info['gateway']['truncated_turns'] == [0]
    assert HEAD in page and cells.startswith('<td>1</td><td>1.000</td><td>finish_reason length 1</td><td>100%</td>')
    assert 'class="notice"' not in page                       # a gateway run with summary.json is complete
    for word in GYM_WORDS:
        assert word not in page, word
    assert len(rec.info['template']['unterminated_turns']) == 1
    (tmp_path / 'run' / 'summary.json').unlink()              # a gateway still serving (or killed): no summary yet
    capsys.readouterr()
    assert main(['report', str(tmp_path / 'run')]) == 0
    note = ('incomplete: no summary.json (the gateway is still serving, or was killed: `agentrl serve --out '
            f"{tmp_path / 'run'}` resumes its open sessions)")
    assert capsys.readouterr().out.endswith(f'; {note}\n')


def test_a_page_mixing_gym_and_imported_records_keeps_each_ones_words(tmp_path, capsys):
    from agentrl.viz import report_html
    assert main(['rollout', '--policy', 'oracle', '--split', 'heldout', '--repeats', '1', '--out',
                 str(tmp_path / 'gym')]) == 0
    _import(capsys, ROOT / 'docs' / 'examples' / 'vllm_completions.jsonl', tmp_path / 'imp')
    gym = store.read_trajectories(tmp_path / 'gym' / 'trajectories')
    imp = store.read_trajectories(tmp_path / 'imp' / 'trajectories.parquet')
    page = report_html(gym + imp)
    assert ('<th>mean reward</th><th>solved</th><th>stops</th>' in page
            and '<tr><td>oracle</td><td>6</td><td>1.000</td><td>100%</td><td>submitted 6</td><td>0%</td>' in page)
    assert '<tr><td>vllm</td><td>1</td><td>1.000</td><td>\u2014</td><td>finish_reason stop 1</td><td>0%</td>' in page
