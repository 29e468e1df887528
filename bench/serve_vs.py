"""Online, side by side: guidellm (a real load generator) against `engine serve` and against a
peer's server, llama.cpp's own (`--peer llamacpp`, the default) or vLLM's CPU build's
OpenAI-compatible server (`--peer vllm`), same weights, same CPUs, one server after the other,
at each concurrency: output tok/s, TTFT and ITL p50/p99, and Attest's ratio over the peer per
row.

Both servers get the same requests: guidellm's synthetic text completions (the same seed, and
the served model's own tokenizer, exported for guidellm from the GGUF file into one folder both
runs read) of --prompt-tokens tokens asking --output-tokens tokens (guidellm sends ignore_eos),
streamed. llama-server runs --parallel slots of the concurrency's size (its continuous
batching); vLLM's server reads the Hugging Face folder made once from the GGUF file
(measure/vllm_cpu.py), in --dtype, prefix caching off, --max-num-seqs at least the concurrency,
its OpenMP threads on every CPU this process may use; the engine runs its default scheduler with
--max-running at least as many (in --dtype too when the peer is vLLM and --quant is exact).

guidellm and the peers are made on demand, never by `make setup`: `engine client-env guidellm`
(about 30 s), --build-llama-server (llama.cpp's sources from llama-cpp-python's source
distribution, cmake, about 5 minutes), `engine bench --install-vllm` (about 2 minutes; its
server compiles for a minute or two per batch shape on first use).

    .venv/bin/python bench/serve_vs.py [--peer llamacpp|vllm] [--concurrency 1,4,16]
        [--quant int4] [--dtype float32] [--threads 2] [--prompt-tokens 128]
        [--output-tokens 64] [--requests 3] [--build-llama-server]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from cpuinfo import describe  # noqa: E402  (bench/cpuinfo.py, beside this script)

from measure import llama_server, vllm_cpu  # noqa: E402
from measure.clients import bin_path, ensure  # noqa: E402
from measure.online import guidellm_command, read_report, table  # noqa: E402
from tests.e2e.server_proc import ServerProc, free_port  # noqa: E402


def tokenizer_folder(model: str, out: Path) -> Path:
    """The GGUF file's tokenizer as a Hugging Face folder, for guidellm's synthetic prompts."""
    from engine.model.loader import load_model

    tok = load_model(model).tokenizer
    out.mkdir(parents=True, exist_ok=True)
    tok.backend.save(str(out / "tokenizer.json"))
    name = lambda tid: tok.token_text(tid) if tid is not None else None  # noqa: E731
    (out / "tokenizer_config.json").write_text(
        json.dumps(
            {
                "tokenizer_class": "PreTrainedTokenizerFast",
                "bos_token": name(tok.bos_id),
                "eos_token": name(tok.eos_id),
                "model_max_length": 1 << 20,
            }
        )
    )
    return out


def load(guidellm: Path, base: str, args, c: int, tok: Path, out: Path, server: str):
    report = out / f"{server}-{c}.json"
    cmd = guidellm_command(
        guidellm, base, c, args.requests * c, args.prompt_tokens, args.output_tokens, tok, report
    )
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HOME": str(out / "hf-home")}
    with open(out / f"{server}-{c}.guidellm.txt", "w") as log:
        subprocess.run(cmd, check=True, stdout=log, stderr=subprocess.STDOUT, env=env)
    level = read_report(report, server, c)
    print(
        f"  {server} at {c}: {level.requests} ok, {level.errors} errors, "
        f"{level.out_tok_s:.1f} tok/s, TTFT p50 {level.ttft_ms[0]:.0f} ms",
        flush=True,
    )
    return level


def args_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--peer", choices=("llamacpp", "vllm"), default="llamacpp")
    ap.add_argument("--concurrency", default="1,4,16")
    ap.add_argument("--quant", default="int4", help="the engine's fast mode (or exact)")
    ap.add_argument(
        "--dtype",
        choices=("float32", "bfloat16"),
        default="float32",
        help="--peer vllm: vLLM's dtype, and the engine's when --quant is exact",
    )
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--prompt-tokens", type=int, default=128)
    ap.add_argument("--output-tokens", type=int, default=64)
    ap.add_argument("--requests", type=int, default=3, help="requests per stream, per level")
    ap.add_argument("--model", default=None, help="a GGUF file (default: the default model)")
    ap.add_argument("--out", default="bench/out/serve_vs")
    ap.add_argument("--build-llama-server", action="store_true")
    ap.add_argument("--vllm-env", default=str(vllm_cpu.ENV))
    return ap


class Peer:
    """The peer's server, started per concurrency: its row name and what ran."""

    def __init__(self, args, model: str, ctx: int) -> None:
        self.args, self.model, self.ctx = args, model, ctx
        if args.peer == "llamacpp":
            self.name = "llama.cpp"
            self.exe = llama_server.build() if args.build_llama_server else llama_server.check()
            self.what = f"llama-server {self.exe}"
        else:
            self.name = f"vLLM {args.dtype}"
            version = vllm_cpu.check_env(args.vllm_env)
            self.folder = vllm_cpu.hf_folder(model)
            env = " ".join(f"{k}={v}" for k, v in vllm_cpu.cpu_env(2).items())
            self.what = f"vllm-cpu {version} ({vllm_cpu.SERVER_MODULE}, {args.dtype}, {env})"

    def start(self, c: int, out: Path):
        if self.args.peer == "llamacpp":
            log = out / f"llama-server-{c}.log"
            return llama_server.LlamaServer(
                self.exe, self.model, free_port(), c, self.ctx, self.args.threads, log
            )
        return vllm_cpu.VllmServer(
            self.args.vllm_env,
            self.folder,
            free_port(),
            self.args.dtype,
            max(c, 8),
            self.ctx,
            out / f"vllm-{c}.log",
        )


