"""agentrl.interop without the frameworks: exact layouts, round trips, refusals, files and the CLI.

The checks against the real packages (TRL, verl) are in tests/interop/ (their own venv).
"""
import json
import re
import warnings
from pathlib import Path

import pytest
import torch

from agentrl import interop, store
from agentrl.checks import errors as E
from agentrl.record import OWNER, Provenance, SamplingSpec, Trajectory

EOT = 7
PAD = 0


def episode(k: int, turns: int = 2, group: str = 'g0', trailing: int = 2, spec=None, reward=None, stop='submitted'):
    """A multi-turn record: template+prompt, then per turn sampled ids ending in EOT and a bridge."""
    g = torch.Generator().manual_seed(k)
    ids, owner, turn, logp = [1, 2, 3 + k % 3], ['template', 'prompt', 'prompt'], [-1] * 3, [0.0] * 3
    ids += [4, 5]
    owner += ['template', 'template']
    turn += [-1, -1]
    logp += [0.0, 0.0]
    for t in range(turns):
        n = 2 + (k + t) % 3
        samp = torch.randint(10, 50, (n,), generator=g).tolist() + [EOT]
        ids += samp
        owner += ['policy'] * len(samp)
        turn += [t] * len(samp)
        logp += (-torch.rand(len(samp), generator=g) * 3).tolist()
        last = t == turns - 1
        if not last or trailing:
            tool = torch.randint(50, 90, (1 + t,), generator=g).tolist()
            br = [8, 9] + tool + [4, 5]
            own = ['template', 'template'] + ['tool'] * len(tool) + ['template', 'template']
            if last:
                br, own = br[:trailing], own[:trailing]
            ids += br
            owner += own
            turn += [t] * len(br)
            logp += [0.0] * len(br)
    prov = Provenance(policy='model', tokenizer='tok', template='tmpl', sampling=spec or SamplingSpec(), model='m',
                      group_id=group, rollout_id=f'r{k}', seed=k)
    return Trajectory.from_tokens(ids, owner, turn, logp, float(k % 2) if reward is None else reward,
                                  {'stop': stop, 'n_turns': turns}, provenance=prov)


@pytest.fixture
def recs():
    return [episode(k, turns=1 + k % 3, group=f'g{k // 2}') for k in range(6)]


def trimmed(r):
    pol = (r.owner == OWNER['policy']).nonzero().flatten()
    E_ = int(pol[-1]) + 1
    return r.ids[:E_], r.action_mask[:E_ - 1], r.sample_logp[:E_ - 1]


def assert_round_trip(orig, back, trim):
    assert len(orig) == len(back)
    for a, b in zip(orig, back):
        ids, mask, lp = trimmed(a) if trim else (a.ids, a.action_mask, a.sample_logp)
        assert torch.equal(b.ids, ids)
        assert torch.equal(b.action_mask, mask)
        assert torch.equal(b.sample_logp.view(torch.int32), lp.view(torch.int32))       # bit-exact
        assert torch.equal(b.owner == OWNER['policy'], (a.owner == OWNER['policy'])[:len(ids)])
        assert b.provenance.to_dict() == a.provenance.to_dict()
        assert b.reward == a.reward


# ---------------------------------------------------------------------------- exact layouts
def test_verl_layout_exact():
    r = episode(1, turns=2)
    P = int((r.owner == OWNER['policy']).nonzero()[0])
    d = interop.to_verl([r, episode(2, turns=1)], pad_id=PAD, prompt_length=8, response_length=40)
    b = d['batch']
    assert b['prompts'].shape == (2, 8) and b['responses'].shape == (2, 40)
    assert b['prompts'][0, 8 - P:].tolist() == r.ids[:P].tolist() and b['prompts'][0, :8 - P].eq(PAD).all()
    ids, mask, lp = trimmed(r)
    n = len(ids) - P
    assert b['responses'][0, :n].tolist() == ids[P:].tolist()
    assert b['response_mask'][0, :n].tolist() == mask[P - 1:].long().tolist()
    assert b['response_mask'][0, 0] == 1 and b['response_mask'][0, n:].eq(0).all()
    assert torch.equal(b['rollout_log_probs'][0, :n], lp[P - 1:])
    assert b['response_mask'].dtype == torch.long and b['rollout_log_probs'].dtype == torch.float32
    assert b['attention_mask'][0].sum() == len(ids)
    assert b['position_ids'][0, 8 - P:8 - P + 3].tolist() == [0, 1, 2] and b['position_ids'][0, 0] == 0
    assert b['rm_scores'][0, n - 1] == r.reward and b['rm_scores'][0].sum() == r.reward
    assert int(b['response_mask'].sum()) == int(r.action_mask.sum()) + int(episode(2, turns=1).action_mask.sum())
    assert d['non_tensor_batch']['uid'].tolist() == ['g0', 'g0']
    assert d['non_tensor_batch']['__num_turns__'].tolist() == [2, 1]


