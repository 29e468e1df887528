"""The `engine` command's shared options, each declared once, so that a command's signature
reads one option a line; the engine's options take their help text (and, in the commands, their
defaults) from the config's fields (engine/config/__init__.py). ``config_of`` gathers a command's options
into the config; ``fail`` is the one way a command exits with an error."""

from __future__ import annotations

from collections.abc import Mapping
from enum import StrEnum
from typing import Annotated, Any

import typer

from engine.config import HELP, SECTION_OF, EngineConfig


def fail(msg: str, code: int = 2) -> None:
    """``error: MSG`` in red on stderr, then exit ``code`` (2: a bad option)."""
    typer.secho(f"error: {msg}", fg="red", err=True)
    raise typer.Exit(code)


ModelOpt = Annotated[str | None, typer.Option("--model", "-m", help=HELP["model"])]
DtypeOpt = Annotated[str, typer.Option("--dtype", help=HELP["dtype"])]
QuantOpt = Annotated[str | None, typer.Option("--quant", help=HELP["quant"])]
BackendOpt = Annotated[str, typer.Option("--attention-backend", help=HELP["attention_backend"])]
DeviceOpt = Annotated[str, typer.Option("--device", help=HELP["device"])]

# serve's longer options, named here so that its signature reads one option a line
HostOpt = Annotated[
    str,
    typer.Option(
        help="Address to bind; loopback unless you mean otherwise. A Host of it is served; a DNS "
        "name clients use for it needs --allowed-hosts."
    ),
]
ServedNameOpt = Annotated[
    str | None, typer.Option(help="Model id clients send. Default: the file's name.")
]
ApiKeyOpt = Annotated[
    str | None,
    typer.Option(
        help="Require `Authorization: Bearer KEY` on every route but /health: the API, /admin, "
        "/docs, /openapi.json and /metrics too (a Prometheus scrape sends it with "
        "`authorization: {credentials: KEY}`).",
        envvar="ATTEST_API_KEY",
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
ReadTimeoutOpt = Annotated[float, typer.Option(help=HELP["read_timeout"])]
ClientConnOpt = Annotated[int, typer.Option(help=HELP["max_client_connections"])]
RequestTimeoutOpt = Annotated[float, typer.Option(help=HELP["request_timeout"])]
LoopStallOpt = Annotated[float, typer.Option(help=HELP["loop_stall_timeout"])]
CheckTimeoutOpt = Annotated[float, typer.Option(help=HELP["check_timeout"])]
PerRequestMetricsOpt = Annotated[
    bool, typer.Option("--enable-per-request-metrics", help=HELP["enable_per_request_metrics"])
]
StoredResponsesOpt = Annotated[int, typer.Option(help=HELP["max_stored_responses"])]
AllowedHostsOpt = Annotated[str, typer.Option(help=HELP["allowed_hosts"])]
AllowedOriginsOpt = Annotated[str, typer.Option(help=HELP["allowed_origins"])]
CutoverTimeoutOpt = Annotated[float, typer.Option(help=HELP["cutover_timeout"])]
GrammarTimeoutOpt = Annotated[float, typer.Option(help=HELP["grammar_timeout"])]
GrammarWorkersOpt = Annotated[int, typer.Option(help=HELP["grammar_workers"])]
GrammarWaitingOpt = Annotated[int, typer.Option(help=HELP["grammar_waiting"])]
PolicyOpt = Annotated[str, typer.Option(help=HELP["scheduling_policy"])]
SpeculativeOpt = Annotated[str, typer.Option(help=HELP["speculative"])]
SpecTokensOpt = Annotated[int, typer.Option(help=HELP["spec_tokens"])]
OverlapOpt = Annotated[bool, typer.Option(help=HELP["overlap_schedule"])]
KvFractionOpt = Annotated[float, typer.Option(help=HELP["kv_memory_fraction"])]
PageSizeOpt = Annotated[int, typer.Option(help=HELP["page_size"])]
LogFileOpt = Annotated[
    str | None,
    typer.Option(help=HELP["log_file"] + " Default: logs/boot-<UTC time>.jsonl."),
]
MaxRunningOpt = Annotated[int, typer.Option(help=HELP["max_running"])]
ChunkTokensOpt = Annotated[int, typer.Option(help=HELP["chunk_tokens"])]
MaxLenOpt = Annotated[int | None, typer.Option(help=HELP["max_model_len"])]
StepTokensOpt = Annotated[int, typer.Option(help=HELP["step_tokens"])]
PrefixCacheOpt = Annotated[bool, typer.Option(help=HELP["prefix_cache"])]
HostKvOpt = Annotated[int | None, typer.Option(help=HELP["host_kv_tokens"])]
StoreDirOpt = Annotated[str | None, typer.Option(help=HELP["kv_store_dir"])]
StoreBytesOpt = Annotated[int | None, typer.Option(help=HELP["kv_store_bytes"])]
StorePinOpt = Annotated[int | None, typer.Option(help=HELP["kv_store_pin_bytes"])]
StoreWriteOpt = Annotated[str, typer.Option(help=HELP["kv_store_write"])]
ThreadsOpt = Annotated[int | None, typer.Option(help=HELP["threads"])]
EnforceEagerOpt = Annotated[bool, typer.Option(help=HELP["enforce_eager"])]
GraphMaxBatchOpt = Annotated[int | None, typer.Option(help=HELP["cuda_graph_max_batch"])]
SeedOpt = Annotated[int, typer.Option(help=HELP["seed"])]
ReceiptsOpt = Annotated[bool, typer.Option(help=HELP["receipts"])]


class OnOff(StrEnum):
    on = "on"
    off = "off"

    @classmethod
    def of(cls, on: bool) -> OnOff:
        return cls.on if on else cls.off


ThrottleOpt = Annotated[int, typer.Option(help=HELP["relief_throttle_iterations"])]
ReliefLadderOpt = Annotated[OnOff, typer.Option(help=HELP["relief_ladder"])]
IterationIntervalOpt = Annotated[int, typer.Option(help=HELP["iteration_receipt_interval"])]
ConsoleReceiptsOpt = Annotated[bool, typer.Option(help=HELP["console_receipts"])]
CheckInvariantsOpt = Annotated[bool, typer.Option(help=HELP["check_invariants"])]
OtlpOpt = Annotated[str | None, typer.Option(help=HELP["otlp_endpoint"])]


def config_of(options: Mapping[str, Any]) -> EngineConfig:
    """The engine's configuration from a command's options, those named as its fields, with
    the command line's spellings undone: --kv-tokens's commas, 0 for no step budget and no
    deadline, on/off for the relief ladder, the commas of the allowed hosts and origins. A bad
    value is a ValueError naming it."""
    from cli.ranks import kv_tokens

    kw = {name: value for name, value in options.items() if name in SECTION_OF}
    if "kv_tokens" in kw:
        kw["kv_tokens"] = kv_tokens(kw["kv_tokens"])
    for name in ("step_tokens", "request_timeout"):
        if name in kw:
            kw[name] = kw[name] or None
    for name in ("allowed_hosts", "allowed_origins"):
        if isinstance(kw.get(name), str):
            kw[name] = tuple(x.strip() for x in kw[name].split(",") if x.strip())
    if "relief_ladder" in kw:
        kw["relief_ladder"] = kw["relief_ladder"] == OnOff.on
    return EngineConfig.from_kwargs(**kw)
