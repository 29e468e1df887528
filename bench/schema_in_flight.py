"""/health and another client's stream with a 1 MB schema in flight, against the same without one.

One `engine serve` (the default model, --kv-tokens 4096, speculation off). Each arm runs for
--seconds while one stream decodes (greedy, EOS ignored) and /health is asked every 50 ms; the
stream's inter-token gaps and health's latencies are kept. Arms: ``none`` (the baseline, nothing
else in flight), ``checks`` (1 MB schemas sent back to back, each refused once its checks have
read all of it: 85,000 empty subschemas, the last asking for ``uniqueItems``: the worst case of
the HTTP process's checks), ``compile`` (a new valid 1 MB schema of 14,000 properties whenever
the last was answered: checked, then compiled in a worker until --grammar-timeout ends it). The
arms alternate within each run; figures are medians over --runs runs, and each arm's ratio is to
``none`` of the same runs. Before the fix the checks ran on the event loop (jsonschema: 29 s for
one such schema here), and /health timed out.

    .venv/bin/python bench/schema_in_flight.py [--runs 3] [--seconds 10]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import threading
import time
from pathlib import Path

import httpx
import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from cpuinfo import describe  # noqa: E402  (bench/cpuinfo.py, beside this script)

STREAM = {
    "prompt": [1000 + i for i in range(20)],
    "max_tokens": 3000,
    "ignore_eos": True,
    "stream": True,
    "temperature": 0,
}


def refused_at_its_checks(tag: int) -> dict:
    props: dict = {f"p{tag}{i:05x}": {} for i in range(85_000)}
    props["last"] = {"type": "array", "uniqueItems": True}
    return {"type": "object", "properties": props}


def slow_to_compile(tag: int) -> dict:
    return {
        "type": "object",
        "properties": {
            f"f{tag}_{i:06d}": {"type": "string", "description": "a field"} for i in range(14_000)
        },
    }


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))] if xs else float("nan")


def arm(base: str, kind: str, seconds: float) -> dict[str, float]:
    """One arm: the stream's gaps and health's latencies (ms) over ``seconds``, with ``kind``
    in flight; how many schema requests were answered meanwhile and their statuses."""
    stop = threading.Event()
    gaps: list[float] = []
    health: list[float] = []
    schemas: list[int] = []

    def stream() -> None:
        with httpx.stream("POST", base + "/v1/completions", json=STREAM, timeout=600) as r:
            assert r.status_code == 200, r.read()
            last = None
            for line in r.iter_lines():
                if line.startswith("data:"):
                    now = time.perf_counter()
                    if last is not None:
                        gaps.append((now - last) * 1e3)
                    last = now
                if stop.is_set():
                    return

    def load() -> None:
        tag = 0
        with httpx.Client(base_url=base, timeout=600) as client:
            while not stop.is_set():
                tag += 1
                make = refused_at_its_checks if kind == "checks" else slow_to_compile
                body = {
                    "prompt": [1000, 1001],
                    "max_tokens": 4,
                    "response_format": {
                        "type": "json_schema",
                        "json_schema": {"name": "s", "schema": make(tag)},
                    },
                }
                content = orjson.dumps(body)
                r = client.post(
                    "/v1/completions", content=content, headers={"content-type": "application/json"}
                )
                schemas.append(r.status_code)

    threads = [threading.Thread(target=stream, daemon=True)]
    if kind != "none":
        threads.append(threading.Thread(target=load, daemon=True))
    for t in threads:
        t.start()
    time.sleep(1.0)  # the stream decoding, the first schema sent
    gaps.clear()
    end = time.monotonic() + seconds
    with httpx.Client(base_url=base, timeout=120) as client:
        while time.monotonic() < end:
            t0 = time.perf_counter()
            assert client.get("/health").status_code == 200
            health.append((time.perf_counter() - t0) * 1e3)
            time.sleep(0.05)
    stop.set()
    measured = list(gaps)
    for t in threads:
        t.join(600)
    return {
        "health_p50": pct(health, 0.5),
        "health_p99": pct(health, 0.99),
        "health_max": max(health),
        "gap_p50": pct(measured, 0.5),
        "gap_p99": pct(measured, 0.99),
        "gap_max": max(measured),
        "schemas": len(schemas),
        "statuses": sorted(set(schemas)),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=10.0)
    args = ap.parse_args()
    from tests.e2e.server_proc import ServerProc

    Path("logs").mkdir(exist_ok=True)
    load_before = os.getloadavg()[0]
    srv = ServerProc(
        Path("logs") / "bench-schema-in-flight.jsonl",
        "--kv-tokens",
        "4096",
        "--speculative",
        "off",
        "--iteration-receipt-interval",
        "0",
    )
    kinds = ["none", "checks", "compile"]
    rows: dict[str, list[dict]] = {k: [] for k in kinds}
    try:
        for r in range(args.runs):
            for kind in kinds[r % 3 :] + kinds[: r % 3]:
                rows[kind].append(arm(srv.base, kind, args.seconds))
                print(f"  run {r + 1} {kind}: {rows[kind][-1]}", file=sys.stderr, flush=True)
    finally:
        srv.stop()
    print(describe())
    print(
        f"load average before/after: {load_before:.2f}/{os.getloadavg()[0]:.2f}; default "
        f"model, one stream, /health every 50 ms for {args.seconds:g} s per arm; median of "
        f"{args.runs} runs"
    )
    print(
        "| in flight | /health p50 ms | p99 ms | max ms | stream gap p50 ms | p99 ms | max ms "
        "| schemas answered (status) | health p99, gap p99 vs none |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    med = {
        k: {m: statistics.median(x[m] for x in v) for m in v[0] if m != "statuses"}
        for k, v in rows.items()
    }
    base = med["none"]
    for kind in kinds:
        m = med[kind]
        statuses = sorted({s for x in rows[kind] for s in x["statuses"]})
        print(
            f"| {kind} | {m['health_p50']:.1f} | {m['health_p99']:.1f} | {m['health_max']:.1f} "
            f"| {m['gap_p50']:.1f} | {m['gap_p99']:.1f} | {m['gap_max']:.1f} "
            f"| {m['schemas']:.0f} ({', '.join(map(str, statuses)) or '-'}) "
            f"| {m['health_p99'] / base['health_p99']:.2f}x, "
            f"{m['gap_p99'] / base['gap_p99']:.2f}x |"
        )


if __name__ == "__main__":
    main()