def test_trl_layout_exact():
    a, b = episode(3, turns=2), episode(4, turns=1, trailing=0)
    d = interop.to_trl([a, b], pad_id=PAD)
    P = int((a.owner == OWNER['policy']).nonzero()[0])
    ids, mask, lp = trimmed(a)
    C = len(ids) - P
    assert d['prompt_ids'].shape[1] == P and d['prompt_mask'].all()
    assert d['completion_ids'][0, :C].tolist() == ids[P:].tolist()
    assert d['tool_mask'][0, :C].tolist() == mask[P - 1:].long().tolist()
    Cb = int(d['completion_mask'][1].sum())
    assert d['tool_mask'][1, Cb:].eq(1).all(), 'TRL pads tool_mask with 1'
    assert d['completion_ids'][1, Cb:].eq(PAD).all() and d['sampling_per_token_logps'][1, Cb:].eq(0).all()
    assert d['completion_ids'][0, C - 1] == EOT, 'trimmed: the last completion token is the EOS'
    loss = d['completion_mask'] * d['tool_mask']
    assert int(loss.sum()) == int(a.action_mask.sum() + b.action_mask.sum())


def test_openrlhf_is_identity_and_prime_rl_full_length(recs):
    d = interop.to_openrlhf(recs, pad_id=PAD)
    for i, r in enumerate(recs):
        T = len(r.ids)
        assert torch.equal(d['action_mask'][i, :T - 1], r.action_mask.long())
        assert torch.equal(d['rollout_log_probs'][i, :T - 1], r.sample_logp)
    rows = interop.to_prime_rl(recs)
    for r, s in zip(recs, rows):
        assert s['mask'] == [False] + r.action_mask.bool().tolist() and len(s['logprobs']) == len(s['token_ids'])
        assert s['logprobs'][1:] == r.sample_logp.tolist()
    g0 = [s['advantages'] for s in rows[:2]]
    m = (recs[0].reward + recs[1].reward) / 2
    assert max(g0[0]) == pytest.approx(max(recs[0].reward - m, 0)) or min(g0[0]) == pytest.approx(recs[0].reward - m)


def test_sft_rows_train_exactly_the_action_tokens(recs):
    for form in interop.SFT_FORMS:
        rows = interop.to_sft(recs, form=form)
        for r, row in zip(recs, rows):
            assert len(row[form]) == len(row['input_ids']) == len(r.ids)
            trained = sum(x != -100 for x in row[form]) if form == 'labels' else sum(row[form])
            assert trained == int(r.action_mask.sum())
            if form != 'labels':
                assert row[form][1:] == r.action_mask.long().tolist() and row[form][0] == 0


# ---------------------------------------------------------------------------- round trips
@pytest.mark.parametrize('trim', [False, True])
def test_round_trips_bit_exact(recs, trim):
    assert_round_trip(recs, interop.from_verl(interop.to_verl(recs, pad_id=PAD, trim=trim)), trim)
    assert_round_trip(recs, interop.from_trl(interop.to_trl(recs, pad_id=PAD, trim=trim)), trim)
    assert_round_trip(recs, interop.from_trl(interop.to_trl_rollout(recs, trim=trim)), trim)
    assert_round_trip(recs, interop.from_slime(interop.to_slime(recs, trim=trim)), trim)
    assert_round_trip(recs, interop.from_skyrl(interop.to_skyrl(recs, trim=trim)), trim)
    if not trim:
        assert_round_trip(recs, interop.from_openrlhf(interop.to_openrlhf(recs)), False)
        assert_round_trip(recs, interop.from_prime_rl(interop.to_prime_rl(recs)), False)


def test_round_trips_rebuild_owners_from_the_mask(recs):
    """What a round trip keeps (docs/interop.md): ids, mask, log-probs, rewards, provenance and turns exactly;
    owners are rebuilt from the mask, so template tokens become prompt (before the first sampled token) or tool."""
    a = recs[1]
    assert a.owner.tolist() == [0, 1, 1, 0, 0, 2, 2, 2, 2, 0, 0, 3, 0, 0, 2, 2, 2, 2, 2, 0, 0]
    rebuilt = [1, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3, 3, 2, 2, 2, 2, 2, 3, 3]
    backs = {'verl': interop.from_verl(interop.to_verl(recs, pad_id=PAD, trim=False)),
             'trl': interop.from_trl(interop.to_trl(recs, pad_id=PAD, trim=False)),
             'trl_rollout': interop.from_trl(interop.to_trl_rollout(recs, trim=False)),
             'slime': interop.from_slime(interop.to_slime(recs, trim=False)),
             'skyrl': interop.from_skyrl(interop.to_skyrl(recs, trim=False)),
             'openrlhf': interop.from_openrlhf(interop.to_openrlhf(recs)),
             'prime_rl': interop.from_prime_rl(interop.to_prime_rl(recs))}
    for fw, back in backs.items():
        b = back[1]
        assert (fw, b.owner.tolist()) == (fw, rebuilt)
        assert (fw, b.turn.tolist()) == (fw, a.turn.tolist())
        assert (fw, b.info) == (fw, a.info)
        assert_round_trip(recs, back, False)


def test_import_without_agentrl_fields_rebuilds_owner_and_turns(recs):
    d = interop.to_verl(recs, pad_id=PAD, trim=False)
    del d['non_tensor_batch']['agentrl_provenance'], d['non_tensor_batch']['agentrl_info']
    back = interop.from_verl(d, spec=SamplingSpec(temperature=0.7))
    for a, b in zip(recs, back):
        assert torch.equal(b.action_mask, a.action_mask)
        assert b.provenance.policy == 'verl' and b.provenance.sampling.temperature == 0.7
        assert b.provenance.group_id == a.provenance.group_id
        pol = a.owner == OWNER['policy']
        assert torch.equal(b.turn[pol], a.turn[pol]), 'turn k = the k-th run of policy tokens'
        P = int(pol.nonzero()[0])
        assert set(b.owner[:P].tolist()) == {OWNER['prompt']} and set(b.owner[P:][~pol[P:]].tolist()) == {OWNER['tool']}


