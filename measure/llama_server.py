"""llama.cpp's own HTTP server (`llama-server`), the peer the online comparison runs against: it
batches requests continuously over ``--parallel`` slots, where llama-cpp-python's Python server
takes one request at a time.

It is built on demand, never by `make setup`: the llama.cpp sources vendored in
llama-cpp-python's source distribution (the same pin as the offline arm, so both arms run one
llama.cpp), configured with cmake for this CPU (``GGML_NATIVE``, less AMX: ``llamacpp.NO_AMX``) and only the server target built:
about 5 minutes on two cores, once.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tarfile
from pathlib import Path

from measure.llamacpp import NO_AMX, PIN
from measure.peer_worker import LoopbackServer

ROOT = Path("build/llama-server")


class MissingServer(RuntimeError):
    """llama-server is not built; the message says how to build it."""


def binary(root: str | Path = ROOT) -> Path:
    return Path(root) / "build" / "bin" / "llama-server"


def check(root: str | Path = ROOT) -> Path:
    exe = binary(root)
    if not os.access(exe, os.X_OK):
        raise MissingServer(
            f"llama-server is not built ({exe} is missing); build it once with "
            f"`.venv/bin/python bench/serve_vs.py --build-llama-server` (cmake, about 5 min)"
        )
    return exe


def build(root: str | Path = ROOT) -> Path:
    """Fetch the source distribution, build the server target; the binary's path."""
    root = Path(root)
    src = root / "src"
    src.mkdir(parents=True, exist_ok=True)
    if not list(src.glob("*.tar.gz")):
        subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "download",
                "--no-deps",
                "--no-binary",
                ":all:",
                PIN,
                "-d",
                str(src),
            ],
            check=True,
        )
    [archive] = src.glob("*.tar.gz")
    tree = src / archive.name.removesuffix(".tar.gz")
    if not tree.is_dir():
        with tarfile.open(archive) as t:
            t.extractall(src, filter="data")
    cmake = [
        "cmake",
        "-S",
        str(tree / "vendor" / "llama.cpp"),
        "-B",
        str(root / "build"),
        "-DCMAKE_BUILD_TYPE=Release",
        "-DLLAMA_BUILD_SERVER=ON",
        "-DLLAMA_BUILD_TESTS=OFF",
        "-DLLAMA_BUILD_EXAMPLES=OFF",
        "-DLLAMA_CURL=OFF",
        "-DGGML_NATIVE=ON",
        f"-DCMAKE_C_FLAGS={NO_AMX}",
        f"-DCMAKE_CXX_FLAGS={NO_AMX}",
    ]
    subprocess.run(cmake, check=True)
    jobs = str(os.cpu_count() or 2)
    subprocess.run(
        ["cmake", "--build", str(root / "build"), "--target", "llama-server", "-j", jobs],
        check=True,
    )
    return check(root)


class LlamaServer(LoopbackServer):
    """A running llama-server on loopback: ``slots`` parallel sequences of ``ctx`` tokens each,
    ``threads`` threads, the model's GGUF file. ``base`` is its URL once healthy."""

    def __init__(
        self,
        exe: Path,
        model: str,
        port: int,
        slots: int,
        ctx: int,
        threads: int,
        log: Path,
        ready_timeout: float = 300,
    ) -> None:
        cmd = [
            str(exe),
            "-m",
            model,
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--parallel",
            str(slots),
            "-c",
            str(slots * ctx),
            "-t",
            str(threads),
            "-tb",
            str(threads),
        ]
        super().__init__(cmd, port, log, ready_timeout, "llama-server")
