"""Imported chat records pass, alignment slips are refused, values are what they claim.

1. A real ``--engine hf`` run (the small random Qwen3 of tests/test_engine_hf.py) that passes ``check``,
   exported to each of the six trainers and imported back with ``--tokenizer``, passes ``check``; the
   template's control ids are template-owned again. Without ``--tokenizer`` the import and the check
   say, in one line, what was not checked.
2. Every length and shape mismatch of an importer is a named refusal; ``check`` takes the end-of-turn
   from the records' template info; the replay names a one-token mask shift.
3. Non-integer ids and masks outside {0, 1} are refused by every importer through one validator; one
   file (or export) mixing two tokenizer fingerprints is refused; a schema version below 1 is refused.
"""
import copy
import json

import pytest
import torch

from _tokenizers import TINY, tokenizer_path
from test_interop import EOT, PAD, episode

from agentrl import checks, interop, store
from agentrl.checks import errors as E
from agentrl.interop.owners import UNCHECKED_NOTE
from agentrl.record import OWNER

SIX = ('verl', 'trl', 'slime', 'openrlhf', 'skyrl', 'prime-rl')


def cli(*argv):
    from agentrl.cli.main import main
    return main([str(a) for a in argv])


# ---------------------------------------------------------------------------- 1. round trips of chat records
@pytest.fixture(scope='module')
def hf_run(tmp_path_factory):
    """A real ``agentrl rollout --engine hf`` run: 6 two-turn episodes of the small random Qwen3."""
    pytest.importorskip('transformers')
    from agentrl.engines import hf
    root = tmp_path_factory.mktemp('hf-round-trip')
    model = hf.make_test_model(root / 'model', tokenizer_path('qwen3'))
    assert cli('rollout', '--engine', 'hf', '--model', model, '--split', 'heldout', '--repeats', '1',
               '--max-new-tokens', '8', '--max-turns', '2', '--temperature', '1.0', '--out', root / 'run') == 0
    return root, model


def _control(rec) -> torch.Tensor:
    ct = checks.template_rules.chat_tokens(rec)
    ids = torch.as_tensor(rec.ids)
    out = torch.zeros_like(ids, dtype=torch.bool)
    for lo, hi in ct['control']:
        out |= (ids >= lo) & (ids < hi)
    return out


def test_hf_run_round_trips_through_every_trainer_with_tokenizer(hf_run, capsys):
    root, model = hf_run
    assert cli('check', root / 'run') == 0
    assert 'records          6  (refused 0, scripted 0)' in capsys.readouterr().out
    orig = store.read_trajectories(root / 'run' / 'trajectories')
    for fw in SIX:
        assert cli('export', root / 'run', '--to', fw, '--out', root / f'ex-{fw}') == 0
        assert cli('import', root / f'ex-{fw}', '--from', fw, '--out', root / f'tok-{fw}', '--tokenizer', model) == 0
        assert capsys.readouterr().err == ''                      # nothing left unchecked
        assert cli('check', root / f'tok-{fw}') == 0, fw
        out = capsys.readouterr().out
        assert 'records          6  (refused 0, scripted 0)' in out and 'refusals by kind: none' in out, (fw, out)
        assert 'not checked' not in out and out.rstrip().endswith('result: OK')
        back = store.read_trajectories(root / f'tok-{fw}' / 'trajectories.parquet')
        for a, b in zip(orig, back):
            n = len(b.ids)
            assert torch.equal(b.ids, a.ids[:n]) and torch.equal(b.action_mask, a.action_mask[:n - 1])
            ctl = _control(b) & (b.owner != OWNER['policy'])
            assert int(ctl.sum()) > 0 and bool((b.owner[ctl] == OWNER['template']).all())     # the template's again
            assert bool((a.owner[:n][ctl] == OWNER['template']).all())                       # as the recorder said
            assert b.info['import']['template_owners'] == 'tokenizer'
            assert b.provenance.to_dict() == a.provenance.to_dict()


