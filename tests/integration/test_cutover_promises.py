"""A pool cutover keeps the promise made at intake, and every cutover ends.

A promised request (the server's: prompt + max_tokens checked against the pool) is never ended
for the pool's size: a smaller pool that would break a promise is refused naming each request and
what it was promised, or caps them when asked (they end with ``length`` at the new bound); new
requests are checked against the pool that exists. A log where a promise was broken anyway (the
check switched off here) FAILs the ``cutover`` window. A cutover whose weights never load ends
``timeout``; one cancelled ends ``cancelled``; one under way at an orderly stop ends ``stopped``
before ``boot.stop``; a pool larger than the memory there is refused naming the bytes."""

from __future__ import annotations

import os

import orjson
import pytest

from engine import LLM, SamplingParams
from engine.request.messages import Cutover
from engine.scheduler import promises

PROMPT = [5] * 100
LONG = SamplingParams(max_tokens=300, temperature=0, ignore_eos=True)  # promised 400


def of(log, kind: str) -> list[dict]:
    return [
        r for line in log.read_bytes().splitlines() if (r := orjson.loads(line))["event"] == kind
    ]


def serving(model, log=None, **config):
    """An engine with one promised request that has started decoding."""
    llm = LLM(
        model=model,
        kv_tokens=1024,
        page_size=4,
        check_invariants=True,
        log_file=None if log is None else str(log),
        **config,
    )
    sched = llm.core.scheduler
    req = sched.add_request(PROMPT, LONG, promise=True)
    while len(req.output_ids) < 5:
        sched.step()
    return llm, req


def run_out(llm) -> None:
    sched = llm.core.scheduler
    while sched.has_work():
        sched.step()


def test_a_promise_is_checked_against_the_pool_at_intake(tiny_model_dir):
    llm = LLM(model=tiny_model_dir, kv_tokens=512, page_size=4)
    sched = llm.core.scheduler
    with pytest.raises(ValueError, match="exceed the KV pool of 512 tokens.*at most 412"):
        sched.add_request(PROMPT, SamplingParams(max_tokens=413), promise=True)
    (reject,) = llm.core.receipts.of("request.reject")
    assert (reject["need"], reject["capacity"]) == (513, 512)
    sched.add_request(PROMPT, SamplingParams(max_tokens=413))  # unpromised (offline) still runs
    promised = sched.add_request(PROMPT, SamplingParams(max_tokens=412), promise=True)
    assert promised.promised == 512


def test_a_pool_cutover_that_would_break_a_promise_is_refused_naming_it(tiny_model_dir):
    llm, req = serving(tiny_model_dir)
    with pytest.raises(ValueError, match=r"r-0 \(promised 400\)"):
        llm.cutover("pool", kv_tokens=256)
    (end,) = llm.core.receipts.of("cutover.end")
    assert (end["outcome"], end["status"]) == ("rejected", 409)
    assert end["promises"] == [{"rid": "r-0", "promised": 400}]
    assert llm.core.scheduler.memory.capacity == 1024  # nothing changed
    run_out(llm)
    assert (req.finish_reason, len(req.output_ids)) == ("length", 300)


def test_asked_to_cap_it_the_request_ends_with_length_at_the_new_bound(tiny_model_dir):
    llm, req = serving(tiny_model_dir)
    assert llm.cutover("pool", kv_tokens=256, promises="cap")["outcome"] == "ok"
    (cap,) = llm.core.receipts.of("request.cap")
    assert cap == {**cap, "rid": "r-0", "promised": 400, "max_new_tokens": 156, "reason": "c-1"}
    with pytest.raises(ValueError, match="KV pool of 256 tokens"):  # the new pool, not the boot's
        llm.core.scheduler.add_request(PROMPT, LONG, promise=True)
    run_out(llm)
    assert (req.finish_reason, len(req.output_ids)) == ("length", 156)
    assert not llm.core.receipts.of("request.abort")


