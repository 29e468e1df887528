"""One streaming pass over boot logs: JSON receipts and plain text lines, mixed.

Every line is one of: a receipt of this schema (a JSON object with ``event``, ``v``, ``boot``,
``rank`` and ``seq``), a foreign JSON object (source ``json``), a plain text line (source
``text``), a blank line, or garbage (a line that starts like JSON and does not parse; the last
line of a file without its newline is counted as truncated instead). Gzip files are read as
such. A ``[tag]:`` prefix before a JSON object (as launchers write for each rank) is dropped.

Memory is bounded by the number of (boot, rank) pairs: ``seq`` is tracked in a bitmap per pair
(one bit per receipt), so a gap or a duplicate is found whatever order the lines came in.
"""

from __future__ import annotations

import gzip
import re
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from engine.obs import schema

TEXT, JSON = "text", "json"  # the named text sources
SOURCES = (TEXT, JSON)
_RANK_PREFIX = re.compile(rb"\[[^\]\n]{0,64}\]:?\s*(?=\{)")
_BITMAP_LIMIT = 1 << 28  # seqs beyond this go to a set: a hostile seq cannot allocate gigabytes


class UnreadableLog(Exception):
    """A log that cannot be opened or decoded at all (sysexits 66)."""


@dataclass(slots=True)
class SeqTrack:
    """Which ``seq`` numbers one (boot, rank) wrote: a bitmap, so order does not matter."""

    bits: bytearray = field(default_factory=bytearray)
    overflow: set[int] = field(default_factory=set)
    distinct: int = 0
    duplicates: int = 0
    top: int = 0

    def add(self, seq: int) -> None:
        if seq < 1:
            self.duplicates += 1  # seq starts at 1: anything else is not a receipt we can place
            return
        self.top = max(self.top, seq)
        if seq >= _BITMAP_LIMIT:
            if seq in self.overflow:
                self.duplicates += 1
            else:
                self.overflow.add(seq)
                self.distinct += 1
            return
        byte, bit = divmod(seq, 8)
        if byte >= len(self.bits):
            self.bits.extend(bytes(max(byte + 1 - len(self.bits), len(self.bits))))
        if self.bits[byte] >> bit & 1:
            self.duplicates += 1
        else:
            self.bits[byte] |= 1 << bit
            self.distinct += 1

    @property
    def missing(self) -> int:
        return self.top - self.distinct

    def first_missing(self) -> int | None:
        if not self.missing:
            return None
        for i, b in enumerate(self.bits):
            full = 0xFE if i == 0 else 0xFF  # seq 0 is never written
            if b & full != full:
                return next(i * 8 + k for k in range(8) if (i or k) and not b >> k & 1)
        seq = max(1, len(self.bits) * 8)
        if seq < _BITMAP_LIMIT:
            return seq
        for v in sorted(self.overflow):
            if v != seq:
                return seq
            seq += 1
        return seq


@dataclass(slots=True)
class ReadStats:
    files: int = 0
    bytes: int = 0
    lines: int = 0
    receipts: int = 0
    text: int = 0
    foreign_json: int = 0
    blank: int = 0
    garbage: int = 0
    truncated: int = 0
    unknown_kind: int = 0
    malformed: int = 0  # known kind, required fields missing: seen (seq) but not evaluated
    kinds: Counter = field(default_factory=Counter)  # (rank, kind) -> count
    seqs: dict[tuple[str, int], SeqTrack] = field(default_factory=dict)
    examples: dict[str, str] = field(default_factory=dict)  # first garbage / malformed line
    # incomplete(), once the scan is over: every claim's gate asks it
    _settled: list = field(default_factory=list, repr=False, compare=False)

    def gaps(self) -> dict[tuple[str, int], int]:
        return {k: t.missing for k, t in self.seqs.items() if t.missing > 0}

    def duplicates(self) -> dict[tuple[str, int], int]:
        return {k: t.duplicates for k, t in self.seqs.items() if t.duplicates}

    @property
    def ranks(self) -> set[int]:
        return {rank for _, rank in self.seqs}

    def incomplete(self) -> tuple[str, str] | None:
        """Why the receipts may not be all the engine wrote: (reason code, sentence), or None."""
        if self._settled:
            return self._settled[0]
        return self._incomplete()

    def settle(self) -> None:
        """The scan is over: what incomplete() says can no longer change."""
        self._settled[:] = [self._incomplete()]

    def _incomplete(self) -> tuple[str, str] | None:
        gaps = self.gaps()
        if gaps:
            (boot, rank), n = next(iter(sorted(gaps.items())))
            first = self.seqs[(boot, rank)].first_missing()
            at = f" (first missing seq {first})" if first is not None else ""
            return "seq_gap", (
                f"{sum(gaps.values())} receipt(s) missing by seq; boot {boot} rank {rank} "
                f"lacks {n}{at}"
            )
        dups = self.duplicates()
        if dups:
            (boot, rank), n = next(iter(sorted(dups.items())))
            return "seq_duplicate", (
                f"{sum(dups.values())} receipt(s) seen twice by seq (boot {boot} rank {rank}: {n}); "
                "the same log read twice?"
            )
        if self.garbage or self.truncated:
            return "unparsed_lines", (
                f"{self.garbage} garbage and {self.truncated} truncated line(s) did not parse; "
                f"first: {self.examples.get('garbage', '')[:80]!r}"
            )
        if self.malformed:
            return "malformed_receipts", (
                f"{self.malformed} receipt(s) lack required fields; "
                f"first: {self.examples.get('malformed', '')[:80]!r}"
            )
        return None

    def as_dict(self) -> dict[str, Any]:
        return {
            "files": self.files,
            "bytes": self.bytes,
            "lines": self.lines,
            "receipts": self.receipts,
            "text": self.text,
            "foreign_json": self.foreign_json,
            "blank": self.blank,
            "garbage": self.garbage,
            "truncated": self.truncated,
            "unknown_kind": self.unknown_kind,
            "malformed": self.malformed,
            "ranks": sorted(self.ranks),
            "seq_gaps": {f"{b}/{r}": n for (b, r), n in sorted(self.gaps().items())},
            "seq_duplicates": {f"{b}/{r}": n for (b, r), n in sorted(self.duplicates().items())},
        }


