"""Auditor throughput: `audit verdict` (every shipped window) over a generated boot log of at least
1 GB, against `grep -c` on the same file in the same run.

    .venv/bin/python bench/audit_throughput.py [--gb 1.0] [--runs 3] [--keep DIR | --log LOG]
        [--audit-cmd CMD] [--audit-args ARGS]
        [--baseline CMD [--baseline-name NAME] [--baseline-args ARGS]]
        [--verdict-out FILE]

The log is a realistic single-rank receipt mix (received, chunked admits, defers, finishes,
evictions, parks/unparks, retract/requeue, iteration summaries) with a plain text line now and
then; seq is gap-free, so every claim is actually evaluated. It is written to a temporary
directory and deleted afterwards. Each tool runs ``--runs`` times, alternating, and the table gives
medians: wall time (and MB/s from it), CPU time (user + system of the child alone: less
sensitive to other work on a shared machine) and the auditor's peak RSS (wait4's rusage), with
the CPU's model and vector flags. ``--audit-cmd`` times another auditor on the same log instead of
this checkout's; ``--baseline`` times one beside it (a copy of an older checkout, run with
``python -P`` so that the working directory's packages do not shadow it), alternating, and prints
the speed ratio and whether the two gave the same verdicts (byte for byte, as ``--json``).
``--audit-args`` adds flags to the auditor timed (not the baseline), e.g. ``--jobs 1``: one
reading process (by default a log this big is read by one per core); ``--baseline-args`` the same
for the baseline.
"""

from __future__ import annotations

import argparse
import os
import random
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from statistics import median
from typing import NamedTuple

import orjson
from cpuinfo import describe  # bench/cpuinfo.py, beside this script

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
        rec = {
            "ts": round(ts, 6),
            "v": 1,
            "boot": BOOT,
            "rank": 0,
            "iter": it,
            "seq": seq,
            **fields,
            "event": event,
        }
        line = orjson.dumps(rec) + b"\n"
        buf.append(line)
        size += len(line)
        counts[event] = counts.get(event, 0) + 1

    budget = dict(local_avail=4096, evictable=512, decode_reserve=300, floor=None, offset=0)
    with path.open("wb") as fh:
        for name, fields in (
            ("boot.start", {"config": {"kv_tokens": 65536, "page_size": 16}}),
            (
                "boot.pool_sized",
                dict(path="configured", kv_tokens=65536, bytes_per_token=512, page_size=16),
            ),
            ("boot.ready", {"startup_s": 1.2}),
        ):
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
                emit(
                    "admission.admit",
                    rid=rid,
                    tokens=min(512, prompt - 512 * c),
                    pages=32,
                    prefix_hit=0,
                    held=512 * c,
                    chunked=c < chunks - 1,
                    retracted=0,
                    remaining=3000,
                    **budget,
                )
                if rng.random() < 0.5:
                    emit(
                        "admission.defer",
                        count=rng.randint(1, 30),
                        reason="budget",
                        running=8,
                        remaining=0,
                        **budget,
                    )
            if rng.random() < 0.05:
                emit(
                    "admission.park",
                    rid=rid,
                    reason="below_page",
                    need=100,
                    fundable=0,
                    page_size=16,
                    remaining=3,
                    **budget,
                )
                emit("admission.unpark", rid=rid, tokens=100, remaining=400, **budget)
            if rng.random() < 0.2:
                asked = rng.randint(16, 512)
                before = rng.randint(asked, 4096)
                emit(
                    "eviction",
                    reason="decode",
                    asked=asked,
                    evicted=asked + 3,
                    staged=0,
                    evictable_before=before,
                    evictable_after=before - asked - 3,
                    available_after=asked + 3,
                )
            if rng.random() < 0.02:
                emit(
                    "retract",
                    rids=[rid],
                    tokens_freed=prompt,
                    need=16,
                    available=0,
                    evictable=0,
                    candidates=[[rid, 3, prompt]],
                    running_after=7,
                    ratio_old=0.5,
                    ratio_new=0.6,
                )
                emit("requeue", rid=rid, generated=3)
            if it % 50 == 0:
                emit(
                    "iteration",
                    running=8,
                    waiting=rng.randint(0, 40),
                    parked=0,
                    token_usage=round(rng.random(), 4),
                    avail=1000,
                    evictable=500,
                    staged=0,
                    cached=2000,
                    ratio=0.5,
                )
            emit(
                "request.finish",
                rid=rid,
                reason="length",
                tokens=256,
                prompt_tokens=prompt,
                cached=0,
                queue_s=0.01,
                ttft_s=0.05,
                e2e_s=2.5,
                parks=0,
                retractions=0,
                trace_id=None,
            )
            if rng.random() < 0.001:
                line = b"INFO uvicorn.access: 127.0.0.1 - POST /v1/completions 200\n"
                buf.append(line)
                size += len(line)
            if len(buf) > 20_000:
                fh.write(b"".join(buf))
                buf.clear()
        emit(
            "boot.stop", reason="sigterm", in_flight=0
        )  # an orderly stop, as `engine serve` writes
        fh.write(b"".join(buf))
    counts["requests"] = n
    return counts


