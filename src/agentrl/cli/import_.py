"""``agentrl import PATH --from FRAMEWORK --out RUN``: a framework's rollouts (or vLLM/SGLang responses) as an
agentrl run folder (``RUN/trajectories.parquet`` + ``RUN/summary.json``) that ``check``, ``show`` and ``report``
read. The work is :func:`agentrl.interop.import_records`."""
from __future__ import annotations

import json
import os
from dataclasses import dataclass

SOURCES = ('verl', 'trl', 'slime', 'openrlhf', 'skyrl', 'prime-rl', 'vllm', 'sglang')


@dataclass
class ImportOptions:
    """Options of ``agentrl import`` (one field per flag).

    Attributes:
        path: the framework's file or an ``agentrl export`` folder; for vllm/sglang a JSON/JSONL file of episodes.
        source: the framework (:data:`SOURCES`).
        out: run folder to write.
        tokenizer: Hugging Face tokenizer folder (fingerprint; needed for chat exchanges).
        temperature, top_k, top_p, min_p, logp_mode: the sampler, when the source does not carry it
            (None: not declared).
        model: model id for the provenance.
    """
    path: str
    source: str
    out: str
    tokenizer: str | None = None
    temperature: float | None = None
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0
    logp_mode: str = 'processed'
    model: str = ''

    def validate(self) -> None:
        """Raise :class:`~agentrl.cli.main.UserError` naming the bad flag and the fix."""
        from .main import UserError
        if not os.path.exists(self.path):
            raise UserError(f'PATH {self.path!r} does not exist; pass the file (or export folder) to import')
        if self.source not in SOURCES:
            raise UserError(f'--from {self.source!r}; use one of {", ".join(SOURCES)}')
        if os.path.isfile(self.out):
            raise UserError(f'--out {self.out!r} is a file; pass a folder for the run')

    def spec(self):
        """The declared :class:`~agentrl.record.SamplingSpec`, or None (ValueError names a bad flag)."""
        if self.temperature is None:
            return None
        from ..record import SamplingSpec
        return SamplingSpec(temperature=self.temperature, top_k=self.top_k, top_p=self.top_p, min_p=self.min_p,
                            logp_mode=self.logp_mode)


def register(sub) -> None:
    """Add this subcommand's parser (every flag documented) to ``sub`` and set ``func=run``."""
    p = sub.add_parser('import', help='bring verl/TRL/slime/OpenRLHF/SkyRL/prime-rl rollouts or vLLM/SGLang '
                                      'responses into an agentrl run folder',
                       description='Import rollouts into RUN/trajectories.parquet (+ summary.json) so that agentrl '
                                   'check, show and report work on them. Server responses must carry token ids.')
    p.add_argument('path', metavar='PATH', help='the file or export folder to import')
    p.add_argument('--from', dest='source', required=True, choices=SOURCES, help='source framework or server')
    p.add_argument('--out', '-o', required=True, metavar='RUN', help='run folder to write')
    p.add_argument('--tokenizer', default=None, metavar='DIR', help='Hugging Face tokenizer folder the rollouts used')
    p.add_argument('--temperature', type=float, default=None,
                   help='sampling temperature, when the source does not carry the sampler')
    p.add_argument('--top-k', type=int, default=0, help='sampler top_k (0 = off; with --temperature)')
    p.add_argument('--top-p', type=float, default=1.0, help='sampler top_p (1 = off; with --temperature)')
    p.add_argument('--min-p', type=float, default=0.0, help='sampler min_p (0 = off; with --temperature)')
    p.add_argument('--logp-mode', default=None, choices=('processed', 'raw'),
                   help='log-prob mode of the source (default: processed; vllm/sglang: raw, vLLM\'s default)')
    p.add_argument('--model', default='', help='model id for the provenance')
    p.set_defaults(func=run)


def run(args) -> int:
    """Run the subcommand for parsed ``args``; return the exit code (errors raise, one line)."""
    server = args.source in ('vllm', 'sglang')
    mode = args.logp_mode or ('raw' if server else 'processed')
    opts = ImportOptions(path=args.path, source=args.source, out=args.out, tokenizer=args.tokenizer,
                         temperature=args.temperature, top_k=args.top_k, top_p=args.top_p, min_p=args.min_p,
                         logp_mode=mode, model=args.model)
    opts.validate()
    from .. import interop, store
    from ..io import atomic_write
    tok = None
    if opts.tokenizer:
        from ..templates import load_tokenizer
        tok = load_tokenizer(opts.tokenizer)
    kwargs = {'model': opts.model}
    if server:
        kwargs['logp_mode'] = opts.logp_mode
    records = interop.import_records(opts.path, opts.source, tokenizer=tok, spec=opts.spec(), **kwargs)
    os.makedirs(opts.out, exist_ok=True)
    path = store.write_trajectories(os.path.join(opts.out, 'trajectories.parquet'), records)
    policies: dict = {}
    for r in records:
        name = r.provenance.policy if r.provenance is not None else '(none)'
        policies[name] = policies.get(name, 0) + 1
    summary = {'episodes': len(records), 'source': opts.source, 'imported_from': os.path.abspath(opts.path),
               'trajectories': str(path), 'policies': {k: {'episodes': n} for k, n in policies.items()},
               'options': {'from': opts.source, 'tokenizer': opts.tokenizer, 'temperature': opts.temperature}}
    atomic_write(os.path.join(opts.out, 'summary.json'), json.dumps(summary, indent=2, sort_keys=True) + '\n')
    print(f'imported {len(records)} records from {opts.source} into {path}')
    return 0