# ---------------------------------------------------------------------------- refusals
def test_mask_of_length_T_minus_1_is_refused():
    r = episode(5)
    T = len(r.ids)
    with pytest.raises(E.MaskAlignmentError, match=r'assistant_masks.*has 1\d entries|ids\[1:\]'):
        interop.check_sft_row({'input_ids': r.ids.tolist(), 'assistant_masks': r.action_mask.long().tolist()})
    row = interop.to_prime_rl([r])[0]
    row['mask'] = row['mask'][1:]
    with pytest.raises(E.MaskAlignmentError, match=rf'mask: from_prime_rl row 0: has length {T - 1} but {T} tokens'):
        interop.from_prime_rl([row])
    d = interop.to_trl_rollout([r])
    d['env_mask'][0] = d['env_mask'][0][1:]
    with pytest.raises(E.MaskAlignmentError, match='env_mask'):
        interop.from_trl(d)


def test_logprob_length_refused():
    d = interop.to_trl_rollout([episode(5)])
    d['logprobs'][0] = d['logprobs'][0][:-2]
    with pytest.raises(E.LogProbLengthError, match='logprobs: from_trl row 0: has .* log-probs for'):
        interop.from_trl(d)


def test_group_not_contiguous_refused_and_sorted(recs):
    shuffled = [recs[0], recs[2], recs[1], recs[3], recs[4], recs[5]]
    for fn in (interop.to_trl_rollout, interop.to_slime, interop.to_openrlhf):
        with pytest.raises(E.GroupOrderError, match="group 'g0' has rows 0 and 2"):
            fn(shuffled)
    interop.to_verl(shuffled, pad_id=PAD)          # verl groups by uid: fine
    assert [r.provenance.group_id for r in interop.sort_by_group(shuffled)] == ['g0', 'g0', 'g1', 'g1', 'g2', 'g2']
    with pytest.raises(E.GroupOrderError, match='sizes'):
        interop.to_trl_rollout(recs[:3])


def test_support_mismatch_refused_or_warned():
    spec = SamplingSpec(temperature=0.7, top_p=0.9)
    rs = [episode(k, spec=spec, group=f'g{k}') for k in range(2)]
    with pytest.raises(E.SupportMismatchError, match=r'step-0 ratio is each token.s kept mass, in \[0.9, 1\]'):
        interop.to_verl(rs, pad_id=PAD)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter('always')
        d = interop.to_verl(rs, pad_id=PAD, allow_support_mismatch=True)
    assert [(w.category, str(w.message)) for w in caught] == [(interop.SupportMismatchWarning, (
        "2 of 2 records (the first: record 0) were sampled with {'temperature': 0.7, 'top_k': 0, 'top_p': 0.9, "
        "'min_p': 0.0, 'logp_mode': 'processed'}, but verl recomputes log_softmax(logits / T) over the full "
        "vocabulary; the worst step-0 ratio is each token's kept mass, in [0.9, 1] (top_p=0.9); below 1 wherever "
        'the nucleus cut'))]
    assert issubclass(interop.SupportMismatchWarning, UserWarning)
    assert d['meta_info']['temperature'] == 0.7
    interop.to_slime(rs)                             # slime replays the top-p keep set
    with pytest.raises(E.SupportMismatchError):
        interop.to_slime([episode(0, spec=SamplingSpec(top_k=20))])
    with warnings.catch_warnings():
        warnings.simplefilter('error')
        interop.to_trl_rollout([episode(0, spec=SamplingSpec(temperature=1.0, top_k=5, logp_mode='raw'))])


def test_greedy_records_refused_for_rl_with_the_right_reason():
    """Greedy (temperature 0) records: the message says why (argmax picks), not a top-k/top-p kept mass."""
    rs = [episode(k, spec=SamplingSpec(temperature=0.0), group=f'g{k}') for k in range(2)]
    msg = ("provenance.sampling: record 0 was decoded greedily (temperature 0): its tokens are argmax picks, "
           "not samples, and its stored log-probs are the argmax's at temperature 1, not the probability of the token "
           'under the sampler that chose it; a policy-gradient update in verl on them is biased. Fix: sample RL '
           'records with temperature > 0 (e.g. 1.0), export greedy records for SFT (--to sft), or pass '
           'allow_support_mismatch=True (--allow-support-mismatch) to export them scored at temperature 1 '
           '(step-0 ratio exactly 1)')
    with pytest.raises(E.SupportMismatchError, match=f'^{re.escape(msg)}$'):
        interop.to_verl(rs, pad_id=PAD)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter('always')
        d = interop.to_verl(rs, pad_id=PAD, allow_support_mismatch=True)
    assert [str(w.message) for w in caught] == [
        "2 of 2 records (the first: record 0) were sampled with {'temperature': 0.0, 'top_k': 0, 'top_p': 1.0, "
        "'min_p': 0.0, 'logp_mode': 'processed'}, but verl recomputes log_softmax(logits / T) over the full "
        "vocabulary; the worst step-0 ratio is exactly 1 when scored at temperature 1 (the stored log-prob is the "
        "argmax's at temperature 1), but the tokens are argmax picks, not samples of that distribution: the update "
        'is biased']
    assert d['meta_info']['temperature'] == 1.0       # never 0: the trainer divides the logits by it
    assert len(interop.to_sft(rs)) == 2


