"""Every message between the frontend process and the scheduler process, as frozen dataclasses.

The frontend sends ``PrepareGuide`` (a constrained request's grammar, before the request),
``AddRequest``, ``AbortRequest``, ``Notice``, ``Record`` (a receipt of its own), ``Cutover``, ``CancelCutover``, ``Serving`` (once,
when its HTTP socket serves) and ``Stop``; the scheduler process answers with ``Ready`` (once,
at boot), ``GuideReady``, ``Outputs`` (a step's outputs with the pool snapshot taken after that
step), ``Heartbeat`` (at least every ``HEARTBEAT_S`` while its loop turns, busy or idle),
``Rejected``, ``CutoverDone`` (when a cutover has ended, or a cancel was answered), ``Stopped``
and ``Dead``. ``Launch`` travels once, with the process's start. ``StepOutput`` is also what the
offline API reads from ``Scheduler.step``. This module imports no torch: the HTTP
process imports it, and must not pay for the model stack.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from engine.request.guide import Guide
from engine.request.sampling_params import SamplingParams

# a sampled token's log-probability and the most likely tokens' (id, logprob), most likely first
TokenLogprobs = tuple[int, float, tuple[tuple[int, float], ...]]

HEARTBEAT_S = 0.5  # the scheduler process's loop says it turns at least this often
STALL_S = 10.0  # the default stall limit: /health's 503 and the scheduler.stall receipt


@dataclass(frozen=True, slots=True, kw_only=True)
class StepOutput:
    """What one step produced for one request. The final output (``finished``) carries the
    request's park and retraction counts."""

    rid: str
    new_token_ids: list[int]
    text_delta: str
    finished: bool
    finish_reason: str | None
    abort_reason: str | None = None  # finish "abort": why (the request.abort receipt's reason)
    stop_sequence: str | None = None  # finish "stop" by a stop string: which one
    cached_tokens: int = 0  # prompt tokens served from the prefix cache
    parks: int = 0  # set on the final output: times the request parked
    retractions: int = 0  # ... and was retracted
    # asked for (``SamplingParams.logprobs``): one entry per new token, in order
    logprobs: list[TokenLogprobs] | None = None
    # asked for: the prompt's tokens' after the first, once, with the first new token
    prompt_logprobs: list[TokenLogprobs] | None = None
    prompt_ranks: list[int] | None = None  # ... and each one's rank among all tokens (1: first)
    # set on the final output: its ending receipt's queue_s, ttft_s and e2e_s, the same numbers
    timing: Mapping[str, float | None] | None = None


@dataclass(frozen=True, slots=True)
class SpecCounts:
    """Speculative decoding since boot (``/metrics``): verifications of a request's drafts,
    drafts verified, drafts kept, and drafts kept at each position (first draft first)."""

    drafts: int = 0
    draft_tokens: int = 0
    accepted_tokens: int = 0
    accepted_per_pos: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class PoolSnapshot:
    """The scheduler's state after a step: one snapshot feeds the ``iteration`` receipt,
    ``/metrics`` and ``/health``. Token counts are KV slots."""

    running: int = 0  # running and not parked
    parked: int = 0
    waiting: int = 0
    kv_used: int = 0  # held by requests: private pages and the cached prefixes they lock
    kv_cached: int = 0  # the prefix cache, reusable
    kv_evictable: int = 0  # what eviction can free now
    kv_free: int = 0  # what the allocator can hand out now
    kv_staged: int = 0  # frees staged in an open free group
    kv_total: int = 0
    new_token_ratio: float = 0.0
    receipts: Mapping[str, int] = field(default_factory=dict)  # decisions since boot, by kind
    # of those receipts, by kind: written to the boot log, and not (its disk full, say)
    receipts_written: Mapping[str, int] = field(default_factory=dict)
    receipts_failed: Mapping[str, int] = field(default_factory=dict)
    # the kinds of schema.TALLIES by (kind, what they said): a relief rung's outcome, say
    tallies: Mapping[tuple[str, str], int] = field(default_factory=dict)
    # progress since boot, the iteration receipt's counters (schema.PROGRESS; counters, not gauges)
    tokens_generated: int = 0  # tokens sampled
    admissions: int = 0  # admission.admit receipts
    requests_ended: int = 0  # requests finished or aborted
    spec: SpecCounts | None = None  # with speculative decoding on
    # with a durable KV store: its cap, used, pinned and reclaimable allocated bytes
    store: Mapping[str, int] | None = None

    @property
    def token_usage(self) -> float:
        """The fraction of the pool the allocator cannot hand out now."""
        return 1 - self.kv_free / self.kv_total if self.kv_total else 0.0

    def gauges(self) -> dict[str, int]:
        """The counts /health reports (everything but the counters and the ratio)."""
        d = asdict(self)
        counters = ("receipts", "receipts_written", "receipts_failed", "tallies", "new_token_ratio")
        for counter in (*counters, *self.progress()):
            del d[counter]
        if self.store is None:
            del d["store"]
        return d

    def progress(self) -> dict[str, int]:
        """The progress counters, named as the ``iteration`` receipt's fields."""
        return {
            "tokens_generated": self.tokens_generated,
            "admissions": self.admissions,
            "requests_ended": self.requests_ended,
        }


