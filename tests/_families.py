"""Shared by the model-family tests: real chat templates and tokenizers that carry a family's control tokens.

- :func:`trl_template`: a chat template from TRL's installed wheel (``trl/chat_templates/NAME.jinja``,
  read from the installed files, trl is not imported); the test is skipped, saying how to install it,
  when trl is absent. Templates are never copied into this repository.
- :data:`KITS` / :func:`kit_dir`: a tokenizer folder for one family, built once per process in a
  temporary folder. Where the family's own tokenizer is in ``../shared/tokenizers`` it is used as is;
  otherwise a base tokenizer (Qwen3's) gets the family's control tokens added as special tokens, its
  ``eos_token`` set and the template installed, and ``generation_config.json`` is written with the
  family's ``eos_token_id`` list, as the model's repository ships it. Such a tokenizer splits ordinary
  text as Qwen3 does: it tests formats, stops and ownership, not the family's vocabulary.
- A template that no registry package ships (Kimi K2, DeepSeek V3.1) is a small fixture of our own
  under ``tests/assets/templates/``, written here in the family's format (its header says so).
"""
import atexit
import json
import shutil
import tempfile
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

import pytest

from _tokenizers import tokenizer_path
from agentrl.templates.loading import load_tokenizer

ASSETS = Path(__file__).resolve().parent / 'assets' / 'templates'


def trl_template(name: str) -> str:
    """The text of TRL's shipped ``chat_templates/NAME.jinja``, or skip (trl not installed / no such template)."""
    try:
        dist = metadata.distribution('trl')
    except metadata.PackageNotFoundError:
        pytest.skip("TRL's wheel ships the chat templates these tests read: pip install -e '.[dev]' (trl)")
    path = Path(dist.locate_file(f'trl/chat_templates/{name}.jinja'))
    if not path.is_file():
        pytest.skip(f'trl {dist.version} ships no chat_templates/{name}.jinja')
    return path.read_text()


@dataclass(frozen=True)
class Kit:
    """How to build one family's test tokenizer.

    Attributes:
        base: the tokenizer in ``../shared/tokenizers`` it starts from (``'qwen3'``, ``'deepseek-v3'``,
            ``'llama3'``). template: ``('trl', NAME)`` for TRL's shipped template, ``('asset', FILE)`` for
            one of ours under ``tests/assets/templates``, or None to keep the base tokenizer's own.
        specials: control tokens to add (as special tokens) when the base lacks them.
        eos: the ``eos_token`` to set (None keeps the base's).
        generation_eos: the ``eos_token_id`` list of ``generation_config.json``, as token texts (empty
            writes no file).
    """
    base: str = 'qwen3'
    template: tuple | None = None
    specials: tuple = ()
    eos: str | None = None
    generation_eos: tuple = ()


