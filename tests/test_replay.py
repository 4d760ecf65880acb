"""agentrl.checks.replay_records: the one replay over a scorer, for every sampler and engine.

Penalties replayed exactly; a sampler left out of (or changed in) the declaration is a
``sampler_mismatch``, never a ``policy_change``; non-finite ratios fail. The Hugging Face part
replays records of ``agentrl rollout --engine hf`` through :func:`agentrl.engines.scorer.load_scorer`.
"""
import dataclasses
import json
import math

import pytest
import torch

import agentrl as arl
from agentrl import checks
from agentrl.record import OWNER, Provenance, SamplingSpec, Trajectory
from agentrl.sampling import PenaltyContext, sample

TPL, P, POL, TOOL = OWNER['template'], OWNER['prompt'], OWNER['policy'], OWNER['tool']


@pytest.fixture(scope='module')
def peaked():
    """A random TinyAgent whose logits are O(1) (a scaled head), so penalties and temperatures matter."""
    torch.manual_seed(0)
    model = arl.TinyAgent(40, max_len=64).eval()
    with torch.no_grad():
        model.head.weight.mul_(60.0)
    return model


def records(model, spec, n=3, seed=0, turns=2, per_turn=5):
    """Sample records token by token: each turn's penalties act on ids[:turn start] and the turn so far."""
    gen = torch.Generator().manual_seed(seed)
    out = []
    for i in range(n):
        ids, owner, turn, logp = [1, 8 + i, 9], [TPL, P, P], [-1, -1, -1], [0.0, 0.0, 0.0]
        for k in range(turns):
            start = len(ids)
            for _ in range(per_turn):
                with torch.no_grad():
                    logits = model(torch.tensor([ids]))[:, -1]
                nxt, lp = sample(logits, spec, generator=gen, context=PenaltyContext.of([ids[:start]], [ids[start:]]))
                ids.append(int(nxt))
                owner.append(POL)
                turn.append(k)
                logp.append(float(lp))
            ids += [3, 20 + k, 4]
            owner += [TPL, TOOL, TPL]
            turn += [k] * 3
            logp += [0.0] * 3
        out.append(Trajectory.from_tokens(ids, owner, turn, logp, 0.0, {},
                                          provenance=Provenance(policy='model', sampling=spec, group_id='g',
                                                                rollout_id=f'r{i}')))
    return out


def declared(trajs, spec):
    return [dataclasses.replace(t, provenance=dataclasses.replace(t.provenance, sampling=spec)) for t in trajs]


@pytest.mark.parametrize('spec', [
    SamplingSpec(repetition_penalty=1.3),
    SamplingSpec(temperature=0.7, top_p=0.9, repetition_penalty=1.3),
    SamplingSpec(repetition_penalty=1.2, presence_penalty=0.5, frequency_penalty=0.3, penalty_semantics='vllm'),
], ids=['rep1.3', 'T0.7-top_p0.9-rep1.3', 'vllm-rep-pres-freq'])
def test_penalised_records_replay_to_one(peaked, spec):
    trajs = records(peaked, spec)
    rep = checks.replay_check(trajs, peaked)
    assert rep.ok and rep.overall.n == 30 and rep.overall.max_abs_dev <= 1e-5


def test_replay_record_of_a_penalised_record_matches_replay_check(peaked):
    """replay_record (precomputed logits) replays penalties against each turn's context, as replay_check does."""
    rec = records(peaked, SamplingSpec(repetition_penalty=1.3), n=1)[0]
    with torch.no_grad():
        logits = peaked(rec.ids[None])[0]
    one = checks.replay_record(rec, logits)
    assert one.ok and one.key == 'g/r0#1' and one.stats.n == 10 and one.stats.max_abs_dev <= 1e-5
    assert torch.equal(one.rows, checks.replay_check([rec], peaked).records[0].rows)


