"""Auditor throughput: `audit verdict` (every shipped window) over a generated boot log of at least
1 GB, against `grep -c` on the same file in the same run.

    .venv/bin/python bench/audit_throughput.py [--gb 1.0] [--keep DIR]

The log is a realistic single-rank receipt mix (received, chunked admits, defers, finishes,
evictions, parks/unparks, retract/requeue, iteration summaries) with a plain text line now and
then; seq is gap-free, so every claim is actually evaluated. It is written to a temporary
directory and deleted afterwards. Peak RSS is the audit process's (getrusage of children).
"""

from __future__ import annotations

import argparse
import random
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import orjson

BOOT = "b-bench001"


def generate(path: Path, target_bytes: int, seed: int = 0) -> dict[str, int]:
    rng = random.Random(seed)
    seq = 0
    it = 0
    ts = 1_800_000_000.0
    counts: dict[str, int] = {}
    buf: list[bytes] = []
    size = 0

    def emit(event: str, **fields: object) -> None:
        nonlocal seq, ts, size
        seq += 1
        ts += 0.0007
        rec = {"ts": round(ts, 6), "v": 1, "boot": BOOT, "rank": 0, "iter": it, "seq": seq,
               **fields, "event": event}  # fmt: skip
        line = orjson.dumps(rec) + b"\n"
        buf.append(line)
        size += len(line)
        counts[event] = counts.get(event, 0) + 1

    budget = dict(local_avail=4096, evictable=512, decode_reserve=300, floor=None, offset=0)
    with path.open("wb") as fh:
        for name, fields in (
            ("boot.start", {"config": {"kv_tokens": 65536, "page_size": 16}}),
            ("boot.pool_sized", dict(path="configured", kv_tokens=65536, bytes_per_token=512, page_size=16)),
            ("boot.ready", {"startup_s": 1.2}),
        ):  # fmt: skip
            emit(name, **fields)
        n = 0
        while size < target_bytes:
            rid = f"r-{n}"
            n += 1
            it += 1
            prompt = rng.randint(16, 2048)
            emit(
                "request.received", rid=rid, prompt_tokens=prompt, max_new_tokens=256, trace_id=None
            )
            chunks = -(-prompt // 512)
            for c in range(chunks):
                emit("admission.admit", rid=rid, tokens=min(512, prompt - 512 * c), pages=32,
                     prefix_hit=0, held=512 * c, chunked=c < chunks - 1, retracted=0,
                     remaining=3000, **budget)  # fmt: skip
                if rng.random() < 0.5:
                    emit("admission.defer", count=rng.randint(1, 30), reason="budget", running=8,
                         remaining=0, **budget)  # fmt: skip
            if rng.random() < 0.05:
                emit("admission.park", rid=rid, reason="below_page", need=100, fundable=0,
                     page_size=16, remaining=3, **budget)  # fmt: skip
                emit("admission.unpark", rid=rid, tokens=100, remaining=400, **budget)
            if rng.random() < 0.2:
                asked = rng.randint(16, 512)
                before = rng.randint(asked, 4096)
                emit("eviction", reason="decode", asked=asked, evicted=asked + 3, staged=0,
                     evictable_before=before, evictable_after=before - asked - 3,
                     available_after=asked + 3)  # fmt: skip
            if rng.random() < 0.02:
                emit("retract", rids=[rid], tokens_freed=prompt, need=16, available=0,
                     evictable=0, candidates=[[rid, 3, prompt]], running_after=7,
                     ratio_old=0.5, ratio_new=0.6)  # fmt: skip
                emit("requeue", rid=rid, generated=3)
            if it % 50 == 0:
                emit("iteration", running=8, waiting=rng.randint(0, 40), parked=0,
                     token_usage=round(rng.random(), 4), avail=1000, evictable=500, staged=0,
                     cached=2000, ratio=0.5)  # fmt: skip
            emit("request.finish", rid=rid, reason="length", tokens=256, prompt_tokens=prompt,
                 cached=0, queue_s=0.01, ttft_s=0.05, e2e_s=2.5, parks=0, retractions=0,
                 trace_id=None)  # fmt: skip
            if rng.random() < 0.001:
                line = b"INFO uvicorn.access: 127.0.0.1 - POST /v1/completions 200\n"
                buf.append(line)
                size += len(line)
            if len(buf) > 20_000:
                fh.write(b"".join(buf))
                buf.clear()
        emit("boot.stop", reason="bench", in_flight=0)
        fh.write(b"".join(buf))
    counts["requests"] = n
    return counts


def timed(cmd: list[str]) -> tuple[float, subprocess.CompletedProcess]:
    t0 = time.perf_counter()
    r = subprocess.run(cmd, capture_output=True, text=True)
    return time.perf_counter() - t0, r


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gb", type=float, default=1.0, help="log size in GB (10^9 bytes)")
    ap.add_argument("--keep", help="write the log here and keep it")
    args = ap.parse_args()
    d = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="audit-bench-"))
    d.mkdir(parents=True, exist_ok=True)
    log = d / "boot.jsonl"
    try:
        t0 = time.perf_counter()
        counts = generate(log, int(args.gb * 1e9))
        gen_s = time.perf_counter() - t0
        size = log.stat().st_size
        lines = sum(v for k, v in counts.items() if k != "requests")
        print(f"generated {size / 1e6:.0f} MB, {lines} receipts, {counts['requests']} requests "
              f"in {gen_s:.1f} s")  # fmt: skip
        grep_s, g = timed(["grep", "-c", '"event":"admission.park"', str(log)])
        audit_s, a = timed([sys.executable, "-m", "cli.audit_app", "verdict", str(log), "--json"])
        rss_mb = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
        if a.returncode not in (0, 1, 2):
            sys.exit(f"audit failed ({a.returncode}): {a.stderr}")
        verdict = orjson.loads(a.stdout)
        assert int(g.stdout) == counts["admission.park"], (g.stdout, counts["admission.park"])
        mb = size / 1e6
        print("| tool | seconds | MB/s | peak RSS |\n|---|---|---|---|")
        print(f"| grep -c | {grep_s:.1f} | {mb / grep_s:.0f} | - |")
        print(f"| audit verdict (5 windows, {sum(len(s['claims']) for s in verdict['specs'])} "
              f"claims) | {audit_s:.1f} | {mb / audit_s:.1f} | {rss_mb:.0f} MB |")  # fmt: skip
        print(f"ratio audit/grep: {audit_s / grep_s:.1f}x; overall verdict {verdict['verdict']} "
              f"({', '.join(s['spec'] + ' ' + s['verdict'] for s in verdict['specs'])})")  # fmt: skip
    finally:
        if not args.keep:
            shutil.rmtree(d, ignore_errors=True)


if __name__ == "__main__":
    main()
