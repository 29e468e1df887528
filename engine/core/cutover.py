"""Cutover: a live change of serving configuration, while serving.

* **weights** (``path``): the new weights load beside the old ones while serving goes on; an
  architecture that differs is refused. Then ``drain``: the line is held until the residents
  finish on the old weights; ``carry``: at the next iteration boundary the residents go back in
  line with the tokens they generated. Either way the prefix cache is dropped (its KV belongs
  to the old weights), the weights are swapped, and serving resumes on the new ones.
* **pool** (``kv_tokens``): the device KV pool is resized. ``carry``: at the next boundary, the
  residents that fit keep their KV (copied into the new pool, slot tables re-homed) and go on
  decoding; those that do not are put back in line; cached prefix is kept up to what fits.
  ``drain``: the line is held until nothing runs, then the cached prefix is carried alone.
* **layout** (``tp``, ``pp``): the same ranks of a group take another layout (``tp`` x ``pp``
  of them: pipeline stages and tensor shards). Every rank makes the change at one boundary
  (rank 0 hands the others a ``Relayout``; a drain's hold is every rank's too): the residents
  go back in line with the tokens they generated and re-prefill in the new layout (their KV
  is not re-sharded), the prefix cache is dropped, and each rank reads its new part of the
  weights and builds its pool for its layers and heads (``group.layout``). The carry takes the
  resident set as the scheduler holds it, up to ``running_ceiling`` (a chunked prefill in
  flight beside ``max_running`` decoders), a count the same on every rank.

Every begin has its end: a cutover that cannot reach its change within ``cutover_timeout``
(weights whose read never returns, a drain that does not end) ends ``timeout``; one cancelled
(``DELETE /admin/cutover/{id}``) ends ``cancelled``; one under way when the engine stops ends
``stopped``. Nothing changes in any of these. A pool cutover keeps the promises made to served
requests (``engine/scheduler/promises.py``) and needs the memory for its new pool beside the old.

Receipts: ``cutover.begin`` (the census before), ``cutover.carry`` (what moved),
``cutover.end`` (outcome ok / rejected / failed / timeout / cancelled / stopped, the census
after, the pause). A refused cutover still writes its begin and its end, and changes nothing; a
census that fails writes a notice and the cutover goes on. The phases are children of a ``cutover`` span when tracing is
on. The engine steps between calls to ``advance``: serving never stops for longer than the
change itself (a drain holds only the line).
"""

from __future__ import annotations

import itertools
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from engine.config import EngineConfig
from engine.memory.kv_pool import KVPool
from engine.model.config import ModelConfig
from engine.model.llama import LlamaModel
from engine.model.loader import LoadedModel, load_model
from engine.model.shard import check_layout
from engine.observability import schema
from engine.observability.receipts import Receipts
from engine.request.messages import Cutover
from engine.scheduler import carry, checks, promises
from engine.scheduler.admission import running_ceiling
from engine.scheduler.census import Census, take_census
from engine.scheduler.group import Relayout
from engine.scheduler.request import Request
from engine.scheduler.scheduler import Scheduler

# the numbers of a model that must match for its weights to replace the serving ones
SHAPE = (
    "architecture",
    "vocab_size",
    "hidden_size",
    "intermediate_size",
    "num_layers",
    "num_heads",
    "num_kv_heads",
    "head_dim",
    "tie_word_embeddings",
)
EMPTY = Census((), (), (), 0)


class CutoverTarget(Protocol):
    """What a cutover reads and changes of its engine (``EngineCore``, which builds its
    ``Cutovers`` and so cannot be imported here): the parts it counts, the three changes, and
    the decode graphs captured anew after a change (``recapture``)."""

    config: EngineConfig
    scheduler: Scheduler
    receipts: Receipts
    kv: KVPool
    model_config: ModelConfig

    def build_model(self, loaded: LoadedModel) -> LlamaModel: ...
    def swap_model(self, loaded: LoadedModel, model: LlamaModel) -> None: ...
    def relayout(self, op: Relayout) -> carry.Carried: ...
    def weights_fields(self) -> dict[str, Any]: ...
    def recapture(self) -> None: ...


class Refused(Exception):
    """A cutover that cannot be done as asked: nothing changes (``status``: the HTTP answer;
    ``fields``: what the cutover.end adds, e.g. the promises it would break)."""

    def __init__(self, reason: str, status: int = 400, **fields: Any) -> None:
        super().__init__(reason)
        self.status = status
        self.fields = fields