def attest_flags(args, model: str, c: int, ctx: int) -> list[str]:
    flags = [
        "--model",
        model,
        "--threads",
        str(args.threads),
        "--max-running",
        str(max(c, 8)),
        "--kv-tokens",
        str(max(c, 8) * ctx),
        "--speculative",
        "off",
    ]
    if args.quant != "exact":
        flags += ["--quant", args.quant]
    elif args.peer == "vllm":
        flags += ["--dtype", args.dtype]
    return flags


def main() -> None:
    args = args_parser().parse_args()
    from engine.model.loader import resolve_model_path

    model = resolve_model_path(args.model)
    levels_c = [int(x) for x in args.concurrency.split(",")]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    ctx = args.prompt_tokens + args.output_tokens + 64
    peer = Peer(args, model, ctx)
    print(f"guidellm {ensure('guidellm')}; {peer.what}", flush=True)
    guidellm = bin_path("guidellm", "guidellm")
    tok = tokenizer_folder(model, out / "tokenizer")
    levels = []
    load_before = os.getloadavg()[0]
    for c in levels_c:  # one server at a time, never both
        srv = peer.start(c, out)
        try:
            levels.append(load(guidellm, srv.base, args, c, tok, out, peer.name))
        finally:
            srv.stop()
        ours = ServerProc(out / f"attest-{c}.jsonl", *attest_flags(args, model, c, ctx))
        try:
            levels.append(load(guidellm, ours.base, args, c, tok, out, "attest"))
        finally:
            ours.stop()
    print(f"\ncpu: {describe()}")
    how = f"--quant {args.quant}" if args.quant != "exact" else f"exact, {args.dtype}"
    print(
        f"load average before/after: {load_before:.2f}/{os.getloadavg()[0]:.2f}; model "
        f"{Path(model).name}; attest {how}; threads {args.threads}; prompt "
        f"{args.prompt_tokens}, output {args.output_tokens} tokens; {args.requests} requests "
        "per stream"
    )
    print(table(levels, "attest", peer.name))


if __name__ == "__main__":
    main()
