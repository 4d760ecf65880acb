"""L0: atomic file writes, the one place that writes a temporary file and renames it.

A reader sees the old file or the new one, never a half-written one, and a failed write leaves
no temporary file behind. Every writer of the package (checkpoints, summaries, reports, Parquet
shards, manifests) goes through :func:`atomic_write` or :func:`atomic_path`.

Source: POSIX ``rename(2)`` is atomic within one file system; a temporary file in the target's
own folder guarantees that.
"""
from __future__ import annotations

import contextlib
import os
import uuid
from pathlib import Path
from typing import Iterator

__all__ = ['atomic_write', 'atomic_path', 'temp_name', 'fsync_dir', 'TEMP_PREFIX']

#: Temporary files are hidden: ``.NAME.tmp-PID-RANDOM`` next to their final ``NAME``.
TEMP_PREFIX = '.'


def temp_name(final: str | os.PathLike) -> Path:
    """The hidden temporary name a write of ``final`` uses: ``.NAME.tmp-PID-8HEX`` in the same folder."""
    final = Path(final)
    return final.with_name(f'{TEMP_PREFIX}{final.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}')


def fsync_dir(folder: str | os.PathLike) -> None:
    """Flush a folder's entries to disk (best effort: some file systems refuse, which is ignored)."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


@contextlib.contextmanager
def atomic_path(final: str | os.PathLike, *, fsync: bool = True, overwrite: bool = True) -> Iterator[Path]:
    """Yield a temporary path to write ``final`` through; publish it only if the block succeeds.

    On any exception (``KeyboardInterrupt`` and ``OSError: No space left on device`` included) the
    temporary file is removed and the exception propagates; ``final`` is untouched.

    Args:
        final: the file to write; its folder must exist.
        fsync: flush the file and its folder before and after the rename (default True).
        overwrite: replace an existing ``final``; with False, ``FileExistsError`` is raised instead
            and nothing is replaced (hard link, then unlink: atomic "create if absent").

    Raises:
        FileExistsError: ``overwrite=False`` and ``final`` exists.
    """
    final = Path(final)
    tmp = temp_name(final)
    try:
        yield tmp
        if fsync:
            fd = os.open(tmp, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        if overwrite:
            os.replace(tmp, final)
        else:
            try:
                os.link(tmp, final)
            except FileExistsError:
                raise
            except OSError:  # file systems without hard links: check, then rename
                if final.exists():
                    raise FileExistsError(str(final)) from None
                os.replace(tmp, final)
        if fsync:
            fsync_dir(final.parent)
    finally:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()


def atomic_write(final: str | os.PathLike, data: bytes | str, *, fsync: bool = True, overwrite: bool = True) -> Path:
    """Write ``data`` (bytes, or str as UTF-8) to ``final`` atomically; see :func:`atomic_path`.

    Returns:
        ``final`` as a Path.

    Raises:
        FileExistsError: ``overwrite=False`` and ``final`` exists.
        OSError: the write failed (full disk, read-only folder); nothing is left behind.
    """
    final = Path(final)
    with atomic_path(final, fsync=fsync, overwrite=overwrite) as tmp:
        with open(tmp, 'wb') as f:
            f.write(data.encode('utf-8') if isinstance(data, str) else data)
    return final
