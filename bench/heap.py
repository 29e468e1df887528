"""The C heap keeping what a step frees (``engine/core/heap.py``, ``ATTEST_HEAP=keep``, the
default) against glibc's own thresholds (``ATTEST_HEAP=system``, the baseline), each arm a fresh
engine in a process of its own (the setting is a process's), the arms taking turns.

Per arm and turn: whether the load's measure (``engine.model.orient``) gave a layer's 512-row
products to the weights packed at load (AMX's tiles in bfloat16 where the CPU has them, else
oneDNN's layout); the process's resident memory once booted; a 512-token prefill (tok/s, the
median of 3, ``measure.method.prefill_rate``); a prefill of 64 prompts of 128 tokens (seconds,
the fastest of 2); the decode of 64 streams (tok/s, ``measure.method.decode_rate``, 32 new
tokens); and the minor page faults of each. Every generate is asserted uncached
(``measure.method.attest_generate``). The table gives each arm's median over turns and keep's
ratio over system (above 1: keep faster).

    .venv/bin/python bench/heap.py [--turns 3] [--dtype bfloat16]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time

from cpuinfo import describe  # bench/cpuinfo.py, beside this script

ARMS = ("keep", "system")
STREAMS, LENGTH, NEW = 64, 128, 32


def faults() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def child(dtype: str) -> dict:
    """One engine's figures, in this process."""
    from engine import LLM
    from measure.method import Prompts, attest_generate, decode_rate, prefill_rate

    llm = LLM(
        dtype=dtype,
        speculative="off",
        kv_tokens=STREAMS * (LENGTH + NEW + 16),
        max_running=STREAMS,
    )
    rss = next(ln for ln in open("/proc/self/status") if ln.startswith("VmRSS:"))
    weights = llm.core.receipts.of("boot.weights")[0]
    sized = llm.core.receipts.of("boot.pool_sized")[0]
    assert sized["heap"] == os.environ["ATTEST_HEAP"], sized  # the arm this process is
    go, prompts = attest_generate(llm), Prompts(llm.core.model_config.vocab_size)
    go(prompts.take(1, 512), 1)  # warm
    f = faults()
    prefill = statistics.median(prefill_rate(go, prompts, 512) for _ in range(3))
    prefill_faults = (faults() - f) // 3
    go(prompts.take(STREAMS, LENGTH), 1)  # warm at the batch's shapes
    f = faults()
    batch = min(go(prompts.take(STREAMS, LENGTH), 1) for _ in range(2))
    batch_faults = (faults() - f) // 2
    f = faults()
    decode, _ = decode_rate(go, prompts, STREAMS, LENGTH, NEW)
    return {
        "packed_512": 512 in weights.get("prepacked", {}).get("layers", []),
        "rss_mib_booted": int(rss.split()[1]) // 1024,  # resident after the boot
        "prefill_tok_s": prefill,
        "prefill_faults": prefill_faults,
        "batch_prefill_s": batch,
        "batch_faults": batch_faults,
        "decode_tok_s": decode,
        "decode_faults": faults() - f,  # two generates: one token, then NEW + 1
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--turns", type=int, default=3)
    ap.add_argument("--dtype", choices=("float32", "bfloat16"), default="bfloat16")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(child(args.dtype)))
        return
    print(f"cpu: {describe()}")
    got: dict[str, list[dict]] = {arm: [] for arm in ARMS}
    for turn in range(args.turns):
        for arm in ARMS if turn % 2 == 0 else ARMS[::-1]:
            t = time.perf_counter()
            out = subprocess.run(
                [sys.executable, __file__, "--child", "--dtype", args.dtype],
                env=os.environ | {"ATTEST_HEAP": arm},
                capture_output=True,
                text=True,
                check=True,
            ).stdout
            got[arm].append(json.loads(out.strip().splitlines()[-1]))
            print(f"turn {turn} {arm} ({time.perf_counter() - t:.0f} s): {got[arm][-1]}")
    keys = [k for k in got[ARMS[0]][0] if k != "packed_512"]
    print(f"\n{args.dtype}, medians of {args.turns} turns")
    print("| figure | keep | system | keep / system |")
    print("|---|---:|---:|---:|")
    packed = {arm: sum(r["packed_512"] for r in got[arm]) for arm in ARMS}
    print(
        f"| boots giving 512 rows to the packed weights | {packed['keep']} | {packed['system']} | |"
    )
    for k in keys:
        med = {arm: statistics.median(r[k] for r in got[arm]) for arm in ARMS}
        # a rate is better higher, seconds lower: the ratio says keep's gain (none for counts)
        if k.endswith("tok_s"):
            cell = f"{med['keep'] / med['system']:.2f}x"
        elif k.endswith("_s"):
            cell = f"{med['system'] / med['keep']:.2f}x"
        else:
            cell = ""
        print(f"| {k} | {med['keep']:.6g} | {med['system']:.6g} | {cell} |")


if __name__ == "__main__":
    main()
