"""One short request behind a busy neighbour: the engine's thread setup when another process keeps
one of this machine's cores busy (the issue: 15-17 s for 10 tokens with the default, 1.0 s with
``--threads 1`` on a 2-core machine).

A neighbour is a separate process spinning (``while True: pass``), pinned to core 0 or left to the
kernel; ``--neighbours all``: one pinned to each core; ``torch``: another torch process on all
cores, small matmuls with its own spinning OpenMP workers (another engine, a test suite). Each arm
runs in a fresh subprocess, so the environment it names is there from process start (OpenMP reads
it when torch loads it). The request: the default model (``LLM(None, kv_tokens=4096)``, or
``engine serve --kv-tokens 4096`` over HTTP with ``--via serve``), a fixed 20-token prompt, 10 new
tokens greedy, EOS ignored, no prefix-cache hit; timed end to end, prefill included, after two
warm-ups; figures are medians of --runs requests. Each arm's baseline is the same arm with no
neighbour, measured in this run.

    .venv/bin/python bench/busy_neighbour.py [--runs 5] [--arms before,threads=1,passive]
        [--neighbours none,pinned,unpinned] [--via llm,serve]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from cpuinfo import describe  # bench/cpuinfo.py, beside this script

ROOT = Path(__file__).resolve().parent.parent

OMP_VARS = (
    "OMP_NUM_THREADS",
    "OMP_WAIT_POLICY",
    "GOMP_SPINCOUNT",
    "KMP_BLOCKTIME",
    "MKL_NUM_THREADS",
)
PROMPT = list(range(1000, 1020))

# arm: (threads passed to LLM; "torch" = torch's own default count, passed explicitly), env at start
ARMS: dict[str, tuple[int | str | None, dict[str, str]]] = {
    # libgomp's own spin count (its default), set so that no engine default replaces it
    "before": ("torch", {"GOMP_SPINCOUNT": "300000"}),
    "threads=1": (1, {"GOMP_SPINCOUNT": "300000"}),
    "default": (None, {}),  # the engine's default: threads from the CPUs, libgomp's own waiting
    # the shared-host switch: threads from the CPUs, waiting workers sleep at once
    "passive": (None, {"OMP_WAIT_POLICY": "PASSIVE"}),
    "spin=1000": ("torch", {"GOMP_SPINCOUNT": "1000"}),
    "spin=10000": ("torch", {"GOMP_SPINCOUNT": "10000"}),
    "spin=30000": ("torch", {"GOMP_SPINCOUNT": "30000"}),
    "active": ("torch", {"OMP_WAIT_POLICY": "ACTIVE"}),
}


def child(threads: int | str | None, runs: int) -> None:
    """One arm, in this process: print the generate times as one JSON line."""
    import torch

    from engine import LLM, SamplingParams

    n = torch.get_num_threads() if threads == "torch" else threads
    llm = LLM(None, kv_tokens=4096, threads=n, speculative="off")
    params = SamplingParams(max_tokens=10, temperature=0, ignore_eos=True)
    times = []
    for i in range(runs + 2):
        llm.core.scheduler.cache.reset_to_empty()  # the prefill is work every time
        t = time.perf_counter()
        out = llm.generate([PROMPT], params)
        if i >= 2:
            times.append(time.perf_counter() - t)
        assert len(out[0].token_ids) == 10
    libs = {
        ln.split()[-1]
        for ln in Path("/proc/self/maps").read_text().splitlines()
        if "omp" in ln.rsplit("/", 1)[-1]
    }
    print(json.dumps({"times": times, "threads": torch.get_num_threads(), "omp": sorted(libs)}))
    llm.close()


def serve_arm(threads: int | str | None, runs: int, env: dict[str, str], log: str) -> dict:
    """The same request over HTTP to ``engine serve`` (its scheduler is a spawned process)."""
    import socket
    import urllib.request

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cmd = [
        str(ROOT / ".venv/bin/engine"),
        "serve",
        "--port",
        str(port),
        "--kv-tokens",
        "4096",
        "--log-file",
        log,
    ]
    cmd += [] if threads in (None, "torch") else ["--threads", str(threads)]
    server = subprocess.Popen(
        cmd, env=env, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    url = f"http://127.0.0.1:{port}"
    ask = {"max_tokens": 10, "temperature": 0, "ignore_eos": True}
    try:
        for _ in range(300):
            try:
                urllib.request.urlopen(url + "/health", timeout=1)
                break
            except OSError:
                time.sleep(0.5)
        times = []
        for i in range(runs + 2):
            body = json.dumps(ask | {"prompt": [2000 + i, *PROMPT[1:]]}).encode()  # no cache hit
            post = urllib.request.Request(
                url + "/v1/completions", body, {"content-type": "application/json"}
            )
            t = time.perf_counter()
            out = json.loads(urllib.request.urlopen(post, timeout=600).read())
            if i >= 2:
                times.append(time.perf_counter() - t)
            assert out["usage"]["completion_tokens"] == 10, out
    finally:
        server.terminate()
        server.wait()
    return {"times": times, "threads": threads or "default", "omp": "?"}


def neighbours(kind: str) -> list[subprocess.Popen]:
    """Start the neighbour of this kind (see the module's docstring)."""
    cpus = sorted(os.sched_getaffinity(0))
    if kind == "torch":
        code = "import torch\na = torch.randn(256, 256)\nwhile True: a @ a"
        spinner = subprocess.Popen(
            [sys.executable, "-c", code], env=os.environ | {"GOMP_SPINCOUNT": "300000"}
        )
        time.sleep(3)  # its import
        return [spinner]
    pins = {"none": [], "pinned": [{cpus[0]}], "unpinned": [None], "all": [{c} for c in cpus]}[kind]
    spinners = []
    for pin in pins:
        spinners.append(subprocess.Popen([sys.executable, "-c", "while True: pass"]))
        if pin is not None:
            os.sched_setaffinity(spinners[-1].pid, pin)
    time.sleep(0.5)  # let them take their cores
    return spinners


def run_arm(arm: str, runs: int, via: str, log: str) -> dict:
    threads, extra = ARMS[arm]
    env = {k: v for k, v in os.environ.items() if k not in OMP_VARS} | extra
    if via == "serve":
        return serve_arm(threads, runs, env, log)
    cmd = [sys.executable, __file__, "--child", json.dumps(threads), "--runs", str(runs)]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=ROOT, timeout=900)
    if out.returncode != 0:
        raise RuntimeError(f"arm {arm} failed:\n{out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--arms", default="before,threads=1,passive")
    ap.add_argument("--neighbours", default="none,pinned,unpinned", help="also: all, torch")
    ap.add_argument("--via", default="llm,serve", help="the offline LLM, engine serve, or both")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child is not None:
        return child(json.loads(args.child), args.runs)
    arms, kinds, vias = args.arms.split(","), args.neighbours.split(","), args.via.split(",")

    logs = tempfile.mkdtemp(prefix="busy_neighbour-")
    load_before = os.getloadavg()[0]
    results: dict[tuple[str, str, str], dict] = {}
    for via in vias:
        for arm in arms:
            for kind in kinds:
                spinners = neighbours(kind)
                try:
                    log = f"{logs}/{via}-{arm}-{kind}.jsonl"
                    results[via, arm, kind] = run_arm(arm, args.runs, via, log)
                finally:
                    for p in spinners:
                        p.kill()
                        p.wait()
                times = [round(t, 3) for t in results[via, arm, kind]["times"]]
                print(
                    f"{via} {arm} {kind}: {times} (load {os.getloadavg()[0]:.2f})",
                    file=sys.stderr,
                    flush=True,
                )

    omp = next((r["omp"] for r in results.values() if r["omp"] != "?"), "?")
    print(f"\ncpu: {describe()}; this process may use CPUs {sorted(os.sched_getaffinity(0))}")
    print(
        f"load average before/after: {load_before:.2f}/{os.getloadavg()[0]:.2f}, "
        f"runs: {args.runs}; OpenMP runtime loaded: {omp}"
    )
    print(
        "10 new tokens after a 20-token prompt, greedy: seconds (median), and the ratio to the "
        "same arm with no neighbour (baseline: neighbour none)"
    )
    print(
        f"{'via':>5} {'arm':>10} {'threads':>7} {'env at start':>24} "
        + " ".join(f"{k:>17}" for k in kinds)
    )
    for via in vias:
        for arm in arms:
            med = {k: statistics.median(results[via, arm, k]["times"]) for k in kinds}
            base = med.get("none")
            cells = " ".join(
                f"{med[k]:>7.3f}s" + (f" ({med[k] / base:>5.1f}x)" if base else " " * 9)
                for k in kinds
            )
            env = " ".join(f"{k}={v}" for k, v in ARMS[arm][1].items()) or "-"
            threads = results[via, arm, kinds[0]]["threads"]
            print(f"{via:>5} {arm:>10} {threads:>7} {env:>24} {cells}")


if __name__ == "__main__":
    main()
