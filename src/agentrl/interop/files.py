"""L4: write an export to disk in the form each framework loads, and read imports back.

Every export writes its files atomically (:func:`agentrl.io.atomic_path`), then ``manifest.json``
(framework, files, record count, options, agentrl version) last, so a folder with a manifest is complete.

=============  ==========================  ===================================================================
framework      file                        how the framework reads it
=============  ==========================  ===================================================================
verl           ``verl_batch.pt``           ``torch.load`` -> ``DataProto.from_dict(tensors=d['batch'], ...)``;
               ``gen_batch.dp``            with verl installed: ``DataProto.load_from_disk`` (pickle; the
                                           ``skip.rollout`` cache file)
trl            ``trl_batch.pt``            the padded GRPO batch (:func:`agentrl.interop.to_trl`);
               ``trl_rollout.json``        the ``rollout_func`` output (:func:`agentrl.interop.to_trl_rollout`)
slime          ``0.pt``                    ``--load-debug-rollout-data DIR/{rollout_id}.pt``:
                                           ``torch.load(...)['samples']`` of ``Sample.to_dict()``
openrlhf       ``experience.pt``           ``Experience(**torch.load(...))`` fields
skyrl          ``generator_output.json``   a ``GeneratorOutput`` dict for a custom ``GeneratorInterface``
prime-rl       ``training_samples.jsonl``  one ``TrainingSample`` per line (``msgspec.json.decode``)
sft            ``sft.parquet``             TRL SFT: ``load_dataset('parquet', ...)`` (``input_ids``, ``assistant_masks``)
skyrl-sft      ``sft.parquet``             SkyRL ``pretokenized_dataset_paths`` (``input_ids``, ``loss_mask``)
=============  ==========================  ===================================================================
"""
from __future__ import annotations

import json
import os
import shutil
import warnings
from pathlib import Path

import torch

from .. import __version__
from ..io import atomic_path, atomic_write, fsync_dir, read_json, regular_file, temp_name
from . import openai, openrlhf, prime_rl, sft, skyrl, slime, trl, verl
from .common import guess_source, load_pt, sort_by_group, source_fix, SupportMismatchWarning  # noqa: F401 - old place

__all__ = ['EXPORTS', 'IMPORTS', 'export', 'load_export', 'import_records']

EXPORTS = ('verl', 'trl', 'slime', 'openrlhf', 'skyrl', 'prime-rl', 'sft', 'skyrl-sft')
IMPORTS = ('verl', 'trl', 'slime', 'openrlhf', 'skyrl', 'prime-rl', 'vllm', 'sglang')


def _save_pt(obj, path: Path) -> None:
    with atomic_path(path) as tmp:
        torch.save(obj, tmp)


def _save_text(text: str, path: Path) -> None:
    atomic_write(path, text)


def _copy_image(data: bytes, out: Path) -> str:
    """Write an image's bytes once into ``out/images/<hex>.<ext>``; return that path relative to ``out``."""
    from ..images import image_digest, image_format
    rel = f'images/{image_digest(data)[len("sha256:"):]}.{image_format(data)}'
    if not (out / rel).exists():
        (out / 'images').mkdir(exist_ok=True)
        atomic_write(out / rel, data)
    return rel


