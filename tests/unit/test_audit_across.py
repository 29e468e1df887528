"""``across_boots``: boots ordered by their ``boot.start`` time; a key one boot leaves open is
found by the next; one the next boot lacks is a FAIL, one owed by the last boot UNDECIDED."""

from __future__ import annotations

from pathlib import Path

import pytest

from audit.parse import parse_spec
from audit.status import Status
from audit.verdict import evaluate
from tests.unit.audit_logs import LogText

CLAIM = (
    'kind = "across_boots"\nwhen = { kind = "checkpoint.create" }\n'
    'then = { kind = "checkpoint.found" }\ncloses = { kind = "checkpoint.delete" }\nkey = "id"\n'
)
MADE = {"tokens": 8, "pages": 2, "pinned_bytes": 64, "shared_bytes": 0}
FOUND = {"tokens": 8, "pages": 2, "missing": 0, "complete": True}


def decide(tmp_path: Path, *logs: LogText):
    spec = parse_spec('description = "t"\n[[claim]]\nid = "c"\n' + CLAIM, Path("t/spec.toml"))
    paths = [log.write(tmp_path / f"boot-{i}.jsonl") for i, log in enumerate(logs)]
    return evaluate([spec], paths).specs[0].claims[0]


def boots(first_ts: object = 1000.0, found: bool = True) -> tuple[LogText, LogText]:
    one = LogText("b-00000001")
    one.r("boot.start", config={}, ts=first_ts)
    one.ts = 1000.0
    one.r("checkpoint.create", id="c-1", **MADE).stop()
    two = LogText("b-00000002")
    two.r("boot.start", config={}, ts=2000.0)
    if found:
        two.r("checkpoint.found", id="c-1", **FOUND)
    return one, two.stop()


def test_a_checkpoint_found_by_the_next_boot_passes_and_one_it_lacks_fails(tmp_path):
    assert decide(tmp_path, *boots()).status is Status.PASS
    assert decide(tmp_path, *boots(found=False)).status is Status.FAIL


@pytest.mark.parametrize("ts", ["x", None, [1], True])
def test_a_boot_start_without_a_numeric_time_is_ordered_as_one_without_a_time(tmp_path, ts):
    """A mangled ``ts`` is read as a missing one (the boot first), never a crash."""
    assert decide(tmp_path, *boots(first_ts=ts)).status is Status.PASS
