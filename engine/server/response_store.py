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
from collections import OrderedDict, deque
from pathlib import Path
from typing import Any

import orjson

from engine.observability import schema
from engine.server.errors import ProtocolError
from engine.server.frontdoor import Recorder

FOLDER = "responses"
# the ids this server writes (resp_ and hex): nothing else can name a file
_ID = re.compile(r"resp_[0-9a-f]{1,64}")


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
            directory.mkdir(parents=True, exist_ok=True)
            for stale in directory.glob("*.tmp"):  # a write a crash cut short
                stale.unlink(missing_ok=True)

    @classmethod
    def beside(cls, store_dir: str | None, bound: int, recorder: Recorder) -> ResponseStore:
        """The store a server keeps: files beside its durable KV store, if it has one."""
        folder = None if store_dir is None else Path(store_dir) / FOLDER
        return cls(folder, bound, recorder)

    @property
    def durable(self) -> bool:
        return self.directory is not None

    def _path(self, rid: str) -> Path | None:
        if self.directory is None or not _ID.fullmatch(rid):
            return None
        return self.directory / f"{rid}.json"

    def put(self, rid: str, record: dict[str, Any]) -> None:
        """Keep ``record`` under ``rid``: on disk (atomically), or in memory within the bound."""
        path = self._path(rid)
        if path is not None:
            tmp = path.with_suffix(".tmp")
            with open(tmp, "wb") as f:
                f.write(orjson.dumps(record))
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
            return
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
        if self.directory is not None:
            path = self._path(rid)
            try:
                if path is not None:
                    return orjson.loads(path.read_bytes())
            except FileNotFoundError:
                pass
            raise self._missing(rid, param)
        record = self.memory.get(rid)
        if record is None:
            raise self._missing(rid, param)
        self.memory.move_to_end(rid)
        return record

    def delete(self, rid: str) -> dict[str, Any]:
        """Remove ``rid``'s record and return it; a 404 naming it."""
        record = self.get(rid)
        path = self._path(rid)
        if path is not None:
            path.unlink(missing_ok=True)
        else:
            self.memory.pop(rid, None)
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
