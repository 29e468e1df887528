"""The online comparison's table: a row per server and concurrency, the peer's first, and each
of ours with its throughput and TTFT ratios over the peer at the same concurrency."""

from __future__ import annotations

from measure.online import Level, guidellm_command, table


def test_each_of_our_rows_carries_its_ratios_over_the_peer_at_its_concurrency():
    levels = [
        Level("attest", 1, 3, 0, 120.0, (50, 80), (8.0, 9.5)),
        Level("llama.cpp", 1, 3, 0, 100.0, (40, 60), (9.0, 12.0)),
        Level("attest", 4, 12, 1, 300.0, (90, 200), (12.0, 30.0)),
        Level("llama.cpp", 4, 12, 0, 200.0, (100, 150), (15.0, 20.0)),
    ]
    rows = table(levels, "attest", "llama.cpp").splitlines()[2:]
    assert [r.split(" | ")[0:2] for r in rows] == [
        ["| llama.cpp", "1"],
        ["| attest", "1"],
        ["| llama.cpp", "4"],
        ["| attest", "4"],
    ]
    assert rows[1].endswith("| 1.20x | 1.25x |") and rows[3].endswith("| 1.50x | 0.90x |")
    assert rows[0].endswith("|  |  |") and "12 / 1" in rows[3]


def test_every_server_gets_the_same_requests():
    a = guidellm_command("g", "http://a", 4, 12, 128, 64, "tok", "r1.json")
    b = guidellm_command("g", "http://b", 4, 12, 128, 64, "tok", "r2.json")
    differ = [(x, y) for x, y in zip(a, b) if x != y]
    assert len(a) == len(b) and len(differ) == 2  # the target and the report only
    assert "kind=static,value=0" in a and "request_format=/v1/completions" in a[3]
