"""``agentrl export --correction MODE --model M``: the off-policy correction's weights and rejection mask land in
each trainer's own batch field, sliced like its log-probs; exact values, shapes, the manifest, and the refusals.

The trainer checks against the installed verl / OpenRLHF functions are in tests/interop/test_export_correction.py.
"""
import dataclasses
import json

import pytest
import torch

import agentrl as arl
from agentrl import interop, store
from agentrl.batching import pad_rows
from agentrl.interop.common import split
from agentrl.correction import off_policy_correction


def cli(*argv):
    from agentrl.cli.main import main
    return main([str(a) for a in argv])


@pytest.fixture(scope='module')
def run(tasks, tok, tmp_path_factory):
    """6 BugFix episodes sampled by one TinyAgent, and a 'trainer' TinyAgent whose weights moved (ratios != 1)."""
    root = tmp_path_factory.mktemp('corr')
    torch.manual_seed(0)
    sampler = arl.TinyAgent(tok.vocab_size).eval()
    recs = arl.rollout_batch(sampler, [arl.BugFixEnv() for _ in range(6)], tasks[:6], tok,
                             generator=torch.Generator().manual_seed(2))
    for i, r in enumerate(recs):
        r.provenance.group_id, r.provenance.rollout_id = f'g{i // 2}', f'r{i}'
        r.reward = float(i % 2)
    trainer = arl.TinyAgent(tok.vocab_size).eval()
    trainer.load_state_dict(sampler.state_dict())
    with torch.no_grad():
        trainer.head.weight.add_(0.05 * torch.randn(trainer.head.weight.shape, generator=torch.Generator().manual_seed(1)))
    store.write_trajectories(root / 'run' / 'trajectories.parquet', recs)
    arl.save_checkpoint(trainer, str(root / 'trainer.pt'))
    recs = store.read_trajectories(root / 'run' / 'trajectories.parquet')
    return root, recs, trainer


def expected(recs, trainer, mode, **kw):
    """The trainer's log-probs of each record alone (padded, full vocabulary, T = 1) and the correction of them."""
    with torch.no_grad():
        lp = [torch.log_softmax(trainer(r.ids[None].long())[0, :-1].double(), -1).gather(
            -1, r.ids[1:, None].long())[:, 0].float() * r.action_mask for r in recs]
    W = max(len(x) for x in lp)
    c = off_policy_correction(pad_rows(lp, W, 0.0), pad_rows([r.sample_logp for r in recs], W, 0.0),
                              pad_rows([r.action_mask.float() for r in recs], W, 0.0), mode, **kw)
    n = [len(r.ids) - 1 for r in recs]
    w = c.weights * c.mask
    return lp, [w[b, :k] for b, k in enumerate(n)], [c.mask[b, :k] for b, k in enumerate(n)], c


def _close(a, b):
    assert a.shape == b.shape
    assert float((a.float() - b.float()).abs().max()) <= 1e-5