def test_a_promise_broken_anyway_fails_the_cutover_window(tiny_model_dir, tmp_path, monkeypatch):
    from audit.spec import resolve
    from audit.verdict import evaluate

    monkeypatch.setattr(promises, "broken", lambda live, capacity: [])  # the check, switched off
    log = tmp_path / "boot.jsonl"
    llm, req = serving(tiny_model_dir, log)
    assert llm.cutover("pool", kv_tokens=256)["outcome"] == "ok"
    run_out(llm)
    assert req.abort_reason == "exceeds_pool"
    llm.close()
    (abort,) = of(log, "request.abort")
    assert (abort["reason"], abort["promised"]) == ("exceeds_pool", 400)
    report = evaluate([resolve("cutover")], [log])
    claims = {c.claim: c.status.value for c in report.specs[0].claims}
    assert claims["promises_kept"] == "FAIL"
    assert {v for k, v in claims.items() if k != "promises_kept"} == {"PASS"}


def test_a_pool_larger_than_the_memory_there_is_refused_naming_the_bytes(tiny_model_dir):
    llm, _ = serving(tiny_model_dir)
    with pytest.raises(ValueError, match=r"needs [\d,]+ bytes .* has [\d,]+ bytes available"):
        llm.cutover("pool", kv_tokens=99_999_999_999)
    assert llm.core.scheduler.memory.capacity == 1024


@pytest.fixture
def fifo(tmp_path):
    """Weights whose read never returns (a FIFO nobody writes); let go afterwards."""
    path = tmp_path / "weights.gguf"
    os.mkfifo(path)
    yield str(path)
    try:  # a writer that opens and closes ends the blocked read (EOF): the thread ends
        os.close(os.open(path, os.O_WRONLY | os.O_NONBLOCK))
    except OSError:
        pass


def test_weights_that_never_load_end_timeout_and_the_next_cutover_runs(tiny_model_dir, fifo):
    # the load never returns by construction: a limit of 1 s is far from its duration
    llm = LLM(model=tiny_model_dir, kv_tokens=1024, page_size=4, cutover_timeout=1.0)
    with pytest.raises(TimeoutError, match="within 1 s .*still loading"):
        llm.cutover("weights", path=fifo)
    (end,) = llm.core.receipts.of("cutover.end")
    assert (end["outcome"], end["status"]) == ("timeout", 504)
    assert llm.cutover("pool", kv_tokens=512)["outcome"] == "ok"


def test_a_cancelled_cutover_ends_cancelled_and_the_next_runs(tiny_model_dir, fifo):
    llm = LLM(model=tiny_model_dir, kv_tokens=1024, page_size=4)
    cutovers = llm.core.cutovers
    assert cutovers.begin(Cutover(kind="weights", mode="carry", path=fifo)) is None
    refused = cutovers.begin(Cutover(kind="pool", mode="carry", kv_tokens=512))
    assert refused["status"] == 409 and "DELETE /admin/cutover/c-1" in refused["reason"]
    assert cutovers.cancel("c-9") is None  # not the one under way
    ended = cutovers.cancel("c-1")
    assert (ended["outcome"], ended["id"]) == ("cancelled", "c-1")
    assert cutovers.advance() is None and cutovers.active is None
    assert llm.cutover("pool", kv_tokens=512)["outcome"] == "ok"


def test_an_orderly_stop_ends_the_cutover_under_way_before_boot_stop(
    tiny_model_dir, fifo, tmp_path
):
    from audit.spec import resolve
    from audit.verdict import evaluate

    log = tmp_path / "boot.jsonl"
    llm = LLM(model=tiny_model_dir, kv_tokens=1024, page_size=4, log_file=str(log))
    llm.generate([PROMPT], SamplingParams(max_tokens=3))
    assert llm.core.cutovers.begin(Cutover(kind="weights", mode="carry", path=fifo)) is None
    llm.close()
    events = [orjson.loads(line)["event"] for line in log.read_bytes().splitlines()]
    assert events[-2:] == ["cutover.end", "boot.stop"]
    (end,) = of(log, "cutover.end")
    assert (end["outcome"], end["status"]) == ("stopped", 503)
    report = evaluate([resolve("cutover")], [log])
    claims = {c.claim: c.status.value for c in report.specs[0].claims}
    assert claims["one_end_per_begin"] == "PASS"
