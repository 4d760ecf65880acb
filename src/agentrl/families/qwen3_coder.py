"""L2: the Qwen3-Coder family: XML ``<function=NAME>`` tool calls with schema-typed values, ``<think>`` reasoning.

Qwen3-Coder, Qwen3.5 and Qwen3.6 write a call as::

    <tool_call>
    <function=NAME>
    <parameter=P>
    VALUE
    </parameter>
    </function>
    </tool_call>

A value is text: one leading and one trailing newline (the template's) are trimmed, the rest is kept
verbatim. Its type comes from the request's tool schema (:meth:`Qwen3CoderFamily.for_tools`): a
parameter whose schema allows only strings, or that the schema does not name, stays a string; one
typed ``null``, ``integer``, ``number``, ``boolean``, ``object`` or ``array`` (also through
``anyOf``/``oneOf``/``allOf``, ``enum`` values and the usual aliases: ``int``, ``float``, ``bool``,
``dict``, ``list`` ...) is converted by the first of those types, in that order, that accepts the
text (``null``: ``null`` in any case; ``integer``: Python ``int``; ``number``: a finite float, an
integral one given as int; ``boolean``: ``true``/``1``, ``false``/``0`` in any case; ``object``,
``array``: any finite JSON), as vLLM's ``qwen3_coder`` parser converts them.

Statuses (:data:`~agentrl.families.base.CALL_STATUSES`): ``unclosed_block`` (``<tool_call>`` and
the reply ends); ``missing_name`` (no ``<function=NAME>`` with a non-empty name opening the block);
``unknown_tool``; ``invalid_json``, this family's "arguments do not parse": the body is not
``<function=NAME>``, parameters and ``</function>`` with only whitespace between them (an unclosed
``<parameter=`` or ``</function>``, stray text, an empty parameter name), or a typed value that
none of its schema's types accepts (vLLM passes such a value on as a string or as whatever JSON
it is; here the call is flagged so a trainer can mask it). A ``<function=`` outside ``<tool_call>``
is content.

Source: the Qwen3.5/3.6 chat templates (TRL's ``qwen3_5_think``, ``qwen3_5_nothink``, ``qwen3_6``);
vLLM's ``qwen3_coder``/``qwen3_xml`` tool parser and its schema coercion. docs/design.md#families.
"""
from __future__ import annotations

import json
import math
import re

from .base import INVALID_JSON, MISSING_NAME, OK, UNCLOSED_BLOCK, UNKNOWN_TOOL, Family, ToolCall

__all__ = ['Qwen3CoderFamily', 'QWEN3_CODER', 'tool_properties', 'typed_value']

_BLOCK = re.compile(r'<tool_call>(.*?)</tool_call>', re.S)
_FUNCTION = re.compile(r'\s*<function=([^>\n]*)>')
_PARAM_OPEN, _PARAM_CLOSE, _FUNCTION_CLOSE = '<parameter=', '</parameter>', '</function>'
#: JSON Schema type spellings models' tool schemas use, to the type they mean.
_ALIASES = {'str': 'string', 'text': 'string', 'varchar': 'string', 'char': 'string', 'enum': 'string',
            'int': 'integer', 'int32': 'integer', 'int64': 'integer', 'uint': 'integer', 'uint32': 'integer',
            'uint64': 'integer', 'long': 'integer', 'short': 'integer', 'unsigned': 'integer',
            'float': 'number', 'float32': 'number', 'float64': 'number', 'double': 'number',
            'bool': 'boolean', 'dict': 'object', 'arr': 'array', 'list': 'array', 'sequence': 'array'}
_ORDER = ('null', 'integer', 'number', 'boolean', 'object', 'array', 'string')
_ENUM_TYPES = ((bool, 'boolean'), (int, 'integer'), (float, 'number'), (str, 'string'), (list, 'array'),
               (dict, 'object'))
_NO_VALUE = object()


def tool_properties(tools) -> dict:
    """``{tool name: {parameter: JSON schema}}`` of a request's tools.

    Args:
        tools: OpenAI function tools (``[{'type': 'function', 'function': {'name', 'parameters'}}]``,
            a bare ``{'name', 'parameters'}`` also taken), or None.

    Returns:
        The ``properties`` of each tool's ``parameters`` (``{}`` for a tool without); ``{}`` for None.
    """
    out = {}
    for t in tools or ():
        fn = t.get('function', t) if isinstance(t, dict) else {}
        params = fn.get('parameters') or {}
        if isinstance(fn.get('name'), str):
            props = params.get('properties') if isinstance(params, dict) else None
            out[fn['name']] = props if isinstance(props, dict) else {}
    return out


def _types(schema) -> set:
    """The JSON types a parameter schema allows (``{'string'}`` when it names none)."""
    if not isinstance(schema, dict):
        return {'string'}
    found = set()
    t = schema.get('type')
    for name in ([t] if isinstance(t, str) else t if isinstance(t, list) else []):
        if isinstance(name, str):
            found.add(name)
    enum = schema.get('enum')
    for v in enum if isinstance(enum, list) else ():
        found.add('null' if v is None else next((n for k, n in _ENUM_TYPES if isinstance(v, k)), 'string'))
    for key in ('anyOf', 'oneOf', 'allOf'):
        if isinstance(schema.get(key), list):
            for sub in schema[key]:
                found |= _types(sub)
    return {_ALIASES.get(n.strip().lower(), n.strip().lower()) for n in found} or {'string'}


