"""L2: real Hugging Face chat templates: token ownership, bridges, prefix stability, thinking, drift.

Every answer comes from rendering the tokenizer's own template (``apply_chat_template``), for
any family; nothing here is a per-model string table. transformers and jinja2 are imported
lazily (extra ``pip install agentrl[hf]``).

- :class:`ChatTemplate`: a tokenizer's template with its options fixed (tools, ``enable_thinking``);
  tokenizers are found and loaded by :mod:`~agentrl.templates.loading`, messages checked by
  :mod:`~agentrl.templates.messages`.
- :class:`ChatRecorder`: token-in/token-out recording of a chat episode into a ``Trajectory``;
  the bridges between turns come from :mod:`~agentrl.templates.bridge`.
- :func:`label_owners`: owner of every token of a finished conversation (SFT data).
- audits: :func:`audit_prefix_stability`, :func:`audit_thinking`, :func:`audit_drift`,
  :func:`template_fingerprint`, :func:`audit_template`.
- contexts: :func:`sampling_contexts`; :func:`turn_records` and :func:`turn_spans` live in
  :mod:`agentrl.record` and are re-exported here.

Source: book chapter 5.1-5.4 and 5.8.
"""
from .audit import (DriftReport, MessageStability, PrefixReport, SpanDrift, TemplateAudit, ThinkingReport,
                    audit_drift, audit_prefix_stability, audit_template, audit_thinking,
                    template_fingerprint)
from .bridge import Bridge, probe_stability, template_bridge
from .chat import CONTENT_TEXT_MODES, ChatTemplate, ControlTextError, tokenizer_fingerprint
from ..record import turn_records, turn_spans
from .labels import OwnerLabels, Region, label_owners, sampling_contexts
from .loading import find_tokenizer_dir, load_tokenizer
from .messages import PROMPT_ROLES, TOOL_ROLES, common_prefix, function_tools
from .recorder import HISTORY_MODES, ChatRecorder

__all__ = ['ChatTemplate', 'function_tools', 'load_tokenizer', 'PROMPT_ROLES', 'TOOL_ROLES',
           'CONTENT_TEXT_MODES', 'ControlTextError', 'find_tokenizer_dir',
           'ChatRecorder', 'Bridge', 'template_bridge', 'probe_stability', 'HISTORY_MODES',
           'label_owners', 'OwnerLabels', 'Region',
           'audit_prefix_stability', 'PrefixReport', 'MessageStability', 'audit_thinking', 'ThinkingReport',
           'audit_drift', 'DriftReport', 'SpanDrift', 'template_fingerprint',
           'tokenizer_fingerprint', 'audit_template', 'TemplateAudit',
           'turn_records', 'sampling_contexts', 'turn_spans', 'common_prefix']
