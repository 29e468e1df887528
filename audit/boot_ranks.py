"""How many ranks a boot has: what its ``boot.start`` declares (``config.tp`` x ``config.pp``,
the engine's configuration as written: ``--tp N --pp M``, ``LLM(tp=N, pp=M)``; a log without
``pp`` is of one stage). A boot that says N ranks and whose logs
hold fewer cannot be judged as a whole: a rank log is missing (not passed, or the rank never
wrote one). The verdict reads it to size a window's logs, ``ranks_agree`` to name the missing.
"""

from __future__ import annotations

from itertools import islice
from typing import Any

from audit.checker import MAX_NAMED, Bus
from engine.observability import schema

WORLD_FIELD = "tp"  # boot.start's config field that says how many ranks a stage has
STAGES_FIELD = "pp"  # and how many stages (absent: one)


def declared_ranks(config: Any) -> tuple[int, bool] | None:
    """(how many ranks ``boot.start``'s ``config`` says, whether it says stages too), or None
    where it does not say."""
    if not isinstance(config, dict):
        return None
    tp, pp = config.get(WORLD_FIELD), config.get(STAGES_FIELD, 1)
    if type(tp) is int and tp > 0 and type(pp) is int and pp > 0:
        return tp * pp, pp > 1
    return None


class WorldSize:
    """Per boot, the rank count its boot.start declares (``declared_ranks``), where one says
    it."""

    def __init__(self, bus: Bus) -> None:
        self.declared: dict[str, int] = {}
        self.staged: set[str] = set()  # boots that declare pipeline stages
        self.started: set[str] = set()  # boots whose boot.start was read, declaring or not
        bus.kinds[schema.BOOT_START].append(self._start)

    def _start(self, rec: dict[str, Any]) -> None:
        self.started.add(rec["boot"])
        said = declared_ranks(rec.get("config"))
        if said is not None:
            self.declared[rec["boot"]] = max(self.declared.get(rec["boot"], 0), said[0])
            if said[1]:
                self.staged.add(rec["boot"])

    def source(self, boot: str) -> str:
        """Where ``boot``'s rank count was read, in words."""
        said = f"{schema.BOOT_START} config.{WORLD_FIELD}"
        return said + (f" x config.{STAGES_FIELD}" if boot in self.staged else "")

    def one_rank(self, boot: str) -> bool:
        """Whether the boot's boot.start, read so far, says (or implies) a single rank."""
        return boot in self.started and self.declared.get(boot, 1) == 1

    def most(self) -> int:
        return max(self.declared.values(), default=0)

    def missing(self, seen: dict[str, list[int]]) -> list[tuple[str, list[int], int, int]]:
        """(boot, the first ranks no log holds, how many, ranks declared) for each boot that
        lacks some (a count, never a list of them all: a hostile ``tp`` stays cheap)."""
        out = []
        for boot, n in sorted(self.declared.items()):
            here = {r for r in seen.get(boot, ()) if 0 <= r < n}
            if len(here) < n:
                first = islice((r for r in range(n) if r not in here), MAX_NAMED)
                out.append((boot, list(first), n - len(here), n))
        return out
