"""L2: where real tokenizers are found and how they load (transformers imported lazily).

:func:`candidate_dirs` is the one list of tokenizer folders agentrl tries (tests, ``viz``,
``make-test-model``); :func:`find_tokenizer_dir` finds one family in it, and
:func:`load_tokenizer` loads a folder, family or hub id.
"""
from __future__ import annotations

import os
from pathlib import Path

from ..io import read_json

__all__ = ['TOKENIZER_FAMILIES', 'tokenizer_family', 'tokenizer_roots', 'candidate_dirs', 'find_tokenizer_dir',
           'require_hf', 'load_tokenizer', 'generation_eos_ids', 'ROUND_TRIP_PROBE', 'verified_tokenizer']

#: Tokenizer families the tests and demos use: folder name -> ungated Hugging Face repo holding the
#: same tokenizer files (None: gated upstream, get the files yourself).
TOKENIZER_FAMILIES = {'qwen3': 'Qwen/Qwen3-0.6B', 'deepseek-v3': 'deepseek-ai/DeepSeek-V3', 'llama3': None}
#: Model-id prefixes (lower case) -> family folder.
_FAMILY_PREFIXES = {'qwen/qwen3': 'qwen3', 'deepseek-ai/deepseek-v3': 'deepseek-v3',
                    'meta-llama/meta-llama-3': 'llama3', 'qwen3': 'qwen3', 'deepseek-v3': 'deepseek-v3',
                    'llama3': 'llama3'}
_TOKENIZER_FILES = ['tokenizer.json', 'tokenizer_config.json', 'chat_template.jinja', 'special_tokens_map.json']


def tokenizer_family(name: str) -> str | None:
    """The family folder (``'qwen3'`` ...) of a model id or folder name, or None.

    Example: ``tokenizer_family('Qwen/Qwen3-8B') == 'qwen3'``.
    """
    low = str(name).lower().rstrip('/')
    for prefix, fam in _FAMILY_PREFIXES.items():
        if low.startswith(prefix) or low.rsplit('/', 1)[-1] == prefix:
            return fam
    return None


_HUB_REACHABLE: dict = {}


def _hub_reachable(timeout: float = 1.5) -> bool:
    """True when huggingface.co answers a TCP connect within ``timeout`` s (cached per process)."""
    if 'ok' not in _HUB_REACHABLE:
        import socket
        try:
            socket.create_connection(('huggingface.co', 443), timeout=timeout).close()
            _HUB_REACHABLE['ok'] = True
        except OSError:
            _HUB_REACHABLE['ok'] = False
    return _HUB_REACHABLE['ok']


def find_tokenizer_dir(family: str, *, hub: bool = True) -> Path:
    """The folder of a real tokenizer family (``'qwen3'``, ``'deepseek-v3'``, ``'llama3'``).

    The one lookup order (tests, ``make-test-model``, ``viz``):
    1. ``$AGENTRL_TOKENIZERS/<family>``;
    2. ``$AGENTRL_SHARED/tokenizers/<family>``, then ``../shared/tokenizers/<family>`` next to the
       repository (and next to the working directory): the roots of :func:`tokenizer_roots`;
    3. the Hugging Face hub for families with an ungated repo (:data:`TOKENIZER_FAMILIES`), only when
       ``huggingface_hub`` is installed, ``HF_HUB_OFFLINE`` is not set and huggingface.co answers
       within 1.5 s (files already in the local hub cache are used without a connection).

    Args:
        family: a family folder name, or a model id it can be told from (``'Qwen/Qwen3-8B'``).
        hub: allow step 3.

    Returns:
        A folder holding ``tokenizer_config.json``.

    Raises:
        FileNotFoundError: none found; the message lists the places tried and how to get the files
            (set ``AGENTRL_TOKENIZERS`` to a folder holding ``<family>/``, or download the hub repo).
    """
    fam = family if family in TOKENIZER_FAMILIES else (tokenizer_family(family) or family)
    tried = [root / fam for root in tokenizer_roots()]
    for d in dict.fromkeys(tried):
        if (d / 'tokenizer_config.json').is_file():
            return d
    repo_id = TOKENIZER_FAMILIES.get(fam)
    if hub and repo_id:
        got = _from_hub(repo_id)
        if got is not None:
            return got
    if repo_id:
        import importlib.util
        need = '' if importlib.util.find_spec('huggingface_hub') else 'pip install huggingface_hub; '
        how = f'or let agentrl fetch the ungated hub repo {repo_id!r} ({need}needs huggingface.co reachable)'
    else:
        how = 'the upstream repo is gated: download its tokenizer files yourself'
    raise FileNotFoundError(f'no {fam} tokenizer found (tried {", ".join(map(str, dict.fromkeys(tried)))}); set '
                            f'AGENTRL_TOKENIZERS to a folder holding {fam}/ with tokenizer.json and '
                            f'tokenizer_config.json, {how}')


