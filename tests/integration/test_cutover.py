"""Cutovers on a serving engine (tiny model, in-process, invariants checked after every step):
the pool resized under its residents and the weights swapped, each while requests are in
flight, change no greedy token; the census counts everyone once; bad asks are refused with a
receipt and serving goes on; the shipped `cutover` window decides the engine's own boot log."""

from __future__ import annotations

import random
from collections import Counter

import orjson
import pytest

from engine import LLM, SamplingParams
from engine.request.messages import Cutover
from engine.scheduler.census import backlog, take_census
from tests.fakes import SetFloor, llm_with_group
from tests.tiny_model import make_tiny_model


def workload(n: int = 12, seed: int = 0):
    rng = random.Random(seed)
    prompts = [[rng.randrange(2, 300) for _ in range(rng.randint(4, 60))] for _ in range(n)]
    params = [
        SamplingParams(max_tokens=rng.randint(10, 40), temperature=0, ignore_eos=True)
        for _ in prompts
    ]
    return prompts, params


@pytest.fixture(scope="module")
def expected(tiny_model_dir):
    """The greedy tokens of an uninterrupted run."""
    prompts, params = workload()
    llm = LLM(model=tiny_model_dir, kv_tokens=4096, check_invariants=True)
    return [o.token_ids for o in llm.generate(prompts, params)]


def serve_with(model, asks: dict[int, Cutover], log=None, **config):
    """The workload, with ``asks[i]`` cut over after step ``i``; (tokens, end fields, llm)."""
    config = {
        "kv_tokens": 2048,
        "page_size": 4,
        "chunk_tokens": 64,
        "max_running": 8,
        "check_invariants": True,
        **config,
    }
    llm = LLM(model=model, log_file=None if log is None else str(log), **config)
    sched = llm.core.scheduler
    prompts, params = workload()
    reqs = [sched.add_request(p, q) for p, q in zip(prompts, params)]
    ends, i = [], 0
    while sched.has_work():
        sched.step()
        i += 1
        if i in asks:
            ends.append(llm.core.cutovers.run(asks[i]))
    return [list(r.output_ids) for r in reqs], ends, llm


def of(log, kind: str) -> list[dict]:
    return [
        r for line in log.read_bytes().splitlines() if (r := orjson.loads(line))["event"] == kind
    ]


def window_verdicts(log) -> dict[str, str]:
    from audit.spec import resolve
    from audit.verdict import evaluate

    report = evaluate([resolve("cutover")], [log])
    return {c.claim: c.status.value for c in report.specs[0].claims}


POOL = {
    "grow": Cutover(kind="pool", mode="carry", kv_tokens=4096),
    "shrink": Cutover(kind="pool", mode="carry", kv_tokens=128),  # puts residents back in line
    "drain": Cutover(kind="pool", mode="drain", kv_tokens=1024),
}


@pytest.mark.parametrize("overlap", [False, True])
@pytest.mark.parametrize("name", sorted(POOL))
def test_a_pool_cutover_under_load_changes_no_token_and_the_window_passes(
    tiny_model_dir, expected, tmp_path, name, overlap
):
    """``overlap``: with the next step planned while each forward runs, the cutover lets go of
    the step planned ahead (its slots are the old pool's) before it changes the pool."""
    log = tmp_path / "boot.jsonl"
    ahead = {"speculative": "off", "overlap_schedule": True} if overlap else {}
    got, (end,), llm = serve_with(tiny_model_dir, {5: POOL[name]}, log, **ahead)
    llm.close("test")
    assert got == expected
    assert end["outcome"] == "ok" and end["kv_tokens"] == POOL[name].kv_tokens
    assert end["backlog"] <= end["backlog_before"]
    (carry,) = of(log, "cutover.carry")
    if name == "shrink":  # who did not fit went back in line, and came back
        assert carry["requeued"] and carry["rids"]
        retracted = {rid for r in of(log, "retract") for rid in r["rids"]}
        assert set(carry["requeued"]) <= retracted  # (later, the small pool retracts more)
    if name == "grow":  # every resident kept its KV and went on decoding
        assert carry["rids"] == end["running"] + end["parked"] and not carry["requeued"]
    assert not of(log, "invariant.violation")
    assert set(window_verdicts(log).values()) == {"PASS"}


class LoadAtOnce:
    """The weights cutover's loading thread run to its end when started: the load then ends
    before the next step, with residents still in flight. On a busy machine the real thread
    could take longer than the tiny workload's remaining steps, leaving nobody to drain, carry
    or hold back (the drain case once found no deferral for that reason)."""

    def __init__(self, target, args=(), daemon=None):
        self.target, self.args = target, args

    def start(self) -> None:
        self.target(*self.args)

    def is_alive(self) -> bool:
        return False

    def join(self, timeout=None) -> None:
        pass


@pytest.mark.parametrize("mode", ["carry", "drain"])
def test_a_weights_cutover_with_the_same_file_changes_no_token(
    tiny_model_dir, expected, tmp_path, mode, monkeypatch
):
    import types

    import engine.core.cutover

    monkeypatch.setattr(engine.core.cutover, "threading", types.SimpleNamespace(Thread=LoadAtOnce))
    log = tmp_path / "boot.jsonl"
    ask = Cutover(kind="weights", mode=mode, path=tiny_model_dir)
    got, (end,), llm = serve_with(tiny_model_dir, {5: ask}, log)
    llm.close("test")
    assert got == expected
    assert end["outcome"] == "ok"
    (carry,) = of(log, "cutover.carry")
    if mode == "carry":  # everyone resident went back in line with what it had generated
        assert carry["requeued"] and set(carry["requeued"]) <= set(end["waiting"])
        assert not end["running"] and not end["parked"]
    else:  # the drain let the residents finish on the old weights, the line held meanwhile
        assert end["ended"] and not carry["requeued"]
        assert [d for d in of(log, "admission.defer") if d["reason"] == "cutover"]
    # the prefix cache held the old weights' KV: all of it was evicted, with a receipt
    (eviction,) = [e for e in of(log, "eviction") if e["reason"] == "cutover"]
    assert eviction["evicted"] == carry["evicted"] > 0 and carry["cached_tokens"] == 0
    verdicts = window_verdicts(log)
    assert verdicts.pop("pool_backlog_not_grown") == "N/A"  # no pool cutover here
    assert set(verdicts.values()) == {"PASS"}


