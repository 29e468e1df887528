"""`audit verdict --live` over the receipt log of a real `engine serve` (the tiny model) copied
while it still serves, a request in flight: boot_health, UNDECIDED without the flag (the log may
end in a death), PASSes as of the log's last line with it, and says where that is; the request
in flight stays UNDECIDED, never FAIL. The only time bounds here are hang limits."""

from __future__ import annotations

import shutil
import threading
from pathlib import Path

import httpx
import orjson
import pytest

from tests.e2e.audit_cli import audit
from tests.e2e.server_proc import ServerProc

# a request still decoding when the log is copied: hundreds of tokens the tiny model never ends
LONG = {"prompt": [7, 8, 9, 10], "max_tokens": 400, "ignore_eos": True, "stream": True}


def receipts(path: Path) -> list[dict]:
    return [orjson.loads(x) for x in path.read_bytes().splitlines() if x.startswith(b"{")]


def verdict(log: Path, spec: str, *flags: str) -> tuple[int, dict]:
    r = audit("verdict", str(log), "--spec", spec, "--json", *flags)
    assert r.returncode in (0, 1, 2), r.stdout + r.stderr
    return r.returncode, orjson.loads(r.stdout)


class Stream(threading.Thread):
    """A streaming completion in the background; ``first`` is set at its first token."""

    def __init__(self, base: str) -> None:
        super().__init__(daemon=True)
        self.base, self.first = base, threading.Event()
        self.start()

    def run(self) -> None:
        try:
            with httpx.stream("POST", self.base + "/v1/completions", json=LONG, timeout=600) as r:
                for line in r.iter_lines():
                    if line.startswith("data: "):
                        self.first.set()
        except httpx.HTTPError:
            pass  # the server's stop at the test's end may cut it
        finally:
            self.first.set()


@pytest.fixture
def live_copy(tiny_model_dir, tmp_path):
    """The receipt log copied while the server serves a request; the server, still running."""
    srv = ServerProc(tmp_path / "boot.jsonl", "--model", tiny_model_dir, "--kv-tokens", "1024")
    try:
        for i in range(3):
            body = {"prompt": [5, 6, 7, 8 + i], "max_tokens": 8}
            assert httpx.post(srv.base + "/v1/completions", json=body, timeout=600).is_success
        stream = Stream(srv.base)
        assert stream.first.wait(600)
        copy = tmp_path / "live.jsonl"
        shutil.copyfile(tmp_path / "boot.jsonl", copy)
        assert srv.proc.poll() is None  # it was copied from a running server
        yield copy, srv
    finally:
        srv.stop()


def test_a_live_servers_log_passes_boot_health_as_of_its_last_line(live_copy):
    copy, srv = live_copy
    recs = receipts(copy)
    kinds = [r["event"] for r in recs]
    assert "boot.stop" not in kinds
    opened = kinds.count("request.received")
    ended = kinds.count("request.finish") + kinds.count("request.abort")
    assert opened == 4 and ended == 3  # the long request is in flight where the copy ends

    code, today = verdict(copy, "boot_health")  # no flag: the honest default stands
    assert (code, today["verdict"]) == (2, "UNDECIDED")
    stopped = {c["claim"]: c for c in today["specs"][0]["claims"]}["stopped_in_order"]
    assert (stopped["verdict"], stopped["reason"]) == ("UNDECIDED", "in_flight_at_end")
    assert "live" not in today and "window_end" not in today

    code, live = verdict(copy, "boot_health", "--live")
    assert (code, live["verdict"], live["live"]) == (0, "PASS", True)
    (end,) = live["window_end"]["receipts"]
    last = max(recs, key=lambda r: r["seq"])
    assert (end["boot"], end["rank"], end["seq"], end["ts"]) == (
        last["boot"],
        0,
        last["seq"],
        last["ts"],
    )

    code, lost = verdict(copy, "no_request_lost", "--live")
    every = {c["claim"]: c for c in lost["specs"][0]["claims"]}["every_request_ends"]
    assert (every["verdict"], every["reason"]) == ("UNDECIDED", "in_flight_at_end")  # not FAIL
    assert code == 2

    text = audit("verdict", str(copy), "--spec", "boot_health", "--live")
    assert text.returncode == 0 and text.stdout.startswith("live window:"), text.stdout
    assert f"seq {last['seq']}," in " ".join(text.stdout.split())  # however the line wraps
    assert srv.proc.poll() is None  # judged while it still ran
