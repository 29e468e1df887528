"""How a scan of boot logs read: ``ReadStats`` (every line accounted for once) and, per (boot,
rank), a ``SeqTrack`` of the ``seq`` numbers it wrote.

Memory is bounded by the number of (boot, rank) pairs: ``seq`` is tracked in a bitmap per pair
(one bit per receipt), so a gap or a duplicate is found whatever order the lines came in.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from engine.observability import schema

BITMAP_LIMIT = 1 << 28  # seqs beyond this go to a set: a hostile seq cannot allocate gigabytes
# containers a receipt may nest, itself included: a deeper one is malformed (no engine writes
# one, and walking such a value, to hash, compare or show it, runs out of Python's recursion)
MAX_DEPTH = 256


@dataclass(slots=True)
class SeqTrack:
    """Which ``seq`` numbers one (boot, rank) wrote: a bitmap, so order does not matter. The
    reader's pass also keeps here what else it counts per pair: the top ``iter`` and the
    evaluated receipts of each kind (``counts`` in the file being read; at its end, into
    ``kinds`` and ``ReadStats.kinds``)."""

    bits: bytearray = field(default_factory=bytearray)
    overflow: set[int] = field(default_factory=set)
    distinct: int = 0
    duplicates: int = 0
    invalid: int = 0  # receipts with a seq the engine never writes (below 1, or not an int)
    top: int = 0
    top_iter: int = -1  # the highest ``iter`` of this pair's evaluated receipts (-1: none)
    # consecutive seqs [lo, hi] seen but not yet in the bitmap (hi 0: none): the reader extends
    # the run with one compare a line and writes it (add_run) where it breaks and at a file's end
    lo: int = 0
    hi: int = 0
    counts: list[int] = field(default_factory=lambda: [0] * len(schema.CATALOG))  # per kind
    kinds: Counter = field(default_factory=Counter)  # kind -> evaluated receipts, files read

    def add(self, seq: int) -> None:
        if seq < 1:
            self.invalid += 1  # seq starts at 1: anything else is not a receipt we can place
            return
        self.top = max(self.top, seq)
        if seq >= BITMAP_LIMIT:
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

    def add_run(self, lo: int, hi: int) -> None:
        """``add`` each of lo..hi (1 <= lo <= hi < BITMAP_LIMIT) in order, at once."""
        self.top = max(self.top, hi)
        first, last = lo >> 3, hi >> 3
        size = len(self.bits)
        if last >= size:  # grow exactly as ``add`` would, seq by seq
            new = max(first + 1, 2 * size) if first >= size else size
            while last >= new:
                new *= 2
            self.bits.extend(bytes(new - size))
        mask = ((1 << (hi - lo + 1)) - 1) << (lo & 7)
        old = int.from_bytes(self.bits[first : last + 1], "little")
        dup = (old & mask).bit_count()
        self.bits[first : last + 1] = (old | mask).to_bytes(last - first + 1, "little")
        self.duplicates += dup
        self.distinct += hi - lo + 1 - dup

    def flush(self) -> None:
        if self.hi:
            self.add_run(self.lo, self.hi)
            self.lo = self.hi = 0

    def state(self) -> tuple[int, int, int, list[int]]:
        return self.lo, self.hi, self.top_iter, self.counts

    def restart(self, lo: int, hi: int, seq: int) -> tuple[int, int]:
        """``seq`` does not extend the run [lo, hi]: write the run, start one at ``seq``."""
        if hi:
            self.add_run(lo, hi)
        if 0 < seq < BITMAP_LIMIT:
            return seq, seq
        self.add(seq)
        return 0, 0

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
        if seq < BITMAP_LIMIT:
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
    malformed: int = 0  # known kind, a required field missing or nested past MAX_DEPTH: seen
    deep: int = 0  # (seq) but not evaluated; ``deep``: those nested past MAX_DEPTH
    seq_invalid: int = 0  # receipts whose seq is not an int: counted, not evaluated
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
        bad = {k: t.invalid for k, t in self.seqs.items() if t.invalid}
        if bad:  # before the gaps: a receipt whose seq cannot be placed leaves one
            (boot, rank), n = min(bad.items())
            example = self.examples.get("seq_invalid")
            return "seq_invalid", (
                f"{sum(bad.values())} receipt(s) carry a seq the engine never writes (below 1, or "
                f"not an integer; boot {boot} rank {rank}: {n})"
                + (f"; one not an integer: {example[:80]!r}" if example else "")
            )
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
            what = "lack required fields"
            if self.deep:  # receipts nested past MAX_DEPTH are malformed too
                deep = f"nest a value deeper than {MAX_DEPTH} levels"
                what = deep if self.deep == self.malformed else f"{what} or {deep}"
            return "malformed_receipts", (
                f"{self.malformed} receipt(s) {what}; "
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
            "seq_invalid": self.seq_invalid,
            "ranks": sorted(self.ranks),
            "seq_gaps": {f"{b}/{r}": n for (b, r), n in sorted(self.gaps().items())},
            "seq_duplicates": {f"{b}/{r}": n for (b, r), n in sorted(self.duplicates().items())},
        }
