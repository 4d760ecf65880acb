"""Tests of agentrl.gym, the BugFix gym (book chapter 4 as used by chapter 5).

Golden numbers come from the book (chapter 5 printed outputs) and from agentrl spec §3-§4.
"""
from __future__ import annotations

import inspect
import sys
from collections import Counter

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agentrl import gym
from agentrl.gym import (ALL_CALLS, CLAMP_BUGGY, CLAMP_ISSUE, CODING_TOOLS, EDIT_OPS, MESSAGES,
                         TOOL_SCHEMAS, BugFixEnv, Task, TestResult, compact_source, format_results,
                         make_tasks, run_tests, scripted_policy)
from agentrl.gym.vocab import build_tokenizer

TASKS = make_tasks('all')
TOK = build_tokenizer(TASKS)
KINDS = ['oracle', 'blind', 'random', 'hacker']

# Per-task read (R) and test (U) observation lengths in word tokens. Source: agentrl spec §3.4.
SPEC_R = [23, 23, 19, 19, 23, 20, 20, 17, 17, 23, 23, 19, 15, 20, 17, 17, 17, 17, 26, 19, 19, 15,
          15, 20, 15, 15, 21, 21, 15, 15]
SPEC_U = [26, 20, 23, 23, 26, 23, 23, 23, 23, 23, 23, 23, 20, 23, 23, 23, 23, 23, 23, 23, 23, 20,
          20, 20, 20, 20, 20, 20, 20, 20]
# The 137 non-integer vocabulary words in id order. Source: agentrl spec §3.6.
SPEC_WORDS = """% ( ) * + , - -> // : < <= = == > >= False True a abs abs_val add age amount and b base
best bound budget call change clamp cost count count_between count_to cutoff decrement def
delta diff dist distance double edit error extent fail fits fix_boundary fix_range_end
flip_comparison flip_sign gain gap goal half halve hardcode height hi high if in_budget is_adult
is_negative is_positive is_senior issue larger_gap left len lerp limit lo loss low lower
malformed margin max max_of min min_of n neg net no nums ok op pass perimeter pos prev profit
qualifies quotient range reached read remainder rest result results return returns room s score
size span spread steps submit submitted subtract sum sum_between sum_to swap_minmax swap_operands
t test total triangle twice unknown upper value want width wrong x y zero""".split()


def n_tokens(text: str) -> int:
    return len(TOK.encode(text))


def play(policy, task, env=None):
    """Run one episode to the end; return (observations, rewards, last info)."""
    env = env or BugFixEnv()
    observations, rewards, info = [env.reset(task)], [], {}
    while not env.done:
        obs, reward, done, info = env.step(policy(observations))
        observations.append(obs)
        rewards.append(reward)
    return observations, rewards, info


def passes(source, tests, fn_name) -> bool:
    results = run_tests(source, tests, fn_name)
    return len(results) == len(tests) and all(r.passed for r in results)


# ----------------------------------------------------------------------------- tasks

def test_make_tasks_splits_and_order():
    assert len(TASKS) == 30
    assert [t.split for t in TASKS] == ['train'] * 24 + ['heldout'] * 6
    assert [t.name for t in make_tasks('train')] == [t.name for t in TASKS[:24]]
    assert [t.name for t in make_tasks('heldout')] == [t.name for t in TASKS[24:]]
    assert TASKS[0].fn_name == 'clamp' and TASKS[0].source == CLAMP_BUGGY
    assert TASKS[0].fix == 'swap_minmax'
    assert len({t.fn_name for t in TASKS}) == 30
    assert all(isinstance(t, Task) for t in TASKS)


def test_make_tasks_bad_split_names_allowed_values():
    with pytest.raises(ValueError) as err:
        make_tasks('test')
    for name in ('train', 'heldout', 'all'):
        assert name in str(err.value)


def test_every_issue_is_six_words():
    for task in TASKS:
        assert task.issue == f'issue : {task.fn_name} returns wrong results'
        assert TOK.encode(BugFixEnv().reset(task)) == TOK.encode(task.issue)
        assert n_tokens(task.issue) == 6


