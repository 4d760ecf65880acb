"""``agentrl import PATH --from FRAMEWORK --out RUN``: a framework's rollouts (or vLLM/SGLang responses) as an
agentrl run folder (``RUN/trajectories.parquet`` + ``RUN/summary.json``) that ``check``, ``show`` and ``report``
read. The work is :func:`agentrl.interop.import_records`."""
from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass, replace

from ..fields import option

from ..io import atomic_write
from ..constraints import GRAMMAR_STARTS
from ..record import LOGP_MODES, SamplingSpec
from .options import UserError, add_fields, check_numbers, from_args

SOURCES = ('verl', 'trl', 'slime', 'openrlhf', 'skyrl', 'prime-rl', 'vllm', 'sglang')


@dataclass
class ImportOptions:
    """Options of ``agentrl import`` (one field per flag; help and range in the metadata).

    Attributes:
        path: the framework's file or an ``agentrl export`` folder; for vllm/sglang a JSON/JSONL file of episodes.
        source: the framework (:data:`SOURCES`), flag ``--from``.
        out: run folder to write.
        tokenizer: Hugging Face tokenizer folder: fingerprint (refused when the records name another),
            template ownership of trainer batches rebuilt from its chat tokens
            (:func:`agentrl.interop.owners.finish_import`), needed for chat exchanges.
        temperature, top_k, top_p, min_p, logp_mode: the sampler, when the source does not carry it
            (``temperature`` None: not declared; ``logp_mode`` None: processed, or the server's default for
            vllm/sglang, :func:`agentrl.interop.openai.server_logp_mode`, which also refuses a mode the server
            cannot have returned).
        grammar_start: vllm/sglang: where a constrained request's grammar started in each turn
            (:data:`agentrl.constraints.GRAMMAR_STARTS`; None: as the exchanges say), docs/grammar.md.
        model: model id for the provenance.
        generation_config: vllm/sglang: the model folder's ``generation_config.json`` the server
            filled absent sampling fields from. Server imports are strict: a sampling field the first
            request leaves out is refused by name unless ``--temperature`` (the whole sampler) or this
            file supplies it (:func:`agentrl.interop.from_openai` ``strict_sampling``).
        chat_template_kwargs: vllm/sglang chat logs: JSON object of chat-template options the
            server rendered with (``{"enable_thinking": false}``) when the requests do not carry them.
        trust_pickle: read a verl ``.dp`` file (a pickle) with verl's ``DataProto.load_from_disk``;
            without it such a file is refused (:meth:`check_pickle`).
    """
    path: str = option(None, 'the file or export folder to import', positional=True, metavar='PATH')
    source: str = option(None, 'source framework or server (required)', choices=SOURCES, flag='--from')
    out: str = option(None, 'run folder to write (required)', metavar='RUN')
    tokenizer: str | None = option(None, 'Hugging Face tokenizer folder the rollouts used (rebuilds which tokens '
                                         "the chat template wrote; without it, chat records' template ownership "
                                         'is not checked)', metavar='DIR')
    temperature: float | None = option(None, 'sampling temperature, when the source does not carry the sampler',
                                     min=0.0)
    top_k: int = option(0, 'sampler top_k (0 = off; with --temperature)', min=0)
    top_p: float = option(1.0, 'sampler top_p (1 = off; with --temperature)', gt=0.0, max=1.0)
    min_p: float = option(0.0, 'sampler min_p (0 = off; with --temperature)', min=0.0, max=0.999999)
    logp_mode: str | None = option(None, 'log-prob mode of the source (default: processed; vllm: raw, the default '
                                         "of vLLM's --logprobs-mode; sglang: scaled, log_softmax(logits / T) with no "
                                         'top-k/top-p renormalisation, raw when the server ran with '
                                         'SGLANG_RETURN_ORIGINAL_LOGPROB)', choices=LOGP_MODES)
    grammar_start: str | None = option(None, 'vllm/sglang: where the server applied a constrained request\'s grammar '
                                             'in each turn: turn (from the first token) or reasoning (after the '
                                             'reasoning close mark: a server with a reasoning parser); default: as '
                                             'the exchanges say', choices=GRAMMAR_STARTS)
    model: str | None = option(None, 'model id for the provenance')
    generation_config: str | None = option(None, "vllm/sglang: the model folder's generation_config.json the "
                                                 'server filled absent sampling fields from (without it, and '
                                                 'without --temperature, a request that leaves a sampling field '
                                                 'out is refused, naming it)', metavar='FILE')
    chat_template_kwargs: str | None = option(None, 'vllm/sglang chat logs: JSON object of chat-template options the '
                                                    'server rendered with, e.g. \'{"enable_thinking": false}\' '
                                                    '(the requests\' own chat_template_kwargs win)', metavar='JSON')
    trust_pickle: bool = option(False, "--from verl: read a .dp file (a pickle: verl's DataProto.save_to_disk) with "
                                       "verl's DataProto.load_from_disk; unpickling runs any code the file holds, "
                                       'so only for files you trust (default: refused)')

    def validate(self) -> None:
        """Raise :class:`~agentrl.cli.options.UserError` naming the bad flag and the fix."""
        if self.source is None or self.out is None:
            raise UserError('--from FRAMEWORK and --out RUN are required, e.g. `agentrl import batch.pt --from verl '
                            '--out runs/imported`')
        check_numbers(self)
        if not os.path.exists(self.path):
            raise UserError(f'PATH {self.path!r} does not exist; pass the file (or export folder) to import')
        if os.path.isfile(self.out):
            raise UserError(f'--out {self.out!r} is a file; pass a folder for the run')
        if self.tokenizer and not os.path.isdir(self.tokenizer):
            raise UserError(f'--tokenizer {self.tokenizer!r} is not a folder; pass a tokenizer folder')
        for flag, v in (('--generation-config', self.generation_config),
                        ('--chat-template-kwargs', self.chat_template_kwargs), ('--grammar-start', self.grammar_start)):
            if v is not None and self.source not in ('vllm', 'sglang'):
                raise UserError(f'{flag} applies to --from vllm or sglang (server logs), not --from {self.source}; '
                                f'drop {flag}')
        if self.generation_config and not os.path.isfile(self.generation_config):
            raise UserError(f'--generation-config {self.generation_config!r} is not a file; pass the model folder\'s '
                            'generation_config.json')
        self.template_kwargs()
        self.check_pickle()

    def check_pickle(self) -> None:
        """Refuse a pickled input (a verl ``.dp`` file) without ``--trust-pickle``, and ``--trust-pickle`` elsewhere.

        A ``.dp`` file is unpickled by verl's ``DataProto.load_from_disk``, which runs any code the file
        holds; every other input is read as data (JSON, or ``torch.load(weights_only=True)``).

        Raises:
            UserError: a ``.dp`` file without ``--trust-pickle``; ``--trust-pickle`` for another input;
                a trusted ``.dp`` file without verl installed (the fix: ``pip install verl``).
        """
        pickled = self.source == 'verl' and os.path.isfile(self.path) and self.path.endswith('.dp')
        if pickled and not self.trust_pickle:
            raise UserError(f"PATH {self.path!r} is a pickle (verl's DataProto.save_to_disk): unpickling runs any "
                            'code the file holds, so it is not read; pass --trust-pickle if you trust the file, or '
                            'import the verl_batch.pt `agentrl export --to verl` writes (tensors only)')
        if self.trust_pickle and not pickled:
            raise UserError(f'--trust-pickle applies to a verl .dp file (--from verl); {self.path!r} is read '
                            'without unpickling code; drop --trust-pickle')
        import importlib.util
        if pickled and importlib.util.find_spec('verl') is None:
            raise UserError(f"PATH {self.path!r} is a verl DataProto pickle, read only by verl's "
                            'DataProto.load_from_disk, and verl is not installed; pip install verl, or import the '
                            'verl_batch.pt `agentrl export --to verl` writes (no verl needed)')

    def template_kwargs(self) -> dict:
        """``--chat-template-kwargs`` as a dict (empty when not given); UserError for anything but a JSON object."""
        if self.chat_template_kwargs is None:
            return {}
        try:
            d = json.loads(self.chat_template_kwargs)
        except ValueError as e:
            raise UserError(f'--chat-template-kwargs is not JSON ({e}); pass an object, e.g. '
                            '\'{"enable_thinking": false}\'') from None
        if not isinstance(d, dict):
            raise UserError(f'--chat-template-kwargs must be a JSON object, got {self.chat_template_kwargs!r}; e.g. '
                            '\'{"enable_thinking": false}\'')
        return d

    def server(self) -> bool:
        """True for server logs (vllm, sglang)."""
        return self.source in ('vllm', 'sglang')

    def spec(self):
        """The declared :class:`~agentrl.record.SamplingSpec`, or None when ``--temperature`` is not given.

        Raises:
            UserError: a ``--logp-mode`` the server cannot have returned
                (:func:`~agentrl.interop.openai.server_logp_mode`).
        """
        if self.temperature is None:
            return None
        spec = SamplingSpec(temperature=self.temperature, top_k=self.top_k, top_p=self.top_p, min_p=self.min_p,
                            logp_mode=self.logp_mode or 'processed')
        if not self.server():
            return spec
        from ..interop.openai import server_logp_mode
        try:
            return replace(spec, logp_mode=server_logp_mode(self.source, self.logp_mode, spec))
        except ValueError as e:
            raise UserError(str(e)) from None


