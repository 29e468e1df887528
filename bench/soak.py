"""Soak: `engine serve` on loopback, far past its pool's capacity, for minutes, with the traffic
operators see: streaming and not, ``n`` > 1, stop strings, clients that hang up mid-stream and
requests that are malformed. At the end the engine must have lost nothing:

- no 5xx except an honest 503/504 naming why, no transport error, no traceback in the output;
- every request the server received has its ending receipt (finish, abort or reject), including
  every id a client saw, and every hang-up became a ``client_disconnect`` abort;
- the pool balances at idle (nothing held, free + cached == total);
- the scheduler process's RSS does not grow from the first fifth of the run to its end beyond
  noise;
- ``audit verdict`` on the boot log gives no FAIL (the windows of SOAK_WINDOWS; relief_ladder's
  verdict is printed too); the server exits 0 on SIGTERM.

The baseline is the run's own first fifth: RSS growth is a ratio to it. Prints the CPU's flags,
the oversubscription reached (tokens asked of the engine at once over the pool's size), the
latency percentiles and the RSS curve.

    .venv/bin/python bench/soak.py [--minutes 10] [--concurrency 64] [--kv-tokens 1024]
        [--model PATH] [--json out.json]
"""

from __future__ import annotations

import argparse
import asyncio
import random
import re
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path

import httpx
import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from cpuinfo import describe  # bench/cpuinfo.py, beside this script

from audit.report_data import percentile  # noqa: E402
from tests.e2e.server_proc import ServerProc  # noqa: E402

WORDS = (
    "memory page cache request token admit park evict retract queue budget floor ledger "
    "receipt window verdict scheduler prefix decode stream engine pool host device"
).split()
# The windows whose claims hold under any load: no FAIL is allowed from them. relief_ladder's
# claims are about its own recipe (a share of engagements paid without a park, and a control
# run); ten times past the pool, parking is the designed outcome, so its verdict is reported,
# not required.
SOAK_WINDOWS = ("boot_health", "no_request_lost", "admission_park", "eviction_honesty")
# each names the field it breaks; the server must answer 4xx naming it
MALFORMED: tuple[tuple[str, object], ...] = (
    ("max_tokens", {"prompt": "hi", "max_tokens": -3}),
    ("max_tokens", {"prompt": "hi", "max_tokens": "many"}),
    ("temperature", {"prompt": "hi", "temperature": "hot"}),
    ("n", {"prompt": "hi", "n": 10_000}),
    ("prompt", {"max_tokens": 4}),
    ("prompt", {"prompt": ""}),
    ("body", b'{"prompt": "unterminated'),
    ("body", b"\xff\xfe not json"),
    ("messages", {"messages": [{"role": "wizard", "content": "hi"}], "_chat": True}),
)


@dataclass(slots=True)
class SoakConfig:
    duration_s: float = 600.0
    concurrency: int = 64
    kv_tokens: int = 1024
    max_running: int = 16
    model: str | None = None  # None: the default model
    disconnect: float = 0.20  # of all requests, streams the client drops mid-way
    malformed: float = 0.05
    seed: int = 0
    prompt_words: tuple[int, int] = (30, 160)  # a prompt's length in words, uniform
    sample_every_s: float = 5.0


@dataclass(slots=True)
class Tally:
    sent: int = 0
    status: Counter = field(default_factory=Counter)
    served: int = 0
    disconnected: int = 0
    malformed_4xx: int = 0
    problems: dict[str, list] = field(
        default_factory=dict
    )  # what must not happen: [count, example]
    latencies: list[float] = field(default_factory=list)  # seconds, served requests
    ids: set[str] = field(default_factory=set)  # the receipt rids the clients saw
    dropped: set[str] = field(default_factory=set)  # the rids of the streams hung up on

    def problem(self, kind: str, text: str) -> None:
        seen = self.problems.setdefault(kind, [0, text])
        seen[0] += 1


def _prompt(rng: random.Random, words: tuple[int, int]) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(rng.randrange(*words)))


def _rids(rid: str, n: int) -> list[str]:
    return [rid] if n == 1 else [f"{rid}-{i}" for i in range(n)]