def tokenizer_roots() -> list[Path]:
    """Folders that may hold tokenizer family folders (``<root>/qwen3/``), in lookup order.

    ``$AGENTRL_TOKENIZERS``; ``$AGENTRL_SHARED/tokenizers``; ``../shared/tokenizers`` next to the
    repository this file is in, and next to the working directory (a development checkout).
    Environment variables are read at each call; a root need not exist.
    """
    out = []
    if os.environ.get('AGENTRL_TOKENIZERS'):
        out.append(Path(os.environ['AGENTRL_TOKENIZERS']))
    if os.environ.get('AGENTRL_SHARED'):
        out.append(Path(os.environ['AGENTRL_SHARED']) / 'tokenizers')
    repo = Path(__file__).resolve().parents[3]            # src/agentrl/templates/loading.py -> repository
    out += [repo.parent / 'shared' / 'tokenizers', Path.cwd().parent / 'shared' / 'tokenizers']
    return list(dict.fromkeys(out))


def candidate_dirs(model: str = '', *, hub: bool = False) -> list[Path]:
    """Every tokenizer folder agentrl would try for a record of ``model``, best first, no repeats.

    Order: the family told from ``model`` (:func:`find_tokenizer_dir`; the hub only with ``hub``);
    every folder holding ``tokenizer.json`` directly under ``$AGENTRL_TOKENIZERS``; then each family of
    :data:`TOKENIZER_FAMILIES` found locally (:func:`tokenizer_roots`). Used to find a tokenizer by its
    fingerprint (``agentrl.viz``). Never raises for a missing folder.

    Args:
        model: a model id or folder name (``'Qwen/Qwen3-8B'``), or ``''``.
        hub: allow the hub download of :func:`find_tokenizer_dir` for ``model``'s family.

    Returns:
        Folders (``Path``), each holding ``tokenizer_config.json`` or ``tokenizer.json``.
    """
    out = []

    def add(family: str, use_hub: bool) -> None:
        try:
            out.append(find_tokenizer_dir(family, hub=use_hub))
        except (FileNotFoundError, OSError):
            pass
    fam = tokenizer_family(model) if model else None
    if fam:
        add(fam, hub)
    root = os.environ.get('AGENTRL_TOKENIZERS', '')
    if root and os.path.isdir(root):
        out += [sub for sub in sorted(Path(root).iterdir()) if (sub / 'tokenizer.json').exists()]
    for f in TOKENIZER_FAMILIES:
        add(f, False)
    return list(dict.fromkeys(out))


def _from_hub(repo_id: str) -> Path | None:
    try:
        import huggingface_hub
    except ImportError:
        return None
    try:   # the local cache first: no connection needed
        return Path(huggingface_hub.snapshot_download(repo_id, allow_patterns=_TOKENIZER_FILES,
                                                      local_files_only=True))
    except Exception:  # noqa: BLE001 - not cached
        pass
    if os.environ.get('HF_HUB_OFFLINE', '0') not in ('', '0') or not _hub_reachable():
        return None
    try:
        return Path(huggingface_hub.snapshot_download(repo_id, allow_patterns=_TOKENIZER_FILES, etag_timeout=5))
    except Exception:  # noqa: BLE001 - any hub failure means "not available"
        return None


def require_hf(what: str = 'agentrl.templates'):
    """Import transformers (and check jinja2), or raise an ImportError that names the extra.

    Returns:
        The ``transformers`` module.

    Raises:
        ImportError: transformers or jinja2 is missing; fix with ``pip install agentrl[hf]``.

    Source: design notes (heavy dependencies are extras, imported lazily).
    """
    try:
        import jinja2  # noqa: F401
        import transformers
    except ImportError as e:  # pragma: no cover - exercised only without the extra
        raise ImportError(f'{what} needs transformers and jinja2 ({e}); install them with '
                          '`pip install agentrl[hf]`') from e
    return transformers


