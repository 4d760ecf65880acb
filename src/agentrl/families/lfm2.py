"""L2: the Liquid AI LFM2 / LFM2.5 family: Python-call tool calls in one bracketed list, ``<think>`` reasoning.

A turn's calls are one block ``<|tool_call_start|>[read(path='a.py'), edit(op="swap", n=3)]<|tool_call_end|>``:
a Python list of calls with keyword arguments (the template writes a string single-quoted, a mapping as
JSON, anything else as its text: ``3``, ``True``, ``None``, ``[1, 'x']``). Arguments are read from
Python's syntax tree (:mod:`ast`), literals only, never evaluated: constants, ``None``/``True``/``False``
and their JSON spellings ``null``/``true``/``false``, ``-``/``+`` numbers, f-strings without
placeholders, dicts with string keys, lists, tuples and sets (as lists).

Like vLLM's ``lfm2`` parser, an element that does not parse as written is tried again after rewrites that
keep what the model meant: raw newlines, tabs and NULs inside a string escaped, leading zeros dropped
from integers (``month=07``), a parameter named after a Python keyword (``from=1``) read under its name,
and a string holding unescaped quotes of its own kind (``cmd='sed -n '1,9p' f.py'``, which
``lfm2_2_5.jinja`` writes for a value with a quote) closed at the one quote that makes the call parse.

Spans tile the block as in :mod:`~agentrl.families.sections`: the first call's span starts at
``<|tool_call_start|>``, each call's span ends after the comma that follows it (so a token ``'),`` stays in one
span) and the last one after ``<|tool_call_end|>``; a block of ``ok`` calls leaves the content whole. Statuses:
``unclosed_block`` (the block opens and the reply ends); ``missing_name`` (an empty list, or an element that
parses but is not a call of a name); ``invalid_json`` (the block is not one bracketed list, or an element is not
valid call syntax, or has an argument that is not a literal or not a keyword); ``unknown_tool``. Where vLLM
differs: it takes all calls of the first block or none (here each call has its own status, and every block is
read), drops positional arguments (here such a call is ``invalid_json``: its arguments would be lost) and joins
the content before and after the block with a newline (here the block is cut out).

Every turn kind ends at ``<|im_end|>``, which the template writes and tells (the shared
:meth:`Family.turn_end`). Reasoning is a leading ``<think>...</think>`` the model writes itself (the
generation prompt opens none); the template renders it (``message.thinking``) only for turns after the
last user message unless ``preserve_thinking``, so earlier reasoning is a history rewrite.

Source: TRL's ``lfm2_2_5.jinja``, ``lfm2_v2.jinja`` (LiquidAI/LFM2.5-230M, LFM2-1.2B); vLLM's ``lfm2``
tool parser (``vllm/tool_parsers/lfm2_tool_parser.py``). docs/design.md#families.
"""
from __future__ import annotations

import ast
import keyword
import re

from .base import INVALID_JSON, MISSING_NAME, OK, UNCLOSED_BLOCK, UNKNOWN_TOOL, Family, ToolCall

__all__ = ['Lfm2Family', 'LFM2']

OPEN, CLOSE = '<|tool_call_start|>', '<|tool_call_end|>'
_BLOCK = re.compile(re.escape(OPEN) + '(.*?)' + re.escape(CLOSE), re.S)
_HEAD = re.compile(r'\s*([A-Za-z_][\w.]*)\s*\(')
_PAIRS = {'(': ')', '[': ']', '{': '}'}
_CLOSERS = set(',)]}:')
_ZEROS = re.compile(r'(?<![\w.])0[\d_]*(?![\d_.eEjJ])')
_RESERVED = '_agentrl_kw_'
_KEYWORD = re.compile(r'([(,]\s*)(' + '|'.join(keyword.kwlist) + r')(\s*=)(?!=)')
_NAMES = {'null': None, 'true': True, 'false': False}


def _string_end(text: str, at: int) -> int | None:
    """The index after the string literal whose quote is ``text[at]`` (escapes skipped), or None: unterminated."""
    q, k = text[at], at + 1
    while k < len(text):
        if text[k] == '\\':
            k += 2
        elif text[k] == q:
            return k + 1
        else:
            k += 1
    return None


def _segments(text: str) -> list | None:
    """``text`` cut into ``(is_string, start, end)`` runs (a string run holds its quotes), or None: a string is
    never closed."""
    out, pos, k = [], 0, 0
    while k < len(text):
        if text[k] in '\'"':
            end = _string_end(text, k)
            if end is None:
                return None
            if k > pos:
                out.append((False, pos, k))
            out.append((True, k, end))
            pos = k = end
        else:
            k += 1
    if pos < len(text):
        out.append((False, pos, len(text)))
    return out


