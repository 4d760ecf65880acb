"""agentrl.engines.hf: token-in/token-out rollouts with a real transformer on the real Qwen3 template.

A small random Qwen3 (2 layers, hidden 64, the real tokenizer) is built once per module in a
temporary folder. Its end-of-turn and ``</think>`` tokens are raised to about 5% per token, so
turns end on their own and some hold reasoning that the template strips after a new user
message. CPU only, fp32.
"""
import dataclasses
import filecmp
import json

import pytest
import torch

from _tokenizers import load, tokenizer_path

pytest.importorskip('transformers')

import agentrl as arl  # noqa: E402
from agentrl.sampling import episode_seed  # noqa: E402
from agentrl import checks  # noqa: E402
from agentrl.engines.scorer import hf_scorer  # noqa: E402
from agentrl.checks.replay import replay_logp  # noqa: E402
from agentrl.engines import hf  # noqa: E402
from agentrl.record import OWNER, SamplingSpec  # noqa: E402
from agentrl.templates import ChatRecorder, ChatTemplate, tokenizer_fingerprint, turn_spans  # noqa: E402
from agentrl.jobs.bugfix import BugFixOptions, bugfix_opening, bugfix_rollouts, gym_call, parse_tool_calls  # noqa: E402

IM_END = 151645
T1 = SamplingSpec()
T07 = SamplingSpec(temperature=0.7, top_p=0.9)


@pytest.fixture(scope='module')
def model_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp('tiny-qwen3')
    return hf.make_test_model(out, tokenizer_path('qwen3'), token_rates={'</think>': 0.05})


@pytest.fixture(scope='module')
def lm(model_dir):
    return hf.load_model(model_dir)


@pytest.fixture(scope='module')
def model(lm):
    return lm[0]


@pytest.fixture(scope='module')
def tok(lm):
    return lm[1]


@pytest.fixture(scope='module')
def template(tok):
    return ChatTemplate(tok, tools=arl.TOOL_SCHEMAS)


@pytest.fixture(scope='module')
def tasks():
    return arl.make_tasks('all')


@pytest.fixture(scope='module')
def episodes_t1(model, tok, template, tasks):
    return bugfix_rollouts(model, tok, tasks[:4], BugFixOptions(spec=T1, max_new_tokens=24, max_turns=4, seed=3), template=template)


def prompts_of(template, n):
    return [template.encode(template.render([{'role': 'user', 'content': 'Fix clamp' + ' now' * k + '.'}], True))
            for k in range(n)]


def gens(seeds):
    return [torch.Generator().manual_seed(s) for s in seeds]


def max_diff(a, b):
    return max(max(abs(x - y) for x, y in zip(u.logp, v.logp)) for u, v in zip(a, b))


# ---------------------------------------------------------------------------- the test model
def test_make_test_model_is_a_small_qwen3_with_the_real_tokenizer(model_dir, model, tok):
    cfg = json.loads((model_dir / 'config.json').read_text())
    assert cfg['model_type'] == 'qwen3' and cfg['num_hidden_layers'] == 2 and cfg['hidden_size'] == 64
    assert cfg['vocab_size'] == len(tok) == 151669
    src = tokenizer_path('qwen3')
    for name in ('tokenizer.json', 'tokenizer_config.json', 'vocab.json', 'merges.txt'):
        assert filecmp.cmp(src / name, model_dir / name, shallow=False)
    assert tokenizer_fingerprint(tok) == tokenizer_fingerprint(load('qwen3'))
    note = json.loads((model_dir / 'agentrl_test_model.json').read_text())
    assert 0.03 < note['measured_rates']['<|im_end|>'] < 0.08 and 0.03 < note['measured_rates']['</think>'] < 0.08
    assert not model.training and next(model.parameters()).dtype == torch.float32


def test_make_test_model_rejects_bad_sizes(tmp_path):
    with pytest.raises(ValueError, match='hidden \\(30\\) must be divisible by heads \\(4\\)'):
        hf.make_test_model(tmp_path, tokenizer_path('qwen3'), hidden=30)
    with pytest.raises(ValueError, match='encodes to 2 tokens'):
        hf.make_test_model(tmp_path, tokenizer_path('qwen3'), token_rates={'-hi': 0.1})