def test_hf_run_without_tokenizer_says_what_it_could_not_check(hf_run, capsys):
    root, _ = hf_run
    for fw in SIX:
        if not (root / f'ex-{fw}').exists():
            assert cli('export', root / 'run', '--to', fw, '--out', root / f'ex-{fw}') == 0
        capsys.readouterr()
        assert cli('import', root / f'ex-{fw}', '--from', fw, '--out', root / f'mask-{fw}') == 0
        assert capsys.readouterr().err == (f'agentrl: note: 6 of 6 records: not checked: {UNCHECKED_NOTE}. Fix: pass '
                                           '--tokenizer DIR (the tokenizer the rollouts used)\n')
        assert cli('check', root / f'mask-{fw}') == 0, fw          # reported, not refused as forged control tokens
        out = capsys.readouterr().out
        assert f'not checked      6 records: {UNCHECKED_NOTE}' in out.splitlines()
        assert 'refusals by kind: none' in out and 'ControlTokenInContentError' not in out
        [r, *_] = store.read_trajectories(root / f'mask-{fw}' / 'trajectories.parquet')
        assert r.info['import'] == {'template_owners': 'mask', 'unchecked': [UNCHECKED_NOTE]}


def test_import_with_another_tokenizer_is_refused(hf_run, capsys):
    root, _ = hf_run
    if not (root / 'ex-verl').exists():
        assert cli('export', root / 'run', '--to', 'verl', '--out', root / 'ex-verl') == 0
    capsys.readouterr()
    assert cli('import', root / 'ex-verl', '--from', 'verl', '--out', root / 'other', '--tokenizer', TINY) == 1
    err = capsys.readouterr().err
    assert err.startswith("agentrl: error: provenance.tokenizer: from_verl row 0: was tokenized by '")
    assert err.endswith('. Fix: pass the tokenizer folder the rollouts used\n') and err.count('\n') == 1


def test_shifted_verl_mask_of_chat_records_fails_a_plain_check(hf_run, capsys):
    """The end-of-turn comes from the records' template info: no --eot-id needed."""
    root, _ = hf_run
    if not (root / 'ex-verl').exists():
        assert cli('export', root / 'run', '--to', 'verl', '--out', root / 'ex-verl') == 0
    d = interop.load_export(root / 'ex-verl', 'verl')
    d['batch']['response_mask'] = torch.roll(d['batch']['response_mask'], -1, dims=1)
    d['batch']['response_mask'][:, -1] = 0
    (root / 'shifted').mkdir()
    torch.save(interop.verl._as_saveable(d), root / 'shifted' / 'verl_batch.pt')
    assert cli('import', root / 'shifted', '--from', 'verl', '--out', root / 'shifted-run', '--tokenizer',
               hf_run[1]) == 0
    capsys.readouterr()
    assert cli('check', root / 'shifted-run') == 1
    out = capsys.readouterr().out
    assert 'EndOfTurnNotTrainedError' in out and 'FAILED (6 of 6 records refused)' in out


def test_replay_names_a_one_token_mask_shift(hf_run):
    """A mask moved one token against the ids is ``mask_shift``, not ``policy_change``, both ways."""
    from agentrl.engines import hf
    from agentrl.engines.scorer import hf_scorer
    root, model_dir = hf_run
    model, _ = hf.load_model(model_dir)
    recs = store.read_trajectories(root / 'run' / 'trajectories')
    assert checks.replay_records(recs, hf_scorer(model)).ok
    rows = interop.to_prime_rl(recs)
    for shift, side in ((-1, 'early'), (1, 'late')):
        moved = copy.deepcopy(rows)
        for r in moved:
            m = r['mask']
            r['mask'] = (m[1:] + [False]) if shift < 0 else ([False] + m[:-1])
        back = interop.from_prime_rl(moved)
        two_turns = [b for b, a in zip(back, recs) if a.info['n_turns'] == 2]
        rep = checks.replay_records(back if shift > 0 else two_turns, hf_scorer(model))
        assert set(rep.record_kinds) == {'mask_shift'}, (shift, rep.record_kinds)
        assert rep.records[0].detail.startswith(f'mask shifted one token {side}: ')
        assert rep.records[0].detail.endswith('(a [T] mask read as [T-1] or the reverse), not a policy change')
        assert f'mask_shift: {len(rep.records)} records, e.g. ' in rep.table()


# ---------------------------------------------------------------------------- 2. alignment slips
@pytest.fixture(scope='module')
def recs():
    return [episode(k, turns=1 + k % 3, group=f'g{k // 2}') for k in range(6)]


def _drop_col(d, key):
    d[key] = d[key][:, :-1]
    return d


def _drop_row(d, key):
    d[key] = d[key][:-1]
    return d


