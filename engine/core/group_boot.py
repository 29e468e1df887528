"""The ranks of a group (``--tp N``, ``--pp M``: N x M ranks): how they start, and how ranks
above 0 follow rank 0.

Rank 0 is the engine callers talk to (``LLM``, the scheduler process of ``engine serve``). It
takes requests and aborts and, at the top of each iteration, broadcasts what it took
(``group.Intake``); every other rank applies the same inputs in the same order and steps the
same scheduler, each over its own part of the weights (a shard of a stage's layers) and its own
KV pool. Decisions read the
published floor (``engine/scheduler/group.py``), so the ranks run the same batches.

Starting: ``dist_init="spawn"`` (the default) makes rank 0 start ranks 1..N-1 on this machine
as child processes that die with it (``python -m engine.core.group_boot``), meeting on a loopback port;
``"env"`` joins a group whose ranks were started on their own, one per node or by torchrun,
with MASTER_ADDR, MASTER_PORT, WORLD_SIZE and RANK (``engine worker`` starts a rank above 0).
Each rank writes its own boot log (``EngineConfig.log_file_of``) under rank 0's boot id.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import traceback
from dataclasses import dataclass, field
from typing import Any

from engine.config import EngineConfig
from engine.core.engine_core import EngineCore
from engine.group.comm import GroupFailure, TorchComm, local_init_method
from engine.group.spawn import dies_with_parent, free_port
from engine.model.loader import LoadedModel
from engine.observability.death import write_boot_failed
from engine.observability.stacks import dump_stacks_on_signal
from engine.observability.tracing import Tracing
from engine.request.messages import AddRequest, Launch
from engine.scheduler.group import GroupSplit, Intake, Line, Op, Relayout

JOIN_GRACE_S = 10.0  # how long rank 0 waits for the others to stop before killing them
EXIT_FAILED = 1  # a rank above 0 whose part of the engine failed, at boot or later
# why a rank stopped while it built its part: SIGTERM (``_interrupt``), its rank 0 gone or told
_STOPPED = "SIGTERM while this rank built its part of the engine (its rank 0 died, or was told)"


# rank 0's greeting, broadcast to every rank: its boot id and its configuration (``as_dict``)
Hello = tuple[str, dict[str, Any]]


@dataclass(slots=True)
class Member:
    """This process's place in the group: its comm, the shared boot id, and (rank 0 of a
    spawned group) the other ranks' processes."""

    comm: TorchComm
    boot: str | None
    procs: dict[int, subprocess.Popen] = field(default_factory=dict)

    @property
    def rank(self) -> int:
        return self.comm.rank

    def lost(self, grace: float = 2.0) -> list[int]:
        """The ranks this process knows are dead (the ones it started and that exited). A
        collective fails the moment a peer's socket closes, a little before its process is
        seen to have exited: up to ``grace`` seconds are given for one to be seen."""
        deadline = time.monotonic() + grace
        while True:
            dead = sorted(r for r, p in self.procs.items() if p.poll() is not None)
            if dead or not self.procs or time.monotonic() >= deadline:
                return dead
            time.sleep(0.05)

    def reap(self, timeout: float = JOIN_GRACE_S) -> None:
        """Wait for the ranks this process started; kill those still there after ``timeout``."""
        for p in self.procs.values():
            try:
                p.wait(timeout)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