def test_placeholder_logp_refused_for_rl_but_fine_for_sft():
    r = episode(1)
    r.provenance.logp_placeholder = True
    with pytest.raises(E.ScriptedRecordError, match='placeholder'):
        interop.to_trl_rollout([r])
    assert interop.to_sft([r])[0]['assistant_masks'][0] == 0


def test_verl_widths_refused():
    with pytest.raises(ValueError, match='prompt_length 2; verl would left-truncate'):
        interop.to_verl([episode(1)], pad_id=PAD, prompt_length=2)


# ---------------------------------------------------------------------------- OpenAI-compatible responses
def completion_episode():
    return {'exchanges': [
        {'request': {'prompt': [1, 2, 3], 'temperature': 0.8, 'top_p': 1.0, 'top_k': 0, 'min_p': 0.0,
                     'repetition_penalty': 1.0, 'presence_penalty': 0.0, 'frequency_penalty': 0.0, 'model': 'm'},
         'response': {'choices': [{'text': 'x', 'token_ids': [10, 11, EOT], 'prompt_token_ids': [1, 2, 3],
                                   'logprobs': {'token_logprobs': [-0.5, -0.25, -0.125]}, 'finish_reason': 'stop'}]}},
        {'request': {'prompt': [1, 2, 3, 10, 11, EOT, 60, 61], 'temperature': 0.8},
         'response': {'output_ids': [12, EOT],
                      'meta_info': {'output_token_logprobs': [[-1.0, 12, None], [-2.0, EOT, None]],
                                    'finish_reason': {'type': 'length'}}}}],
        'reward': 1.0, 'group_id': 'q1'}


def test_openai_completion_and_sglang_import():
    ep = completion_episode()
    ep['exchanges'][1]['request']['input_ids'] = ep['exchanges'][1]['request']['prompt']
    with pytest.raises(ValueError, match=r"^episode 0 exchange 1: response is an SGLang /generate response but --from "
                                         r"is 'vllm', so the mode of its log-probs is not known; pass --from sglang, or "
                                         r"--logp-mode processed, raw or scaled \(logp_mode=\)$"):
        interop.from_openai([ep], source='vllm', strict_sampling=True)          # two servers, one default: unknown
    [r] = interop.from_openai([ep], source='vllm', strict_sampling=True, logp_mode='raw')     # every field sent
    assert r.ids.tolist() == [1, 2, 3, 10, 11, EOT, 60, 61, 12, EOT]
    assert r.owner.tolist() == [1, 1, 1, 2, 2, 2, 3, 3, 2, 2]
    assert r.sample_logp.tolist() == [0, 0, -0.5, -0.25, -0.125, 0, 0, -1.0, -2.0]
    assert r.provenance.sampling == SamplingSpec(temperature=0.8, logp_mode='raw')
    assert r.provenance.group_id == 'q1' and r.info['stop'] == 'truncated'


def test_openai_library_import_is_strict_about_sampling_fields_by_default():
    """As ``agentrl import``: a sampler field the request leaves out is refused, unless strict_sampling=False."""
    ep = completion_episode()
    ep['exchanges'][0]['request'] = {'prompt': [1, 2, 3], 'temperature': 0.8, 'model': 'm'}
    ep['exchanges'][1]['request']['input_ids'] = ep['exchanges'][1]['request']['prompt']
    with pytest.raises(ValueError) as e:
        interop.from_openai([ep])
    assert str(e.value) == ('episode 0 exchange 0: request: has no top_p, top_k, min_p, repetition_penalty, '
                            'presence_penalty, frequency_penalty; the server filled them from its defaults, so the '
                            'record cannot declare what ran. Fix: send every sampling field, or pass the sampler '
                            '(--temperature/--top-p/... or spec=) or the generation_config.json the server read '
                            '(--generation-config)')
    [r] = interop.from_openai([ep], strict_sampling=False, logp_mode='raw')
    assert r.provenance.sampling == SamplingSpec(temperature=0.8, logp_mode='raw')
    assert r.info['import']['sampling_sources'] == {'temperature': 'request', 'top_p': 'absent', 'top_k': 'absent',
                                                    'min_p': 'absent', 'repetition_penalty': 'absent',
                                                    'presence_penalty': 'absent', 'frequency_penalty': 'absent'}


def test_openai_response_without_token_ids_refused():
    ep = completion_episode()
    del ep['exchanges'][0]['response']['choices'][0]['token_ids']
    with pytest.raises(E.MissingTokenIdsError, match='token_ids: exchange 0 response has no output token ids'):
        interop.from_openai([ep])


# ---------------------------------------------------------------------------- files and CLI
def test_export_files_and_manifest(tmp_path, recs):
    for fw in interop.EXPORTS:
        m = interop.export(recs, fw, tmp_path / fw, pad_id=PAD)
        assert json.loads((tmp_path / fw / 'manifest.json').read_text()) == m
        assert m['records'] == len(recs) and all((tmp_path / fw / f).exists() for f in m['files'])
        assert not [p for p in (tmp_path / fw).iterdir() if p.name.startswith('.')], 'no temporary file left'
    import pyarrow.parquet as pq
    t = pq.read_table(tmp_path / 'sft' / 'sft.parquet')
    assert t.column_names == ['input_ids', 'assistant_masks']
    for fw in ('verl', 'trl', 'slime', 'openrlhf', 'skyrl', 'prime-rl'):
        back = interop.import_records(tmp_path / fw, fw)
        assert_round_trip(recs, back, trim=fw in ('verl', 'trl', 'skyrl'))


def cli(*argv):
    from agentrl.cli.main import main
    return main([str(a) for a in argv])