SLIPS = [  # (framework, build, mutate, error, message)
    ('trl', lambda r: interop.to_trl(r, pad_id=PAD), lambda d: _drop_col(d, 'completion_mask'), E.MaskAlignmentError,
     r'completion_mask: from_trl: has shape \[6, 22\] but completion_ids has \[6, 23\]'),
    ('trl', lambda r: interop.to_trl(r, pad_id=PAD), lambda d: _drop_col(d, 'tool_mask'), E.MaskAlignmentError,
     r'tool_mask: from_trl: has shape \[6, 22\] but completion_ids has \[6, 23\]'),
    ('trl', lambda r: interop.to_trl(r, pad_id=PAD), lambda d: _drop_col(d, 'sampling_per_token_logps'),
     E.LengthMismatchError, r'sampling_per_token_logps: from_trl: has shape \[6, 22\] but completion_ids has \[6, 23\]'),
    ('trl', lambda r: interop.to_trl(r, pad_id=PAD), lambda d: _drop_col(d, 'prompt_mask'), E.MaskAlignmentError,
     r'prompt_mask: from_trl: has shape \[6, 4\] but prompt_ids has \[6, 5\]'),
    ('trl', lambda r: interop.to_trl_rollout(r), lambda d: _drop_row(d, 'env_mask'), E.LengthMismatchError,
     r'env_mask: from_trl: has shape \[5\] but prompt_ids \(rows\) has \[6\]'),
    ('verl', lambda r: interop.to_verl(r, pad_id=PAD), lambda d: _drop_col(d['batch'], 'response_mask') and d,
     E.MaskAlignmentError, r'response_mask: from_verl row all: has length 22 but 23 tokens; a mask aligned to ids\[1:\]'),
    ('verl', lambda r: interop.to_verl(r, pad_id=PAD), lambda d: _drop_col(d['batch'], 'attention_mask') and d,
     E.MaskAlignmentError, r'attention_mask: from_verl: has shape \[6, 27\] but prompts \+\+ responses has \[6, 28\]'),
    ('verl', lambda r: interop.to_verl(r, pad_id=PAD), lambda d: _drop_col(d['batch'], 'rm_scores') and d,
     E.LengthMismatchError, r'rm_scores: from_verl: has shape \[6, 22\] but responses has \[6, 23\]'),
    ('verl', lambda r: interop.to_verl(r, pad_id=PAD), lambda d: _drop_row(d['batch'], 'responses') and d,
     E.LengthMismatchError, r'responses: from_verl: has shape \[5\] but prompts \(rows\) has \[6\]'),
    ('openrlhf', lambda r: interop.to_openrlhf(r, pad_id=PAD), lambda d: _drop_col(d, 'attention_mask'),
     E.MaskAlignmentError, r'attention_mask: from_openrlhf: has shape \[6, 29\] but sequences has \[6, 30\]'),
    ('openrlhf', lambda r: interop.to_openrlhf(r, pad_id=PAD), lambda d: _drop_col(d, 'rollout_log_probs'),
     E.LengthMismatchError, r'rollout_log_probs: from_openrlhf: has shape \[6, 28\] but sequences\[:, 1:\] has \[6, 29\]'),
    ('slime', lambda r: interop.to_slime(r), lambda d: d[0].update(response_length=len(d[0]['tokens']) + 1) or d,
     E.LengthMismatchError, r'response_length: from_slime row 0: is 11, but tokens has 10 entries'),
    ('slime', lambda r: interop.to_slime(r), lambda d: d[0].update(loss_mask=d[0]['loss_mask'][:-1]) or d,
     E.MaskAlignmentError, r'loss_mask: from_slime row 0: has length 4 but 5 tokens'),
    ('skyrl', lambda r: interop.to_skyrl(r), lambda d: _drop_row(d, 'loss_masks'), E.LengthMismatchError,
     r'loss_masks: from_skyrl: has shape \[5\] but response_ids \(rows\) has \[6\]'),
    ('prime-rl', lambda r: interop.to_prime_rl(r), lambda d: d[0].update(mask=d[0]['mask'][:-1]) or d,
     E.MaskAlignmentError, r'mask: from_prime_rl row 0: has length 9 but 10 tokens'),
]
IMPORTERS = {'verl': interop.from_verl, 'trl': interop.from_trl, 'slime': interop.from_slime,
             'openrlhf': interop.from_openrlhf, 'skyrl': interop.from_skyrl, 'prime-rl': interop.from_prime_rl}


@pytest.mark.parametrize('fw, build, mutate, err, msg', SLIPS, ids=[f'{s[0]}-{s[4][:24]}' for s in SLIPS])
def test_alignment_slips_are_named_refusals(recs, fw, build, mutate, err, msg):
    data = mutate(build(recs))
    with pytest.raises(err, match=msg):
        IMPORTERS[fw](data)


