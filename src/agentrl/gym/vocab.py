"""The word-level vocabulary of the BugFix gym: the tokenizer that covers every text the gym writes.

:func:`build_tokenizer` enumerates the texts; :func:`bugfix_tokenizer` is the one for all 30
tasks, built once. The :class:`agentrl.tokenizer.Tokenizer` itself knows nothing of the gym.
"""
from __future__ import annotations

import functools

from ..tokenizer import SPECIALS, Tokenizer
from .calls import ALL_CALLS, MESSAGES
from .ops import EDIT_OPS
from .sandbox import run_tests
from .tasks import make_tasks
from .text import compact_source, format_results

__all__ = ['build_tokenizer', 'bugfix_tokenizer']


def build_tokenizer(tasks) -> Tokenizer:
    """Build the tokenizer that covers all text the BugFix gym can produce for ``tasks``.

    Enumerates every well-formed call, every fixed message, the test-output words, the
    integers -20..150, and for each task its issue plus the ``read`` and ``test`` observations
    of the buggy source and of the source after each edit op. Pass all 30 tasks (train and
    held-out) so held-out function names get ids. Source: book chapter 5.5.

    Returns:
        Tokenizer with specials first, then the words in Python string order
        (316 entries for ``make_tasks('all')``).
    """
    texts = [*ALL_CALLS, *MESSAGES.values(), 'pass fail -> want error True False']
    texts += [str(i) for i in range(-20, 151)]
    for task in tasks:
        texts.append(task.issue)
        for op in (None, *EDIT_OPS.values()):
            source = task.source if op is None else op(task.source, task.public_tests)
            results = run_tests(source, task.public_tests, task.fn_name)
            texts.append(compact_source(source))
            texts.append(format_results(results, task.public_tests))
    words = {w for text in texts for w in text.split()} - set(SPECIALS)
    return Tokenizer(sorted(words))


@functools.lru_cache(maxsize=1)
def bugfix_tokenizer():
    """TinyAgent's word-level tokenizer over every BugFix task (train and held-out), cached.

    The same object as ``build_tokenizer(make_tasks('all'))`` (316 entries), built once per
    process; treat it as read-only.

    Returns:
        :class:`agentrl.tokenizer.Tokenizer`.

    Source: book chapter 5.5 (pass all 30 tasks so held-out function names get ids).
    """
    return build_tokenizer(make_tasks('all'))