def test_cli_export_import_check(tmp_path, recs, capsys):
    store.write_trajectories(tmp_path / 'run' / 'trajectories.parquet', recs)
    assert cli('export', tmp_path / 'run', '--to', 'verl', '--out', tmp_path / 'v', '--pad-id', PAD, '--no-trim') == 0
    assert 'wrote 6 records for verl' in capsys.readouterr().out
    assert cli('import', tmp_path / 'v', '--from', 'verl', '--out', tmp_path / 'back') == 0
    back = store.read_trajectories(tmp_path / 'back' / 'trajectories.parquet')
    assert_round_trip(recs, back, trim=False)
    assert json.loads((tmp_path / 'back' / 'summary.json').read_text())['episodes'] == 6
    assert cli('check', tmp_path / 'back' / 'trajectories.parquet', '--eot-id', EOT) == 0
    assert cli('show', tmp_path / 'back' / 'trajectories.parquet', '--format', 'svg', '--out', tmp_path / 's.svg') == 0
    assert cli('report', tmp_path / 'back') == 0 and (tmp_path / 'back' / 'report.html').exists()
    # the silent shift: a response_mask built from action_mask[P:] instead of action_mask[P-1:]
    d = interop.load_export(tmp_path / 'v', 'verl')
    d['batch']['response_mask'] = torch.roll(d['batch']['response_mask'], -1, dims=1)
    d['batch']['response_mask'][:, -1] = 0
    for k in ('agentrl_provenance',):
        d['non_tensor_batch'][k] = [None] * 6
    torch.save(interop.verl._as_saveable(d), tmp_path / 'v' / 'verl_batch.pt')
    capsys.readouterr()
    assert cli('import', tmp_path / 'v', '--from', 'verl', '--out', tmp_path / 'shifted', '--temperature', 1.0) == 0
    assert cli('check', tmp_path / 'shifted' / 'trajectories.parquet', '--eot-id', EOT) == 1
    out = capsys.readouterr().out
    assert 'EndOfTurnNotTrainedError' in out and 'FAILED (6 of 6 records refused)' in out


@pytest.mark.parametrize('fw', ['trl', 'verl'])
def test_cli_export_warns_once_per_export(tmp_path, capsys, fw):
    """--allow-support-mismatch: one warning line for the export (count, worst ratio), not one per record."""
    rs = [episode(k, spec=SamplingSpec(temperature=0.7, top_p=0.8 if k == 3 else 0.9), group=f'g{k}')
          for k in range(6)]
    rs[5].provenance.sampling = SamplingSpec(temperature=0.7)          # temperature only: exact at step 0
    store.write_trajectories(tmp_path / 'run' / 'trajectories.parquet', rs)
    assert cli('export', tmp_path / 'run', '--to', fw, '--out', tmp_path / 'x', '--allow-support-mismatch') == 0
    target = {'trl': 'TRL', 'verl': 'verl'}[fw]
    assert capsys.readouterr().err == (
        f'agentrl: warning: 5 of 6 records (the first: record 0) were sampled with 2 samplers, but {target} recomputes '
        "log_softmax(logits / T) over the full vocabulary; the worst step-0 ratio is each token's kept mass, in "
        '[0.8, 1] (top_p=0.8); below 1 wherever the nucleus cut\n')


def test_cli_export_refusal_is_one_line(tmp_path, recs, capsys):
    store.write_trajectories(tmp_path / 'run' / 'trajectories.parquet', recs[::-1][1:] + recs[-1:])
    assert cli('export', tmp_path / 'run', '--to', 'trl', '--out', tmp_path / 't') == 1      # data refused
    err = capsys.readouterr().err
    assert err.startswith('agentrl: error: provenance.group_id') and '--sort-groups' in err
    assert not (tmp_path / 't').exists()                       # a refused export leaves no folder behind
    assert cli('export', tmp_path / 'run', '--to', 'trl', '--out', tmp_path / 't', '--sort-groups') == 0
    assert cli('export', tmp_path / 'run', '--to', 'slime', '--out', tmp_path / 't', '--sort-groups') == 2
    assert "exists and is not an empty folder" in capsys.readouterr().err   # exports never mix
    assert sorted(p.name for p in (tmp_path / 't').iterdir()) == ['manifest.json', 'trl_batch.pt', 'trl_rollout.json']
    assert cli('import', tmp_path / 't' / 'trl_batch.pt', '--from', 'trl', '--out', tmp_path / 'run') == 2
    assert 'is not an empty folder; import into a new folder' in capsys.readouterr().err
    assert sorted(p.name for p in (tmp_path / 'run').iterdir()) == ['trajectories.parquet']   # the run is untouched