# ---------------------------------------------------------------------------- the sampler
def test_padded_rows_equal_unpadded_runs(model, template):
    """Left padding with position_ids counting real tokens: a padded row scores like the prompt alone."""
    prompts = prompts_of(template, 3)                       # 3 lengths: the shorter ones are left-padded
    assert len({len(p) for p in prompts}) == 3
    cont = [template.encode('Read the source, then fix min and max.') for _ in prompts]
    for cache in (True, False):
        s = hf.HFSampler(model, template.stop_ids, T1, cache=cache)
        batched = s.sample(prompts, teacher=cont)
        alone = [s.sample([p], teacher=[c])[0] for p, c in zip(prompts, cont)]
        assert [t.ids for t in batched] == cont
        assert max_diff(batched, alone) < 1e-5
    # one left-padded forward pass over prompt + continuation against each unpadded pass: the last
    # hidden state at every real position, and the log-probs of every continuation position
    full = [p + c for p, c in zip(prompts, cont)]
    L, k = max(map(len, full)), len(cont[0])
    ids = torch.tensor([[0] * (L - len(f)) + f for f in full])
    mask = torch.tensor([[0] * (L - len(f)) + [1] * len(f) for f in full])
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    with torch.no_grad():
        out = model(input_ids=ids, attention_mask=mask, position_ids=pos, logits_to_keep=k, output_hidden_states=True)
        for b, f in enumerate(full):
            one = model(input_ids=torch.tensor([f]), logits_to_keep=k, output_hidden_states=True)
            assert (out.hidden_states[-1][b, L - len(f):] - one.hidden_states[-1][0]).abs().max() < 1e-5
            assert (out.logits[b].log_softmax(-1) - one.logits[0].log_softmax(-1)).abs().max() < 1e-5


def test_batched_and_one_by_one_give_the_same_logprobs(model, template):
    prompts = prompts_of(template, 4)
    for spec in (T1, T07):
        s = hf.HFSampler(model, template.stop_ids, spec, max_new_tokens=20)
        batched = s.sample(prompts, gens([11, 12, 13, 14]))
        teacher = [t.ids for t in batched]
        for cache in (True, False):
            one = hf.HFSampler(model, template.stop_ids, spec, max_new_tokens=20, cache=cache)
            alone = [one.sample([p], teacher=[ids])[0] for p, ids in zip(prompts, teacher)]
            assert [t.ids for t in alone] == teacher
            assert max_diff(batched, alone) < 1e-5
        # the per-episode generators make one-by-one sampling draw the same ids (near-uniform model:
        # a draw within rounding of a CDF boundary may pick a neighbour, so most rows, not all)
        redo = [s.sample([p], gens([g]))[0].ids for p, g in zip(prompts, [11, 12, 13, 14])]
        assert sum(r == t for r, t in zip(redo, teacher)) >= 2


def test_sampled_logp_is_the_processed_logprob(model, template):
    prompt = prompts_of(template, 1)[0]
    s = hf.HFSampler(model, template.stop_ids, T07, max_new_tokens=12)
    turn = s.sample([prompt] * 3, gens([1, 2, 3]))
    for t in turn:
        ids = prompt + t.ids
        with torch.no_grad():
            logits = model(input_ids=torch.tensor([ids])).logits[0, len(prompt) - 1:-1]
        want = replay_logp(logits, torch.tensor(t.ids), T07)
        raw = replay_logp(logits, torch.tensor(t.ids), SamplingSpec(temperature=0.7))
        assert (want - torch.tensor(t.logp, dtype=torch.float64)).abs().max() < 1e-4
        if any(i not in template.stop_ids for i in t.ids):   # non-stop tokens: the nucleus renormalises
            assert (want - raw).abs().max() > 1e-3
    # logp_mode='raw': the same draw, the unmodified log-softmax stored
    raw_spec = dataclasses.replace(T07, logp_mode='raw')
    r = hf.HFSampler(model, template.stop_ids, raw_spec, max_new_tokens=12).sample([prompt] * 3, gens([1, 2, 3]))
    assert [t.ids for t in r] == [t.ids for t in turn]
    for t in r:
        with torch.no_grad():
            logits = model(input_ids=torch.tensor([prompt + t.ids])).logits[0, len(prompt) - 1:-1]
        assert (replay_logp(logits, torch.tensor(t.ids), raw_spec) - torch.tensor(t.logp).double()).abs().max() < 1e-4


