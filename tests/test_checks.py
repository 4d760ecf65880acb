"""L3 checks: the lesson's fixture, the issue's replay numbers, the validator, retry identity."""
import math
import re
from dataclasses import replace

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agentrl import checks
from agentrl.checks import (Expected, RecordError, action_targets, classify_tokens, convert_logp, find_problems,
                            replay_check, replay_logp, validate)
from agentrl.record import OWNER, Provenance, SamplingSpec, Trajectory

P, POL, TOOL, TPL = OWNER['prompt'], OWNER['policy'], OWNER['tool'], OWNER['template']


@pytest.fixture(autouse=True, scope='module')
def one_thread():
    """Tiny forward passes are fastest single-threaded (and immune to a busy machine)."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


# ------------------------------------------------------------------------------ action_targets

def test_action_targets_lesson_fixture():
    ids = [101, 102, 201, 202, 301, 302, 203]
    generated = [False, False, True, True, False, False, True]
    assert action_targets(ids, generated) == [(1, 201), (2, 202), (5, 203)]
    # one more tool token before the final action: only that action's row moves
    assert action_targets(ids[:6] + [303, 203], generated[:6] + [False, True]) == [(1, 201), (2, 202), (6, 203)]
    # a tool token marked generated exposes an extra training target; the ids are unchanged
    wrong = generated[:4] + [True] + generated[5:]
    assert action_targets(ids, wrong) == [(1, 201), (2, 202), (3, 301), (5, 203)]
    assert action_targets(torch.tensor(ids), generated) == [(1, 201), (2, 202), (5, 203)]


def test_action_targets_errors():
    with pytest.raises(ValueError, match='7 ids but 6 origin flags'):
        action_targets([101, 102, 201, 202, 301, 302, 203], [False] * 6)
    with pytest.raises(ValueError, match=r'generated\[1\] is 1, not a bool'):
        action_targets([1, 2], [False, 1])
    with pytest.raises(ValueError, match='needs a preceding context position'):
        action_targets([1, 2], [True, False])
    assert action_targets([], []) == []


# ------------------------------------------------------------------------------ replay numbers

def fixed_model(rows):
    """A 'model' whose logits at every position are ``rows`` (``[T, V]``), for replay_check."""
    rows = torch.as_tensor(rows, dtype=torch.float32)
    return lambda ids: rows[None, :ids.shape[1]]


def one_token_record(stored_logp, spec, n_vocab, token=0, **prov):
    return Trajectory.from_tokens([n_vocab - 1, token], ['prompt', 'policy'], [-1, 0], [0.0, stored_logp], 1.0, {},
                                  provenance=Provenance(policy='model', sampling=spec, group_id='g',
                                                        rollout_id='r', **prov))


def test_replay_temperature_and_logp_mode():
    spec = SamplingSpec(temperature=0.5)
    assert replay_logp(torch.tensor([2.0, 1.0, 0.0]), torch.tensor(0), spec).item() == pytest.approx(-0.1429, abs=5e-5)
    assert replay_logp(torch.tensor([[2.0, 1.0, 0.0]]), torch.tensor([0]), replace(spec, logp_mode='raw')).item() \
        == pytest.approx(-0.4076, abs=5e-5)
    rec = one_token_record(-0.4076, spec, 3)      # raw stored, processed declared
    rep = replay_check([rec], fixed_model([[2.0, 1.0, 0.0]] * 2))
    r = rep.records[0]
    assert r.kind == 'logp_mode_mismatch' and r.token_kinds == {'logp_mode_mismatch': 1}
    assert r.stats.mean == pytest.approx(1.303, abs=1e-3)
    ok = one_token_record(float(replay_logp(torch.tensor([2.0, 1.0, 0.0]), torch.tensor(0), spec)), spec, 3)
    rep = replay_check([ok], fixed_model([[2.0, 1.0, 0.0]] * 2))
    assert rep.ok and rep.overall.max_abs_dev < 1e-6


def test_replay_top_k_support():
    logits = torch.tensor([0.50, 0.30, 0.15, 0.05]).log()
    spec = SamplingSpec(top_k=2)
    assert replay_logp(logits, torch.tensor(0), spec).exp().item() == pytest.approx(0.625)
    model = fixed_model([logits.tolist()] * 2)
    rep = replay_check([one_token_record(math.log(0.625), spec, 4)], model)
    assert rep.ok and rep.records[0].stats.mean == pytest.approx(1.0, abs=1e-6)
    # the same stored 0.625 replayed over the full vocabulary: 0.5 / 0.625 = 0.8, a support mismatch
    rep = replay_check([one_token_record(math.log(0.625), SamplingSpec(), 4)], model)
    r = rep.records[0]
    assert r.stats.mean == pytest.approx(0.8, abs=1e-6)
    assert r.kind == 'support_mismatch' and rep.record_kinds == {'support_mismatch': 1}
    # storing the raw 0.50 while declaring top-k 2 processed: ratio 1.25, and it is the raw log-prob
    rep = replay_check([one_token_record(math.log(0.5), spec, 4)], model)
    assert rep.records[0].stats.mean == pytest.approx(1.25) and rep.records[0].kind == 'logp_mode_mismatch'
    # a different model: policy change
    rep = replay_check([one_token_record(math.log(0.9), spec, 4)], model)
    assert rep.records[0].kind == 'policy_change'
    assert 'policy_change' in rep.table()


def test_support_transforms():
    lp = torch.tensor([[0.50, 0.30, 0.15, 0.05]], dtype=torch.float64).log()
    keep = lambda **kw: checks.support_mask(lp, SamplingSpec(**kw)).flatten().tolist()  # noqa: E731
    assert keep(top_k=2) == [True, True, False, False]
    assert keep(top_p=0.75) == [True, True, False, False]   # 0.5 < 0.75, then 0.8 crosses it
    assert keep(top_p=0.5) == [True, False, False, False]   # mass before B is 0.5, not < 0.5
    assert keep(top_p=0.4) == [True, False, False, False]
    assert keep(min_p=0.5) == [True, True, False, False]    # 0.3 >= 0.25, 0.15 < 0.25
    assert keep(top_k=3, min_p=0.4) == [True, True, False, False]  # min-p on renormalised top-3
    assert keep() == [True] * 4
    p = replay_logp(lp.repeat(3, 1), torch.tensor([0, 1, 2]), SamplingSpec(top_k=3, top_p=0.8)).exp()
    assert p[:2].tolist() == pytest.approx([0.625, 0.375]) and p[2].item() == 0.0
    # greedy stores the temperature-1 log-prob (agentrl.model.sample_next)
    assert replay_logp(lp, torch.tensor([0]), SamplingSpec(temperature=0)).exp().item() == pytest.approx(0.5)
    with pytest.raises(ValueError, match='1 logits rows for 2 ids'):
        replay_logp(lp, torch.tensor([0, 1]), SamplingSpec())


def test_classify_tokens_vectorised():
    logits = torch.tensor([[2.0, 1.0, 0.0]] * 3)
    stored = torch.tensor([-0.1429, -0.4076, -5.0])
    log_ratio, kind = classify_tokens(logits, torch.tensor([0, 0, 0]), stored, SamplingSpec(0.5), tol=1e-3)
    assert [checks.TOKEN_KINDS[k] for k in kind] == ['match', 'logp_mode_mismatch', 'policy_change']


def test_never_rescale_stored_logps():
    spec = SamplingSpec(temperature=0.5, logp_mode='raw')
    stored = torch.tensor([-0.4076])
    with pytest.raises(checks.LogpConversionError, match=r'sample_logp: holds raw log-probs.*needs the logits'):
        convert_logp(stored, spec, 'processed')
    assert convert_logp(stored, spec, 'raw').tolist() == stored.tolist()
    out = convert_logp(stored, spec, 'processed', logits=torch.tensor([[2.0, 1.0, 0.0]]), ids=torch.tensor([0]))
    assert out.item() == pytest.approx(-0.1429, abs=5e-5)


def test_scripted_records_never_enter_a_ratio():
    rec = one_token_record(0.0, None, 3, logp_placeholder=True)
    with pytest.raises(checks.ScriptedRecordError, match=r'provenance.logp_placeholder: is True.*importance ratio'):
        replay_check([rec], fixed_model([[2.0, 1.0, 0.0]] * 2))
    with pytest.raises(checks.MissingProvenanceError, match='provenance.sampling'):
        replay_check([one_token_record(-1.0, None, 3)], fixed_model([[2.0, 1.0, 0.0]] * 2))
    # per-turn contexts are replayed (each turn after its own context); inconsistent ones are refused
    lp0 = float(torch.log_softmax(torch.tensor([2.0, 1.0, 0.0]), -1)[0])
    rec = one_token_record(lp0, SamplingSpec(), 3)
    rec.turn_contexts = [(1, torch.tensor([2]))]
    rep = replay_check([rec], fixed_model([[2.0, 1.0, 0.0]] * 2))
    assert rep.ok and [r.key for r in rep.records] == ['g/r#1 turn 0'] and rep.overall.n == 1
    rec.turn_contexts = [(0, torch.tensor([2]))]
    with pytest.raises(checks.ReplayUnsupportedError, match=r'turn_contexts: is inconsistent with the record \(traj.turn_contexts\[0\] starts at 0 but turn 0 starts at token 1\)'):
        replay_check([rec], fixed_model([[2.0, 1.0, 0.0]] * 2))


# ------------------------------------------------------------------------------ validator

EXPECTED = Expected(tokenizer='tokA', template='tplA', pad_id=0, eot_ids=(6,))


def issue_record(mask=None):
    # ids [p1, p2, a1, a2, EOS]; owners prompt, prompt, policy, policy, policy
    t = Trajectory.from_tokens([11, 12, 21, 22, 6], ['prompt', 'prompt', 'policy', 'policy', 'policy'],
                               [-1, -1, 0, 0, 0], [0.0, 0.0, -0.5, -0.25, -0.125], 1.0, {},
                               provenance=Provenance(policy='model', tokenizer='tokA', template='tplA',
                                                     sampling=SamplingSpec()))
    if mask is not None:
        t.action_mask = torch.tensor(mask, dtype=torch.float32)
    return t


def test_validate_issue_case():
    t = issue_record()
    assert t.action_mask.tolist() == [0, 1, 1, 1]
    validate(t, EXPECTED)
    validate(t)
    with pytest.raises(checks.MaskOnNonPolicyError) as e:
        validate(issue_record([1, 1, 1, 0]), EXPECTED)
    msg = str(e.value)
    assert msg.startswith('action_mask[0]: is 1 but ids[1] is owned by prompt')
    assert 'shifted twice' in msg and 'Fix: derive the mask from owner' in msg
    assert (e.value.field, e.value.position, e.value.kind) == ('action_mask', 0, 'MaskOnNonPolicyError')
    kinds = [p.kind for p in find_problems(issue_record([1, 1, 1, 0]), EXPECTED)]
    assert kinds == ['MaskOnNonPolicyError', 'EndOfTurnNotTrainedError']
    kinds = [p.kind for p in find_problems(issue_record([1, 1, 1, 0]))]   # no end-of-turn id known
    assert kinds == ['MaskOnNonPolicyError', 'MaskMissingOnPolicyError']
    with pytest.raises(checks.MaskMissingOnPolicyError, match='never shifted'):
        validate(issue_record([0, 0, 1, 1]))


def test_validate_messages_name_field_position_fix():
    t = issue_record()
    t.sample_logp[2] = float('nan')
    with pytest.raises(checks.NaNLogProbError, match=r'^sample_logp\[2\]: is NaN .*ids\[3\].*Fix: store'):
        validate(t)
    t = issue_record()
    t.sample_logp[1:] = 0.5
    with pytest.raises(checks.PositiveLogProbError, match=r'^sample_logp\[1\]: .*\(and 2 more positions\)'):
        validate(t)
    t = issue_record()
    with pytest.raises(checks.TokenizerMismatchError, match="provenance.tokenizer: is 'tokA' but 'tokB'"):
        validate(t, {'tokenizer': 'tokB'})
    assert isinstance(checks.TokenizerMismatchError('x', field='f'), checks.FingerprintMismatchError)
    t = issue_record()
    t.provenance = None
    validate(t, require_provenance=False)
    with pytest.raises(checks.MissingProvenanceError, match='Fix: attach a Provenance'):
        validate(t)
    # context positions need no probability
    t = issue_record()
    t.sample_logp[0] = float('nan')
    validate(t, EXPECTED)
    with pytest.raises(TypeError, match='expected must be'):
        validate(issue_record(), 42)


# hypothesis: random valid records, then one corruption at a time

@st.composite
def valid_record(draw):
    word = st.integers(8, 99)
    ids, owner, logp = [1], [TPL], [0.0]
    ids += draw(st.lists(word, min_size=1, max_size=4))
    owner += [P] * (len(ids) - 1)
    n_turns = draw(st.integers(1, 3))
    for k in range(n_turns):
        span = draw(st.lists(word, min_size=1, max_size=4))
        if k == 0 or draw(st.booleans()):   # the first call ends with an end-of-turn token
            span.append(6)
        ids += span
        owner += [POL] * len(span)
        if k < n_turns - 1 or draw(st.booleans()):
            obs = draw(st.lists(word, min_size=0, max_size=4))
            ids += [3, *obs, 4]
            owner += [TPL] + [TOOL] * len(obs) + [TPL]
    n_pad = draw(st.integers(0, 3))
    ids += [0] * n_pad
    owner += [TPL] * n_pad
    ctx_logp = st.sampled_from([0.0, float('nan'), -3.0])
    logp = [draw(st.floats(-30, 0)) if o == POL else draw(ctx_logp) for o in owner]
    turn = [0] * len(ids)
    prov = Provenance(policy='model', tokenizer='tokA', template='tplA',
                      sampling=draw(st.sampled_from([SamplingSpec(), SamplingSpec(0.7, top_k=5)])))
    return Trajectory.from_tokens(ids, owner, turn, logp, 0.0, {}, provenance=prov)


def _rows(t, pred):
    return [j for j in range(len(t.ids) - 1) if pred(j)]


def _trailing_pad_rows(t):
    rows, j = [], len(t.ids) - 1
    while j >= 1 and int(t.ids[j]) == 0 and int(t.owner[j]) != POL:
        rows.append(j - 1)
        j -= 1
    return rows


def corrupt(kind, t, data):
    pick = lambda rows: data.draw(st.sampled_from(rows))  # noqa: E731
    own = lambda j: int(t.owner[j + 1])  # noqa: E731  owner of the token row j predicts
    eot_rows = _rows(t, lambda j: own(j) == POL and int(t.ids[j + 1]) == 6 and int(t.owner[j]) == POL)
    if kind == 'LengthMismatchError':
        field = data.draw(st.sampled_from(['owner', 'turn', 'action_mask', 'sample_logp']))
        v = getattr(t, field)
        setattr(t, field, v[:-1] if data.draw(st.booleans()) else torch.cat([v, v[:1]]))
    elif kind == 'MissingFieldError':
        setattr(t, data.draw(st.sampled_from(['owner', 'action_mask'])), None)
    elif kind == 'UnknownOwnerError':
        t.owner[data.draw(st.integers(0, len(t.ids) - 1))] = data.draw(st.sampled_from([-1, 4, 9]))
    elif kind == 'PolicyFirstTokenError':
        t.owner[0] = POL
    elif kind == 'MaskValueError':
        t.action_mask[pick(list(range(len(t.ids) - 1)))] = data.draw(st.sampled_from([0.5, -1.0, 2.0, float('nan')]))
    elif kind == 'MaskOnNonPolicyError':
        pad = set(_trailing_pad_rows(t))
        t.action_mask[pick(_rows(t, lambda j: own(j) != POL and j not in pad))] = 1.0
    elif kind == 'MaskMissingOnPolicyError':
        t.action_mask[pick(_rows(t, lambda j: own(j) == POL and j not in eot_rows))] = 0.0
    elif kind == 'EndOfTurnNotTrainedError':
        t.action_mask[pick(eot_rows)] = 0.0
    elif kind == 'PaddingMaskedError':
        if not _trailing_pad_rows(t):
            n = len(t.ids)
            t.ids, t.owner, t.turn = (torch.cat([t.ids, torch.zeros(1, dtype=torch.long)]),
                                      torch.cat([t.owner, torch.tensor([TPL])]), torch.cat([t.turn, t.turn[-1:]]))
            t.action_mask, t.sample_logp = torch.cat([t.action_mask, torch.zeros(1)]), torch.cat(
                [t.sample_logp, torch.zeros(1)])
            assert len(t.ids) == n + 1
        t.action_mask[pick(_trailing_pad_rows(t))] = 1.0
    elif kind == 'MissingLogProbError':
        t.sample_logp = None
    elif kind in ('NaNLogProbError', 'InfiniteLogProbError', 'PositiveLogProbError'):
        value = {'NaNLogProbError': st.just(float('nan')),
                 'InfiniteLogProbError': st.sampled_from([float('inf'), float('-inf')]),
                 'PositiveLogProbError': st.floats(1e-3, 50)}[kind]
        t.sample_logp[pick(_rows(t, lambda j: own(j) == POL))] = data.draw(value)
    elif kind == 'MissingProvenanceError':
        if data.draw(st.booleans()):
            t.provenance = None
        else:
            t.provenance.sampling = None
    elif kind == 'TokenizerMismatchError':
        t.provenance.tokenizer = 'tokB'
    elif kind == 'TemplateMismatchError':
        t.provenance.template = ''
    else:
        raise AssertionError(kind)
    return t


CORRUPTIONS = ['LengthMismatchError', 'MissingFieldError', 'UnknownOwnerError', 'PolicyFirstTokenError',
               'MaskValueError', 'MaskOnNonPolicyError', 'MaskMissingOnPolicyError', 'EndOfTurnNotTrainedError',
               'PaddingMaskedError', 'MissingLogProbError', 'NaNLogProbError', 'InfiniteLogProbError',
               'PositiveLogProbError', 'MissingProvenanceError', 'TokenizerMismatchError', 'TemplateMismatchError']


@settings(deadline=None)
@given(t=valid_record())
def test_valid_records_pass(t):
    validate(t, EXPECTED)
    assert find_problems(t, EXPECTED) == []


@pytest.mark.parametrize('kind', CORRUPTIONS)
@settings(deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(t=valid_record(), data=st.data())
def test_each_corruption_refused_with_its_type(kind, t, data):
    bad = corrupt(kind, t, data)
    cls = getattr(checks, kind)
    with pytest.raises(RecordError) as e:
        validate(bad, EXPECTED)
    assert type(e.value) is cls, str(e.value)
    assert isinstance(e.value, ValueError) and 'Fix: ' in str(e.value) and e.value.field in str(e.value)
    assert {p.kind for p in find_problems(bad, EXPECTED)} == {kind}


junk_tensor = st.one_of(
    st.none(),
    st.lists(st.integers(-5, 120), max_size=8).map(lambda v: torch.tensor(v, dtype=torch.long)),
    st.lists(st.floats(allow_nan=True, allow_infinity=True, width=32), max_size=8).map(
        lambda v: torch.tensor(v, dtype=torch.float32)))


@settings(deadline=None)
@given(ids=junk_tensor, owner=junk_tensor, turn=junk_tensor, mask=junk_tensor, logp=junk_tensor,
       prov=st.sampled_from([None, Provenance(), Provenance(tokenizer='tokA', template='tplA', logp_placeholder=True)]))
def test_nothing_else_raises(ids, owner, turn, mask, logp, prov):
    t = Trajectory(ids=ids, action_mask=mask, sample_logp=logp, reward=0.0, info={}, owner=owner, turn=turn,
                   provenance=prov)
    for p in find_problems(t, EXPECTED):
        assert isinstance(p, RecordError)
    try:
        validate(t, EXPECTED)
    except RecordError:
        pass


# ------------------------------------------------------------------------------ identity

def test_retry_and_resend_identity():
    t = issue_record()
    t.provenance.group_id, t.provenance.rollout_id = 'g', 'r'
    assert checks.record_key(t) == 'g/r#1'
    again = issue_record()
    again.provenance = replace(t.provenance)
    assert checks.is_resend(t, again)                   # same identity, same content
    retry = issue_record()
    retry.sample_logp[1] = -0.7                         # sampled again
    retry.provenance = checks.new_attempt(t)
    assert retry.provenance.attempt == 2 and t.provenance.attempt == 1
    assert not checks.is_resend(t, retry)
    kept, n = checks.dedupe([t, again, retry])
    assert kept == [t, retry] and n == 1
    clash = issue_record()
    clash.sample_logp[1] = -0.7
    clash.provenance = replace(t.provenance)
    with pytest.raises(checks.IdentityConflictError, match=r'provenance.attempt: identity g/r#1 .*new_attempt'):
        checks.dedupe([t, clash])
    assert checks.record_digest(t) == checks.record_digest(again) != checks.record_digest(retry)
    orphan = issue_record()
    orphan.provenance = None
    with pytest.raises(checks.MissingProvenanceError):
        checks.new_attempt(orphan)


# ------------------------------------------------------------------------------ real rollouts

@pytest.fixture(scope='module')
def untrained_rollouts(tasks, tok):
    import agentrl as arl
    torch.manual_seed(0)
    model = arl.TinyAgent(tok.vocab_size).eval()
    gen = torch.Generator().manual_seed(0)
    trajs = arl.rollout_batch(model, [arl.BugFixEnv() for _ in range(6)], tasks[:6], tok, generator=gen)
    trajs += [arl.rollout(model, arl.BugFixEnv(), tasks[0], tok, temperature=0.7, generator=gen)]
    return model, trajs


def test_untrained_tinyagent_replays_to_one(untrained_rollouts, tok):
    model, trajs = untrained_rollouts
    for t in trajs:
        validate(t, Expected.from_tokenizer(tok))
    rep = replay_check(trajs, model)
    assert rep.ok and rep.overall.n == sum(int(t.action_mask.sum()) for t in trajs)
    assert rep.overall.max_abs_dev < 1e-5
    # another model is a policy change, not a sampler problem
    torch.manual_seed(1)
    import agentrl as arl
    other = arl.TinyAgent(tok.vocab_size).eval()
    rep = replay_check(trajs[:2], other)
    assert set(rep.record_kinds) == {'policy_change'}


def test_scripted_rollout_is_valid_but_never_replayed(tasks, tok):
    import agentrl as arl
    t = arl.scripted_rollout(arl.scripted_policy('oracle'), arl.BugFixEnv(), tasks[0], tok)
    validate(t, Expected.from_tokenizer(tok))
    with pytest.raises(checks.ScriptedRecordError):
        replay_check([t], lambda ids: torch.zeros(1, ids.shape[1], tok.vocab_size))


# ------------------------------------------------------------------------------ agentrl check

def sampled_records(model, n, temperature=1.0, seed=0):
    """Sample records token by token with TinyAgent and sample_next (no gym needed)."""
    from agentrl.model import sample_next
    gen = torch.Generator().manual_seed(seed)
    out = []
    for i in range(n):
        ids, owner, logp = [1, 8 + i, 9], [TPL, P, P], [0.0, 0.0, 0.0]
        for turn in range(2):
            for _ in range(3):
                with torch.no_grad():
                    nxt, lp = sample_next(model(torch.tensor([ids]))[:, -1], temperature, generator=gen)
                ids.append(int(nxt))
                owner.append(POL)
                logp.append(float(lp))
            ids += [3, 20 + turn, 4]
            owner += [TPL, TOOL, TPL]
            logp += [0.0] * 3
        out.append(Trajectory.from_tokens(ids, owner, [0] * len(ids), logp, 0.0, {'stop': 'truncated' if i else 'solved'},
                                          provenance=Provenance(policy='model', tokenizer='tokA', template='tplA',
                                                                sampling=SamplingSpec(temperature), model='tiny',
                                                                group_id='g', rollout_id=f'r{i}')))
    return out


def test_cli_check(tmp_path, capsys):
    from agentrl import store
    from agentrl.cli.main import main
    from agentrl.model import TinyAgent
    torch.manual_seed(0)
    model = TinyAgent(40, max_len=32).eval()
    ckpt = tmp_path / 'model.pt'
    torch.save({'state_dict': model.state_dict(), 'vocab_size': 40, 'max_len': 32}, ckpt)
    recs = sampled_records(model, 4, temperature=0.7)
    scripted = issue_record()
    scripted.provenance = replace(scripted.provenance, logp_placeholder=True, sampling=None, rollout_id='s')
    store.write_trajectories(tmp_path / 'ok.parquet', recs + [scripted])
    assert main(['check', str(tmp_path / 'ok.parquet'), '--model', str(ckpt), '--expect-tokenizer', 'tokA',
                 '--max-ratio-dev', '1e-5']) == 0
    out = capsys.readouterr().out
    assert 'records          5  (refused 0, scripted 1)' in out and 'truncation rate  0.600  (episodes stopped truncated or with a turn cut at its budget)' in out
    assert 'refusals by kind: none' in out and 'not replayed: 1 scripted' in out
    assert re.search(r'^  all +24 +1\.0000', out, re.M), out   # 4 records x 6 sampled tokens
    assert 'records: match 4' in out and out.rstrip().endswith('result: OK')
    # refused records: counts by kind, the message, exit code 1
    bad = sampled_records(model, 3)
    bad[0].action_mask = issue_record([1, 1, 1, 0]).action_mask.repeat(6)[:len(bad[0].ids) - 1]
    bad[1].provenance.tokenizer = 'tokB'
    w = store.ShardWriter(tmp_path / 'ds')
    w.write(bad)
    assert main(['check', str(tmp_path / 'ds'), '--expect-tokenizer', 'tokA']) == 1
    out = capsys.readouterr().out
    assert 'records          3  (refused 2, scripted 0)' in out
    assert 'TokenizerMismatchError       1' in out and 'MaskOnNonPolicyError' in out
    assert 'e.g. g/r1#1: TokenizerMismatchError: provenance.tokenizer:' in out
    assert 'result: FAILED (2 of 3 records refused)' in out
    # a record whose declared sampler is wrong (raw stored, processed declared) fails the replay
    lie = sampled_records(model, 1, temperature=0.5)[0]
    lie.provenance.sampling = SamplingSpec(0.5, logp_mode='raw')   # processed stored, raw declared
    store.write_trajectories(tmp_path / 'lie.parquet', [lie])
    assert main(['check', str(tmp_path / 'lie.parquet'), '--model', str(ckpt)]) == 1
    out = capsys.readouterr().out
    assert 'records: logp_mode_mismatch 1' in out and 'e.g. g/r0#1: logp_mode_mismatch' in out
    # another model is a policy change: a failure by default (the step-0 check), reported only with inf
    torch.manual_seed(1)
    torch.save({'state_dict': TinyAgent(40, max_len=32).state_dict(), 'vocab_size': 40, 'max_len': 32}, ckpt)
    assert main(['check', str(tmp_path / 'ok.parquet'), '--model', str(ckpt), '--max-ratio-dev', 'inf']) == 0
    assert 'records: policy_change 4' in capsys.readouterr().out
    assert main(['check', str(tmp_path / 'ok.parquet'), '--model', str(ckpt)]) == 1
    assert 'exceeds --max-ratio-dev' in capsys.readouterr().out
    assert main(['check', str(tmp_path / 'missing.parquet')]) == 2
    assert 'no trajectory file or folder' in capsys.readouterr().err
    (tmp_path / 'notes.txt').write_text('not a checkpoint, not a parquet file\n')
    assert main(['check', str(tmp_path / 'ok.parquet'), '--model', str(tmp_path / 'notes.txt')]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "is not an agentrl TinyAgent checkpoint (torch.load failed: UnpicklingError)" in err
    assert main(['check', str(tmp_path / 'notes.txt')]) == 2
    err = capsys.readouterr().err
    assert err.count('\n') == 1 and 'notes.txt' in err and 'is not a Parquet file' in err


def test_rollout_output_passes_check(tmp_path, tok, capsys):
    import agentrl as arl
    from agentrl.cli.main import main
    from agentrl.checkpoint import save_checkpoint
    torch.manual_seed(0)
    ckpt = str(tmp_path / 'model.pt')
    save_checkpoint(arl.TinyAgent(tok.vocab_size).eval(), ckpt)
    out = str(tmp_path / 'run')
    assert main(['rollout', '--policy', 'model,oracle', '--split', 'heldout', '--repeats', '2', '--out', out,
                 '--checkpoint', ckpt]) == 0
    capsys.readouterr()
    path = str(tmp_path / 'run' / 'trajectories')
    assert main(['check', path, '--model', ckpt, '--expect-tokenizer', tok.fingerprint,
                 '--max-ratio-dev', '1e-5']) == 0
    report = capsys.readouterr().out
    assert 'records          24  (refused 0, scripted 12)' in report
    assert 'records: match 12' in report and report.rstrip().endswith('result: OK')


def test_end_of_turn_rule_exempts_turns_cut_at_the_token_limit():
    # prompt, policy turn 0 cut at max_new_tokens, then the template closes it with EOS (id 99)
    def record(info):
        return Trajectory.from_tokens([11, 12, 21, 22, 99, 13], ['prompt', 'prompt', 'policy', 'policy', 'template', 'prompt'],
                                      [-1, -1, 0, 0, 0, 0], [0.0, 0.0, -0.5, -0.25, 0.0, 0.0], 0.0, info,
                                      provenance=Provenance(policy='hf', sampling=SamplingSpec()))
    exp = {'eot_ids': (99,)}
    with pytest.raises(checks.EndOfTurnNotTrainedError, match=r'end-of-turn token ids\[4\]=99'):
        checks.validate(record({}), exp)
    checks.validate(record({'template': {'unterminated_turns': [0]}}), exp)
    with pytest.raises(checks.EndOfTurnNotTrainedError):       # another turn's exemption does not apply
        checks.validate(record({'template': {'unterminated_turns': [1]}}), exp)


def test_check_prints_the_would_be_correction_weights(tmp_path, capsys):
    from agentrl import store
    from agentrl.cli.main import main
    from agentrl.jobs.check import CheckOptions, run_check
    from agentrl.model import TinyAgent
    from agentrl.correction import off_policy_correction
    torch.manual_seed(0)
    ckpt = tmp_path / 'model.pt'
    model = TinyAgent(40, max_len=32).eval()
    torch.save({'state_dict': model.state_dict(), 'vocab_size': 40, 'max_len': 32}, ckpt)
    store.write_trajectories(tmp_path / 'ok.parquet', sampled_records(model, 4, temperature=0.7))
    # the sampling model: every weight is 1, nothing clipped or masked
    assert main(['check', str(tmp_path / 'ok.parquet'), '--model', str(ckpt), '--correction', 'token_tis']) == 0
    assert ('  would-be token_tis weights: mean 1.0000  min 1.0000  max 1.0000  clipped 0.00%  masked 0.00% of '
            'tokens (0 units)') in capsys.readouterr().out
    # another model: the printed numbers are off_policy_correction's over the replayed log-ratios
    torch.manual_seed(1)
    torch.save({'state_dict': TinyAgent(40, max_len=32).state_dict(), 'vocab_size': 40, 'max_len': 32}, ckpt)
    rep = run_check(CheckOptions(path=str(tmp_path / 'ok.parquet'), model=str(ckpt), max_ratio_dev=float('inf'),
                                 correction='icepop'))
    lr = torch.stack([r.log_ratio.float() for r in rep.replays])          # 4 records x 6 sampled tokens
    want = off_policy_correction(lr, torch.zeros_like(lr), torch.ones_like(lr), 'icepop').metrics
    assert rep.weights == want and want['corr_masked_frac'] > 0
    assert main(['check', str(tmp_path / 'ok.parquet'), '--correction', 'icepop']) == 2
    assert '--correction needs --model' in capsys.readouterr().err


#: run in a subprocess: ``agentrl ARGS...``, then print the agentrl.gym modules it imported (none expected)
# printed once the command returned (not from an exit handler: the agentrl process ends in its own last one)
_GYM_FREE = '''import runpy, sys
sys.argv = ['agentrl', *sys.argv[1:]]
try:
    runpy.run_module('agentrl', run_name='__main__')
finally:
    print('gym modules:', sorted(m for m in sys.modules if m.startswith('agentrl.gym')))
'''


def test_model_free_check_never_imports_the_gym(tmp_path, tasks, tok):
    """The word-level facts a check needs are data (agentrl.tokenizer.BUGFIX_VOCAB), not a run of the gym."""
    import subprocess
    import sys

    import agentrl as arl
    from agentrl import store
    recs = [arl.scripted_rollout(arl.scripted_policy(p), arl.BugFixEnv(), tasks[0], tok) for p in ('oracle', 'blind')]
    for i, r in enumerate(recs):
        r.provenance = replace(r.provenance, group_id='g', rollout_id=f'r{i}')
    store.ShardWriter(tmp_path / 'run' / 'trajectories').write(recs)
    out = subprocess.run([sys.executable, '-c', _GYM_FREE, 'check', str(tmp_path / 'run' / 'trajectories')], capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert 'records          2  (refused 0, scripted 2)' in out.stdout and 'result: OK' in out.stdout
    assert out.stdout.rstrip().endswith('gym modules: []')
    # the BugFix vocabulary's size comes from that data too: an id past it is refused, still without the gym
    bad = recs[1]
    bad.ids[1] = tok.vocab_size
    store.write_trajectories(tmp_path / 'bad.parquet', [bad])
    out = subprocess.run([sys.executable, '-c', _GYM_FREE, 'check', str(tmp_path / 'bad.parquet')],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 1 and out.stdout.rstrip().endswith('gym modules: []'), out.stdout + out.stderr
    assert 'TokenIdError: ids[1]: is 316, not a token id (ids are in [0, 316), the vocabulary of the expected ' \
           'tokenizer)' in out.stdout
