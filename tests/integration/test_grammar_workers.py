"""The server's grammar compiles, in worker processes over a tiny byte-level vocabulary: a
prepared guide is compiled in a worker, then once more in this process, cached and answered by
``poll``; one that does not compile is refused with xgrammar's reason and remembered; one past
its time limit has its worker killed (the process is gone, its CPU free) and is refused from
then on; the limit counts from a ready worker; and at most ``workers`` compile at once, at most
``waiting`` wait, the rest refused as load (503, Retry-After), each answer with its receipt.

The slow guide is an enum of 50,000 strings: 11 s to compile here with the tiny vocabulary (and
longer on a busy machine), against limits of 1 s."""

from __future__ import annotations

import threading
import time

import psutil
import pytest

from engine.guided import compiler as compiler_module
from engine.guided.compiler import Grammars
from engine.model.tokenizer import Tokenizer
from engine.observability.receipts import Receipts
from engine.request.guide import json_schema_guide, text_guide
from engine.request.messages import GuideReady
from tests.tiny_model import EOS, VOCAB, train_tokenizer


def slow(tag: int):
    """A guide that takes seconds to compile, one of its own per ``tag``."""
    return json_schema_guide({"enum": [f"v{tag}-{i:07d}" for i in range(50_000)]}, False, "s")


@pytest.fixture(scope="module")
def tokenizer() -> Tokenizer:
    return Tokenizer(
        train_tokenizer(), bos_id=0, eos_id=EOS, stop_ids={EOS}, add_bos=False, chat_template=None
    )


@pytest.fixture
def make(tokenizer):
    made: list[Grammars] = []

    def build(timeout_s: float = 60.0, **kw) -> Grammars:
        made.append(Grammars(tokenizer, VOCAB, Receipts(capture=True), timeout_s, **kw))
        return made[-1]

    yield build
    for g in made:
        g.close()


def answers_of(grammars: Grammars, n: int = 1, limit_s: float = 120.0) -> list[GuideReady]:
    """``n`` answers, polled as the scheduler's loop polls; at no time more compiles running
    than there are workers. The limit only catches a hang."""
    got: list[GuideReady] = []
    end = time.monotonic() + limit_s
    while len(got) < n:
        assert time.monotonic() < end, f"{len(got)} of {n} answers"
        got += grammars.poll()
        assert len(grammars.running()) <= grammars.workers
        time.sleep(0.01)
    return got


def gone(pid: int, limit_s: float = 10.0) -> bool:
    """Whether ``pid`` is gone (reaped) within ``limit_s``: a generous bound on a SIGKILL."""
    end = time.monotonic() + limit_s
    while psutil.pid_exists(pid):
        if time.monotonic() > end:
            return False
        time.sleep(0.02)
    return True


def test_prepared_guides_are_compiled_once_in_a_worker_and_answered_by_poll(make):
    grammars = make()
    guide = json_schema_guide({"type": "integer"}, False, "s")
    grammars.prepare(guide, 1)
    grammars.prepare(guide, 2)  # the same compile answers both
    assert sorted(answers_of(grammars, 2), key=lambda a: a.ticket) == [
        GuideReady(ticket=1),
        GuideReady(ticket=2),
    ]
    grammars.prepare(guide, 3)
    assert grammars.poll() == [GuideReady(ticket=3)]  # cached: answered at once
    assert grammars.compiled(guide) is grammars.compiled(guide)
    receipts = grammars.receipts.of("grammar.compile")
    assert [(r["cache"], r["outcome"], r["site"]) for r in receipts] == [
        ("miss", "ok", "prepare"),
        ("hit", "ok", "prepare"),
    ]
    assert receipts[0]["guide"] == guide.digest and receipts[0]["ms"] >= 0
    [started] = grammars.receipts.of("grammar.worker")
    assert started["action"] == "started" and started["ms"] > 0