def _save_parquet(rows: list, path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq
    table = pa.Table.from_pylist(rows)
    with atomic_path(path) as tmp:
        pq.write_table(table, tmp)


def _write_files(framework: str, records: list, out: Path, pad_id: int, tr: dict, opts: dict,
                 prompt_length: int | None, response_length: int | None, post=None, images=None) -> list:
    """Write ``framework``'s files for ``records`` into ``out`` (see :func:`export`); return their names.

    ``post(obj, rollout=None)`` (the correction, :func:`agentrl.interop.correction.apply_correction`) edits
    each exported object after the exporter's checks and before it is written."""
    post = post or (lambda obj, rollout=None: obj)
    files = []
    if framework == 'verl':
        d = post(verl.to_verl(records, pad_id=pad_id, prompt_length=prompt_length, response_length=response_length,
                              images=images, **tr, **opts))
        _save_pt(verl._as_saveable(d), out / 'verl_batch.pt')
        files.append('verl_batch.pt')
        try:
            from verl.protocol import DataProto
        except ImportError:
            DataProto = None
        if DataProto is not None:
            dp = DataProto.from_dict(tensors=d['batch'], non_tensors=d['non_tensor_batch'], meta_info=d['meta_info'])
            with atomic_path(out / 'gen_batch.dp') as tmp:
                dp.save_to_disk(tmp)
            files.append('gen_batch.dp')
    elif framework == 'trl':
        r = trl.to_trl_rollout(records, images=images, **tr, **opts)
        with warnings.catch_warnings():                 # the same records: warned about just above
            warnings.simplefilter('ignore', SupportMismatchWarning)
            d = post(trl.to_trl(records, pad_id=pad_id, images=images, **tr, **opts), rollout=r)
        _save_pt(d, out / 'trl_batch.pt')
        if 'images' in r:                               # JSON holds paths: the images are copied beside it
            r = dict(r, images=[[_copy_image(b, out) for b in row] for row in r['images']])
        _save_text(json.dumps(r), out / 'trl_rollout.json')
        files += ['trl_batch.pt', 'trl_rollout.json'] + sorted({p for row in r.get('images', ()) for p in row})
    elif framework == 'slime':
        _save_pt({'samples': post(slime.to_slime(records, **tr, **opts))}, out / '0.pt')
        files.append('0.pt')
    elif framework == 'openrlhf':
        _save_pt(post(openrlhf.to_openrlhf(records, pad_id=pad_id, **opts)), out / 'experience.pt')
        files.append('experience.pt')
    elif framework == 'skyrl':
        _save_text(json.dumps(post(skyrl.to_skyrl(records, **tr, **opts))), out / 'generator_output.json')
        files.append('generator_output.json')
    elif framework == 'prime-rl':
        rows = post(prime_rl.to_prime_rl(records, **opts))
        _save_text(''.join(json.dumps(r) + '\n' for r in rows), out / 'training_samples.jsonl')
        files.append('training_samples.jsonl')
    else:
        _save_parquet(sft.to_sft(records, form='assistant_masks' if framework == 'sft' else 'loss_mask'),
                      out / 'sft.parquet')
        files.append('sft.parquet')
    return files


def export(records, framework: str, out, *, pad_id: int = 0, trim: bool | None = None,
           allow_support_mismatch: bool = False, sort_groups: bool = False, prompt_length: int | None = None,
           response_length: int | None = None, split_turns: bool = False, correction=None, images=None) -> dict:
    """Export ``records`` for ``framework`` into folder ``out``; return the manifest (also ``out/manifest.json``).

    Args:
        records: agentrl records.
        framework: one of :data:`EXPORTS`.
        out: output folder: new or empty. The files are written into a hidden folder next to it
            (``.NAME.tmp-PID-RANDOM``) renamed to ``out`` when complete, so a refused, failed or
            killed export never leaves ``out`` empty or partial.
        pad_id: the tokenizer's pad id (verl, TRL, OpenRLHF).
        trim: drop the trailing observation (None: the framework's default).
        allow_support_mismatch: warn instead of refusing top-k/top-p log-probs (one
            :class:`~agentrl.interop.common.SupportMismatchWarning` per export).
        sort_groups: reorder records so each group is contiguous (stable) before export.
        prompt_length, response_length: verl's fixed widths (None: the longest).
        split_turns: replace records with per-turn contexts by one row per turn (not for verl and TRL,
            which take one trajectory per prompt).
        correction: an :class:`~agentrl.interop.correction.ExportCorrection`: re-score the records with its
            model and write the weights and rejection mask into the trainer's own fields
            (:data:`~agentrl.interop.correction.CORRECTION_FIELDS`); the manifest's ``correction`` entry
            records mode, thresholds, model fingerprint and weight statistics. None: no correction.
        images: where the records' images are: the run folder (or any trajectory path of the run), or
            ``digest -> bytes``. verl and TRL export them (``trl_rollout.json`` names copies in ``out/images/``);
            every other framework refuses a record with images (docs/design.md#images).

    Raises:
        ValueError: an unknown framework, ``split_turns`` for verl or TRL, a correction for an SFT export, or a
            refusal of the exporter (a RecordError names the record, the field and the fix;
            ``TokenizerMismatchError`` for a correction model of another tokenizer).
    """
    if framework not in EXPORTS:
        raise ValueError(f'unknown framework {framework!r}; export to one of {", ".join(EXPORTS)}')
    records = list(records)
    if split_turns:
        if framework in ('verl', 'trl'):
            raise ValueError(f'split_turns: {framework} takes one trajectory per prompt, so per-turn rows would count '
                             'as separate group members; sample with history="sampled" for it instead')
        from .common import split_turns as _split_turns
        records = _split_turns(records)
    if sort_groups:
        records = sort_by_group(records)
    post, summary = None, {}
    if correction is not None:
        from .correction import CORRECTION_FIELDS, apply_correction, correct_records
        if framework not in CORRECTION_FIELDS:
            raise ValueError(f'--correction: {framework} exports carry no sampling log-probs, so there is nothing '
                             f'to correct; export to one of {", ".join(CORRECTION_FIELDS)}')
        done: dict = {}

        def post(obj, rollout=None):            # scored once, after the exporter's own refusals
            if 'rc' not in done:
                done['rc'] = correct_records(records, correction)
                summary.update(done['rc'].summary, fields=dict(zip(('weights', 'mask', 'old_log_probs'),
                                                                    CORRECTION_FIELDS[framework])))
            return apply_correction(framework, obj, records, done['rc'], trim, rollout=rollout)
    out = Path(out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ValueError(f'export: {str(out)!r} exists and is not an empty folder; pass a new --out '
                         '(an export never mixes its files with another folder\'s)')
    out.parent.mkdir(parents=True, exist_ok=True)
    work = temp_name(out)           # built hidden, renamed into place: a kill never leaves an empty or partial out
    work.mkdir()
    try:
        opts = {'allow_support_mismatch': allow_support_mismatch}
        tr = {} if trim is None else {'trim': trim}
        files = _write_files(framework, records, work, pad_id, tr, opts, prompt_length, response_length, post,
                             images)
        manifest = {'framework': framework, 'files': files, 'records': len(records), 'pad_id': pad_id,
                    'trim': trim, 'allow_support_mismatch': allow_support_mismatch, 'sort_groups': sort_groups,
                    'split_turns': split_turns,
                    'agentrl_version': __version__}
        if summary:
            manifest['correction'] = summary
        atomic_write(work / 'manifest.json', json.dumps(manifest, indent=2, sort_keys=True) + '\n')
        os.replace(work, out)       # rename(2): onto a missing or empty folder
        fsync_dir(out.parent)
        return manifest
    except BaseException:      # a refusal or a failed write leaves nothing behind
        shutil.rmtree(work, ignore_errors=True)
        raise


def load_export(path, framework: str, *, trust_pickle: bool = False):
    """The object an export wrote (the input of the matching ``from_*``) from a folder or file.

    ``.pt`` files are read with ``torch.load(weights_only=True)``; a verl ``.dp`` file is a pickle
    (``DataProto.load_from_disk``), read only with ``trust_pickle=True`` (unpickling runs any code the
    file holds): pass it only for ``.dp`` files you trust.

    Raises:
        ValueError: a verl ``.dp`` file without ``trust_pickle=True`` (nothing is unpickled; the message says
            why and how) or, with it, without verl installed (the fix: ``pip install verl``); no such file in the folder, an unknown framework, a ``.pt`` file holding
            objects beyond tensors and plain containers, a slime file without ``samples``, a
            JSON/JSONL file that is not UTF-8 JSON or is over ``AGENTRL_MAX_INPUT_BYTES``, or a path
            that is not a regular file (a FIFO, a device; each names the file).
    """
    path = Path(path)
    name = {'verl': 'verl_batch.pt', 'trl': 'trl_batch.pt', 'slime': '0.pt', 'openrlhf': 'experience.pt',
            'skyrl': 'generator_output.json', 'prime-rl': 'training_samples.jsonl'}.get(framework)
    if path.is_dir():
        if name is None or not (path / name).exists():
            raise ValueError(f'{str(path)!r} has no {name}; pass the file or the folder `agentrl export --to '
                             f'{framework}` wrote')
        path = path / name
    regular_file(path, 'imports')         # a FIFO would block, /dev/zero never ends (docs/design.md#bounds)
    if framework == 'verl':
        if path.suffix == '.dp':
            return _load_dataproto(path, trust_pickle)
        from .verl import load_verl
        return load_verl(path)
    if framework in ('skyrl', 'prime-rl'):
        with open(path, 'rb') as f:
            if f.read(2) == b'PK':                  # a torch .pt (zip) file
                data = load_pt(path)
                raise ValueError(f'{str(path)!r} is a torch .pt file, not JSON; {source_fix(data, framework)}')
    fix = f'pass the file (or folder) `agentrl export --to {framework}` or {framework} wrote'
    if framework in ('trl', 'openrlhf'):
        if path.suffix == '.json':
            return read_json(path, fix=fix)
        return load_pt(path, framework)
    if framework == 'slime':
        data = load_pt(path, framework)
        if not isinstance(data, dict) or 'samples' not in data:
            what = f'keys {sorted(map(str, data))}' if isinstance(data, dict) else f'a {type(data).__name__}'
            raise ValueError(f"{str(path)!r}: samples: is missing (the file holds {what}); a slime rollout file is "
                             f"{{'samples': [Sample.to_dict(), ...]}} (slime --save-debug-rollout-data); {source_fix(data, framework)}")
        if not isinstance(data['samples'], (list, tuple)):
            raise ValueError(f"{str(path)!r}: samples: is of type {type(data['samples']).__name__}, not a list of "
                             f'Sample.to_dict() dicts; {fix}')
        return data['samples']
    if framework == 'skyrl':
        return read_json(path, fix=fix)
    if framework == 'prime-rl':
        return read_json(path, fix=fix, lines=True)
    raise ValueError(f'unknown framework {framework!r}; import from one of {", ".join(IMPORTS)}')


def _load_dataproto(path: Path, trust_pickle: bool):
    """verl's ``DataProto.load_from_disk(path)``, only when ``trust_pickle`` (else nothing is unpickled)."""
    if not trust_pickle:
        raise ValueError(
            f"{str(path)!r} is a pickle (verl's DataProto.save_to_disk): unpickling runs any code the file holds, "
            'so it is not read; pass trust_pickle=True (CLI: --trust-pickle) if you trust the file, or import the '
            'verl_batch.pt `agentrl export --to verl` writes (tensors only)')
    try:
        from verl.protocol import DataProto
    except ImportError:
        raise ValueError(f"{str(path)!r} is a verl DataProto pickle, read only by verl's DataProto.load_from_disk, "
                         'and verl is not installed; pip install verl, or import the verl_batch.pt `agentrl export '
                         '--to verl` writes (no verl needed)') from None
    return DataProto.load_from_disk(str(path))


def import_records(path, framework: str, *, tokenizer=None, spec=None, trust_pickle: bool = False,
                   **kwargs) -> list:
    """Read ``path`` written by ``framework`` (or by :func:`export`) and return agentrl records.

    Args:
        path: a file or export folder; for ``vllm``/``sglang`` a JSON/JSONL file of episodes
            (see :func:`agentrl.interop.from_openai`).
        framework: one of :data:`IMPORTS`.
        tokenizer: Hugging Face tokenizer: fingerprint, template ownership of trainer batches
            (:func:`agentrl.interop.owners.finish_import`); needed for chat exchanges.
        spec: the sampler, when the source does not carry it.
        trust_pickle: read a verl ``.dp`` file (a pickle) with verl's ``DataProto.load_from_disk``
            (:func:`load_export`); default False: refused, nothing unpickled.
        **kwargs: passed to the ``from_*`` function (``logp_mode``, ``model`` ...).

    Raises:
        ValueError: a verl ``.dp`` file without ``trust_pickle=True`` (nothing is unpickled).
        ValueError: an unknown framework or a missing file; a file without a field its framework
            writes (``'PATH': response_length: is missing; ...``) or not of its shape, each naming
            the file; the importer's refusals (RecordError).
    """
    if framework in ('vllm', 'sglang'):
        if Path(path).is_file():
            with open(path, 'rb') as f:
                if f.read(2) == b'PK':              # a torch .pt (zip) file
                    data = load_pt(Path(path))
                    raise ValueError(f'{str(path)!r} is a torch .pt file, not JSON; {source_fix(data, framework)}')
        episodes = openai.read_episodes(path)
        openai.check_episodes(episodes, repr(str(path)), source_fix(episodes, framework))
        return openai.from_openai(episodes, tokenizer, spec=spec, source=framework, **kwargs)
    if framework not in IMPORTS:
        raise ValueError(f'unknown framework {framework!r}; import from one of {", ".join(IMPORTS)}')
    data = load_export(path, framework, trust_pickle=trust_pickle)
    fn = {'verl': verl.from_verl, 'trl': trl.from_trl, 'slime': slime.from_slime, 'openrlhf': openrlhf.from_openrlhf,
          'skyrl': skyrl.from_skyrl, 'prime-rl': prime_rl.from_prime_rl}[framework]
    try:
        return fn(data, spec=spec, tokenizer=tokenizer, **{k: v for k, v in kwargs.items() if k == 'model'})
    except (KeyError, TypeError) as e:       # a missing field or a value of the wrong type in the file
        fix = source_fix(data, framework)
        what = e.args[0] if e.args else ''
        if isinstance(e, KeyError) and isinstance(what, str) and ' ' not in what:
            raise ValueError(f'{str(path)!r}: {what}: is missing; {framework} exports carry it; {fix}') from e
        raise ValueError(f'{str(path)!r} does not hold a {framework} export ({what}); {fix}') from e
