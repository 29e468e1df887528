"""The verdict of one claim: three values (PASS, FAIL, UNDECIDED) merged by priority, a fourth
(N/A: the claim does not apply to this log) that stays out of the merge, and the
``ClaimVerdict`` that carries one of them with its sentence and numbers.

These are plain values with no imports from the rest of the auditor, so the checkers that make
them and the reports that gather them can both depend on this module.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any


class Status(StrEnum):
    PASS = "PASS"
    FAIL = "FAIL"
    UNDECIDED = "UNDECIDED"
    NOT_APPLICABLE = "N/A"  # nothing the claim is about is in the log: it decides nothing

    @property
    def exit_code(self) -> int:
        return {Status.PASS: 0, Status.FAIL: 1, Status.UNDECIDED: 2}.get(self, 0)


_RANK = {Status.PASS: 0, Status.UNDECIDED: 1, Status.FAIL: 2}


def merge(statuses: list[Status]) -> Status:
    """FAIL if any failed, else UNDECIDED if any is undecided, else PASS; N/A is left out.
    Nothing to merge is UNDECIDED: no claim was decided."""
    decided = [s for s in statuses if s is not Status.NOT_APPLICABLE]
    if not decided:
        return Status.UNDECIDED
    return max(decided, key=_RANK.__getitem__)


@dataclass(slots=True)
class ClaimVerdict:
    claim: str
    kind: str
    status: Status
    why: str  # one sentence, with the numbers
    reason: str | None = None  # a code for every UNDECIDED and N/A ("vacuous" on an allowed pass)
    numbers: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {
            "claim": self.claim,
            "kind": self.kind,
            "verdict": self.status.value,
            "reason": self.reason,
            "why": self.why,
            "numbers": self.numbers,
        }