class Run(NamedTuple):
    wall_s: float
    cpu_s: float  # user + system, of the child alone
    rss_mb: float  # the child's peak resident set
    code: int
    out: bytes
    err: bytes


def run(cmd: list[str]) -> Run:
    """One child process, timed, with its own CPU time and peak RSS (wait4's rusage)."""
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        t0 = time.perf_counter()
        p = subprocess.Popen(cmd, stdout=out, stderr=err)
        _, status, ru = os.wait4(p.pid, 0)
        wall = time.perf_counter() - t0
        p.returncode = os.waitstatus_to_exitcode(status)  # reaped here, not by Popen
        out.seek(0)
        err.seek(0)
        return Run(
            wall,
            ru.ru_utime + ru.ru_stime,
            ru.ru_maxrss / 1024,
            p.returncode,
            out.read(),
            err.read(),
        )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gb", type=float, default=1.0, help="log size in GB (10^9 bytes)")
    ap.add_argument("--keep", help="write the log here and keep it")
    ap.add_argument("--log", help="read this log instead of generating one")
    ap.add_argument("--runs", type=int, default=3, help="runs of each tool, alternating")
    ap.add_argument("--audit-cmd", help="the auditor to time (default: this checkout's)")
    ap.add_argument("--audit-args", default="", help="flags added to the auditor timed")
    ap.add_argument("--baseline", help="another auditor to time beside it, named as below")
    ap.add_argument("--baseline-name", default="baseline", help="the baseline's name in the table")
    ap.add_argument("--baseline-args", default="", help="flags added to the baseline")
    ap.add_argument("--verdict-out", help="write the last run's `audit verdict --json` here")
    ap.add_argument(
        "--rss-head",
        type=float,
        default=0.1,
        help="also run each auditor once on this fraction of the log (its first "
        "lines) and print the peak RSS at both sizes (0: skip)",
    )
    args = ap.parse_args()
    d = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="audit-bench-"))
    d.mkdir(parents=True, exist_ok=True)
    log = Path(args.log) if args.log else d / "boot.jsonl"
    try:
        print(f"CPU: {describe()}")
        counts = None
        if not args.log:
            t0 = time.perf_counter()
            counts = generate(log, int(args.gb * 1e9))
            lines = sum(v for k, v in counts.items() if k != "requests")
            print(
                f"generated {log.stat().st_size / 1e6:.0f} MB, {lines} receipts, "
                f"{counts['requests']} requests in {time.perf_counter() - t0:.1f} s"
            )
        audit = (
            shlex.split(args.audit_cmd)
            if args.audit_cmd
            else [sys.executable, "-m", "cli.audit_app"]
        )
        auditors = {"audit verdict": (audit, shlex.split(args.audit_args))}
        if args.baseline:
            auditors = {
                args.baseline_name: (shlex.split(args.baseline), shlex.split(args.baseline_args)),
                **auditors,
            }
        grep: list[Run] = []
        runs: dict[str, list[Run]] = {name: [] for name in auditors}
        for _ in range(args.runs):
            grep.append(run(["grep", "-c", '"event":"admission.park"', str(log)]))
            for name, auditor in auditors.items():
                runs[name].append(run(verdict(auditor, log)))
                if runs[name][-1].code not in (0, 1, 2):
                    sys.exit(
                        f"{name} failed ({runs[name][-1].code}): {runs[name][-1].err.decode()}"
                    )
        if counts is not None:
            assert all(int(g.out) == counts["admission.park"] for g in grep), grep[0].out
        aud = runs["audit verdict"]
        if args.verdict_out:
            Path(args.verdict_out).write_bytes(aud[-1].out)
        report(log.stat().st_size / 1e6, grep, runs, orjson.loads(aud[-1].out))
        if args.rss_head > 0:
            rss_growth(log, d / "head.jsonl", args.rss_head, auditors, runs)
        if args.baseline:
            same = {r.out for rs in runs.values() for r in rs} == {aud[-1].out}
            print(
                f"verdicts of {args.baseline_name} and audit verdict, every run: "
                + ("the same, byte for byte" if same else "DIFFERENT")
            )
            if not same:
                sys.exit(1)
    finally:
        if not args.keep:
            shutil.rmtree(d, ignore_errors=True)


