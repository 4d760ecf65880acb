"""The BugFix gym (book chapter 4): repair small Python functions with four text tools.

Text in, text out, no torch. A policy sees an issue, then calls ``read`` (compact source),
``edit <op>`` (one of seven rewrite ops), ``test`` (public-test report) and ``submit``
(graded on public plus hidden tests) within a budget of six turns.

Modules: ``text`` (compact_source, format_results), ``sandbox`` (run_tests), ``ops``
(EDIT_OPS), ``calls`` (MESSAGES, ALL_CALLS), ``tasks`` (Task, make_tasks), ``env``
(BugFixEnv), ``policies`` (scripted_policy), ``schemas`` (TOOL_SCHEMAS, CODING_TOOLS, clamp
texts).
"""
from ..record import StopReason
from .calls import ALL_CALLS, MESSAGES
from .env import BugFixEnv
from .ops import EDIT_OPS
from .policies import scripted_policy
from .sandbox import TestResult, run_tests
from .schemas import CLAMP_BUGGY, CLAMP_ISSUE, CODING_TOOLS, TOOL_SCHEMAS
from .tasks import Task, make_tasks
from .text import compact_source, format_results
from .vocab import bugfix_tokenizer

__all__ = ['Task', 'make_tasks', 'BugFixEnv', 'TOOL_SCHEMAS', 'CODING_TOOLS', 'CLAMP_ISSUE',
           'CLAMP_BUGGY', 'compact_source', 'run_tests', 'format_results', 'TestResult',
           'EDIT_OPS', 'MESSAGES', 'ALL_CALLS', 'scripted_policy', 'bugfix_tokenizer', 'StopReason']