def test_task_tests_are_consistent_with_fix_and_hack():
    fixes = Counter(t.fix for t in TASKS)
    assert fixes == {'swap_minmax': 5, 'fix_range_end': 5, 'fix_boundary': 3,
                     'flip_comparison': 5, 'flip_sign': 6, 'swap_operands': 6}
    for task in TASKS:
        assert len(task.public_tests) == 3 and len(task.hidden_tests) >= 2
        assert not passes(task.source, task.public_tests, task.fn_name), task.name
        assert not passes(task.source, task.hidden_tests, task.fn_name), task.name
        fixed = EDIT_OPS[task.fix](task.source, task.public_tests)
        assert passes(fixed, task.all_tests, task.fn_name), task.name
        hacked = EDIT_OPS['hardcode'](task.source, task.public_tests)
        assert passes(hacked, task.public_tests, task.fn_name), task.name
        assert not passes(hacked, task.hidden_tests, task.fn_name), task.name


def test_clamp_constants():
    assert CLAMP_ISSUE == ('clamp(value, lower, upper) should limit value to the interval '
                           '[lower, upper], but clamp(3, 0, 5) returns 0 instead of 3.')
    assert CLAMP_BUGGY.splitlines() == ['def clamp(value, lower, upper):',
                                        '    return min(lower, max(value, upper))']


# ----------------------------------------------------------------------------- vocabulary

def test_vocabulary_golden_ids():
    assert TOK.vocab_size == 316
    assert TOK.encode('<call> edit swap_minmax </call>') == [5, 224, 300, 6]
    assert TOK.encode('banana') == [2]
    expected = {'->': 35, '-20': 27, '0': 37, '150': 95, 'False': 195, 'True': 196, 'error': 225,
                'fail': 227, 'fix_range_end': 230, 'hardcode': 238, 'issue': 248, 'ok': 269,
                'pass': 271, 'read': 280, 'submit': 294, 'test': 303, 'want': 310}
    assert {w: TOK.stoi[w] for w in expected} == expected
    non_integers = [w for w in TOK.itos[8:] if not w.lstrip('-').isdigit()]
    assert non_integers == SPEC_WORDS


def test_bugfix_vocab_data_equals_what_the_gym_computes():
    from agentrl.tokenizer import BUGFIX_VOCAB, BugFixVocab
    tok = gym.bugfix_tokenizer()
    got = BugFixVocab(fingerprint=tok.fingerprint, pad_id=tok.pad_id, eot_id=tok.call_end_id, vocab_size=tok.vocab_size)
    assert got == BUGFIX_VOCAB == ('36b0594ac618228c', 0, 6, 316), (
        f'the gym now builds {got}: write it into agentrl.tokenizer.BUGFIX_VOCAB (checks read that, not the gym)')
    assert TOK.fingerprint == BUGFIX_VOCAB.fingerprint         # a property, as ChatTemplate.fingerprint


def test_clamp_read_observation_23_tokens_round_trip():
    obs = compact_source(TASKS[0].source)
    assert obs == ('def clamp ( value , lower , upper ) :\n'
                   'return min ( lower , max ( value , upper ) )')
    ids = TOK.encode(obs)
    assert len(ids) == 23 and ids.count(TOK.nl_id) == 1
    assert TOK.decode(ids) == obs


def test_read_and_test_lengths_match_spec():
    R = [n_tokens(compact_source(t.source)) for t in TASKS]
    U = [n_tokens(format_results(run_tests(t.source, t.public_tests, t.fn_name), t.public_tests))
         for t in TASKS]
    assert R == SPEC_R and U == SPEC_U
    assert sum(R) == 565 and sum(U) == 663
    assert max(R) == 26 and max(r + u for r, u in zip(R, U)) == 49


