"""``agentrl drift``: retokenization drift (book chapter 5.4).

``agentrl drift --model DIR --samples 8 --tokens 128`` samples continuations of the chapter's
prompt, decodes and re-encodes them, and reports the samples that drift with their first
differing tokens. ``agentrl drift --records PATH`` measures the drift rate per 1,000 policy
tokens over a rollout file (records are never changed; this only measures).
"""
from __future__ import annotations

import os
from dataclasses import dataclass

from ..io import printable
from ..record import SamplingSpec
from .options import UserError


#: upper bounds of --samples and --tokens (a larger value would run for hours)
MAX_SAMPLES = 10_000
MAX_TOKENS = 32_768


def _context_of(model_dir: str) -> int | None:
    """``max_position_embeddings`` of the model folder's config.json, or None when it does not say."""
    import json
    try:
        with open(os.path.join(model_dir, 'config.json')) as fh:
            n = json.load(fh).get('max_position_embeddings')
    except (OSError, ValueError, AttributeError):
        return None
    return n if isinstance(n, int) and not isinstance(n, bool) and n > 0 else None


@dataclass
class DriftOptions:
    """Options of ``agentrl drift`` (one field per flag).

    Attributes:
        model: model folder (``save_pretrained``) for the sampling experiment.
        records: a rollout file or folder (Parquet, ``agentrl rollout --engine hf``) to measure.
        tokenizer: tokenizer folder for ``--records`` (default: the model folder in the records'
            provenance, or ``--model``).
        samples: continuations to sample (1 to :data:`MAX_SAMPLES`). tokens: token budget of each (1 to
            :data:`MAX_TOKENS`, and below the model's ``max_position_embeddings`` when its config gives one).
        temperature, top_k, top_p, min_p: the sampler (default: temperature 1, no truncation).
        seed: sampling seed.
        prompt: the user message (default: the chapter's clamp request).
    """
    model: str | None = None
    records: str | None = None
    tokenizer: str | None = None
    samples: int = 8
    tokens: int = 128
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0
    seed: int = 0
    prompt: str | None = None

    def validate(self) -> None:
        """Raise :class:`~agentrl.cli.options.UserError` naming the bad flag and the fix."""
        if not self.model and not self.records:
            raise UserError('pass --model DIR (sample and measure) or --records PATH (measure a rollout file)')
        if self.model and not os.path.isfile(os.path.join(self.model, 'config.json')):
            raise UserError(f'--model {self.model!r} has no config.json; pass a folder written by save_pretrained '
                            '(`agentrl make-test-model OUT` builds one)')
        if self.records and not os.path.exists(self.records):
            raise UserError(f'--records {self.records!r} does not exist; pass a Parquet file or folder')
        if self.tokenizer and not os.path.isfile(os.path.join(self.tokenizer, 'tokenizer_config.json')):
            raise UserError(f'--tokenizer {self.tokenizer!r} has no tokenizer_config.json')
        if self.samples < 1 or self.tokens < 1:
            raise UserError(f'--samples and --tokens must be >= 1, got {self.samples} and {self.tokens}')
        if self.samples > MAX_SAMPLES:
            raise UserError(f'--samples must be <= {MAX_SAMPLES}, got {self.samples}')
        if self.tokens > MAX_TOKENS:
            raise UserError(f'--tokens must be <= {MAX_TOKENS}, got {self.tokens}')
        context = self.model and _context_of(self.model)
        if context and self.tokens > context:
            raise UserError(f'--tokens must be <= {context} (the context of --model {self.model!r}), got {self.tokens}')
        try:
            self.spec()
        except ValueError as e:
            raise UserError(str(e).replace('SamplingSpec.', '--').replace('_', '-')) from None

    def spec(self):
        """The :class:`~agentrl.record.SamplingSpec` of the flags."""
        return SamplingSpec(temperature=self.temperature, top_k=self.top_k, top_p=self.top_p, min_p=self.min_p)


def register(sub) -> None:
    """Add this subcommand's parser (every flag documented) to ``sub`` and set ``func=run``."""
    d = DriftOptions()
    p = sub.add_parser('drift', help='retokenization drift: sample-decode-re-encode, or the rate over a rollout file',
                       description='Sample continuations with --model, decode and re-encode them, and report the '
                                   'samples that drift and their first differing tokens (book chapter 5.4); with '
                                   '--records, report the drift rate per 1,000 policy tokens of a rollout file '
                                   '(sampled by a Hugging Face model: `agentrl rollout --engine hf`); with both, '
                                   "measure the records with --model's tokenizer (unless --tokenizer), then sample.")
    p.add_argument('--model', metavar='DIR', default=None, help='model folder to sample from')
    p.add_argument('--records', metavar='PATH', default=None, help='rollout Parquet file or folder to measure')
    p.add_argument('--tokenizer', metavar='DIR', default=None,
                   help="tokenizer for --records (default: the records' model folder, or --model)")
    p.add_argument('--samples', type=int, default=d.samples, help=f'continuations to sample, at most {MAX_SAMPLES} (default: {d.samples})')
    p.add_argument('--tokens', type=int, default=d.tokens, help=f'token budget per sample, at most {MAX_TOKENS} and below the '
                   f"model's context (default: {d.tokens})")
    p.add_argument('--temperature', type=float, default=d.temperature, help='sampling temperature (default: 1.0)')
    p.add_argument('--top-k', type=int, default=d.top_k, help='top-k truncation, 0 = off (default: 0)')
    p.add_argument('--top-p', type=float, default=d.top_p, help='nucleus mass, 1 = off (default: 1.0)')
    p.add_argument('--min-p', type=float, default=d.min_p, help='min-p truncation, 0 = off (default: 0.0)')
    p.add_argument('--seed', type=int, default=d.seed, help='sampling seed (default: 0)')
    p.add_argument('--prompt', default=None, help="user message (default: the chapter's clamp request)")
    p.set_defaults(func=run)


