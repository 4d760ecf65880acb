"""The gym's call grammar and fixed messages.

A call is whitespace-separated words: ``<call> read </call>``, ``<call> test </call>``,
``<call> submit </call>`` or ``<call> edit <op> </call>``. Anything else is malformed.

Source: book chapter 4; docs/design.md#gym.
"""
from __future__ import annotations

from .ops import EDIT_OPS

__all__ = ['MESSAGES', 'TOOLS', 'ALL_CALLS', 'parse_call']

#: Fixed observation strings. Source: docs/design.md#gym.
MESSAGES = {
    'malformed': 'error : malformed call',
    'unknown_op': 'error : unknown op',
    'ok': 'ok',
    'no_change': 'no change',
    'submitted': 'submitted',
    'done': 'error : no steps left',
}

#: Tool name -> number of arguments it takes.
TOOLS = {'read': 0, 'edit': 1, 'test': 0, 'submit': 0}

#: Every well-formed call text: read, test, submit, then one edit per op in sorted order
#: (10 calls). Source: docs/design.md#gym.
ALL_CALLS = (['<call> read </call>', '<call> test </call>', '<call> submit </call>']
             + [f'<call> edit {op} </call>' for op in sorted(EDIT_OPS)])


def parse_call(text):
    """Parse action text into ``(tool, args)``, or ``None`` when it is malformed.

    Well-formed means: a ``str`` whose whitespace-separated words are ``<call>``, a tool
    name, that tool's number of arguments (one for ``edit``, none for the others) and
    ``</call>``. The op name of an edit is not checked here. Source: docs/design.md#gym.

    Args:
        text: the policy's action (any object; non-strings are malformed).

    Returns:
        ``(tool, args_list)`` or ``None``. Never raises.
    """
    if not isinstance(text, str):
        return None
    words = text.split()
    if len(words) < 3 or words[0] != '<call>' or words[-1] != '</call>':
        return None
    tool, args = words[1], words[2:-1]
    if TOOLS.get(tool) != len(args):
        return None
    return tool, args
