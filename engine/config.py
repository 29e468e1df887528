"""EngineConfig: every knob, validated once, shared by the CLI and ``LLM(...)``."""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any

DTYPES = ("float32", "bfloat16")
QUANTS = ("int8", "int4")  # fast mode's weight formats (engine/model/quant.py)
DIST_INITS = ("spawn", "env")
# `engine serve`'s step budget (--step-tokens): of 32, 48, 64 and 96, the one that kept eight
# streams' inter-token p99 within 3x their p50 with long prompts arriving (bench/serve.py
# --mixed; BENCHMARKS.md, 2026-12-01). Offline (LLM) the default is no budget: generate returns
# whole outputs, nobody waits on a next token, and the budget halved a 32-prompt burst's tok/s.
SERVE_STEP_TOKENS = 32


def _per_rank(v: Any, tp: int) -> bool:
    """One pool size per rank, each an integer >= 1."""
    if not isinstance(v, (list, tuple)) or len(v) != tp or tp < 2:
        return False
    return all(isinstance(x, int) and not isinstance(x, bool) and x >= 1 for x in v)


def _http_url(v: Any) -> bool:
    from urllib.parse import urlsplit

    if not isinstance(v, str):
        return False
    try:
        u = urlsplit(v)
        u.port  # noqa: B018 (raises on a malformed port)
    except ValueError:
        return False
    return u.scheme in ("http", "https") and bool(u.hostname)


