"""llama.cpp's arm, from this side: its environment (a virtualenv of its own, created on demand,
never by `make setup`: installing llama-cpp-python compiles llama.cpp, about 4 minutes on two
cores), and the worker process that runs in it (measure/llamacpp_worker.py), spoken to
one JSON line at a time."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from measure.peer_worker import PeerWorker, env_python, env_version

PIN = "llama-cpp-python==0.3.36"
# llama.cpp is built for this CPU less its AMX tile instructions: on a CPU that reports them (an
# Intel Xeon with amx_tile, amx_int8), llama-server's AMX matrix kernel died of an illegal
# instruction (`tilezero`, in its first decode). An explicit -mno-* outlasts -march=native in GCC.
NO_AMX = "-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
WORKER = Path(__file__).with_name("llamacpp_worker.py")


def install_commands(env: str | Path) -> list[list[str]]:
    return [
        [sys.executable, "-m", "venv", str(env)],
        [str(Path(env) / "bin" / "pip"), "install", PIN],
    ]


def cmake_flags() -> str:
    """What llama.cpp's build is given (through CMAKE_ARGS): this CPU less its AMX kernels."""
    return f"-DCMAKE_C_FLAGS='{NO_AMX}' -DCMAKE_CXX_FLAGS='{NO_AMX}'"


def missing_env_message(env: str | Path, why: str) -> str:
    make, pip = (" ".join(c).replace(sys.executable, "python3") for c in install_commands(env))
    steps = f'{make} && CMAKE_ARGS="{cmake_flags()}" {pip}'
    return (
        f"llama.cpp's environment {env} {why}. Create it once with "
        f"`engine bench --table --install-llamacpp --llamacpp-env {env}` (it compiles llama.cpp: "
        f"about 4 minutes, both cores busy), or by hand: {steps}. "
        "Or leave llama.cpp out: --engines attest,transformers."
    )


def check_env(env: str | Path) -> str:
    """llama-cpp-python's version in ``env``; MissingEnv when it is not there."""
    code = "import llama_cpp, numpy; print(llama_cpp.__version__)"
    return env_version(env, "llama_cpp", code, missing_env_message)


def install(env: str | Path) -> str:
    """Create ``env`` and install llama-cpp-python into it (llama.cpp compiled for this CPU less
    its AMX kernels, ``NO_AMX``); its version once it imports."""
    flags = cmake_flags()
    cmake = {**os.environ, "CMAKE_ARGS": f"{os.environ.get('CMAKE_ARGS', '')} {flags}".strip()}
    for cmd in install_commands(env):
        subprocess.run(cmd, check=True, env=cmake)
    return check_env(env)


class LlamaCppWorker(PeerWorker):
    """The worker process in llama.cpp's environment, the model loaded; ``generate`` is the
    method's ``go`` (measure/method.py): llama.cpp's own time for one batched generate.
    ``info`` says what runs: version, prefill strategy, KV layout, llama.cpp's CPU features."""

    name = "llama.cpp"

    def __init__(self, env: str | Path, model: str, threads: int, flash_attn: bool = True) -> None:
        check_env(env)
        self.threads, self.flash_attn = threads, flash_attn
        load = {"op": "load", "model": model, "threads": threads, "flash_attn": flash_attn}
        super().__init__(env_python(env), WORKER, load)

    def generate(self, prompts: list[list[int]], new: int) -> float:
        ans = self._ask({"op": "generate", "prompts": prompts, "new": new})
        self.tokens: list[list[int]] = ans["tokens"]  # the last generate's, for checks
        assert [len(t) for t in self.tokens] == [new] * len(prompts)
        return ans["seconds"]

    def lookup(self, prompt: list[int], new: int, draft: int) -> tuple[float, list[int]]:
        """One greedy stream through llama-cpp-python's prompt-lookup decoding (``draft``
        tokens a step; 0: none): its decode seconds (first token to last) and tokens."""
        ans = self._ask({"op": "lookup", "prompt": prompt, "new": new, "draft": draft})
        return ans["seconds"], ans["tokens"]