def test_trl_completion_mask_one_column_short_is_refused_by_the_cli(tmp_path, recs, capsys):
    d = interop.to_trl(recs, pad_id=PAD)
    d['completion_mask'] = d['completion_mask'][:, :-1]
    torch.save(d, tmp_path / 'trl_batch.pt')
    assert cli('import', tmp_path / 'trl_batch.pt', '--from', 'trl', '--out', tmp_path / 'run') == 1
    assert capsys.readouterr().err == (
        'agentrl: error: completion_mask: from_trl: has shape [6, 22] but completion_ids has [6, 23]; every row '
        'and column must line up with it (a column short or extra would move or drop tokens). Fix: pass '
        'completion_mask exactly as the framework wrote it, one entry per completion_ids entry\n')
    assert not (tmp_path / 'run').exists()


def test_padding_holes_are_refused(recs):
    d = interop.to_verl(recs, pad_id=PAD)
    Lp = d['batch']['prompts'].shape[1]
    d['batch']['attention_mask'][0, Lp + 1] = 0                       # a hole inside the response
    with pytest.raises(E.LengthMismatchError, match=r'attention_mask\[\d+\]: from_verl row 0: has a 0/1 hole'):
        interop.from_verl(d)
    d = interop.to_verl(recs, pad_id=PAD)
    n = int(d['batch']['attention_mask'][1, Lp:].sum())
    d['batch']['response_mask'][1, n] = 1                               # trained padding
    with pytest.raises(E.MaskValueError, match=rf'response_mask\[{n}\]: from_verl row 1: is 1 at response position '
                                               rf'{n}, on padding past the {n} real response tokens'):
        interop.from_verl(d)
    d = interop.to_openrlhf(recs, pad_id=PAD)
    d['attention_mask'][2, 1] = 0
    with pytest.raises(E.LengthMismatchError, match=r'attention_mask\[\d+\]: from_openrlhf row 2: is not right '
                                                    r'padding'):
        interop.from_openrlhf(d)


def test_shifted_end_of_turn_from_template_info_without_flag(recs):
    """A chat record's own ``chat_tokens`` give the end-of-turn: the shifted-mask rule runs by default."""
    r = copy.deepcopy(recs[1])
    r.info['template'] = {'chat_tokens': {'end_of_turn': [EOT], 'stop': [EOT], 'control': [], 'content_text': 'plain'}}
    assert checks.find_problems(r) == []
    rows = interop.to_prime_rl([r])
    rows[0]['mask'] = rows[0]['mask'][1:] + [False]                   # one token early: the end-of-turn untrained
    [back] = interop.from_prime_rl(rows)
    kinds = [p.kind for p in checks.find_problems(back)]
    assert 'EndOfTurnNotTrainedError' in kinds
    bare = copy.deepcopy(back)
    bare.info.pop('template')
    assert 'EndOfTurnNotTrainedError' not in [p.kind for p in checks.find_problems(bare)]      # nothing to derive from


# ---------------------------------------------------------------------------- 3. values are what they claim
def _set(container, key, row, pos, value):
    seq = container[row][key] if isinstance(container, list) else container[key][row]
    seq[pos] = value