def test_a_guide_that_does_not_compile_is_refused_with_its_reason_and_remembered(make):
    grammars = make()
    bad = text_guide("regex", "a(b", "r")
    grammars.prepare(bad, 1)
    [ready] = answers_of(grammars)
    ticket, error, status = ready.ticket, ready.error, ready.status
    assert (ticket, status) == (1, 400) and error.startswith("the regex does not compile: ")
    assert "parenthesis" in error and ".cc:" not in error  # xgrammar's words, not its source
    grammars.prepare(bad, 2)
    assert grammars.poll() == [GuideReady(ticket=2, error=error)]
    with pytest.raises(ValueError, match="does not compile"):
        grammars.compiled(bad)
    outcomes = [(r["cache"], r["outcome"]) for r in grammars.receipts.of("grammar.compile")]
    assert outcomes == [("miss", "invalid"), ("hit", "invalid")]


def test_a_compile_past_its_limit_has_its_worker_killed_and_stays_refused(make):
    """A deadline test: a compile of about 11 s against a limit of 1 s. The worker process is
    gone shortly after the refusal: its CPU is free, not spent on a grammar nobody will use."""
    grammars = make(timeout_s=1.0)
    guide = slow(0)
    grammars.prepare(guide, 7)
    [ready] = answers_of(grammars)
    ticket, error, status = ready.ticket, ready.error, ready.status
    assert (ticket, status) == (7, 400) and "did not compile within 1 s" in error
    [timeout] = grammars.receipts.of("grammar.compile")
    assert (timeout["outcome"], timeout["cache"]) == ("timeout", "miss")
    assert gone(timeout["worker"])
    started, killed = grammars.receipts.of("grammar.worker")
    assert (started["action"], killed["action"]) == ("started", "killed")
    assert killed["pid"] == timeout["worker"] and killed["guide"] == guide.digest
    assert killed["limit_s"] == 1.0
    grammars.prepare(guide, 8)
    assert grammars.poll() == [
        GuideReady(ticket=8, error=error)
    ]  # from then on at once, no worker asked
    assert grammars.running() == {}


def test_the_time_limit_counts_from_a_ready_worker_not_its_start(make, monkeypatch):
    """A deadline test: the vocabulary a worker is handed is held past the 0.2 s limit (it is
    built once per boot, seconds for the default model on a busy machine); the grammar
    compiles in far less once the worker is ready, and is not refused for the start's time."""
    build = threading.Event()
    real = compiler_module.token_info

    def slow_info(*args):
        build.wait(60)
        return real(*args)

    monkeypatch.setattr(compiler_module, "token_info", slow_info)
    grammars = make(timeout_s=0.2)
    grammars.prepare(text_guide("regex", "a+", "r"), 7)
    time.sleep(0.6)
    assert grammars.poll() == []  # past the limit, but the worker is not ready yet
    build.set()
    assert answers_of(grammars) == [GuideReady(ticket=7)]


def test_at_most_n_compile_at_once_a_bounded_line_waits_the_rest_are_refused_as_load(make):
    """One worker, a line of one: of three slow guides at once, the first compiles, the second
    waits and compiles once the first is ended, and the third is refused at once as load, with
    when to try again; never more than one compile at a time."""
    grammars = make(timeout_s=1.0, workers=1, waiting=1)
    a, b, c = slow(1), slow(2), slow(3)
    for ticket, guide in enumerate((a, b, c), 1):
        grammars.prepare(guide, ticket)
    assert list(grammars.running()) == [a]
    [busy] = grammars.poll()
    assert (busy.ticket, busy.status) == (3, 503) and busy.retry_after >= 1
    assert "--grammar-workers" in busy.error and f"{busy.retry_after} s" in busy.error
    answers = answers_of(grammars, 2)
    assert [(x.ticket, x.status) for x in answers] == [(1, 400), (2, 400)]
    refused = grammars.receipts.of("grammar.compile")
    assert [r["outcome"] for r in refused] == ["busy", "timeout", "timeout"]
    assert (refused[0]["running"], refused[0]["waiting"]) == (1, 1)
    assert refused[0]["retry_after_s"] == busy.retry_after
    assert refused[1]["worker"] != refused[2]["worker"]  # the killed worker was not reused
    killed = [r for r in grammars.receipts.of("grammar.worker") if r["action"] == "killed"]
    assert [k["guide"] for k in killed] == [a.digest, b.digest]
    grammars.prepare(c, 4)  # load is not the guide's fault: not remembered
    assert list(grammars.running()) == [c]
