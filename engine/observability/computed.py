"""Receipt fields the engine computes, computed one way everywhere: a batch's digest (the same in
every process, so ranks that agree write the same one) and the progress counters of an
``iteration``. The catalog (``schema``) says what the fields are; this says how their values are
made."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence

from engine.observability.schema import ADMISSION_ADMIT, PROGRESS, REQUEST_ABORT, REQUEST_FINISH


def progress(tokens_generated: int, counts: Mapping[str, int]) -> dict[str, int]:
    """The progress counters (``PROGRESS``) from the tokens sampled and the receipts written
    since boot, by kind."""
    ended = counts.get(REQUEST_FINISH, 0) + counts.get(REQUEST_ABORT, 0)
    values = (tokens_generated, counts.get(ADMISSION_ADMIT, 0), ended)
    return dict(zip(PROGRESS, values, strict=True))


def batch_digest(entries: Sequence[tuple[str, int]]) -> str:
    """The digest of a batch (its (rid, tokens scheduled) in the order it runs): 16 hex
    characters, the same in every process (blake2b, never Python's per-process ``hash``), so the
    ranks of a group that agree write the same one. Each rid is length-prefixed: no rid can
    spell the end of one entry and the start of the next."""
    text = "".join(f"{len(rid)}:{rid}={int(tokens)};" for rid, tokens in entries)
    return hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=8).hexdigest()
