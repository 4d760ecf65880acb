"""L4: the content fingerprint of a model file or folder, and the ``name@fingerprint`` records declare.

Standard library only.
"""
from __future__ import annotations

import hashlib
import os
from pathlib import Path

__all__ = ['model_fingerprint', 'model_name']


def model_fingerprint(path: str | os.PathLike) -> str:
    """A short content fingerprint of a checkpoint file or a model folder: 12 hex digits of sha256.

    A file's is the sha256 of its bytes. A folder's fingerprint covers ``config.json`` and its weight files (``*.safetensors``,
    ``*.bin``, ``*.pt``), by name and content, so a copy on another machine has the same one.

    Raises:
        FileNotFoundError: nothing at ``path``.
    """
    p = Path(path)
    h = hashlib.sha256()
    if not p.exists():
        raise FileNotFoundError(f'no model at {str(p)!r}')
    files = [p] if p.is_file() else sorted(f for f in p.iterdir() if f.is_file() and (
        f.name == 'config.json' or f.suffix in ('.safetensors', '.bin', '.pt')))
    for f in files:
        if p.is_dir():
            h.update(f.name.encode() + b'\0')
        with open(f, 'rb') as fh:
            for block in iter(lambda: fh.read(1 << 20), b''):
                h.update(block)
    return h.hexdigest()[:12]


def model_name(model_dir: str | os.PathLike) -> str:
    """``Provenance.model`` of an engine's records: ``'<folder name>@<model_fingerprint>'`` (never a local path).

    Raises:
        FileNotFoundError: nothing at ``model_dir``.
    """
    return f'{Path(model_dir).resolve().name}@{model_fingerprint(model_dir)}'
