"""The compiled grammars of one engine: xgrammar's compiler over the served vocabulary, a cache
keyed by the guide, and compiles off the step loop with a time limit.

Two ways in. ``prepare`` (the server, before a request is submitted) starts a compile on a worker
thread and ``poll`` answers it from the loop when it is done, or refuses it once it has run past
``timeout_s`` (xgrammar cannot be interrupted: the worker finishes and its result is dropped,
and the guide stays refused, answered at once the next time). ``compiled`` (a request added to
the scheduler, and the offline engine) takes the cached grammar, or compiles then and there.
Every compile, and every prepared request that found its grammar cached, writes a
``grammar.compile`` receipt; the receipts are written on the loop's thread, never a worker's.

xgrammar, and the torch and transformers it imports, load on the first guided request, so an
engine that never sees one pays nothing.
"""

from __future__ import annotations

import re
import threading
import time
from collections import OrderedDict
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

import orjson
import torch

from engine.grammar.masks import Guided
from engine.guide import JSON_KINDS, Guide
from engine.model.tokenizer import Tokenizer
from engine.obs import schema
from engine.obs.receipts import Receipts

CACHE_ENTRIES = 256  # compiled grammars kept (least recently used dropped first)
_ORIGIN = re.compile(r"^\[[\d:]+\] \S+:\d+: ")  # xgrammar's "[hh:mm:ss] file.cc:line: "


class CompileError(ValueError):
    """A guide that does not compile, or not within the time limit (``outcome``)."""

    def __init__(self, message: str, outcome: str) -> None:
        super().__init__(message)
        self.outcome = outcome


@dataclass(slots=True)
class _Compile:
    """A compile on a worker and the prepared requests waiting for it."""

    future: Future
    started: float
    tickets: list[int] = field(default_factory=list)


def token_info(tokenizer: Tokenizer, vocab_size: int) -> Any:
    """xgrammar's view of the vocabulary: its own reading of the tokenizer (byte-level, byte
    fallback or raw) over the logits' width (ids past the tokenizer's are never allowed), with
    the model's stop tokens as the ones that end a finished grammar."""
    import xgrammar as xgr
    from transformers import PreTrainedTokenizerFast

    wrapped = PreTrainedTokenizerFast(tokenizer_object=tokenizer.backend)
    return xgr.TokenizerInfo.from_huggingface(
        wrapped, vocab_size=vocab_size, stop_token_ids=sorted(tokenizer.stop_ids)
    )