def register(sub) -> None:
    """Add this subcommand's parser (every flag documented) to ``sub`` and set ``func=run``."""
    p = sub.add_parser('import', help='bring verl/TRL/slime/OpenRLHF/SkyRL/prime-rl rollouts or vLLM/SGLang '
                                      'responses into an agentrl run folder',
                       description='Import rollouts into RUN/trajectories.parquet (+ summary.json) so that agentrl '
                                   'check, show and report work on them. Server responses must carry token ids.')
    add_fields(p, ImportOptions)
    p.set_defaults(func=run)


def run(args) -> int:
    """Run the subcommand for parsed ``args``; return the exit code (errors raise, one line)."""
    opts = from_args(ImportOptions, args)
    opts.validate()
    from .. import interop, store
    tok = None
    if opts.tokenizer:
        from ..templates import load_tokenizer
        tok = load_tokenizer(opts.tokenizer)
    kwargs = {'model': opts.model or ''}
    if opts.source in ('vllm', 'sglang'):     # strict: every sampling field from the request, --temperature or the file
        kwargs.update(logp_mode=opts.logp_mode, strict_sampling=True, generation_config=opts.generation_config,
                      grammar_start=opts.grammar_start, **opts.template_kwargs())
    if os.path.exists(opts.out) and (not os.path.isdir(opts.out) or os.listdir(opts.out)):
        raise UserError(f'--out {opts.out!r} exists and is not an empty folder; import into a new folder '
                        '(a run folder is never overwritten)')
    try:
        records = interop.import_records(opts.path, opts.source, tokenizer=tok, spec=opts.spec(),
                                         trust_pickle=opts.trust_pickle, **kwargs)
    except (TypeError, KeyError, AttributeError, IndexError, RuntimeError) as e:   # a value of the wrong shape deep
        # in the file (RuntimeError: a torch op on a tensor where a list or a dict belongs)
        what = ' '.join(str(e).split())[:160] or type(e).__name__
        server = opts.source in ('vllm', 'sglang')
        fix = ('log each exchange as the request and response bodies the server sent and received' if server else
               f'pass a file `agentrl export --to {opts.source}` or {opts.source} wrote')
        raise UserError(f'PATH {opts.path!r} holds a value agentrl cannot read as {opts.source} '
                        f'{"exchanges" if server else "data"} ({type(e).__name__}: {what}); {fix}') from None
    os.makedirs(opts.out, exist_ok=True)
    path = store.write_trajectories(os.path.join(opts.out, 'trajectories.parquet'), records)
    policies: dict = {}
    for r in records:
        name = r.provenance.policy if r.provenance is not None else '(none)'
        policies[name] = policies.get(name, 0) + 1
    summary = {'episodes': len(records), 'source': opts.source, 'imported_from': os.path.basename(opts.path),
               'trajectories': os.path.basename(path), 'policies': {k: {'episodes': n} for k, n in policies.items()},
               'options': {'from': opts.source, 'tokenizer': opts.tokenizer, 'temperature': opts.temperature,
                           **({'generation_config': os.path.basename(opts.generation_config)}
                              if opts.generation_config else {}),
                           **({'chat_template_kwargs': opts.template_kwargs()} if opts.chat_template_kwargs else {})}}
    atomic_write(os.path.join(opts.out, 'summary.json'), json.dumps(summary, indent=2, sort_keys=True) + '\n')
    print(f'imported {len(records)} records from {opts.source} into {path}')
    from ..checks.consistency import unchecked_notes
    unchecked = sum(1 for r in records if unchecked_notes(r))
    if unchecked:
        from ..interop.owners import UNCHECKED_NOTE
        print(f'agentrl: note: {unchecked} of {len(records)} records: not checked: {UNCHECKED_NOTE}. Fix: pass '
              '--tokenizer DIR (the tokenizer the rollouts used)', file=sys.stderr)
    return 0
