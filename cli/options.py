"""The `engine` command's shared options, each declared once with its help text, so that a
command's signature reads one option a line; and the one way a command exits with an error."""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated

import typer


def fail(msg: str, code: int = 2) -> None:
    """``error: MSG`` in red on stderr, then exit ``code`` (2: a bad option)."""
    typer.secho(f"error: {msg}", fg="red", err=True)
    raise typer.Exit(code)


ModelOpt = Annotated[
    str | None,
    typer.Option(
        "--model", "-m", help="GGUF file or Hugging Face folder. Default: SmolLM2-135M-Instruct."
    ),
]
DtypeOpt = Annotated[str, typer.Option("--dtype", help="float32 (exact) or bfloat16 (faster).")]
QuantOpt = Annotated[
    str | None,
    typer.Option(
        "--quant",
        help="Fast mode: int8 or int4 weights, quantised at load; bfloat16 activations where the "
        "CPU has bfloat16 units (then --dtype does not apply). Default: off (exact mode).",
    ),
]
BackendOpt = Annotated[
    str,
    typer.Option(
        "--attention-backend",
        help="Attention kernels: auto (torch; on CUDA a faster one only once bench/gpu_check.py "
        "has verified it on a GPU), torch, torch-padded (its older decode path, to compare), "
        "triton (CPU only with TRITON_INTERPRET=1) or "
        "flashinfer (CUDA, bfloat16).",
    ),
]
DeviceOpt = Annotated[
    str, typer.Option("--device", help="cpu, cuda or cuda:N (off the CPU, give --kv-tokens).")
]

# serve's longer options, named here so that its signature reads one option a line
HostOpt = Annotated[str, typer.Option(help="Address to bind; loopback unless you mean otherwise.")]
ServedNameOpt = Annotated[
    str | None, typer.Option(help="Model id clients send. Default: the file's name.")
]
ApiKeyOpt = Annotated[
    str | None,
    typer.Option(
        help="Require `Authorization: Bearer KEY` on /v1/* and /admin/*.", envvar="ATTEST_API_KEY"
    ),
]
PidFileOpt = Annotated[
    str | None,
    typer.Option(help="Pid file held while serving. Default: the boot log's path + .pid."),
]
DrainOpt = Annotated[
    float,
    typer.Option(
        help="On SIGTERM/SIGINT, let requests in flight finish for up to this many seconds, "
        "then abort the rest; 0: abort at once."
    ),
]
StallOpt = Annotated[
    float,
    typer.Option(help="/health answers 503 after this many seconds without a scheduler heartbeat."),
]
ReadTimeoutOpt = Annotated[
    float,
    typer.Option(help="Seconds a client may take to send a request's headers, then its body."),
]
ClientConnOpt = Annotated[
    int, typer.Option(help="Connections one client address may hold open at once; 0: no cap.")
]
RequestTimeoutOpt = Annotated[
    float,
    typer.Option(help="Seconds from a request's arrival to its last token, then it is aborted "
                 "(504); 0: no deadline."),
]  # fmt: skip
KvFractionOpt = Annotated[
    float,
    typer.Option(help="Share of available memory for the KV pool when --kv-tokens is not given."),
]
LogFileOpt = Annotated[
    str | None,
    typer.Option(help="Boot log of JSON receipts. Default: logs/boot-<UTC time>.jsonl."),
]
MaxLenOpt = Annotated[int | None, typer.Option(help="Context limit (default: the model's).")]
StepTokensOpt = Annotated[
    int,
    typer.Option(
        help="Tokens one forward may hold: a decode token per decoding request, then prefill "
        "chunks in what is left (the first at least as many as the decodes, so prompts "
        "always move). "
        "Bounds the inter-token latency a long prompt adds (bench/serve.py --mixed measures "
        "it); 0: no step budget."
    ),
]
PrefixCacheOpt = Annotated[bool, typer.Option(help="Reuse cached prompt prefixes (radix cache).")]
HostKvOpt = Annotated[
    int | None,
    typer.Option(
        help="Host KV tier in tokens: cold cached prefixes spill there instead of being dropped "
        "and load back on a hit. 0: off. Default: off on the CPU, a share of host memory "
        "(bounded by the cgroup limit) on CUDA."
    ),
]


class OnOff(StrEnum):
    on = "on"
    off = "off"


ThrottleOpt = Annotated[
    int, typer.Option(help="Iterations the throttle rung keeps new admissions out once it pays.")
]
ReliefLadderOpt = Annotated[
    OnOff,
    typer.Option(
        help="on: the relief ladder (evict, spill, throttle, retract) pays before admission "
        "parks; off: no rung is registered (and the boot log says so once)."
    ),
]
IterationIntervalOpt = Annotated[
    int, typer.Option(help="An `iteration` summary receipt every N steps; 0: off.")
]
ConsoleReceiptsOpt = Annotated[bool, typer.Option(help="Also print receipts, pretty, on stderr.")]
CheckInvariantsOpt = Annotated[
    bool, typer.Option(help="Check the memory ledger after every step (slow; for tests).")
]
OtlpOpt = Annotated[
    str | None,
    typer.Option(
        help="Export OpenTelemetry traces over OTLP/HTTP to this collector base URL "
        "(e.g. http://127.0.0.1:4318). Default: the OTEL_EXPORTER_OTLP_* variables; "
        "neither: tracing is off."
    ),
]
