"""``agentrl make-test-model OUT``: a small random Qwen3 with a real tokenizer, for offline rollouts and tests."""
from __future__ import annotations

import json
import os
from dataclasses import dataclass


@dataclass
class MakeTestModelOptions:
    """Options of ``agentrl make-test-model`` (one field per flag).

    Attributes:
        out: output folder (written with ``save_pretrained``; loadable by ``--model OUT``).
        tokenizer: tokenizer folder; None = ``$AGENTRL_TOKENIZERS/qwen3``, else
            ``../shared/tokenizers/qwen3`` (see :func:`agentrl.engines.hf.default_tokenizer_dir`).
        layers: decoder layers. hidden: hidden size (divisible by ``heads``). heads: attention
            heads. kv_heads: key/value heads (GQA).
        seed: initialisation seed.
        end_of_turn_rate: about this probability of the end-of-turn token per sampled token at
            temperature 1 (so turns end); 0 = a plain random init.
    """
    out: str
    tokenizer: str | None = None
    layers: int = 2
    hidden: int = 64
    heads: int = 4
    kv_heads: int = 2
    seed: int = 0
    end_of_turn_rate: float = 0.05

    def validate(self) -> None:
        """Raise :class:`~agentrl.cli.main.UserError` naming the bad flag and the fix."""
        from .options import UserError
        if self.tokenizer is not None and not os.path.isfile(os.path.join(self.tokenizer, 'tokenizer_config.json')):
            raise UserError(f'--tokenizer {self.tokenizer!r} has no tokenizer_config.json; pass a tokenizer folder')
        for flag, v in (('--layers', self.layers), ('--hidden', self.hidden), ('--heads', self.heads),
                        ('--kv-heads', self.kv_heads)):
            if v < 1:
                raise UserError(f'{flag} must be >= 1, got {v}')
        if self.hidden % self.heads or self.heads % self.kv_heads:
            raise UserError(f'--hidden {self.hidden} must be divisible by --heads {self.heads}, and --heads by '
                            f'--kv-heads {self.kv_heads}')
        if not 0.0 <= self.end_of_turn_rate < 1.0:
            raise UserError(f'--end-of-turn-rate must be in [0, 1), got {self.end_of_turn_rate}')


def register(sub) -> None:
    """Add this subcommand's parser (every flag documented) to ``sub`` and set ``func=run``."""
    d = MakeTestModelOptions(out='')
    p = sub.add_parser('make-test-model', help='build a small random Qwen3 with a real tokenizer (offline, seconds)',
                       description='Build a small randomly initialised Qwen3 (transformers Qwen3ForCausalLM) paired '
                                   'with a real tokenizer and save it with save_pretrained into OUT, for '
                                   '`agentrl rollout --engine hf --model OUT` and `agentrl drift --model OUT`.')
    p.add_argument('out', metavar='OUT', help='output folder')
    p.add_argument('--tokenizer', metavar='DIR', default=None,
                   help='tokenizer folder (default: $AGENTRL_TOKENIZERS/qwen3 or ../shared/tokenizers/qwen3)')
    p.add_argument('--layers', type=int, default=d.layers, help=f'decoder layers (default: {d.layers})')
    p.add_argument('--hidden', type=int, default=d.hidden, help=f'hidden size (default: {d.hidden})')
    p.add_argument('--heads', type=int, default=d.heads, help=f'attention heads (default: {d.heads})')
    p.add_argument('--kv-heads', type=int, default=d.kv_heads, help=f'key/value heads (default: {d.kv_heads})')
    p.add_argument('--seed', type=int, default=d.seed, help=f'initialisation seed (default: {d.seed})')
    p.add_argument('--end-of-turn-rate', type=float, default=d.end_of_turn_rate,
                   help='probability of the end-of-turn token per sampled token at temperature 1, so that '
                        f'turns end (0 = plain random init; default: {d.end_of_turn_rate})')
    p.set_defaults(func=run)


def run(args) -> int:
    """Run the subcommand for parsed ``args``; return the exit code (errors raise ``UserError``, one line)."""
    opts = MakeTestModelOptions(out=args.out, tokenizer=args.tokenizer, layers=args.layers, hidden=args.hidden,
                                heads=args.heads, kv_heads=args.kv_heads, seed=args.seed,
                                end_of_turn_rate=args.end_of_turn_rate)
    opts.validate()
    from ..engines.hf import make_test_model
    path = make_test_model(opts.out, opts.tokenizer, layers=opts.layers, hidden=opts.hidden, heads=opts.heads,
                           kv_heads=opts.kv_heads, seed=opts.seed, end_of_turn_rate=opts.end_of_turn_rate or None)
    note = json.loads((path / 'agentrl_test_model.json').read_text())
    print(f"wrote a {opts.layers}-layer Qwen3 (hidden {opts.hidden}, {note['parameters']:,} parameters) with the "
          f"tokenizer of {note['tokenizer_dir']} to {path}")
    if note['measured_rates']:
        print('measured per-token rates at temperature 1: '
              + ', '.join(f'{k} {v:.4f}' for k, v in note['measured_rates'].items()))
    return 0
