"""What tracing costs when it is off: calls into ``engine/observability/tracing.py`` and their time during
an offline batch (32 prompts of 128 random tokens, 64 new tokens each), under cProfile, and
whether the OpenTelemetry SDK was imported at all. Off is the default (no endpoint configured).

    .venv/bin/python bench/tracing_off_cost.py
"""

from __future__ import annotations

import cProfile
import pstats
import sys
import time

from cpuinfo import describe  # bench/cpuinfo.py, beside this script


def main() -> None:
    from engine import LLM, SamplingParams
    from measure.method import Prompts

    llm = LLM(kv_tokens=8192, max_running=32)
    if llm.core.scheduler.traces is not None:
        raise SystemExit("tracing is on here (an OTEL endpoint is set): unset it to measure off")
    prompts = Prompts(llm.core.model_config.vocab_size).take(32, 128)
    params = SamplingParams(max_tokens=64, temperature=0, ignore_eos=True)
    prof = cProfile.Profile()
    t = time.perf_counter()
    prof.enable()
    llm.generate(prompts, params)
    prof.disable()
    wall = time.perf_counter() - t
    stats = pstats.Stats(prof).stats  # type: ignore[attr-defined]
    mine = [v for k, v in stats.items() if k[0].endswith("engine/observability/tracing.py")]
    calls, seconds = sum(v[1] for v in mine), sum(v[2] for v in mine)
    sdk = any(m.startswith("opentelemetry") for m in sys.modules)
    print(f"cpu: {describe()}")
    print(
        f"tracing off: {calls} calls into engine/observability/tracing.py, {seconds * 1e6:.1f} us of their "
        f"own time in a {wall:.2f} s batch (under cProfile); OpenTelemetry imported: {sdk}"
    )
    llm.close()


if __name__ == "__main__":
    main()
