"""A stored conversation continued after a restart through the Responses API: turn 2's time to
first token with turn 1's conversation loaded from the durable KV store (its checkpoint) against
the same turn 2 recomputing it, `engine serve` on the default model, several runs.

Each run: server A (``--kv-store-dir`` in a fresh directory) answers turn 1 (a long
``instructions`` and a question, stored: the response is written beside the store and its
conversation checkpointed) and stops; the page cache is dropped for the store's files, so the
next boot reads them from the disk; server B boots on the same store and streams turn 2
(``previous_response_id``, the same instructions): its TTFT is the wall time from the request to
the first ``response.output_text.delta`` (each server answers a short unrelated turn first, so
neither arm pays a first request's one-time costs). The script checks that B loaded the conversation from
the store (``store.load``, and the ``cached`` tokens of turn 2's ``request.finish``). Server C,
without a store, streams the same turn 2 with turn 1's items sent as its input (the same prompt,
checked by its token count) and computes it all: with ``--no-prefix-cache``, it is answered
twice and the second time is the one counted (a warm server computing the whole prompt; the
first is printed as ``cold``). Greedy: both arms must answer the same text.

    .venv/bin/python bench/responses_lane.py [--runs 3] [--facts 150]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx
import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from cpuinfo import describe  # noqa: E402  (bench/cpuinfo.py, beside this script)
from kv_store_resume import drop_page_cache  # noqa: E402

from tests.e2e.server_proc import ServerProc  # noqa: E402

SERVE = ("--kv-tokens", "4096", "--speculative", "off", "--iteration-receipt-interval", "0")
QUESTION = "Which lane carries the number 42? Answer with the lane only."


def instructions(facts: int) -> str:
    words = ("colour", "width", "owner", "speed", "name")
    lines = [f"Fact {i}: the {words[i % 5]} of lane {i} is {(i * 37) % 101}." for i in range(facts)]
    return "Answer from these facts only.\n" + "\n".join(lines)


def warm(base: str) -> None:
    """A short unrelated turn first: what a server's first request pays once (its kernels'
    first runs) is not either arm's TTFT."""
    body = {"input": "Hi.", "max_output_tokens": 2, "store": False, "temperature": 0}
    httpx.post(base + "/v1/responses", json=body, timeout=600).raise_for_status()


def first_delta(base: str, body: dict) -> tuple[float, dict]:
    """Turn ``body`` streamed: the seconds to its first text delta, and its final response."""
    t0 = time.perf_counter()
    first = None
    final: dict = {}
    with httpx.stream("POST", base + "/v1/responses", json=body, timeout=600) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if not line.startswith("data: "):
                continue
            event = orjson.loads(line[6:])
            if event["type"] == "response.output_text.delta" and first is None:
                first = time.perf_counter() - t0
            if event["type"] in ("response.completed", "response.incomplete"):
                final = event["response"]
            if event["type"] == "response.failed":
                raise RuntimeError(f"turn failed: {event['response']['error']}")
    assert first is not None, "no text was streamed"
    return first, final


def receipts(path: Path, rid: str) -> tuple[list[dict], dict]:
    """The boot's ``store.load`` receipts with pages, and ``rid``'s ``request.finish``."""
    deadline = time.monotonic() + 60  # the scheduler process writes the log
    while True:
        rows = [orjson.loads(x) for x in path.read_bytes().splitlines()]
        done = [x for x in rows if x["event"] == "request.finish" and x.get("rid") == rid]
        if done or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert done, f"no request.finish for {rid} in {path}"
    return [x for x in rows if x["event"] == "store.load" and x["pages"]], done[0]


def one_run(logs: Path, k: int, system: str) -> dict[str, float]:
    turn = {"model": None, "temperature": 0, "instructions": system}
    with tempfile.TemporaryDirectory(prefix="responses-lane-") as d:
        store = ("--kv-store-dir", d)
        a = ServerProc(logs / f"lane-{k}-a.jsonl", *SERVE, *store)
        try:
            r = httpx.post(
                a.base + "/v1/responses",
                json={**turn, "input": "Read the facts.", "max_output_tokens": 16},
                timeout=600,
            )
            r.raise_for_status()
            first = r.json()
        finally:
            a.stop()
        drop_page_cache(Path(d))
        log_b = logs / f"lane-{k}-b.jsonl"
        b = ServerProc(log_b, *SERVE, *store)
        try:
            warm(b.base)
            listed = httpx.get(b.base + "/v1/checkpoints", timeout=60).json()["data"]
            pinned = next(c["tokens"] for c in listed if c["id"] == first["id"])
            ask = {"input": QUESTION, "max_output_tokens": 8, "store": False}
            body = {**turn, **ask, "previous_response_id": first["id"], "stream": True}
            store_s, by_store = first_delta(b.base, body)
        finally:
            b.stop()
    loads, fin = receipts(log_b, "resp-" + by_store["id"].removeprefix("resp_"))
    assert loads and loads[0]["tokens"] >= pinned - 16, loads  # its whole store pages
    assert fin["cached"] >= pinned - 16, fin  # the conversation was not computed again
    c = ServerProc(logs / f"lane-{k}-c.jsonl", *SERVE, "--no-prefix-cache")
    try:
        items = [{"role": "user", "content": "Read the facts."}, *first["output"]]
        body = {**turn, **ask, "input": [*items, {"role": "user", "content": QUESTION}]}
        cold_s, _ = first_delta(c.base, {**body, "stream": True})  # its first time: not counted
        recompute_s, by_hand = first_delta(c.base, {**body, "stream": True})
    finally:
        c.stop()
    assert by_hand["usage"]["input_tokens"] == by_store["usage"]["input_tokens"]
    text = [o["content"][0]["text"] for o in (by_store["output"][0], by_hand["output"][0])]
    assert text[0] == text[1], text
    return {
        "store_s": store_s,
        "recompute_s": recompute_s,
        "cold_s": cold_s,
        "prompt": by_store["usage"]["input_tokens"],
        "cached": fin["cached"],
        "loaded": loads[0]["tokens"],
        "load_s": loads[0].get("seconds", 0.0),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--facts", type=int, default=150, help="lines of turn 1's instructions")
    args = ap.parse_args()
    logs = Path("logs")
    logs.mkdir(exist_ok=True)
    system = instructions(args.facts)
    runs = []
    for k in range(args.runs):
        runs.append(one_run(logs, k, system))
        print(f"  run {k + 1}: {runs[-1]}", file=sys.stderr, flush=True)
    med = {key: statistics.median(r[key] for r in runs) for key in runs[0]}
    print(describe())
    print(
        f"turn 2: {med['prompt']:.0f} prompt tokens, {med['loaded']:.0f} loaded from the store "
        f"(request.finish cached {med['cached']:.0f}); default model, runs {args.runs} (each: A "
        "answers turn 1 and stops, the page cache is dropped for the store, B continues by "
        "previous_response_id, C recomputes the same prompt without a store)"
    )
    print("| arm | turn 2 TTFT, median s | per run |")
    print("|---|---|---|")
    arms = (
        ("recompute, a cold server (not the baseline)", "cold_s"),
        ("recompute (no store), warm: the baseline", "recompute_s"),
        ("from the store, after the restart", "store_s"),
    )
    for name, key in arms:
        each = ", ".join(f"{r[key]:.3f}" for r in runs)
        print(f"| {name} | {med[key]:.3f} | {each} |")
    print(f"ratio recompute / store: {med['recompute_s'] / med['store_s']:.2f}x")


if __name__ == "__main__":
    main()