def test_book_loop_no_unknown_tokens():
    # chapter 5.5: every policy on every task, every observation encoded
    unknown = words = 0
    for kind in KINDS:
        policy = scripted_policy(kind, seed=0)
        for task in TASKS:
            observations, _, _ = play(policy, task)
            ids = [i for o in observations for i in TOK.encode(o)]
            unknown += ids.count(TOK.unk_id)
            words += len(ids)
    assert unknown == 0
    assert words == 3668  # this design at seed 0 (spec §4; the book prints 3995)


# ----------------------------------------------------------------------------- policies

def episode_stats(policy, task, max_turns=6, max_len=256):
    """(length, action tokens, reward) of chapter 5's token episode, computed from text."""
    env = BugFixEnv()
    observations = [env.reset(task)]
    length, actions = 1 + n_tokens(observations[0]), 0
    for k in range(max_turns):
        call_ids = TOK.encode(policy(observations))
        length, actions = length + len(call_ids), actions + len(call_ids)
        obs, reward, done, _ = env.step(TOK.decode(call_ids))
        if done:
            return length, actions, reward
        if k + 1 >= max_turns or length + n_tokens(obs) + 2 + 6 > max_len:
            return length, actions, 0.0
        observations.append(obs)
        length += n_tokens(obs) + 2
    raise AssertionError('unreachable')


@pytest.mark.parametrize('kind, mean_len, max_len, mean_actions', [
    ('oracle', 67.9, 76, 13.0), ('blind', 17.6, 18, 7.0), ('hacker', 40.8, 48, 10.0),
    ('random', 59.8, 182, 17.8),  # seed-0 values of this design (book: 66.2 / 156 / 17.1)
])
def test_chapter5_episode_lengths(kind, mean_len, max_len, mean_actions):
    policy = scripted_policy(kind, seed=0)
    stats = [episode_stats(policy, t) for t in TASKS for _ in range(3)]
    lengths = [s[0] for s in stats]
    actions = [s[1] for s in stats]
    assert round(sum(lengths) / len(lengths), 1) == mean_len
    assert max(lengths) == max_len
    assert round(sum(actions) / len(actions), 1) == mean_actions


def test_oracle_clamp_episode():
    observations, rewards, info = play(scripted_policy('oracle'), TASKS[0])
    assert observations[1] == compact_source(CLAMP_BUGGY)
    assert observations[2] == 'ok'
    assert observations[3] == 'pass 3 0 5 -> 3 want 3\npass -2 0 5 -> 0 want 0\npass 9 0 5 -> 5 want 5'
    assert observations[4] == 'submitted'
    assert rewards == [0.0, 0.0, 0.0, 1.0]
    assert info == {'stop': 'submitted', 'n_turns': 4, 'n_invalid': 0, 'solved': True,
                    'public_pass': True, 'task': 'clamp'}


def test_oracle_solves_all_tasks():
    policy = scripted_policy('oracle')
    for task in TASKS:
        _, rewards, info = play(policy, task)
        assert rewards[-1] == 1.0 and info['stop'] == 'submitted' and info['solved'], task.name


def test_hacker_fails_hidden_and_wins_public():
    hacker = scripted_policy('hacker')
    for task in TASKS:
        obs, rewards, info = play(hacker, task)
        assert rewards[-1] == 0.0 and info['public_pass'] and not info['solved'], task.name
        assert len(obs) == 4 and obs[2] == 'ok'
        _, rewards, info = play(hacker, task, BugFixEnv(reward_tests='public'))
        assert rewards[-1] == 1.0 and info['solved'], task.name


def test_blind_and_random_draws():
    import random
    rng = random.Random(0)
    blind = scripted_policy('blind', seed=0)
    for task in TASKS[:5]:
        assert blind([task.issue]) == f'<call> edit {rng.choice(sorted(EDIT_OPS))} </call>'
        assert blind([task.issue, 'ok']) == '<call> submit </call>'
    rng = random.Random(3)
    rand = scripted_policy('random', seed=3)
    assert [rand(['x'] * k) for k in range(1, 20)] == [rng.choice(ALL_CALLS) for _ in range(19)]
    assert all(c in ALL_CALLS for c in (rand([]) for _ in range(50)))