def _seconds(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and 0 < v < float("inf")


@dataclass(slots=True)
class EngineConfig:
    model: str | None = None  # GGUF file or HF folder; None: the default model
    dtype: str = "float32"  # float32 is the exact mode; bfloat16 is about 2x faster here
    # fast mode: linear weights quantised at load (int8, or int4 in groups of 64/128), bfloat16
    # activations where the CPU has bfloat16 units (the dtype is then chosen by the mode)
    quant: str | None = None
    # KV pool size in tokens; None: a share of free memory; with several ranks, one size per
    # rank may be given ([2048, 1536]: each rank its own pool, as uneven devices have)
    kv_tokens: int | list[int] | None = None
    kv_memory_fraction: float = 0.2  # that share, when kv_tokens is None
    page_size: int = 1  # KV slots per page
    max_running: int = 64  # requests decoding at once
    chunk_tokens: int = 2048  # prefill tokens per step (longer prompts are chunked)
    # tokens one forward may hold: a decode token per decoding request, then prefill chunks in
    # what is left (the first chunk at least as many as the decodes); None: no budget (served:
    # SERVE_STEP_TOKENS unless --step-tokens says otherwise)
    step_tokens: int | None = None
    max_model_len: int | None = None  # context limit; None: the model's own
    attention_backend: str = "auto"  # auto: torch on CPU, the best one that runs on CUDA
    threads: int | None = None  # torch intra-op threads; None: engine/threads.py chooses
    seed: int = 0  # seed of the shared generator used by unseeded sampling requests
    prefix_cache: bool = True  # reuse cached prefixes through the radix cache
    # host KV tier in tokens (cold prefix KV spills there and loads back on a hit); 0: off;
    # None: off on the CPU, a share of host memory (bounded by the cgroup limit) on CUDA
    host_kv_tokens: int | None = None
    relief_ladder: bool = True  # evict -> spill -> throttle -> retract; False: no rung registered
    relief_throttle_iterations: int = 8  # how long the throttle rung closes the line
    iteration_receipt_interval: int = 50  # an `iteration` summary receipt every N steps; 0: off
    check_invariants: bool = False  # check the ledger after every step and raise (tests)
    receipts: bool = True  # False: write no receipts at all (for the on/off benchmark)
    log_file: str | None = None  # boot log (JSON receipts); None: receipts kept in memory only
    console_receipts: bool = False  # also print receipts, pretty, on stderr
    device: str = "cpu"  # where weights, KV pool and attention run: cpu, cuda or cuda:N
    # OTLP/HTTP collector base URL for traces; None: the OTEL_* variables decide (off if unset)
    otlp_endpoint: str | None = None
    # the HTTP frontend's limits: seconds a client may take to send a request's headers, then its
    # body; connections one client address may hold open (0: no cap); seconds from a request's
    # arrival to its last token, past which it is aborted (None: no deadline)
    read_timeout: float = 30.0
    max_client_connections: int = 128
    request_timeout: float | None = 600.0
    # tensor parallelism: ranks, each holding a shard of the weights and its own KV pool; they
    # run the same scheduler on the same inputs and decide from the published floor
    tp: int = 1
    # "spawn": rank 0 starts the other ranks on this machine; "env": each rank is started on its
    # own (torchrun, or one command per node) and MASTER_ADDR, MASTER_PORT, WORLD_SIZE, RANK say
    # who is who
    dist_init: str = "spawn"
    group_timeout: float = 30.0  # seconds a collective waits for a rank that stopped answering
    # every N iterations the ranks compare their batch digests (an all-gather before the
    # forward); in check mode, every iteration
    group_check_interval: int = 16
    # False makes admission read this rank's own pool instead of the published floor: a test
    # switch that splits a group with uneven pools (it exists to prove the split is caught)
    published_floor: bool = True

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        def need(ok: bool, field: str, rule: str) -> None:
            if not ok:
                raise ValueError(f"{field} must be {rule}, got {getattr(self, field)!r}")

        def count(v: Any) -> bool:
            return isinstance(v, int) and not isinstance(v, bool) and v >= 0

        def pos_int(v: Any) -> bool:
            return count(v) and v >= 1

        need(self.model is None or isinstance(self.model, str), "model", "a path or None")
        need(self.dtype in DTYPES, "dtype", f"one of {DTYPES}")
        need(self.quant is None or self.quant in QUANTS, "quant", f"None or one of {QUANTS}")
        need(
            self.kv_tokens is None or pos_int(self.kv_tokens) or _per_rank(self.kv_tokens, self.tp),
            "kv_tokens",
            "None or an integer >= 1"
            + ("" if self.tp == 1 else f", or one integer >= 1 per rank ({self.tp})"),
        )  # fmt: skip
        need(
            isinstance(self.kv_memory_fraction, (int, float)) and 0 < self.kv_memory_fraction <= 0.9,
            "kv_memory_fraction", "in (0, 0.9]",
        )  # fmt: skip
        need(pos_int(self.page_size), "page_size", "an integer >= 1")
        need(isinstance(self.check_invariants, bool), "check_invariants", "a boolean")
        need(isinstance(self.prefix_cache, bool), "prefix_cache", "a boolean")
        need(
            self.host_kv_tokens is None or count(self.host_kv_tokens),
            "host_kv_tokens", "None or an integer >= 0",
        )  # fmt: skip
        need(isinstance(self.relief_ladder, bool), "relief_ladder", "a boolean")
        need(
            pos_int(self.relief_throttle_iterations), "relief_throttle_iterations",
            "an integer >= 1",
        )  # fmt: skip
        need(isinstance(self.receipts, bool), "receipts", "a boolean")
        need(
            isinstance(self.iteration_receipt_interval, int) and self.iteration_receipt_interval >= 0,
            "iteration_receipt_interval", "an integer >= 0",
        )  # fmt: skip
        need(self.log_file is None or isinstance(self.log_file, str), "log_file", "a path or None")
        need(pos_int(self.max_running), "max_running", "an integer >= 1")
        need(pos_int(self.chunk_tokens), "chunk_tokens", "an integer >= 1")
        need(
            self.step_tokens is None
            or (pos_int(self.step_tokens) and self.step_tokens >= self.page_size),
            "step_tokens", f"None or an integer >= page_size ({self.page_size})",
        )  # fmt: skip
        need(
            self.max_model_len is None or pos_int(self.max_model_len),
            "max_model_len",
            "None or an integer >= 1",
        )
        need(isinstance(self.attention_backend, str), "attention_backend", "a backend name")
        need(self.threads is None or pos_int(self.threads), "threads", "None or an integer >= 1")
        need(isinstance(self.seed, int) and not isinstance(self.seed, bool), "seed", "an integer")
        need(
            isinstance(self.device, str)
            and (self.device in ("cpu", "cuda") or self.device.startswith("cuda:")),
            "device", "cpu, cuda or cuda:N",
        )  # fmt: skip
        need(
            self.otlp_endpoint is None or _http_url(self.otlp_endpoint),
            "otlp_endpoint", "None or an http(s) URL such as http://127.0.0.1:4318",
        )  # fmt: skip
        need(_seconds(self.read_timeout), "read_timeout", "a number of seconds > 0")
        need(
            isinstance(self.max_client_connections, int) and self.max_client_connections >= 0,
            "max_client_connections", "an integer >= 0 (0: no cap)",
        )  # fmt: skip
        need(
            self.request_timeout is None or _seconds(self.request_timeout),
            "request_timeout", "None or a number of seconds > 0",
        )  # fmt: skip
        need(
            self.device == "cpu" or self.kv_tokens is not None,
            "kv_tokens", "given off the CPU (otherwise the pool is sized from host memory)",
        )  # fmt: skip
        need(
            self.quant is None or self.device == "cpu",
            "device", "cpu with --quant (its kernels are torch's CPU ones)",
        )  # fmt: skip

        need(pos_int(self.tp), "tp", "an integer >= 1")
        need(self.dist_init in DIST_INITS, "dist_init", f"one of {DIST_INITS}")
        need(_seconds(self.group_timeout), "group_timeout", "a number of seconds > 0")
        need(pos_int(self.group_check_interval), "group_check_interval", "an integer >= 1")
        need(isinstance(self.published_floor, bool), "published_floor", "a boolean")
        need(
            self.tp == 1 or not self.host_kv_tokens,
            "host_kv_tokens", "0 or None with more than one rank (the host tier is one rank's)",
        )  # fmt: skip

    def log_file_of(self, rank: int) -> str | None:
        """Rank ``rank``'s boot log: rank 0 writes ``log_file``, rank r ``NAME.rankR.EXT``
        beside it (one file per rank, all under one boot id)."""
        if self.log_file is None or rank == 0:
            return self.log_file
        from pathlib import Path

        p = Path(self.log_file)
        return str(p.with_name(f"{p.stem}.rank{rank}{p.suffix}"))

    def kv_tokens_of(self, rank: int) -> int | None:
        """Rank ``rank``'s KV pool size (None: sized from free memory)."""
        if isinstance(self.kv_tokens, list):
            return self.kv_tokens[rank]
        return self.kv_tokens

    @classmethod
    def from_kwargs(cls, **kwargs: Any) -> EngineConfig:
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(kwargs) - known)
        if unknown:
            raise TypeError(f"unknown engine option(s) {unknown}; known: {sorted(known)}")
        return cls(**kwargs)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)