@dataclass(frozen=True, slots=True, kw_only=True)
class EngineInfo:
    """The engine's description at boot: the model, the pool, the paths chosen."""

    model: str
    format: str
    name: str | None
    architecture: str
    parameters: int
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    context: int
    dtype: str
    kv_tokens: int
    kv_sizing: str
    page_size: int
    kv_bytes_per_token: int
    kv_pool_bytes: int
    attention_backend: str
    device: str
    load_seconds: float
    startup_seconds: float
    tp: int = 1  # ranks of the tensor-parallel group (in each pipeline stage)
    pp: int = 1  # pipeline stages
    weights: str = "exact"  # exact (float32), bfloat16, or fast mode's int8 / int4
    weights_path: str = ""  # fast mode: which kernels run, in words (engine/model/quant.py)
    ops: str = ""  # on a CPU: native (kernels/cpu_ops.cpp) or torch, with why when torch
    store_off: str | None = None  # a --kv-store-dir given that the store does not use: why

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


# -- frontend -> scheduler ------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class AddRequest:
    rid: str
    prompt_ids: list[int]
    params: SamplingParams
    trace: str | None = None  # the W3C traceparent its scheduler spans go under
    # the server's requests are promised up front: prompt + max_tokens fit the pool, so none is
    # ended for the pool's size once admitted (the offline API lets one run until it cannot)
    promise: bool = False
    arrived: float | None = None  # the wall time the frontend took it in (latencies count from it)
    api: str | None = None  # the HTTP API it came by, named in its request.received receipt


@dataclass(frozen=True, slots=True, kw_only=True)
class AbortRequest:
    rid: str
    reason: str


@dataclass(frozen=True, slots=True, kw_only=True)
class Notice:
    """A frontend notice, written once to the one boot log by the scheduler process."""

    key: str
    text: str
    fields: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True, kw_only=True)
class Record:
    """A receipt of the frontend's own (a kind of ``schema.FRONTEND_KINDS``), written to the one
    boot log by the scheduler process with ``process: "frontend"``."""

    kind: str
    fields: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True, kw_only=True)
class Cutover:
    """A live change of serving configuration (``engine/core/cutover.py``): ``kind`` weights (from
    ``path``), pool (to ``kv_tokens``) or layout (a group's ranks to ``tp`` x ``pp``), ``mode``
    drain or carry. ``ticket``: the frontend's name for the answer."""

    kind: str
    mode: str
    path: str | None = None
    kv_tokens: int | None = None
    tp: int | None = None
    pp: int | None = None
    promises: str = "refuse"  # or "cap": what a pool cutover does with promises it would break
    ticket: int = 0


@dataclass(frozen=True, slots=True, kw_only=True)
class PrepareGuide:
    """Compile ``guide`` (off the scheduler's loop) before a request that needs it is sent;
    ``GuideReady`` answers ``ticket``."""

    guide: Guide
    ticket: int = 0


