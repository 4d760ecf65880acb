"""L5: the gateway's append-only journal: one JSON line per event, flushed and fsync'd before it counts.

Events (``ev``): ``session`` (opened: id, identity, task), ``call`` (a completed call: the request
as recorded, its messages after the ``prefix`` shared with the session's previous call, the sampled
ids and log-probs, the response sent), ``undelivered`` (the client never
received a call's response), ``finish`` (reward and info, or aborted), ``committed`` (its records
are stored). The gateway's whole state is a fold of these events, so a gateway killed with
SIGKILL and restarted on the same folder resumes exactly where the last fsync'd line left it. A
torn last line (killed mid-write) is dropped on reading; any other bad line is an error.

Source: docs/design.md#integrity (never lose, never double).
"""
from __future__ import annotations

import json
import os
import threading
from pathlib import Path

__all__ = ['Journal', 'read_journal']


def read_journal(path: str | os.PathLike) -> list:
    """The events of a journal file, in order ([] when it does not exist).

    Raises:
        ValueError: a line other than the last one is not a JSON object (names the file and line).
    """
    p = Path(path)
    if not p.is_file():
        return []
    lines = p.read_bytes().split(b'\n')
    out = []
    for n, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            ev = json.loads(line)
            if not isinstance(ev, dict):
                raise ValueError('not an object')
        except ValueError as e:
            if n == len(lines) - 1:          # torn last line: its call was never answered
                break
            raise ValueError(f'{p}: line {n + 1} is not a journal event ({e}); the journal was edited or '
                             'damaged: restore it or serve into a new --out') from None
        out.append(ev)
    return out


class Journal:
    """Append events to ``path`` durably (``write`` + ``fsync`` before :meth:`append` returns).

    A torn last line left by a killed writer is cut off when the journal is opened, so new events
    start on a fresh line.

    Raises:
        OSError: the file cannot be opened or written (full disk: the call fails, nothing is sent).
    """

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if self.path.is_file():
            data = self.path.read_bytes()
            if data and not data.endswith(b'\n'):
                with open(self.path, 'r+b') as f:
                    f.truncate(data.rfind(b'\n') + 1)
        self._f = open(self.path, 'ab')
        self._lock = threading.Lock()
        fd = os.open(self.path.parent, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def append(self, event: dict) -> None:
        """Write one event as a JSON line and fsync it."""
        line = json.dumps(event, separators=(',', ':'), ensure_ascii=False).encode() + b'\n'
        with self._lock:
            self._f.write(line)
            self._f.flush()
            os.fsync(self._f.fileno())

    def close(self) -> None:
        """Close the file."""
        with self._lock:
            self._f.close()