def test_cli_export_refuses_what_check_refuses(tmp_path, capsys):
    """A scripted record written without its placeholder flag (its zero log-probs would pass as sampled ones)
    passes the exporters' own refusals; export runs the check's rules first and writes nothing."""
    import pyarrow.parquet as pq
    from test_gate import write
    run = tmp_path / 'run'
    assert cli('rollout', '--policy', 'oracle', '--split', 'heldout', '--repeats', '1', '--out', run) == 0
    (f,) = store.data_files(run / 'trajectories')
    t = pq.read_table(f)
    assert t.column('logp_placeholder').to_pylist() == [True] * 6
    recs = store.read_trajectories(f)
    recs[2].provenance.logp_placeholder = False                       # a writer that lost the flag (an edit of the
    store.write_trajectories(f, recs)                                 # file itself is a digest mismatch)
    p = store.read_trajectories(f)[2].provenance
    assert p.rollout_id.startswith(f'{p.group_id}/')                   # the id printed once
    line = (f'{p.rollout_id}#1: MissingProvenanceError: provenance.sampling: is None on a record with '
            'sampled tokens; nobody can tell which distribution the log-probs came from. Fix: record the SamplingSpec '
            '(temperature, top_k, top_p, min_p, logp_mode), or set logp_placeholder=True for scripted records')
    capsys.readouterr()
    assert cli('check', run) == 1
    assert f'\n  e.g. {line}\n' in capsys.readouterr().out
    for fw in ('verl', 'sft'):
        assert cli('export', run, '--to', fw, '--out', tmp_path / fw) == 1
        assert capsys.readouterr().err == (f"agentrl: error: {line} (1 of 6 records refused; `agentrl check "
                                           f"{run / 'trajectories'}` lists them all)\n")
        assert not (tmp_path / fw).exists()                          # nothing written, no folder left behind
    write(f, t)                                                       # the untouched run: SFT takes scripted records
    assert cli('export', run, '--to', 'sft', '--out', tmp_path / 'sft') == 0


# ---------------------------------------------------------------------------- chat responses, real template
def test_vllm_chat_import_rebuilds_owners_from_the_template():
    pytest.importorskip('transformers')
    from _tokenizers import load
    from agentrl.templates import ChatRecorder
    tok = load('qwen3')
    im_end = tok.convert_tokens_to_ids('<|im_end|>')
    msgs = [{'role': 'user', 'content': 'Fix clamp.'}]
    ref = ChatRecorder(tok, msgs, history='sampled')
    p0 = ref.prompt_ids
    s0 = tok.encode('I will read it.', add_special_tokens=False) + [im_end]
    ref.add_turn(s0, [-0.5] * len(s0))
    p1 = ref.add_messages([{'role': 'user', 'content': 'Go on.'}])
    s1 = tok.encode('Done.', add_special_tokens=False) + [im_end]
    ref.add_turn(s1, [-0.25] * len(s1))
    want = ref.finish(reward=1.0)

    def resp(prompt, ids, lp):
        return {'prompt_token_ids': prompt, 'choices': [{'message': {'role': 'assistant', 'content': ''},
                'token_ids': ids, 'finish_reason': 'stop',
                'logprobs': {'content': [{'token': '', 'logprob': x} for x in lp]}}]}
    msgs1 = msgs + [{'role': 'assistant', 'content': 'I will read it.'}, {'role': 'user', 'content': 'Go on.'}]
    ep = {'exchanges': [{'request': {'messages': msgs, 'temperature': 1.0, 'model': 'q'},
                         'response': resp(p0, s0, [-0.5] * len(s0))},
                        {'request': {'messages': msgs1, 'temperature': 1.0},
                         'response': resp(p1, s1, [-0.25] * len(s1))}], 'reward': 1.0, 'group_id': 'g'}
    [r] = interop.from_openai([ep], tok, strict_sampling=False)   # temperature only: the rest neutral
    assert torch.equal(r.ids, want.ids) and torch.equal(r.owner, want.owner)
    assert torch.equal(r.sample_logp, want.sample_logp) and int(r.action_mask.sum()) == len(s0) + len(s1)
    assert r.info['import']['context_drift'] == [] and r.turn_contexts is None
    assert r.provenance.sampling.logp_mode == 'raw' and r.provenance.tokenizer
    # a server that re-tokenized history: its context for turn 1 is kept as that turn's context
    drifted = p1[:-3] + [p1[-1]]
    ep['exchanges'][1]['response'] = resp(drifted, s1, [-0.25] * len(s1))
    [r] = interop.from_openai([ep], tok, strict_sampling=False)
    assert r.info['import']['context_drift'] == [1]
    assert r.turn_contexts[1][1].tolist() == drifted and r.turn_contexts[0][1].tolist() == p0
    ep['exchanges'][1]['response']['choices'][0].pop('token_ids')
    with pytest.raises(E.MissingTokenIdsError, match='exchange 1 response has no output token ids'):
        interop.from_openai([ep], tok, strict_sampling=False)


def test_per_turn_contexts_refused_or_split():
    r = episode(2, turns=2, trailing=0)
    pol = (r.owner == OWNER['policy']).nonzero().flatten().tolist()
    starts = [j for j in pol if j - 1 not in pol]
    r.turn_contexts = [(s, r.ids[:s]) for s in starts]
    r.turn_contexts[1] = (starts[1], torch.cat([r.ids[:3], r.ids[starts[1] - 4:starts[1]]]))
    with pytest.raises(E.TurnContextError, match='turn_contexts: record 0 has per-turn contexts'):
        interop.to_slime([r])
    rows = interop.split_turns([r])
    assert len(rows) == 2 and rows[1].ids[:7].tolist() == r.turn_contexts[1][1].tolist()
    assert sum(int(x.action_mask.sum()) for x in rows) == int(r.action_mask.sum())
    assert len(interop.to_slime(rows)) == 2
    with pytest.raises(ValueError, match='one trajectory per prompt'):
        interop.export([r], 'trl', '/nonexistent', split_turns=True)


def test_trl_truncated_rows_measured_by_pad_id():
    d = interop.to_trl([episode(1), episode(2)], pad_id=PAD)
    d['completion_mask'][0] = 0                    # mask_truncated_completions zeroes the row
    del d['agentrl_provenance'], d['agentrl_info']
    back = interop.from_trl(d, pad_id=PAD)
    assert torch.equal(back[0].ids, trimmed(episode(1))[0])