def test_stop_token_is_kept_and_budget_cut_is_truncated(model, template):
    prompts = prompts_of(template, 4) * 4
    s = hf.HFSampler(model, template.stop_ids, T1, max_new_tokens=12)
    turns = s.sample(prompts, gens(range(16)))
    stopped = [t for t in turns if not t.truncated]
    cut = [t for t in turns if t.truncated]
    assert stopped and cut
    for t in stopped:
        assert t.ids[-1] == IM_END and IM_END not in t.ids[:-1] and len(t.ids) <= 12
    for t in cut:
        assert len(t.ids) == 12 and IM_END not in t.ids
    with pytest.raises(ValueError, match='token budget of 0'):
        s.sample(prompts[:1], max_new_tokens=0)


# ---------------------------------------------------------------------------- episodes
def test_bugfix_records_keep_every_sampled_turn_verbatim(model, tok, template, tasks):
    seen = []

    class Spy(hf.HFSampler):
        def sample(self, prompts, generators=None, **kw):
            out = super().sample(prompts, generators, **kw)
            seen.append([(list(p), t) for p, t in zip(prompts, out)])
            return out

    spy = Spy(model, template.stop_ids, T1, max_new_tokens=16)
    trajs = bugfix_rollouts(model, tok, tasks[:3], BugFixOptions(max_turns=3, seed=1), sampler=spy, template=template)
    for i, traj in enumerate(trajs):
        spans = turn_spans(traj)
        assert len(spans) == len(traj.info['turn_tokens']) == traj.info['n_turns']
        # a turn whose history the template rewrites (a sampled '</think>' in content) has its own context
        contexts = {int(st): [int(x) for x in c] for st, c in (traj.turn_contexts or [])}
        for k, (turn, s, e) in enumerate(spans):
            prompt, sampled = seen[k][i]
            assert traj.ids[s:e].tolist() == sampled.ids                 # verbatim, never re-encoded
            assert contexts.get(s, traj.ids[:s].tolist()) == prompt      # the prompt the engine continued
            assert torch.allclose(traj.sample_logp[s - 1:e - 1], torch.tensor(sampled.logp, dtype=torch.float32))
            assert (traj.owner[s:e] == OWNER['policy']).all() and (traj.action_mask[s - 1:e - 1] == 1).all()
    # a text round trip would have changed some spans: the record holds what was sampled instead
    drift = hf.drift_rate(trajs, tok)
    assert drift.spans == sum(len(t.info['turn_tokens']) for t in trajs) and drift.drifting_spans > 0


def test_truncated_turns_have_no_end_of_turn_and_get_malformed(episodes_t1, tok):
    n_cut = n_stop = 0
    for traj in episodes_t1:
        cut = traj.info['truncated_turns']
        assert cut == traj.info['template']['unterminated_turns']
        for k, s, e in turn_spans(traj):
            span = traj.ids[s:e].tolist()
            if k in cut:
                n_cut += 1
                assert IM_END not in span and len(span) == 24
                assert traj.info['actions'][k] == '' and traj.info['tool_calls'][k] is None
            else:
                n_stop += 1
                assert span[-1] == IM_END and IM_END not in span[:-1]
            nxt = (traj.turn == k) & (traj.owner == OWNER['tool'])
            if nxt.any():
                obs = tok.decode(traj.ids[nxt].tolist())
                assert obs == 'error : malformed call'                   # a random model never calls a tool
    assert n_cut and n_stop
    for traj in episodes_t1:
        assert traj.info['stop'] == 'budget' and traj.reward == 0.0 and traj.info['n_invalid'] == 4


def test_provenance_of_hf_records(episodes_t1, tok, template, model_dir, tasks):
    for i, traj in enumerate(episodes_t1):
        p = traj.provenance
        assert p.policy == 'hf' and p.sampling == T1 and not p.logp_placeholder
        assert p.tokenizer == tokenizer_fingerprint(tok) and p.template == template.fingerprint
        assert p.model == str(model_dir.resolve()) and p.seed == episode_seed(3, f'3/hf/{tasks[i].name}', f'3/hf/{tasks[i].name}/{i}')
        # a turn cut at its budget is closed by a template-owned <|im_end|>; the validator knows it from
        # info['template']['unterminated_turns'] and still checks every sampled end-of-turn token
        arl.validate(traj, {'tokenizer': p.tokenizer, 'template': p.template, 'eot_ids': (IM_END,)})
    assert any(t.info['truncated_turns'] for t in episodes_t1), 'the fixture should include a cut turn'


