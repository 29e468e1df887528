"""GroupView: what the ranks of a group agreed on this iteration.

Decisions that must agree across ranks read the *published floor* (the MIN over ranks of
available + evictable tokens, reduced once per iteration before any branch), never one rank's
own pool alone. "No floor was published" (None) and "the floor is zero" (0) are different
states: the first leaves the local budget untouched, the second binds.

With more than one rank (``PublishedGroup``) one all-reduce (MIN) per iteration publishes each
memory term a decision reads: available, evictable and staged tokens, and their sum the floor.
What this rank holds above the MIN is its *surplus*; for the rest of the iteration the
scheduler reads its own numbers less that surplus (``memory.Memory``'s numbers). Every rank
runs the same
decisions on the same inputs, so the changes a step makes (an eviction, a retraction, a chunk)
are the same on every rank and the agreed numbers stay equal after them; a rank whose larger
pool would have admitted more does not. The allocation-site net stays rank-local: where the
agreed numbers fund an allocation, the smallest rank's own pool funds it.

Each iteration that scheduled work, every rank writes the digest of the batch it is about to
run (the ``iteration`` receipt's ``digest``); every ``group_check_interval`` iterations (every
one in check mode) the ranks compare digests with an all-gather before the forward. A mismatch
is ``invariant.violation`` ``group_split`` on every rank, and the group stops (``GroupSplit``)
rather than running different batches into a collective that would hang.
"""

from __future__ import annotations

from dataclasses import dataclass

from engine.group.comm import Comm, GroupFailure
from engine.observability import schema
from engine.observability.receipts import Receipts
from engine.request.messages import AbortRequest, AddRequest


@dataclass(slots=True, frozen=True)
class Line:
    """Rank 0 closed (``closed``) or opened its line to new admissions for a cutover's drain:
    every rank does the same at the same boundary."""

    closed: bool


@dataclass(slots=True, frozen=True)
class Relayout:
    """A layout cutover's change (cutover ``id``): at this boundary every rank of the group
    becomes part of ``tp`` x ``pp`` (``EngineCore.relayout``)."""

    id: str
    tp: int
    pp: int


Op = AddRequest | AbortRequest | Line | Relayout  # what rank 0 hands the others, in order


class GroupSplit(GroupFailure):
    """The ranks were about to run different batches."""

    stop = "group_split"


@dataclass(slots=True, frozen=True)
class Terms:
    """The memory numbers a decision reads: tokens available, evictable and staged."""

    available: int
    evictable: int
    staged: int

    def __sub__(self, other: Terms) -> Terms:
        return Terms(
            self.available - other.available,
            self.evictable - other.evictable,
            self.staged - other.staged,
        )


NONE = Terms(0, 0, 0)


class GroupView:
    """One rank alone: it publishes no floor, so the local budget decides."""

    world = 1
    rank = 0
    surplus = NONE

    def publish(self, local: Terms, receipts: Receipts) -> int | None:
        """Once per iteration, before any branch: publish this rank's terms, return the floor
        (a floor set from outside is written down each iteration it is read)."""
        floor = self.published_floor()
        if floor is not None:
            receipts.emit(schema.GROUP_FLOOR, floor=floor, local=local.available + local.evictable)
        return floor

    def published_floor(self) -> int | None:
        """The floor every rank decides from this iteration, or None when none was published."""
        return None

    def floor_now(self, agreed: Terms) -> int | None:
        """The floor after what this iteration's own decisions freed or took (``agreed``: the
        agreed terms now). A published floor moves with them; a fixed one does not."""
        return self.published_floor()

    def capacity(self, local: int) -> int:
        """The pool size the group can count on: the smallest rank's."""
        return local

    def record(self, op: Op) -> None:
        """An input rank 0 took between iterations (a request, an abort); one rank keeps none."""

    def sync(self, stop: str | None = None) -> None:
        """At the top of an iteration: hand the others what arrived (rank 0 of a group); with
        ``stop``, hand them that too and tell them to stop instead of stepping."""

    def announce(self, op: Op) -> None:
        """Between iterations (rank 0 of a group): hand the others what arrived and ``op`` now,
        without a step, so every rank applies ``op`` at this boundary."""

    def agree(self, iteration: int, digest: str) -> None:
        """Before the forward: the ranks compare the batch each is about to run."""


class PublishedGroup(GroupView):
    """A rank of a group of ``comm.world``: the floor is all-reduced, the digests compared.

    ``reads_floor`` False keeps the surplus at zero: every decision reads this rank's own pool
    (the test switch that proves a split is caught). ``check_every``: digests are compared
    every that many iterations."""

    def __init__(
        self,
        comm: Comm,
        receipts: Receipts,
        capacity: int,
        check_every: int,
        reads_floor: bool = True,
    ) -> None:
        self.comm = comm
        self.world, self.rank = comm.world, comm.rank
        self.receipts = receipts
        self.check_every = check_every
        self.reads_floor = reads_floor
        self.ops: list[Op] = []  # rank 0: inputs since the last iteration
        self.floor: int | None = None
        self._capacity = comm.min_ints([capacity])[0]  # once, at boot

    def capacity(self, local: int) -> int:
        return self._capacity

    def publish(self, local: Terms, receipts: Receipts) -> int | None:
        mins = self.comm.min_ints(
            [local.available, local.evictable, local.staged, local.available + local.evictable]
        )
        agreed = Terms(*mins[:3])
        self.surplus = (local - agreed) if self.reads_floor else NONE
        self.floor = mins[3]
        mine = local.available + local.evictable
        if self.floor < mine:  # it binds: this rank alone would have counted more
            self.receipts.emit(
                schema.GROUP_FLOOR,
                floor=self.floor,
                local=mine,
                available=agreed.available,
                evictable=agreed.evictable,
                staged=agreed.staged,
            )
        return self.floor

    def published_floor(self) -> int | None:
        return self.floor

    def floor_now(self, agreed: Terms) -> int | None:
        if self.floor is None or not self.reads_floor:
            return None
        return agreed.available + agreed.evictable

    def record(self, op: Op) -> None:
        if self.rank == 0:
            self.ops.append(op)

    def sync(self, stop: str | None = None) -> None:
        if self.rank == 0:
            ops, self.ops = self.ops, []
            self.comm.broadcast(Intake(ops=ops, step=stop is None, stop=stop))

    def announce(self, op: Op) -> None:
        if self.rank == 0:
            ops, self.ops = [*self.ops, op], []
            self.comm.broadcast(Intake(ops=ops, step=False))

    def agree(self, iteration: int, digest: str) -> None:
        if iteration % self.check_every:
            return
        whole = int(digest, 16)  # 64 bits, sent as two halves (an int64 holds each)
        halves = self.comm.gather_ints([whole >> 32, whole & 0xFFFFFFFF])
        if len({tuple(h) for h in halves}) > 1:
            shown = [format(hi << 32 | lo, "016x") for hi, lo in halves]
            self.receipts.violation(
                "group_split",
                iteration=iteration,
                digests=shown,
                rank=self.rank,
                message=f"the ranks were about to run different batches at iteration {iteration}",
            )
            raise GroupSplit(f"group split at iteration {iteration}: batch digests by rank {shown}")


@dataclass(slots=True, frozen=True)
class Intake:
    """What rank 0 broadcasts at the top of an iteration: the inputs it took since the last
    one, in order (the frontend's own messages: ``AddRequest``, ``AbortRequest``; a drain's
    ``Line``), then whether to step, or why the group stops (``stop``). Between iterations it
    broadcasts a ``Relayout`` the same way, without a step."""

    ops: list[Op]
    step: bool = False
    stop: str | None = None
