"""The CPU a benchmark ran on: its model, core count and vector flags. This machine kind's CPU
varies (AVX-512 one day, AVX2 only the next), so every benchmark prints this with its table."""

from __future__ import annotations

import os
import re
from pathlib import Path


def describe() -> str:
    try:
        info = Path("/proc/cpuinfo").read_text()
    except OSError:
        return "unknown CPU"
    model = next(
        (ln.split(":", 1)[1].strip() for ln in info.splitlines() if ln.startswith("model name")),
        "?",
    )
    flags = sorted(set(re.findall(r"\b(avx2|avx512[a-z_0-9]*)\b", info)))
    return f"{model}, {os.cpu_count()} cores; flags: {' '.join(flags) or 'no avx2/avx512'}"
