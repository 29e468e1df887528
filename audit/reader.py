"""One streaming pass over boot logs: JSON receipts and plain text lines, mixed.

Every line is one of: a receipt of this schema (a JSON object with ``event``, ``v``, ``boot``,
``rank`` and ``seq``), a foreign JSON object (source ``json``), a plain text line (source
``text``), a blank line, or garbage (a line that starts like JSON and does not parse; the last
line of a file without its newline is counted as truncated instead). Gzip files are read as
such. A ``[tag]:`` prefix before a JSON object (as launchers write for each rank) is dropped.
A JSON object with a string ``log`` field is a log shipper's record of one line (docker's
json-file driver, Fluent Bit, Fluentd): that line is read in its place, as whatever it is.

The pass is the auditor's hot path (a gigabyte is four million lines): files are read a block at
a time and split in C; a line that starts with ``{`` and parses into a receipt is handled inline
(its seq extends a run, its kind is counted, its kind's receivers get it: ``routes``, one lookup
a line); any other line goes through ``_classify``, the one place that decides what a line is.
A receipt that nests containers deeper than ``MAX_DEPTH`` is malformed, as one without its
kind's required fields is: its seq is tracked, its fields are not read. How the lines read is
counted in ``audit.readstats``.
"""

from __future__ import annotations

import re
import zlib
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import orjson

from audit import native
from audit.readstats import BITMAP_LIMIT, MAX_DEPTH, ReadStats, SeqTrack
from audit.streams import UnreadableLog, display_name, open_log
from engine.observability import schema

TEXT, JSON = "text", "json"  # the named text sources
SOURCES = (TEXT, JSON)
_RANK_PREFIX = re.compile(rb"\[[^\]\n]{0,64}\]:?\s*(?=\{)")
_BLOCK = 1 << 20  # bytes read at a time: lines are split in C, a block at a time


OnReceipt = Callable[[dict[str, Any]], None]
OnText = Callable[[str, str, str], None]  # source, line, where ("file:line")
Routes = Mapping[str, Sequence[OnReceipt]]  # kind -> who gets its receipts, in order


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
            elif body is not line:  # a logger's "[head] " before a dict's repr: a text line
                stats.text += 1
                return TEXT, line.decode("utf-8", "replace")
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
        ):
            if type(obj.get("seq")) is int:
                return "receipt", obj
            stats.seq_invalid += 1  # a receipt, but its seq cannot be placed: not evaluated
            stats.seqs.setdefault((obj["boot"], obj["rank"]), SeqTrack()).invalid += 1
            stats.examples.setdefault("seq_invalid", line[:200].decode("utf-8", "replace"))
            return "skip", None
        if isinstance(obj, dict) and isinstance(obj.get("log"), str):
            # a log shipper's record of one line the process wrote (docker's json-file driver,
            # Fluent Bit, Fluentd: {"log": "<line>\n", "stream": ..., "time": ...}): the line
            return _classify(obj["log"].encode("utf-8", "surrogatepass"), stats, False)
        stats.foreign_json += 1
        return JSON, line.decode("utf-8", "replace")
    stats.text += 1
    return TEXT, line.decode("utf-8", "replace")


_DEEP_LINE = 2 * MAX_DEPTH  # a shorter line cannot hold the brackets of a deeper receipt
_STUCK = 8  # lines in a row the compiled loop did not take before the rest go the Python way


def _too_deep(line: bytes, obj: dict[str, Any]) -> bool:
    """Whether containers nest deeper than MAX_DEPTH in ``obj`` (``line``, its text: a line with
    fewer openers cannot), walked without recursion."""
    if line.count(b"[") + line.count(b"{") <= MAX_DEPTH:
        return False
    stack: list[tuple[Any, int]] = [(obj, 1)]
    while stack:
        v, depth = stack.pop()
        if depth > MAX_DEPTH:
            return True
        for x in v.values() if type(v) is dict else v:
            if type(x) is dict or type(x) is list:
                stack.append((x, depth + 1))
    return False


def _blocks(fh: Any, path: Path, upto: int | None) -> Iterator[tuple[list[bytes], int, bool]]:
    """A file's lines (its first ``upto`` bytes, where given), a block at a time, without their
    newlines: (lines, their bytes, cut); ``cut`` marks the last block, of one line that had no
    newline. A read error before the first line is UnreadableLog; after it (a gzip stream cut
    short) ``([], 0, True)`` ends the file and the partial line before the error is dropped, as
    reading line by line drops it."""
    head: list[bytes] = []  # the start of a line whose newline has not come yet, in pieces
    held, seen, left = 0, False, upto
    while left is None or left > 0:
        try:
            data = fh.read1(_BLOCK if left is None else min(_BLOCK, left))
        except (OSError, EOFError, zlib.error) as e:  # zlib's errors are not OSErrors
            if not seen:
                raise UnreadableLog(f"{path}: {e}") from e
            yield [], 0, True
            return
        if not data:
            break
        if left is not None:
            left -= len(data)
        lines = data.split(b"\n")
        tail = lines.pop()
        if lines:
            if head:
                lines[0] = b"".join((*head, lines[0]))
            seen = True
            yield lines, held + len(data) - len(tail), False
            head, held = [], 0
        if tail:
            head.append(tail)
            held += len(tail)
    if head:
        line = b"".join(head)
        yield [line], len(line), True


