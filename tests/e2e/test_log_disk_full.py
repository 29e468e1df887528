"""`engine serve` (a tiny model) whose boot log is on a full disk (``/dev/full``: every write
fails with ENOSPC): it serves, `/metrics` counts the receipts it could not write apart from
those it wrote, and it stops in order without a traceback."""

from __future__ import annotations

from pathlib import Path

import httpx

from tests.e2e.server_proc import ServerProc

FULL = Path("/dev/full")


def test_receipts_not_written_are_counted_apart_and_the_server_stops_in_order(
    tiny_model_dir, tmp_path
):
    pid_file = tmp_path / "serve.pid"
    srv = ServerProc(
        FULL, "--model", tiny_model_dir, "--kv-tokens", "1024", "--pid-file", str(pid_file)
    )
    try:
        r = httpx.post(
            srv.base + "/v1/completions", json={"prompt": "hi", "max_tokens": 2}, timeout=60
        )
        assert r.status_code == 200, r.text
        m = srv.metrics()  # the snapshot after the request's last step came with its answer
    finally:
        code, out = srv.stop()
    assert m['attest:receipts_failed_total{kind="request.finish"}'] == 1, m
    assert m['attest:receipts_failed_total{kind="boot.start"}'] == 1, m
    assert not any(k.startswith("attest:receipts_total") for k in m), m  # none was written
    assert code == 0, out
    assert "Traceback" not in out and "died" not in out, out
    assert out.count("No space left on device") == 1, out  # said once, then counted
    assert not pid_file.exists()