class Grammars:
    def __init__(
        self, tokenizer: Tokenizer, vocab_size: int, receipts: Receipts, timeout_s: float
    ) -> None:
        self.tokenizer = tokenizer
        self.vocab_size = vocab_size
        self.receipts = receipts
        self.timeout_s = timeout_s
        self._cache: OrderedDict[Guide, Any] = OrderedDict()
        # guides that did not compile, answered at once again: bounded as the cache is, so a
        # client sending ever new bad schemas cannot grow it
        self._refused: OrderedDict[Guide, CompileError] = OrderedDict()
        self._running: dict[Guide, _Compile] = {}
        self._answers: list[tuple[int, str | None]] = []
        self._lock = threading.Lock()  # the compiler is built once, by whichever thread is first
        self._xgr_compiler: Any = None
        # when the compiler was built: the time limit is the grammar's, and counts from then,
        # never the vocabulary table xgrammar builds once per boot (seconds on a busy machine)
        self._ready_at: float | None = None
        self._info: Any = None
        self._controls: torch.Tensor | None = None

    # -- the server's way in: prepared off the loop ------------------------------------------

    def prepare(self, guide: Guide, ticket: int) -> None:
        """Have ``guide`` compiled before its request is submitted; ``poll`` answers ``ticket``."""
        if guide in self._cache or guide in self._refused:
            error = self._refused.get(guide)
            self._cache_touch(guide)
            self._emit(guide, "hit", None, error)
            self._answers.append((ticket, None if error is None else str(error)))
        elif guide in self._running:
            self._running[guide].tickets.append(ticket)
        else:
            self._running[guide] = _Compile(self._start(guide), time.monotonic(), [ticket])

    def _start(self, guide: Guide) -> Future:
        """The compile on a thread of its own, a daemon: one past its time limit neither holds
        the next compile back nor keeps the process from exiting."""
        future: Future = Future()

        def run() -> None:
            try:
                future.set_result(self._timed_compile(guide))
            except BaseException as e:  # the loop's poll reads it
                future.set_exception(e)

        threading.Thread(target=run, name="grammar-compile", daemon=True).start()
        return future

    def pending(self) -> bool:
        """Whether a prepared request still waits for its answer."""
        return bool(self._running or self._answers)

    def poll(self) -> list[tuple[int, str | None]]:
        """The prepared requests answered since the last poll: (ticket, None) when the guide
        compiled, else (ticket, why not)."""
        now = time.monotonic()
        for guide, job in list(self._running.items()):
            if job.future.done():
                del self._running[guide]
                try:
                    grammar, ms = job.future.result()
                except Exception as e:
                    if not isinstance(e, CompileError):  # the compiler's fault, said as such
                        e = CompileError(f"the {guide.kind} could not be compiled ({e!r})", "error")
                    self._refuse(guide, e, (now - job.started) * 1e3, job.tickets)
                    continue
                _keep(self._cache, guide, grammar)
                self._emit(guide, "miss", ms, None)
                self._answers += [(t, None) for t in job.tickets]
            elif (
                self._ready_at is not None
                and now - max(job.started, self._ready_at) > self.timeout_s
            ):
                del self._running[guide]  # the worker runs on; what it makes is dropped
                e = CompileError(
                    f"the {guide.kind} did not compile within {self.timeout_s:g} s (too "
                    "complex: simplify it)",
                    "timeout",
                )
                self._refuse(guide, e, (now - job.started) * 1e3, job.tickets)
        answers, self._answers = self._answers, []
        return answers

    def _refuse(self, guide: Guide, e: CompileError, ms: float, tickets: list[int]) -> None:
        _keep(self._refused, guide, e)
        self._emit(guide, "miss", ms, e)
        self._answers += [(t, str(e)) for t in tickets]

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
        banned = self._control_tokens() if guide.kind in JSON_KINDS else None
        return Guided.of(guide, grammar, banned)

    def _control_tokens(self) -> torch.Tensor:
        """The tokens holding a byte below 0x20. JSON has no place for one outside a string's
        escapes (structural whitespace is off), but xgrammar 0.2.9's rule for a string with a
        length bound lets any byte but ``"``, ``\\``, CR and LF through: JSON guides never
        sample these tokens (tests/unit/test_grammar_masks.py pins both)."""
        if self._controls is None:
            self._compiler()
            info = self._info
            ids = [i for i, b in enumerate(info.decoded_vocab) if any(c < 0x20 for c in b)]
            keep = set(info.stop_token_ids) | set(info.special_token_ids)
            self._controls = torch.tensor([i for i in ids if i not in keep], dtype=torch.int64)
        return self._controls

    # -- compiling and the cache --------------------------------------------------------------

    def _timed_compile(self, guide: Guide) -> tuple[Any, float]:
        self._compiler()  # built once; its time is not the grammar's
        t0 = time.perf_counter()
        grammar = self._compile(guide)
        return grammar, (time.perf_counter() - t0) * 1e3

    def _compile(self, guide: Guide) -> Any:
        compiler = self._compiler()
        try:
            match guide.kind:
                case "json_object":  # any JSON object, as OpenAI's json_object means
                    return compiler.compile_json_schema(
                        '{"type": "object"}', strict_mode=False, any_whitespace=False
                    )
                case "json_schema":
                    return compiler.compile_json_schema(
                        guide.spec, strict_mode=guide.strict, any_whitespace=False
                    )
                case "regex":
                    return compiler.compile_regex(guide.spec)
                case "tagged_json":
                    return compiler.compile_grammar(tagged_ebnf(guide))
                case "choice":
                    options = orjson.loads(guide.spec)
                    ebnf = "root ::= " + " | ".join(orjson.dumps(c).decode() for c in options)
                    return compiler.compile_grammar(ebnf)
                case _:
                    return compiler.compile_grammar(guide.spec)
        except (RuntimeError, ValueError) as e:
            message = _ORIGIN.sub("", str(e).strip())
            raise CompileError(f"the {guide.kind} does not compile: {message}", "invalid") from None

    def _compiler(self) -> Any:
        with self._lock:
            if self._xgr_compiler is None:
                import xgrammar as xgr

                self._info = info = token_info(self.tokenizer, self.vocab_size)
                # our cache decides what stays; xgrammar's own would keep every schema seen
                self._xgr_compiler = xgr.GrammarCompiler(info, max_threads=1, cache_enabled=False)
                self._ready_at = time.monotonic()
            return self._xgr_compiler

    def _cache_touch(self, guide: Guide) -> Any:
        """Mark ``guide`` used (compiled or refused); its compiled grammar, if any."""
        for table in (self._cache, self._refused):
            if guide in table:
                table.move_to_end(guide)
        return self._cache.get(guide)

    def _emit(
        self, guide: Guide, cache: str, ms: float | None, error: CompileError | None,
        site: str = "prepare",
    ) -> None:  # fmt: skip
        extra: dict[str, Any] = {} if ms is None else {"ms": round(ms, 3)}
        if error is not None:
            extra["error"] = str(error)
        self.receipts.emit(
            schema.GRAMMAR_COMPILE, guide=guide.digest, kind=guide.kind, cache=cache,
            outcome="ok" if error is None else error.outcome, site=site, **extra,
        )  # fmt: skip


def tagged_ebnf(guide: Guide) -> str:
    """A ``tagged_json`` guide's grammar: blocks of ``begin`` + JSON (held to ``schema``) +
    ``end``, one, or one or more a newline apart (``repeat``)."""
    import xgrammar as xgr

    spec = orjson.loads(guide.spec)
    inner = str(xgr.Grammar.from_json_schema(
        orjson.dumps(spec["schema"]).decode(), strict_mode=guide.strict, any_whitespace=False
    ))  # fmt: skip
    # the schema's start rule renamed; the others (root_...) are its own and keep their names
    inner = re.sub(r"^root ::=", "tagged_value ::=", inner, count=1, flags=re.MULTILINE)
    block = (
        f"{orjson.dumps(spec['begin']).decode()} tagged_value {orjson.dumps(spec['end']).decode()}"
    )
    more = ' ("\\n" tagged_block)*' if spec["repeat"] else ""
    return f"root ::= tagged_block{more}\ntagged_block ::= {block}\n{inner}"


def _keep(table: OrderedDict[Guide, Any], guide: Guide, value: Any) -> None:
    """``value`` for ``guide`` in ``table``, which drops its least recently used past
    ``CACHE_ENTRIES``."""
    table[guide] = value
    while len(table) > CACHE_ENTRIES:
        table.popitem(last=False)