def _tokenizer_dirs_with(fingerprint: str) -> list:
    """Tokenizer folders under ``$AGENTRL_TOKENIZERS`` (or the shared tokenizers) with this fingerprint."""
    from pathlib import Path

    from ..engines.hf import default_tokenizer_dir
    from ..templates import load_tokenizer, tokenizer_fingerprint
    roots = [os.environ.get('AGENTRL_TOKENIZERS', '')]
    try:
        roots.append(str(default_tokenizer_dir('qwen3', hub=False).parent))
    except (FileNotFoundError, OSError, ValueError):
        pass
    for root in dict.fromkeys(r for r in roots if r and os.path.isdir(r)):
        for sub in sorted(Path(root).iterdir()):
            if (sub / 'tokenizer_config.json').is_file():
                try:
                    if tokenizer_fingerprint(load_tokenizer(str(sub))) == fingerprint:
                        return [str(sub)]
                except Exception:  # noqa: BLE001 - a folder that does not load is not the one
                    continue
    return []


def _tokenizer_for_records(opts: DriftOptions, records):
    from ..gym.vocab import bugfix_tokenizer
    fps = {r.provenance.tokenizer for r in records if r.provenance is not None and r.provenance.tokenizer}
    if bugfix_tokenizer().fingerprint in fps:   # TinyAgent / scripted records: no Hugging Face tokenizer folder
        raise UserError(f"--records {opts.records!r} were sampled with agentrl's word-level tokenizer (TinyAgent or "
                        'scripted policies), which has no tokenizer folder and cannot drift (its words decode and '
                        're-encode to the same ids); measure a run of `agentrl rollout --engine hf --model DIR`, '
                        'or sample with `agentrl drift --model DIR`')
    from ..templates.loading import require_hf as require_transformers
    from ..templates import load_tokenizer, tokenizer_fingerprint
    require_transformers('agentrl drift --records')
    path = opts.tokenizer or opts.model
    if path is None:
        models = {r.provenance.model for r in records if r.provenance is not None and r.provenance.model}
        found = [m for m in models if os.path.isfile(os.path.join(m, 'tokenizer_config.json'))]
        fps = {r.provenance.tokenizer for r in records if r.provenance is not None and r.provenance.tokenizer}
        if not found and len(fps) == 1:       # records name a model, not a folder: find the tokenizer by fingerprint
            found = _tokenizer_dirs_with(fps.pop())
        if not found:
            raise UserError("--records: no tokenizer folder in the records' provenance (model "
                            f'{sorted(models) or "unset"}); pass --tokenizer DIR')
        path = found[0]
    tok = load_tokenizer(path)
    fp = tokenizer_fingerprint(tok)
    other = {r.provenance.tokenizer for r in records if r.provenance is not None and r.provenance.tokenizer} - {fp}
    if other:
        raise UserError(f'--records were sampled with tokenizer {sorted(other)} but {path!r} is {fp}; pass the '
                        'tokenizer the records were sampled with (--tokenizer DIR)')
    return tok, path


def run(args) -> int:
    """Run the subcommand for parsed ``args``; return the exit code (errors raise ``UserError``, one line)."""
    opts = DriftOptions(model=args.model, records=args.records, tokenizer=args.tokenizer, samples=args.samples,
                        tokens=args.tokens, temperature=args.temperature, top_k=args.top_k, top_p=args.top_p,
                        min_p=args.min_p, seed=args.seed, prompt=args.prompt)
    opts.validate()
    from ..engines import hf
    if opts.records:
        from ..store import read_trajectories
        records = read_trajectories(opts.records)
        if not records:
            raise UserError(f'--records {opts.records!r} holds no records')
        tok, path = _tokenizer_for_records(opts, records)
        rate = hf.drift_rate(records, tok)
        print(printable(f'drift over {opts.records} (tokenizer {path})'))
        print(printable(rate.format(), newlines=True))
    if opts.model:
        model, tok = hf.load_model(opts.model)
        exp = hf.drift_experiment(model, tok, samples=opts.samples, tokens=opts.tokens, spec=opts.spec(),
                                  prompt=opts.prompt or hf.DRIFT_PROMPT, seed=opts.seed)
        print(printable(f'drift experiment: {opts.samples} samples of up to {opts.tokens} tokens from {opts.model} '
                        f'(prompt {exp.prompt_len} tokens)'))
        print(printable(exp.format(), newlines=True))
    return 0
