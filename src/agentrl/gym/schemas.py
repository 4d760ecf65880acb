"""Tool schemas (MCP style) and the clamp example texts of the BugFix gym.

``TOOL_SCHEMAS`` describes the gym's four tools the way an MCP server lists them (``name``,
``description``, ``inputSchema``); chapter 5 hands them to a real chat template.
``CODING_TOOLS`` are six production-style coding-agent tools in the same format.

Source: book chapter 4.7; docs/design.md#gym.
"""
from __future__ import annotations

from .ops import EDIT_OPS

__all__ = ['TOOL_SCHEMAS', 'CODING_TOOLS', 'CLAMP_ISSUE', 'CLAMP_BUGGY']

#: The long-form issue of the clamp task (chapter 5's chat-template demo). Source: book chapter 5.2.
CLAMP_ISSUE = ('clamp(value, lower, upper) should limit value to the interval [lower, upper], '
               'but clamp(3, 0, 5) returns 0 instead of 3.')

#: The buggy clamp (min and max swapped); tasks[0].source. Source: book chapter 4 / 5.5.
CLAMP_BUGGY = ('def clamp(value, lower, upper):\n'
               '    return min(lower, max(value, upper))\n')


def _object(properties: dict | None = None, required: list | None = None) -> dict:
    return {'type': 'object', 'properties': dict(properties or {}), 'required': list(required or [])}


def _string(description: str, enum=None) -> dict:
    schema = {'type': 'string', 'description': description}
    if enum is not None:
        schema['enum'] = list(enum)
    return schema


def _integer(description: str) -> dict:
    return {'type': 'integer', 'description': description}


def _boolean(description: str) -> dict:
    return {'type': 'boolean', 'description': description}


#: The gym's four tools: read, edit(op), test, submit. Source: docs/design.md#gym.
TOOL_SCHEMAS = [
    {'name': 'read',
     'description': 'Return the current source of the function, one statement per line.',
     'inputSchema': _object()},
    {'name': 'edit',
     'description': 'Apply a named repair operation to the source.',
     'inputSchema': _object({'op': _string('Name of the repair operation.', enum=list(EDIT_OPS))},
                            ['op'])},
    {'name': 'test',
     'description': 'Run the public tests; one line per test: pass or fail, arguments, result, '
                    'expected.',
     'inputSchema': _object()},
    {'name': 'submit',
     'description': 'Submit the current source for grading and end the episode.',
     'inputSchema': _object()},
]

#: Six production-style coding tools (Read, Write, Edit, Bash, Glob, Grep). Source:
#: docs/design.md#gym (Read, Edit, Bash confirmed by the book; the rest and all descriptions are ours).
CODING_TOOLS = [
    {'name': 'Read',
     'description': 'Read a file from the local filesystem, with line numbers.',
     'inputSchema': _object({'file_path': _string('Absolute path of the file to read.'),
                             'offset': _integer('Line number to start reading from.'),
                             'limit': _integer('Number of lines to read.')},
                            ['file_path'])},
    {'name': 'Write',
     'description': 'Write a file to the local filesystem, replacing it if it exists.',
     'inputSchema': _object({'file_path': _string('Absolute path of the file to write.'),
                             'content': _string('The content to write.')},
                            ['file_path', 'content'])},
    {'name': 'Edit',
     'description': 'Replace an exact string in a file with another string.',
     'inputSchema': _object({'file_path': _string('Absolute path of the file to modify.'),
                             'old_string': _string('The text to replace.'),
                             'new_string': _string('The text to replace it with.'),
                             'replace_all': _boolean('Replace every occurrence (default false).')},
                            ['file_path', 'old_string', 'new_string'])},
    {'name': 'Bash',
     'description': 'Run a shell command and return its output.',
     'inputSchema': _object({'command': _string('The command to run.'),
                             'timeout': _integer('Optional timeout in milliseconds.')},
                            ['command'])},
    {'name': 'Glob',
     'description': 'Find files whose paths match a glob pattern.',
     'inputSchema': _object({'pattern': _string('The glob pattern, e.g. "**/*.py".'),
                             'path': _string('Directory to search in (default: working directory).')},
                            ['pattern'])},
    {'name': 'Grep',
     'description': 'Search file contents with a regular expression.',
     'inputSchema': _object({'pattern': _string('The regular expression to search for.'),
                             'path': _string('File or directory to search in (default: working '
                                             'directory).')},
                            ['pattern'])},
]
