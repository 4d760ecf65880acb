"""L2: the GLM-4.5/4.6/4.7 family: ``<tool_call>NAME<arg_key>K</arg_key><arg_value>V</arg_value>...`` calls, ``<think>``.

A call block holds the function name, then one ``<arg_key>``/``<arg_value>`` pair per argument;
GLM-4.5/4.6 write a newline after the name and after each tag pair, GLM-4.7 none (both parse).
Argument values are text: a value is typed only by the tool's JSON schema (an ``integer``
property's ``5`` becomes 5; a ``string`` property, or a key without a schema, stays text), which
:meth:`GlmFamily.find_calls` reads when ``tool_names`` maps names to parameter schemas.

The template writes no end-of-turn token: the model ends a turn by sampling the next role token,
``<|observation|>`` after a tool call (the tool's results follow it) and ``<|user|>`` after an
answer (``<|endoftext|>`` at the end of a conversation); the template writes that same token as
the next message's header, so the sampled stop is the policy's and the bridge starts after it
(docs/design.md#stops, #families).

Source: GLM-4.5's chat template (TRL's ``glm4moe.jinja``) and ``generation_config.json``
(``eos_token_id``: ``<|endoftext|>``, ``<|user|>``, ``<|observation|>``); vLLM's ``glm45``/``glm47``
tool parser (schema typing of argument values) and reasoning parser.
"""
from __future__ import annotations

import json
import re
from collections.abc import Mapping

from .base import INVALID_JSON, MISSING_NAME, OK, TURN_KINDS, UNKNOWN_TOOL, Family, TurnEnd

__all__ = ['GlmFamily', 'GLM', 'typed_value']

_BLOCK = re.compile(r'<tool_call>(.*?)</tool_call>', re.S)
_PAIR = re.compile(r'\s*<arg_key>(.*?)</arg_key>\s*<arg_value>(.*?)</arg_value>', re.S)
#: The role token that ends each turn kind (the next message's header); an answer also ends at ``eos``.
_ENDS = {'tool_call': ('<|observation|>',), 'answer': ('<|user|>',)}


def typed_value(text: str, schema) -> object:
    """An argument value's text typed by its property schema, as vLLM's GLM parser types it.

    The types the schema allows (``type``, an ``enum``'s values, ``anyOf``/``oneOf``/``allOf``) are
    tried in the order null, integer, number, boolean, object, array, string: the first the text
    parses as wins (``'true'``/``'1'`` are true, ``'false'``/``'0'`` false, numbers and JSON as JSON
    reads them, non-finite numbers never); none parsing leaves the text. No schema, or a ``string``
    property: the text itself.

    Returns:
        The typed value (``str`` when nothing applies).
    """
    if not isinstance(schema, Mapping):
        return text
    types = _schema_types(schema)
    for t in ('null', 'integer', 'number', 'boolean', 'object', 'array', 'string'):
        if t not in types:
            continue
        if t == 'string':
            return text
        if t == 'boolean':
            low = text.strip().lower()
            if low in ('true', '1', 'false', '0'):
                return low in ('true', '1')
            continue
        if t == 'null':
            if text.lower() == 'null':
                return None
            continue
        try:
            v = int(text) if t == 'integer' else float(text) if t == 'number' else json.loads(text)
        except (ValueError, TypeError):
            continue
        if t == 'number':
            if v != v or v in (float('inf'), float('-inf')):
                continue
            return int(v) if v == int(v) else v
        if t in ('object', 'array') and not _finite(v):
            continue
        return v
    try:
        v = json.loads(text)
    except ValueError:
        return text
    return v if _finite(v) else text


def _finite(v) -> bool:
    if isinstance(v, float):
        return v == v and v not in (float('inf'), float('-inf'))
    if isinstance(v, dict):
        return all(_finite(x) for x in v.values())
    if isinstance(v, list):
        return all(_finite(x) for x in v)
    return True


_ALIASES = {'str': 'string', 'text': 'string', 'int': 'integer', 'float': 'number', 'double': 'number',
            'bool': 'boolean', 'dict': 'object', 'list': 'array'}


