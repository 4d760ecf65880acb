"""L2: model families: the one home of what differs between families of chat formats.

- :mod:`~agentrl.families.base`: :class:`Family` (reply parsing with a status and spans per call,
  stops and ends of turn per turn kind), :class:`Reply`, :class:`ToolCall`; its streaming parser
  (:mod:`~agentrl.families.stream`) and token spans (:mod:`~agentrl.families.spans`).
- :mod:`~agentrl.families.generic`: what the template tells, no tool-call parsing.
- :mod:`~agentrl.families.qwen3`: Hermes ``<tool_call>`` JSON and ``<think>`` reasoning.
- :mod:`~agentrl.families.gpt_oss`: harmony channels, calls to ``functions.NAME`` ending at ``<|call|>``.
- :mod:`~agentrl.families.glm`: GLM-4.5/4.6/4.7 ``<arg_key>``/``<arg_value>`` calls, the next role token as stop.
- :mod:`~agentrl.families.qwen3_coder`: Qwen3-Coder/3.5/3.6 XML ``<function=NAME>`` calls, values typed
  by the request's tool schemas (:meth:`Family.for_tools`).
- :mod:`~agentrl.families.llama3`: Llama 3.1-3.3 JSON calls (``"parameters"``), ``<|eom_id|>`` a stop.
- :mod:`~agentrl.families.deepseek`: DeepSeek V3 (fenced JSON) and V3.1 calls, R1 ``<think>`` reasoning.
- :mod:`~agentrl.families.kimi`: Kimi K2 calls with their own ids (``functions.NAME:IDX``), ``<think>``.
- :mod:`~agentrl.families.sections`: the shared parsing of calls inside one calls section.
- :mod:`~agentrl.families.registry`: :func:`family_for` picks one for a template or tokenizer.

Torch-free and transformers-free: a template is used through its methods. docs/design.md#families.
"""
from .base import (CALL_STATUSES, INVALID_JSON, MISSING_NAME, OK, TURN_KINDS, UNCLOSED_BLOCK, UNKNOWN_TOOL, Family,
                   Reply, ToolCall, TurnEnd)
from .deepseek import DEEPSEEK_V3, DEEPSEEK_V31, DeepSeekV3Family, DeepSeekV31Family
from .generic import GENERIC, GenericFamily
from .gpt_oss import GPT_OSS, GptOssFamily
from .glm import GLM, GlmFamily
from .llama3 import LLAMA3, Llama3Family
from .lfm2 import LFM2, Lfm2Family
from .kimi import KIMI_K2, KimiK2Family
from .qwen3 import QWEN3, Qwen3Family
from .qwen3_coder import QWEN3_CODER, Qwen3CoderFamily
from .registry import FAMILIES, family_for, family_names, register
from .stream import StreamParser

__all__ = ['Family', 'Reply', 'ToolCall', 'TurnEnd', 'StreamParser', 'CALL_STATUSES', 'TURN_KINDS', 'OK',
           'INVALID_JSON', 'UNCLOSED_BLOCK', 'MISSING_NAME', 'UNKNOWN_TOOL', 'GenericFamily', 'GENERIC',
           'GptOssFamily', 'GPT_OSS', 'Qwen3Family', 'QWEN3', 'GlmFamily', 'GLM', 'Qwen3CoderFamily', 'QWEN3_CODER',
           'Llama3Family', 'LLAMA3', 'DeepSeekV3Family', 'DEEPSEEK_V3', 'DeepSeekV31Family', 'DEEPSEEK_V31',
           'KimiK2Family', 'KIMI_K2', 'Lfm2Family', 'LFM2', 'FAMILIES', 'family_for', 'family_names', 'register']