def test_truncation_rate_counts_turns_cut_at_the_budget(episodes_t1, tmp_path, capsys):
    """The truncation rate is the fraction of episodes truncated: stop 'truncated' or a turn cut at its budget."""
    from agentrl import stats
    cut = sum(bool(t.info['truncated_turns']) for t in episodes_t1)
    assert 0 < cut and all(t.info['stop'] != 'truncated' for t in episodes_t1)
    assert [stats.is_truncated(t) for t in episodes_t1] == [bool(t.info['truncated_turns']) for t in episodes_t1]
    assert stats.PolicySummary.of(episodes_t1).truncation_rate == cut / len(episodes_t1)
    arl.write_trajectories(tmp_path / 'hf.parquet', episodes_t1)
    assert cli('check', tmp_path / 'hf.parquet') == 0
    assert (f'truncation rate  {cut / len(episodes_t1):.3f}  (episodes stopped truncated or with a turn cut at its '
            'budget)') in capsys.readouterr().out.splitlines()


def test_function_calls_drive_the_gym(model, tok, template, tasks):
    """Scripted turns (teacher-forced through the real model) exercise parsing, the gym and the bridge."""
    script = ['<think>\nRead first.\n</think>\n\n<tool_call>\n{"name":"read","arguments":{}}\n</tool_call>',
              '<tool_call>\n{"name": "fix", "arguments": {}}\n</tool_call>',
              '<tool_call>\n{"name": "edit", "arguments": {"op": "swap_minmax"}}\n</tool_call>',
              '<tool_call>\n{"name": "submit", "arguments": "{}"}\n</tool_call>']

    class Scripted(hf.HFSampler):
        calls = 0

        def sample(self, prompts, generators=None, **kw):
            ids = template.encode(script[self.calls]) + [IM_END]
            self.calls += 1
            return super().sample(prompts, generators, teacher=[ids] * len(prompts))

    trajs = bugfix_rollouts(model, tok, [tasks[0]], BugFixOptions(max_new_tokens=64), sampler=Scripted(model, template.stop_ids, T1), template=template)
    traj = trajs[0]
    assert tasks[0].name == 'clamp' and traj.reward == 1.0 and traj.info['stop'] == 'submitted'
    assert traj.info['actions'] == ['<call> read </call>', '', '<call> edit swap_minmax </call>',
                                    '<call> submit </call>']
    assert traj.info['tool_calls'][1] == [{'name': 'fix', 'arguments': {}}]
    tool = [tok.decode(traj.ids[(traj.turn == k) & (traj.owner == OWNER['tool'])].tolist()) for k in range(3)]
    assert [t.strip() for t in tool] == [arl.compact_source(arl.CLAMP_BUGGY).strip(), 'error : malformed call', 'ok']
    assert traj.ids[-1] == IM_END and traj.info['template']['unterminated_turns'] == []
    assert checks.replay_records(trajs, hf_scorer(model)).ok


@pytest.mark.parametrize('text, calls, gym', [
    ('<tool_call>\n{"name":"read","arguments":{}}\n</tool_call>', [('read', {})], '<call> read </call>'),
    ('<think>\n<tool_call>{"name": "submit", "arguments": {}}</tool_call>\n</think>\n\nno call', [], None),
    ('<tool_call>\n{"name": "edit", "arguments": {"op": "swap_minmax"}}\n</tool_call>',
     [('edit', {'op': 'swap_minmax'})], '<call> edit swap_minmax </call>'),
    ('<tool_call>\n{"name": "edit", "arguments": "{\\"op\\": \\"nope\\"}"}\n</tool_call>', [('edit', {'op': 'nope'})],
     '<call> edit nope </call>'),
    ('<tool_call>\n{"name": "read", "arguments": {}}\n</tool_call>\n<tool_call>\n{"name": "test", "arguments": {}}'
     '\n</tool_call>', [('read', {}), ('test', {})], None),
    ('<tool_call>\n{"name": "read", "arguments": {"path": "x"}}\n</tool_call>', [('read', {'path': 'x'})], None),
    ('<tool_call>\n{"name": "edit", "arguments": {"op": "swap minmax"}}\n</tool_call>',
     [('edit', {'op': 'swap minmax'})], None),
    ('<tool_call>\n{"name": "read", "arguments": {}\n</tool_call>', None, None),
    ('<tool_call>\n{"name": "read", "arguments": {}}\n', None, None),
    ('<tool_call>["read"]</tool_call>', None, None),
    ('<call> read </call>', [], None),
])
def test_parse_tool_calls_and_gym_mapping(text, calls, gym):
    assert parse_tool_calls(text) == calls
    assert gym_call(calls) == gym


