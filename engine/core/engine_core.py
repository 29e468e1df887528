"""EngineCore: model, memory and scheduler built from one EngineConfig."""

from __future__ import annotations

import math
import os
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any, Protocol

import torch

from engine.config import EngineConfig
from engine.core.cutover import Cutovers
from engine.core.heap import give_back, keep_freed
from engine.core.info import engine_info
from engine.core.phase import PhasePolicy, check_layouts
from engine.group.comm import Comm, GroupFailure
from engine.memory.allocator import TokenAllocator
from engine.memory.kv_pool import KVPool, size_pool
from engine.memory.radix import RadixCache
from engine.memory.req_table import ReqToTokenPool
from engine.model.graphs import (
    DecodeGraphs,
    build_graphs,
    capture_or_eager,
    capture_sizes,
    graphs_off,
)
from engine.model.llama import LlamaModel
from engine.model.loader import LoadedModel, load_model
from engine.model.quant import QuantPlan, plan_quant
from engine.model.runner import BatchEntry, ModelRunner
from engine.model.shard import check_layout
from engine.observability import schema
from engine.observability.boot_fields import boot_fields
from engine.observability.clip import clip_words
from engine.observability.receipts import Receipts
from engine.observability.tracing import Tracing
from engine.request.messages import EngineInfo, Launch, StepOutput
from engine.scheduler import carry
from engine.scheduler.admission import running_ceiling
from engine.scheduler.group import GroupView, PublishedGroup, Relayout
from engine.scheduler.scheduler import Scheduler
from engine.scheduler.traces import RequestTraces
from engine.tiers.host_tier import HostTier, size_host_tier
from engine.tiers.store_tier import StoreTier, model_identity, open_store
from kernels import cpu_ops
from kernels.attention import AttentionBackend, HeadShape
from kernels.select import choose_backend, get_backend

# the dtypes EngineConfig accepts (validated there, torch-free), as torch knows them
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


class Membership(Protocol):
    """This process's place in its group (``engine.core.group_boot.Member``, whose module
    builds the engine and so cannot be imported here)."""

    boot: str | None

    @property
    def comm(self) -> Comm: ...
    @property
    def rank(self) -> int: ...
    def lost(self, grace: float = ...) -> list[int]: ...
    def reap(self, timeout: float = ...) -> None: ...


# how rank 0 joins its group once the model's shapes are checked: (config, boot id) -> its place
Join = Callable[[EngineConfig, str], Membership]


