"""A long conversation resumed after a restart: its next turn's time to first token with the
durable KV store (the history's KV loaded from disk) against recomputing it (no store), same
model, same process, the arms alternating.

Each run: engine A (with a store in a fresh directory) computes the history (a one-token
request) and stops cleanly, which writes what it cached; the page cache is then dropped for the
store's files (``os.sync`` and ``posix_fadvise(DONTNEED)``), so the next boot reads them from the
disk, not from memory; engine B boots on the same store and answers the next turn (the history
plus a new question): its TTFT is the wall time of that one-token request, and the script
asserts that B loaded the whole history from the store (``store.load``) and computed only the
question. Engine C, without a store, answers the same turn from nothing. Greedy first tokens
must agree. Also reported: the write at A's stop (pages, bytes, seconds) and B's load bandwidth.

    .venv/bin/python bench/kv_store_resume.py [--history 2048] [--question 16] [--runs 3]
        [--page-size 1] [--quant int8|int4]
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import tempfile
import time
from pathlib import Path

from cpuinfo import describe  # bench/cpuinfo.py, beside this script


def drop_page_cache(root: Path) -> int:
    """Ask the kernel to forget the cached pages of every file under ``root``; returns the
    files."""
    os.sync()
    n = 0
    for dirpath, _, names in os.walk(root):
        for name in names:
            fd = os.open(Path(dirpath) / name, os.O_RDONLY)
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)
            n += 1
    return n


def ttft(llm, prompt: list[int]) -> tuple[float, int]:
    from engine import SamplingParams

    params = SamplingParams(max_tokens=1, temperature=0, ignore_eos=True)
    t0 = time.perf_counter()
    (out,) = llm.generate([prompt], params)
    return time.perf_counter() - t0, out.token_ids[0]


def one_run(args, history: list[int], turn: list[int], engine_kw: dict) -> dict[str, float]:
    from engine import LLM

    with tempfile.TemporaryDirectory(prefix="kvstore-bench-") as d:
        a = LLM(kv_store_dir=d, **engine_kw)
        ttft(a, history)
        a.close()
        writes = [w for w in a.core.receipts.of("store.write") if w["reason"] == "stop"]
        files = drop_page_cache(Path(d))
        b = LLM(kv_store_dir=d, **engine_kw)
        store_s, first_store = ttft(b, turn)
        loads = [x for x in b.core.receipts.of("store.load") if x["pages"]]
        assert loads and loads[0]["tokens"] >= len(history) - args.page_size, loads
        (fin,) = b.core.receipts.of("request.finish")
        assert fin["cached"] >= len(history) - args.page_size, fin  # not computed again
        b.close()
    c = LLM(**engine_kw)
    recompute_s, first_plain = ttft(c, turn)
    c.close()
    assert first_store == first_plain, (first_store, first_plain)
    return {
        "store_s": store_s,
        "recompute_s": recompute_s,
        "load_s": loads[0]["seconds"],
        "load_bytes": loads[0]["bytes"],
        "write_pages": sum(w["pages"] for w in writes),
        "write_bytes": sum(w["apparent"] for w in writes),
        "write_alloc": sum(w["allocated"] for w in writes),
        "write_s": sum(w["seconds"] for w in writes),
        "files": files,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--history", type=int, default=2048, help="tokens of the conversation so far")
    ap.add_argument("--question", type=int, default=16, help="tokens of the next turn's question")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--page-size", type=int, default=1)
    ap.add_argument("--quant", default=None)
    ap.add_argument("--model", default=None)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    print(describe())
    rng = random.Random(args.seed)
    vocab = 49152 if args.model is None else 320
    history = [rng.randrange(3, vocab) for _ in range(args.history)]
    turn = history + [rng.randrange(3, vocab) for _ in range(args.question)]
    kw = dict(
        model=args.model,
        kv_tokens=args.history + args.question + 512,
        page_size=args.page_size,
        quant=args.quant,
        speculative="off",
    )
    runs = [one_run(args, history, turn, kw) for _ in range(args.runs)]
    med = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
    print(
        f"history {args.history} tokens, question {args.question}, page size {args.page_size}, "
        f"quant {args.quant or 'exact'}, runs {args.runs} (each: A computes and stops, the page "
        "cache is dropped for the store, B resumes from the store, C recomputes)"
    )
    print("| arm | TTFT of the next turn, median s | per run |")
    print("|---|---|---|")
    print(
        f"| recompute (no store) | {med['recompute_s']:.3f} | "
        + ", ".join(f"{r['recompute_s']:.3f}" for r in runs)
        + " |"
    )
    print(
        f"| from the store | {med['store_s']:.3f} | "
        + ", ".join(f"{r['store_s']:.3f}" for r in runs)
        + " |"
    )
    print(f"ratio recompute / store: {med['recompute_s'] / med['store_s']:.1f}x")
    print(
        f"B's load: {med['load_bytes'] / 1e6:.1f} MB in {med['load_s']:.3f} s "
        f"({med['load_bytes'] / 1e6 / med['load_s']:.0f} MB/s); A's write at stop: "
        f"{med['write_pages']:.0f} pages, {med['write_bytes'] / 1e6:.1f} MB "
        f"({med['write_alloc'] / 1e6:.1f} MB allocated) in {med['write_s']:.3f} s; "
        f"{med['files']:.0f} files dropped from the page cache"
    )


if __name__ == "__main__":
    main()