def _refuse_missing_path(name: str) -> None:
    """Refuse a local path that names no folder, before the hub is asked (offline, its retries cost ~50 s).

    Path-like: starts with ``/``, ``.`` or ``~``, holds ``os.sep`` (other than ``/``) or more than one
    ``/`` (a hub id is ``name`` or ``org/name``), or its parent folder exists here.

    Raises:
        ValueError: ``TOKENIZER 'PATH' is not a folder ...`` (one line, the fix).
    """
    name = str(name)
    if os.path.isdir(name) or os.path.isdir(os.path.expanduser(name)) and name.startswith('~'):
        return
    parent = os.path.dirname(name)
    pathlike = (name.startswith(('/', '.', '~')) or (os.sep != '/' and os.sep in name) or name.count('/') > 1
                or (parent and os.path.isdir(os.path.expanduser(parent))))
    if pathlike:
        what = 'a file' if os.path.exists(name) else 'no such folder'
        raise ValueError(f'TOKENIZER {name!r} is not a folder ({what}); it looks like a local path, so the Hugging '
                         'Face hub is not asked: check the path, or pass a hub id such as Qwen/Qwen3-0.6B')


def load_tokenizer(name_or_path: str):
    """Load a Hugging Face tokenizer from a local folder or a hub id.

    Args:
        name_or_path: a folder with ``tokenizer.json`` / ``tokenizer_config.json``, a family name
            of :data:`TOKENIZER_FAMILIES` (``'qwen3'``: found by :func:`find_tokenizer_dir`), or a hub
            id. With ``HF_HUB_OFFLINE=1`` nothing is downloaded.

    Returns:
        The ``AutoTokenizer`` instance (transformers' logging is left unchanged), checked by
        :func:`verified_tokenizer` (a ``PreTrainedTokenizerFast`` instead when that one encodes text
        as ``tokenizer.json`` does and the ``AutoTokenizer`` class does not).

    Raises:
        ImportError: without the ``hf`` extra (``pip install agentrl[hf]``).
        ValueError: the folder or id does not hold a tokenizer; pass a folder that contains
            ``tokenizer.json`` or a hub id reachable from this machine. A local path that names no
            folder is refused before the hub is asked (:func:`_refuse_missing_path`); a hub id while
            huggingface.co does not answer (:func:`_hub_reachable`, 1.5 s) is read from the local hub cache
            only, and refused at once when it is not there. A tokenizer that encodes text otherwise
            than its ``tokenizer.json`` under this transformers version (:func:`verified_tokenizer`).

    Source: Hugging Face ``AutoTokenizer.from_pretrained``.
    """
    _refuse_missing_path(name_or_path)              # before transformers is imported, and before any hub call
    transformers = require_hf('load_tokenizer')
    if name_or_path in TOKENIZER_FAMILIES and not os.path.isdir(name_or_path):
        try:                                 # a family name: the one lookup (env, ../shared, hub)
            name_or_path = str(find_tokenizer_dir(name_or_path))
        except FileNotFoundError as e:
            raise ValueError(str(e)) from e
    offline = not os.path.isdir(name_or_path) and not _hub_reachable()
    kwargs = {'local_files_only': True} if offline else {}
    try:                                 # offline: the local hub cache only (its retries cost ~50 s otherwise)
        tok = transformers.AutoTokenizer.from_pretrained(name_or_path, **kwargs)
    except (OSError, ValueError) as e:
        if offline:
            raise ValueError(f'TOKENIZER {name_or_path!r} is not a folder here nor in the local Hugging Face cache, '
                             'and huggingface.co did not answer within 1.5 s, so it was not downloaded: pass a folder '
                             'with tokenizer.json, or run where the hub is reachable') from e
        raise ValueError(f'TOKENIZER {name_or_path!r} could not be loaded ({type(e).__name__}: {e}); '
                         'pass a folder with tokenizer.json and tokenizer_config.json, or a hub id '
                         '(set HF_HUB_OFFLINE=1 to forbid downloads)') from e
    return verified_tokenizer(tok, name_or_path, **kwargs)


#: Text every loaded tokenizer must encode as its own ``tokenizer.json`` does and decode back: runs of
#: spaces, a newline, non-ASCII Latin and CJK (what a Metaspace pre-tokenizer put over a byte-level BPE drops).
ROUND_TRIP_PROBE = 'It is 25 °C\n  ok, naïve 東京'
_VERIFIED: dict = {}       # tokenizer.json path -> (ids, decoded text) of the probe under the file's own tokenizer


def _tokenizer_json(name_or_path: str) -> str | None:
    """The ``tokenizer.json`` a tokenizer was loaded from (a folder's, or the hub cache's), or None."""
    path = os.path.join(str(name_or_path), 'tokenizer.json')
    if os.path.isdir(str(name_or_path)):
        return path if os.path.isfile(path) else None
    try:
        import huggingface_hub
        return huggingface_hub.hf_hub_download(str(name_or_path), 'tokenizer.json', local_files_only=True)
    except Exception:  # noqa: BLE001 - no such file cached: nothing to compare with
        return None


