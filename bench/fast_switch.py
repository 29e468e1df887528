"""Fast mode with and without one of its switches, in one run: decode tok/s per stream count, the
two arms alternating on fresh prompts (the prefix cache emptied, every request asserted uncached),
and with --agreement each arm's greedy agreement with exact mode on the held-out prompts
(``measure.agreement``).

The switches (--switch), each read at load, the baseline arm loaded with it at 0; the run asserts
from each arm's model which one it is:

* ``vnni``: the integer products (``engine.model.vnni``: FBGEMM's VNNI product for the LM head);
  baseline ``ATTEST_VNNI=0``, torch's packed int8 kernel for the head.
* ``step``: a small decode forward's layers in one native call (``engine.model.native_step``);
  baseline ``ATTEST_NATIVE_STEP=0``, the layers in Python (the same kernels, the same bits).
* ``ints``: the layer matrices' integer products (``engine.model.int_vnni``: 8-bit activations,
  AVX-512 VNNI); baseline ``ATTEST_INT_VNNI=0``, torch's packed int4 / int8 kernels.
* ``rows``: up to how many rows the integer products run, measured at load
  (``engine.model.int_rows``); baseline ``ATTEST_INT_ROWS=4``, the bound fixed before.

    .venv/bin/python bench/fast_switch.py [--switch vnni|step|ints|rows] [--modes int8,int4]
        [--streams 1,16,64] [--runs 5] [--prompt-len 128] [--new-tokens 64] [--agreement]
"""

from __future__ import annotations

import argparse
import os
import statistics

from cpuinfo import describe  # bench/cpuinfo.py, beside this script

from engine import LLM
from measure.agreement import PROMPTS, greedy_agreement
from measure.method import Prompts, attest_generate, decode_rate

# switch: (environment variable, its value for the baseline, whether a loaded model runs what
# the switch turns on)
SWITCHES = {
    "vnni": ("ATTEST_VNNI", "0", lambda llm: llm.core.model.quant.vnni_rows > 0),
    "step": ("ATTEST_NATIVE_STEP", "0", lambda llm: llm.core.model.native_step is not None),
    "ints": ("ATTEST_INT_VNNI", "0", lambda llm: llm.core.model.quant.int_vnni),
    "rows": ("ATTEST_INT_ROWS", "4", lambda llm: bool(llm.core.model.quant.int_rows)),
}


def load(mode: str, switch: str, on: bool) -> LLM:
    """``mode`` with ``switch`` on or off (read at load)."""
    var, off, runs = SWITCHES[switch]
    old = os.environ.pop(var, None)
    if not on:
        os.environ[var] = off
    try:
        llm = LLM(quant=mode, speculative="off", kv_tokens=32768, receipts=True)
    finally:
        os.environ.pop(var, None)
        if old is not None:
            os.environ[var] = old
    assert runs(llm) == on, f"{mode}: the arm asked {switch}={on}, its model says otherwise"
    return llm


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--switch", choices=sorted(SWITCHES), default="vnni")
    ap.add_argument("--modes", default="int8,int4")
    ap.add_argument("--streams", default="1,16,64")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--agreement", action="store_true")
    args = ap.parse_args()
    print(f"cpu: {describe()}; load average {os.getloadavg()[0]:.2f}")
    print(
        f"{args.prompt_len}-token prompts, {args.new_tokens} new tokens, greedy; decode tok/s, "
        f"median of {args.runs} alternating runs; baseline: "
        f"{'='.join(SWITCHES[args.switch][:2])}"
    )
    exact = LLM(kv_tokens=16384, receipts=False) if args.agreement else None
    for mode in args.modes.split(","):
        arms = {"on": load(mode, args.switch, True), "off": load(mode, args.switch, False)}
        print(f"{mode}: {arms['on'].core.model.quant.path}")
        if arms["on"].core.model.quant.int_rows:
            print(f"  measured at load: {arms['on'].core.model.quant.fields()['int_rows']}")
        vocab = arms["on"].core.model.cfg.vocab_size
        prompts = Prompts(vocab, seed=0)
        goes = {name: attest_generate(llm) for name, llm in arms.items()}
        for n in (int(s) for s in args.streams.split(",")):
            got: dict[str, list[float]] = {name: [] for name in arms}
            for go in goes.values():
                go(prompts.take(n, args.prompt_len), 4)  # warm-up at this batch size
            for r in range(args.runs):
                order = list(goes) if r % 2 == 0 else list(reversed(goes))
                for name in order:
                    rate = decode_rate(goes[name], prompts, n, args.prompt_len, args.new_tokens)
                    got[name].append(rate[0])
            med = {name: statistics.median(v) for name, v in got.items()}
            print(
                f"  {mode} {n:>3} streams: {args.switch} on {med['on']:.1f} ({min(got['on']):.1f}-"
                f"{max(got['on']):.1f}), off {med['off']:.1f} ({min(got['off']):.1f}-"
                f"{max(got['off']):.1f}) tok/s, ratio {med['on'] / med['off']:.2f}x"
            )
        if exact is not None:
            ids = [exact.tokenizer.encode_chat([{"role": "user", "content": p}]) for p in PROMPTS]
            for name, llm in arms.items():
                a = greedy_agreement(exact, llm, ids, 32)
                print(
                    f"  {mode} {name}: {a.equal}/{a.positions} positions agree with exact = "
                    f"{a.share:.1%}; common prefixes {a.common_prefix}"
                )
        for llm in arms.values():
            llm.close()


if __name__ == "__main__":
    main()