Auditor = tuple[list[str], list[str]]  # the command, and flags after `verdict LOG --json`


def verdict(auditor: Auditor, log: Path) -> list[str]:
    """``audit verdict LOG --json`` by one auditor, with its flags."""
    cmd, flags = auditor
    return [*cmd, "verdict", str(log), "--json", *flags]


def rss_growth(
    log: Path,
    head: Path,
    frac: float,
    auditors: dict[str, Auditor],
    runs: dict[str, list[Run]],
) -> None:
    """Peak RSS on the log's first lines against the whole log's: what the auditor holds per
    GB read (flat: about nothing)."""
    want = int(log.stat().st_size * frac)
    with log.open("rb") as src, head.open("wb") as dst:
        while dst.tell() < want:
            chunk = src.readline()
            if not chunk:
                break
            dst.write(chunk)
    mb, whole = head.stat().st_size / 1e6, log.stat().st_size / 1e6
    for name, auditor in auditors.items():
        small = run(verdict(auditor, head))
        big = max(r.rss_mb for r in runs[name])
        per_gb = (big - small.rss_mb) / (whole - mb) * 1000
        print(
            f"peak RSS of {name}: {small.rss_mb:.0f} MB on the first {mb:.0f} MB, {big:.0f} MB "
            f"on {whole:.0f} MB: {per_gb:+.0f} MB per GB read"
        )
    head.unlink()


def report(mb: float, grep: list[Run], runs: dict[str, list[Run]], verdict: dict) -> None:
    g = median([r.wall_s for r in grep])
    claims = sum(len(s["claims"]) for s in verdict["specs"])
    print(f"| tool | runs | median s | MB/s | CPU s (median) | peak RSS |\n|{'---|' * 6}")
    print(
        f"| grep -c | {len(grep)} | {g:.2f} | {mb / g:.0f} | "
        f"{median([r.cpu_s for r in grep]):.2f} | - |"
    )
    for name, rs in runs.items():
        a = median([r.wall_s for r in rs])
        print(
            f"| {name} ({len(verdict['specs'])} windows, {claims} claims) | {len(rs)} | "
            f"{a:.2f} | {mb / a:.1f} | {median([r.cpu_s for r in rs]):.2f} | "
            f"{max(r.rss_mb for r in rs):.0f} MB |"
        )
    print(
        "each run, wall s: grep "
        + " ".join(f"{r.wall_s:.2f}" for r in grep)
        + "".join(
            f"; {name} " + " ".join(f"{r.wall_s:.2f}" for r in rs) for name, rs in runs.items()
        )
    )
    aud = runs["audit verdict"]
    a = median([r.wall_s for r in aud])
    print(
        f"ratio audit/grep: {a / g:.1f}x; overall verdict {verdict['verdict']} "
        f"({', '.join(s['spec'] + ' ' + s['verdict'] for s in verdict['specs'])})"
    )
    for name, rs in runs.items():
        if rs is not aud:
            b = median([r.wall_s for r in rs])
            cpu = median([r.cpu_s for r in rs]) / median([r.cpu_s for r in aud])
            print(f"ratio {name}/audit verdict: {b / a:.2f}x wall, {cpu:.2f}x CPU")


if __name__ == "__main__":
    main()
