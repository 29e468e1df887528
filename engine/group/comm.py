"""The collectives a group of ranks takes, over ``torch.distributed``.

``Comm`` is one rank alone: every collective is the identity, so the model and the scheduler
call the same methods with one rank or many. ``TorchComm`` is a real group: gloo on the CPU,
NCCL for tensors on CUDA. It holds three process groups, because the waits differ:

* ``work``: the model's all-reduces and all-gathers (the default group; NCCL on CUDA);
* ``sched``: the scheduler's small integer collectives (the published floor, the digest check),
  gloo on the host, with the group timeout: a rank that died or stopped answering makes the
  others raise within it instead of hanging;
* ``intake``: rank 0's broadcast of what arrived (requests, aborts, stop) at the top of each
  iteration. A group may idle for as long as nobody sends work, so this wait has no short
  timeout; a rank that dies closes its sockets, which ends the wait at once.
"""

from __future__ import annotations

import os
from datetime import timedelta
from typing import TYPE_CHECKING, Any

import torch

from engine.group.pipeline import Stage, TorchStage

if TYPE_CHECKING:  # torch.distributed is imported when a group is made, not before
    from torch.distributed import ProcessGroup

# how long a follower waits for the next iteration's intake: an engine may idle for days
IDLE_WAIT = timedelta(days=365)


class GroupFailure(RuntimeError):
    """A collective failed: a rank died, stopped answering within the timeout, or split."""

    stop = "rank_lost"  # the boot.stop reason it ends the boot with


class Comm:
    """One rank alone: every collective returns its input."""

    rank = 0
    world = 1

    def all_reduce_sum(self, t: torch.Tensor) -> torch.Tensor:
        """``t`` summed over the ranks; returns the sum (``t`` itself when it is contiguous)."""
        return t

    def all_gather(self, t: torch.Tensor, dim: int = -1) -> torch.Tensor:
        """Each rank's ``t`` concatenated along ``dim``, in rank order."""
        return t

    def min_ints(self, values: list[int]) -> list[int]:
        """Element-wise MIN of a list of integers over the ranks."""
        return list(values)

    def gather_ints(self, values: list[int]) -> list[list[int]]:
        """Every rank's list of integers (all the same length), in rank order."""
        return [list(values)]

    def broadcast(self, obj: Any) -> Any:
        """Rank 0's ``obj`` on every rank (the others pass None)."""
        return obj

    def close(self) -> None:
        """Leave the group (idempotent)."""

    def layout(self, tp: int) -> tuple[Comm, Stage]:
        """This rank's place in a group of ``tp``-rank stages: the comm of its stage's shards
        (the model's collectives) and its pipeline stage."""
        return self, Stage()


