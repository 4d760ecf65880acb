"""L0: atomic file writes, the one place that writes a temporary file and renames it.

A reader sees the old file or the new one, never a half-written one, and a failed write leaves
no temporary file behind. Every writer of the package (checkpoints, summaries, reports, Parquet
shards, manifests) goes through :func:`atomic_write` or :func:`atomic_path`.

Source: POSIX ``rename(2)`` is atomic within one file system; a temporary file in the target's
own folder guarantees that.

Reading: :func:`read_json` reads a JSON or JSONL file and names the file (and line) in every
decode error, so a CLI reader never shows a bare ``Expecting ',' delimiter``.

Bounds: :func:`env_bound` reads the environment variable that raises one of the documented bounds
(docs/design.md#bounds); :func:`read_json` reads only regular files, up to ``AGENTRL_MAX_INPUT_BYTES``.

Terminal output: :func:`printable` is the one helper that neutralises escape and control
characters in data (record fields, file names, messages) before they reach a terminal.
"""
from __future__ import annotations

import contextlib
import errno
import json
import os
import re
import uuid
from pathlib import Path
from typing import Iterator

__all__ = ['atomic_write', 'atomic_path', 'temp_name', 'fsync_dir', 'TEMP_PREFIX', 'printable', 'read_json',
           'env_bound', 'regular_file', 'MAX_INPUT_BYTES']

#: The lock file of a run folder (``fcntl.flock``).
LOCK = '.lock'
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


#: Default of ``AGENTRL_MAX_INPUT_BYTES``: the largest JSON/JSONL input read (docs/design.md#bounds).
MAX_INPUT_BYTES = 1 << 30


def env_bound(name: str, default: int | float, *, kind: type = int) -> int | float:
    """The bound set by environment variable ``name`` (read at each call), else ``default``.

    Args:
        name: e.g. ``'AGENTRL_MAX_INPUT_BYTES'`` (every bound and its variable: docs/design.md#bounds).
        default: the documented default.
        kind: ``int`` (bytes, characters) or ``float`` (seconds).

    Returns:
        a positive ``kind``.

    Raises:
        ValueError: ``NAME='abc' is not a positive number; unset it for the default D``.
    """
    raw = os.environ.get(name)
    if raw is None or not raw.strip():
        return default
    try:
        value = kind(raw.strip())
        ok = value > 0 and value == value and value != float('inf')
    except ValueError:
        ok = False
    if not ok:
        raise ValueError(f'{name}={raw!r} is not a positive {"integer" if kind is int else "number"}; set it to '
                         f'the bound you want, or unset it for the default {default}')
    return value


def _refuse_irregular(path, st: os.stat_result, what: str) -> None:
    import stat
    if not stat.S_ISREG(st.st_mode):
        kind = {stat.S_IFIFO: 'a FIFO', stat.S_IFCHR: 'a character device', stat.S_IFBLK: 'a block device',
                stat.S_IFSOCK: 'a socket', stat.S_IFDIR: 'a folder'}.get(stat.S_IFMT(st.st_mode), 'not a file')
        raise ValueError(f'{str(path)!r} is {kind}, not a regular file; agentrl reads {what} only from regular '
                         'files: copy the data into a file and pass that')


def regular_file(path: str | os.PathLike, what: str = 'input') -> os.stat_result:
    """Refuse anything but a regular file before it is opened (a FIFO blocks the reader; ``/dev/zero`` never ends).

    Returns:
        the file's ``os.stat`` result (``st_size`` is its length in bytes).

    Raises:
        FileNotFoundError: nothing at ``path``.
        ValueError: ``'PATH' is a FIFO, not a regular file; ...`` (also a character device, socket,
            folder ...): one line naming the file and the fix.
    """
    st = os.stat(path)
    _refuse_irregular(path, st, what)
    return st


