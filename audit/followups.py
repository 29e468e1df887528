"""``Followups``: the windows of the ``every`` claims, judged as the log is read.

A key's window opens at a ``when`` record (a later ``when`` of the same key, before the window
closed, opens it again from there), is followed by any ``then`` record after it, and closes at a
``closes`` record of the key (a request's ending, for request keys), at boot.stop or at one of the
claim's ``stops``. A window that closes is settled there and forgotten: followed, it counts under
the first ``then`` selector (in the spec's order) that followed it; not followed, it is a failure
with its key and seqs. So what is held grows with the windows open at once, not with the log. A
key used again after its window closed opens a new window (and counts again).

A log read in seq order (as each rank writes it) is judged as it is read. Where a record comes
before one already read on its (boot, rank) (rotated files given newest first), the logs are read
again on an exact bus (``rescan``), which holds every record the windows read and replays each
(boot, rank)'s in seq order once read: one set of rules either way.

Claims that read the same records by the same keys share one (``Bus.shared``): a request's
ending is handled once however many claims wait for it.

Where the compiled loop is built (``audit.native``), a record's receiver is the same rule compiled
(``audit/fastfollow.c``, ``tests/unit/test_audit_fastfollow.py`` reads records both ways); it
calls back here for a stop, a key that is not a str, a text line and a window that nothing
followed.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from typing import Any

from audit import native
from audit.foreign import TEXT_BOOT
from audit.model import ReceiptSel
from engine.observability import schema

KEPT = 50  # failed windows kept by name (the first by sort order), however many failed
WHEN, THEN, CLOSE, STOP = range(4)  # a record's roles, in the order one record plays them
Failure = tuple[str, str]  # (key named, what happened)


def keys_of(rec: dict[str, Any], field: str) -> list[Any]:
    """The keys a record names in ``field``: a scalar, or each element of a list (None, objects
    and nested lists name none)."""
    k = rec.get(field)
    if k is None or type(k) is dict:
        return []
    if type(k) is list:
        return [x for x in k if x is not None and not isinstance(x, list | dict)]
    return [k]


def first_then(mask: int) -> int:
    """The first `then` selector (in the spec's order) of those that followed a window."""
    return (mask & -mask).bit_length() - 1


class _Rank:
    """One (boot, rank): its open windows (key -> [when's seq, followed mask, line]) and the
    highest seq read, to tell a record that comes before what was read."""

    __slots__ = ("open", "seq", "stop")

    def __init__(self) -> None:
        self.open: dict[Any, list[Any]] = {}
        self.seq = 0
        self.stop = 0  # the highest stop seen: what a sentence names


Part = tuple[ReceiptSel, int, int, str]  # selector, role, its index among the role's, key field


class Followups:
    """Windows per (boot, rank) for one set of selectors and keys; the numbers ``decide`` asks."""

    def __init__(
        self,
        when: tuple[tuple[ReceiptSel, str], ...],  # (selector, its key field), by role
        then: tuple[tuple[ReceiptSel, str], ...],
        closes: tuple[tuple[ReceiptSel, str], ...],
        stops: tuple[ReceiptSel, ...],
        *,
        when_key: str,
        opened: str,
        ended: str,
        subscribe: Callable[[ReceiptSel, Callable[[dict[str, Any]], None]], None],
        exact: bool,
    ) -> None:
        self.when_key, self.opened, self.ended = when_key, opened, ended
        self.exact, self.disordered = exact, False
        self.ranks: dict[tuple[str, int], _Rank] = {}
        self._at: tuple[Any, Any, _Rank] = (None, None, _Rank())  # the last (boot, rank) read
        self.seen: dict[tuple[str, int], list[tuple[int, int, int, Any, str]]] = defaultdict(list)
        self.windows = 0  # settled windows
        self.by_then = [0] * len(then)  # settled windows, by the first `then` that followed
        self.failed: list[Failure] = []  # the first KEPT by sort order, and some more
        self.failures = 0
        ends = ((ReceiptSel(schema.BOOT_STOP), ""), *((s, "") for s in stops))
        parts: dict[Any, list[Part]] = {}  # by what a record is: one call a record plays them all
        for role, sels in ((WHEN, when), (THEN, then), (CLOSE, closes), (STOP, ends)):
            for i, (s, field) in enumerate(sels):
                kind = s.kind if s.event is None else s.event
                parts.setdefault(kind, []).append((s, role, i, field))
        for kind_parts in parts.values():
            subscribe(kind_parts[0][0], self._fn(tuple(kind_parts)))

    def _fn(self, parts: tuple[Part, ...]) -> Callable[[dict[str, Any]], None]:
        if self.exact:
            return lambda rec: self._keep(parts, rec)
        if (follower := native.fast_follower()) is not None:  # the same rule, compiled
            ready = tuple((s.matches if s.where else None, r, i, f, 1 << i) for s, r, i, f in parts)
            return follower(self, ready, self.ranks, self._part, self._settle, _Rank, TEXT_BOOT)

        def fn(rec: dict[str, Any]) -> None:  # the hot path: a scalar key, inline
            boot, rank, seq = rec["boot"], rec["rank"], rec["seq"]
            b, r, st = self._at
            if rank != r or boot != b:  # lines of one rank come in runs
                st = self.ranks.get((boot, rank))
                if st is None:
                    st = self.ranks[(boot, rank)] = _Rank()
                self._at = boot, rank, st
            if seq < st.seq:  # before what was read: only the exact way can order it
                self.disordered = True
                return
            st.seq = seq
            opened = st.open
            for s, role, i, field in parts:
                if s.where and not s.matches(rec):
                    continue
                k = rec.get(field)
                if role == STOP or type(k) is not str or boot == TEXT_BOOT:
                    self._part(rec, st, seq, role, i, field)
                elif role == WHEN:
                    opened[k] = [seq, 0, ""]
                elif (w := opened.get(k)) is not None and w[0] < seq:  # this window, later
                    if role == THEN:
                        w[1] |= 1 << i
                    else:  # CLOSE: a `then` in this record has already followed it
                        del opened[k]
                        self._settle((boot, rank), k, w, seq)

        return fn

    def _part(self, rec: dict[str, Any], st: _Rank, seq: int, role: int, i: int, f: str) -> None:
        """One part of a record the general way: a stop, a list of keys, a text event."""
        at = (rec["boot"], rec["rank"])
        if role == STOP:
            self._stop(at, st, seq)
            return
        line = rec.get("where", "?") if at[0] == TEXT_BOOT else ""
        for k in keys_of(rec, f):
            self._key(at, st, seq, role, i, k, line)

    def _keep(self, parts: tuple[Part, ...], rec: dict[str, Any]) -> None:
        """The exact way: each part a record plays, kept to be ordered once read."""
        at, seq = (rec["boot"], rec["rank"]), rec["seq"]
        line = rec.get("where", "?") if at[0] == TEXT_BOOT else ""
        seen = self.seen[at]
        for s, role, i, field in parts:
            if s.where and not s.matches(rec):
                continue
            for k in keys_of(rec, field) if role != STOP else [None]:
                seen.append((seq, role, i, k, line))

    def _key(
        self, at: tuple[str, int], st: _Rank, seq: int, role: int, i: int, k: Any, line: str
    ) -> None:
        """One record's part in the window of one key."""
        if role == WHEN:
            st.open[k] = [seq, 0, line]
            return
        w = st.open.get(k)
        if w is None or w[0] >= seq:  # no window open, or this record opened it
            return
        if role == THEN:
            w[1] |= 1 << i
        else:  # CLOSE: a `then` in the same record has already followed it
            del st.open[k]
            self._settle(at, k, w, seq)

    def _stop(self, at: tuple[str, int], st: _Rank, seq: int) -> None:
        """A stop: every window of its (boot, rank) opened before it closes."""
        st.stop = max(st.stop, seq)
        for key, w in list(st.open.items()):
            if w[0] < seq:
                del st.open[key]
                self._settle(at, key, w, None)

    def _settle(self, at: tuple[str, int], k: Any, w: list[Any], closed: int | None) -> None:
        """A window closed (at ``closed``, or at a stop where None): counted, and if nothing
        followed it, a failure."""
        self.windows += 1
        if w[1]:
            self.by_then[first_then(w[1])] += 1
            return
        self.failures += 1
        name, seen = self.named(at, k, w)
        if closed is not None:
            how = f" at seq {closed}" if at[0] != TEXT_BOOT else " later"
            what = f"{self.opened} at {seen}, its window closed{how}"
        elif at[0] == TEXT_BOOT:
            what = f"{self.opened} at {seen}, {self.ended} later"
        else:
            what = f"{self.opened} at {seen}, {self.ended} at seq {self.ranks[at].stop}"
        self.failed.append((name, what))
        if len(self.failed) > 4 * KEPT:  # sorted now and then: the first KEPT stay
            self.failed = sorted(self.failed)[:KEPT]

    def named(self, at: tuple[str, int], k: Any, w: list[Any]) -> tuple[str, str]:
        """A window's key and where it opened, for a sentence."""
        if at[0] == TEXT_BOOT:  # a text line is named by its place in the file
            return f"{self.when_key} {k!r}", w[2]
        return f"{k} (rank {at[1]})", f"seq {w[0]}"

    def summary(self) -> tuple[int, int, list[Failure], list[str], list[int]]:
        """(windows, failed, the failed kept, open keys named, windows by the first `then` that
        followed them), the settled ones and those open where the log ends (read the exact way
        first, where it was)."""
        if self.seen:
            self.replay()
        by_then, open_ = list(self.by_then), []
        for at, st in self.ranks.items():
            for k, w in st.open.items():
                if w[1]:  # followed, not closed yet
                    by_then[first_then(w[1])] += 1
                else:
                    open_.append(self.named(at, k, w)[0])
        return (
            self.windows + self.held(),
            self.failures,
            self.first_failures(),
            sorted(open_),
            by_then,
        )

    def replay(self) -> None:
        """Read the exact way: every record, each (boot, rank)'s in seq order (once)."""
        for at in sorted(self.seen):
            st = self.ranks[at] = _Rank()
            for seq, role, i, k, line in sorted(self.seen[at], key=lambda e: e[:3]):
                if role == STOP:
                    self._stop(at, st, seq)
                else:
                    self._key(at, st, seq, role, i, k, line)
        self.seen.clear()

    def held(self) -> int:
        """Windows open now: what the state holds per key."""
        return sum(len(st.open) for st in self.ranks.values())

    def first_failures(self) -> list[Failure]:
        """The failed windows kept (the first ``KEPT`` by sort order), in sort order."""
        return sorted(self.failed)[:KEPT]
