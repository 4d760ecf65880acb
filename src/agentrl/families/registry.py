"""L2: which family a tokenizer or template is: picked by markers, or named.

A named family matches when all of its :attr:`~agentrl.families.base.Family.markers` occur in the
template's source or among the tokenizer's added tokens; the match with the most markers wins
(Qwen3-Coder's ``<function=`` beats plain Hermes), ties going to the earlier registered. Nothing
matching gives the generic family (:mod:`agentrl.families.generic`).
"""
from __future__ import annotations

from .base import Family
from .deepseek import DEEPSEEK_V3, DEEPSEEK_V31
from .generic import GENERIC, generic_for
from .gpt_oss import GPT_OSS
from .glm import GLM
from .llama3 import LLAMA3
from .kimi import KIMI_K2
from .lfm2 import LFM2
from .qwen3 import QWEN3
from .qwen3_coder import QWEN3_CODER

__all__ = ['FAMILIES', 'register', 'family_for', 'family_names']

#: Registered named families, by name.
FAMILIES: dict = {}


def register(family: Family) -> Family:
    """Add a named family (its ``name`` must be new); returns it.

    Raises:
        ValueError: the name is empty, ``'generic'``, or taken.
    """
    if not family.name or family.name == GENERIC.name or family.name in FAMILIES:
        raise ValueError(f'family name {family.name!r} is empty, reserved or taken; registered: {family_names()}')
    FAMILIES[family.name] = family
    return family


def family_names() -> tuple:
    """Every name :func:`family_for` takes: the registered families, then ``'generic'``."""
    return (*FAMILIES, GENERIC.name)


def _source_and_tokens(template_or_tokenizer) -> tuple:
    """``(template source, added-token texts)`` of a chat template or a tokenizer."""
    tok = getattr(template_or_tokenizer, 'tokenizer', template_or_tokenizer)
    source = getattr(template_or_tokenizer, 'source', None)
    if source is None:
        source = getattr(tok, 'chat_template', None) or ''
        if isinstance(source, dict):
            source = '\n'.join(source.values())
    added = getattr(tok, 'added_tokens_decoder', None) or {}
    return source, {getattr(t, 'content', str(t)) for t in added.values()}


def family_for(template_or_tokenizer=None, *, name: str | None = None, require_tools: bool = False) -> Family:
    """The family of a chat template or tokenizer, or the one named.

    Args:
        template_or_tokenizer: a :class:`~agentrl.templates.ChatTemplate` or a Hugging Face tokenizer
            (its ``chat_template`` and added tokens are read); may be None when ``name`` is given.
        name: one of :func:`family_names`, overriding the pick.
        require_tools: the caller parses tool calls: refuse a family that parses none.

    Raises:
        ValueError: an unknown ``name``; or ``require_tools`` and no tool-call family fits (one line
            naming the options).
    """
    if name is not None:
        if name == GENERIC.name:
            family = generic_for(_source_and_tokens(template_or_tokenizer)[0]) if template_or_tokenizer else GENERIC
        elif name in FAMILIES:
            family = FAMILIES[name]
        else:
            raise ValueError(f'family={name!r} is not a model family; use one of {", ".join(family_names())}')
    else:
        source, tokens = _source_and_tokens(template_or_tokenizer)
        best = None
        for fam in FAMILIES.values():
            if all(m in source or m in tokens for m in fam.markers) and (best is None
                                                                      or len(fam.markers) > len(best.markers)):
                best = fam
        family = best if best is not None else generic_for(source)
    if require_tools and not family.parses_tools:
        raise ValueError(f'no model family parses the tool calls of this template (picked {family.name!r}); pass '
                         f'family= one of {", ".join(FAMILIES)} if its calls are in that format, or add a family '
                         'module (docs/design.md#families)')
    return family


register(QWEN3)
register(GPT_OSS)
register(GLM)
register(QWEN3_CODER)
register(LLAMA3)
register(DEEPSEEK_V3)
register(DEEPSEEK_V31)
register(KIMI_K2)
register(LFM2)
