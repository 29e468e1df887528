"""`engine serve`'s options, one row each: its name, its type (with its help) and its default.

A table rather than a signature: the command has an option for every knob a server starts with,
and a list that long is data, not logic. ``with_options`` hands it to typer as the command's
signature (typer reads ``inspect.signature``), so each row is an option exactly as a parameter
would be."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Annotated, Any

import typer

from cli.options import (
    AllowedHostsOpt,
    AllowedOriginsOpt,
    ApiKeyOpt,
    BackendOpt,
    CheckInvariantsOpt,
    CheckTimeoutOpt,
    ChunkTokensOpt,
    ClientConnOpt,
    ConsoleReceiptsOpt,
    CutoverTimeoutOpt,
    DeviceOpt,
    DrainOpt,
    DtypeOpt,
    EnforceEagerOpt,
    GrammarTimeoutOpt,
    GrammarWaitingOpt,
    GrammarWorkersOpt,
    GraphMaxBatchOpt,
    HostKvOpt,
    HostOpt,
    IterationIntervalOpt,
    KvFractionOpt,
    LogFileOpt,
    LoopStallOpt,
    MaxLenOpt,
    MaxRunningOpt,
    ModelOpt,
    OnOff,
    OtlpOpt,
    OverlapOpt,
    PageSizeOpt,
    PerRequestMetricsOpt,
    PidFileOpt,
    PolicyOpt,
    PrefixCacheOpt,
    QuantOpt,
    ReadTimeoutOpt,
    ReceiptsOpt,
    ReliefLadderOpt,
    RequestTimeoutOpt,
    SeedOpt,
    ServedNameOpt,
    SpecTokensOpt,
    SpeculativeOpt,
    StallOpt,
    StepTokensOpt,
    StoreBytesOpt,
    StoreDirOpt,
    StoredResponsesOpt,
    StorePinOpt,
    StoreWriteOpt,
    ThreadsOpt,
    ThrottleOpt,
)
from cli.ranks import (
    DistInitOpt,
    FloorOpt,
    GroupCheckOpt,
    GroupTimeoutOpt,
    KvOpt,
    PhaseDwellOpt,
    PhaseEnterOpt,
    PhaseExitOpt,
    PhaseIntervalOpt,
    PhasePolicyOpt,
    PpOpt,
    TpOpt,
)
from engine.config import DEFAULTS, SERVE_STEP_TOKENS

PortOpt = Annotated[int, typer.Option(help="TCP port.")]

SERVE: tuple[tuple[str, Any, Any], ...] = (
    ("model", ModelOpt, DEFAULTS["model"]),
    ("host", HostOpt, "127.0.0.1"),
    ("port", PortOpt, 8000),
    ("served_model_name", ServedNameOpt, None),
    ("api_key", ApiKeyOpt, None),
    ("dtype", DtypeOpt, DEFAULTS["dtype"]),
    ("quant", QuantOpt, DEFAULTS["quant"]),
    ("kv_tokens", KvOpt, DEFAULTS["kv_tokens"]),
    ("kv_memory_fraction", KvFractionOpt, DEFAULTS["kv_memory_fraction"]),
    ("page_size", PageSizeOpt, DEFAULTS["page_size"]),
    ("log_file", LogFileOpt, DEFAULTS["log_file"]),
    ("max_running", MaxRunningOpt, DEFAULTS["max_running"]),
    ("chunk_tokens", ChunkTokensOpt, DEFAULTS["chunk_tokens"]),
    ("step_tokens", StepTokensOpt, SERVE_STEP_TOKENS),  # serve's own (offline: no step budget)
    ("max_model_len", MaxLenOpt, DEFAULTS["max_model_len"]),
    ("prefix_cache", PrefixCacheOpt, DEFAULTS["prefix_cache"]),
    ("host_kv_tokens", HostKvOpt, DEFAULTS["host_kv_tokens"]),
    ("kv_store_dir", StoreDirOpt, DEFAULTS["kv_store_dir"]),
    ("kv_store_bytes", StoreBytesOpt, DEFAULTS["kv_store_bytes"]),
    ("kv_store_pin_bytes", StorePinOpt, DEFAULTS["kv_store_pin_bytes"]),
    ("kv_store_write", StoreWriteOpt, DEFAULTS["kv_store_write"]),
    ("relief_ladder", ReliefLadderOpt, OnOff.of(DEFAULTS["relief_ladder"])),
    ("relief_throttle_iterations", ThrottleOpt, DEFAULTS["relief_throttle_iterations"]),
    ("attention_backend", BackendOpt, DEFAULTS["attention_backend"]),
    ("device", DeviceOpt, DEFAULTS["device"]),
    ("threads", ThreadsOpt, DEFAULTS["threads"]),
    ("enforce_eager", EnforceEagerOpt, DEFAULTS["enforce_eager"]),
    ("cuda_graph_max_batch", GraphMaxBatchOpt, DEFAULTS["cuda_graph_max_batch"]),
    ("seed", SeedOpt, DEFAULTS["seed"]),
    ("iteration_receipt_interval", IterationIntervalOpt, DEFAULTS["iteration_receipt_interval"]),
    ("receipts", ReceiptsOpt, DEFAULTS["receipts"]),
    ("console_receipts", ConsoleReceiptsOpt, DEFAULTS["console_receipts"]),
    ("check_invariants", CheckInvariantsOpt, DEFAULTS["check_invariants"]),
    ("otlp_endpoint", OtlpOpt, DEFAULTS["otlp_endpoint"]),
    ("pid_file", PidFileOpt, None),
    ("drain_timeout", DrainOpt, 0.0),
    ("stall_timeout", StallOpt, 10.0),
    ("read_timeout", ReadTimeoutOpt, DEFAULTS["read_timeout"]),
    ("max_client_connections", ClientConnOpt, DEFAULTS["max_client_connections"]),
    ("request_timeout", RequestTimeoutOpt, DEFAULTS["request_timeout"]),
    ("loop_stall_timeout", LoopStallOpt, DEFAULTS["loop_stall_timeout"]),
    ("check_timeout", CheckTimeoutOpt, DEFAULTS["check_timeout"]),
    ("enable_per_request_metrics", PerRequestMetricsOpt, False),
    ("max_stored_responses", StoredResponsesOpt, DEFAULTS["max_stored_responses"]),
    ("allowed_hosts", AllowedHostsOpt, ""),
    ("allowed_origins", AllowedOriginsOpt, ""),
    ("cutover_timeout", CutoverTimeoutOpt, DEFAULTS["cutover_timeout"]),
    ("grammar_timeout", GrammarTimeoutOpt, DEFAULTS["grammar_timeout"]),
    ("grammar_workers", GrammarWorkersOpt, DEFAULTS["grammar_workers"]),
    ("grammar_waiting", GrammarWaitingOpt, DEFAULTS["grammar_waiting"]),
    ("scheduling_policy", PolicyOpt, DEFAULTS["scheduling_policy"]),
    ("speculative", SpeculativeOpt, DEFAULTS["speculative"]),
    ("spec_tokens", SpecTokensOpt, DEFAULTS["spec_tokens"]),
    ("overlap_schedule", OverlapOpt, DEFAULTS["overlap_schedule"]),
    ("tp", TpOpt, DEFAULTS["tp"]),
    ("pp", PpOpt, DEFAULTS["pp"]),
    ("dist_init", DistInitOpt, DEFAULTS["dist_init"]),
    ("group_check_interval", GroupCheckOpt, DEFAULTS["group_check_interval"]),
    ("group_timeout", GroupTimeoutOpt, DEFAULTS["group_timeout"]),
    ("published_floor", FloorOpt, DEFAULTS["published_floor"]),
    ("phase_policy", PhasePolicyOpt, DEFAULTS["phase_policy"]),
    ("phase_enter_pp", PhaseEnterOpt, DEFAULTS["phase_enter_pp"]),
    ("phase_exit_pp", PhaseExitOpt, DEFAULTS["phase_exit_pp"]),
    ("phase_dwell", PhaseDwellOpt, DEFAULTS["phase_dwell"]),
    ("phase_interval", PhaseIntervalOpt, DEFAULTS["phase_interval"]),
)


def with_options(table: tuple[tuple[str, Any, Any], ...]) -> Callable[[Callable], Callable]:
    """A command that takes ``**options`` gets ``table`` as its signature, keyword by keyword."""

    def give(command: Callable) -> Callable:
        params = [
            inspect.Parameter(
                name, inspect.Parameter.KEYWORD_ONLY, annotation=kind, default=default
            )
            for name, kind, default in table
        ]
        command.__signature__ = inspect.Signature(params, return_annotation=None)
        return command

    return give
