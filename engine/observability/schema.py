"""The receipt catalog: every kind the engine may write and the fields it must carry.

Shared by the engine (which writes receipts) and the auditor (which reads them), so it imports
nothing heavier than the standard library. Grow it; never rename a kind or a field silently:
a breaking change bumps SCHEMA_VERSION.
"""

from __future__ import annotations

from dataclasses import dataclass

SCHEMA_VERSION = 1

# Fields every receipt carries. `seq` counts receipts per (boot, rank): a gap is a lost line.
COMMON_FIELDS = ("ts", "event", "v", "boot", "rank", "iter", "seq")


@dataclass(frozen=True, slots=True)
class Kind:
    name: str
    fields: tuple[str, ...]  # required beyond the common ones
    doc: str
    optional: tuple[str, ...] = ()  # written by the engine in some receipts or some paths


# Field groups the engine writes together (optional fields of several kinds)
_BUDGET = ("local_avail", "evictable", "decode_reserve", "floor", "offset", "remaining")
_STORE = ("cap", "used", "pinned", "reclaimable")  # the store's numbers, in allocated bytes
_ENDING = (
    "tokens",
    "prompt_tokens",
    "cached",
    "parks",
    "retractions",
    "trace_id",
    "queue_s",
    "ttft_s",
    "e2e_s",
    "constrained",
    "spec_proposed",
    "spec_accepted",
    "output_hash",
)
_NET = ("site", "rid")
# The step budget (`step_tokens`) as admission saw it: the step's decode tokens, the room left
# for this chunk (None: no step budget), and whether that room cut the chunk short.
_STEP = ("decodes", "step_budget", "step_cut")
# The progress counters of an `iteration`, cumulative since boot (tokens sampled, admission.admit
# receipts, requests finished or aborted): a sampled receipt still shows what every step did.
PROGRESS = ("tokens_generated", "admissions", "requests_ended")
# The `boot.stop` reasons of an orderly stop (boot_health's `stopped_in_order` names the same
# list; any other reason is a crash): a signal (the frontend's SIGTERM/SIGINT handler), the
# defaults of EngineCore.shutdown / EngineDriver.stop ("shutdown") and LLM.close ("closed"), the
# scheduler process after its frontend went away, and the reason the test suites close with.
ORDERLY_STOPS = ("sigterm", "sigint", "shutdown", "closed", "frontend_gone", "test")
# The `boot.stop` reason of a boot that exited before it served (its engine could not be built:
# a bad --tp, a model that does not load, a pool that does not fit; its HTTP server never
# started; a rank that could not build its part of a group), written by the process that exits,
# with its `exit_code` and its message (`error`). Not an orderly stop: boot_health FAILs it.
BOOT_FAILED = "boot_failed"

# A cutover's census: the rids running, parked and waiting, and the prompt tokens not yet
# prefilled (counted once per request); the end repeats the census taken before as *_before.
_CENSUS = ("running", "parked", "waiting", "rids", "backlog")
CUTOVER_OUTCOMES = ("ok", "rejected", "failed")

# The `request.abort` reasons the HTTP frontend gives (engine/server/job.py): the client went
# away, the request's deadline passed (--request-timeout), or another choice of the same request
# failed (the scheduler refused it, or could not take it), so this one was aborted with it.
FRONTEND_ABORTS = ("client_disconnect", "deadline", "sibling_failed")