#: One entry per family under test; a family's helper adds its entry here.
KITS = {
    'qwen3': Kit(generation_eos=('<|im_end|>', '<|endoftext|>')),
    'gpt-oss': Kit(template=('trl', 'gptoss'), eos='<|return|>',
                   specials=('<|start|>', '<|end|>', '<|message|>', '<|channel|>', '<|constrain|>', '<|return|>',
                             '<|call|>'),
                   generation_eos=('<|return|>', '<|endoftext|>', '<|call|>')),
    # GLM-4.5/4.6: TRL's glm4moe template; GLM's role, argument and prompt marks as special tokens; eos and the
    # generation eos list as GLM-4.5's repository ships them (no end-of-turn token: the next role token stops)
    'glm-4.5': Kit(template=('trl', 'glm4moe'),
                   specials=('[gMASK]', '<sop>', '<|system|>', '<|user|>', '<|assistant|>', '<|observation|>',
                             '<arg_key>', '</arg_key>', '<arg_value>', '</arg_value>', '/nothink'),
                   eos='<|endoftext|>', generation_eos=('<|endoftext|>', '<|user|>', '<|observation|>')),
    'qwen3.5': Kit(template=('trl', 'qwen3_5_think'), generation_eos=('<|im_end|>', '<|endoftext|>')),
    'qwen3.6': Kit(template=('trl', 'qwen3_6'), generation_eos=('<|im_end|>', '<|endoftext|>')),
    'llama3.1': Kit(base='llama3', template=('trl', 'llama3_1'), specials=('<|eom_id|>', '<|python_tag|>'),
                    eos='<|eot_id|>', generation_eos=('<|end_of_text|>', '<|eom_id|>', '<|eot_id|>')),
    'llama3.2': Kit(base='llama3', template=('trl', 'llama3_2'), specials=('<|eom_id|>', '<|python_tag|>'),
                    eos='<|eot_id|>', generation_eos=('<|end_of_text|>', '<|eom_id|>', '<|eot_id|>')),
    # DeepSeek-V3's own tokenizer, with R1's and V3.1's <think> tokens; its own template renders the calls of
    # one turn only, so the loop runs on ours
    'deepseek-v3': Kit('deepseek-v3', ('asset', 'deepseek_v3.jinja'), ('<think>', '</think>'),
                       generation_eos=('<｜end▁of▁sentence｜>',)),
    'deepseek-v3.1': Kit('deepseek-v3', ('asset', 'deepseek_v31.jinja'), ('<think>', '</think>'),
                         generation_eos=('<｜end▁of▁sentence｜>',)),
    'kimi-k2': Kit('qwen3', ('asset', 'kimi_k2.jinja'),
                   ('<|im_system|>', '<|im_user|>', '<|im_assistant|>', '<|im_middle|>', '<|tool_calls_section_begin|>',
                    '<|tool_calls_section_end|>', '<|tool_call_begin|>', '<|tool_call_argument_begin|>',
                    '<|tool_call_end|>'), '<|im_end|>', ('<|im_end|>',)),
    # LFM2.5: TRL's lfm2_2_5 template (no LFM2 tokenizer in ../shared/tokenizers: Qwen3's, which has <|im_start|>,
    # <|im_end|>, <think> and </think>, with LFM2's bos and tool marks added); eos and generation eos <|im_end|>
    'lfm2.5': Kit('qwen3', ('trl', 'lfm2_2_5'),
                  ('<|startoftext|>', '<|tool_list_start|>', '<|tool_list_end|>', '<|tool_call_start|>',
                   '<|tool_call_end|>', '<|tool_response_start|>', '<|tool_response_end|>'), '<|im_end|>',
                  ('<|im_end|>',)),
}

_BUILT: dict = {}
_ROOT: list = []


def _root() -> Path:
    if not _ROOT:
        _ROOT.append(Path(tempfile.mkdtemp(prefix='agentrl-family-kits-')))
        atexit.register(shutil.rmtree, _ROOT[0], True)
    return _ROOT[0]


def kit_dir(name: str) -> Path:
    """The tokenizer folder of ``KITS[name]`` (built once per process; skipped when its base is absent)."""
    if name in _BUILT:
        return _BUILT[name]
    kit = KITS[name]
    base = tokenizer_path(kit.base)
    out = _root() / name
    shutil.copytree(base, out)
    if kit.template is not None or kit.specials or kit.eos is not None:
        from transformers import AddedToken
        tok = load_tokenizer(str(out))
        have = set(tok.get_vocab())
        new = [AddedToken(t, special=True, normalized=False) for t in kit.specials if t not in have]
        if new:
            tok.add_tokens(new, special_tokens=True)
        if kit.eos is not None:
            tok.eos_token = kit.eos
        if kit.template is not None:
            where, what = kit.template
            tok.chat_template = trl_template(what) if where == 'trl' else (ASSETS / what).read_text()
        for f in ('chat_template.jinja', 'tokenizer.json', 'tokenizer_config.json'):
            (out / f).unlink(missing_ok=True)
        tok.save_pretrained(str(out))
    if kit.generation_eos:
        tok = load_tokenizer(str(out))
        ids = [tok.convert_tokens_to_ids(t) for t in kit.generation_eos]
        (out / 'generation_config.json').write_text(json.dumps({'eos_token_id': ids}))
    _BUILT[name] = out
    return out


def kit_tokenizer(name: str):
    """The Hugging Face tokenizer of :func:`kit_dir` (a fresh load)."""
    return load_tokenizer(str(kit_dir(name)))