def env_rank() -> tuple[int, int]:
    """(RANK, WORLD_SIZE) from the torch.distributed environment; ValueError naming what is
    missing."""
    missing = [
        k for k in ("MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "RANK") if k not in os.environ
    ]
    if missing:
        raise ValueError(f"dist_init env needs {', '.join(missing)} in the environment")
    rank, world = (os.environ[k].strip() for k in ("RANK", "WORLD_SIZE"))
    if not (rank.isdigit() and world.isdigit() and int(rank) < int(world)):
        raise ValueError(
            f"RANK and WORLD_SIZE must be integers with 0 <= RANK < WORLD_SIZE, "
            f"got RANK={rank!r} WORLD_SIZE={world!r}"
        )
    return int(rank), int(world)


def _connect(
    rank: int, world: int, init: str, timeout_s: float, device: str, hello: Hello | None = None
) -> tuple[Member, dict[str, Any]]:
    """Join the group; rank 0's ``hello`` (its boot id and configuration) comes back on every
    rank: each writes under rank 0's boot id, with rank 0's configuration."""
    comm = TorchComm(rank, world, init, timeout_s, device)
    boot, config = comm.broadcast(hello)
    return Member(comm, boot), config


def join_as_rank0(config: EngineConfig, boot: str) -> Member:
    """Rank 0's join: start the other ranks here (spawn) or meet them (env)."""
    import torch.distributed as dist

    if dist.is_initialized():  # torch.distributed has one default group per process
        raise ValueError("one multi-rank engine per process: close the other (LLM.close) first")
    hello = (boot, config.as_dict())
    if config.group.dist_init == "env":
        rank, world = env_rank()
        if rank != 0 or world != config.group.world:
            raise ValueError(
                f"this process is RANK {rank} of WORLD_SIZE {world}; the engine that serves is "
                f"rank 0 of {config.group.world} (tp {config.group.tp} x pp {config.group.pp}; "
                "start the others with `engine worker`)"
            )
        return _connect(0, world, "env://", config.group.group_timeout, config.model.device, hello)[
            0
        ]
    init = local_init_method(free_port())
    world = config.group.world
    args = [str(world), init, str(config.group.group_timeout), config.model.device]
    procs = {
        r: subprocess.Popen(
            [sys.executable, "-m", "engine.core.group_boot", str(r), *args],
            preexec_fn=dies_with_parent(),
            start_new_session=True,  # signals to rank 0's group are rank 0's to act on
        )
        for r in range(1, world)
    }
    try:
        member = _connect(0, world, init, config.group.group_timeout, config.model.device, hello)[0]
    except BaseException:
        for p in procs.values():
            p.kill()
        raise
    member.procs = procs
    return member


def boot(
    config: EngineConfig,
    loaded: LoadedModel | None = None,
    launch: Launch | None = None,
    tracing: Tracing | None = None,
) -> EngineCore:
    """The engine of ``config``: with more than one rank (``tp`` x ``pp``), rank 0 of its group
    (the others started or met once the model's shapes are checked against ``tp`` and ``pp``);
    ``tracing``: request spans."""
    join = join_as_rank0 if config.group.world > 1 else None
    return EngineCore(config, loaded, launch, join=join, tracing=tracing)


def follow(core: EngineCore) -> int:
    """A rank above 0: apply rank 0's inputs and step, until told to stop (0) or the group
    fails (1: the receipts say why)."""
    comm = core.member.comm
    try:
        while True:
            msg: Intake = comm.broadcast(None)
            for op in msg.ops:  # every input and control message before the batch it shapes
                _apply(core, op)
            if msg.stop is not None:
                core.shutdown(msg.stop)
                return 0
            if msg.step:
                core.step()  # a failed group ends the boot there
    except GroupFailure as e:  # an input this rank refused (``_apply``); idempotent after step
        core.fail(e)
        return EXIT_FAILED
    except KeyboardInterrupt:
        core.shutdown("sigterm")
        return 0


def _apply(core: EngineCore, op: Op) -> None:
    sched = core.scheduler
    if isinstance(op, Line):  # rank 0's drain holds the line: every rank's with it
        if op.closed:
            sched.admitter.close_line("cutover")
        else:
            sched.admitter.open_line()
    elif isinstance(op, Relayout):  # rank 0's layout cutover changes here, at this boundary
        core.relayout(op)
    elif isinstance(op, AddRequest):
        try:
            sched.add_request(
                op.prompt_ids, op.params, rid=op.rid, trace_id=op.trace, promise=op.promise
            )
        except ValueError as e:  # rank 0 took it: refusing it here is a split
            raise GroupSplit(
                f"rank {sched.group.rank} refused {op.rid} that rank 0 took: {e}"
            ) from e
    else:
        sched.abort(op.rid, reason=op.reason)


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def follower_main(
    rank: int, world: int, init: str, timeout_s: float = 30.0, device: str = "cpu"
) -> int:
    """A rank above 0, as a process of its own (spawned by rank 0, or ``engine worker``):
    it joins, takes rank 0's configuration, builds its shard of the engine and follows."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the terminal's Ctrl-C is rank 0's
    signal.signal(signal.SIGTERM, _interrupt)  # rank 0 died (PDEATHSIG) or we were told
    dump_stacks_on_signal()
    member, fields = _connect(rank, world, init, timeout_s, device)
    config = EngineConfig.from_kwargs(**fields)
    try:
        core = EngineCore(config, member=member)
    except BaseException as e:  # the boot this rank began in its log ends saying why
        traceback.print_exc()
        member.comm.close()
        why = _STOPPED if isinstance(e, KeyboardInterrupt) else f"{type(e).__name__}: {e}"
        write_boot_failed(config.log_file_of(rank), os.getpid(), EXIT_FAILED, why)
        return EXIT_FAILED
    return follow(core)


def worker_from_env(timeout_s: float = 30.0, device: str = "cpu") -> int:
    """``engine worker``: a rank above 0 started on its own (another node, torchrun)."""
    rank, world = env_rank()
    if rank == 0:
        raise ValueError("RANK 0 is the engine that serves: start it with `engine serve`")
    return follower_main(rank, world, "env://", timeout_s, device)


if __name__ == "__main__":  # a rank rank 0 spawned: RANK WORLD INIT TIMEOUT DEVICE
    a = sys.argv[1:]
    sys.exit(follower_main(int(a[0]), int(a[1]), a[2], float(a[3]), a[4]))