def _commas(inner: str) -> list | None:
    """The positions of the commas of ``inner`` outside strings and brackets, or None: a string or bracket is
    left open (or a bracket closes one it did not open)."""
    segs = _segments(inner)
    if segs is None:
        return None
    out, stack = [], []
    for is_str, a, b in segs:
        if is_str:
            continue
        for k in range(a, b):
            c = inner[k]
            if c in _PAIRS:
                stack.append(_PAIRS[c])
            elif c in ')]}':
                if not stack or stack.pop() != c:
                    return None
            elif c == ',' and not stack:
                out.append(k)
    return None if stack else out


def _escape_controls(text: str) -> str:
    """Raw newlines, returns, tabs and NULs inside string literals written as escapes (the value is unchanged)."""
    segs = _segments(text)
    if segs is None:
        return text
    out = []
    for is_str, a, b in segs:
        part = text[a:b]
        if is_str:
            part = re.sub(r'\\.|[\n\r\t\x00]', lambda m: m.group(0) if len(m.group(0)) == 2
                          else {'\n': '\\n', '\r': '\\r', '\t': '\\t', '\x00': '\\x00'}[m.group(0)], part, flags=re.S)
        out.append(part)
    return ''.join(out)


def _outside_strings(text: str, fix) -> str:
    """``fix`` applied to each run of ``text`` outside string literals."""
    segs = _segments(text)
    if segs is None:
        return text
    return ''.join(text[a:b] if is_str else fix(text[a:b]) for is_str, a, b in segs)


def _drop_zeros(code: str) -> str:
    return _ZEROS.sub(lambda m: str(int(m.group(0).replace('_', ''))) if m.group(0).strip('0_') else m.group(0), code)


def _rename_keywords(code: str) -> str:
    return _KEYWORD.sub(lambda m: m.group(1) + m.group(2) + _RESERVED + m.group(3), code)


def _requote(text: str) -> tuple | None:
    """``text`` with its first broken string (its first closing quote is not followed by ``,)]}:``) closed at the
    one later quote of its kind after which ``text`` parses, the quotes inside escaped: ``(new text, the indices
    of the added backslashes in it)``; None when no string is broken, or no or several quotes close it."""
    k = 0
    while k < len(text):
        if text[k] not in '\'"':
            k += 1
            continue
        q, end = text[k], _string_end(text, k)
        if end is not None and text[end:].lstrip()[:1] in _CLOSERS:
            k = end
            continue
        found = []
        for j in range(k + 1, len(text)):
            if text[j] != q or _escaped(text, j) or text[j + 1:].lstrip()[:1] not in _CLOSERS:
                continue
            inner, added = [], []
            for i in range(k + 1, j):
                if text[i] == q and not _escaped(text, i):
                    added.append(k + 1 + len(inner))
                    inner.append('\\')
                inner.append(text[i])
            cand = text[:k + 1] + ''.join(inner) + text[j:]
            if _syntax(_escape_controls(cand)) is not None:
                found.append((cand, added))
        return found[0] if len(found) == 1 else None
    return None


def _escaped(text: str, at: int) -> bool:
    """Whether ``text[at]`` follows an odd run of backslashes."""
    n = 0
    while at - n - 1 >= 0 and text[at - n - 1] == '\\':
        n += 1
    return n % 2 == 1


def _syntax(src: str):
    """The expression node of ``src``, or None: not one Python expression."""
    try:
        return ast.parse(src.strip(), mode='eval').body
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None


def _expression(src: str):
    """``(node, renamed)``: the expression of ``src`` as written, else after the rewrites (module docstring);
    ``renamed`` when keyword-named parameters carry :data:`_RESERVED`. None: no rewrite parses."""
    node = _syntax(src)
    if node is not None:
        return node, False
    fixed = _escape_controls(_outside_strings(src, _drop_zeros))
    cands = [fixed]
    requoted = _requote(fixed)
    if requoted is not None:
        cands.append(_escape_controls(requoted[0]))
    renamed = _outside_strings(cands[-1], _rename_keywords)
    for k, cand in enumerate(cands + ([renamed] if renamed != cands[-1] else [])):
        node = _syntax(cand)
        if node is not None:
            return node, k == len(cands)
    return None


def _value(node):
    """A literal's value (JSON types only).

    Raises:
        ValueError: the node is not a literal this format allows.
    """
    if isinstance(node, ast.Constant):
        if node.value is None or isinstance(node.value, (str, int, float)):
            return node.value
    elif isinstance(node, ast.Dict):
        if all(isinstance(k, ast.Constant) and isinstance(k.value, str) for k in node.keys):
            return {k.value: _value(v) for k, v in zip(node.keys, node.values)}
    elif isinstance(node, (ast.List, ast.Tuple, ast.Set)):
        return [_value(v) for v in node.elts]
    elif isinstance(node, ast.JoinedStr) and all(isinstance(v, ast.Constant) for v in node.values):
        return ''.join(str(v.value) for v in node.values)
    elif isinstance(node, ast.Name) and node.id in _NAMES:
        return _NAMES[node.id]
    elif isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        v = _value(node.operand)
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            return -v if isinstance(node.op, ast.USub) else v
    raise ValueError(f'not a literal: {type(node).__name__}')


