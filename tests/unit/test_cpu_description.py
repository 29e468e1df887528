"""A benchmark's CPU line tells two CPUs apart that share a model name, and says how many cores
the benchmark could use: the same "Intel(R) Xeon(R) Processor" came as a 2.6 GHz model 167
with two cores and as a 2.1 GHz model 207 with sixteen, of which a run used two (taskset)."""

from __future__ import annotations

from engine.core import threads
from measure import method

CPUINFO = "".join(
    f"processor\t: {i}\nvendor_id\t: GenuineIntel\ncpu family\t: 6\nmodel\t\t: 207\n"
    "model name\t: Intel(R) Xeon(R) Processor\nstepping\t: 2\ncpu MHz\t\t: 2100.000\n"
    "flags\t\t: fpu avx2 avx512f avx512_vnni amx_tile\n\n"
    for i in range(16)
)


def test_the_cpu_line_names_the_model_number_and_the_cores_usable(monkeypatch):
    monkeypatch.setattr(method, "_cpuinfo", lambda: CPUINFO)
    monkeypatch.setattr(method.os, "sched_getaffinity", lambda _: {2, 3}, raising=False)
    monkeypatch.setattr(method.os, "cpu_count", lambda: 16)
    monkeypatch.setattr(threads, "_cgroup_quota", lambda: None)  # no CPU quota here
    got = method.describe_cpu()
    assert got == (
        "Intel(R) Xeon(R) Processor (family 6 model 207 stepping 2, 2100 MHz), 2 of 16 cores; "
        "flags: amx_tile avx2 avx512_vnni avx512f"
    )
    monkeypatch.setattr(method.os, "sched_getaffinity", lambda _: set(range(16)), raising=False)
    assert ", 16 cores; flags:" in method.describe_cpu()


def test_no_cpuinfo_is_an_unknown_cpu(monkeypatch):
    monkeypatch.setattr(method, "_cpuinfo", lambda: None)
    assert method.describe_cpu() == "unknown CPU"