def read_json(path: str | os.PathLike, *, fix: str, lines: bool | str = False, max_bytes: int | None = None):
    """The JSON value of the UTF-8 file ``path`` (``lines=True``: a list, one value per non-blank line).

    Args:
        path: the file (a regular file: :func:`regular_file`).
        fix: what the user should do, appended to every error (e.g. ``'pass a template audit .json'``).
        max_bytes: the largest file read (None: ``AGENTRL_MAX_INPUT_BYTES``, default
            :data:`MAX_INPUT_BYTES`; docs/design.md#bounds).
        lines: True: JSON Lines, one value per line, blank lines skipped; ``'auto'``: a JSON list
            when the text starts with ``[``, else JSON Lines.

    Returns:
        the decoded value (``dict``, ``list``, ...); a ``list`` with ``lines=True``.

    Raises:
        ValueError: ``'PATH' is not UTF-8 text (byte 0xff at offset 0); FIX`` or ``'PATH' is not
            valid JSON (Expecting value at line 2 column 1); FIX`` (JSONL: ``'PATH' line 3 is not
            valid JSON (...)``), one line each; not a regular file (:func:`regular_file`), or larger than
            ``max_bytes`` (``'PATH' holds N bytes, over the bound of M bytes ...``).
        OSError: the file cannot be read (``FileNotFoundError`` names it).

    Example:
        ``read_json('a.json', fix='fix it')`` on a file holding ``{"x": 1`` raises
        ``ValueError("'a.json' is not valid JSON (Expecting ',' delimiter at line 1 column 8); fix it")``.
    """
    name = repr(str(path))
    cap = env_bound('AGENTRL_MAX_INPUT_BYTES', MAX_INPUT_BYTES) if max_bytes is None else max_bytes
    fd = os.open(path, os.O_RDONLY | getattr(os, 'O_NONBLOCK', 0))    # a FIFO: open returns, fstat refuses it
    with os.fdopen(fd, 'rb') as f:
        st = os.fstat(fd)
        _refuse_irregular(path, st, 'JSON')
        size = st.st_size
        raw = f.read(cap + 1) if size <= cap else b''
    if size > cap or len(raw) > cap:
        raise ValueError(f'{name} holds {max(size, len(raw))} bytes, over the bound of {cap} bytes for a JSON input '
                         '(AGENTRL_MAX_INPUT_BYTES); split the file, or raise AGENTRL_MAX_INPUT_BYTES if you trust it')
    try:
        text = raw.decode('utf-8')
    except UnicodeDecodeError as e:
        raise ValueError(f'{name} is not UTF-8 text (byte 0x{raw[e.start]:02x} at offset {e.start}); {fix}') from None
    if lines == 'auto':
        lines = not text.lstrip().startswith('[')
    if not lines:
        try:
            return json.loads(text)
        except json.JSONDecodeError as e:
            raise ValueError(f'{name} is not valid JSON ({e.msg} at line {e.lineno} column {e.colno}); {fix}') from None
    out = []
    for k, line in enumerate(text.splitlines(), 1):
        if line.strip():
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError as e:
                raise ValueError(f'{name} line {k} is not valid JSON ({e.msg} at column {e.colno}); {fix}') from None
    return out


# C0 and C1 control characters (ESC starts terminal escape sequences; CSI is 0x9b), DEL, and the
# Unicode bidirectional overrides and isolates that reorder how a line is displayed.
_CONTROL = re.compile('[\x00-\x08\x0b-\x1f\x7f-\x9f\u200e\u200f\u202a-\u202e\u2066-\u2069]')
_CONTROL_NL = re.compile('[\x00-\x1f\x7f-\x9f\u200e\u200f\u202a-\u202e\u2066-\u2069]')


def _escape(m: re.Match) -> str:
    c = ord(m.group())
    return f'\\x{c:02x}' if c < 0x100 else f'\\u{c:04x}'


def printable(text, *, newlines: bool = False) -> str:
    """``text`` with every control character shown as an escape, safe to print to a terminal.

    ESC (``\\x1b``, which starts a terminal escape sequence such as ``\\x1b[2J`` "clear the
    screen"), the other C0 and C1 controls, DEL and the Unicode bidirectional overrides become
    visible ``\\xNN`` / ``\\uNNNN`` text; tab and newline are kept with ``newlines=True``.

    Args:
        text: any object (converted with ``str``).
        newlines: keep ``\\n`` and ``\\t`` (multi-line output); default False escapes them too
            (one-line output).

    Returns:
        str with no control characters (other than tab and newline when allowed).

    Example:
        ``printable('\\x1b[2J\\x1b[31mEVIL')`` is ``'\\\\x1b[2J\\\\x1b[31mEVIL'`` (printed: ``\\x1b[2J\\x1b[31mEVIL``).

    Source: ECMA-48 (control functions: C0, C1 and the CSI introducer); Unicode UAX #9
    (bidirectional formatting characters).
    """
    text = text if isinstance(text, str) else str(text)
    return (_CONTROL if newlines else _CONTROL_NL).sub(_escape, text)


def pid_alive(pid: int) -> bool:
    """True when process ``pid`` exists on this machine (it may belong to another user)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class FolderLockedError(ValueError):
    """Another process is writing the folder (it holds ``FOLDER/.lock``)."""


@contextlib.contextmanager
def folder_lock(folder: str | os.PathLike) -> Iterator[Path]:
    """Hold ``folder/.lock`` (``fcntl.flock``, exclusive, non-blocking) for the block; remove it after.

    The lock dies with its process (also on SIGKILL), so a killed job never blocks the folder. When
    the block ends, finished or failed, the file is removed (while still locked), so a finished run
    folder holds no ``.lock``; a job refused here leaves the holder's file alone. A job that opened
    the file just before its holder removed it locks a file nobody can find: it sees that the path
    no longer names its file, and starts again on the file at the path.

    Yields:
        the lock file's path (``folder/.lock``).

    Raises:
        FolderLockedError: another process holds it. Fix: wait for that job, or choose another folder.
    """
    import fcntl
    path = Path(folder) / LOCK
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            os.close(fd)
            if e.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise
            raise FolderLockedError(f'{str(folder)!r} is being written by another agentrl job (it holds '
                                    f'{str(path)!r}); wait for it to finish, or choose another --out') from None
        if _names(path, fd):
            break
        os.close(fd)                       # the holder removed it between our open and our lock: again
    try:
        os.ftruncate(fd, 0)
        os.write(fd, str(os.getpid()).encode())
        yield path
    finally:
        try:
            if _names(path, fd):           # still ours: remove it before the lock goes
                with contextlib.suppress(FileNotFoundError):
                    path.unlink()
        finally:
            os.close(fd)


def _names(path: Path, fd: int) -> bool:
    """True when ``path`` is the file open as ``fd``."""
    try:
        return os.path.samestat(os.stat(path), os.fstat(fd))
    except FileNotFoundError:
        return False