def test_context_limit_stops_the_episode_truncated(model, tok, template, tasks):
    opening = len(ChatRecorder(template, bugfix_opening(tasks[0].issue)).prompt_ids)
    trajs = bugfix_rollouts(model, tok, tasks[:1], BugFixOptions(max_new_tokens=16, max_context=opening + 40), template=template)
    t = trajs[0]
    assert t.info['stop'] == 'truncated' and t.reward == 0.0 and t.info['task'] == tasks[0].name
    assert len(t.ids) <= opening + 40 + 40
    with pytest.raises(ValueError, match='no room for a turn'):
        bugfix_rollouts(model, tok, tasks[:1], BugFixOptions(max_context=opening), template=template)


# ---------------------------------------------------------------------------- the step-0 proof
def _max_abs(report):
    return max(float(r.log_ratio.abs().max()) for r in report.records if len(r.log_ratio))


def test_step0_plain_forward_matches_sample_logp_at_t1(model, episodes_t1):
    rep = checks.replay_records(episodes_t1, hf_scorer(model), batch_size=4)         # right-padded collate, one forward pass
    assert rep.ok and rep.overall.n == sum(int(t.action_mask.sum()) for t in episodes_t1)
    assert _max_abs(rep) < 1e-4
    assert len({len(t.ids) for t in episodes_t1}) > 1                   # the batch really was padded


def test_step0_at_t07_top_p09(model, tok, template, tasks):
    trajs = bugfix_rollouts(model, tok, tasks[4:7], BugFixOptions(spec=T07, max_new_tokens=16, max_turns=3), template=template)
    assert all(t.provenance.sampling == T07 for t in trajs)
    rep = checks.replay_records(trajs, hf_scorer(model))
    assert rep.ok and _max_abs(rep) < 1e-4
    # the stored values are the nucleus log-probs: replaying them at T=0.7 without top_p does not match
    t07 = SamplingSpec(temperature=0.7)
    other = [dataclasses.replace(t, provenance=dataclasses.replace(t.provenance, sampling=t07)) for t in trajs]
    assert not checks.replay_records(other, hf_scorer(model)).ok


@pytest.mark.parametrize('spec', [T1, T07], ids=['T1', 'T0.7-top_p0.9'])
def test_step0_per_turn_contexts_when_not_prefix_stable(model, tok, spec):
    """Thinking mode + a new user message: the template strips earlier reasoning; each turn is
    scored against its own sampling context and still matches."""
    template = ChatTemplate(tok)                                        # thinking mode (Qwen3's default)
    s = hf.HFSampler(model, template.stop_ids, spec, max_new_tokens=24)
    recs = [ChatRecorder(template, [{'role': 'user', 'content': f'Question {i}?'}]) for i in range(4)]

    def respond(i, turn, text):
        return hf.Reply(messages=[{'role': 'user', 'content': 'And one more thing?'}], action=text)

    trajs = hf.run_chat_episodes(s, recs, respond, seeds=range(4), max_turns=3)
    split = [t for t in trajs if t.turn_contexts is not None]
    assert split, 'no episode sampled reasoning that the template strips'
    assert all(not t.info['template']['prefix_stable'] for t in split)
    rep = checks.replay_records(trajs, hf_scorer(model))
    assert rep.ok and _max_abs(rep) < 1e-4
    assert sum(' turn ' in r.key for r in rep.records) >= 3
    # one forward pass over the final sequence scores earlier turns in the wrong context
    flat = checks.replay_records([dataclasses.replace(t, turn_contexts=None) for t in split[:1]], hf_scorer(model))
    assert not flat.ok