@dataclass(frozen=True, slots=True, kw_only=True)
class GuideReady:
    """The guide compiled (``error`` None), or why it did not: ``status`` 400 (it does not
    compile, or not in time) or 503 (no compile worker was free: ``retry_after`` seconds)."""

    ticket: int
    error: str | None = None
    status: int = 400
    retry_after: int | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class CheckpointOp:
    """A conversation checkpoint (``engine/tiers/checkpoints.py``): ``op`` create (of ``tokens``,
    named ``id`` or not), list, or delete (``id``); ``CheckpointDone`` answers ``ticket``."""

    op: str
    ticket: int = 0
    tokens: list[int] | None = None
    id: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class CheckpointDone:
    """A checkpoint operation's HTTP answer: its ``status`` and JSON ``body``."""

    ticket: int
    status: int
    body: Mapping[str, Any]


@dataclass(frozen=True, slots=True, kw_only=True)
class CancelCutover:
    """End the cutover ``id`` under way (outcome ``cancelled``); ``ticket``: whom to answer."""

    id: str
    ticket: int = 0


@dataclass(frozen=True, slots=True, kw_only=True)
class Serving:
    """The HTTP socket is bound and the server accepts: the scheduler writes ``boot.ready``."""

    host: str
    port: int


@dataclass(frozen=True, slots=True, kw_only=True)
class Stop:
    reason: str
    drain_s: float = 0.0  # let the requests in flight finish for up to this long, then abort
    # boot.stop's fields besides the reason: a boot that never served says why (exit_code, error)
    cause: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True, kw_only=True)
class Launch:
    """What the frontend knows of this boot, for the scheduler process's boot receipts."""

    argv: list[str]
    stale_pid: Mapping[str, Any] | None = None  # a dead predecessor's pid file, taken over
    stall_s: float = STALL_S  # a loop that does not turn for longer is a stall (scheduler.stall)


# -- scheduler -> frontend ------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class Ready:
    info: EngineInfo
    # engine.model.tokenizer.Tokenizer (torch-free, pickled across); the model room is above
    # this one, so only its reader (the driver) names the type
    tokenizer: Any
    snapshot: PoolSnapshot


@dataclass(frozen=True, slots=True, kw_only=True)
class Outputs:
    outputs: list[StepOutput]
    snapshot: PoolSnapshot  # taken after the step: a finished request's memory is back


@dataclass(frozen=True, slots=True, kw_only=True)
class Heartbeat:
    """The scheduler's loop turns; the pool as of now."""

    snapshot: PoolSnapshot


@dataclass(frozen=True, slots=True, kw_only=True)
class Rejected:
    rid: str
    message: str  # why the scheduler refused it (a 400 for the client)


@dataclass(frozen=True, slots=True, kw_only=True)
class CutoverDone:
    """A cutover ended: its ``cutover.end`` fields (``status``: the HTTP answer)."""

    ticket: int
    fields: Mapping[str, Any]
    snapshot: PoolSnapshot | None = None  # the pool as the cutover left it (/health at once)


@dataclass(frozen=True, slots=True, kw_only=True)
class Stopped:
    reason: str
    in_flight: int  # requests aborted by the stop


@dataclass(frozen=True, slots=True, kw_only=True)
class Dead:
    reason: str  # the whole text (for stderr): an exception's, with its paths and addresses
    ended: bool = False  # the scheduler wrote its own boot.stop (a group that failed)
    said: str = "the scheduler failed"  # what happened, in words a client may read


ToScheduler = (
    AddRequest
    | AbortRequest
    | Notice
    | Record
    | Cutover
    | CancelCutover
    | PrepareGuide
    | CheckpointOp
    | Serving
    | Stop
)
ToFrontend = (
    Ready
    | Outputs
    | Heartbeat
    | Rejected
    | CutoverDone
    | GuideReady
    | CheckpointDone
    | Stopped
    | Dead
)