def _json_type(v) -> str:
    """The JSON type name of an enum value."""
    if v is None:
        return 'null'
    if isinstance(v, bool):
        return 'boolean'
    if isinstance(v, int):
        return 'integer'
    if isinstance(v, float):
        return 'number'
    return {dict: 'object', list: 'array'}.get(type(v), 'string')


def _schema_types(schema: Mapping) -> set:
    """The JSON types a property schema allows (``{'string'}`` when it names none)."""
    out = set()
    t = schema.get('type')
    for x in (t if isinstance(t, list) else [t]):
        if isinstance(x, str):
            x = x.strip().lower()
            out.add(_ALIASES.get(x, x))
    for v in schema.get('enum') or ():
        out.add(_json_type(v))
    for key in ('anyOf', 'oneOf', 'allOf'):
        for sub in schema.get(key) or ():
            if isinstance(sub, Mapping):
                out |= _schema_types(sub)
    return out or {'string'}


def _status(inner: str, tool_names) -> tuple:
    """``(status, name, arguments)`` of one block's inner text."""
    k = inner.find('<arg_key>')
    name = (inner if k < 0 else inner[:k]).strip()
    if not name or '<' in name:
        return MISSING_NAME, None, None
    args, pos, rest = {}, 0, '' if k < 0 else inner[k:]
    for m in _PAIR.finditer(rest):
        if m.start() != pos:
            break
        args[m.group(1).strip()] = m.group(2)
        pos = m.end()
    if rest[pos:].strip():                         # a key without its value, text between pairs, a stray tag
        return INVALID_JSON, name, None
    if tool_names is not None and name not in tool_names:
        return UNKNOWN_TOOL, name, args
    if isinstance(tool_names, Mapping):
        props = (tool_names.get(name) or {}).get('properties') or {}
        args = {key: typed_value(v, props.get(key)) for key, v in args.items()}
    return OK, name, args


class GlmFamily(Family):
    """GLM-4.5/4.6/4.7: XML-ish argument pairs, ``<think>`` reasoning, the next role token as each turn's stop.

    ``find_calls`` statuses: ``missing_name`` (nothing, or a tag, before the first ``<arg_key>``),
    ``invalid_json`` (the arguments are not a run of complete key/value pairs), ``unknown_tool``,
    ``unclosed_block``. ``tool_names`` may be a mapping ``name -> parameters schema``
    (``{'type': 'object', 'properties': ...}``): values are then typed by :func:`typed_value`.
    """
    name = 'glm'
    markers = ('<tool_call>', '<arg_key>', '<|observation|>')
    think_open, think_close = '<think>', '</think>'
    call_open, call_close = '<tool_call>', '</tool_call>'

    def find_calls(self, body: str, offset: int = 0, tool_names=None) -> list:
        return self.block_calls(body, offset, _BLOCK, lambda inside: _status(inside, tool_names))

    def turn_end(self, template, kind: str = 'answer') -> TurnEnd:
        """``tool_call``: ``<|observation|>`` stops it; ``answer``: ``<|user|>`` or ``eos``; no end of turn.

        Raises:
            ValueError: ``kind`` outside :data:`~agentrl.families.base.TURN_KINDS`; the tokenizer has
                no single ``<|observation|>``/``<|user|>`` token (not a GLM tokenizer: pick another family).
        """
        if kind not in TURN_KINDS:
            raise ValueError(f'kind={kind!r}; use one of {TURN_KINDS}')
        ids = {_single_id(template, t) for t in _ENDS[kind]}
        if kind == 'answer':
            eos = getattr(getattr(template, 'tokenizer', None), 'eos_token', None)
            if eos:
                ids.add(_single_id(template, eos))
        return TurnEnd(frozenset(ids), None)

    def stop_ids(self, template) -> frozenset:
        """The template's stops (its ``eos`` and generation-config ids) and both kinds' role tokens."""
        return frozenset(super().stop_ids(template) | self.turn_end(template, 'tool_call').stop_ids
                         | self.turn_end(template, 'answer').stop_ids)


def _single_id(template, text: str) -> int:
    ids = template.encode(text)
    if len(ids) != 1:
        raise ValueError(f'{text!r} encodes to {len(ids)} tokens {ids} with this tokenizer: the glm family needs '
                         "GLM's role tokens; pass family= the tokenizer's own family")
    return ids[0]


#: The one GLM family object the registry holds.
GLM = GlmFamily()