def test_icepop_lands_in_every_trainers_field(run):
    root, recs, trainer = run
    band = (0.9, 1.1)
    lp, w, keep, c = expected(recs, trainer, 'icepop', is_correction_threshold=band)
    assert 0 < int((c.mask == 0).logical_and(pad_rows([r.action_mask for r in recs], None, 0) > 0).sum())  # some masked
    sp = [split(r, i) for i, r in enumerate(recs)]
    for fw in ('verl', 'trl', 'openrlhf', 'slime', 'skyrl', 'prime-rl'):
        out = root / f'icepop-{fw}'
        assert cli('export', root / 'run', '--to', fw, '--out', out, '--model', root / 'trainer.pt',
                   '--correction', 'icepop', '--is-correction-threshold', '0.9,1.1') == 0
        d = interop.load_export(out, fw)
        for b, (r, s) in enumerate(zip(recs, sp)):
            resp = slice(s.P - 1, s.E - 1)              # verl, TRL, SkyRL trim the trailing observation
            full = slice(s.P - 1, len(r.ids) - 1)       # slime keeps it
            if fw == 'verl':
                n = s.E - s.P
                _close(d['batch']['rollout_is_weights'][b, :n], w[b][resp])
                assert torch.equal(d['batch']['response_mask'][b, :n], keep[b][resp].long())
                _close(d['batch']['agentrl_old_log_probs'][b, :n], lp[b][resp])
                assert float(d['batch']['rollout_is_weights'][b, n:].abs().sum()) == 0.0
            elif fw == 'trl':
                n = s.E - s.P
                _close(d['importance_sampling_ratio'][b, :n], w[b][resp])
                _close(d['old_per_token_logps'][b, :n], lp[b][resp])
                assert torch.equal(d['tool_mask'][b, :n], keep[b][resp].long())
                assert bool((d['tool_mask'][b, n:] == 1).all())            # TRL's padding of tool_mask stays 1
                rollout = json.loads((out / 'trl_rollout.json').read_text())
                assert rollout['env_mask'][b] == keep[b][resp].long().tolist()
            elif fw == 'openrlhf':
                n = len(r.ids) - 1
                _close(d['agentrl_is_weights'][b, :n], w[b])
                _close(d['action_log_probs'][b, :n], lp[b])
                assert torch.equal(d['action_mask'][b, :n], keep[b].long())
            elif fw == 'slime':
                assert d[b]['loss_mask'] == keep[b][full].long().tolist()
                _close(torch.tensor(d[b]['metadata']['agentrl_is_weights']), w[b][full])
                _close(torch.tensor(d[b]['metadata']['agentrl_old_log_probs']), lp[b][full])
            elif fw == 'skyrl':
                assert d['loss_masks'][b] == keep[b][resp].long().tolist()
                _close(torch.tensor(d['agentrl_is_weights'][b]), w[b][resp])
            else:
                assert d[b]['mask'] == [False] + keep[b].bool().tolist()
                _close(torch.tensor(d[b]['agentrl_is_weights']), torch.cat([torch.zeros(1), w[b]]))
                _close(torch.tensor(d[b]['agentrl_old_log_probs']), torch.cat([torch.zeros(1), lp[b]]))
        m = json.loads((out / 'manifest.json').read_text())['correction']
        from agentrl.jobs.rollout import model_fingerprint
        act = sum(int(r.action_mask.sum()) for r in recs)
        assert m['mode'] == 'icepop' and m['is_correction_threshold'] == [0.9, 1.1] and m['rollout_is_threshold'] == 2.0
        assert m['model'] == 'trainer.pt' and m['model_fingerprint'] == model_fingerprint(root / 'trainer.pt')
        assert m['tokenizer'] == recs[0].provenance.tokenizer and m['scoring'] == 'packed'
        assert m['action_tokens'] == act and m['masked_tokens'] == act - int(c.mask.sum())
        assert m['masked_records'] == c.metrics['corr_masked_records']
        assert m['weights'] == pytest.approx({'mean': c.metrics['corr_weight_mean'], 'min': c.metrics['corr_weight_min'],
                                              'max': c.metrics['corr_weight_max']}, abs=1e-5)
        assert m['fields'] == dict(zip(('weights', 'mask', 'old_log_probs'), interop.CORRECTION_FIELDS[fw]))


