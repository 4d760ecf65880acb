"""L2: the DeepSeek families: V3 (fenced JSON calls) and V3.1 (bare JSON calls), ``<think>`` reasoning.

V3 writes a call as ``<｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME\\n```json\\nARGS\\n```<｜tool▁call▁end｜>``,
V3.1 as ``<｜tool▁call▁begin｜>NAME<｜tool▁sep｜>ARGS<｜tool▁call▁end｜>``; both inside
``<｜tool▁calls▁begin｜>`` ... ``<｜tool▁calls▁end｜>`` (:mod:`~agentrl.families.sections`). Reasoning is
R1's ``<think>...</think>``; a generation prompt that ends in ``<think>`` (R1, V3-0324, V3.1 thinking
mode) opens the block, so the reply is reasoning up to ``</think>``. The template tells the rest:
``<｜end▁of▁sentence｜>`` ends every turn kind.

Both families' markers hold the call marks, which DeepSeek's tokenizer carries as added tokens
whatever its template; V3 adds the template's `````json`` fence, so it wins on a V3 template and
V3.1 wins on a template without fences (docs/design.md#families, most markers wins).

Source: DeepSeek-V3's and DeepSeek-V3.1's chat templates; vLLM's ``deepseek_v3``/``deepseek_v31``
tool parsers and ``deepseek_r1`` reasoning parser.
"""
from __future__ import annotations

import re

from .base import INVALID_JSON, MISSING_NAME, OK
from .sections import SectionFamily, json_object

__all__ = ['DeepSeekV3Family', 'DeepSeekV31Family', 'DEEPSEEK_V3', 'DEEPSEEK_V31']

SEP = '<｜tool▁sep｜>'
_FENCED = re.compile(r'\n```json\n(.*)\n```', re.S)


class DeepSeekV3Family(SectionFamily):
    """DeepSeek V3: ``TYPE<｜tool▁sep｜>NAME``, a newline, then ARGS in a `````json`` fence, per call.

    TYPE is ``function`` in what the model writes; any TYPE is read, as vLLM's parser reads it.
    """
    name = 'deepseek-v3'
    markers = ('<｜tool▁calls▁begin｜>', SEP, '```json')
    think_open, think_close = '<think>', '</think>'
    call_open, call_close = '<｜tool▁calls▁begin｜>', '<｜tool▁calls▁end｜>'
    item_open, item_close = '<｜tool▁call▁begin｜>', '<｜tool▁call▁end｜>'

    def read_call(self, inner: str) -> tuple:
        if SEP not in inner:
            return MISSING_NAME, None, None, None
        rest = inner.split(SEP, 1)[1]
        name, nl, fenced = rest.partition('\n')
        if not name:
            return MISSING_NAME, None, None, None
        m = _FENCED.fullmatch(nl + fenced)
        args = json_object(m.group(1)) if m else None
        return (OK, name, args, None) if args is not None else (INVALID_JSON, name, None, None)


class DeepSeekV31Family(SectionFamily):
    """DeepSeek V3.1: ``NAME<｜tool▁sep｜>ARGS`` per call, no type, no fences."""
    name = 'deepseek-v3.1'
    markers = ('<｜tool▁calls▁begin｜>', SEP)
    think_open, think_close = '<think>', '</think>'
    call_open, call_close = '<｜tool▁calls▁begin｜>', '<｜tool▁calls▁end｜>'
    item_open, item_close = '<｜tool▁call▁begin｜>', '<｜tool▁call▁end｜>'

    def read_call(self, inner: str) -> tuple:
        name, sep, raw = inner.partition(SEP)
        if not sep or not name:
            return MISSING_NAME, None, None, None
        args = json_object(raw)
        return (OK, name, args, None) if args is not None else (INVALID_JSON, name, None, None)


#: The registry's DeepSeek family objects.
DEEPSEEK_V3 = DeepSeekV3Family()
DEEPSEEK_V31 = DeepSeekV31Family()
