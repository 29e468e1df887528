"""The stored responses of ``/v1/responses`` (``store: true``, the default): what
``previous_response_id``, ``GET``, ``DELETE`` and ``input_items`` read back.

A record is a response's answer as it was sent (``response``), the items the model was given
before this response's own input (``history``: the earlier turns of a conversation, their answers
included), its own input items (``input``) and the checkpoint that pins its conversation's KV in
the durable store (``checkpoint``, or None).

Two homes, decided by the server's configuration. With a durable KV store (``--kv-store-dir``)
each record is a JSON file in ``responses/`` beside the store's pages, written under a temporary
name, flushed and renamed (a crash leaves the old file or the new one, never half of one) and
read back at boot, so a conversation outlives a restart as its checkpoint does. Without one they
live in this process's memory, at most ``--max-stored-responses`` of them, the least recently
used dropped first with a ``response.evict`` receipt; a restart forgets them, and the 404 of a
``previous_response_id`` says so.
"""

from __future__ import annotations

import os
import re
import stat
from collections import OrderedDict, deque
from pathlib import Path
from typing import Any, Protocol

import orjson

from engine.observability import schema
from engine.server.errors import ProtocolError

FOLDER = "responses"
# the ids this server writes (resp_ and hex): nothing else can name a file
_ID = re.compile(r"resp_[0-9a-f]{1,64}")


class Recorder(Protocol):
    """Where the store's receipts go (``EngineDriver``): a receipt, or a notice said once."""

    def record(self, kind: str, **fields: Any) -> None: ...
    def notice(self, key: str, text: str, **fields: Any) -> None: ...


class ResponseStore:
    """Stored responses by id: files under ``directory`` (None: in memory, at most ``bound``)."""

    def __init__(self, directory: Path | None, bound: int, recorder: Recorder) -> None:
        self.directory = directory
        self.bound = bound
        self.recorder = recorder
        self.memory: OrderedDict[str, dict[str, Any]] = OrderedDict()
        # the ids dropped for the bound lately, so their 404 can say so
        self.dropped: deque[str] = deque(maxlen=bound)
        if directory is not None:
            for stale in directory.glob("*.tmp"):  # a write a crash cut short
                stale.unlink(missing_ok=True)

    @classmethod
    def beside(cls, store_dir: str | None, bound: int, recorder: Recorder) -> ResponseStore:
        """The store a server keeps: files in ``responses/`` beside its durable KV store, if it
        has one it can use; else (said once) in memory. As the store itself, it follows no
        link: a ``responses`` that is not a folder of its own is not used."""
        if store_dir is None:
            return cls(None, bound, recorder)
        folder = Path(store_dir) / FOLDER
        try:
            folder.mkdir(exist_ok=True)
            if folder.is_symlink() or not folder.is_dir():
                raise NotADirectoryError(f"{folder} is not a folder (a link is not followed)")
        except OSError as e:
            recorder.notice(
                "responses_in_memory",
                f"stored responses are kept in memory, not in {folder}: {e}",
                dir=str(folder),
            )
            return cls(None, bound, recorder)
        return cls(folder, bound, recorder)

    @property
    def durable(self) -> bool:
        return self.directory is not None

    def _path(self, rid: str) -> Path | None:
        if self.directory is None or not _ID.fullmatch(rid):
            return None
        return self.directory / f"{rid}.json"

    def put(self, rid: str, record: dict[str, Any]) -> None:
        """Keep ``record`` under ``rid``: on disk (atomically), or in memory within the bound.
        A file that cannot be written (a full disk) keeps it in memory, said once."""
        path = self._path(rid)
        if path is not None:
            try:
                _write(path, orjson.dumps(record))
                return
            except OSError as e:
                self.recorder.notice(
                    "response_not_written",
                    f"a stored response could not be written to {path.parent} ({e}); it is "
                    "kept in memory until a restart",
                    id=rid,
                )
        self.memory[rid] = record
        self.memory.move_to_end(rid)
        while len(self.memory) > self.bound:
            old, _ = self.memory.popitem(last=False)
            self.dropped.append(old)
            self.recorder.record(
                schema.RESPONSE_EVICT,
                id=old,
                reason="bound",
                bound=self.bound,
                stored=len(self.memory),
            )

    def get(self, rid: str, param: str | None = None) -> dict[str, Any]:
        """The record of ``rid`` (a use: the most recently used now); a 404 naming it."""
        record = self.memory.get(rid)
        if record is not None:
            self.memory.move_to_end(rid)
            return record
        path = self._path(rid)
        if path is not None:
            try:
                return orjson.loads(_read(path))
            except (FileNotFoundError, NotADirectoryError):
                pass
        raise self._missing(rid, param)

    def delete(self, rid: str) -> dict[str, Any]:
        """Remove ``rid``'s record and return it; a 404 naming it."""
        record = self.get(rid)
        if self.memory.pop(rid, None) is None and (path := self._path(rid)) is not None:
            path.unlink(missing_ok=True)
        return record

    def _missing(self, rid: str, param: str | None) -> ProtocolError:
        where = f"{param}: " if param else ""
        if self.directory is not None:
            why = "it was never stored here (store: false), or it was deleted"
        elif rid in self.dropped:
            why = (
                f"this server keeps stored responses in memory, at most {self.bound} of them "
                "(--max-stored-responses), and dropped it, the least recently used "
                "(response.evict)"
            )
        else:
            why = (
                "this server keeps stored responses in memory (it has no --kv-store-dir), so "
                "a restart forgets them: it was restarted since, dropped it for the bound of "
                f"{self.bound} (--max-stored-responses), or it was never stored (store: false)"
            )
        return ProtocolError(f"{where}no response {rid!r}: {why}", param, 404)


def _write(path: Path, data: bytes) -> None:
    """``data`` as the file at ``path``, whole or not at all: a new temporary file (no link
    followed), flushed, then renamed over it."""
    tmp = path.with_suffix(".tmp")
    tmp.unlink(missing_ok=True)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)


def _read(path: Path) -> bytes:
    """The regular file at ``path`` (a link is not followed: FileNotFoundError)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError as e:
        raise FileNotFoundError(str(path)) from e
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise FileNotFoundError(str(path))
        with os.fdopen(fd, "rb", closefd=False) as f:
            return f.read()
    finally:
        os.close(fd)