@dataclass(slots=True)
class Active:
    id: str
    ask: Cutover
    before: Census
    t0: float = field(default_factory=time.perf_counter)
    paused: float | None = None  # when new work stopped starting (a hold, or the change)
    hold: carry.Hold | None = None
    loading: threading.Thread | None = None
    # the file read, and the model built from it
    loaded: tuple[LoadedModel, LlamaModel] | None = None
    load_error: BaseException | None = None
    phases: list[tuple[str, int, int, dict[str, Any]]] = field(default_factory=list)
    t0_ns: int = field(default_factory=time.time_ns)
    extra: dict[str, Any] = field(default_factory=dict)  # cutover.end fields a refusal adds


class Cutovers:
    """The cutovers of one engine: at most one at a time (another is refused, 409)."""

    def __init__(self, core: CutoverTarget) -> None:
        self.core = core
        self.active: Active | None = None
        self._ids = itertools.count(1)

    @property
    def sched(self) -> Scheduler:
        return self.core.scheduler

    # -- bookkeeping (never raises into a cutover) --------------------------------------------

    def census(self) -> tuple[Census, dict[str, Any]]:
        """The census now, or an empty one and the error when it cannot be taken (a notice)."""
        try:
            return take_census(self.sched.running, self.sched.waiting), {}
        except Exception as e:
            text = f"cutover census failed: {type(e).__name__}: {e}"
            self.core.receipts.notice("cutover_census", text)
            return EMPTY, {"census_error": text}

    def _ceiling(self) -> int:
        return running_ceiling(self.core.config.scheduler.max_running)

    # -- the cutover ----------------------------------------------------------------------------

    def begin(self, ask: Cutover) -> dict[str, Any] | None:
        """Start a cutover. Its end fields at once when it is refused or already done (a carry
        at this boundary); None while it runs on (``advance`` between steps finishes it)."""
        cid = f"c-{next(self._ids)}"
        before, error = self.census()
        asked = (("path", ask.path), ("kv_tokens", ask.kv_tokens), ("tp", ask.tp), ("pp", ask.pp))
        where = {k: v for k, v in asked if v is not None}
        self.core.receipts.emit(
            schema.CUTOVER_BEGIN,
            id=cid,
            kind=ask.kind,
            mode=ask.mode,
            **where,
            **before.fields(),
            ceiling=self._ceiling(),
            **error,
        )
        a = Active(cid, ask, before)
        try:
            if self.active is not None:
                cid = self.active.id
                raise Refused(
                    f"cutover {cid} is under way (DELETE /admin/cutover/{cid} cancels it)", 409
                )
            world = self.core.config.group.world
            if world > 1 and ask.kind != "layout":  # every rank would change at one boundary
                raise Refused(
                    f"a {ask.kind} cutover runs on one rank only; this engine has {world} ranks",
                    409,
                )
            self._check(ask)
        except Refused as e:
            a.extra.update(e.fields)
            return self._end(a, "rejected", str(e), e.status)
        self.active = a
        if ask.kind == "weights":
            a.loading = threading.Thread(target=self._load, args=(a,), daemon=True)
            a.loading.start()
        return self.advance()

    def _check(self, ask: Cutover) -> None:
        if ask.kind not in ("weights", "pool", "layout"):
            raise Refused(f"kind must be 'weights', 'pool' or 'layout', not {ask.kind!r}")
        if ask.mode not in ("drain", "carry"):
            raise Refused(f"mode must be 'drain' or 'carry', not {ask.mode!r}")
        if ask.promises not in promises.ON_BROKEN:
            raise Refused(f"promises must be 'refuse' or 'cap', not {ask.promises!r}")
        if ask.kind == "layout":
            return self._check_layout(ask)
        if ask.kind == "weights":
            if not ask.path:
                raise Refused("a weights cutover needs a path")
            if not Path(ask.path).exists():
                raise Refused(f"no weights at {ask.path!r}: the path does not exist")
            return
        tokens, page = ask.kv_tokens, self.sched.page_size
        if not isinstance(tokens, int) or isinstance(tokens, bool) or tokens < page:
            raise Refused(f"a pool cutover needs kv_tokens, at least one page ({page})")
        least = carry.in_flight_minimum(self.sched.requests.values(), self.sched.page_size)
        if tokens - tokens % page < least:
            raise Refused(
                f"a pool of {tokens} tokens is smaller than the in-flight minimum of {least} "
                "(the longest live request and its next token, in whole pages)"
            )
        per_token, device = self.core.kv.bytes_per_token, self.core.config.model.device
        if why := promises.memory_refusal(tokens - tokens % page, per_token, device):
            raise Refused(why)
        self._promises(ask)

    def _check_layout(self, ask: Cutover) -> None:
        """A layout the same ranks can take: tp x pp of them, heads that divide by tp, no more
        stages than layers, not the layout serving now."""
        group, cfg = self.core.config.group, self.core.model_config
        tp, pp = ask.tp, ask.pp
        if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 1 for v in (tp, pp)):
            raise Refused("a layout cutover needs tp and pp, integers >= 1")
        if tp * pp != group.world:
            raise Refused(
                f"a layout cutover keeps the group's {group.world} ranks: tp {tp} x pp {pp} is "
                f"{tp * pp}"
            )
        if (tp, pp) == (group.tp, group.pp):
            raise Refused(f"the group serves tp {tp} x pp {pp} already", 409)
        try:
            check_layout(cfg, tp, pp)
        except ValueError as e:
            raise Refused(str(e)) from None

    def _promises(self, ask: Cutover) -> list[Request]:
        """The promised requests a pool of the asked size breaks; refused (409, naming them)
        unless the cutover asks to cap them."""
        capacity = ask.kv_tokens - ask.kv_tokens % self.sched.page_size
        broken = promises.broken(self.sched.requests.values(), capacity)
        if broken and ask.promises != "cap":
            raise Refused(promises.refusal(broken, capacity), 409, promises=promises.named(broken))
        return broken

    def _load(self, a: Active) -> None:
        """The new weights, loaded and checked beside the serving ones (a thread)."""
        t0 = time.time_ns()
        try:
            core = self.core
            loaded = load_model(a.ask.path)
            old, new = core.model_config, loaded.config
            differ = [
                f"{k} {getattr(new, k)} (serving {getattr(old, k)})"
                for k in SHAPE
                if getattr(new, k) != getattr(old, k)
            ]
            if differ:
                raise Refused(f"another architecture: {', '.join(differ)}")
            a.loaded = (loaded, core.build_model(loaded))
        except BaseException as e:
            a.load_error = e
        a.phases.append(("load", t0, time.time_ns(), {"attest.path": a.ask.path}))

    def advance(self) -> dict[str, Any] | None:
        """Between steps: move the active cutover on. Its end fields once it has ended."""
        a = self.active
        if a is None:
            return None
        if (waited := time.perf_counter() - a.t0) > (limit := self._timeout()):
            return self._finish(a, "timeout", self._late(a, waited, limit), 504)
        if a.loading is not None and a.loading.is_alive():
            return None
        if a.load_error is not None:
            e = a.load_error
            status = e.status if isinstance(e, Refused) else 400
            reason = str(e) if isinstance(e, Refused) else f"cannot load {a.ask.path!r}: {e}"
            return self._finish(a, "rejected", reason, status)
        if a.ask.mode == "drain" and self.sched.running:
            if a.hold is None:
                hold = carry.Hold(self.sched.admitter, self.sched.group).close()
                a.paused, a.hold = time.perf_counter(), hold
                a.phases.append(("drain", time.time_ns(), 0, {}))
            return None
        if a.hold is not None:
            name, t0, _, attrs = a.phases[-1]
            a.phases[-1] = (name, t0, time.time_ns(), attrs)
        if a.paused is None:
            a.paused = time.perf_counter()
        try:
            self._change(a)
        except Refused as e:  # a promise made while it drained, which the new pool breaks
            a.extra.update(e.fields)
            return self._finish(a, "rejected", str(e), e.status)
        except Exception as e:
            self.core.receipts.notice("cutover_failed", f"cutover {a.id}: {type(e).__name__}: {e}")
            return self._finish(a, "failed", f"{type(e).__name__}: {e}", 500)
        return self._finish(a, "ok", None, 200)

    def _change(self, a: Active) -> None:
        """The change itself, at an iteration boundary."""
        sched, t0 = self.sched, time.time_ns()
        sched.unplan()  # a step planned ahead holds slots of the pool about to change
        if a.ask.kind == "pool":
            broken = self._promises(a.ask)  # again: a drain let promises be made meanwhile
            capacity = a.ask.kv_tokens - a.ask.kv_tokens % sched.page_size
            promises.cap(broken, capacity, a.id, self.core.receipts)
            carried = carry.resize_pool(sched.memory, self.core.kv, a.ask.kv_tokens)
            self.core.recapture()  # the decode graphs wrote the pool before it
        elif a.ask.kind == "layout":
            op = Relayout(a.id, a.ask.tp, a.ask.pp)
            carry.check_ceiling(sched.memory, self.core.config.scheduler.max_running)
            sched.group.announce(op)  # rank 0: every other rank makes the same change now
            carried = self.core.relayout(op)
        else:
            carried = carry.put_all_back(sched.memory)
            carried.evicted = carry.drop_prefix_cache(sched.memory)
            loaded, model = a.loaded
            self.core.swap_model(loaded, model)
            a.loaded = None
        self.core.receipts.emit(
            schema.CUTOVER_CARRY, id=a.id, **carried.fields(sched.cache.total_size())
        )
        a.phases.append(
            (
                "carry",
                t0,
                time.time_ns(),
                {"attest.carried": len(carried.rids), "attest.requeued": len(carried.requeued)},
            )
        )
        checks.audit_idle(sched)  # receipts only: bookkeeping never raises into a cutover

    def _timeout(self) -> float:
        return self.core.config.scheduler.cutover_timeout

    def _late(self, a: Active, waited: float, limit: float) -> str:
        """Why a cutover ran past its limit: what it was still waiting for."""
        if a.loading is not None and a.loading.is_alive():
            what = f"the weights at {a.ask.path!r} were still loading"
        else:
            what = f"{len(self.sched.running)} resident(s) were still running (a drain)"
        return (
            f"the cutover did not reach its change within {limit:g} s (--cutover-timeout; "
            f"{waited:.1f} s passed): {what}; nothing changed"
        )

    def cancel(self, cid: str) -> dict[str, Any] | None:
        """End the cutover ``cid`` under way before its change (outcome ``cancelled``, nothing
        changes); None when no cutover of that id is under way."""
        a = self.active
        if a is None or a.id != cid:
            return None
        return self._finish(a, "cancelled", f"cutover {cid} was cancelled; nothing changed", 409)

    def halt(self, reason: str) -> dict[str, Any] | None:
        """The engine stops: a cutover under way ends ``stopped`` (nothing changes), so its
        begin has its end before ``boot.stop``. None when none is under way."""
        a = self.active
        if a is None:
            return None
        text = f"the engine stopped ({reason}) before cutover {a.id} ended; nothing changed"
        return self._finish(a, "stopped", text, 503)

    def _finish(self, a: Active, outcome: str, reason: str | None, status: int) -> dict[str, Any]:
        """End the active cutover: the line opens again; weights loaded for it are let go (a
        load still under way finishes into nothing: a thread cannot be stopped)."""
        if a.hold is not None:
            a.hold.open()
        a.loaded = None
        self.active = None
        return self._end(a, outcome, reason, status)

    def _end(self, a: Active, outcome: str, reason: str | None, status: int) -> dict[str, Any]:
        after, error = self.census()
        gone = [rid for rid in a.before.rids() if rid not in self.sched.requests]
        if doubled := after.doubled():
            self.core.receipts.violation("cutover_census", id=a.id, doubled=doubled)
        pause = 0.0 if a.paused is None else time.perf_counter() - a.paused
        fields = {
            "id": a.id,
            "kind": a.ask.kind,
            "mode": a.ask.mode,
            "outcome": outcome,
            "status": status,
            **after.fields(),
            "rids": sorted({*after.rids(), *gone}),
            "ended": gone,
            "backlog_before": a.before.backlog,
            "rids_before": a.before.rids(),
            "pause_s": round(pause, 6),
            "seconds": round(time.perf_counter() - a.t0, 6),
            "kv_tokens": self.sched.allocator.capacity,
            "ceiling": self._ceiling(),
            **error,
            **a.extra,
        }
        if reason is not None:
            fields["reason"] = reason
        if a.ask.path is not None:
            fields["path"] = a.ask.path
        if a.ask.kind == "weights" and outcome == "ok":  # which weights and kernels now serve
            fields["weights"] = self.core.weights_fields()
        if a.ask.kind == "layout":  # the layout serving after it
            fields["tp"], fields["pp"] = self.core.config.group.tp, self.core.config.group.pp
        self.core.receipts.emit(schema.CUTOVER_END, **fields)
        self._span(a, fields)
        return fields

    def _span(self, a: Active, fields: dict[str, Any]) -> None:
        """The ``cutover`` root span, its phases as children (tracing on only; never raises)."""
        traces = self.sched.traces
        if traces is None:
            return
        try:
            from opentelemetry.trace import set_span_in_context

            attrs = {
                "attest.cutover.id": a.id,
                "attest.cutover.kind": a.ask.kind,
                "attest.cutover.mode": a.ask.mode,
                "attest.cutover.outcome": fields["outcome"],
                "attest.cutover.pause_s": fields["pause_s"],
            }
            tr = traces.tracing
            root = tr.start_span(
                "cutover", parent=_root_context(), start_ns=a.t0_ns, attributes=attrs
            )
            for name, t0, t1, extra in a.phases:
                child = tr.start_span(
                    name, parent=set_span_in_context(root), start_ns=t0, attributes=extra or None
                )
                child.end(end_time=t1 or time.time_ns())
            root.end()
        except Exception as e:
            self.core.receipts.notice("cutover_span", f"cutover span failed: {e}")

    def run(self, ask: Cutover) -> dict[str, Any]:
        """A whole cutover, stepping the engine while it runs (the offline API's)."""
        fields = self.begin(ask)
        while fields is None:
            loading = self.active.loading if self.active is not None else None
            if self.sched.has_work():
                self.sched.step()
            elif loading is not None:
                loading.join(0.05)
            fields = self.advance()
        return fields


def _root_context() -> Any:
    from opentelemetry.context import Context

    return Context()