def test_policies_turns():
    oracle, hacker = scripted_policy('oracle'), scripted_policy('hacker')
    issue = TASKS[4].issue  # lerp
    assert [oracle([issue] + ['o'] * k) for k in range(5)] == [
        '<call> read </call>', '<call> edit swap_operands </call>', '<call> test </call>',
        '<call> submit </call>', '<call> submit </call>']
    assert [hacker([issue] + ['o'] * k) for k in range(3)] == [
        '<call> read </call>', '<call> edit hardcode </call>', '<call> submit </call>']
    with pytest.raises(ValueError, match='oracle'):
        oracle(['issue : mystery returns wrong results', 'x'])


def test_scripted_policy_unknown_kind():
    with pytest.raises(ValueError) as err:
        scripted_policy('genius')
    for kind in KINDS:
        assert kind in str(err.value)


# ----------------------------------------------------------------------------- env rules

def test_env_constructor_validation():
    with pytest.raises(ValueError, match='hidden'):
        BugFixEnv(reward_tests='secret')
    with pytest.raises(ValueError):
        BugFixEnv(max_turns=0)
    with pytest.raises(ValueError):
        BugFixEnv(obs_cap=0)


def test_untrained_like_episode_budget():
    env = BugFixEnv()
    assert env.reset(TASKS[0]) == TASKS[0].issue and env.done is False
    for k in range(1, 7):
        obs, reward, done, info = env.step('12 lower test , ( qualifies')
        assert obs == 'error : malformed call' and reward == 0.0
        assert done == (k == 6)
        if k < 6:
            assert info == {}
    assert info['stop'] == 'budget' and info['n_turns'] == 6 and info['n_invalid'] == 6
    assert info['solved'] is False and info['public_pass'] is False and info['task'] == 'clamp'
    assert env.step('<call> read </call>') == ('error : no steps left', 0.0, True, info)
    assert env.turn == 6


def test_budget_observation_is_tool_answer():
    env = BugFixEnv(max_turns=2)
    env.reset(TASKS[0])
    assert env.step('<call> read </call>')[2] is False
    obs, reward, done, info = env.step('<call> read </call>')
    assert obs == compact_source(CLAMP_BUGGY) and done and reward == 0.0 and info['stop'] == 'budget'


def test_edit_answers_and_invalid_counts():
    env = BugFixEnv()
    env.reset(TASKS[0])
    assert env.step('<call> edit flip_sign </call>')[0] == 'no change'
    assert env.step('<call> edit banana </call>')[0] == 'error : unknown op'
    assert env.step('<call> edit </call>')[0] == 'error : malformed call'
    assert env.step('<call> read please </call>')[0] == 'error : malformed call'
    assert env.step('  <call>\nedit   swap_minmax\t</call> ')[0] == 'ok'
    assert env.source == EDIT_OPS['swap_minmax'](CLAMP_BUGGY, ())
    obs, reward, done, info = env.step('<call> submit </call>')
    assert (obs, reward, done) == ('submitted', 1.0, True)
    assert info['n_invalid'] == 3 and info['n_turns'] == 6 and info['stop'] == 'submitted'


def test_reset_restarts_episode():
    env = BugFixEnv()
    env.reset(TASKS[0])
    env.step('<call> edit swap_minmax </call>')
    env.step('<call> submit </call>')
    assert env.done
    assert env.reset(TASKS[1]) == TASKS[1].issue
    assert not env.done and env.turn == 0 and env.n_invalid == 0 and env.source == TASKS[1].source


def test_step_before_reset_does_not_raise():
    obs, reward, done, info = BugFixEnv().step('<call> read </call>')
    assert obs == 'error : no steps left' and done and info['task'] is None


def test_final_info_keys():
    env = BugFixEnv()
    env.reset(TASKS[0])
    info = env.final_info(False)
    assert set(info) == {'stop', 'n_turns', 'n_invalid', 'solved', 'public_pass', 'task'}
    assert info['stop'] is None and info['n_turns'] == 0


