"""The front door on the record, through a real `engine serve`: each refusal is a
``request.rejected`` receipt in the boot log (written by the scheduler process for the frontend,
``process: "frontend"``) and a count in ``/metrics``, the two equal; a loop that stood past its
limit is ``frontend.stall`` / ``frontend.resume``, in ``/health`` and ``/metrics``; and the
auditor's boot_health FAILs that boot for its stall (``no_frontend_stall``)."""

from __future__ import annotations

import time
from collections import Counter

import httpx
import orjson
import pytest

from engine.observability import schema
from tests.e2e.audit_cli import audit
from tests.e2e.http_raw import exchange, head
from tests.e2e.server_proc import ServerProc

# a limit any turn of the loop that parses a large body stands past (the test is of the wiring
# from the loop to the log, not of where the limit should be)
STALL_LIMIT = "0.001"
WAIT_S = 120  # an upper bound on the receipts' trip over the pipe, quick on a quiet machine


@pytest.fixture(scope="module")
def door(tiny_model_dir, tmp_path_factory):
    log = tmp_path_factory.mktemp("door") / "boot.jsonl"
    srv = ServerProc(
        log, "--model", tiny_model_dir, "--kv-tokens", "1024", "--loop-stall-timeout", STALL_LIMIT
    )
    yield srv
    srv.stop()


def _receipts(path, kind: str) -> list[dict]:
    out = []
    for line in path.read_bytes().splitlines():
        try:
            rec = orjson.loads(line)
        except orjson.JSONDecodeError:
            continue
        if isinstance(rec, dict) and rec.get("event") == kind:
            out.append(rec)
    return out


def _wait_for(path, kind: str, count: int) -> list[dict]:
    give_up = time.monotonic() + WAIT_S
    while len(got := _receipts(path, kind)) < count and time.monotonic() < give_up:
        time.sleep(0.2)
    return got


def _rejections(metrics: dict[str, float]) -> Counter:
    out: Counter = Counter()
    for name, value in metrics.items():
        if name.startswith("attest:http_rejections_total{"):
            status = name.split('status="', 1)[1].split('"', 1)[0]
            out[int(status)] += int(value)
    return out


def test_each_refusal_is_a_receipt_in_the_boot_log_and_a_count_in_metrics(door):
    base = door.base
    asked = [
        httpx.get(base + "/v2/nothing-here", timeout=60),
        httpx.post(
            base + "/v1/completions",
            content=b"{not json",
            timeout=60,
            headers={"content-type": "application/json"},
        ),
        httpx.post(base + "/v1/completions", json={"prompt": "hi", "max_tokens": -1}, timeout=60),
        httpx.put(base + "/v1/completions", json={}, timeout=60),
    ]
    assert [r.status_code for r in asked] == [404, 400, 400, 405]
    got = _wait_for(door.log_file, schema.REQUEST_REJECTED, 4)
    mine = [r for r in got if r["path"] in ("/v2/nothing-here", "/v1/completions")]
    assert sorted(r["status"] for r in mine) == [400, 400, 404, 405]
    assert all(r["process"] == "frontend" and r["rank"] == 0 for r in mine)
    by_status = {(r["status"], r["field"]): r for r in mine}
    assert by_status[(400, "max_tokens")]["route"] == "/v1/completions"
    assert "max_tokens" in by_status[(400, "max_tokens")]["reason"]
    assert by_status[(404, None)]["route"] == "unmatched"
    assert "not valid JSON" in by_status[(400, None)]["reason"]
    # /metrics counts what the log holds, status by status
    assert _rejections(door.metrics()) == Counter(r["status"] for r in got)


def test_what_the_protocol_refuses_before_the_app_is_on_the_record_too(door):
    fat = head("/v1/completions", 2, "X-Fat: " + "a" * 40_000 + "\r\n") + b"{}"
    two = head("/v1/chat/completions", 2, "Transfer-Encoding: chunked\r\n") + b"0\r\n\r\n"
    assert exchange(door.port, fat)[0] == 431
    assert exchange(door.port, two)[0] == 400
    got = _wait_for(door.log_file, schema.REQUEST_REJECTED, 6)
    by_status = {
        r["status"]: r for r in got if r["status"] == 431 or "Transfer-Encoding" in r["reason"]
    }
    assert by_status[431]["route"] == "unparsed" and "exceeds" in by_status[431]["reason"]
    assert by_status[400]["route"] == "/v1/chat/completions"
    assert by_status[400]["method"] == "POST"
    assert _rejections(door.metrics()) == Counter(r["status"] for r in got)


def test_a_loop_that_stood_past_its_limit_is_on_the_record_in_health_and_metrics(door):
    # a large body is read and parsed on the loop: at this limit, a turn that stands past it
    big = {"prompt": "word " * 400_000, "max_tokens": 1}
    httpx.post(door.base + "/v1/completions", json=big, timeout=120)
    stalls = _wait_for(door.log_file, schema.FRONTEND_STALL, 1)
    assert stalls and all(s["process"] == "frontend" for s in stalls)
    assert stalls[0]["limit_s"] == float(STALL_LIMIT)
    assert _wait_for(door.log_file, schema.FRONTEND_RESUME, 1)
    health = httpx.get(door.base + "/health", timeout=60).json()
    assert health["loop_stalls"] >= 1 and health["loop_stall_limit_s"] == float(STALL_LIMIT)
    assert door.metrics()["attest:frontend_loop_stalls_total"] >= 1


def test_the_auditor_fails_the_boot_for_its_frontend_stall(door):
    assert _wait_for(door.log_file, schema.FRONTEND_STALL, 1)
    code, _ = door.stop()
    assert code == 0
    done = audit("verdict", str(door.log_file), "--spec", "boot_health", "--json")
    report = orjson.loads(done.stdout)
    claims = {c["claim"]: c["verdict"] for c in report["specs"][0]["claims"]}
    assert done.returncode == 1 and claims["no_frontend_stall"] == "FAIL"
    assert claims["ready"] == "PASS" and claims["no_internal_error"] == "PASS"
