"""The knobs of a group of ranks (``engine/core/group_boot.py``): EngineConfig's ``group`` section.

A group is ``tp`` x ``pp`` ranks: ``pp`` pipeline stages, each a run of the model's layers, and
in each stage ``tp`` tensor-parallel ranks, each a shard of those layers. Rank ``r`` is stage
``r // tp``, shard ``r % tp``; rank 0 (stage 0, shard 0) is the engine callers talk to."""

from __future__ import annotations

from dataclasses import dataclass

from engine.config.rules import _knob, _Section, is_int, need, seconds

DIST_INITS = ("spawn", "env")
PHASE_POLICIES = ("off", "auto")  # how a group's layout is chosen while it serves


@dataclass(frozen=True, slots=True)
class GroupSection(_Section):
    """Tensor and pipeline parallelism: ranks, each holding a part of the weights and its own
    KV pool; they run the same scheduler on the same inputs and decide from the published
    floor."""

    tp: int = _knob(
        1,
        "Tensor-parallel ranks: each holds a shard of the weights and its own KV pool "
        "(gloo on the CPU, NCCL on CUDA). The model's heads must divide by it.",
    )
    pp: int = _knob(
        1,
        "Pipeline stages: each holds a run of the model's layers (and their KV); a batch "
        "goes through them in micro-batches. At most the model's layer count.",
    )
    dist_init: str = _knob(
        "spawn",
        "spawn: start the other ranks on this machine; env: they are started on their own "
        "(`engine worker` on each node, or torchrun) and MASTER_ADDR, MASTER_PORT, "
        "WORLD_SIZE and RANK say who is who.",
    )
    group_timeout: float = _knob(
        30.0, "Seconds a collective waits for a rank that stopped answering."
    )
    group_check_interval: int = _knob(
        16, "Ranks compare batch digests every N iterations (every one with --check-invariants)."
    )
    # a test switch that splits a group with uneven pools (it exists to prove the split is caught)
    published_floor: bool = _knob(
        True, "A test switch: --own-pool makes each rank decide from its own pool (a split)."
    )

    phase_policy: str = _knob(
        "off",
        "auto: the group flips between pipeline stages (tp 1 x pp N, many prefills at once) "
        "and tensor shards (tp N x pp 1, decode) by its prefill backlog, through layout "
        "cutovers (engine/core/phase.py); off: the layout stays as booted.",
    )
    phase_enter_pp: int = _knob(
        2048, "auto: the prefill backlog (tokens) at or above which the group takes stages."
    )
    phase_exit_pp: int = _knob(
        256, "auto: the prefill backlog at or below which the group goes back to shards."
    )
    phase_dwell: int = _knob(32, "auto: iterations a layout is kept at least after a flip.")
    phase_interval: int = _knob(8, "auto: iterations between two decisions (phase.decide).")

    @property
    def world(self) -> int:
        """How many ranks the group has: ``tp`` in each of ``pp`` stages."""
        return self.tp * self.pp

    def validate(self) -> None:
        need(is_int(self.tp, 1), self, "tp", "an integer >= 1")
        need(is_int(self.pp, 1), self, "pp", "an integer >= 1")
        need(self.dist_init in DIST_INITS, self, "dist_init", f"one of {DIST_INITS}")
        need(seconds(self.group_timeout), self, "group_timeout", "a number of seconds > 0")
        need(is_int(self.group_check_interval, 1), self, "group_check_interval", "an integer >= 1")
        need(isinstance(self.published_floor, bool), self, "published_floor", "a boolean")
        need(self.phase_policy in PHASE_POLICIES, self, "phase_policy", "off or auto")
        need(is_int(self.phase_enter_pp, 1), self, "phase_enter_pp", "an integer >= 1")
        need(
            is_int(self.phase_exit_pp, 0) and self.phase_exit_pp < self.phase_enter_pp,
            self,
            "phase_exit_pp",
            f"an integer >= 0 below phase_enter_pp ({self.phase_enter_pp})",
        )
        need(is_int(self.phase_dwell, 1), self, "phase_dwell", "an integer >= 1")
        need(is_int(self.phase_interval, 1), self, "phase_interval", "an integer >= 1")
        need(
            self.phase_policy == "off" or self.world > 1,
            self,
            "phase_policy",
            "off with one rank (a layout needs ranks to change)",
        )