async def _bad(client: httpx.AsyncClient, rng: random.Random, t: Tally) -> None:
    name, body = rng.choice(MALFORMED)
    chat = isinstance(body, dict) and body.get("_chat")
    path = "/v1/chat/completions" if chat else "/v1/completions"
    if isinstance(body, dict):
        body = orjson.dumps({k: v for k, v in body.items() if k != "_chat"})
    r = await client.post(path, content=body, headers={"content-type": "application/json"})
    t.status[r.status_code] += 1
    if 400 <= r.status_code < 500 and "error" in r.json():
        t.malformed_4xx += 1
    else:
        t.problem(f"malformed {name} not 4xx", f" {r.status_code} {r.text[:200]}")


async def _good(client: httpx.AsyncClient, rng: random.Random, t: Tally, cfg: SoakConfig) -> None:
    chat, n = rng.random() < 0.5, 2 if rng.random() < 0.1 else 1
    drop = rng.random() < cfg.disconnect / (1 - cfg.malformed)
    stream = drop or rng.random() < 0.5
    text, max_tokens = _prompt(rng, cfg.prompt_words), rng.randrange(8, 48)
    body: dict = {
        "max_tokens": max_tokens,
        "n": n,
        "stream": stream,
        "temperature": 0.7,
        "seed": rng.randrange(1 << 30),
    }
    if rng.random() < 0.3:
        body["stop"] = [".", "\n\n"]
    if chat:
        body["messages"] = [{"role": "user", "content": text}]
    else:
        body["prompt"] = text
    path = "/v1/chat/completions" if chat else "/v1/completions"
    t0 = time.perf_counter()
    if not stream:
        r = await client.post(path, json=body)
        t.status[r.status_code] += 1
        if r.status_code != 200:
            t.problem(f"{path} {r.status_code}", r.text[:300])
            return
        t.ids.update(_rids(r.json()["id"], n))
    else:
        async with client.stream("POST", path, json=body) as r:
            t.status[r.status_code] += 1
            if r.status_code != 200:
                t.problem(
                    f"{path} stream {r.status_code}",
                    (await r.aread())[:300].decode(errors="replace"),
                )
                return
            chunks = rng.randrange(1, 5) if drop else -1
            async for line in r.aiter_lines():
                if line.startswith("data: {"):
                    chunk = orjson.loads(line[6:])
                    if "error" in chunk:
                        t.problem(f"{path} error event", line[:300])
                        return
                    t.ids.update(_rids(chunk["id"], n))
                    chunks -= 1
                    if chunks == 0:
                        t.disconnected += 1
                        t.dropped.update(_rids(chunk["id"], n))
                        return  # leaving the block closes the connection mid-stream
    t.served += 1
    t.latencies.append(time.perf_counter() - t0)


async def _load(base: str, cfg: SoakConfig, t: Tally) -> None:
    deadline = time.monotonic() + cfg.duration_s
    limits = httpx.Limits(max_connections=cfg.concurrency + 8)
    async with httpx.AsyncClient(base_url=base, timeout=300, limits=limits) as client:

        async def worker(i: int) -> None:
            rng = random.Random(cfg.seed * 1000 + i)
            first = i == 0  # one malformed body always, however few requests a slow host sends
            while time.monotonic() < deadline:
                t.sent += 1
                try:
                    if rng.random() < cfg.malformed or first:
                        first = False
                        await _bad(client, rng, t)
                    else:
                        await _good(client, rng, t, cfg)
                except httpx.HTTPError as e:
                    t.problem(f"transport {type(e).__name__}", str(e))
                except Exception as e:  # an answer the client could not read is a finding
                    t.problem(f"unreadable answer {type(e).__name__}", str(e))

        await asyncio.gather(*(worker(i) for i in range(cfg.concurrency)))


def rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        kb = re.search(r"VmRSS:\s+(\d+)", f.read())
    return int(kb.group(1)) / 1024 if kb else float("nan")


def _sample_rss(pid: int, every: float, stop: threading.Event, out: list) -> None:
    t0 = time.monotonic()
    while not stop.is_set():
        try:
            out.append((round(time.monotonic() - t0, 1), round(rss_mb(pid), 1)))
        except OSError:
            return
        stop.wait(every)