# ---------------------------------------------------------------------------- drift
def test_drift_experiment_reports_first_differing_tokens(model, tok):
    exp = hf.drift_experiment(model, tok, samples=4, tokens=24, seed=0)
    assert len(exp.samples) == 4 and exp.n_tokens == sum(len(s.ids) for s in exp.samples)
    for s in exp.samples:
        assert s.drifted == (s.reencoded != s.ids)
        if s.drifted:
            assert s.ids[:s.at] == s.reencoded[:s.at] and s.ids[s.at] != s.reencoded[s.at]
            assert s.sampled_tokens == tok.convert_ids_to_tokens(s.ids[s.at:s.at + 2])
    assert 'of 4 samples drift' in exp.format()


def test_drift_rate_counts_the_chapter_example(tok):
    rec = ChatRecorder(tok, [{'role': 'user', 'content': 'Name a flag.'}])
    turn = tok('Pass', add_special_tokens=False)['input_ids'] + [12, 6023] + [IM_END]       # '-', 'hi' as sampled
    rec.add_turn(turn, [-0.1] * len(turn))
    rate = hf.drift_rate([rec.finish()], tok)
    assert (rate.spans, rate.policy_tokens, rate.drifting_spans) == (1, 4, 1)
    assert rate.per_1000 == 250.0 and rate.affected_tokens == 3
    assert rate.examples[0][1].sampled == ['-', 'hi'] and rate.examples[0][1].other == ['-h', 'i']


# ---------------------------------------------------------------------------- CLI
def cli(*argv):
    from agentrl.cli.main import main
    return main([str(a) for a in argv])


def test_cli_make_test_model(tmp_path, capsys):
    assert cli('make-test-model', tmp_path / 'm', '--tokenizer', tokenizer_path('qwen3'), '--seed', 1) == 0
    out = capsys.readouterr().out
    assert 'wrote a 2-layer Qwen3 (hidden 64, 9,780,928 parameters)' in out and '<|im_end|>' in out
    assert (tmp_path / 'm' / 'config.json').is_file() and (tmp_path / 'm' / 'tokenizer.json').is_file()
    assert cli('make-test-model', tmp_path / 'x', '--tokenizer', tmp_path) == 2
    assert 'has no tokenizer_config.json' in capsys.readouterr().err
    m = tmp_path / 'm'
    assert cli('make-test-model', m, '--tokenizer', tokenizer_path('qwen3')) == 2       # its own folder: --force
    assert capsys.readouterr().err == (f"agentrl: error: {str(m)!r} already holds a model (config.json); pass --force "
                                       'to replace it, or choose another folder\n')
    assert cli('make-test-model', m, '--tokenizer', tokenizer_path('qwen3'), '--force') == 0
    capsys.readouterr()
    run = tmp_path / 'run'                      # any other non-empty folder (a rollout run): refused even with --force
    (run / 'trajectories').mkdir(parents=True)
    (run / 'run.json').write_text('{}')
    for force in ([], ['--force']):
        assert cli('make-test-model', run, '--tokenizer', tokenizer_path('qwen3'), *force) == 2
        assert capsys.readouterr().err == (f"agentrl: error: OUT {str(run)!r} is not empty and is not a "
                                           'make-test-model folder (no agentrl_test_model.json); choose a new or '
                                           'empty folder\n')
    assert sorted(p.name for p in run.iterdir()) == ['run.json', 'trajectories']
    (tmp_path / 'empty').mkdir()
    assert cli('make-test-model', tmp_path / 'empty', '--tokenizer', tokenizer_path('qwen3')) == 0