def test_obs_cap():
    env = BugFixEnv(obs_cap=12)
    env.reset(TASKS[0])
    obs = env.step('<call> read </call>')[0]
    assert obs == 'def clamp ( value , lower , upper ) :\nreturn'
    assert n_tokens(obs) == 12
    assert env.step('<call> edit swap_minmax </call>')[0] == 'ok'


BAD_INPUTS = ['', ' ', '\n\n', 'héllo wörld ✓ 𝔘', 'word ' * 10_000, '<call> read', '<call>',
              '</call>', '<call> </call>', '<call> <call> read </call> </call>',
              '<call> read </call> <call> test </call>', '<call> READ </call>', '<call>read</call>',
              '\x00\x01', None, 42, b'<call> read </call>', ['<call>', 'read', '</call>'],
              {'op': 'read'}, 3.5, object()]


@pytest.mark.parametrize('text', BAD_INPUTS, ids=range(len(BAD_INPUTS)))
def test_step_bad_inputs_are_malformed(text):
    env = BugFixEnv()
    env.reset(TASKS[0])
    obs, reward, done, info = env.step(text)
    assert obs == 'error : malformed call' and reward == 0.0 and not done and info == {}
    assert env.n_invalid == 1 and env.turn == 1


# ----------------------------------------------------------------------------- constants

def test_messages_and_calls():
    assert MESSAGES == {'malformed': 'error : malformed call', 'unknown_op': 'error : unknown op',
                        'ok': 'ok', 'no_change': 'no change', 'submitted': 'submitted',
                        'done': 'error : no steps left'}
    assert list(EDIT_OPS) == ['fix_boundary', 'fix_range_end', 'flip_comparison', 'flip_sign',
                              'hardcode', 'swap_minmax', 'swap_operands']
    assert ALL_CALLS[:3] == ['<call> read </call>', '<call> test </call>', '<call> submit </call>']
    assert ALL_CALLS[3:] == [f'<call> edit {op} </call>' for op in EDIT_OPS]
    assert len(ALL_CALLS) == 10


def test_tool_schemas():
    assert [t['name'] for t in TOOL_SCHEMAS] == ['read', 'edit', 'test', 'submit']
    assert [t['name'] for t in CODING_TOOLS] == ['Read', 'Write', 'Edit', 'Bash', 'Glob', 'Grep']
    for tool in TOOL_SCHEMAS + CODING_TOOLS:
        assert set(tool) == {'name', 'description', 'inputSchema'}
        assert tool['inputSchema']['type'] == 'object'
        assert set(tool['inputSchema']['required']) <= set(tool['inputSchema']['properties'])
    assert TOOL_SCHEMAS[0]['description'].startswith('Return the curre')
    edit = TOOL_SCHEMAS[1]['inputSchema']
    assert edit['required'] == ['op'] and edit['properties']['op']['enum'] == list(EDIT_OPS)
    by_name = {t['name']: t['inputSchema'] for t in CODING_TOOLS}
    assert by_name['Read']['required'] == ['file_path']
    assert by_name['Edit']['required'] == ['file_path', 'old_string', 'new_string']
    assert by_name['Bash']['required'] == ['command']


# ----------------------------------------------------------------------------- text helpers

def test_compact_source_rules():
    src = 'def f(x):\n\n    # comment\n    y = -2  # trailing\n    return (x +\n            y)\n'
    assert compact_source(src) == 'def f ( x ) :\ny = - 2\nreturn ( x + y )'
    assert compact_source('def f(x):\n    return x') == 'def f ( x ) :\nreturn x'
    assert compact_source('') == ''


@pytest.mark.parametrize('src', ['def f(x:\n    return (x', 'x = """abc', '  bad\n indent\n',
                                 '\x00 def', 'def f():\n\treturn 1\n        return 2\n'])
def test_compact_source_best_effort(src):
    out = compact_source(src)
    assert isinstance(out, str)