class TorchComm(Comm):
    """A member of a ``torch.distributed`` group. ``init_method``: ``tcp://HOST:PORT`` (rank 0
    hosts the rendezvous store there) or ``env://`` (MASTER_ADDR, MASTER_PORT, WORLD_SIZE,
    RANK as torchrun sets them)."""

    def __init__(
        self, rank: int, world: int, init_method: str, timeout_s: float, device: str = "cpu"
    ) -> None:
        import torch.distributed as dist

        self.dist = dist
        self.rank, self.world = rank, world
        self.device = torch.device(device)
        backend = "nccl" if self.device.type == "cuda" else "gloo"
        timeout = timedelta(seconds=timeout_s)
        dist.init_process_group(
            backend, init_method=init_method, rank=rank, world_size=world, timeout=timeout
        )
        self.work = None  # the default group
        self.sched = dist.new_group(backend="gloo", timeout=timeout)
        # rank 0 only sends on the intake: its send waits no longer than any collective for a
        # rank that stopped answering (gloo can miss a pair closed between two operations and
        # leave the next one waiting); the others idle on it until the next iteration's comes
        self.intake = dist.new_group(backend="gloo", timeout=timeout if rank == 0 else IDLE_WAIT)
        self._layouts: dict[int, tuple[Comm, Stage]] = {}  # by tp: a stage's shards, the stage
        self._closed = False

    def _call(self, what: str, fn: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except RuntimeError as e:  # gloo says a peer closed or a wait timed out
            raise GroupFailure(f"{what} failed on rank {self.rank}: {e}") from e

    def all_reduce_sum(self, t: torch.Tensor) -> torch.Tensor:
        return _all_reduce_sum(self, self.work, t)

    def all_gather(self, t: torch.Tensor, dim: int = -1) -> torch.Tensor:
        return _all_gather(self, self.work, self.world, t, dim)

    def min_ints(self, values: list[int]) -> list[int]:
        t = torch.tensor(values, dtype=torch.int64)
        self._call(
            "floor all_reduce",
            self.dist.all_reduce,
            t,
            op=self.dist.ReduceOp.MIN,
            group=self.sched,
        )
        return [int(v) for v in t]

    def gather_ints(self, values: list[int]) -> list[list[int]]:
        t = torch.tensor(values, dtype=torch.int64)
        parts = [torch.empty_like(t) for _ in range(self.world)]
        self._call("digest all_gather", self.dist.all_gather, parts, t, group=self.sched)
        return [[int(v) for v in p] for p in parts]

    def broadcast(self, obj: Any) -> Any:
        box = [obj]
        self._call(
            "intake broadcast", self.dist.broadcast_object_list, box, src=0, group=self.intake
        )
        return box[0]

    def layout(self, tp: int) -> tuple[Comm, Stage]:
        if self.world % tp:
            raise ValueError(f"a group of {self.world} ranks is not stages of tp {tp}")
        pp = self.world // tp
        if pp == 1:
            return self, Stage()
        if tp not in self._layouts:  # a layout taken before keeps its groups
            # every rank makes every stage's group, in the same order (torch.distributed's rule)
            groups = [
                self.dist.new_group(ranks=list(range(s * tp, (s + 1) * tp))) for s in range(pp)
            ]
            shard: Comm = Comm() if tp == 1 else _Shard(self, groups[self.rank // tp], tp)
            stage = TorchStage(self.dist, self.rank, tp, pp, self.device, self._call)
            self._layouts[tp] = (shard, stage)
        return self._layouts[tp]

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            self.dist.destroy_process_group()
        except Exception:  # a group whose peer is gone cannot be torn down politely
            pass


class _Shard(Comm):
    """The ``tp`` ranks of one pipeline stage: the model's collectives stay within it."""

    def __init__(self, parent: TorchComm, group: ProcessGroup, tp: int) -> None:
        self.parent, self.group = parent, group
        self.rank, self.world = parent.rank % tp, tp

    def all_reduce_sum(self, t: torch.Tensor) -> torch.Tensor:
        return _all_reduce_sum(self.parent, self.group, t)

    def all_gather(self, t: torch.Tensor, dim: int = -1) -> torch.Tensor:
        return _all_gather(self.parent, self.group, self.world, t, dim)


def _all_reduce_sum(comm: TorchComm, group: ProcessGroup | None, t: torch.Tensor) -> torch.Tensor:
    # gloo reduces the storage from the first element on: a view that skips elements (one row
    # of a padded product) would be summed wrong, silently
    t = t.contiguous()
    comm._call("all_reduce", comm.dist.all_reduce, t, group=group)
    return t


def _all_gather(
    comm: TorchComm, group: ProcessGroup | None, world: int, t: torch.Tensor, dim: int
) -> torch.Tensor:
    t = t.contiguous()
    parts = [torch.empty_like(t) for _ in range(world)]
    comm._call("all_gather", comm.dist.all_gather, parts, t, group=group)
    return torch.cat(parts, dim=dim)


def local_init_method(port: int) -> str:
    """The rendezvous of a group whose ranks all run on this machine (loopback only)."""
    # gloo picks its interface from the host name, which may not resolve to loopback here
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    return f"tcp://127.0.0.1:{port}"
