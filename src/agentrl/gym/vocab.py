"""The word-level vocabulary of the BugFix gym: one tokenizer for all 30 tasks, built once."""
from __future__ import annotations

import functools

__all__ = ['bugfix_tokenizer']


@functools.lru_cache(maxsize=1)
def bugfix_tokenizer():
    """TinyAgent's word-level tokenizer over every BugFix task (train and held-out), cached.

    The same object as ``build_tokenizer(make_tasks('all'))`` (316 entries), built once per
    process; treat it as read-only.

    Returns:
        :class:`agentrl.tokenizer.Tokenizer`.

    Source: book chapter 5.5 (pass all 30 tasks so held-out function names get ids).
    """
    from ..tokenizer import build_tokenizer
    from .tasks import make_tasks
    return build_tokenizer(make_tasks('all'))