class EngineCore:
    """``launch``: the frontend's facts when served. Then ``boot.ready`` waits for ``ready()``,
    called once the HTTP socket serves; offline it is written as soon as the engine is built."""

    def __init__(
        self,
        config: EngineConfig,
        loaded: LoadedModel | None = None,
        launch: Launch | None = None,
        member: Membership | None = None,
        join: Join | None = None,
        tracing: Tracing | None = None,
        group: GroupView | None = None,
    ) -> None:
        """``member``: this rank's place in a group (``engine.core.group_boot.Member``) when it joined
        before the engine was built (ranks above 0); ``join``: how rank 0 joins its group,
        called once the model's shapes are checked against ``tp`` (``engine.core.group_boot.boot``);
        ``tracing``: request spans when enabled; ``group``: this rank's view of its group when
        built elsewhere (otherwise one rank alone, or the published group of ``tp`` ranks)."""
        self._t0 = time.perf_counter()
        config.validate()
        if config.group.world > 1 and member is None and join is None:
            raise ValueError(
                f"{config.group.world} ranks need their group: build it with engine.core.group_boot.boot"
            )
        self.config, self.member = config, member
        self.rank = member.rank if member is not None else 0
        self.receipts = self._open_log(launch)
        self._set_threads()
        self.heap = keep_freed()  # before the load, whose measure of the products it steadies
        backend = self._choose_backend()
        self._load(loaded, backend, join)  # what the load freed given back (_new_model) ...
        self._size_memory()  # ... before the pool's sizing reads the free memory
        self.scheduler = self._build_scheduler(tracing, group)
        self.cutovers = Cutovers(self)
        auto = config.group.phase_policy == "auto" and self.rank == 0
        self.phase = PhasePolicy(self) if auto else None  # rank 0 decides, the others follow
        self._stopped = False
        self._ready = False
        self.startup_seconds = time.perf_counter() - self._t0
        if launch is None:
            self.ready()

    def _open_log(self, launch: Launch | None) -> Receipts:
        """The boot log (without one, the newest receipts kept in memory, bounded), opened
        with ``boot.start``."""
        c, rank = self.config, self.rank
        receipts = Receipts(
            c.log_file_of(rank) if c.observability.receipts else None,
            capture=c.observability.receipts and c.observability.log_file is None,
            console=c.observability.receipts and c.observability.console_receipts,
            enabled=c.observability.receipts,
            boot=self.member.boot if self.member is not None else None,
            rank=rank,
        )
        receipts.emit(schema.BOOT_START, **boot_fields(c, launch))
        if launch is not None and launch.stale_pid is not None:
            receipts.emit(schema.BOOT_STALE_PID, **launch.stale_pid)
        return receipts

    def _set_threads(self) -> None:
        from engine.core.threads import (  # torch-free; why in its docstring
            choose_threads,
            usable_cpus,
        )

        c = self.config
        ranks_here = (
            c.group.world if c.group.dist_init == "spawn" else 1
        )  # spawned ranks share the CPUs
        threads = choose_threads(c.model.threads, os.environ, usable_cpus(), ranks_here)
        if threads is not None:
            torch.set_num_threads(threads)

    def _choose_backend(self) -> AttentionBackend:
        """Fast mode's plan (the activations' dtype by what the CPU has), and the attention
        backend, which fails now, before any weight is loaded, if it cannot run here."""
        c = self.config
        self.quant = self._plan_quant()
        self.dtype = self.quant.dtype if self.quant else DTYPES[c.model.dtype]
        choice = choose_backend(c.model.attention_backend, c.model.device, self.dtype)
        if choice.note is not None:  # an unverified fast path is never taken silently
            self.receipts.notice("attention_backend", choice.note, process="scheduler")
            print(f"attest: {choice.note}", file=sys.stderr, flush=True)
        return get_backend(choice.name, c.model.device, self.dtype, c.memory.page_size)

    def _load(
        self, loaded: LoadedModel | None, backend: AttentionBackend, join: Join | None
    ) -> None:
        """The weights, checked against ``tp`` before any other rank starts (a ValueError
        naming the numbers, exit 2), then rank 0 joins its group and the model is built."""
        c = self.config
        self.loaded = loaded or load_model(c.model.model)
        cfg = self.model_config = self.loaded.config
        self.tokenizer = self.loaded.tokenizer
        check_layout(cfg, c.group.tp, c.group.pp)  # before any other rank starts
        if c.group.phase_policy == "auto":  # and so do both layouts the policy flips between
            check_layouts(cfg, c.group.world)
        if join is not None:
            self.member = join(c, self.receipts.boot)
        self.comm = self.member.comm if self.member is not None else Comm()
        self.shard_comm, self.stage = self.comm.layout(c.group.tp)
        self.model = self._new_model(self.loaded, backend, self.quant)
        if torch.device(c.model.device).type == "cpu" and c.group.world == 1:
            # the backend times its ways for these shapes (a group's ranks keep the default,
            # so they attend alike)
            backend.prepare(self.head_shape)
        self.receipts.emit(schema.BOOT_WEIGHTS, **self.weights_fields())
        self.max_context = min(c.model.max_model_len or cfg.max_position, cfg.max_position)

    @property
    def kv_dtype(self) -> torch.dtype:
        """The KV pool's dtype: fast mode's plan's, else the activations'."""
        return self.quant.kv_dtype if self.quant else self.dtype

    @property
    def head_shape(self) -> HeadShape:
        """This rank's attention shapes and dtypes, as the backend's choices read them."""
        m = self.model
        return HeadShape(
            m.local_heads, m.local_kv_heads, self.model_config.head_dim, self.dtype, self.kv_dtype
        )

    def _size_memory(self) -> None:
        """The KV pool (this rank's heads), its allocator, the request table, the runner."""
        c, cfg = self.config, self.model_config
        kv_dtype = self.kv_dtype
        kv_heads = self.model.local_kv_heads  # this rank's share of them
        layers = len(self.model.span)  # and of the layers, on a pipeline stage
        per_token = cfg.kv_bytes_per_token(torch.finfo(kv_dtype).bits // 8)
        self.sizing = size_pool(
            c.kv_tokens_of(self.rank),
            c.memory.kv_memory_fraction,
            per_token * kv_heads * layers // (cfg.num_kv_heads * cfg.num_layers),
            c.memory.page_size,
        )
        self.allocator = TokenAllocator(self.sizing.kv_tokens, c.memory.page_size)
        self.kv = self._pool(self.model, self.allocator.pool_slots, kv_dtype)
        self.receipts.emit(schema.BOOT_POOL_SIZED, **self.sizing.as_fields(), **self.heap)
        self.req_table = ReqToTokenPool(running_ceiling(c.scheduler.max_running), self.max_context)
        self.runner = ModelRunner(self.model, self.kv, self.req_table, self._graphs())

    def recapture(self) -> None:
        """The runner on the serving model, its decode graphs captured anew over the serving
        weights and pool (a cutover changed one of them; the old graphs read the old ones),
        with a ``boot.graphs`` saying what was captured."""
        self.runner.serve(self.model, None)  # the old graphs' memory goes before new ones
        self.runner.serve(self.model, self._graphs())

    def _graphs(self) -> DecodeGraphs | None:
        """On CUDA, the decode steps captured as CUDA graphs, one per batch bucket up to
        ``cuda_graph_max_batch`` (at most ``max_running``), and ``boot.graphs`` saying which
        and what memory they took, or why none. None on a CPU (no receipt: nothing to
        capture) and wherever none is captured."""
        c = self.config
        if torch.device(c.model.device).type == "cpu":
            return None
        why = graphs_off(
            c.model.device,
            c.model.enforce_eager,
            c.group.world,
            self.stage.count,
            self.model.backend.name,
        )
        if why is not None:
            self.receipts.emit(schema.BOOT_GRAPHS, captured=[], why=why)
            return None
        top = min(c.model.cuda_graph_max_batch or c.scheduler.max_running, c.scheduler.max_running)
        sizes = capture_sizes(top)
        graphs, fields = capture_or_eager(
            lambda: build_graphs(self.model, self.kv, self.req_table, sizes)
        )
        self.receipts.emit(schema.BOOT_GRAPHS, **fields)
        return graphs

    def _pool(self, model: LlamaModel, slots: int, dtype: torch.dtype) -> KVPool:
        """A KV pool of ``slots`` for ``model``'s part: its stage's layers, its shard's heads."""
        heads, dim = model.local_kv_heads, self.model_config.head_dim
        return KVPool(len(model.span), slots, heads, dim, dtype, device=self.config.model.device)

    def _build_scheduler(self, tracing: Tracing | None, group: GroupView | None) -> Scheduler:
        """The prefix cache with its host tier (``tier.sized`` says how big) and durable store
        (``store.sized``), this rank's view of its group, the request spans, the scheduler."""
        c, receipts = self.config, self.receipts
        host = size_host_tier(
            c.memory.host_kv_tokens,
            c.model.device,
            self.kv,
            self.allocator,
            c.memory.prefix_cache,
            receipts,
        )
        tier = (lambda cache: HostTier(cache, self.kv, host, receipts)) if host else None
        store, self.store_off = open_store(
            c.store, c.memory.prefix_cache, c.group.world, self._identity(), receipts
        )  # store_off: why a --kv-store-dir given is not used (/health, /v1/checkpoints)
        ps, write = self.allocator.page_size, c.store.kv_store_write
        keeper = StoreTier(store, self.kv, ps, write) if store else None
        cache = RadixCache(
            self.allocator,
            disabled=not c.memory.prefix_cache,
            receipts=receipts,
            tier=tier,
            keeper=keeper,
            kv=self.kv,
        )
        self.host_tier = cache.tier
        return Scheduler(
            c,
            self.runner,
            self.allocator,
            self.req_table,
            cache,
            self.tokenizer,
            self.max_context,
            receipts,
            group or self._group(),
            RequestTraces.of(tracing, receipts),
        )

    def _identity(self) -> str:
        """The durable store's name for these weights and the KV they compute."""
        m, kv = self.config.model, self.kv.layers[0].k
        shape = [len(self.kv.layers), *kv.shape[1:], self.allocator.page_size, str(kv.dtype)]
        return model_identity(self.loaded.path, {"mode": [m.dtype, m.quant], "kv": shape})

    def weights_fields(self) -> dict[str, Any]:
        """``boot.weights``: which mode runs (exact, bfloat16, int8, int4), on a CPU whether the
        native ops run (and why not), and in fast mode the kernels chosen for this CPU and what
        the quantised weights take."""
        if self.quant is None:
            mode = "exact" if self.dtype == torch.float32 else "bfloat16"
            fields: dict[str, Any] = {"mode": mode, "dtype": self.config.model.dtype}
        else:
            fields = self.quant.fields()
        if self.stage.count > 1:  # a pipeline stage: which of the layers are here
            fields.update(
                stage=self.stage.index, layers=[self.model.span.start, self.model.span.stop]
            )
        if torch.device(self.config.model.device).type == "cpu":  # which small ops and decode run
            fields["ops"] = "native" if cpu_ops.load() else "torch"
            if fields["ops"] == "torch":
                fields["ops_why"] = cpu_ops.why_not()
            # rows up to which the norms are the native ones (0: torch's; "any": every count)
            rows = self.model.ops.norm_rows
            fields["norm_rows"] = "any" if rows == math.inf else int(rows)
            # which kernels attend, decode and extend
            attention = self.model.backend.kernels(self.head_shape)
            if attention is not None:
                fields["attention"] = attention
            parts = (("layers", self.model.orient), ("head", self.model.head_orient))
            if any(o is not None for _, o in parts):
                # dense products: the row counts that take (W @ x.T).T, and those that take
                # the weights packed at load (fast mode: its dense values'), for AMX's tiles or
                # for oneDNN
                fields["orient"] = {part: o.fields() for part, o in parts if o is not None}
                fields["prepacked"] = {
                    part: o.packed_fields() if o is not None else [] for part, o in parts
                } | {
                    "bytes": self.model.packed_bytes,
                    "tiles": self.model.packed_tiles,
                    "f32": self.model.packed_f32,
                    "pairs": self.model.packed_pairs,
                }
            # a decode forward's layers in one native call (fast and exact mode, on a CPU)
            step = self.model.native_step
            fields["step_rows"] = step.rows if step is not None else 0
        return fields

    def _group(self) -> GroupView:
        """This rank's view of its group (one rank alone publishes no floor)."""
        if self.config.group.world == 1:
            return GroupView()
        c = self.config
        every = 1 if c.scheduler.check_invariants else c.group.group_check_interval
        return PublishedGroup(
            self.comm, self.receipts, self.allocator.capacity, every, c.group.published_floor
        )

    def step(self) -> list[StepOutput]:
        """One scheduler iteration; a group that failed ends this boot with receipts first."""
        try:
            outs = self.scheduler.step()
            if self.phase is not None:  # a flip is a layout cutover at this boundary
                self.phase.after_step()
            return outs
        except GroupFailure as e:
            self.fail(e)
            raise

    def fail(self, error: BaseException) -> None:
        """The group failed (a split, a rank lost, a collective that timed out): the boot ends
        as ``shutdown`` ends it, with the reason and the ranks known lost, and this rank leaves
        the group without another collective. Idempotent."""
        if self._stopped:
            return
        reason = error.stop if isinstance(error, GroupFailure) else "rank_lost"
        lost = self.member.lost() if self.member is not None else []
        self._end_boot(reason, None, lost_ranks=lost, error=clip_words(str(error), 500))
        self.comm.close()
        if self.member is not None:
            self.member.reap(2.0)  # the others fail at the same collective; a hung one is killed

    def _plan_quant(self) -> QuantPlan | None:
        """Fast mode's plan for this CPU (None in exact or bfloat16 mode): the boot's model and
        a weights cutover's new one are quantised alike."""
        m = self.config.model
        return plan_quant(m.quant, m.device) if m.quant else None

    def build_model(self, loaded: LoadedModel) -> LlamaModel:
        """A model of ``loaded``'s weights on this engine's dtype, backend, device and place in
        its group (a weights cutover builds the new one beside the serving one)."""
        return self._new_model(loaded, self.model.backend, self._plan_quant())

    def _new_model(
        self, loaded: LoadedModel, backend: AttentionBackend, quant: QuantPlan | None
    ) -> LlamaModel:
        """The model of ``loaded``'s weights (the boot's, a weights cutover's, a relayout's): the
        file's copies are let go once it holds its own (fused, cast), and what the load freed
        is given back to the system (``engine.core.heap``: the kept heap would hold it)."""
        model = LlamaModel(
            loaded.config,
            loaded.weights,
            self.dtype,
            backend,
            device=self.config.model.device,
            comm=self.shard_comm,
            quant=quant,
            stage=self.stage,
        )
        loaded.weights = {}
        give_back()
        return model

    def swap_model(self, loaded: LoadedModel, model: LlamaModel) -> None:
        """Serve ``model`` from the next step on (at an iteration boundary, nothing resident)."""
        self.loaded, self.model, self.model_config = loaded, model, loaded.config
        self.quant = model.quant  # fast mode: the new weights' own plan (counts, bytes, time)
        self.recapture()
        if (keeper := self.scheduler.cache.keeper) is not None:  # it holds the old weights' KV
            keeper.retire("a weights cutover: the store holds KV of the weights before it")

    def relayout(self, op: Relayout) -> carry.Carried:
        """A layout cutover's change (``group.Relayout``), made by every rank of the group at one
        boundary: the residents back in line to re-prefill (the carry, within the running
        ceiling) and the cached prefixes dropped, their KV being the old layout's; then the
        group's stages and shards anew, this rank's part of the weights read again and its
        pool rebuilt for its layers and heads (the same tokens). ``group.layout`` says what it
        holds now. Returns what the carry moved."""
        t0, before, memory = time.perf_counter(), self.config.group, self.scheduler.memory
        carried = carry.put_all_back(memory)  # within the ceiling rank 0 checked (Cutovers)
        carried.evicted = carry.drop_prefix_cache(memory)
        self.config = replace(self.config, group=replace(before, tp=op.tp, pp=op.pp))
        self.shard_comm, self.stage = self.comm.layout(op.tp)
        loaded = load_model(self.loaded.path)
        model = self._new_model(loaded, self.model.backend, self.quant)
        self.kv.take_over(self._pool(model, self.kv.pool_slots, self.kv.dtype))
        self.loaded, self.model = loaded, model
        self.recapture()
        self.receipts.emit(
            schema.GROUP_LAYOUT,
            id=op.id,
            tp=op.tp,
            pp=op.pp,
            stage=self.stage.index,
            layers=[model.span.start, model.span.stop],
            kv_heads=model.local_kv_heads,
            pool_bytes=self.kv.total_bytes,
            before=[before.tp, before.pp],
            seconds=round(time.perf_counter() - t0, 6),
        )
        return carried

    def ready(self, **where: Any) -> None:
        """Write ``boot.ready`` once: the engine accepts work (``where``: the host and port it
        serves on, once the HTTP socket is bound). Idempotent."""
        if self._ready:
            return
        self._ready = True
        startup = round(time.perf_counter() - self._t0, 3)
        engine = {"engine_s": round(self.startup_seconds, 3)} if where else {}
        self.receipts.emit(schema.BOOT_READY, startup_s=startup, **engine, **where)

    def shutdown(
        self,
        reason: str = "shutdown",
        outs: list[StepOutput] | None = None,
        drained: int | None = None,
        cause: Mapping[str, Any] | None = None,
    ) -> int:
        """An orderly stop: every request still in flight ends with an abort receipt (its final
        output appended to ``outs`` when given), then ``boot.stop`` says why and how many there
        were (and ``drained``: how many ended during a drain before it; ``cause``: more fields,
        the exit code and error of a boot that never served). Returns that count. Idempotent."""
        if self._stopped:
            return 0
        fields = {**(cause or {}), **({} if drained is None else {"drained": drained})}
        n = self._end_boot(reason, outs, **fields)
        self._leave(reason)
        return n

    def _end_boot(self, reason: str, outs: list[StepOutput] | None, **fields: Any) -> int:
        """A cutover under way ends ``stopped``, every request in flight aborts with ``reason``
        (final outputs into ``outs``), then ``boot.stop`` with ``fields`` closes the log. Returns how many were in flight."""
        self._stopped = True
        self.cutovers.halt(reason)  # every cutover.begin has its end before boot.stop
        sched = self.scheduler
        sched.grammars.close()  # no compile worker outlives the boot
        ended = [o for rid in list(sched.requests) if (o := sched.abort(rid, reason=reason))]
        if sched.cache.keeper is not None:  # what is cached outlives the boot
            sched.cache.keeper.flush(sched.cache)
        if outs is not None:
            outs.extend(ended)
        self.receipts.emit(schema.BOOT_STOP, reason=reason, in_flight=len(ended), **fields)
        self.receipts.close()
        return len(ended)

    def _leave(self, reason: str) -> None:
        """Rank 0 tells the others to stop (with the aborts it just made) and waits for them."""
        if self.member is None:
            return
        if self.rank == 0:
            try:
                self.scheduler.group.sync(stop=reason)  # with the aborts it just recorded
            except GroupFailure:
                pass  # a rank already gone stops on its own
        self.comm.close()
        self.member.reap()

    def sequence_logits(self, token_ids: list[int]) -> torch.Tensor:
        """Logits [len, vocab] at every position of one sequence, in one prefill (for scoring
        and for comparing against a reference implementation). Borrows and returns its memory."""
        if self.scheduler.has_work():
            raise RuntimeError("sequence_logits needs an idle engine")
        n = len(token_ids)
        slots = self.allocator.alloc_extend(0, n, None)
        if slots is None:
            raise ValueError(
                f"{n} tokens do not fit the KV pool ({self.allocator.available_size()} free)"
            )
        row = self.req_table.alloc()
        try:
            self.req_table.write(row, 0, slots)
            return self.runner.forward(
                [BatchEntry(row, 0, list(token_ids), slots)], all_positions=True
            )
        finally:
            self.req_table.free(row)
            self.allocator.free(slots)

    def info(self) -> EngineInfo:
        """The engine's description: what ``engine info`` prints and the scheduler process
        sends the frontend at boot."""
        return engine_info(self)

    def describe(self) -> dict[str, object]:
        """``info()`` as a plain dict (for JSON and tables)."""
        return self.info().as_dict()