def test_penalty_left_out_of_the_declaration_is_a_sampler_mismatch(peaked):
    """Sampled with repetition_penalty=1.3, declared without: the replay finds the penalty, not a new policy."""
    trajs = records(peaked, SamplingSpec(repetition_penalty=1.3))
    rep = checks.replay_check(declared(trajs, SamplingSpec()), peaked)
    assert rep.record_kinds == {'sampler_mismatch': 3}
    assert {r.detail for r in rep.records} == {'repetition_penalty=1.3'}
    assert rep.overall.max_abs_dev > 1e-3 and not rep.ok
    # another model is still a policy change
    torch.manual_seed(1)
    other = arl.TinyAgent(40, max_len=64).eval()
    assert set(checks.replay_check(trajs, other).record_kinds) == {'policy_change'}


@pytest.mark.parametrize('sampled, relabelled, detail', [(0.7, 1.0, 'temperature=0.7'), (0.7, 0.5, 'temperature=0.7'),
                                                         (1.3, 0.8, 'temperature=1.3')])
def test_temperature_relabel_is_a_sampler_mismatch(peaked, sampled, relabelled, detail):
    trajs = records(peaked, SamplingSpec(temperature=sampled))
    rep = checks.replay_check(declared(trajs, SamplingSpec(temperature=relabelled)), peaked)
    assert rep.record_kinds == {'sampler_mismatch': 3} and {r.detail for r in rep.records} == {detail}
    assert 'sampler_mismatch' in rep.table()


def test_non_finite_ratios_fail(peaked):
    trajs = records(peaked, SamplingSpec(), n=2)
    broken = arl.TinyAgent(40, max_len=64).eval()
    with torch.no_grad():
        for p in broken.parameters():
            p.fill_(float('nan'))
    rep = checks.replay_check(trajs, broken)
    assert not rep.ok and rep.record_kinds == {'non_finite': 2}
    assert rep.overall.max_abs_dev == math.inf and not rep.overall.max_abs_dev <= 1e-3
    assert checks.RatioStats.of(torch.tensor([0.0, float('nan')])).max_abs_dev == math.inf


def test_per_turn_contexts_replay_each_turn_in_its_context(peaked):
    """A record whose turn 1 was sampled after a context the final ids do not hold (a rewritten history)."""
    spec = SamplingSpec(temperature=0.8, repetition_penalty=1.3)
    gen = torch.Generator().manual_seed(3)
    ids, owner, turn, logp, ctxs = [1, 8, 9], [TPL, P, P], [-1, -1, -1], [0.0] * 3, []
    for k in range(2):
        ctx = list(ids) if k == 0 else [1, 30, 31] + ids[3:]          # turn 1 saw another prompt
        ctxs.append((len(ids), torch.tensor(ctx)))
        seq = list(ctx)
        for _ in range(4):
            with torch.no_grad():
                logits = peaked(torch.tensor([seq]))[:, -1]
            nxt, lp = sample(logits, spec, generator=gen, context=PenaltyContext.of([ctx], [seq[len(ctx):]]))
            seq.append(int(nxt))
            ids.append(int(nxt))
            owner.append(POL)
            turn.append(k)
            logp.append(float(lp))
        ids += [3, 20, 4]
        owner += [TPL, TOOL, TPL]
        turn += [k] * 3
        logp += [0.0] * 3
    rec = Trajectory.from_tokens(ids, owner, turn, logp, 0.0, {}, turn_contexts=ctxs,
                                 provenance=Provenance(policy='model', sampling=spec, group_id='g', rollout_id='r'))
    rep = checks.replay_check([rec], peaked)
    assert rep.ok and [r.key for r in rep.records] == ['g/r#1 turn 0', 'g/r#1 turn 1']
    assert rep.overall.n == 8 and rep.overall.max_abs_dev <= 1e-5
    assert rep.records[1].rows.tolist() == [j - 1 for j in range(len(ids)) if turn[j] == 1 and owner[j] == POL]
    flat = checks.replay_check([dataclasses.replace(rec, turn_contexts=None)], peaked)
    assert not flat.ok and flat.records[0].token_kinds['match'] >= 4           # turn 0 still matches