VALUES = [  # (framework, build, mutate, error, message)
    ('trl', interop.to_trl_rollout, lambda d: _set(d, 'completion_ids', 1, 2, 141.5), E.TokenIdError,
     r'completion_ids\[2\]: from_trl row 1: is 141.5 \(float\), not an integer token id'),
    ('trl', interop.to_trl_rollout, lambda d: _set(d, 'prompt_ids', 0, 1, True), E.TokenIdError,
     r'prompt_ids\[1\]: from_trl row 0: is True \(bool\), not an integer token id'),
    ('trl', interop.to_trl_rollout, lambda d: _set(d, 'env_mask', 2, 0, 2), E.MaskValueError,
     r'env_mask\[0\]: from_trl row 2: is 2, not 0 or 1'),
    ('skyrl', interop.to_skyrl, lambda d: _set(d, 'response_ids', 1, 2, 141.5), E.TokenIdError,
     r'response_ids\[2\]: from_skyrl row 1: is 141.5 \(float\), not an integer token id'),
    ('skyrl', interop.to_skyrl, lambda d: _set(d, 'loss_masks', 3, 1, 0.5), E.MaskValueError,
     r'loss_masks\[1\]: from_skyrl row 3: is 0.5, not 0 or 1'),
    ('prime-rl', interop.to_prime_rl, lambda d: _set(d, 'token_ids', 1, 5, 141.5), E.TokenIdError,
     r'token_ids\[5\]: from_prime_rl row 1: is 141.5 \(float\), not an integer token id'),
    ('prime-rl', interop.to_prime_rl, lambda d: _set(d, 'token_ids', 0, 0, False), E.TokenIdError,
     r'token_ids\[0\]: from_prime_rl row 0: is False \(bool\), not an integer token id'),
    ('prime-rl', interop.to_prime_rl, lambda d: _set(d, 'mask', 0, 6, 2), E.MaskValueError,
     r'mask\[6\]: from_prime_rl row 0: is 2, not 0 or 1'),
    ('slime', interop.to_slime, lambda d: _set(d, 'tokens', 1, 3, 141.5), E.TokenIdError,
     r'tokens\[3\]: from_slime row 1: is 141.5 \(float\), not an integer token id'),
    ('slime', interop.to_slime, lambda d: _set(d, 'loss_mask', 0, 0, -1), E.MaskValueError,
     r'loss_mask\[0\]: from_slime row 0: is -1, not 0 or 1'),
    ('verl', lambda r: interop.to_verl(r, pad_id=PAD), lambda d: d['batch'].update(responses=d['batch']['responses']
                                                                                   .double() + 0.5),
     E.TokenIdError, r'responses\[0\]: from_verl row 0: is \d+.5 \(float\), not an integer token id'),
    ('verl', lambda r: interop.to_verl(r, pad_id=PAD), lambda d: d['batch']['response_mask'].__setitem__((1, 0), 3),
     E.MaskValueError, r'response_mask\[0\]: from_verl row 1: is 3, not 0 or 1'),
    ('openrlhf', lambda r: interop.to_openrlhf(r, pad_id=PAD), lambda d: d.update(sequences=d['sequences'] > 0),
     E.TokenIdError, r'sequences\[0\]: from_openrlhf row 0: is True \(bool\), not an integer token id'),
    ('openrlhf', lambda r: interop.to_openrlhf(r, pad_id=PAD), lambda d: d['action_mask'].__setitem__((2, 3), 2),
     E.MaskValueError, r'action_mask\[3\]: from_openrlhf row 2: is 2, not 0 or 1'),
    ('trl', lambda r: interop.to_trl(r, pad_id=PAD), lambda d: d['tool_mask'].__setitem__((0, 1), 5),
     E.MaskValueError, r'tool_mask\[1\]: from_trl row 0: is 5, not 0 or 1'),
]


@pytest.mark.parametrize('fw, build, mutate, err, msg', VALUES, ids=[f'{v[0]}-{v[4][:20]}' for v in VALUES])
def test_values_are_what_they_claim(recs, fw, build, mutate, err, msg):
    data = build(recs)
    mutate(data)
    with pytest.raises(err, match=msg):
        IMPORTERS[fw](data)


def test_openai_ids_are_integers():
    from test_interop import completion_episode
    ep = completion_episode()
    ep['exchanges'][0]['response']['choices'][0]['token_ids'][1] = 141.5
    with pytest.raises(E.TokenIdError, match=r'token_ids\[1\]: exchange 0 response: is 141.5 \(float\), not an '
                                             'integer token id'):
        interop.from_openai([ep])


@pytest.mark.parametrize('fw', ['prime-rl', 'skyrl'])
def test_json_values_through_the_cli(tmp_path, recs, capsys, fw):
    assert interop.export(recs, fw, tmp_path / 'x')
    f = tmp_path / 'x' / ('training_samples.jsonl' if fw == 'prime-rl' else 'generator_output.json')
    if fw == 'prime-rl':
        rows = [json.loads(line) for line in f.read_text().splitlines()]
        rows[2]['token_ids'][4] = True
        f.write_text(''.join(json.dumps(r) + '\n' for r in rows))
        line = ('agentrl: error: token_ids[4]: from_prime_rl row 2: is True (bool), not an integer token id. Fix: '
                'store token ids as integers (int64); a float or boolean id is not the token that was sampled\n')
    else:
        d = json.loads(f.read_text())
        d['loss_masks'][1][0] = 0.5
        f.write_text(json.dumps(d))
        line = ('agentrl: error: loss_masks[0]: from_skyrl row 1: is 0.5, not 0 or 1. Fix: masks are 0/1 (1: sampled '
                'by the policy)\n')
    assert cli('import', tmp_path / 'x', '--from', fw, '--out', tmp_path / 'run') == 1
    assert capsys.readouterr().err == line