def _file_probe(path: str) -> tuple:
    """``(ids, decoded text)`` of :data:`ROUND_TRIP_PROBE` under ``tokenizer.json``'s own tokenizer (cached)."""
    key = (path, os.path.getmtime(path))
    if key not in _VERIFIED:
        import tokenizers
        ref = tokenizers.Tokenizer.from_file(path)
        ids = ref.encode(ROUND_TRIP_PROBE, add_special_tokens=False).ids
        _VERIFIED[key] = (ids, ref.decode(ids))
    return _VERIFIED[key]


def _probe(tok) -> tuple:
    ids = list(tok(ROUND_TRIP_PROBE, add_special_tokens=False)['input_ids'])
    return ids, tok.decode(ids)


def verified_tokenizer(tok, name_or_path: str, **kwargs):
    """``tok`` when it encodes and decodes :data:`ROUND_TRIP_PROBE` as its ``tokenizer.json`` does, else one that does.

    Some transformers versions load a tokenizer as a class that rebuilds its pipeline (5.10 loads
    DeepSeek-V3's byte-level BPE as ``LlamaTokenizer`` with a Metaspace pre-tokenizer: spaces, newlines
    and non-ASCII vanish). The probe's ids and decoded text must equal those of
    ``tokenizers.Tokenizer.from_file(tokenizer.json)``; otherwise the folder is loaded again with
    ``PreTrainedTokenizerFast.from_pretrained`` (the file as it is), which must then agree.

    Args:
        tok: a loaded Hugging Face tokenizer. name_or_path: the folder or hub id it was loaded from.
        kwargs: passed on to ``from_pretrained`` for the second load (``local_files_only``).

    Returns:
        ``tok``, or the ``PreTrainedTokenizerFast`` that agrees with the file; ``tok`` unchanged when
        there is no ``tokenizer.json`` to compare with (a slow-only tokenizer).

    Raises:
        ValueError: neither load agrees with the file: one line naming the transformers version and the fix.

    Source: docs/design.md#templates; the ``tokenizers`` library (``Tokenizer.from_file``).
    """
    path = _tokenizer_json(name_or_path)
    if path is None:
        return tok
    want = _file_probe(path)
    got = _probe(tok)
    if got == want:
        return tok
    import transformers
    fast = transformers.PreTrainedTokenizerFast.from_pretrained(name_or_path, **kwargs)
    if _probe(fast) == want:
        return fast
    raise ValueError(f'TOKENIZER {str(name_or_path)!r} does not encode text as its tokenizer.json does under '
                     f'transformers {transformers.__version__} ({type(tok).__name__} gives ids {got[0]} and '
                     f'text {got[1]!r} for {ROUND_TRIP_PROBE!r}); install another transformers version '
                     '(pip install "transformers>=5.24") or fix tokenizer_class in tokenizer_config.json')


def generation_eos_ids(source) -> tuple:
    """The ``eos_token_id`` list of a model's ``generation_config.json``: ids every vLLM request stops at.

    vLLM adds this list to each request's stop ids (GLM-4.5: ``<|endoftext|>``, ``<|user|>``,
    ``<|observation|>``; Qwen3: ``<|im_end|>``, ``<|endoftext|>``; gpt-oss: ``<|return|>``, ``<|call|>``),
    so agentrl's stops include it (docs/design.md#stops).

    Args:
        source: a folder holding ``generation_config.json``, the file itself, a dict of it, or a
            tokenizer (its ``name_or_path`` folder is read). None, or a folder without the file: ``()``.

    Returns:
        ``tuple[int]`` in the file's order (an int ``eos_token_id`` gives one id; absent gives ``()``).

    Raises:
        ValueError: the file is not a JSON object, or ``eos_token_id`` is not an int or a list of ints
            (the message names the file).
    """
    if source is None:
        return ()
    if not isinstance(source, (dict, str, os.PathLike)):
        source = getattr(source, 'name_or_path', None) or ''
        if not source or not os.path.isdir(source):
            return ()
    where = 'generation_config'
    if not isinstance(source, dict):
        path = Path(source)
        path = path / 'generation_config.json' if path.is_dir() else path
        if not path.is_file():
            return ()
        where = str(path)
        source = read_json(path, fix="pass the model folder's generation_config.json")
        if not isinstance(source, dict):
            raise ValueError(f'{where}: is not a JSON object; pass the model folder\'s generation_config.json')
    eos = source.get('eos_token_id')
    if eos is None:
        return ()
    eos = [eos] if isinstance(eos, int) and not isinstance(eos, bool) else eos
    if not isinstance(eos, list) or not all(isinstance(i, int) and not isinstance(i, bool) for i in eos):
        raise ValueError(f'{where}: eos_token_id is {eos!r}; it must be an int or a list of ints (token ids)')
    return tuple(eos)
