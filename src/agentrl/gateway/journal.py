"""L5: the gateway's append-only journal: one JSON line per event, written whole and fsync'd before it counts.

Events (``ev``): ``session`` (opened: id, identity, task, and ``v``, the journal format of its
calls), ``call`` (a completed call: the request as recorded, its messages after the ``prefix``
shared with the session's previous call, the sampled ids and log-probs, the response sent),
``delivered`` (every byte of a call's response was handed to the connection), ``undelivered``
(the client never received a call's response), ``policy``, ``finish`` (reward and info, or
aborted), ``committed`` (its records are stored, with what the run summary and the identity
check keep of it). The gateway's whole state is a fold of these events, so a gateway killed with
SIGKILL and restarted on the same folder resumes exactly where the last fsync'd line left it.

Formats: a session whose ``session`` line has ``v`` >= 2 (:data:`JOURNAL_VERSION`) trains a call
only once a ``delivered`` line follows it (or a later call echoes it); a session written before
(no ``v``) counts its calls delivered unless an ``undelivered`` line says otherwise.

A line is appended whole or not at all (:meth:`Journal.append`). A torn last line (killed
mid-write) is dropped on reading; any other bad line (not JSON, a missing or mistyped field, a
call repeated or out of order) is refused by name.

Source: docs/design.md#integrity (never lose, never double).
"""
from __future__ import annotations

import json
import os
import threading
from pathlib import Path

__all__ = ['Journal', 'read_journal', 'JOURNAL_VERSION']

#: The format a new session's calls are journalled in (2: a call is delivered once marked so).
JOURNAL_VERSION = 2

_INT, _NUM, _STR, _DICT, _LIST, _BOOL = 'an integer', 'a number', 'a string', 'an object', 'a list', 'a boolean'
#: per event: its required fields and their kinds
_FIELDS = {
    'session': {'sid': _STR, 'identity': _DICT, 't': _NUM},
    'call': {'sid': _STR, 'index': _INT, 'digest': _STR, 'req': _DICT, 'ids': _LIST, 'logp': _LIST,
             'truncated': _BOOL, 'message': _DICT, 'response': _DICT, 't': _NUM},
    'delivered': {'sid': _STR, 'index': _INT},
    'undelivered': {'sid': _STR, 'index': _INT},
    'policy': {'version': _STR},
    'finish': {'sid': _STR, 'reward': _NUM, 'info': _DICT, 'aborted': _BOOL},
    'committed': {'sid': _STR, 'records': _INT},
}
#: per event: fields it may lack, and their kinds when present
_OPTIONAL = {'session': {'v': _INT}, 'committed': {'stats': _DICT, 'describe': _DICT}}


def _kind_ok(v, kind: str) -> bool:
    if kind in (_INT, _NUM) and isinstance(v, bool):
        return False
    return isinstance(v, {_INT: int, _NUM: (int, float), _STR: str, _DICT: dict, _LIST: list, _BOOL: bool}[kind])


def _problem(ev, calls: dict) -> str | None:
    """What is wrong with one parsed line (None: a good event); ``calls`` (sid -> calls so far) is updated."""
    if not isinstance(ev, dict):
        return f'a JSON {type(ev).__name__}, not an object'
    kind = ev.get('ev')
    if kind not in _FIELDS:
        return f'ev={kind!r} is not one of {sorted(_FIELDS)}'
    for name, want in _FIELDS[kind].items():
        if name not in ev:
            return f'event {kind!r}: no field {name!r}'
        if not _kind_ok(ev[name], want):
            return f'event {kind!r}: field {name!r} is {type(ev[name]).__name__}, not {want}'
    for name, want in _OPTIONAL.get(kind, {}).items():
        if name in ev and not _kind_ok(ev[name], want):
            return f'event {kind!r}: field {name!r} is {type(ev[name]).__name__}, not {want}'
    if kind == 'call':
        have = calls.get(ev['sid'], 0)
        if ev['index'] < have:
            return f'a duplicated line: it repeats call {ev["index"]} of session {ev["sid"]}'
        if ev['index'] > have:
            return f'call {ev["index"]} of session {ev["sid"]}, but only {have} calls of it come before'
        calls[ev['sid']] = have + 1
    return None


def read_journal(path: str | os.PathLike) -> list:
    """The events of a journal file, in order ([] when it does not exist).

    A torn last line (not JSON: a writer killed mid-line) is dropped.

    Raises:
        ValueError: a line that is not a JSON object, has an unknown ``ev``, lacks a field of its
            event or holds one of another type, or repeats (or skips) a call of a session (names
            the file, the line number and the fix).
    """
    p = Path(path)
    if not p.is_file():
        return []
    lines = p.read_bytes().split(b'\n')
    out, calls = [], {}
    for n, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            ev = json.loads(line)
        except ValueError as e:
            if n == len(lines) - 1:          # torn last line: its call was never answered
                break
            what = f'not JSON: {e}'
        else:
            what = _problem(ev, calls)
        if what is not None:
            raise ValueError(f'{p}: line {n + 1} is not a journal event ({what}); the journal was edited or damaged: '
                             'restore it or serve into a new --out')
        out.append(ev)
    return out


class Journal:
    """Append events to ``path`` durably and whole (``write`` + ``fsync`` before :meth:`append` returns).

    A torn last line left by a killed writer is cut off when the journal is opened, so new events
    start on a fresh line.

    Raises:
        OSError: the file cannot be opened.
    """

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if self.path.is_file():
            data = self.path.read_bytes()
            if data and not data.endswith(b'\n'):
                with open(self.path, 'r+b') as f:
                    f.truncate(data.rfind(b'\n') + 1)
        self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        self._lock = threading.Lock()
        self._broken: str | None = None
        fd = os.open(self.path.parent, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def append(self, event: dict, sync: bool = True) -> None:
        """Write one event as a JSON line and fsync it: all of it, or nothing.

        On a failed write or fsync the file is cut back to its size before the call, so no part
        of the line stays (and nothing is written later in front of another event). ``sync=False``
        skips the fsync: the line is in the kernel's cache, kept if the process is killed, made
        durable by the next synced line (for marks whose loss only errs on the safe side).

        Raises:
            OSError: the write or fsync failed (ENOSPC, EFBIG, EIO ...; the journal is as before),
                or an earlier failure could not be cut back (restart the gateway: opening cuts it).
        """
        line = json.dumps(event, separators=(',', ':'), ensure_ascii=False).encode() + b'\n'
        with self._lock:
            if self._broken is not None:
                raise OSError(f'{self.path} holds part of a line that could not be cut back ({self._broken}); '
                              'restart the gateway on the same --out')
            size = os.fstat(self._fd).st_size
            try:
                view = memoryview(line)
                while view:
                    view = view[os.write(self._fd, view):]
                if sync:
                    os.fsync(self._fd)
            except OSError as e:
                try:
                    os.ftruncate(self._fd, size)
                except OSError as cut:
                    self._broken = f'{type(cut).__name__}: {cut}'
                raise e from None

    def close(self) -> None:
        """Close the file (idempotent)."""
        with self._lock:
            if self._fd >= 0:
                os.close(self._fd)
                self._fd = -1
