"""templates.messages: the sequence diffs work on strings and on lists of ids alike (no tokenizer needed)."""
from hypothesis import given, settings
from hypothesis import strategies as st

from agentrl.templates import common_prefix
from agentrl.templates.messages import common_suffix, diff_span


def _naive_prefix(a, b):
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def test_common_prefix_and_suffix_on_strings_and_lists():
    assert common_prefix('abcx', 'abcy') == 3 and common_prefix('', 'a') == 0 and common_prefix('ab', 'ab') == 2
    assert common_prefix([1, 2, 3, 9], [1, 2, 3, 7, 7]) == 3
    assert common_prefix([5], [6]) == 0 and common_prefix([1, 2], [1, 2, 3]) == 2
    assert common_suffix('xabc', 'yyabc', 10) == 3 and common_suffix('xabc', 'yyabc', 2) == 2
    assert common_suffix([9, 1, 2], [8, 8, 1, 2], 10) == 2 and common_suffix([1], [1], 0) == 0


def test_diff_span_on_ids_widens_to_the_whole_sentinel():
    # text = [1, 2, (3, 4), 5, 6]; other swaps the field (3, 4) for the sentinel [2, 99, 5]
    text, other = [1, 2, 3, 4, 5, 6], [1, 2, 2, 99, 5, 5, 6]
    assert diff_span(text, other, [2, 99, 5]) == (2, 4, [2, 99, 5])
    assert diff_span('ab<x>cd', 'abZZcd', 'ZZ') == (2, 5, 'ZZ')
    assert diff_span([1, 2, 3], [1, 7, 3], [8]) == (1, 2, [7])       # no sentinel in other: the plain diff


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, 3), max_size=12), st.lists(st.integers(0, 3), max_size=12))
def test_common_prefix_of_lists_equals_a_scan_and_the_string_answer(a, b):
    n = _naive_prefix(a, b)
    assert common_prefix(a, b) == n == common_prefix(''.join(map(str, a)), ''.join(map(str, b)))
    assert common_suffix(a, b, 99) == _naive_prefix(a[::-1], b[::-1])