class _Obj:
    pass


def test_pt_files_load_without_running_code(tmp_path):
    torch.save({'samples': [_Obj()]}, tmp_path / '0.pt')
    with pytest.raises(ValueError, match="holds objects beyond tensors, lists and dicts .* weights_only=True"):
        interop.import_records(tmp_path / '0.pt', 'slime')


def test_import_of_a_malformed_file_is_one_line(tmp_path, recs, capsys):
    """A file without the field its framework writes, or not UTF-8 JSON: one line naming the file and the field."""
    def refused(path, fw):
        assert cli('import', path, '--from', fw, '--out', tmp_path / 'out') == 2
        err = capsys.readouterr().err
        assert err.count('\n') == 1 and not (tmp_path / 'out').exists()
        return err

    def fix(fw):
        return f'pass the file (or folder) `agentrl export --to {fw}` or {fw} wrote'

    torch.save({'rollouts': []}, tmp_path / '0.pt')
    assert refused(tmp_path / '0.pt', 'slime') == (
        f"agentrl: error: {str(tmp_path / '0.pt')!r}: samples: is missing (the file holds keys ['rollouts']); a slime "
        "rollout file is {'samples': [Sample.to_dict(), ...]} (slime --save-debug-rollout-data); " + fix('slime') + '\n')
    torch.save([1, 2], tmp_path / '0.pt')
    assert "samples: is missing (the file holds a list); " in refused(tmp_path / '0.pt', 'slime')
    torch.save({'samples': 3}, tmp_path / '0.pt')
    assert refused(tmp_path / '0.pt', 'slime') == (
        f"agentrl: error: {str(tmp_path / '0.pt')!r}: samples: is of type int, not a list of Sample.to_dict() dicts; "
        + fix('slime') + '\n')
    sample = interop.to_slime(recs)[0]
    del sample['response_length']
    torch.save({'samples': [sample]}, tmp_path / '0.pt')
    assert refused(tmp_path / '0.pt', 'slime') == (
        f"agentrl: error: {str(tmp_path / '0.pt')!r}: response_length: is missing; slime exports carry it; "
        + fix('slime') + '\n')
    (tmp_path / 'generator_output.json').write_text('{"prompt_token_ids": [[1, 2]],')
    assert refused(tmp_path / 'generator_output.json', 'skyrl') == (
        f"agentrl: error: {str(tmp_path / 'generator_output.json')!r} is not valid JSON (Expecting property name "
        "enclosed in double quotes at line 1 column 31); " + fix('skyrl') + '\n')
    (tmp_path / 'training_samples.jsonl').write_bytes(b'{}\n\n{"a": "\xff"}\n')
    assert refused(tmp_path / 'training_samples.jsonl', 'prime-rl') == (
        f"agentrl: error: {str(tmp_path / 'training_samples.jsonl')!r} is not UTF-8 text (byte 0xff at offset 11); "
        + fix('prime-rl') + '\n')
    (tmp_path / 'training_samples.jsonl').write_text('{}\n\n{"a": 1\n')
    assert refused(tmp_path / 'training_samples.jsonl', 'prime-rl') == (
        f"agentrl: error: {str(tmp_path / 'training_samples.jsonl')!r} line 3 is not valid JSON (Expecting ',' "
        "delimiter at column 8); " + fix('prime-rl') + '\n')
    (tmp_path / 'episodes.jsonl').write_text('{"exchanges": []}\n{"exchanges": [}\n')
    assert refused(tmp_path / 'episodes.jsonl', 'vllm') == (
        f"agentrl: error: {str(tmp_path / 'episodes.jsonl')!r} line 2 is not valid JSON (Expecting value at column "
        "16); pass a JSON list of episodes or a JSONL file, one episode per line\n")
    (tmp_path / 'episodes.json').write_text(' [{"exchanges": []},')
    assert refused(tmp_path / 'episodes.json', 'sglang') == (
        f"agentrl: error: {str(tmp_path / 'episodes.json')!r} is not valid JSON (Expecting value at line 1 column "
        "21); pass a JSON list of episodes or a JSONL file, one episode per line\n")