def _hang_ups(log: Path, dropped: set[str]) -> tuple[int, list[str]]:
    """Of the requests whose client hung up mid-stream, how many
    finished all the same (their last tokens made before the abort reached the scheduler: a
    few milliseconds after the client left, or before it, still being read), and which ended
    neither so nor aborted ``client_disconnect`` (no ending, or another abort)."""
    endings: dict[str, dict] = {}
    for line in log.read_bytes().splitlines():
        if line.startswith(b"{") and (b'"request.finish"' in line or b'"request.abort"' in line):
            r = orjson.loads(line)
            if r["rid"] in dropped:
                endings[r["rid"]] = r
    finished, wrong = 0, []
    for rid in dropped:
        end = endings.get(rid, {})
        if end.get("event") == "request.finish":
            finished += 1
        elif end.get("reason") != "client_disconnect":
            wrong.append(f"{rid} ({end.get('event')} {end.get('reason')})")
    return finished, sorted(wrong)


def _receipts(log: Path) -> tuple[set[str], set[str], Counter, int]:
    """(rids received, rids ended, abort reasons, the peak of prompt + max new tokens summed
    over the requests in flight at once) from the boot log."""
    received, ended, reasons = set(), set(), Counter()
    held: dict[str, int] = {}
    asked = peak = 0
    for line in log.read_bytes().splitlines():
        if not line.startswith(b"{"):
            continue
        r = orjson.loads(line)
        ev = r.get("event")
        if ev == "request.received":
            received.add(r["rid"])
            held[r["rid"]] = r.get("prompt_tokens", 0) + r.get("max_new_tokens", 0)
            asked += held[r["rid"]]
            peak = max(peak, asked)
        elif ev in ("request.finish", "request.abort", "request.reject"):
            ended.add(r["rid"])
            asked -= held.pop(r["rid"], 0)
            if ev == "request.reject":  # refused at the door: received and ended at once
                received.add(r["rid"])
            if ev == "request.abort":
                reasons[r.get("reason")] += 1
    return received, ended, reasons, peak


def run_soak(cfg: SoakConfig, log: Path) -> dict:
    """Boot, load for ``cfg.duration_s``, stop with SIGTERM, and judge. The result's
    ``problems`` is empty when nothing was lost."""
    args = ["--kv-tokens", str(cfg.kv_tokens), "--max-running", str(cfg.max_running)]
    if cfg.model:
        args += ["--model", cfg.model]
    srv = ServerProc(log, *args)
    t, rss, stop = Tally(), [], threading.Event()
    sampler = threading.Thread(
        target=_sample_rss, args=(srv.scheduler_pid(), cfg.sample_every_s, stop, rss)
    )
    sampler.start()
    try:
        asyncio.run(_load(srv.base, cfg, t))
        time.sleep(1.0)  # the last aborts of dropped streams reach the scheduler
        idle = httpx.get(srv.base + "/health", timeout=10).json()
    finally:
        stop.set()
        sampler.join()
        code, out = srv.stop(signal.SIGTERM, timeout=60)
    return judge(cfg, log, t, rss, idle, code, out)


def judge(cfg: SoakConfig, log: Path, t: Tally, rss: list, idle: dict, code: int, out: str):
    problems = [f"{kind} x{n}: {example}" for kind, (n, example) in t.problems.items()]
    if code != 0:
        problems.append(f"server exited {code} on SIGTERM")
    if "Traceback" in out:
        problems.append(
            f"a traceback in the server's output: {out[out.index('Traceback') :][:600]}"
        )
    received, ended, reasons, peak = _receipts(log)
    if lost := received - ended:
        problems.append(f"{len(lost)} received requests have no ending receipt: {sorted(lost)[:5]}")
    if unseen := t.ids - received:
        problems.append(f"{len(unseen)} ids a client saw were never received: {sorted(unseen)[:5]}")
    finished_anyway, unheard = _hang_ups(log, t.dropped)
    if unheard:
        problems.append(
            f"{len(unheard)} hung-up requests neither finished nor aborted client_disconnect: "
            f"{unheard[:5]}"
        )
    held = {k: idle.get(k) for k in ("running", "parked", "waiting", "kv_used")}
    if any(held.values()):
        problems.append(f"not idle after the load: {held}")
    if idle.get("kv_free", 0) + idle.get("kv_cached", 0) + idle.get("kv_staged", 0) != idle.get(
        "kv_total"
    ):
        problems.append(f"the pool does not balance at idle: {idle}")
    early = [mb for s, mb in rss if cfg.duration_s * 0.2 <= s <= cfg.duration_s * 0.3]
    base_mb = early[0] if early else (rss[0][1] if rss else float("nan"))
    end_mb = rss[-1][1] if rss else float("nan")
    growth = end_mb - base_mb
    if growth > max(64.0, 0.10 * base_mb):  # noise: allocator arenas, page cache of weights
        problems.append(f"scheduler RSS grew {growth:.0f} MB ({base_mb:.0f} -> {end_mb:.0f})")
    verdict, report = _verdict(log, SOAK_WINDOWS)
    if verdict.returncode not in (0, 2):
        problems.append(f"audit verdict exited {verdict.returncode}: {verdict.stdout[-800:]}")
    _, ladder = _verdict(log, ("relief_ladder",))
    return {
        "config": asdict(cfg),
        "sent": t.sent,
        "status": dict(t.status),
        "served": t.served,
        "disconnected": t.disconnected,
        "finished_despite_hangup": finished_anyway,
        "malformed_4xx": t.malformed_4xx,
        "received": len(received),
        "abort_reasons": dict(reasons),
        "oversubscription": round(peak / cfg.kv_tokens, 1),
        "latency_s": {
            q: percentile(t.latencies, n) or float("nan") for q, n in (("p50", 50), ("p99", 99))
        },
        "rss_mb": rss,
        "rss_growth_mb": round(growth, 1),
        "idle": idle,
        "audit": {
            "exit_code": verdict.returncode,
            "verdict": report.get("verdict"),
            "relief_ladder": ladder.get("verdict"),
        },
        "problems": problems,
    }