# a kind's required fields, who gets its receipts, its index in _KINDS (and SeqTrack.counts)
Route = tuple[frozenset[str], tuple[OnReceipt, ...], int]
_KINDS = tuple(schema.CATALOG)


class _Pass:
    """One scan's state. ``block`` is the loop every line goes through: a line that parses into a
    receipt of a known kind is handled inline; any other line takes ``other`` (which hands back
    the receipts among them: of a kind the catalog lacks, behind a rank prefix). The (boot,
    rank) of the last receipt, its run of seqs, top iter and counts stay in locals."""

    def __init__(
        self,
        stats: ReadStats,
        routes: dict[str, Route],
        on_text: OnText | None,
        skip: Iterable[str] = (),
    ):
        self.stats, self.routes, self.on_text = stats, routes, on_text
        self.at: tuple = (None, None, None, 0, 0, -1, [])  # track, boot, rank, lo, hi, iter, counts
        self.fast = native.fast_run()  # the common case compiled, where it was built
        self.fast_routes = {k: (tuple(sorted(r[0])), r[1], r[2]) for k, r in routes.items()}
        self.skip = tuple(b',"event":"' + k.encode() + b'"}' for k in sorted(skip))

    def block(self, lines: list[bytes], lineno: int, name: str, cut: bool) -> None:
        """The lines of a block: runs of plain receipts of one (boot, rank) in sequence in the
        compiled loop (``audit.native``), each line it stops at in ``_block``; where it takes
        none of several lines in a row (a text log, ranks interleaved), the rest in ``_block``."""
        fast = self.fast
        if fast is None:
            return self._block(lines, lineno, name, cut)
        i, n, stuck, routes, loads = 0, len(lines), 0, self.fast_routes, orjson.loads
        while i < n:
            track, boot0, rank0, lo, hi, top_it, counts = self.at
            if track is not None:
                j, hi, top_it = fast(
                    lines,
                    i,
                    routes,
                    boot0,
                    rank0,
                    hi,
                    top_it,
                    counts,
                    loads,
                    BITMAP_LIMIT,
                    _DEEP_LINE,
                    MAX_DEPTH,
                    self.skip,
                    not self.skip,
                )
                self.at = (track, boot0, rank0, lo, hi, top_it, counts)
                track.lo, track.hi, track.top_iter = lo, hi, top_it
                if j == n:
                    return
                stuck = stuck + 1 if j == i else 0
                i = j
            if stuck > _STUCK:
                return self._block(lines[i:], lineno + i, name, cut)
            self._block(lines[i : i + 1], lineno + i, name, cut)
            i += 1

    def _block(self, lines: list[bytes], lineno: int, name: str, cut: bool) -> None:
        routes, loads, bad = self.routes, orjson.loads, orjson.JSONDecodeError
        limit, deep = BITMAP_LIMIT, _DEEP_LINE
        track, boot0, rank0, lo, hi, top_it, counts = self.at
        for lineno, line in enumerate(lines, lineno + 1):  # noqa: B020 (the count goes on)
            obj = route = None
            if line[:1] == b"{":
                try:
                    obj = loads(line)
                    route = routes[obj["event"]]
                    boot, rank, seq = obj["boot"], obj["rank"], obj["seq"]
                except (bad, KeyError, TypeError):  # not JSON, no envelope, an unknown kind
                    route = None
            if (
                route is None
                or type(boot) is not str
                or type(rank) is not int
                or type(seq) is not int
                or "v" not in obj
            ):  # not a plain receipt of a known kind: the other lines' way, out of line
                obj = self.other(line, cut, f"{name}:{lineno}")
                if obj is None:
                    continue
                boot, rank, seq = obj["boot"], obj["rank"], obj["seq"]
                route = routes.get(obj["event"])
            if boot != boot0 or rank != rank0:
                if track is not None:
                    track.lo, track.hi, track.top_iter = lo, hi, top_it
                track = self.track(boot, rank)
                boot0, rank0, (lo, hi, top_it, counts) = boot, rank, track.state()
            if seq == hi + 1 and hi and seq < limit:
                hi = seq
            else:
                lo, hi = track.restart(lo, hi, seq)
            if route is not None and len(line) > deep and _too_deep(line, obj):
                self.stats.deep += 1  # not read: whatever else it lacks, this is why
                self.unfit(route, line, cut)
                continue
            if route is None or not obj.keys() >= route[0]:
                self.unfit(route, line, cut)
                continue
            counts[route[2]] += 1
            it = obj.get("iter")
            if type(it) is int and it > top_it:
                top_it = it
            for fn in route[1]:
                fn(obj)
        if track is not None:
            track.lo, track.hi, track.top_iter = lo, hi, top_it
        self.at = (track, boot0, rank0, lo, hi, top_it, counts)

    def track(self, boot: str, rank: int) -> SeqTrack:
        track = self.stats.seqs.get((boot, rank))
        if track is None:
            track = self.stats.seqs[(boot, rank)] = SeqTrack()
        return track

    def other(self, line: bytes, cut: bool, where: str) -> dict[str, Any] | None:
        """Any line but a plain receipt of a known kind: a receipt (of a kind the catalog lacks,
        or behind a rank prefix) comes back; any other line is counted, its text handed on."""
        what, obj = _classify(line if cut else line + b"\n", self.stats, cut)
        if what == "receipt":
            return obj
        if what != "skip" and self.on_text is not None:
            self.on_text(what, obj, where)
        return None

    def unfit(self, route: Route | None, line: bytes, cut: bool) -> None:
        """A receipt of a kind the catalog lacks, or without its kind's required fields."""
        if route is None:
            self.stats.unknown_kind += 1
            return
        self.stats.malformed += 1
        raw = line if cut else line + b"\n"
        self.stats.examples.setdefault("malformed", raw[:200].decode("utf-8", "replace"))

    def end_file(self) -> None:
        """Each (boot, rank)'s run into its bitmap, its counts into its kinds and stats.kinds."""
        stats = self.stats
        for (_, rank), t in stats.seqs.items():
            t.flush()
            for kind, n in zip(_KINDS, t.counts):
                if n:
                    t.kinds[kind] += n
                    stats.kinds[(rank, kind)] += n
                    stats.receipts += n
            t.counts[:] = [0] * len(_KINDS)
        self.at = (None, None, None, 0, 0, -1, [])


