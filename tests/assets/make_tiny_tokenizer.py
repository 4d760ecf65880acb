"""Regenerate ``tests/assets/tiny-chat/``: a tiny byte-level BPE tokenizer with a chat template of our own.

The tokenizer is trained with the ``tokenizers`` library on the text below (written for this
project), with Qwen-style control tokens, and saved with a chat template written for agentrl in a
Qwen-like style (system + ``# Tools`` preamble, ``<tool_call>`` / ``<tool_response>`` wrappers,
``<think>`` reasoning shown only after the last user message (the last turn always shows its
think block, empty when it has no reasoning; reasoning written into ``content`` is split out), ``enable_thinking=False`` inserting an
empty think block). The template tests, the recorder, labels, audits and the HF-engine tests use it
when the real tokenizers are not around, so they always run.

Run: ``python tests/assets/make_tiny_tokenizer.py`` (needs ``tokenizers`` and ``transformers``);
the output is deterministic.
"""
import json
import sys
from pathlib import Path

OUT = Path(__file__).resolve().parent / 'tiny-chat'
VOCAB_SIZE = 700

#: Special control tokens (ids right after the BPE vocabulary).
SPECIAL = ['<|endoftext|>', '<|im_start|>', '<|im_end|>']
#: Added tokens a model writes itself (not "special": decoding keeps them, as in Qwen3).
TAGS = ['<think>', '</think>', '<tool_call>', '</tool_call>', '<tool_response>', '</tool_response>']

CHAT_TEMPLATE = (
    "{%- set ns = namespace(last_user=-1, first=0) -%}"
    "{%- for m in messages -%}{%- if m.role == 'user' -%}{%- set ns.last_user = loop.index0 -%}{%- endif -%}"
    "{%- endfor -%}"
    "{%- if messages and messages[0].role == 'system' -%}{%- set ns.first = 1 -%}{%- endif -%}"
    "{%- if tools or ns.first -%}"
    "{{- '<|im_start|>system\\n' -}}"
    "{%- if ns.first -%}{{- messages[0].content -}}{%- endif -%}"
    "{%- if tools -%}"
    "{%- if ns.first -%}{{- '\\n\\n' -}}{%- endif -%}"
    "{{- '# Tools\\nTo use a tool, write <tool_call>{\"name\": ..., \"arguments\": {...}}</tool_call>. Tools:' -}}"
    "{%- for t in tools -%}{{- '\\n' + ((t.function if t.function is defined else t) | tojson) -}}{%- endfor -%}"
    "{%- endif -%}"
    "{{- '<|im_end|>\\n' -}}"
    "{%- endif -%}"
    "{%- for m in messages -%}"
    "{%- set i = loop.index0 -%}"
    "{%- if i < ns.first -%}"
    "{%- elif m.role == 'assistant' -%}"
    "{{- '<|im_start|>assistant\\n' -}}"
    "{%- set r = m.reasoning_content if m.reasoning_content is defined and m.reasoning_content else '' -%}"
    "{%- set c = m.content if m.content is string else '' -%}"
    "{%- if not r and '</think>' in c -%}"
    "{%- set r = c.split('</think>')[0].split('<think>')[-1] -%}{%- set c = c.split('</think>')[-1].lstrip('\\n') -%}"
    "{%- endif -%}"
    "{%- if i > ns.last_user and (loop.last or r) -%}"
    "{{- '<think>\\n' + r.strip() + '\\n</think>\\n\\n' -}}"
    "{%- endif -%}"
    "{{- c -}}"
    "{%- if m.tool_calls is defined and m.tool_calls -%}"
    "{%- for call in m.tool_calls -%}"
    "{%- set f = call.function if call.function is defined else call -%}"
    "{%- if c or not loop.first -%}{{- '\\n' -}}{%- endif -%}"
    "{{- '<tool_call>\\n{\"name\": \"' + f.name + '\", \"arguments\": ' -}}"
    "{{- (f.arguments if f.arguments is string else (f.arguments | tojson)) + '}\\n</tool_call>' -}}"
    "{%- endfor -%}"
    "{%- endif -%}"
    "{{- '<|im_end|>\\n' -}}"
    "{%- elif m.role == 'tool' -%}"
    "{%- if i == 0 or messages[i - 1].role != 'tool' -%}{{- '<|im_start|>user' -}}{%- endif -%}"
    "{{- '\\n<tool_response>\\n' + m.content + '\\n</tool_response>' -}}"
    "{%- if loop.last or messages[i + 1].role != 'tool' -%}{{- '<|im_end|>\\n' -}}{%- endif -%}"
    "{%- else -%}"
    "{{- '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>\\n' -}}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}"
    "{{- '<|im_start|>assistant\\n' -}}"
    "{%- if enable_thinking is defined and not enable_thinking -%}{{- '<think>\\n\\n</think>\\n\\n' -}}{%- endif -%}"
    "{%- endif -%}"
)

#: Training text, written for this project: bug-fixing chats, tool calls and plain prose.
CORPUS = """
The agent reads the file first, then it runs the tests, and only then it writes a fix.
A tool call names the tool and gives its arguments as JSON: {"name": "read", "arguments": {"path": "src/clamp.py"}}.
The tool answers with the text of the file, or with an error that says what went wrong.
def clamp(x, lo, hi):
    return max(lo, min(x, hi))
def add(a, b):
    return a + b
Fix clamp. The bounds are swapped: lo must be the smaller one. Swap them and run the tests again.
Tests pass. All 4 tests pass; the bug is fixed. Thanks!
Hi there. Hello! How can I help you today? Be brief. Count to three: 1 2 3.
The model writes its reasoning between think tags, then the answer. Read first, think, then act.
Probe question. Probe answer. Probe reasoning. Probe result.
apple river stone cloud maple tiger lemon piano zeta fix bug x1 42 ok yes no done
{"path": "tests/test_clamp.py"} {"name": "run_tests", "arguments": {}} {"name": "submit", "arguments": {"code": "x"}}
Error: file not found. Error: the tests failed with an assertion error on line 3.
The quick answer is often wrong; check it with the tool, then answer in one line.
"""


def build(out: Path = OUT) -> Path:
    """Train the tokenizer and write ``tokenizer.json``, ``tokenizer_config.json`` (with the template)."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB_SIZE, min_frequency=2, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), special_tokens=[])
    tok.train_from_iterator([CORPUS] * 20, trainer=trainer)
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIAL])
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in TAGS])
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token='<|im_end|>', pad_token='<|endoftext|>')
    fast.chat_template = CHAT_TEMPLATE
    out.mkdir(parents=True, exist_ok=True)
    fast.save_pretrained(str(out))
    cfg_path = out / 'tokenizer_config.json'      # loadable by transformers 4 and 5 alike
    cfg = json.loads(cfg_path.read_text())
    cfg.update(tokenizer_class='PreTrainedTokenizerFast', chat_template=CHAT_TEMPLATE)
    cfg.pop('backend', None)
    cfg_path.write_text(json.dumps(cfg, indent=2, sort_keys=True) + '\n')
    readme = out / 'README.md'
    readme.write_text('Tiny chat tokenizer for agentrl tests, generated by ../make_tiny_tokenizer.py '
                      f'(byte-level BPE, {len(fast)} tokens, our own Qwen-style chat template). '
                      'Do not edit by hand: regenerate.\n')
    return out


if __name__ == '__main__':
    path = build(Path(sys.argv[1]) if len(sys.argv) > 1 else OUT)
    print(f'wrote {path}: ' + ', '.join(f'{p.name} {p.stat().st_size} B' for p in sorted(path.iterdir())))