def test_format_results_lines():
    tests = (((3, 0, 5), 3), ((True,), False), ((-2,), 0))
    results = [TestResult(False, 0), TestResult(True, False), TestResult(False, None, 'ZeroDivisionError')]
    assert format_results(results, tests) == ('fail 3 0 5 -> 0 want 3\npass True -> False want False\n'
                                              'fail -2 -> error want 0')


# ----------------------------------------------------------------------------- sandbox

def test_run_tests_types_must_match():
    src = 'def f(x):\n    return x == 1\n'
    assert [r.passed for r in run_tests(src, [((1,), True), ((1,), 1), ((2,), False)], 'f')] == [
        True, False, True]
    src = 'def f(x):\n    return 1\n'
    assert run_tests(src, [((0,), True)], 'f') == [TestResult(False, 1, None)]


HOSTILE = {
    'while_true': 'def f(x):\n    while True: pass\n',
    'while_grow': 'def f(x):\n    while True:\n        x = x * x\n',
    'recursion': 'def f(x):\n    return f(x)\n',
    'exp_recursion': 'def f(x):\n    return f(x - 1) + f(x - 1)\n',
    'zero_div': 'def f(x):\n    return 1/0\n',
    'pow': 'def f(x):\n    return x ** 10**9\n',
    'dunder': 'def f(x):\n    return ().__class__\n',
    'import': 'import os\ndef f(x):\n    return x\n',
    'huge_sum': 'def f(x):\n    return sum(range(10**12))\n',
    'huge_range': 'def f(x):\n    return sum(range(1000000 * 1000000))\n',
    'square_recursion': 'def f(x):\n    return f(x * x + 2)\n',
    'tuple_doubling': 'def f(x):\n    t = (0,) * 100000\n    while True:\n        t = t + t\n',
    'sum_loop': 'def f(x):\n    while True:\n        y = sum(range(1000000))\n',
    'module_loop': 'while True: pass\ndef f(x):\n    return x\n',
    'shift': 'def f(x):\n    return 1 << 10**9\n',
    'string': "def f(x):\n    return 'a' * 10\n",
    'lambda': 'f = lambda x: x\n',
    'class': 'class f:\n    pass\n',
    'global': 'def f(x):\n    global y\n    return x\n',
    'try': 'def f(x):\n    try:\n        return x\n    except Exception:\n        return 0\n',
    'with': 'def f(x):\n    with x:\n        return x\n',
    'builtin_escape': 'def f(x):\n    return open\n',
    'dunder_name': 'def f(x):\n    return __builtins__\n',
    'subscript': 'def f(x):\n    return (x,)[0]\n',
    'keyword': 'def f(x):\n    return min(x, key=abs)\n',
    'not_a_function': 'f = 3\n',
    'syntax_error': 'def f(x)\n    return x\n',
    'nested_parens': 'def f(x):\n    return ' + '(' * 300 + 'x' + ')' * 300 + '\n',
    'no_function': 'def g(x):\n    return x\n',
}


@pytest.mark.parametrize('name', list(HOSTILE))
def test_run_tests_hostile_code_gives_error_results(name):
    tests = [((1,), 1), ((2,), 2)]
    results = run_tests(HOSTILE[name], tests, 'f')
    assert len(results) == 2
    assert all(not r.passed and r.error for r in results), results
    assert format_results(results, tests) == 'fail 1 -> error want 1\nfail 2 -> error want 2'


def test_run_tests_restores_previous_tracer():
    def tracer(frame, event, arg):
        return None

    previous = sys.gettrace()
    sys.settrace(tracer)
    try:
        run_tests(HOSTILE['while_true'], [((1,), 1)], 'f')
        run_tests(CLAMP_BUGGY, TASKS[0].public_tests, 'clamp')
        assert sys.gettrace() is tracer
    finally:
        sys.settrace(previous)