def _routes(on_receipt: OnReceipt | None, routes: Routes | None) -> dict[str, Route]:
    """For every kind of the catalog: its required fields, who gets its receipts, its index."""
    if routes is None:
        routes = {} if on_receipt is None else dict.fromkeys(_KINDS, (on_receipt,))
    return {
        name: (frozenset(schema.CATALOG[name].fields), tuple(routes.get(name, ())), i)
        for i, name in enumerate(_KINDS)
    }


def scan(
    paths: Iterable[str | Path],
    on_receipt: OnReceipt | None = None,
    on_text: OnText | None = None,
    stats: ReadStats | None = None,
    *,
    routes: Routes | None = None,
    upto: Sequence[int] | None = None,
    sizes: list[int] | None = None,
    skip: Iterable[str] = (),
) -> ReadStats:
    """Read every log once, in the order given; hand each valid receipt of a known kind to
    ``on_receipt`` (or, with ``routes``, to each callable its kind lists, in order) and each text
    line to ``on_text``. With ``upto``, the i-th log is read no further than its i-th number of
    bytes (a growing log read again as far as before); ``sizes`` gets the bytes read of each.
    ``skip`` names kinds whose receipts no one here wants and whose reading numbers are kept by
    another reading of the same logs: the compiled loop passes over their lines unparsed, and
    the numbers this reading returns are not the logs' (counts and seqs go unkept). Raises
    UnreadableLog for a file that cannot be opened or is not a readable gzip stream."""
    stats = stats or ReadStats()
    run = _Pass(stats, _routes(on_receipt, routes), on_text, skip)
    for i, p in enumerate(paths):
        path = Path(p)
        if path.is_dir():
            raise UnreadableLog(f"{path}: is a directory")
        stats.files += 1
        lineno, before = 0, stats.bytes
        with open_log(path) as fh:
            try:
                for lines, size, cut in _blocks(fh, path, None if upto is None else upto[i]):
                    if not lines:  # a gzip stream cut short: what came is kept
                        stats.truncated += 1
                        continue
                    stats.lines += len(lines)
                    stats.bytes += size
                    run.block(lines, lineno, display_name(path), cut)
                    lineno += len(lines)
            finally:
                run.end_file()
        if sizes is not None:
            sizes.append(stats.bytes - before)
    stats.settle()
    return stats


def head_receipts(path: str | Path, size: int) -> list[dict[str, Any]]:
    """The receipts of a known kind among the whole lines of a log's first ``size`` bytes, as
    ``scan`` hands them on (nothing where the log cannot be read)."""
    got: list[dict[str, Any]] = []
    try:
        with open_log(Path(path)) as fh:
            lines = fh.read(size).split(b"\n")[:-1]
    except (OSError, EOFError, zlib.error, UnreadableLog):
        return got
    run = _Pass(ReadStats(), _routes(got.append, None), None)
    run.block(lines, 0, Path(path).name, False)
    return got
