"""EngineConfig: every knob, in sections (model, memory, scheduler, server, group,
observability), validated once, shared by the CLI and ``LLM(...)``.

Each knob is declared once, as a field of its section: its default and its help text (the
field's ``metadata["help"]``), which the `engine` command's options and the HTTP limits read. The
flat names (``LLM(kv_tokens=...)``, ``EngineConfig.from_kwargs``, the ``boot.start`` receipt's
``config``) are the fields' own names, unique across the sections (``SECTION_OF``)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from typing import Any

from engine.config.group import GroupSection
from engine.config.rules import (
    _knob,
    _Section,
    http_url,
    int_or_none,
    is_int,
    need,
    per_rank,
    seconds,
)
from engine.config.server import ServerSection
from engine.config.store import StoreSection

DTYPES = ("float32", "bfloat16")
QUANTS = ("int8", "int4")  # fast mode's weight formats (engine/model/quant.py)
POLICIES = ("fcfs", "priority")  # how the waiting line is ordered
SPECULATIVE = ("off", "ngram", "suffix")  # how drafts are proposed (engine/speculative)
# `engine serve`'s step budget (--step-tokens): of 32, 48, 64 and 96, the one that kept eight
# streams' inter-token p99 within 3x their p50 with long prompts arriving (bench/serve.py
# --mixed; BENCHMARKS.md, 2026-12-01). Offline (LLM) the default is no budget: generate returns
# whole outputs, nobody waits on a next token, and the budget halved a 32-prompt burst's tok/s.
SERVE_STEP_TOKENS = 32


@dataclass(frozen=True, slots=True)
class ModelSection(_Section):
    """What runs and where: the weights, their number format, the kernels, the device."""

    model: str | None = _knob(
        None, "GGUF file or Hugging Face folder. Default: SmolLM2-135M-Instruct."
    )
    # float32 is the exact mode; bfloat16 is about 2x faster here
    dtype: str = _knob("float32", "float32 (exact) or bfloat16 (faster).")
    # fast mode: linear weights quantised at load (int8, or int4 in groups of 64/128), bfloat16
    # activations where the CPU has bfloat16 units (the dtype is then chosen by the mode)
    quant: str | None = _knob(
        None,
        "Fast mode: int8 or int4 weights, quantised at load; bfloat16 activations where the "
        "CPU has bfloat16 units (then --dtype does not apply). Default: off (exact mode).",
    )
    max_model_len: int | None = _knob(None, "Context limit (default: the model's).")
    attention_backend: str = _knob(
        "auto",
        "Attention kernels: auto (torch; on CUDA a faster one only once bench/gpu_check.py "
        "has verified it on a GPU), torch, torch-padded (its older decode path, to compare), "
        "triton (CPU only with TRITON_INTERPRET=1) or flashinfer (CUDA, bfloat16).",
    )
    # on CUDA a decode step is a graph replayed (engine/model/graphs.py); True: always eager
    enforce_eager: bool = _knob(
        False,
        "On CUDA: run every step eagerly, without CUDA graphs (by default decode steps are "
        "captured at boot as one graph per batch bucket, with the triton or flashinfer "
        "attention backend, and replayed).",
    )
    cuda_graph_max_batch: int | None = _knob(
        None,
        "On CUDA: the largest decode batch captured as a graph (buckets 1, 2, 4, 8, 16, 24, "
        "32, 48, 64, then every 16, up to it); a larger batch runs eagerly. "
        "Default: --max-running.",
    )
    threads: int | None = _knob(None, "Torch CPU threads.")  # None: engine/core/threads.py chooses
    # where weights, KV pool and attention run
    device: str = _knob("cpu", "cpu, cuda or cuda:N (off the CPU, give --kv-tokens).")

    def validate(self) -> None:
        need(self.model is None or isinstance(self.model, str), self, "model", "a path or None")
        need(self.dtype in DTYPES, self, "dtype", f"one of {DTYPES}")
        need(self.quant is None or self.quant in QUANTS, self, "quant", f"None or one of {QUANTS}")
        need(int_or_none(self.max_model_len, 1), self, "max_model_len", "None or an integer >= 1")
        need(isinstance(self.attention_backend, str), self, "attention_backend", "a backend name")
        need(isinstance(self.enforce_eager, bool), self, "enforce_eager", "a boolean")
        need(
            int_or_none(self.cuda_graph_max_batch, 1),
            self,
            "cuda_graph_max_batch",
            "None or an integer >= 1",
        )
        need(int_or_none(self.threads, 1), self, "threads", "None or an integer >= 1")
        need(
            isinstance(self.device, str)
            and (self.device in ("cpu", "cuda") or self.device.startswith("cuda:")),
            self,
            "device",
            "cpu, cuda or cuda:N",
        )
        need(
            self.quant is None or self.device == "cpu",
            self,
            "device",
            "cpu with --quant (its kernels are torch's CPU ones)",
        )


@dataclass(frozen=True, slots=True)
class MemorySection(_Section):
    """The KV pool, its pages, the prefix cache, the host tier and the relief ladder."""

    # None: a share of free memory; [2048, 1536]: each rank its own pool, as uneven devices
    # have. Its rule reads tp: checked across sections.
    kv_tokens: int | list[int] | None = _knob(
        None,
        "KV pool size in tokens; with --tp, one size per rank may be given "
        "(--kv-tokens 2048,1536). Default: a share of free memory (--kv-memory-fraction).",
    )
    kv_memory_fraction: float = _knob(
        0.2, "Share of available memory for the KV pool when --kv-tokens is not given."
    )
    page_size: int = _knob(1, "KV slots per page.")
    prefix_cache: bool = _knob(True, "Reuse cached prompt prefixes (radix cache).")
    # 0: off; None: off on the CPU, a share of host memory (bounded by the cgroup limit) on CUDA
    host_kv_tokens: int | None = _knob(
        None,
        "Host KV tier in tokens: cold cached prefixes spill there instead of being dropped "
        "and load back on a hit. 0: off. Default: off on the CPU, a share of host memory "
        "(bounded by the cgroup limit) on CUDA.",
    )
    # evict -> spill -> throttle -> retract; False: no rung registered
    relief_ladder: bool = _knob(
        True,
        "on: the relief ladder (evict, spill, throttle, retract) pays before admission "
        "parks; off: no rung is registered (and the boot log says so once).",
    )
    relief_throttle_iterations: int = _knob(
        8, "Iterations the throttle rung keeps new admissions out once it pays."
    )

    def validate(self) -> None:
        f = self.kv_memory_fraction
        need(
            isinstance(f, (int, float)) and 0 < f <= 0.9, self, "kv_memory_fraction", "in (0, 0.9]"
        )
        need(is_int(self.page_size, 1), self, "page_size", "an integer >= 1")
        need(isinstance(self.prefix_cache, bool), self, "prefix_cache", "a boolean")
        need(int_or_none(self.host_kv_tokens, 0), self, "host_kv_tokens", "None or an integer >= 0")
        need(isinstance(self.relief_ladder, bool), self, "relief_ladder", "a boolean")
        need(
            is_int(self.relief_throttle_iterations, 1),
            self,
            "relief_throttle_iterations",
            "an integer >= 1",
        )


@dataclass(frozen=True, slots=True)
class SchedulerSection(_Section):
    """What a step may hold and how requests are sampled; the ledger checks of tests."""

    max_running: int = _knob(64, "Requests decoding at once.")
    chunk_tokens: int = _knob(2048, "Prefill tokens per step, at most.")
    # None: no budget (served: SERVE_STEP_TOKENS unless --step-tokens says otherwise). Its rule
    # reads page_size: checked across sections.
    step_tokens: int | None = _knob(
        None,
        "Tokens one forward may hold: a decode token per decoding request, then prefill "
        "chunks in what is left (the first at least as many as the decodes, so prompts "
        "always move). Bounds the inter-token latency a long prompt adds (bench/serve.py "
        "--mixed measures it); 0: no step budget.",
    )
    # the seed of the shared generator used by unseeded sampling requests
    seed: int = _knob(0, "Seed for unseeded sampling.")
    check_invariants: bool = _knob(
        False, "Check the memory ledger after every step (slow; for tests)."
    )
    cutover_timeout: float = _knob(
        600.0, "Seconds a cutover may wait for its weights or its drain; then it ends, unchanged."
    )
    scheduling_policy: str = _knob(
        "fcfs",
        "fcfs (first come, first served) or priority: requests wait in order of their "
        "priority (the lower value first, as vLLM orders them), then of arrival.",
    )
    speculative: str = _knob(
        "suffix",
        "Speculative decoding: ngram proposes a request's next tokens from its own prompt and "
        "output (prompt lookup); suffix (the default) from those and recent requests' outputs "
        "too; the model checks them in one forward and keeps what it would have chosen "
        "(greedy) or what rejection sampling keeps (sampled: the output distribution is "
        "unchanged; a request with its own seed is not drafted for); off: one token a step.",
    )
    spec_tokens: int = _knob(4, "Tokens proposed per request and step, at most.")
    overlap_schedule: bool = _knob(
        False,
        "Plan the next step on a worker thread while this step's forward runs: its "
        "decodes funded, its prompts admitted, its slots taken; relief waits for the forward "
        "first. One rank, --speculative off.",
    )
    grammar_timeout: float = _knob(
        10.0,
        "Seconds a request's grammar (response_format) may take to compile; past them the "
        "request is refused (400) and so is that grammar from then on; its worker process "
        "is ended then.",
    )
    # 2: this machine's two cores; more compiles at once only share them, and each worker
    # process holds xgrammar (and the torch it imports) in memory
    grammar_workers: int = _knob(
        2,
        "Grammars that compile at once, each in a worker process of its own (ended when it "
        "passes --grammar-timeout, its CPU free again).",
    )
    grammar_waiting: int = _knob(
        8,
        "Grammars that may wait for a free compile worker (each compile ends by "
        "--grammar-timeout, so the line moves); with the line full a request is refused "
        "(503 with Retry-After).",
    )

    def validate(self) -> None:
        need(is_int(self.max_running, 1), self, "max_running", "an integer >= 1")
        need(is_int(self.chunk_tokens, 1), self, "chunk_tokens", "an integer >= 1")
        seed = self.seed
        need(isinstance(seed, int) and not isinstance(seed, bool), self, "seed", "an integer")
        need(isinstance(self.check_invariants, bool), self, "check_invariants", "a boolean")
        need(seconds(self.cutover_timeout), self, "cutover_timeout", "a number of seconds > 0")
        need(seconds(self.grammar_timeout), self, "grammar_timeout", "a number of seconds > 0")
        need(is_int(self.grammar_workers, 1), self, "grammar_workers", "an integer >= 1")
        need(is_int(self.grammar_waiting, 0), self, "grammar_waiting", "an integer >= 0")
        need(self.scheduling_policy in POLICIES, self, "scheduling_policy", " or ".join(POLICIES))
        need(self.speculative in SPECULATIVE, self, "speculative", " or ".join(SPECULATIVE))
        need(isinstance(self.overlap_schedule, bool), self, "overlap_schedule", "a boolean")
        need(
            is_int(self.spec_tokens, 1) and self.spec_tokens <= 16,
            self,
            "spec_tokens",
            "an integer in [1, 16]",
        )


@dataclass(frozen=True, slots=True)
class ObservabilitySection(_Section):
    """Receipts (where, how often, whether at all) and traces."""

    receipts: bool = _knob(True, "Write receipts at all.")  # False: the on/off benchmark
    # None: receipts kept in memory only
    log_file: str | None = _knob(None, "Boot log of JSON receipts.")
    console_receipts: bool = _knob(False, "Also print receipts, pretty, on stderr.")
    iteration_receipt_interval: int = _knob(
        50, "An `iteration` receipt every N steps, and after one that moved the queue; 0: off."
    )
    # OTLP/HTTP collector base URL for traces; None: the OTEL_* variables decide (off if unset)
    otlp_endpoint: str | None = _knob(
        None,
        "Export OpenTelemetry traces over OTLP/HTTP to this collector base URL "
        "(e.g. http://127.0.0.1:4318). Default: the OTEL_EXPORTER_OTLP_* variables; "
        "neither: tracing is off.",
    )

    def validate(self) -> None:
        need(isinstance(self.receipts, bool), self, "receipts", "a boolean")
        log_file = self.log_file
        need(log_file is None or isinstance(log_file, str), self, "log_file", "a path or None")
        need(
            is_int(self.iteration_receipt_interval, 0),
            self,
            "iteration_receipt_interval",
            "an integer >= 0",
        )
        need(
            self.otlp_endpoint is None or http_url(self.otlp_endpoint),
            self,
            "otlp_endpoint",
            "None or an http(s) URL such as http://127.0.0.1:4318",
        )


SECTIONS: dict[str, type[_Section]] = {  # EngineConfig's sections, by attribute name
    "model": ModelSection,
    "memory": MemorySection,
    "store": StoreSection,
    "scheduler": SchedulerSection,
    "server": ServerSection,
    "group": GroupSection,
    "observability": ObservabilitySection,
}


def _route() -> dict[str, str]:
    """Each flat name -> the section holding it; a name in two sections is refused here."""
    table: dict[str, str] = {}
    for section, cls in SECTIONS.items():
        for f in fields(cls):
            if f.name in table:
                raise TypeError(f"option {f.name!r} is in both {table[f.name]} and {section}")
            table[f.name] = section
    return table


SECTION_OF = _route()
DEFAULTS: dict[str, Any] = {f.name: f.default for c in SECTIONS.values() for f in fields(c)}
HELP: dict[str, str] = {f.name: f.metadata["help"] for c in SECTIONS.values() for f in fields(c)}


def _check_across(c: EngineConfig) -> None:
    """The rules that read more than one section."""
    mem, world = c.memory, c.group.world
    need(
        mem.kv_tokens is None or is_int(mem.kv_tokens, 1) or per_rank(mem.kv_tokens, world),
        mem,
        "kv_tokens",
        "None or an integer >= 1"
        + ("" if world == 1 else f", or one integer >= 1 per rank ({world})"),
    )
    step = c.scheduler.step_tokens
    need(
        step is None or (is_int(step, 1) and step >= mem.page_size),
        c.scheduler,
        "step_tokens",
        f"None or an integer >= page_size ({mem.page_size})",
    )
    need(
        c.model.device == "cpu" or mem.kv_tokens is not None,
        mem,
        "kv_tokens",
        "given off the CPU (otherwise the pool is sized from host memory)",
    )
    sched = c.scheduler
    need(
        not sched.overlap_schedule or (world == 1 and sched.speculative == "off"),
        sched,
        "overlap_schedule",
        "False with more than one rank or with --speculative on (a group plans in lockstep; "
        "a draft is proposed from the token before it)",
    )
    need(
        world == 1 or not mem.host_kv_tokens,
        mem,
        "host_kv_tokens",
        "0 or None with more than one rank (the host tier is one rank's)",
    )


@dataclass(frozen=True, slots=True)
class EngineConfig:
    model: ModelSection = field(default_factory=ModelSection)
    memory: MemorySection = field(default_factory=MemorySection)
    store: StoreSection = field(default_factory=StoreSection)
    scheduler: SchedulerSection = field(default_factory=SchedulerSection)
    server: ServerSection = field(default_factory=ServerSection)
    group: GroupSection = field(default_factory=GroupSection)
    observability: ObservabilitySection = field(default_factory=ObservabilitySection)

    def __post_init__(self) -> None:
        for name, cls in SECTIONS.items():  # EngineConfig(kv_tokens=...) was the flat API
            if not isinstance(got := getattr(self, name), cls):
                raise TypeError(
                    f"EngineConfig.{name} must be a {cls.__name__}, got {got!r}; "
                    "flat options go through EngineConfig.from_kwargs"
                )
        _check_across(self)

    def validate(self) -> None:
        for section in SECTIONS:
            getattr(self, section).validate()
        _check_across(self)

    def log_file_of(self, rank: int) -> str | None:
        """Rank ``rank``'s boot log: rank 0 writes ``log_file``, rank r ``NAME.rankR.EXT``
        beside it (one file per rank, all under one boot id)."""
        log_file = self.observability.log_file
        if log_file is None or rank == 0:
            return log_file
        from pathlib import Path

        p = Path(log_file)
        return str(p.with_name(f"{p.stem}.rank{rank}{p.suffix}"))

    def kv_tokens_of(self, rank: int) -> int | None:
        """Rank ``rank``'s KV pool size (None: sized from free memory)."""
        kv_tokens = self.memory.kv_tokens
        return kv_tokens[rank] if isinstance(kv_tokens, list) else kv_tokens

    @classmethod
    def from_kwargs(cls, **kwargs: Any) -> EngineConfig:
        """From the flat names (``kv_tokens=1024, tp=2``), each routed into its section."""
        unknown = sorted(set(kwargs) - set(SECTION_OF))
        if unknown:
            raise TypeError(f"unknown engine option(s) {unknown}; known: {sorted(SECTION_OF)}")
        parts: dict[str, dict[str, Any]] = {section: {} for section in SECTIONS}
        for name, value in kwargs.items():
            parts[SECTION_OF[name]][name] = value
        return cls(**{s: SECTIONS[s](**kw) for s, kw in parts.items()})

    def as_dict(self) -> dict[str, Any]:
        """Flat, by the fields' own names: the ``boot.start`` receipt's ``config``."""
        return {k: v for s in SECTIONS for k, v in asdict(getattr(self, s)).items()}