def test_cli_rollout_engine_hf_and_drift(model, model_dir, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(torch.cuda, 'is_available', lambda: False)     # CPU only, like the replay below
    out = tmp_path / 'run'
    assert cli('rollout', '--engine', 'hf', '--model', model_dir, '--split', 'heldout', '--repeats', '1',
               '--max-new-tokens', '8', '--max-turns', '2', '--temperature', '0.7', '--top-p', '0.9',
               '--out', out) == 0
    text = capsys.readouterr().out
    assert 'wrote 6 episodes to' in text and 'unk obs' not in text and 'None' not in text
    summary = json.loads((out / 'summary.json').read_text())
    from agentrl.jobs.rollout import model_fingerprint
    name = f'{model_dir.name}@{model_fingerprint(model_dir)}'       # a name and a fingerprint, never a local path
    assert list(summary['policies']) == ['model'] and summary['hf']['model'] == name
    assert str(tmp_path) not in (out / 'summary.json').read_text()
    assert summary['hf']['sampling'] == T07.to_dict()
    trajs = arl.read_trajectories(out / 'trajectories')
    assert len(trajs) == 6 and all(t.provenance.policy == 'hf' for t in trajs)
    assert {t.provenance.model for t in trajs} == {name}
    assert {t.provenance.group_id for t in trajs} == {f'0/model/{t.name}' for t in arl.make_tasks('heldout')}
    assert checks.replay_records(trajs, hf_scorer(model)).ok                        # step 0 holds after the Parquet round trip

    assert cli('drift', '--records', out / 'trajectories') == 0
    text = capsys.readouterr().out
    assert '6 records, ' in text and 'per 1,000 policy tokens' in text
    assert cli('drift', '--model', model_dir, '--samples', '3', '--tokens', '16') == 0
    assert 'of 3 samples drift' in capsys.readouterr().out


@pytest.mark.parametrize('argv, message', [
    (['rollout', '--engine', 'hf'], '--engine hf needs --model DIR with config.json'),
    (['rollout', '--model', '/nonexistent'], '--model is the Hugging Face model of --engine hf'),
    (['rollout', '--engine', 'hf', '--model', '{model}', '--top-p', '0'], '--top-p must be in (0, 1] (got 0); 1 turns it off'),
    (['drift'], 'pass --model DIR (sample and measure) or --records PATH'),
    (['drift', '--model', '/nonexistent'], "--model '/nonexistent' has no config.json"),
    (['drift', '--model', '{model}', '--samples', '100000000', '--tokens', '100000000'],
     '--samples must be <= 10000, got 100000000\n'),
    (['drift', '--model', '{model}', '--tokens', '100000000'], '--tokens must be <= 32768, got 100000000\n'),
    (['drift', '--model', '{model}', '--tokens', '4097'], "--tokens must be <= 4096 (the context of --model '{model}'), "
                                                         'got 4097\n'),
])
def test_cli_bad_input_is_one_line(argv, message, model_dir, tmp_path, capsys):
    argv = [a.replace('{model}', str(model_dir)) for a in argv]
    message = message.replace('{model}', str(model_dir))
    argv += ['--out', str(tmp_path)] if argv[0] == 'rollout' else []
    assert cli(*argv) == 2
    err = capsys.readouterr().err
    assert err.startswith(f'agentrl: error: {message}') and len(err.strip().splitlines()) == 1


def test_cli_truncated_weights_are_one_line(model_dir, tmp_path, capsys):
    """A cut model.safetensors: rollout and drift name the folder and the fix in one line."""
    import shutil
    bad = tmp_path / 'cut'
    shutil.copytree(model_dir, bad)
    with open(bad / 'model.safetensors', 'r+b') as f:
        f.truncate(5000)
    message = (f"agentrl: error: model {str(bad)!r} could not be loaded as a causal LM (SafetensorError: Error while "
               "deserializing header: incomplete metadata, file not fully covered); if its weights are damaged or "
               "partly copied, copy or download them again; else pass a folder written by save_pretrained\n")
    assert cli('rollout', '--engine', 'hf', '--model', bad, '--out', tmp_path / 'run') == 2
    assert capsys.readouterr().err.lstrip('\n') == message        # (the progress bar ends its line first)
    assert cli('drift', '--model', bad) == 2
    assert capsys.readouterr().err == message


def test_cli_drift_records_with_model_and_of_a_word_level_run(model_dir, tmp_path, capsys, monkeypatch):
    """--model with --records measures the records, then samples; a TinyAgent run is refused with what works."""
    monkeypatch.setattr(torch.cuda, 'is_available', lambda: False)
    hrun, wrun = tmp_path / 'hf', tmp_path / 'words'
    assert cli('rollout', '--engine', 'hf', '--model', model_dir, '--split', 'heldout', '--repeats', '1',
               '--max-new-tokens', '8', '--max-turns', '2', '--out', hrun) == 0
    assert cli('rollout', '--policy', 'oracle', '--split', 'heldout', '--repeats', '1', '--out', wrun) == 0
    capsys.readouterr()
    assert cli('drift', '--model', model_dir, '--records', hrun, '--samples', '2', '--tokens', '8') == 0
    out = capsys.readouterr().out
    assert out.startswith(f'drift over {hrun} (tokenizer {model_dir})\n6 records, ')
    assert f'drift experiment: 2 samples of up to 8 tokens from {model_dir} ' in out
    want = (f"agentrl: error: --records {str(wrun)!r} were sampled with agentrl's word-level tokenizer (TinyAgent or "
            'scripted policies), which has no tokenizer folder and cannot drift (its words decode and re-encode to '
            'the same ids); measure a run of `agentrl rollout --engine hf --model DIR`, or sample with `agentrl '
            'drift --model DIR`\n')
    for argv in (['--records', wrun], ['--model', model_dir, '--records', wrun]):
        assert cli('drift', *argv) == 2
        assert capsys.readouterr().err == want


def test_run_chat_episodes_refuses_a_reply_without_messages(model, template):
    s = hf.HFSampler(model, template.stop_ids, T1, max_new_tokens=2)
    rec = ChatRecorder(template, [{'role': 'user', 'content': 'Hi.'}])
    with pytest.raises(ValueError, match='respond returned no messages for running episode 0'):
        hf.run_chat_episodes(s, [rec], lambda i, turn, text: hf.Reply(), seeds=[0], max_turns=2)
    with pytest.raises(ValueError, match='max_turns must be >= 1'):
        hf.run_chat_episodes(s, [rec], lambda i, turn, text: hf.Reply(), max_turns=0)


@pytest.mark.parametrize('spec', [T1, SamplingSpec(temperature=0.7), SamplingSpec(temperature=0.0),
                                  SamplingSpec(temperature=0.8, logp_mode='raw'), T07,
                                  SamplingSpec(repetition_penalty=1.3, temperature=0.9)],
                         ids=['t1', 't07', 'greedy', 'raw', 'top_p', 'penalty'])
def test_choose_in_reused_buffers_is_bit_identical_to_the_one_sampler(model, spec):
    from agentrl.sampling import PenaltyContext, draw, processed_logp
    sampler = hf.HFSampler(model, (), spec)
    torch.manual_seed(0)
    ptrs = set()
    for n in (5, 3, 8, 2, 8):                       # shrink and grow: views of one [2, rows, V] buffer
        logits = torch.randn(n, 2000) * 4
        ctx = PenaltyContext.of([[1, 2, 3]] * n, [[4, 5]] * n) if spec.penalized else None
        seeds = [7 * n + r for r in range(n)]
        ids, logp = sampler.choose(logits, [torch.Generator().manual_seed(s) for s in seeds], context=ctx)
        lp = processed_logp(logits, spec, ctx)
        if spec.temperature <= 0:
            want = lp.argmax(-1)
        else:
            u = torch.stack([torch.rand((), dtype=torch.float64, generator=torch.Generator().manual_seed(s))
                             for s in seeds])
            want = draw(lp.exp(), u)
        if spec.logp_mode == 'raw' and spec.temperature > 0:
            lp = torch.log_softmax(logits.double(), -1)
        assert torch.equal(ids, want)
        assert torch.equal(logp, lp.gather(-1, want[:, None]).squeeze(-1))
        assert logp.dtype == torch.float64 and ids.shape == (n,)
        if sampler._buffers is not None:
            ptrs.add(sampler._buffers.data_ptr())
    reused = not spec.penalized and not (spec.temperature > 0 and spec.truncated)
    assert len(ptrs) == (2 if reused else 0)        # allocated at 5 rows, again at 8, then kept


def test_draw_inplace_refuses_weights_it_cannot_overwrite():
    from agentrl.sampling import draw
    w = torch.tensor([[0.2, 0.8]])
    with pytest.raises(ValueError, match=r'^draw: inplace=True needs contiguous float64 weights, got torch.float32$'):
        draw(w, torch.tensor([0.5], dtype=torch.float64), inplace=True)
    w64 = torch.tensor([[0.25, 0.75]], dtype=torch.float64)
    assert draw(w64, torch.tensor([0.5], dtype=torch.float64), inplace=True).tolist() == [1]
    assert w64.tolist() == [[0.25, 1.0]]             # the CDF, written over the weights
