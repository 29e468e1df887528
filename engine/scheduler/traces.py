"""The scheduler's request spans: one span per scheduled request, with child spans for its
queue, prefill chunks, parks and decode, driven by the scheduler's own receipts.

Off unless tracing is configured; ``RequestTraces.of`` then listens to the receipts, and the
scheduler it is handed to calls it at its two untapped moments (a request handed in, a step
done).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from engine.observability import schema
from engine.observability.receipts import Receipts
from engine.observability.tracing import Tracing, clean, set_error

if TYPE_CHECKING:
    from engine.scheduler.request import Request


@dataclass(slots=True)
class _Live:
    """The open spans of one scheduled request (OpenTelemetry's, a package imported only when
    tracing is on: hence ``Any``)."""

    span: Any  # the request (one choice), received -> finished or aborted
    queue: Any = None  # received or requeued -> admitted
    parked: Any = None  # parked -> unparked
    decode: Any = None  # first token of a run -> end, retraction, or abort
    chunks: list[Any] = field(default_factory=list)  # prefill chunks of this step
    n_chunks: int = 0


_ENDINGS = (schema.REQUEST_FINISH, schema.REQUEST_ABORT)


class RequestTraces:
    """The scheduler's spans, driven by its receipts (one hook: ``Receipts.tap``) plus the
    two moments no receipt marks: a request handed in, and the end of a step.

    Every receipt naming a live request (``rid`` or ``rids``) becomes an event, with the
    receipt's fields, on that request's span. Never raises: a failure is said once as a notice
    and tracing goes on for the other requests."""

    def __init__(self, tracing: Tracing, receipts: Receipts) -> None:
        self.tracing = tracing
        self.receipts = receipts
        self.live: dict[str, _Live] = {}
        receipts.listen(self.on_receipt)

    @classmethod
    def of(cls, tracing: Tracing | None, receipts: Receipts) -> RequestTraces | None:
        """The request spans of the scheduler writing ``receipts`` (it calls ``open`` and
        ``step_done``); None when tracing is off."""
        if tracing is None or not tracing.enabled:
            return None
        return cls(tracing, receipts)

    def _failed(self, e: Exception) -> None:
        try:
            self.receipts.notice(
                "trace_hook_failed", f"a trace hook failed: {type(e).__name__}: {e}"
            )
        except Exception:
            pass

    def _child(self, live: _Live, name: str, **attributes: Any) -> Any:
        from opentelemetry.trace import set_span_in_context

        return self.tracing.start_span(
            name, parent=set_span_in_context(live.span), attributes=clean(attributes)
        )

    def open(self, req: Request) -> None:
        """A request was handed in (called before its ``request.received`` receipt)."""
        try:
            parent = self.tracing.context_from({"traceparent": req.trace_parent or ""})
            span = self.tracing.start_span(
                "scheduler.request",
                parent=parent,
                attributes=clean(
                    {
                        "attest.rid": req.rid,
                        "attest.boot": self.receipts.boot,
                        "gen_ai.request.max_tokens": req.params.max_tokens,
                        "attest.prompt_tokens": req.prompt_len,
                    }
                ),
            )
            live = self.live[req.rid] = _Live(span)
            live.queue = self._child(live, "scheduler.queue", **{"attest.rid": req.rid})
        except Exception as e:
            self._failed(e)

    def on_receipt(self, event: str, fields: dict[str, Any]) -> None:
        """The receipt hook: an event on the named requests' spans, and their phases."""
        try:
            rid = fields.get("rid")
            if rid is not None:
                live = self.live.get(rid)
                if live is not None:
                    self._apply(live, rid, event, fields)
            for r in fields.get("rids") or ():
                live = self.live.get(r)
                if live is not None:
                    self._apply(live, r, event, fields)
        except Exception as e:
            self._failed(e)

    def _apply(self, live: _Live, rid: str, event: str, fields: dict[str, Any]) -> None:
        live.span.add_event(event, attributes=clean(fields))
        if event == schema.ADMISSION_ADMIT:
            if live.queue is not None:
                live.queue.end()
                live.queue = None
            live.n_chunks += 1
            live.chunks.append(
                self._child(
                    live,
                    "scheduler.prefill",
                    **{
                        "attest.rid": rid,
                        "attest.chunk.index": live.n_chunks - 1,
                        "attest.chunk.tokens": fields.get("tokens"),
                        "attest.chunk.offset": fields.get("held"),
                        "attest.chunk.prefix_hit": fields.get("prefix_hit"),
                        "attest.retractions": fields.get("retracted"),
                    },
                )
            )
        elif event == schema.ADMISSION_PARK:
            if live.parked is None:
                live.parked = self._child(
                    live,
                    "scheduler.parked",
                    **{
                        "attest.rid": rid,
                        "attest.park.reason": fields.get("reason"),
                        "attest.park.need": fields.get("need"),
                        "attest.park.fundable": fields.get("fundable"),
                    },
                )
        elif event == schema.ADMISSION_UNPARK:
            if live.parked is not None:
                live.parked.end()
                live.parked = None
        elif event == schema.RETRACT:
            self._end_phases(live)
        elif event == schema.REQUEUE:
            if live.queue is None:
                live.queue = self._child(
                    live, "scheduler.queue", **{"attest.rid": rid, "attest.requeued": True}
                )
        elif event in _ENDINGS:
            self._finish(live, event, fields)
            del self.live[rid]

    def _end_phases(self, live: _Live) -> None:
        for s in (*live.chunks, live.queue, live.parked, live.decode):
            if s is not None:
                s.end()
        live.chunks = []
        live.queue = live.parked = live.decode = None

    def _finish(self, live: _Live, event: str, f: dict[str, Any]) -> None:
        self._end_phases(live)
        reason = f.get("reason")
        finish = "abort" if event == schema.REQUEST_ABORT else reason
        live.span.set_attributes(
            clean(
                {
                    "gen_ai.usage.input_tokens": f.get("prompt_tokens"),
                    "gen_ai.usage.output_tokens": f.get("tokens"),
                    "gen_ai.usage.cache_read.input_tokens": f.get("cached"),
                    "gen_ai.response.finish_reasons": [finish] if finish else None,
                    "attest.cached_tokens": f.get("cached"),
                    "attest.parks": f.get("parks"),
                    "attest.retractions": f.get("retractions"),
                    "attest.queue_s": f.get("queue_s"),
                    "attest.ttft_s": f.get("ttft_s"),
                    "attest.e2e_s": f.get("e2e_s"),
                    "attest.chunks": live.n_chunks,
                    "attest.spec.proposed": f.get("spec_proposed"),
                    "attest.spec.accepted": f.get("spec_accepted"),
                    "attest.abort_reason": reason if event == schema.REQUEST_ABORT else None,
                }
            )
        )
        if event == schema.REQUEST_ABORT:
            set_error(live.span, f"aborted: {reason}")
        live.span.end()

    def step_done(self, chunks: list[tuple[Request, int]]) -> None:
        """The step's forward is done: its prefill chunks end, and a request whose prefill
        completed has its first token of this run: its decode phase begins."""
        try:
            for req, _ in chunks:
                live = self.live.get(req.rid)
                if live is None:
                    continue  # it ended in this step
                for s in live.chunks:
                    s.end()
                live.chunks = []
                if not req.prefilling and live.decode is None:
                    live.decode = self._child(live, "scheduler.decode", **{"attest.rid": req.rid})
        except Exception as e:
            self._failed(e)