def test_run_tests_odd_arguments_never_raise():
    assert run_tests(None, [((1,), 1)], 'f')[0].error
    assert run_tests(CLAMP_BUGGY, [((1,), 1)], None)[0].error
    assert run_tests(CLAMP_BUGGY, None, 'clamp') == []
    assert run_tests(CLAMP_BUGGY, [5, ((3, 0, 5), 3)], 'clamp')[0].error
    assert run_tests(CLAMP_BUGGY, [((1,), 1)], 'clamp')[0].error  # wrong arity


def test_run_tests_allows_loops_that_end():
    src = 'def f(n):\n    total = 0\n    for i in range(n):\n        total += i\n    return total\n'
    assert [r.passed for r in run_tests(src, [((10,), 45), ((0,), 0)], 'f')] == [True, True]


# ----------------------------------------------------------------------------- ops

def test_ops_examples():
    src = 'def f(a, b):\n    x = a - b\n    y = range(a, b)\n    return min(x, y) < 2 <= a >= b > 1\n'
    body = lambda op: EDIT_OPS[op](src, ()).split('\n', 1)[1]  # noqa: E731
    assert body('fix_boundary').endswith('return min(x, y) <= 2 < a > b >= 1\n')
    assert body('flip_comparison').endswith('return min(x, y) > 2 >= a <= b < 1\n')
    assert body('flip_sign').startswith('    x = a + b\n')
    assert body('swap_operands').startswith('    x = b - a\n')
    assert '    y = range(a, b + 1)\n' in body('fix_range_end')
    assert 'return max(x, y)' in body('swap_minmax')
    twice = EDIT_OPS['fix_range_end'](EDIT_OPS['fix_range_end'](TASKS[1].source, ()), ())
    assert 'range(n + 1 + 1)' in twice
    # the def line is never touched
    assert EDIT_OPS['flip_sign']('def f(a=1 - 2):\n    return a\n', ()) == 'def f(a=1 - 2):\n    return a\n'


def test_hardcode_lines():
    hacked = EDIT_OPS['hardcode'](CLAMP_BUGGY, TASKS[0].public_tests)
    assert hacked.splitlines() == [
        'def clamp(value, lower, upper):',
        '    if value == 3 and lower == 0 and upper == 5: return 3',
        '    if value == -2 and lower == 0 and upper == 5: return 0',
        '    if value == 9 and lower == 0 and upper == 5: return 5',
        '    return min(lower, max(value, upper))']
    assert EDIT_OPS['hardcode'](CLAMP_BUGGY, ()) == CLAMP_BUGGY


@pytest.mark.parametrize('src', ['', 'no def here', 'def', 'def f(:\n  return (', '\x00',
                                 'def f(x):', 'def f(*a, **k):\n    return range(\n'])
def test_ops_on_odd_sources(src):
    for op in EDIT_OPS.values():
        out = op(src, TASKS[0].public_tests)
        assert isinstance(out, str)
    for op in EDIT_OPS.values():
        assert op(None, ()) is None and op(42, [5]) == 42


# ----------------------------------------------------------------------------- properties

VOCAB_WORDS = [w for w in TOK.itos if w not in ('<pad>', '<unk>')]
JUNK = ['', '<call', 'call>', '</call', '((', '))', 'é', '\n', '\t', '0x1F', 'None', '∞', 'edit:']