def test_import_of_another_frameworks_file_names_it(tmp_path, recs, capsys):
    """A file of another framework, or of the wrong shape: one line naming the file, the entry, the field, the fix."""
    def refused(path, fw):
        assert cli('import', path, '--from', fw, '--out', tmp_path / 'out') == 2
        err = capsys.readouterr().err
        assert err.count('\n') == 1 and not (tmp_path / 'out').exists()
        return err

    for fw in ('verl', 'trl', 'slime', 'openrlhf', 'skyrl', 'prime-rl'):
        interop.export(recs, fw, tmp_path / fw, pad_id=PAD)
    trl, slime, skyrl = tmp_path / 'trl' / 'trl_batch.pt', tmp_path / 'slime' / '0.pt', tmp_path / 'skyrl'
    prime = tmp_path / 'prime-rl' / 'training_samples.jsonl'
    assert refused(trl, 'verl') == (
        f"agentrl: error: {str(trl)!r}: batch: is missing; a verl batch is {{'batch': {{...}}, 'non_tensor_batch': "
        "{...}, 'meta_info': {...}}; is this a trl file? pass --from trl\n")
    assert refused(slime, 'openrlhf') == (
        f"agentrl: error: {str(slime)!r}: sequences: is missing; openrlhf exports carry it; is this a slime file? "
        "pass --from slime\n")
    assert refused(skyrl / 'generator_output.json', 'verl') == (
        f"agentrl: error: {str(skyrl / 'generator_output.json')!r} is JSON text, not a torch .pt file; is this a "
        "skyrl file? pass --from skyrl\n")
    assert refused(tmp_path / 'verl' / 'verl_batch.pt', 'prime-rl') == (
        f"agentrl: error: {str(tmp_path / 'verl' / 'verl_batch.pt')!r} is a torch .pt file, not JSON; is this a "
        "verl file? pass --from verl\n")
    assert refused(skyrl / 'generator_output.json', 'prime-rl') == (
        f"agentrl: error: {str(skyrl / 'generator_output.json')!r}: token_ids: is missing; prime-rl exports carry "
        "it; is this a skyrl file? pass --from skyrl\n")
    assert refused(prime, 'vllm') == (
        f"agentrl: error: {str(prime)!r} episode 0: exchanges: is missing or empty; is this a prime-rl file? "
        "pass --from prime-rl\n")
    (tmp_path / 'ints.json').write_text('[1, 2]')
    assert refused(tmp_path / 'ints.json', 'sglang') == (
        f"agentrl: error: {str(tmp_path / 'ints.json')!r} episode 0: is a int, not {{\"exchanges\": [...]}}; pass a "
        'JSON list of episodes {"exchanges": [{"request": ..., "response": ...}, ...]} or a JSONL file, one '
        'episode per line\n')
    (tmp_path / 'noreq.json').write_text('[{"exchanges": [{"request": {}, "response": {}}, {"response": {}}]}]')
    assert refused(tmp_path / 'noreq.json', 'vllm') == (
        f"agentrl: error: {str(tmp_path / 'noreq.json')!r} episode 0 exchange 1: request: is missing; log each "
        'exchange as {"request": <request body>, "response": <server response>}\n')
    assert refused(tmp_path / 'noreq.json', 'slime') == (
        f"agentrl: error: {str(tmp_path / 'noreq.json')!r} is JSON text, not a torch .pt file; is this a file of "
        "vLLM/SGLang episodes? pass --from vllm or --from sglang\n")


def test_cli_flags_checked_in_one_line(tmp_path, recs, capsys):
    store.write_trajectories(tmp_path / 'run' / 'trajectories.parquet', recs)
    assert cli('export', tmp_path / 'run', '--to', 'verl', '--out', tmp_path / 'v', '--prompt-length', 0) == 2
    assert '--prompt-length must be >= 1, got 0' in capsys.readouterr().err
    assert cli('export', tmp_path / 'run', '--out', tmp_path / 'v') == 2
    assert '--to FRAMEWORK and --out PATH are required' in capsys.readouterr().err
    assert cli('import', tmp_path / 'run', '--from', 'verl', '--out', tmp_path / 'x', '--temperature', -1) == 2
    assert '--temperature must be >= 0.0, got -1.0' in capsys.readouterr().err


def test_cli_import_of_server_logs_is_strict_about_sampling_fields(tmp_path, capsys):
    example = Path(__file__).resolve().parents[1] / 'docs' / 'examples' / 'vllm_completions.jsonl'
    assert cli('import', example, '--from', 'vllm', '--out', tmp_path / 'ok') == 0        # the documented format
    [r] = store.read_trajectories(tmp_path / 'ok' / 'trajectories.parquet')
    assert r.ids.tolist() == [1, 2, 3, 10, 11, 5, 60, 61, 12, 5] and r.provenance.sampling == SamplingSpec(
        temperature=0.8, logp_mode='raw')
    assert set(r.info['import']['sampling_sources'].values()) == {'request'}
    ep = json.loads(example.read_text())
    for e in ep['exchanges']:
        for f in ('top_p', 'top_k', 'min_p'):
            del e['request'][f]
    bare = tmp_path / 'bare.jsonl'
    bare.write_text(json.dumps(ep) + '\n')
    capsys.readouterr()
    assert cli('import', bare, '--from', 'vllm', '--out', tmp_path / 'no') == 2
    err = capsys.readouterr().err
    assert err.startswith('agentrl: error: episode 0 exchange 0: request: has no top_p, top_k, min_p; the server '
                          'filled them from its defaults') and err.count('\n') == 1 and not (tmp_path / 'no').exists()
    gen = tmp_path / 'generation_config.json'
    gen.write_text(json.dumps({'temperature': 0.6, 'top_k': 20, 'top_p': 0.95, 'min_p': 0.0}))
    assert cli('import', bare, '--from', 'vllm', '--out', tmp_path / 'gen', '--generation-config', gen) == 0
    [r] = store.read_trajectories(tmp_path / 'gen' / 'trajectories.parquet')
    assert r.provenance.sampling == SamplingSpec(temperature=0.8, top_k=20, top_p=0.95, logp_mode='raw')
    assert cli('import', bare, '--from', 'vllm', '--out', tmp_path / 'spec', '--temperature', 0.8) == 0
    capsys.readouterr()
    assert cli('import', bare, '--from', 'vllm', '--out', tmp_path / 'x', '--chat-template-kwargs', '[1]') == 2
    assert "--chat-template-kwargs must be a JSON object, got '[1]'" in capsys.readouterr().err
    assert cli('import', bare, '--from', 'verl', '--out', tmp_path / 'x', '--generation-config', gen) == 2
    assert '--generation-config applies to --from vllm or sglang' in capsys.readouterr().err
