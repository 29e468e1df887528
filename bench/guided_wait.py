"""The time a guided request waits in line on an idle server, against a plain one's.

One `engine serve` per tree (the default model, --kv-tokens 4096), idle but for this client,
which sends requests one at a time: a plain chat and a chat held to a JSON schema the server has
compiled already (a warm-up request compiled it), alternating, --pairs of each, max_tokens 4.
Each request's ``queue_s`` (from the frontend taking it in to its admission: the wait for its
guide's answer is in it) is read from its ``request.finish`` receipt. The benchmark asserts that
every guided request it counts found its grammar compiled (a ``grammar.compile`` receipt with
``cache`` ``hit``), so no compile is timed as waiting. ``--before TREE`` runs the same against
another checkout of the project first (its own `engine serve`, this environment), so the two
are measured on one machine in one run.

    .venv/bin/python bench/guided_wait.py [--pairs 20] [--before TREE]
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import orjson

HERE = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(HERE))
from cpuinfo import describe  # noqa: E402  (bench/cpuinfo.py, beside this script)

SCHEMA = {
    "type": "object",
    "properties": {"city": {"type": "string"}, "population": {"type": "integer"}},
    "required": ["city", "population"],
}
CHAT = [{"role": "user", "content": "Name a large city and its population."}]
GUIDED = {"type": "json_schema", "json_schema": {"name": "city", "schema": SCHEMA}}


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _serve(tree: Path, log: Path) -> tuple[subprocess.Popen, str]:
    port = _port()
    cmd = [sys.executable, "-m", "cli.engine_app", "serve", "--port", str(port)]
    cmd += ["--log-file", str(log), "--kv-tokens", "4096", "--served-model-name", "m"]
    proc = subprocess.Popen(cmd, cwd=tree, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the server of {tree} exited ({proc.returncode}); see {log}")
        try:
            if httpx.get(base + "/health", timeout=10).status_code == 200:
                return proc, base
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    proc.kill()
    raise RuntimeError(f"the server of {tree} was not healthy within 600 s")


def _ask(client: httpx.Client, guided: bool) -> str:
    body = {"model": "m", "messages": CHAT, "max_tokens": 4, "temperature": 0}
    if guided:
        body["response_format"] = GUIDED
    r = client.post("/v1/chat/completions", json=body)
    assert r.status_code == 200, r.text
    return r.json()["id"]


def measure(tree: Path, pairs: int) -> dict[str, list[float]]:
    """Each kind's queue_s (seconds) on ``tree``'s server, idle but for these requests."""
    log = Path(tempfile.mkdtemp()) / "boot.jsonl"
    proc, base = _serve(tree, log)
    rids: dict[str, list[str]] = {"plain": [], "guided": []}
    try:
        with httpx.Client(base_url=base, timeout=300) as client:
            _ask(client, False), _ask(client, True)  # warm: the template, the grammar compiled
            for _ in range(pairs):
                rids["plain"].append(_ask(client, False))
                rids["guided"].append(_ask(client, True))
    finally:
        proc.terminate()
        proc.wait(120)
    receipts = [orjson.loads(x) for x in log.read_bytes().splitlines()]
    compiles = [r for r in receipts if r["event"] == "grammar.compile"]
    # the warm-up missed; every counted guided request found its grammar compiled
    assert [r["cache"] for r in compiles] == ["miss"] + ["hit"] * pairs, compiles
    ends = {r["rid"]: r for r in receipts if r["event"] == "request.finish"}
    return {kind: [ends[rid]["queue_s"] for rid in ids] for kind, ids in rids.items()}


def _row(name: str, q: dict[str, list[float]]) -> str:
    plain, guided = (statistics.median(q[k]) * 1e3 for k in ("plain", "guided"))
    return (
        f"| {name} | {plain:.1f} | {max(q['plain']) * 1e3:.1f} | {guided:.1f} | "
        f"{max(q['guided']) * 1e3:.1f} | {guided - plain:+.1f} |"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--pairs", type=int, default=20)
    ap.add_argument("--before", type=Path, help="another checkout, measured first")
    args = ap.parse_args()
    load = os.getloadavg()[0]
    runs = []
    if args.before is not None:
        runs.append((f"before ({args.before.name})", measure(args.before.resolve(), args.pairs)))
    runs.append(("this tree", measure(HERE, args.pairs)))
    print(describe())
    print(f"load average before: {load:.2f}; {args.pairs} plain and {args.pairs} guided requests")
    print(
        "| tree | plain queue p50 ms | max | guided (cached schema) p50 ms | max | guided - plain |"
    )
    print("|---|---|---|---|---|---|")
    for name, q in runs:
        print(_row(name, q))


if __name__ == "__main__":
    main()