def test_scorer_of_a_checkpoint(peaked, tmp_path):
    from agentrl.engines.scorer import load_scorer
    from agentrl.model import save_checkpoint
    save_checkpoint(peaked, str(tmp_path / 'model.pt'))
    scorer = load_scorer(tmp_path / 'model.pt')
    assert scorer.name == 'model.pt' and scorer.max_len == 64
    rep = checks.replay_records(records(peaked, SamplingSpec(top_k=5)), scorer, batch_size=2)
    assert rep.ok and rep.overall.max_abs_dev <= 1e-5
    long = records(peaked, SamplingSpec(), n=1, turns=8)
    with pytest.raises(checks.ReplayUnsupportedError, match='ids: has 67 tokens to score but the model takes at most 64'):
        checks.replay_records(long, scorer)
    with pytest.raises(FileNotFoundError, match='not found; pass a TinyAgent model.pt file or a Hugging Face'):
        load_scorer(tmp_path / 'nope.pt')
    (tmp_path / 'empty').mkdir()
    with pytest.raises(FileNotFoundError, match='is a folder without config.json'):
        load_scorer(tmp_path / 'empty')


# ------------------------------------------------------------------------------ Hugging Face engine records

@pytest.fixture(scope='module')
def hf_model_dir(tmp_path_factory):
    pytest.importorskip('transformers')
    from _tokenizers import tokenizer_path
    from agentrl.engines import hf
    out = tmp_path_factory.mktemp('tiny-qwen3-replay')
    return hf.make_test_model(out, tokenizer_path('qwen3'), token_rates={'</think>': 0.05})


@pytest.mark.parametrize('flags, spec', [([], SamplingSpec()),
                                         (['--temperature', '0.7', '--top-p', '0.9'], SamplingSpec(0.7, top_p=0.9))],
                         ids=['T1', 'T0.7-top_p0.9'])
def test_hf_engine_records_replay_through_load_scorer(hf_model_dir, tmp_path, monkeypatch, flags, spec):
    from agentrl.cli.main import main
    from agentrl.engines.scorer import load_scorer
    monkeypatch.setattr(torch.cuda, 'is_available', lambda: False)
    out = tmp_path / 'run'
    assert main(['rollout', '--engine', 'hf', '--model', str(hf_model_dir), '--split', 'heldout', '--repeats', '1',
                 '--max-new-tokens', '8', '--max-turns', '2', '--out', str(out), *flags]) == 0
    trajs = arl.read_trajectories(out / 'trajectories')
    assert all(t.provenance.sampling == spec for t in trajs)
    scorer = load_scorer(hf_model_dir)
    assert scorer.name == hf_model_dir.name
    rep = checks.replay_records(trajs, scorer, batch_size=3)
    assert rep.ok and rep.overall.n == sum(int(t.action_mask.sum()) for t in trajs)
    assert rep.overall.max_abs_dev <= 1e-5, rep.table()
    assert json.loads((out / 'summary.json').read_text())['hf']['sampling'] == spec.to_dict()


@pytest.fixture(scope='module')
def hf_lm(hf_model_dir):
    from agentrl.engines import hf
    return hf.load_model(hf_model_dir)


@pytest.mark.parametrize('spec', [SamplingSpec(), SamplingSpec(0.7, top_p=0.9),
                                  SamplingSpec(repetition_penalty=1.3),
                                  SamplingSpec(0.9, repetition_penalty=1.2, presence_penalty=0.4, frequency_penalty=0.3,
                                               penalty_semantics='vllm')],
                         ids=['T1', 'T0.7-top_p0.9', 'rep1.3', 'vllm-penalties'])
def test_hf_per_turn_context_records_replay_to_one(hf_lm, hf_model_dir, spec):
    """Thinking mode + a new user message: earlier reasoning is stripped, so turns carry their own contexts."""
    from agentrl.engines import hf
    from agentrl.engines.scorer import load_scorer
    from agentrl.templates import ChatRecorder, ChatTemplate
    model, tok = hf_lm
    template = ChatTemplate(tok)
    n = 2 if spec.penalized else 4                         # the mismatch fit scores a 151k vocabulary: keep it small
    sampler = hf.HFSampler(model, template.stop_ids, spec, max_new_tokens=24 if n == 4 else 16)
    recs = [ChatRecorder(template, [{'role': 'user', 'content': f'Question {i}?'}]) for i in range(n)]

    def respond(i, turn, text):
        return hf.Reply(messages=[{'role': 'user', 'content': 'And one more thing?'}], action=text)

    trajs = hf.run_chat_episodes(sampler, recs, respond, seeds=range(n), max_turns=3)
    assert any(t.turn_contexts is not None for t in trajs)
    rep = checks.replay_records(trajs, load_scorer(hf_model_dir))
    assert rep.ok and rep.overall.max_abs_dev <= 1e-5, rep.table()
    assert sum(' turn ' in r.key for r in rep.records) >= 2
    if spec.repetition_penalty != 1.0:      # declared without the repetition penalty: a sampler mismatch
        bare = dataclasses.replace(spec, repetition_penalty=1.0)
        kinds = checks.replay_records(declared(trajs, bare), load_scorer(hf_model_dir)).record_kinds
        assert 'policy_change' not in kinds and 'sampler_mismatch' in kinds, kinds