def _dotted(node) -> str | None:
    """``a.b.c`` of a call's function, or None: not a (dotted) name."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    return '.'.join([node.id, *reversed(parts)]) if isinstance(node, ast.Name) else None


def _read_call(src: str, tool_names) -> tuple:
    """``(status, name, arguments)`` of one list element ``NAME(k=v, ...)``."""
    parsed = _expression(src)
    if parsed is None:
        m = _HEAD.match(src)
        return INVALID_JSON, (m.group(1) if m else None), None
    node, renamed = parsed
    name = _dotted(node.func) if isinstance(node, ast.Call) else None
    if name is None:
        return MISSING_NAME, None, None
    if node.args or any(k.arg is None for k in node.keywords):
        return INVALID_JSON, name, None
    try:
        args = {k.arg: _value(k.value) for k in node.keywords}
    except (ValueError, RecursionError):
        return INVALID_JSON, name, None
    if renamed:
        args = {(k[:-len(_RESERVED)] if k.endswith(_RESERVED) and keyword.iskeyword(k[:-len(_RESERVED)]) else k): v
                for k, v in args.items()}
    if tool_names is not None and name not in tool_names:
        return UNKNOWN_TOOL, name, args
    return OK, name, args


class Lfm2Family(Family):
    """LFM2 / LFM2.5: ``<|tool_call_start|>[name(k=v), ...]<|tool_call_end|>``, ``<think>`` reasoning, ``<|im_end|>``.

    ``find_calls`` gives one :class:`~agentrl.families.ToolCall` per call of each block (statuses and spans:
    the module docstring).
    """
    name = 'lfm2'
    markers = (OPEN, CLOSE)
    think_open, think_close = '<think>', '</think>'
    call_open, call_close = OPEN, CLOSE

    def find_calls(self, body: str, offset: int = 0, tool_names=None) -> list:
        out = []
        for block in self.block_calls(body, offset, _BLOCK, lambda inner: (OK, None, None)):
            out += [block] if block.status == UNCLOSED_BLOCK else _block_calls(block, tool_names)
        return out

    def strict_calls(self, text: str) -> list | None:
        """As :meth:`Family.strict_calls`: the ``ok`` calls after the reasoning, None when a call is not ``ok``
        or a mark stands outside a block (a block holds several calls, so marks are not counted per call)."""
        got = self.ok_calls_and_rest(text)
        if got is None:
            return None
        calls, rest = got
        return None if OPEN in rest or CLOSE in rest else calls


def _block_calls(block: ToolCall, tool_names) -> list:
    """The calls of one closed block (``block.text`` at ``block.chars[0]``), their spans tiling it."""
    text, start = block.text, block.chars[0]
    inner = text[len(OPEN):len(text) - len(CLOSE)]
    lead = len(inner) - len(inner.lstrip())
    listed = inner.strip()

    def whole(status, name=None):
        return [ToolCall(name, None, status, text, block.chars)]

    bracketed = listed.startswith('[') and listed.endswith(']')
    commas, added = (_commas(listed[1:-1]) if bracketed else None), []
    if commas is None and bracketed and (requoted := _requote(listed)) is not None:
        listed, added = requoted                          # a quote inside a string: split the mended list
        commas = _commas(listed[1:-1])
    if commas is None:
        m = _HEAD.match(listed.lstrip('['))
        return whole(INVALID_JSON, m.group(1) if m else None)
    body = listed[1:-1]
    cuts = [-1, *commas, len(body)]
    parts = [body[a + 1:b] for a, b in zip(cuts, cuts[1:])]
    if len(parts) > 1 and not parts[-1].strip():          # a trailing comma
        parts.pop()
    if not parts[0].strip() and len(parts) == 1:
        return whole(MISSING_NAME)
    if any(not p.strip() for p in parts):
        return whole(INVALID_JSON)
    base = start + len(OPEN) + lead + 1                   # where ``body`` starts in the parsed text
    ends = [base + c + 1 - sum(a <= c for a in added) for c in commas[:len(parts) - 1]] + [block.chars[1]]
    out, at = [], start
    for part, end in zip(parts, ends):
        status, name, args = _read_call(part, tool_names)
        out.append(ToolCall(name, args, status, text[at - start:end - start], (at, end)))
        at = end
    return out


#: The one LFM2 family object the registry holds.
LFM2 = Lfm2Family()