@pytest.mark.parametrize('mode', ['token_tis', 'seq_tis', 'geo_mask'])
def test_verl_weights_of_each_mode_and_the_padded_path(run, mode, capsys):
    root, recs, trainer = run
    lp, w, keep, c = expected(recs, trainer, mode, rollout_is_threshold=1.05)
    out = root / f'verl-{mode}'
    assert cli('export', root / 'run', '--to', 'verl', '--out', out, '--model', root / 'trainer.pt', '--correction',
               mode, '--rollout-is-threshold', 1.05, '--no-trim', '--no-packed') == 0
    printed = capsys.readouterr().out
    assert f'{mode} weights in rollout_is_weights (rejections in response_mask): mean' in printed
    d = interop.load_export(out, 'verl')
    for b, r in enumerate(recs):
        s = split(r, b)
        n = len(r.ids) - s.P
        _close(d['batch']['rollout_is_weights'][b, :n], w[b][s.P - 1:])
        assert torch.equal(d['batch']['response_mask'][b, :n], keep[b][s.P - 1:].long())
    m = json.loads((out / 'manifest.json').read_text())['correction']
    assert m['scoring'] == 'padded' and m['rollout_is_threshold'] == 1.05
    assert m['clipped_frac'] == pytest.approx(c.metrics['corr_clipped_frac'])
    back = interop.import_records(out, 'verl')                  # the rows still import
    assert len(back) == len(recs)


def test_without_correction_the_manifest_and_fields_are_unchanged(run):
    root, recs, _ = run
    assert cli('export', root / 'run', '--to', 'verl', '--out', root / 'plain') == 0
    d = interop.load_export(root / 'plain', 'verl')
    assert 'rollout_is_weights' not in d['batch'] and 'agentrl_old_log_probs' not in d['batch']
    assert 'correction' not in json.loads((root / 'plain' / 'manifest.json').read_text())


def test_refusals_by_name(run, capsys, tmp_path):
    root, recs, _ = run
    assert cli('export', root / 'run', '--to', 'verl', '--out', tmp_path / 'a', '--correction', 'icepop') == 2
    assert 'agentrl: error: --correction needs --model' in capsys.readouterr().err
    assert cli('export', root / 'run', '--to', 'verl', '--out', tmp_path / 'a', '--model', root / 'trainer.pt') == 2
    assert '--model is only read with --correction' in capsys.readouterr().err
    assert cli('export', root / 'run', '--to', 'sft', '--out', tmp_path / 'a', '--model', root / 'trainer.pt',
               '--correction', 'icepop') == 2
    assert '--correction: sft exports carry no sampling log-probs' in capsys.readouterr().err
    assert cli('export', root / 'run', '--to', 'verl', '--out', tmp_path / 'a', '--model', root / 'trainer.pt',
               '--correction', 'icepop', '--is-correction-threshold', '2,1') == 2
    assert '--is-correction-threshold must be LOW,HIGH with 0 < LOW <= HIGH, got 2,1' in capsys.readouterr().err
    assert cli('export', root / 'run', '--to', 'verl', '--out', tmp_path / 'a', '--model', tmp_path / 'nope.pt',
               '--correction', 'icepop') == 2
    assert "--model" in capsys.readouterr().err and not (tmp_path / 'a').exists()
    # a model of another tokenizer: refused by name, nothing written
    other = [dataclasses.replace(r, provenance=dataclasses.replace(r.provenance, tokenizer='f00dfeedf00dfeed'))
             for r in recs]
    store.write_trajectories(tmp_path / 'other' / 'trajectories.parquet', other)
    assert cli('export', tmp_path / 'other', '--to', 'verl', '--out', tmp_path / 'b', '--model', root / 'trainer.pt',
               '--correction', 'icepop') == 1
    err = capsys.readouterr().err
    assert err.startswith('agentrl: error: provenance.tokenizer') and 'record 0 was tokenized by f00dfeedf00dfeed' in err
    assert not (tmp_path / 'b').exists()
    with pytest.raises(ValueError, match=r"correction mode 'tis' is unknown"):
        interop.ExportCorrection(None, 'tis')


def test_cli_modes_are_the_trainers_modes():
    from agentrl.cli.export import CORRECTION_MODES
    from agentrl.jobs.check import CheckOptions
    from agentrl.correction import CORRECTION_MODES as TRAIN
    assert CORRECTION_MODES == TRAIN
    assert {f.name: f for f in __import__('dataclasses').fields(CheckOptions)}['correction'].metadata['choices'] == TRAIN