def test_hf_another_model_is_a_policy_change(hf_lm, tmp_path):
    from _tokenizers import tokenizer_path
    from agentrl.engines import hf
    from agentrl.engines.scorer import load_scorer
    from agentrl.templates import ChatRecorder, ChatTemplate
    model, tok = hf_lm
    template = ChatTemplate(tok)
    sampler = hf.HFSampler(model, template.stop_ids, SamplingSpec(0.8), max_new_tokens=12)
    recs = [ChatRecorder(template, [{'role': 'user', 'content': f'Question {i}?'}]) for i in range(2)]
    trajs = hf.run_chat_episodes(sampler, recs, lambda i, turn, text: hf.Reply(messages=[], action=text, done=True),
                                 seeds=range(2), max_turns=1)
    other = hf.make_test_model(tmp_path / 'other', tokenizer_path('qwen3'), seed=1)
    kinds = checks.replay_records(trajs, load_scorer(other)).record_kinds
    assert kinds == {'policy_change': 2}, kinds


def test_hf_trainer_scores_with_attention_dropout_off(hf_model_dir):
    """A Hugging Face model whose attention dropout is 0.1: the GRPO step-0 ratio is still 1."""
    from agentrl.engines import hf
    from agentrl.templates import ChatRecorder, ChatTemplate
    from agentrl.train import GRPOOptions, grpo_step, token_log_probs
    model, tok = hf.load_model(hf_model_dir)
    for layer in model.model.layers:
        layer.self_attn.attention_dropout = 0.1
    model.config.attention_dropout = 0.1
    template = ChatTemplate(tok)
    sampler = hf.HFSampler(model, template.stop_ids, SamplingSpec(), max_new_tokens=8)
    recs = [ChatRecorder(template, [{'role': 'user', 'content': 'Hi?'}]) for _ in range(2)]
    trajs = hf.run_chat_episodes(sampler, recs, lambda i, turn, text: hf.Reply(messages=[], action=text, done=True,
                                                                              reward=float(i)),
                                 seeds=range(2), max_turns=1)
    trajs = [dataclasses.replace(t, provenance=dataclasses.replace(t.provenance, group_id='g', rollout_id=f'g/{i}'))
             for i, t in enumerate(trajs)]
    assert [t.reward for t in trajs] == [0.0, 1.0]
    batch = arl.collate(trajs, 0)
    model.train()                                             # the old trainer's mode: dropout moves the ratio
    with torch.no_grad():
        logp, _ = token_log_probs(model, batch.ids)
    dev = float(((logp - batch.sample_logp).exp() - 1).abs().mul(batch.action_mask).max())
    assert dev > 1e-3
    m = grpo_step(model, torch.optim.SGD(model.parameters(), lr=0.0), trajs, 2, 0, GRPOOptions(ratio_tol=1e-5))
    assert m['ratio_dev0'] <= 1e-5 and m['dropout_disabled'] == 1.0 and m['updates'] == 1


def test_replay_scores_in_eval_mode(peaked):
    """A model left in train mode with dropout still replays to 1: scorers switch dropout off."""
    trajs = records(peaked, SamplingSpec(), n=2)
    peaked.blocks[0].mlp.append(torch.nn.Dropout(0.5))
    try:
        peaked.train()
        rep = checks.replay_check(trajs, peaked)
        assert rep.ok and rep.overall.max_abs_dev <= 1e-5 and peaked.training
    finally:
        del peaked.blocks[0].mlp[3]
        peaked.eval()