BOOT_START = "boot.start"
BOOT_POOL_SIZED = "boot.pool_sized"
BOOT_WEIGHTS = "boot.weights"
BOOT_GRAPHS = "boot.graphs"
BOOT_READY = "boot.ready"
BOOT_STOP = "boot.stop"
BOOT_DRAIN = "boot.drain"
# The fields that say what caused a receipt, where it carries them: the auditor names them beside
# the receipt when a claim matched it (a stop's exit code, signal, lost ranks and message).
CAUSE_FIELDS = {BOOT_STOP: ("exit_code", "signal", "lost_ranks", "error")}
BOOT_STALE_PID = "boot.stale_pid"
REQUEST_RECEIVED = "request.received"
REQUEST_FINISH = "request.finish"
REQUEST_ABORT = "request.abort"
REQUEST_REJECT = "request.reject"
REQUEST_CAP = "request.cap"
ADMISSION_ADMIT = "admission.admit"
ADMISSION_PARK = "admission.park"
ADMISSION_UNPARK = "admission.unpark"
ADMISSION_DEFER = "admission.defer"
EVICTION = "eviction"
EVICTION_UNDER_DELIVERED = "eviction.under_delivered"
ALLOC_FLUSH = "alloc.flush"
ALLOC_RELIEF = "alloc.relief"
ALLOC_RETRY = "alloc.retry"
ALLOC_OOM = "alloc.oom"
RELIEF_ENGAGE = "relief.engage"
RELIEF_RUNG = "relief.rung"
RELIEF_THROTTLE = "relief.throttle"
TIER_SIZED = "tier.sized"
TIER_SPILL = "tier.spill"
TIER_LOAD = "tier.load"
TIER_DROP = "tier.drop"
STORE_SIZED = "store.sized"
STORE_SCAN = "store.scan"
STORE_WRITE = "store.write"
STORE_LOAD = "store.load"
STORE_EVICT = "store.evict"
STORE_REAP = "store.reap"
STORE_QUARANTINE = "store.quarantine"
CHECKPOINT_CREATE = "checkpoint.create"
CHECKPOINT_DELETE = "checkpoint.delete"
CHECKPOINT_REFUSE = "checkpoint.refuse"
CHECKPOINT_FOUND = "checkpoint.found"
CHECKPOINT_DELETE_FAILED = "checkpoint.delete_failed"
RETRACT = "retract"
CUTOVER_BEGIN = "cutover.begin"
CUTOVER_CARRY = "cutover.carry"
CUTOVER_END = "cutover.end"
REQUEUE = "requeue"
GROUP_FLOOR = "group.floor"
GROUP_LAYOUT = "group.layout"
PHASE_DECIDE = "phase.decide"
ITERATION = "iteration"
INVARIANT_VIOLATION = "invariant.violation"
NOTICE = "notice"
SCHEDULER_STALL = "scheduler.stall"
SCHEDULER_RESUME = "scheduler.resume"
GRAMMAR_COMPILE = "grammar.compile"
GRAMMAR_WORKER = "grammar.worker"
SPEC_CUT = "spec.cut"
SPEC_OFF = "spec.off"
SPEC_ON = "spec.on"
# The HTTP process's own decisions, sent over the pipe and written by the scheduler process into
# the one boot log with ``process: "frontend"`` (engine/server/frontdoor.py, loop_watch.py).
REQUEST_REJECTED = "request.rejected"
FRONTEND_STALL = "frontend.stall"
FRONTEND_RESUME = "frontend.resume"
# the stored responses of /v1/responses (engine/server/response_store.py, responses_api.py)
RESPONSE_EVICT = "response.evict"
RESPONSE_UNCHECKPOINTED = "response.uncheckpointed"
FRONTEND_KINDS = frozenset(
    {REQUEST_REJECTED, FRONTEND_STALL, FRONTEND_RESUME, RESPONSE_EVICT, RESPONSE_UNCHECKPOINTED}
)


@dataclass(frozen=True, slots=True)
class Tally:
    """A kind counted by what it said as well as by kind (/metrics): ``field``'s value, one of
    the closed list ``values``; for ``error``, whether one was given (``error``) or not
    (``ok``)."""

    field: str
    values: tuple[str, ...]


TALLIES = {
    RELIEF_RUNG: Tally("outcome", ("paid", "short", "raised")),
    GRAMMAR_COMPILE: Tally("outcome", ("ok", "invalid", "timeout", "error", "busy")),
    STORE_QUARANTINE: Tally("reason", ("wrong_type", "malformed", "checksum", "unreadable")),
    STORE_LOAD: Tally("error", ("ok", "error")),
    STORE_WRITE: Tally("error", ("ok", "error")),
}


def tally_of(event: str, fields: dict[str, object]) -> str | None:
    """The value ``event``'s receipt is counted under (None: a kind not tallied)."""
    tally = TALLIES.get(event)
    if tally is None:
        return None
    value = fields.get(tally.field)
    if tally.field == "error":
        return "error" if value else "ok"
    return str(value)


