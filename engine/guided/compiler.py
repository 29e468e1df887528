"""The compiled grammars of one engine: xgrammar's compiler over the served vocabulary, a cache
keyed by the guide, and the server's compiles: bounded in number, in time, and ended at their
limit.

Two ways in. ``prepare`` (the server, before a request is submitted) has a guide compiled in a
worker process (``engine/guided/compile_worker.py``), at most ``workers`` at once; ``poll`` answers it
from the loop. A compile past ``timeout_s`` (from when its worker was ready) has its worker
killed, its CPU free at once, and is refused (400), then refused at once from then on. One that
compiled in time is compiled again here, on a thread, where the matchers need it (the worker
keeps what it made: see its module), known to end; its slot is held until then. A guide that
finds no free worker waits in a line of at most ``waiting`` (each running compile ends by its
limit, so the line moves); with the line full it is refused as load (503, ``retry_after``: when
the first running compile must end), never remembered. ``compiled`` (a request added to the scheduler,
and the offline engine) takes the cached grammar, or compiles then and there. Every answer
writes a ``grammar.compile`` receipt, and each worker's start and end a ``grammar.worker``; the
receipts are written on the loop's thread, never a worker's.

xgrammar, and the torch and transformers it imports, load on the first guided request, so an
engine that never sees one pays nothing.
"""

from __future__ import annotations

import math
import threading
import time
from collections import OrderedDict
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from engine.config import SchedulerSection
from engine.guided.build import CompileError, compile_guide, token_info
from engine.guided.compile_worker import Worker
from engine.guided.masks import Guided
from engine.model.tokenizer import Tokenizer
from engine.observability import schema
from engine.observability.receipts import Receipts

if TYPE_CHECKING:  # xgrammar loads on the first guided request, not before
    import xgrammar as xgr
from engine.request.guide import Guide
from engine.request.messages import GuideReady

CACHE_ENTRIES = 256  # compiled grammars kept (least recently used dropped first)


@dataclass(slots=True)
class _Compile:
    """A guide being compiled and the prepared requests waiting for it: in a worker
    (``worker`` set, ``future`` its milliseconds), then here (``worker`` None)."""

    future: Future
    started: float
    worker: Worker | None
    tickets: list[int] = field(default_factory=list)
    ms: float = 0.0  # the worker's compile


