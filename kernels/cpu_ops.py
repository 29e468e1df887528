"""The native CPU ops (``kernels/cpu_ops.cpp``): built at install time, loaded when present.

``make`` runs ``python -m kernels.cpu_ops build``, which compiles the source with torch's extension
tooling into ``build/cpu_ops/<key>/``. The key covers the source, torch's version and the CPU's
flags: the library is built for the CPU it runs on (``-march=native``), and this machine kind's
CPU changes from one day to the next, so a library built for another CPU is never loaded; the
next ``make`` builds one for this CPU. At run time ``load()`` only loads a built library, it never
compiles (a minute of a boot); without one the engine runs the same operations in Python
(``engine.model.fused``, ``kernels.paged_decode``) and ``why_not()`` says why.
``ATTEST_NATIVE_OPS=0`` in the environment turns them off (to measure against, or to rule them
out).

    python -m kernels.cpu_ops build   # compile for this CPU (a no-op when built)
    python -m kernels.cpu_ops status  # built or not, and where
"""

from __future__ import annotations

import hashlib
import os
import platform
import sys
from functools import cache
from pathlib import Path

import torch

SOURCE = Path(__file__).with_name("cpu_ops.cpp")
# compiled into one library; the key covers them all
SOURCES = (
    SOURCE,
    *(
        SOURCE.with_name(n)
        for n in (
            "cpu_step.cpp",
            "cpu_int.cpp",
            "cpu_extend.cpp",
            "cpu_dense.cpp",
            "cpu_dense_vec.cpp",
            "cpu_ops.h",
        )
    ),
)
NAME = "attest_cpu_ops"
# no fused multiply-adds: the elementwise ops keep the Python ops' roundings (see the source);
# OpenMP: at::parallel_for is inline and runs serially without it
CFLAGS = ["-O3", "-march=native", "-ffp-contract=off", "-fopenmp"]
ROOT = Path(__file__).resolve().parents[1] / "build" / "cpu_ops"


def cpu_flags() -> frozenset[str]:
    """The CPU's feature flags from /proc/cpuinfo (empty where there is none)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return frozenset(line.split(":", 1)[1].split())
    except OSError:
        pass
    return frozenset()


@cache
def vector_512() -> bool:
    """Whether the library's AVX-512 kernels are in it: it is built for this CPU, so they are
    where the CPU has AVX-512 (the native extend kernel has no other form)."""
    return "avx512f" in cpu_flags()


def build_dir() -> Path:
    key = hashlib.sha256()
    cpu = " ".join(sorted(cpu_flags())) or platform.machine()
    for part in (
        *(p.read_bytes() for p in SOURCES),
        torch.__version__.encode(),
        cpu.encode(),
        " ".join(CFLAGS).encode(),
    ):
        key.update(part + b"\0")
    return ROOT / key.hexdigest()[:16]


def library_path() -> Path:
    return build_dir() / f"{NAME}.so"


@cache
def why_not() -> str | None:
    """Why the native ops are not in use (None: ``torch.ops.attest.*`` is registered from the
    library built for this CPU). Decided once a process."""
    if os.environ.get("ATTEST_NATIVE_OPS", "").strip() == "0":
        return "native CPU ops turned off (ATTEST_NATIVE_OPS=0)"
    path = library_path()
    if not path.exists():
        return f"native CPU ops not built for this CPU ({path.parent.name}): run `make`"
    try:
        torch.ops.load_library(str(path))
    except (OSError, RuntimeError) as e:
        return f"native CPU ops did not load: {e}"
    return None


def load() -> bool:
    """Whether ``torch.ops.attest.*`` runs here (``why_not()`` says why not)."""
    return why_not() is None


# the ways a bfloat16 prefill chunk's attention can run, the most a CPU runs first
EXTEND_BF16_WAYS = ("tiles", "pairs", "loops")


def extend_ways() -> list[str]:
    """The ways of ``EXTEND_BF16_WAYS`` this CPU runs a bfloat16 prefill chunk's attention in
    (``attest::set_extend_way`` refuses the others; ``kernels/cpu_extend.cpp``); none where the
    native ops are not loaded."""
    if not load():
        return []
    was, ways = torch.ops.attest.extend_way(), []
    for way in EXTEND_BF16_WAYS:
        try:
            torch.ops.attest.set_extend_way(way)
        except RuntimeError:
            continue
        ways.append(way)
    torch.ops.attest.set_extend_way(was)
    return ways


def build(verbose: bool = False) -> Path:
    """Compile the library for this CPU into ``build_dir()`` (torch's ninja build; a no-op when
    it is there). Raises what the compiler said when it fails."""
    from torch.utils import cpp_extension

    out = build_dir()
    if (out / f"{NAME}.so").exists():
        return out / f"{NAME}.so"
    out.mkdir(parents=True, exist_ok=True)
    cpp_extension.load(
        name=NAME,
        sources=[str(p) for p in SOURCES if p.suffix == ".cpp"],
        extra_cflags=CFLAGS,
        build_directory=str(out),
        is_python_module=False,
        verbose=verbose,
    )
    return out / f"{NAME}.so"


def main(argv: list[str]) -> int:
    cmd = argv[0] if argv else "status"
    if cmd == "build":
        try:
            path = build(verbose="-v" in argv)
        except Exception as e:  # noqa: BLE001 - any compiler failure: say it, the engine runs on
            print(
                f"native CPU ops not built ({type(e).__name__}: {str(e)[-2000:]}); the engine "
                "will run its Python ops",
                file=sys.stderr,
            )
            return 0
        print(f"native CPU ops: {path}")
        return 0
    if cmd == "status":
        print(f"native CPU ops: {library_path() if load() else why_not()}")
        return 0
    print("usage: python -m kernels.cpu_ops [build [-v] | status]", file=sys.stderr)
    return 64


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