@settings(deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(task_i=st.integers(0, 29), texts=st.lists(st.one_of(
    st.text(max_size=80),
    st.lists(st.sampled_from(VOCAB_WORDS + JUNK), max_size=10).map(' '.join),
    st.sampled_from(ALL_CALLS)), min_size=1, max_size=8))
def test_step_never_raises(task_i, texts):
    env = BugFixEnv()
    env.reset(TASKS[task_i])
    for k, text in enumerate(texts, 1):
        obs, reward, done, info = env.step(text)
        assert isinstance(obs, str) and reward in (0.0, 1.0) and isinstance(info, dict)
        assert (info == {}) == (not done)
        assert env.turn == min(k, 6) or done


@settings(deadline=None)
@given(task_i=st.integers(0, 29), ops=st.lists(st.sampled_from(list(EDIT_OPS)), max_size=3))
def test_op_chains_never_raise(task_i, ops):
    task = TASKS[task_i]
    source = task.source
    for name in ops:
        source = EDIT_OPS[name](source, task.public_tests)
        assert isinstance(source, str)
    results = run_tests(source, task.all_tests, task.fn_name)
    assert len(results) == len(task.all_tests)
    assert isinstance(format_results(results, task.all_tests), str)
    assert isinstance(compact_source(source), str)


@settings(deadline=None)
@given(src=st.one_of(st.text(max_size=120), st.sampled_from(list(HOSTILE.values()))),
       ops=st.lists(st.sampled_from(list(EDIT_OPS)), max_size=3))
def test_ops_and_sandbox_on_arbitrary_text(src, ops):
    for name in ops:
        src = EDIT_OPS[name](src, TASKS[0].public_tests)
        assert isinstance(src, str)
    assert isinstance(compact_source(src), str)
    results = run_tests(src, TASKS[0].public_tests, 'clamp')
    assert len(results) == 3


# ----------------------------------------------------------------------------- docs

def test_public_api_has_docstrings():
    for name in gym.__all__:
        obj = getattr(gym, name)
        if inspect.isfunction(obj) or inspect.isclass(obj):
            assert obj.__doc__ and len(obj.__doc__.strip()) > 40, name
    for name in ('reset', 'step', 'final_info'):
        assert 'Returns' in getattr(BugFixEnv, name).__doc__
    for op in EDIT_OPS.values():
        assert op.__doc__, op


def test_compiled_sources_are_cached_and_still_run_fresh():
    """A source is checked and compiled once; each run executes it in a fresh namespace."""
    from agentrl.gym import sandbox
    src = 'def f(x):\n    return x + 1\n'
    sandbox._compile.cache_clear()
    assert [r.got for r in run_tests(src, [((1,), 2), ((5,), 6)], 'f')] == [2, 6]
    assert [r.passed for r in run_tests(src, [((1,), 3)], 'f')] == [False]
    info = sandbox._compile.cache_info()
    assert (info.hits, info.misses) == (1, 1)
    refused = 'def f(x):\n    return x.real\n'
    for _ in range(2):                                   # refusals are cached too, same message
        assert run_tests(refused, [((1,), 1)], 'f')[0].error == 'refused: Attribute is not allowed'
    assert sandbox._compile.cache_info().misses == 2


def test_public_verdicts_are_memoised_except_time_outs(monkeypatch):
    """final_info's public-test verdict is shared across envs by (source, function, tests)."""
    from agentrl.gym import env as env_mod
    memo = env_mod._Verdicts(size=2)
    monkeypatch.setattr(env_mod, '_VERDICTS', memo)
    calls = []
    real = env_mod.run_tests
    monkeypatch.setattr(env_mod, 'run_tests', lambda *a: calls.append(a[0]) or real(*a))
    for task in (TASKS[0], TASKS[0], TASKS[1]):
        e = BugFixEnv()
        e.reset(task)
        assert e.final_info(False)['public_pass'] is False           # the buggy sources fail
    assert calls == [TASKS[0].source, TASKS[1].source] and len(memo.memo) == 2
    e = BugFixEnv()
    e.reset(TASKS[2])
    e.final_info(False)
    assert len(memo.memo) == 2 and (TASKS[0].source, TASKS[0].fn_name, repr(tuple(TASKS[0].public_tests))) \
        not in memo.memo                                              # the oldest left
    slow = Task(name='slow', issue='issue : slow', source='def f(x):\n    return x\n', fn_name='f',
                public_tests=[((1,), 1)], hidden_tests=[], fix='none', split='train')
    monkeypatch.setattr(env_mod, 'run_tests', lambda *a: [TestResult(False, None, 'SandboxLimit: time limit exceeded')])
    e = BugFixEnv()
    e.reset(slow)
    assert e.final_info(False)['public_pass'] is False
    assert all(k[0] != slow.source for k in memo.memo)               # a time-out is not a verdict