class Grammars:
    def __init__(
        self,
        tokenizer: Tokenizer,
        vocab_size: int,
        receipts: Receipts,
        timeout_s: float,
        workers: int = 2,
        waiting: int = 8,
    ) -> None:
        self.tokenizer = tokenizer
        self.vocab_size = vocab_size
        self.receipts = receipts
        self.timeout_s = timeout_s
        self.workers = workers
        self.waiting = waiting
        self._cache: OrderedDict[Guide, Any] = OrderedDict()
        # guides that did not compile, answered at once again: bounded as the cache is, so a
        # client sending ever new bad schemas cannot grow it
        self._refused: OrderedDict[Guide, CompileError] = OrderedDict()
        self._running: dict[Guide, _Compile] = {}
        self._line: dict[Guide, list[int]] = {}  # guides waiting for a worker, in order
        self._pool: list[Worker] = []
        self._answers: list[GuideReady] = []
        self._lock = threading.Lock()  # the compiler is built once, by whichever thread is first
        self._xgr_compiler: xgr.GrammarCompiler | None = None
        self._info: xgr.TokenizerInfo | None = None
        self._controls: torch.Tensor | None = None

    @classmethod
    def of(
        cls, tokenizer: Tokenizer, vocab_size: int, receipts: Receipts, sc: SchedulerSection
    ) -> Grammars:
        """The grammars of an engine configured by its scheduler section's grammar knobs."""
        return cls(
            tokenizer,
            vocab_size,
            receipts,
            sc.grammar_timeout,
            sc.grammar_workers,
            sc.grammar_waiting,
        )

    # -- the server's way in: prepared in worker processes -----------------------------------

    def prepare(self, guide: Guide, ticket: int) -> None:
        """Have ``guide`` compiled before its request is submitted; ``poll`` answers ``ticket``."""
        if guide in self._cache or guide in self._refused:
            error = self._refused.get(guide)
            self._cache_touch(guide)
            self._emit(guide, "hit", None, error)
            self._answers.append(
                GuideReady(ticket=ticket, error=None if error is None else str(error))
            )
        elif guide in self._running:
            self._running[guide].tickets.append(ticket)
        elif guide in self._line:
            self._line[guide].append(ticket)
        elif len(self._running) < self.workers:
            self._begin(guide, [ticket])
        elif len(self._line) < self.waiting:
            self._line[guide] = [ticket]
        else:
            self._busy(guide, [ticket])

    def pending(self) -> bool:
        """Whether a prepared request still waits for its answer."""
        return bool(self._running or self._line or self._answers)

    def answered(self) -> bool:
        """Whether an answer is ready for ``poll`` to hand out."""
        return bool(self._answers)

    def running(self) -> dict[Guide, int | None]:
        """The guides compiling now, each with its worker's pid (None: compiled here again)."""
        return {g: None if c.worker is None else c.worker.pid for g, c in self._running.items()}

    def poll(self) -> list[GuideReady]:
        """The prepared requests answered since the last poll."""
        now = time.monotonic()
        for guide, job in list(self._running.items()):
            self._advance(guide, job, now)
        while self._line and len(self._running) < self.workers:
            guide, tickets = next(iter(self._line.items()))
            del self._line[guide]
            self._begin(guide, tickets)
        answers, self._answers = self._answers, []
        return answers

    def close(self) -> None:
        """End every worker (the engine stops)."""
        for worker in self._pool:
            worker.close()
            self._emit_worker(worker, "stopped")
        self._pool.clear()

    def _begin(self, guide: Guide, tickets: list[int]) -> None:
        """``guide``'s compile on a free worker, started if need be (a free slot is assured)."""
        busy = {c.worker for c in self._running.values()}
        worker = next((w for w in self._pool if w not in busy), None)
        if worker is None:
            worker = Worker(self._vocabulary)
            self._pool.append(worker)
        self._running[guide] = _Compile(worker.compile(guide), time.monotonic(), worker, tickets)

    def _advance(self, guide: Guide, job: _Compile, now: float) -> None:
        """One running compile moved on: answered, compiled here again, or ended at its limit."""
        worker = job.worker
        if worker is not None and worker.ready_at is not None and job.started < worker.ready_at:
            job.started = worker.ready_at  # its limit counts from when the worker could compile
            self._emit_worker(worker, "started", ms=worker.ready_ms)
        if job.future.done():
            try:
                if worker is None:
                    grammar, _ = job.future.result()
                else:
                    job.ms = job.future.result()
            except Exception as e:
                self._failed(guide, job, e, now, worker)
                return
            if worker is not None:  # compiled in time: once more here, where it is needed
                self._running[guide] = _Compile(self._start(guide), now, None, job.tickets, job.ms)
                return
            del self._running[guide]
            _keep(self._cache, guide, grammar)
            self._emit(guide, "miss", job.ms, None)
            self._answers += [GuideReady(ticket=t) for t in job.tickets]
        elif worker is not None and worker.ready_at is not None:
            if now - job.started > self.timeout_s:
                self._end(guide, job, worker, now)
        elif worker is not None and not worker.alive:  # died before it was ready
            self._failed(guide, job, RuntimeError("the compile worker did not start"), now, worker)

    def _failed(
        self, guide: Guide, job: _Compile, e: Exception, now: float, worker: Worker | None
    ) -> None:
        del self._running[guide]
        if not isinstance(e, CompileError):  # the compiler's fault, said as such
            e = CompileError(f"the {guide.kind} could not be compiled ({e})", "error")
        if worker is not None and not worker.alive:
            self._drop(worker, "died", exit_code=worker.proc.poll())
        self._refuse(guide, e, (now - job.started) * 1e3, job.tickets, worker)

    def _end(self, guide: Guide, job: _Compile, worker: Worker, now: float) -> None:
        """A compile past its limit: its worker killed (the CPU is free at once), the guide
        refused, and from then on at once."""
        del self._running[guide]
        worker.kill()
        self._drop(worker, "killed", guide=guide.digest, limit_s=self.timeout_s)
        e = CompileError(
            f"the {guide.kind} did not compile within {self.timeout_s:g} s (too complex: "
            "simplify it)",
            "timeout",
        )
        self._refuse(guide, e, (now - job.started) * 1e3, job.tickets, worker)

    def _drop(self, worker: Worker, action: str, **fields: Any) -> None:
        if worker in self._pool:
            self._pool.remove(worker)
        self._emit_worker(worker, action, **fields)

    def _busy(self, guide: Guide, tickets: list[int]) -> None:
        """No worker for ``guide``: refused as load (503), and not remembered."""
        now = time.monotonic()
        ends = [c.started + self.timeout_s - now for c in self._running.values() if c.worker]
        later = max(1, math.ceil(min(ends, default=1.0)))
        message = (
            f"all {self.workers} grammar compile workers are busy and {self.waiting} more "
            f"grammars wait for one (--grammar-workers, --grammar-waiting): try again in "
            f"{later} s"
        )
        self.receipts.emit(
            schema.GRAMMAR_COMPILE,
            guide=guide.digest,
            kind=guide.kind,
            cache="miss",
            outcome="busy",
            site="prepare",
            error=message,
            running=len(self._running),
            waiting=len(self._line),
            retry_after_s=later,
        )
        self._answers += [
            GuideReady(ticket=t, error=message, status=503, retry_after=later) for t in tickets
        ]

    def _refuse(
        self, guide: Guide, e: CompileError, ms: float, tickets: list[int], worker: Worker | None
    ) -> None:
        _keep(self._refused, guide, e)
        self._emit(guide, "miss", ms, e, worker=None if worker is None else worker.pid)
        self._answers += [GuideReady(ticket=t, error=str(e)) for t in tickets]

    def _start(self, guide: Guide) -> Future:
        """The compile here, on a thread of its own, a daemon (it neither holds the next one
        back nor keeps the process from exiting)."""
        future: Future = Future()

        def run() -> None:
            try:
                future.set_result(self._timed_compile(guide))
            except BaseException as e:  # the loop's poll reads it
                future.set_exception(e)

        threading.Thread(target=run, name="grammar-compile", daemon=True).start()
        return future

    # -- the scheduler's way in ---------------------------------------------------------------

    def compiled(self, guide: Guide) -> Any:
        """``guide``'s compiled grammar: cached, else compiled now (a CompileError if it does
        not compile, or did not before)."""
        if guide in self._refused:
            raise self._refused[guide]
        if guide in self._cache:
            return self._cache_touch(guide)
        try:
            grammar, ms = self._timed_compile(guide)
        except CompileError as e:
            _keep(self._refused, guide, e)
            self._emit(guide, "miss", None, e, site="add")
            raise
        _keep(self._cache, guide, grammar)
        self._emit(guide, "miss", ms, None, site="add")
        return grammar

    def guided(self, guide: Guide) -> Guided:
        """A new request's grammar state over ``guide`` (compiled as ``compiled`` does)."""
        grammar = self.compiled(guide)
        banned = self._control_tokens() if guide.json_only else None
        return Guided.of(guide, grammar, banned)

    def _control_tokens(self) -> torch.Tensor:
        """The tokens holding a byte below 0x20. JSON has no place for one outside a string's
        escapes (structural whitespace is off), but xgrammar 0.2.9's rule for a string with a
        length bound lets any byte but ``"``, ``\\``, CR and LF through: JSON guides never
        sample these tokens (tests/unit/test_grammar_compiler.py pins both)."""
        if self._controls is None:
            self._compiler()
            info = self._info
            ids = [i for i, b in enumerate(info.decoded_vocab) if any(c < 0x20 for c in b)]
            keep = set(info.stop_token_ids) | set(info.special_token_ids)
            self._controls = torch.tensor([i for i in ids if i not in keep], dtype=torch.int64)
        return self._controls

    # -- compiling here and the cache ---------------------------------------------------------

    def _vocabulary(self) -> str:
        """The served vocabulary as xgrammar's JSON, for a worker (on its talking thread)."""
        self._compiler()
        return self._info.serialize_json()

    def _timed_compile(self, guide: Guide) -> tuple[Any, float]:
        compiler = self._compiler()  # built once; its time is not the grammar's
        t0 = time.perf_counter()
        grammar = compile_guide(compiler, guide)
        return grammar, (time.perf_counter() - t0) * 1e3

    def _compiler(self) -> xgr.GrammarCompiler:
        with self._lock:
            if self._xgr_compiler is None:
                import xgrammar as xgr

                self._info = info = token_info(self.tokenizer, self.vocab_size)
                # our cache decides what stays; xgrammar's own would keep every schema seen
                self._xgr_compiler = xgr.GrammarCompiler(info, max_threads=1, cache_enabled=False)
            return self._xgr_compiler

    def _cache_touch(self, guide: Guide) -> Any:
        """Mark ``guide`` used (compiled or refused); its compiled grammar, if any."""
        for table in (self._cache, self._refused):
            if guide in table:
                table.move_to_end(guide)
        return self._cache.get(guide)

    def _emit(
        self,
        guide: Guide,
        cache: str,
        ms: float | None,
        error: CompileError | None,
        site: str = "prepare",
        worker: int | None = None,
    ) -> None:
        extra: dict[str, Any] = {} if ms is None else {"ms": round(ms, 3)}
        if error is not None:
            extra["error"] = str(error)
        if worker is not None:
            extra["worker"] = worker
        self.receipts.emit(
            schema.GRAMMAR_COMPILE,
            guide=guide.digest,
            kind=guide.kind,
            cache=cache,
            outcome="ok" if error is None else error.outcome,
            site=site,
            **extra,
        )

    def _emit_worker(self, worker: Worker, action: str, **fields: Any) -> None:
        fields = {k: round(v, 3) if isinstance(v, float) else v for k, v in fields.items()}
        self.receipts.emit(schema.GRAMMAR_WORKER, pid=worker.pid, action=action, **fields)


def _keep(table: OrderedDict[Guide, Any], guide: Guide, value: Any) -> None:
    """``value`` for ``guide`` in ``table``, which drops its least recently used past
    ``CACHE_ENTRIES``."""
    table[guide] = value
    while len(table) > CACHE_ENTRIES:
        table.popitem(last=False)