OnReceipt = Callable[[dict[str, Any]], None]
OnText = Callable[[str, str, str], None]  # source, line, where ("file:line")


def _open(path: Path):
    try:
        fh = path.open("rb")
        magic = fh.read(2)
        fh.seek(0)
    except OSError as e:
        raise UnreadableLog(f"{path}: {e.strerror or e}") from e
    if magic == b"\x1f\x8b":
        return gzip.GzipFile(fileobj=fh, mode="rb")
    return fh


def _classify(raw: bytes, stats: ReadStats, last: bool) -> tuple[str, Any]:
    """('receipt', dict) | (source, text) | ('skip', None)."""
    line = raw.rstrip(b"\r\n")
    if not line.strip():
        stats.blank += 1
        return "skip", None
    body = line
    if body[:1] == b"[":
        m = _RANK_PREFIX.match(body)
        if m:
            body = body[m.end() :]
    if body[:1] == b"{":
        try:
            obj = orjson.loads(body)
        except orjson.JSONDecodeError:
            if last and not raw.endswith(b"\n"):
                stats.truncated += 1
            else:
                stats.garbage += 1
            stats.examples.setdefault("garbage", line[:200].decode("utf-8", "replace"))
            return "skip", None
        if (
            isinstance(obj, dict)
            and isinstance(obj.get("event"), str)
            and "v" in obj
            and isinstance(obj.get("boot"), str)
            and type(obj.get("rank")) is int
            and type(obj.get("seq")) is int
        ):
            return "receipt", obj
        stats.foreign_json += 1
        return JSON, line.decode("utf-8", "replace")
    stats.text += 1
    return TEXT, line.decode("utf-8", "replace")


def scan(
    paths: Iterable[str | Path],
    on_receipt: OnReceipt | None = None,
    on_text: OnText | None = None,
    stats: ReadStats | None = None,
) -> ReadStats:
    """Read every log once, in the order given; hand each valid receipt of a known kind to
    ``on_receipt`` and each text line to ``on_text``. Raises UnreadableLog for a file that
    cannot be opened or is not a readable gzip stream."""
    stats = stats or ReadStats()
    catalog = schema.CATALOG
    seqs = stats.seqs
    for p in paths:
        path = Path(p)
        if path.is_dir():
            raise UnreadableLog(f"{path}: is a directory")
        stats.files += 1
        lineno = 0
        with _open(path) as fh:
            it = iter(fh)
            try:
                nxt = next(it, None)
            except (OSError, EOFError) as e:
                raise UnreadableLog(f"{path}: {e}") from e
            while nxt is not None:
                raw = nxt
                try:
                    nxt = next(it, None)
                except (OSError, EOFError):  # a gzip stream cut short: what came is kept
                    nxt = None
                    stats.truncated += 1
                lineno += 1
                stats.lines += 1
                stats.bytes += len(raw)
                what, obj = _classify(raw, stats, nxt is None)
                if what == "receipt":
                    key = (obj["boot"], obj["rank"])
                    track = seqs.get(key)
                    if track is None:
                        track = seqs[key] = SeqTrack()
                    track.add(obj["seq"])
                    kind = catalog.get(obj["event"])
                    if kind is None:
                        stats.unknown_kind += 1
                        continue
                    if any(f not in obj for f in kind.fields):
                        stats.malformed += 1
                        stats.examples.setdefault("malformed", raw[:200].decode("utf-8", "replace"))
                        continue
                    stats.receipts += 1
                    stats.kinds[(obj["rank"], obj["event"])] += 1
                    if on_receipt is not None:
                        on_receipt(obj)
                elif what != "skip" and on_text is not None:
                    on_text(what, obj, f"{path.name}:{lineno}")
    stats.settle()
    return stats
