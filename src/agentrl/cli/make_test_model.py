"""``agentrl make-test-model OUT``: a small random Qwen3 with a real tokenizer, for offline rollouts and tests."""
from __future__ import annotations

import json
import os
from dataclasses import dataclass

from ..fields import option

from .options import UserError, add_fields, check_numbers, from_args


#: the note make_test_model writes into every folder it builds (marks a make-test-model folder)
NOTE = 'agentrl_test_model.json'


@dataclass
class MakeTestModelOptions:
    """Options of ``agentrl make-test-model`` (one field per flag; help and range in the metadata).

    Attributes:
        out: output folder (written with ``save_pretrained``; loadable by ``--model OUT``).
        tokenizer: tokenizer folder; None = ``$AGENTRL_TOKENIZERS/qwen3``, else
            ``../shared/tokenizers/qwen3`` (see :func:`agentrl.engines.hf.default_tokenizer_dir`).
        layers: decoder layers. hidden: hidden size (divisible by ``heads``; None: 64). heads: attention
            heads (None: 4, or with ``for_vllm`` the most heads whose head_dim vLLM CPU attention runs,
            2 at hidden 64). kv_heads: key/value heads (GQA). :meth:`validate` fills the Nones in.
        seed: initialisation seed.
        end_of_turn_rate: about this probability of the end-of-turn token per sampled token at
            temperature 1 (so turns end); 0 = a plain random init.
        context: the model's context in tokens (``max_position_embeddings``: the limit rollouts and ``agentrl
            serve`` respect).
        force: replace a model this command wrote into ``out`` (without it, such a folder is refused;
            any other non-empty folder is refused either way).
        for_vllm: pick (no ``heads`` given) or else require a head size vLLM CPU attention runs
            (:data:`agentrl.engines.vllm.CPU_HEAD_DIMS`; the server would die at its first request).
        vision: a tiny Qwen2.5-VL (vision tower, image processor, TRL's Qwen2.5-VL chat template) instead of a Qwen3
            (:func:`agentrl.engines.hf.make_test_model` with ``vision=True``).
    """
    out: str = option(None, 'output folder', positional=True, metavar='OUT')
    tokenizer: str | None = option(None, 'tokenizer folder (default: $AGENTRL_TOKENIZERS/qwen3 or '
                                       '../shared/tokenizers/qwen3)', metavar='DIR')
    layers: int = option(2, 'decoder layers', min=1, max=256)
    hidden: int | None = option(None, 'hidden size (default 64)', min=1, max=65536)
    heads: int | None = option(None, 'attention heads (default 4; with --for-vllm the most heads whose head size '
                                     'vLLM CPU attention runs: 2 at --hidden 64)', min=1, max=1024)
    kv_heads: int = option(2, 'key/value heads', min=1, max=1024)
    seed: int = option(0, 'initialisation seed', min=0, max=2 ** 63 - 1)
    end_of_turn_rate: float = option(0.05, 'probability of the end-of-turn token per sampled token at temperature '
                                         '1, so that turns end (0 = plain random init)', min=0.0, max=0.999999)
    context: int = option(4096, "the model's context in tokens (max_position_embeddings)", min=32, max=1 << 20,
                          metavar='N')
    force: bool = option(False, 'replace the model files of a folder OUT this command wrote (any other non-empty '
                              'folder is refused)')
    for_vllm: bool = option(False, 'a head size (hidden / heads) that vLLM CPU attention runs, so the model serves '
                                 'with --engine vllm: picked when --heads is not given, else a size it cannot '
                                 'run is refused')
    vision: bool = option(False, 'a tiny vision-language model (Qwen2.5-VL: vision tower, image processor, chat '
                                 'template from the installed trl) instead of a Qwen3')

    def validate(self) -> None:
        """Raise :class:`~agentrl.cli.options.UserError` naming the bad flag and the fix.

        A non-empty ``out`` is refused unless it is a folder this command wrote (it holds
        ``agentrl_test_model.json``) and ``force`` is set.
        """
        check_numbers(self)
        self.hidden = 64 if self.hidden is None else self.hidden
        if self.heads is None:
            self.heads = _vllm_heads(self.hidden, self.kv_heads) if self.for_vllm else 4
        if self.tokenizer is not None and not os.path.isfile(os.path.join(self.tokenizer, 'tokenizer_config.json')):
            raise UserError(f'--tokenizer {self.tokenizer!r} has no tokenizer_config.json; pass a tokenizer folder')
        if self.hidden % self.heads or self.heads % self.kv_heads:
            raise UserError(f'--hidden {self.hidden} must be divisible by --heads {self.heads}, and --heads by '
                            f'--kv-heads {self.kv_heads}')
        if (self.hidden // self.heads) % 2:
            raise UserError(f'--hidden {self.hidden} / --heads {self.heads} gives head_dim {self.hidden // self.heads}, '
                            'which is odd; rotary position embeddings rotate pairs of channels: pass --hidden and '
                            '--heads whose quotient is even (e.g. --hidden 64 --heads 4)')
        if self.for_vllm:
            from ..engines.vllm.server import CPU_HEAD_DIMS
            hd = self.hidden // self.heads
            if hd not in CPU_HEAD_DIMS:
                fix = (f'--heads {self.hidden // 32} --kv-heads 1' if self.hidden % 32 == 0
                       else '--hidden 64 --heads 2 --kv-heads 1')
                raise UserError(f'--for-vllm: head_dim {hd} (--hidden {self.hidden} / --heads {self.heads}) is not '
                                f'one vLLM CPU attention runs ({", ".join(map(str, CPU_HEAD_DIMS))}); fix: {fix} '
                                '(head_dim 32)')
        if os.path.exists(self.out) and not os.path.isdir(self.out):
            raise UserError(f'OUT {self.out!r} is a file; pass a folder')
        if not os.path.isdir(self.out) or not os.listdir(self.out):
            return
        if not os.path.isfile(os.path.join(self.out, NOTE)):     # a run, a real model, anything else: never mixed
            raise UserError(f'OUT {self.out!r} is not empty and is not a make-test-model folder (no {NOTE}); choose '
                            'a new or empty folder')
        if not self.force:
            raise UserError(f'{self.out!r} already holds a model (config.json); pass --force to replace it, or '
                            'choose another folder')


def _vllm_heads(hidden: int, kv_heads: int) -> int:
    """The most attention heads (a multiple of ``kv_heads``) whose head_dim ``hidden / heads`` vLLM CPU attention
    runs; 4 when none does (validate then refuses the size, naming the fix)."""
    from ..engines.vllm.server import CPU_HEAD_DIMS
    fits = [h for h in range(kv_heads, hidden + 1, kv_heads) if hidden % h == 0 and hidden // h in CPU_HEAD_DIMS]
    return max(fits) if fits else 4


def _qwen3_tokenizer():
    """The Qwen3 tokenizer folder (:func:`agentrl.templates.loading.find_tokenizer_dir`), or a one-line
    :class:`~agentrl.cli.options.UserError` naming every way to give one."""
    import importlib.util
    from ..templates.loading import TOKENIZER_FAMILIES, find_tokenizer_dir, tokenizer_roots
    try:
        return find_tokenizer_dir('qwen3')
    except FileNotFoundError:
        pass
    tried = ', '.join(str(r / 'qwen3') for r in tokenizer_roots())
    hub = f'or go online so agentrl fetches {TOKENIZER_FAMILIES["qwen3"]} from the Hugging Face hub'
    if importlib.util.find_spec('huggingface_hub') is None:
        hub += ' (pip install huggingface_hub)'
    raise UserError(f'make-test-model needs a Qwen3 tokenizer and found none (tried {tried}); pass --tokenizer DIR '
                    '(a folder with tokenizer.json and tokenizer_config.json), set AGENTRL_TOKENIZERS to a folder '
                    f'holding qwen3/, or AGENTRL_SHARED to one holding tokenizers/qwen3, {hub}')


def register(sub) -> None:
    """Add this subcommand's parser (every flag documented) to ``sub`` and set ``func=run``."""
    p = sub.add_parser('make-test-model', help='build a small random Qwen3 with a real tokenizer (offline, seconds)',
                       description='Build a small randomly initialised Qwen3 (transformers Qwen3ForCausalLM) paired '
                                   'with a real tokenizer and save it with save_pretrained into OUT, for '
                                   '`agentrl rollout --engine hf --model OUT` and `agentrl drift --model OUT`.')
    add_fields(p, MakeTestModelOptions)
    p.set_defaults(func=run)


def run(args) -> int:
    """Run the subcommand for parsed ``args``; return the exit code (errors raise ``UserError``, one line)."""
    opts = from_args(MakeTestModelOptions, args)
    opts.validate()
    if opts.tokenizer is None:            # found before transformers loads, so a miss fails fast
        opts.tokenizer = str(_qwen3_tokenizer())
    from ..engines.hf import make_test_model
    path = make_test_model(opts.out, opts.tokenizer, layers=opts.layers, hidden=opts.hidden, heads=opts.heads,
                           kv_heads=opts.kv_heads, seed=opts.seed, end_of_turn_rate=opts.end_of_turn_rate or None,
                           max_positions=opts.context, vision=opts.vision)
    note = json.loads((path / NOTE).read_text())
    kind = 'Qwen2.5-VL' if opts.vision else 'Qwen3'
    print(f"wrote a {opts.layers}-layer {kind} (hidden {opts.hidden}, {note['parameters']:,} parameters) with the "
          f"tokenizer of {os.path.basename(os.path.normpath(note['tokenizer_dir']))} to {path}")
    if note['measured_rates']:
        print('measured per-token rates at temperature 1: '
              + ', '.join(f'{k} {v:.4f}' for k, v in note['measured_rates'].items()))
    return 0