def _finite(v) -> bool:
    if isinstance(v, float):
        return math.isfinite(v)
    if isinstance(v, list):
        return all(_finite(x) for x in v)
    if isinstance(v, dict):
        return all(_finite(x) for x in v.values())
    return True


def _as(kind: str, text: str):
    """``text`` as a value of JSON type ``kind``, or ``_NO_VALUE``."""
    if kind == 'string':
        return text
    if kind == 'null':
        return None if text.lower() == 'null' else _NO_VALUE
    if kind == 'integer':
        try:
            return int(text)
        except ValueError:
            return _NO_VALUE
    if kind == 'number':
        try:
            x = float(text)
        except ValueError:
            return _NO_VALUE
        return _NO_VALUE if not math.isfinite(x) else int(x) if x == int(x) else x
    if kind == 'boolean':
        word = text.strip().lower()
        return True if word in ('true', '1') else False if word in ('false', '0') else _NO_VALUE
    try:
        v = json.loads(text)
    except ValueError:
        return _NO_VALUE
    return v if _finite(v) else _NO_VALUE


def typed_value(text: str, schema) -> tuple:
    """``(ok, value)``: a parameter's text as the type its JSON schema gives (see the module docstring).

    Args:
        text: the value as written (its template newlines already trimmed). schema: the parameter's
            JSON schema, or None (a string).

    Returns:
        ``(True, value)`` from the first allowed type in the order null, integer, number, boolean,
        object, array, string that accepts ``text``; ``(False, None)`` when none does.
    """
    kinds = _types(schema)
    for kind in _ORDER:
        if kind in kinds:
            v = _as(kind, text)
            if v is not _NO_VALUE:
                return True, v
    return False, None


def _trim(value: str) -> str:
    """A value less one leading and one trailing newline (the template writes them)."""
    value = value[1:] if value.startswith('\n') else value
    return value[:-1] if value.endswith('\n') else value


def _arguments(body: str, props: dict) -> dict | None:
    """The typed arguments of a block's text after ``<function=NAME>``, or None (malformed)."""
    args, pos = {}, 0
    while True:
        while pos < len(body) and body[pos].isspace():
            pos += 1
        if body.startswith(_FUNCTION_CLOSE, pos):
            return args if not body[pos + len(_FUNCTION_CLOSE):].strip() else None
        if not body.startswith(_PARAM_OPEN, pos):
            return None
        gt = body.find('>', pos)
        end = body.find(_PARAM_CLOSE, gt + 1) if gt >= 0 else -1
        name = body[pos + len(_PARAM_OPEN):gt] if gt >= 0 else ''
        if end < 0 or not name.strip() or '\n' in name:
            return None
        ok, value = typed_value(_trim(body[gt + 1:end]), props.get(name))
        if not ok:
            return None
        args[name] = value
        pos = end + len(_PARAM_CLOSE)


class Qwen3CoderFamily(Family):
    """XML tool calls with values typed by the request's tool schemas, and ``<think>`` reasoning.

    Args:
        properties: ``{tool name: {parameter: JSON schema}}`` (:func:`tool_properties`); None types
            every value as a string. :meth:`for_tools` makes the family of one request.
    """
    name = 'qwen3_coder'
    markers = ('<tool_call>', '<function=')
    think_open, think_close = '<think>', '</think>'
    call_open, call_close = '<tool_call>', '</tool_call>'

    def __init__(self, properties: dict | None = None):
        self.properties = properties or {}

    def for_tools(self, tools) -> 'Qwen3CoderFamily':
        """This family typing values by ``tools`` (OpenAI function tools, or None: every value a string)."""
        return Qwen3CoderFamily(tool_properties(tools))

    def find_calls(self, body: str, offset: int = 0, tool_names=None) -> list:
        out, pos = [], 0
        for m in _BLOCK.finditer(body):
            out.append(self._call(m.group(1), m.group(0), (offset + m.start(), offset + m.end()), tool_names))
            pos = m.end()
        k = body.find(self.call_open, pos)
        if k >= 0:
            out.append(ToolCall(None, None, UNCLOSED_BLOCK, body[k:], (offset + k, offset + len(body))))
        return out

    def _call(self, inner: str, text: str, chars: tuple, tool_names) -> ToolCall:
        m = _FUNCTION.match(inner)
        name = m.group(1).strip() if m else ''
        if not name:
            return ToolCall(None, None, MISSING_NAME, text, chars)
        args = _arguments(inner[m.end():], self.properties.get(name, {}))
        if args is None:
            return ToolCall(name, None, INVALID_JSON, text, chars)
        if tool_names is not None and name not in tool_names:
            return ToolCall(name, args, UNKNOWN_TOOL, text, chars)
        return ToolCall(name, args, OK, text, chars)


#: The Qwen3-Coder family the registry holds (every value a string until :meth:`~Qwen3CoderFamily.for_tools`).
QWEN3_CODER = Qwen3CoderFamily()