_CATALOG = (
    Kind(BOOT_START, ("config",), "the engine starts; its whole configuration",
         ("pid", "ppid", "host", "argv", "versions")),
    Kind(BOOT_POOL_SIZED, ("path", "kv_tokens", "bytes_per_token", "page_size"),
         "the KV pool was sized: path is 'configured' (a token count was given) or 'measured' "
         "(from a memory budget), with the inputs of that path; and what the process's C heap "
         "does with what a step frees (heap: 'keep', up to heap_bytes, or 'system', glibc's "
         "own or another C library's, with heap_why)",
         ("mem_available", "fraction", "budget_bytes", "heap", "heap_bytes", "heap_why")),
    Kind(BOOT_GRAPHS, ("captured",),
         "on CUDA, after the pool is sized (and after a cutover that changed the weights, "
         "layout or pool): the decode batch buckets captured as CUDA graphs "
         "(empty, with why, where none is: enforce_eager, a group, the torch backend, a capture "
         "that failed), the "
         "device memory their static buffers and graphs took (bytes; graph_bytes the graphs "
         "alone), the seconds capture took, the slot table width and the attention backend",
         ("why", "bytes", "graph_bytes", "seconds", "width", "backend")),
    Kind(BOOT_WEIGHTS, ("mode", "dtype"),
         "the weights are in place: mode exact (float32), bfloat16, or fast mode's int8 / int4 "
         "with the kernels chosen for this CPU (path, small_rows, vnni_rows, int_vnni: the layer "
         "matrices' few-row products in integers, kv_dtype; int_rows: where small_rows was "
         "measured at load, per row count the microseconds of one layer's products in "
         "integers and dense) and what "
         "they take; "
         "on a CPU whether the native ops run (ops native | torch, ops_why), up to how many rows "
         "the norms are the native ones (norm_rows: 0 torch's, \"any\" every count) and which kernels "
         "attend this model's heads, a decode step's and a prefill chunk's, the latter timed "
         "against SDPA at boot where both can run (attention, extend_us; extend_way: how the "
         "native kernel runs bfloat16 chunks, on AMX's tiles, AVX-512 BF16 vectors or its "
         "loops), and "
         "up to how many rows a decode forward's layers run as one native call (step_rows, 0: "
         "never; fast mode and bfloat16); on a CPU, the row counts from which the layers' and the LM head's dense "
         "products take (W @ x.T).T rather than F.linear, measured at load (orient), and "
         "those that take the weights packed at load (fast mode: its dense values'), with "
         "the copies' bytes and whether they are laid out for AMX's tiles (tiles), the "
         "native float32 product (f32) or the native bfloat16 product on vectors (pairs), "
         "else for oneDNN "
         "(prepacked); on a pipeline stage, which stage and the layers [start, stop) it holds",
         ("path", "small_rows", "vnni_rows", "int_vnni", "matrices", "packed_bytes", "dense_bytes",
          "quantize_s", "kv_dtype", "ops", "ops_why", "norm_rows", "step_rows", "orient", "stage", "layers",
          "int_rows", "prepacked", "attention")),
    Kind(BOOT_READY, ("startup_s",),
         "the engine accepts work (served: its HTTP socket is bound and serving)",
         ("host", "port", "engine_s")),
    Kind(BOOT_STALE_PID, ("path", "pid", "running"),
         "the pid file of a dead predecessor was taken over (running: its pid was reused)"),
    Kind(BOOT_DRAIN, ("reason", "in_flight", "timeout_s"),
         "an orderly stop lets the requests in flight finish for up to timeout_s"),
    Kind(BOOT_STOP, ("reason", "in_flight"),
         "the boot ends: orderly (a reason in ORDERLY_STOPS) or not (a crash; BOOT_FAILED: it "
         "exited before serving)",
         ("signal", "exit_code", "drained", "lost_ranks", "error")),
    Kind(REQUEST_RECEIVED, ("rid", "prompt_tokens", "max_new_tokens"),
         "a request was handed in; promised: prompt + max_new_tokens, checked against the pool "
         "(the server's requests): it is never ended for the pool's size; arrived: the wall time "
         "the frontend took it in (its latencies count from then, queueing before the scheduler "
         "saw it included); api: the HTTP API it came by (completions, chat.completions, "
         "responses, messages); under the priority policy its priority and how many waiting "
         "requests it was placed ahead of (overtook)",
         ("trace_id", "promised", "arrived", "api", "priority", "overtook")),
    Kind(REQUEST_FINISH, ("rid", "reason", "tokens"), "a request ended normally", _ENDING),
    Kind(REQUEST_ABORT, ("rid", "reason"), "a request ended abnormally",
         _ENDING + ("need", "capacity", "promised")),
    Kind(REQUEST_CAP, ("rid", "promised", "max_new_tokens", "reason"),
         "a promised request's max_new_tokens lowered so it still ends with length in a smaller "
         "pool (reason: the cutover's id, asked with promises = cap)"),
    Kind(REQUEST_REJECT, ("rid", "reason", "need", "capacity"),
         "a request refused at intake because it could never fit the pool (never received)"),
    Kind(ADMISSION_ADMIT, ("rid", "tokens"),
         "a request or chunk was scheduled (no_prefix: why the prefix cache was not read for it)",
         ("pages", "prefix_hit", "held", "chunked", "retracted", "no_prefix") + _STEP + _BUDGET),
    Kind(ADMISSION_PARK, ("rid", "reason", "need", "fundable"), "a chunk could not be funded",
         ("page_size",) + _BUDGET),
    Kind(ADMISSION_UNPARK, ("rid",), "a parked chunk was funded again", ("tokens",) + _BUDGET),
    Kind(ADMISSION_DEFER, ("count", "reason"),
         "requests held back this iteration (rid: the in-flight chunk the step budget held)",
         ("running", "rid", "step_budget") + _BUDGET),
    Kind(EVICTION, ("reason", "asked", "evicted", "staged", "evictable_before", "evictable_after"),
         "the prefix cache evicted (scope 'host_backed': only device copies of nodes whose KV "
         "is also on the host, and evictable_before/after count what such a pass can reach)",
         ("available_after", "spilled", "scope")),
    Kind(EVICTION_UNDER_DELIVERED, ("reason", "asked", "evicted", "evictable_before", "note"),
         "eviction freed less than min(asked, evictable_before): the counter promised what the "
         "actuator did not pay"),
    Kind(ALLOC_FLUSH, ("need", "staged", "freed"), "staged frees applied at an allocation site",
         _NET),
    Kind(ALLOC_RELIEF, ("need", "freed"), "one bounded relief at an allocation site",
         ("evicted", "relieved") + _NET),
    Kind(ALLOC_RETRY, ("need", "ok"), "the allocation retried after relief", _NET),
    Kind(ALLOC_OOM, ("need", "available"), "the allocation failed after the net",
         ("staged", "evictable", "capacity") + _NET),
    Kind(RELIEF_ENGAGE, ("shortfall",), "the relief ladder engaged", ("rungs", "site")),
    Kind(RELIEF_RUNG, ("rung", "asked", "paid", "outcome"),
         "one rung of the ladder: outcome paid, short or raised", ("error", "site")),
    Kind(RELIEF_THROTTLE, ("iterations", "until"),
         "the throttle rung closed the line to new admissions for some iterations",
         ("running", "waiting", "site")),
    Kind(TIER_SIZED, ("path", "host_kv_tokens", "bytes_per_token"),
         "the host KV tier was sized: path 'off', 'configured' or 'measured' (a share of host "
         "memory, bounded by the cgroup limit where one is set), with the inputs of that path",
         ("page_size", "mem_available", "cgroup_limit", "cgroup_usage", "fraction",
          "budget_bytes", "cap_tokens", "reason")),
    Kind(TIER_SPILL, ("tokens", "bytes", "seconds"),
         "cold prefix KV copied device -> host instead of dropped; its device pages freed",
         ("nodes", "dropped", "rid", "host_free", "error")),
    Kind(TIER_LOAD, ("tokens", "bytes", "seconds"),
         "a prefix hit's host-only KV copied host -> device before the request's extend",
         ("nodes", "rid", "asked", "error")),
    Kind(TIER_DROP, ("reason", "tokens"),
         "host copies dropped (least recently used first) to make room, at a reset, or below "
         "a node whose spill failed (spill_failed)",
         ("nodes", "need", "host_free")),
    Kind(STORE_SIZED, ("path",),
         "the durable KV store was opened ('configured': a directory and a cap were given), is "
         "'off' (no directory given; more than one rank; no prefix cache) or 'unusable' (a "
         "directory given that it cannot make, write or claim: another model's store, a "
         "STORE.json it did not write), with the reason (kept: /health's store_off)",
         ("dir", "cap", "pin_budget", "reason", "identity")),
    Kind(STORE_SCAN, ("files", "pages", "allocated", "apparent", "reaped"),
         "the store's index rebuilt from its files at boot; reaped: files removed, by reason "
         "(partial, foreign, orphan_pin, orphan_manifest); set_aside: names moved to "
         "quarantine/ (each its store.quarantine)",
         ("checkpoints", "set_aside", "seconds") + _STORE),
    Kind(STORE_WRITE, ("reason", "pages", "tokens", "allocated", "apparent"),
         "pages written to the store (reason: what dropped them from memory above it); no_room: "
         "pages the cap could not take, error: a write that failed (an outcome, serving goes on)",
         ("no_room", "rid", "seconds", "error") + _STORE),
    Kind(STORE_LOAD, ("pages", "asked", "tokens", "bytes"),
         "a prefix's pages read from the store into device pages instead of recomputed; a "
         "corrupt page ends the load there (error) and is set aside (store.quarantine)",
         ("rid", "seconds", "error")),
    Kind(STORE_EVICT, ("reason", "asked", "freed", "pages", "skipped"),
         "least recently used unpinned pages deleted for allocated bytes asked (reason write, "
         "disk_full: the filesystem said ENOSPC, ...); skipped: files that would not go (marked "
         "stuck, left in place, no longer reclaimable)",
         ("pinned_pages", "rid", "error") + _STORE),
    Kind(STORE_REAP, ("reason", "files", "allocated", "apparent"),
         "files the store wrote and has no use for, removed (partial, foreign, orphan_pin, "
         "orphan_manifest)", ("failed", "error")),
    Kind(STORE_QUARANTINE, ("path", "reason", "detail"),
         "something at a name of the store's layout that the store did not write as it is, set "
         "aside: moved (moved_to) into quarantine/ under the store's root, never read, never "
         "deleted (error: it could not be moved and is left where it is, never read). path is "
         "relative to the root; reason wrong_type (a link, FIFO, socket, device, a folder for a "
         "file or a file for a folder), malformed (a header or JSON not as the store writes "
         "it), checksum (a page's payload, found when loaded), unreadable (an I/O error); "
         "checkpoints: those pinning a page set aside when loaded (incomplete from then on)",
         ("moved_to", "error", "checkpoints")),
    Kind(CHECKPOINT_CREATE, ("id", "tokens", "pages", "pinned_bytes", "shared_bytes"),
         "a conversation checkpoint pinned its pages (pinned_bytes: pages newly pinned; "
         "shared_bytes: pinned already by another checkpoint; file_bytes: its own two files, "
         "pinned too)", ("file_bytes",) + _STORE),
    Kind(CHECKPOINT_DELETE, ("id", "tokens", "pages"), "a checkpoint and its pins removed",
         _STORE),
    Kind(CHECKPOINT_FOUND, ("id", "tokens", "pages", "missing", "complete"),
         "a checkpoint the boot's scan found in the store, with its pages missing from it (a "
         "pinned page lost) and whether its manifest was written (false: being written, or an "
         "orphan younger than the orphan age)"),
    Kind(CHECKPOINT_DELETE_FAILED, ("id", "path", "error"),
         "a checkpoint's file (path, relative to the store's root) could not be removed: the "
         "delete is answered with an error; with its manifest still there nothing changed, "
         "past it the checkpoint is incomplete and its pins hold"),
    Kind(CHECKPOINT_REFUSE, ("id", "want", "held", "budget", "overshoot"),
         "a checkpoint refused: its new pinned bytes (want) on top of those pinned (held) "
         "would cross the pin budget by overshoot; nothing changed", ("tokens",)),
    Kind(RETRACT, ("rids", "tokens_freed"), "decode requests retracted",
         ("ratio_old", "ratio_new", "need", "available", "evictable", "candidates",
          "running_after", "site")),
    Kind(CUTOVER_BEGIN, ("id", "kind", "mode") + _CENSUS,
         "a live change of serving configuration begins (kind weights, pool or layout, mode "
         "drain or carry), with the census before it",
         ("path", "kv_tokens", "tp", "pp", "ceiling", "census_error")),
    Kind(CUTOVER_CARRY, ("id", "rids", "tokens"),
         "what a cutover carried: residents re-homed with their KV (rids, tokens) and those "
         "put back in line with the tokens they generated (requeued)",
         ("requeued", "requeued_tokens", "cached_tokens", "evicted")),
    Kind(CUTOVER_END, ("id", "kind", "mode", "outcome") + _CENSUS,
         "a cutover ended: outcome ok, rejected (with the reason; nothing changed; promises: "
         "those a smaller pool would break), failed (rolled back), or timeout, cancelled or "
         "stopped (nothing changed); the census after it, the census before (*_before), the rids that "
         "ended during it (ended) and the seconds no new work could start (pause_s); a weights "
         "cutover that took effect adds the new weights' boot.weights fields (weights); a layout "
         "cutover the group's tp and pp after it",
         ("reason", "status", "pause_s", "seconds", "ended", "backlog_before", "rids_before",
          "ceiling", "kv_tokens", "path", "census_error", "weights", "promises", "tp", "pp")),
    Kind(REQUEUE, ("rid",), "a retracted request was put back in line", ("generated",)),
    Kind(GROUP_FLOOR, ("floor", "local"),
         "the published floor of a multi-rank group, where it binds (this rank counted more)",
         ("available", "evictable", "staged")),
    Kind(GROUP_LAYOUT, ("id", "tp", "pp", "stage", "layers"),
         "every rank of a group changed its layout at one boundary (a layout cutover): the new "
         "tp x pp, this rank's stage and layers [start, stop), its KV heads and pool bytes, the "
         "layout before, and the seconds the change took here",
         ("kv_heads", "pool_bytes", "before", "seconds")),
    Kind(PHASE_DECIDE, ("decision", "reason", "layout", "backlog", "since"),
         "the phase policy decided at a boundary (rank 0, every phase_interval iterations): "
         "decision flip or stay, reason (backlog_high, backlog_low, steady, dwell), the layout "
         "serving (stages or shards), the prefill backlog counted once per request, iterations "
         "since the last flip, the decode batch, the line, the free pool and the thresholds; a "
         "flip names the layout it went to and its cutover (a refused one: stay, with outcome)",
         ("decode", "waiting", "free", "enter", "exit", "dwell", "to", "cutover", "outcome")),
    Kind(ITERATION, ("running", "waiting"),
         "a scheduler summary, sampled every N steps and (one rank) after a step that moved the "
         "queue (running, waiting, parked); with more than one rank, one on every iteration that "
         "scheduled work, with the digest of the batch about to run (batch_digest)",
         ("parked", "token_usage", "avail", "evictable", "staged", "cached", "ratio", "digest",
          "constrained", "mask_ms", "spec_proposed", "spec_accepted", "spec_recent_tokens",
          "graph_steps", "eager_steps", "overlap_ahead", "overlap_waited", "overlap_dropped")
         + PROGRESS),
    Kind(INVARIANT_VIOLATION, ("what",), "a checked invariant failed (once per kind)"),
    Kind(NOTICE, ("text",), "something said once", ("process",)),
    Kind(SCHEDULER_STALL, ("since", "limit_s", "running", "waiting", "parked"),
         "the scheduler's loop did not turn for longer than the stall limit (stopped, or one step "
         "that long): written when it turns again, with the wall time of its last turn (since) "
         "and the work it held then"),
    Kind(SCHEDULER_RESUME, ("stalled_s", "arrived"),
         "the loop turns again after a stall of stalled_s seconds; arrived: the requests handed "
         "in while it stood (each request.received before this receipt carries its arrival)"),
    Kind(GRAMMAR_COMPILE, ("guide", "kind", "cache", "outcome"),
         "a constrained request's grammar (guide: its digest; kind json_object, json_schema, "
         "regex, choice, grammar, tagged_json (a tool-calling model's blocks) or alternation (any one "
         "of its parts: tool calls or the answer format asked beside them)) was compiled (cache miss, with ms) or found compiled (hit): "
         "outcome ok, invalid, timeout (refused after the time limit; worker: the pid of the "
         "compile worker killed then), error, or busy (no compile worker free: refused as load, "
         "503, with the compiles running and waiting and retry_after_s); site prepare "
         "(before the request was submitted) or add (as it was added)",
         ("ms", "error", "site", "worker", "running", "waiting", "retry_after_s")),
    Kind(GRAMMAR_WORKER, ("pid", "action"),
         "a grammar compile worker process: started (ready to compile, ms after its spawn), "
         "killed (its compile of guide passed limit_s: the process ended, its CPU free), died "
         "(it ended by itself, exit_code) or stopped (the engine stops)",
         ("ms", "guide", "limit_s", "exit_code")),
    Kind(SPEC_CUT, ("rid", "want", "got", "spare"),
         "a request's drafts cut to what the step's spare pages fund (speculative decoding "
         "never makes room for drafts; got 0: it decodes one token as usual), or to the rows "
         "a step leaves for drafts (rows) within the step budget and, in fast mode, the rows "
         "the packed kernel computes",
         ("rows",)),
    Kind(SPEC_OFF, ("scope",),
         "drafting stopped paying: scope request (rid; rate, the weighted share of its drafts "
         "the model kept, fell below what a drafted position costs; steps: its pause) or batch "
         "(decoding requests above max_batch: none is drafted for); or scope request with "
         "reason seed: it samples with its own seed, so it is never drafted for (its answer "
         "must not depend on what the pool funds)",
         ("rid", "rate", "steps", "decoding", "max_batch", "reason")),
    Kind(SPEC_ON, ("scope",),
         "drafting again: a request's pause is over (rid), or the batch narrowed (decoding)",
         ("rid", "decoding", "max_batch")),
    Kind(REQUEST_REJECTED, ("method", "route", "status", "reason"),
         "the HTTP frontend answered a request with an error before or instead of serving it "
         "(every status from 400 up but 499, a client that left): route is the route's template "
         "(unmatched: no route), reason the message the client was told, field the request "
         "field it names; a 500 (an unhandled exception) carries the traceback's text, which "
         "the client never sees",
         ("path", "field", "traceback", "process")),
    Kind(FRONTEND_STALL, ("since", "limit_s"),
         "the HTTP frontend's event loop did not turn for longer than its limit "
         "(--loop-stall-timeout): written by a watching thread while it stands, with the wall "
         "time of its last turn (since) and where the loop's thread was (stack)",
         ("stack", "process")),
    Kind(FRONTEND_RESUME, ("stalled_s",),
         "the HTTP frontend's event loop turns again after standing stalled_s seconds",
         ("process",)),
    Kind(RESPONSE_EVICT, ("id", "reason", "bound"),
         "a stored response (/v1/responses, store: true) was dropped from memory, least recently "
         "used first, to keep at most bound of them (--max-stored-responses; a server without "
         "--kv-store-dir keeps them in memory only): a previous_response_id naming it is a 404 "
         "from now on",
         ("stored", "process")),
    Kind(RESPONSE_UNCHECKPOINTED, ("id", "status", "reason"),
         "a stored response's conversation could not be checkpointed in the durable store (its "
         "answer and its items are stored all the same): status and reason are the checkpoint's "
         "refusal (400: under one store page; 409: over the pin budget; 507: no room), so a "
         "continued response may recompute its prefix",
         ("tokens", "process")),
)  # fmt: skip

CATALOG: dict[str, Kind] = {k.name: k for k in _CATALOG}


def missing_fields(event: str, fields: dict[str, object]) -> list[str]:
    """Required fields of ``event`` absent from ``fields``; raises KeyError for an unknown kind."""
    kind = CATALOG[event]
    return [f for f in kind.fields if f not in fields]


def known_field(event: str, field: str) -> bool:
    """Whether a receipt of ``event`` may be selected on ``field`` (common, required or one of
    the optional fields the engine writes)."""
    kind = CATALOG.get(event)
    return kind is not None and (
        field in COMMON_FIELDS or field in kind.fields or field in kind.optional
    )