def test_new_weights_change_the_tokens_and_the_engine_serves_them(tiny_model_dir, tmp_path):
    other = make_tiny_model(tmp_path / "other", seed=7)
    llm = LLM(model=tiny_model_dir, kv_tokens=1024, check_invariants=True)
    prompt, p = [5, 6, 7, 8], SamplingParams(max_tokens=8, temperature=0, ignore_eos=True)
    before = llm.generate([prompt], p)[0].token_ids
    end = llm.cutover("weights", "carry", path=str(other))
    assert end["outcome"] == "ok"
    fresh = LLM(model=str(other), kv_tokens=1024).generate([prompt], p)[0].token_ids
    assert llm.generate([prompt], p)[0].token_ids == fresh != before


@pytest.mark.parametrize("quant", [None, "int8"])
def test_a_weights_cutover_says_which_weights_and_kernels_now_serve(
    tiny_model_dir, tmp_path, quant
):
    """cutover.end of a weights cutover carries the new weights' boot.weights fields (fast
    mode: their own quantisation), and engine info follows them."""
    other = make_tiny_model(tmp_path / "other", seed=7)
    llm = LLM(model=tiny_model_dir, kv_tokens=1024, quant=quant)
    end = llm.cutover("weights", "carry", path=str(other))
    (boot,) = llm.core.receipts.of("boot.weights")
    assert end["weights"]["mode"] == boot["mode"] == (quant or "exact")
    if quant:
        assert end["weights"]["matrices"] == boot["matrices"]
        assert llm.core.quant is llm.core.model.quant  # the plan of the weights now serving
    assert llm.core.info().weights == end["weights"]["mode"]
    llm.close()


def test_bad_cutovers_are_refused_with_a_receipt_and_serving_goes_on(tiny_model_dir, tmp_path):
    three = make_tiny_model(tmp_path / "three", layers=3)
    llm = LLM(model=tiny_model_dir, kv_tokens=2048, page_size=4, check_invariants=True)
    sched = llm.core.scheduler
    req = sched.add_request(list(range(2, 90)), SamplingParams(max_tokens=20, ignore_eos=True))
    sched.step()
    cut = llm.core.cutovers
    refused = {
        "missing": cut.run(Cutover(kind="weights", mode="carry", path=str(tmp_path / "none"))),
        "architecture": cut.run(Cutover(kind="weights", mode="carry", path=str(three))),
        "small": cut.run(Cutover(kind="pool", mode="carry", kv_tokens=64)),
        "kind": cut.run(Cutover(kind="tokenizer", mode="carry")),
    }
    assert cut.begin(Cutover(kind="pool", mode="drain", kv_tokens=1024)) is None  # under way
    busy = cut.begin(Cutover(kind="pool", mode="carry", kv_tokens=1024))
    assert [f["outcome"] for f in refused.values()] == ["rejected"] * 4
    assert "does not exist" in refused["missing"]["reason"]
    assert "num_layers 3 (serving 2)" in refused["architecture"]["reason"]
    assert "smaller than the in-flight minimum" in refused["small"]["reason"]
    assert {f["status"] for f in refused.values()} == {400}
    assert busy["status"] == 409 and busy["outcome"] == "rejected"
    while sched.has_work():  # the drain ends once the resident has finished
        sched.step()
        if (end := cut.advance()) is not None:
            assert end["outcome"] == "ok" and end["ended"] == [req.rid]
    assert req.finish_reason == "length" and len(req.output_ids) == 20
    kinds = Counter(r["event"] for r in llm.core.receipts.records)
    assert kinds["cutover.begin"] == kinds["cutover.end"] == 6
    assert llm.core.allocator.capacity == 1024


def test_the_census_counts_parked_requests_and_each_request_once(tiny_model_dir):
    group = SetFloor(None)
    llm = llm_with_group(tiny_model_dir, group, kv_tokens=1024, chunk_tokens=8, page_size=4)
    sched = llm.core.scheduler
    parked = sched.add_request(list(range(2, 40)), SamplingParams(max_tokens=3, ignore_eos=True))
    waiting = sched.add_request(list(range(2, 30)), SamplingParams(max_tokens=3, ignore_eos=True))
    sched.step()
    group.floor = 0
    sched.step()
    assert parked.state.value == "parked"
    census = take_census(sched.running, sched.waiting)
    assert (census.running, census.parked, census.waiting) == ((), (parked.rid,), (waiting.rid,))
    assert census.backlog == (38 - 8) + 28
    # a request in two lists (a carry that did not consume what it moved) is counted once, and named
    assert backlog(sched.running, [*sched.waiting, parked]) == census.backlog
    doubled = take_census(sched.running, [*sched.waiting, parked])
    assert doubled.backlog == census.backlog and doubled.doubled() == [parked.rid]
    end = llm.cutover("pool", "carry", kv_tokens=512)
    assert end["parked"] == [parked.rid] and end["rids_before"] == sorted([parked.rid, waiting.rid])