def _verdict(log: Path, windows: tuple[str, ...]) -> tuple[subprocess.CompletedProcess, dict]:
    specs = [a for w in windows for a in ("--spec", w)]
    done = subprocess.run(
        [sys.executable, "-m", "cli.audit_app", "verdict", str(log), *specs, "--json"],
        capture_output=True,
        text=True,
    )
    return done, orjson.loads(done.stdout) if done.stdout.startswith("{") else {}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--minutes", type=float, default=10.0)
    ap.add_argument("--concurrency", type=int, default=64)
    ap.add_argument("--kv-tokens", type=int, default=1024)
    ap.add_argument("--max-running", type=int, default=16)
    ap.add_argument("--model", default=None)
    ap.add_argument("--json", default=None, help="also write the result here")
    a = ap.parse_args()
    cfg = SoakConfig(
        duration_s=a.minutes * 60,
        concurrency=a.concurrency,
        kv_tokens=a.kv_tokens,
        max_running=a.max_running,
        model=a.model,
    )
    log = Path("logs") / f"soak-{time.strftime('%Y%m%dT%H%M%S')}.jsonl"
    log.parent.mkdir(exist_ok=True)
    print(describe(), flush=True)
    res = run_soak(cfg, log)
    lat = res["latency_s"]
    print(
        f"{a.minutes:g} min at concurrency {a.concurrency}, pool {a.kv_tokens} tokens: "
        f"oversubscription {res['oversubscription']}x (tokens asked at once / pool)"
    )
    print(
        f"sent {res['sent']}, served {res['served']}, dropped by the client "
        f"{res['disconnected']}, malformed answered 4xx {res['malformed_4xx']}; "
        f"statuses {res['status']}; aborts by reason {res['abort_reasons']}"
    )
    print(f"latency p50 {lat['p50']:.2f} s, p99 {lat['p99']:.2f} s (served requests, end to end)")
    curve = ", ".join(
        f"{s:.0f}s {mb:.0f}" for s, mb in res["rss_mb"][:: max(1, len(res["rss_mb"]) // 12)]
    )
    print(
        f"scheduler RSS MB: {curve}; growth after the first fifth {res['rss_growth_mb']} MB "
        f"(ratio {res['rss_mb'][-1][1] / res['rss_mb'][0][1]:.3f} to the start)"
    )
    aud = res["audit"]
    print(
        f"audit verdict ({', '.join(SOAK_WINDOWS)}): {aud['verdict']} (exit {aud['exit_code']});"
        f" relief_ladder: {aud['relief_ladder']}; log {log}"
    )
    if a.json:
        Path(a.json).write_bytes(
            orjson.dumps(res, option=orjson.OPT_INDENT_2 | orjson.OPT_NON_STR_KEYS)
        )
    for p in res["problems"]:
        print("PROBLEM:", p)
    return 1 if res["problems"] else 0


if __name__ == "__main__":
    sys.exit(main())