def test_one_file_of_two_tokenizers_is_refused_by_check_and_export(tmp_path, recs, capsys):
    mixed = copy.deepcopy(recs)
    mixed[3].provenance.tokenizer = 'tok2'
    store.write_trajectories(tmp_path / 'run' / 'trajectories.parquet', mixed)
    assert cli('check', tmp_path / 'run' / 'trajectories.parquet') == 1
    out = capsys.readouterr().out
    assert 'TokenizerMismatchError       1' in out and 'FAILED (1 of 6 records refused)' in out
    assert ("TokenizerMismatchError: provenance.tokenizer: is 'tok2', but row 0 of the same file was tokenized by "
            "'tok'; one file holds one tokenizer's ids") in out
    for fw in SIX:
        with pytest.raises(E.TokenizerMismatchError, match="provenance.tokenizer: record 3 was tokenized by 'tok2' "
                                                           "but record 0 by 'tok'"):
            interop.export(mixed, fw, tmp_path / f'x-{fw}', pad_id=PAD)
        assert not (tmp_path / f'x-{fw}').exists()
    assert cli('export', tmp_path / 'run', '--to', 'verl', '--out', tmp_path / 'v', '--pad-id', PAD) == 1
    err = capsys.readouterr().err                                      # export runs the check first
    assert err.startswith("agentrl: error: g1/r3#1: TokenizerMismatchError: provenance.tokenizer: is 'tok2', but row 0 "
                          "of the same file was tokenized by 'tok'") and err.count('\n') == 1


def test_schema_version_below_one_is_refused(tmp_path, recs, capsys):
    import pyarrow.parquet as pq
    store.write_trajectories(tmp_path / 'a.parquet', recs)
    t = pq.read_table(tmp_path / 'a.parquet')
    for v in (b'0', b'-3'):
        pq.write_table(t.replace_schema_metadata({**t.schema.metadata, b'agentrl.schema_version': v}),
                       tmp_path / 'b.parquet')
        msg = (f"'{tmp_path / 'b.parquet'}' has schema version {v.decode()}; versions start at 1, so it was not "
               'written by agentrl (rewrite it with agentrl.store.write_trajectories)')
        with pytest.raises(ValueError, match='^' + msg.replace('(', r'\(').replace(')', r'\)').replace('.', r'\.') + '$'):
            store.read_trajectories(tmp_path / 'b.parquet')
        assert cli('check', tmp_path / 'b.parquet') != 0
        err = capsys.readouterr()
        assert f'has schema version {v.decode()}; versions start at 1' in err.err + err.out


def test_record_from_response_names_the_sources_own_columns():
    from agentrl.interop.common import ResponseColumns, record_from_response
    cols = ResponseColumns('from_x', prompt='p', response='r', mask='keep', logp='lp')
    with pytest.raises(E.LengthMismatchError) as e:
        record_from_response([1, 2], [3, 4], [1], None, reward=0.0, info={}, provenance=None, row=3, columns=cols)
    assert str(e.value) == 'keep: from_x row 3: has length 1 but 2 tokens. Fix: give one entry per token'
    with pytest.raises(E.LengthMismatchError) as e:
        record_from_response([1, 2], [3, 4], [1, 1], [0.1], reward=0.0, info={}, provenance=None, columns=cols)
    assert str(e.value) == 'lp: from_x row 0: has length 1 but 2 tokens. Fix: give one entry per token'
    t = record_from_response([1, 2], [3, 4, 5], [1, 0, 1], [-0.5, 0.0, -0.25], reward=1.0, info={}, provenance=None)
    assert t.owner.tolist() == [OWNER['prompt'], OWNER['prompt'], OWNER['policy'], OWNER['tool'], OWNER['policy']]
    assert (t.turn.tolist(), t.action_mask.tolist(), t.sample_logp.tolist()) == (
        [-1, -1, 0, 0, 1], [0.0, 1.0, 0.0, 1.0], [0.0, -0.5, 0.0, -0.25])
    with pytest.raises(ValueError) as e:
        ResponseColumns('from_x', mask='')
    assert str(e.value) == ("ResponseColumns.mask = '': must be a non-empty string; pass the name the source uses "
                            'for it')
