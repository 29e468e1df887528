"""The auditor on boot logs written by the real engine (tiny model, in-process)."""

from __future__ import annotations

import orjson

from engine import LLM, SamplingParams
from engine.obs import schema
from tests.integration.test_pressure import three_at_once, workload


def read(log) -> list[dict]:
    return [orjson.loads(line) for line in log.read_bytes().splitlines()]


def pressured_log(model: str, log, n: int = 32) -> None:
    prompts, params = workload(300, n=n)
    llm = LLM(
        model=model,
        kv_tokens=three_at_once(prompts, params),
        chunk_tokens=32,
        max_running=8,
        check_invariants=True,
        log_file=str(log),
        iteration_receipt_interval=5,
    )
    llm.generate(prompts, params)
    llm.close("test")


def test_the_catalog_knows_every_field_a_pressured_engine_writes(tiny_model_dir, tmp_path):
    log = tmp_path / "boot.jsonl"
    pressured_log(tiny_model_dir, log)
    recs = read(log)
    kinds = {r["event"] for r in recs}
    assert {"admission.park", "retract", "requeue", "eviction", "iteration"} <= kinds
    unknown = {
        (r["event"], f)
        for r in recs
        if r["event"] != schema.INVARIANT_VIOLATION  # its numbers depend on what failed
        for f in r
        if not schema.known_field(r["event"], f)
    }
    assert unknown == set()


def test_drop_for_test_loses_a_request_without_an_ending_and_keeps_the_ledger(
    tiny_model_dir, tmp_path
):
    log = tmp_path / "boot.jsonl"
    llm = LLM(model=tiny_model_dir, kv_tokens=2048, log_file=str(log), check_invariants=True)
    sched = llm.core.scheduler
    params = SamplingParams(max_tokens=6, temperature=0, ignore_eos=True)
    reqs = [sched.add_request([3, 4, 5, 6], params) for _ in range(3)]
    sched.step()
    sched.drop_for_test(reqs[1].rid)
    while sched.has_work():
        sched.step()  # check mode: the ledger and request states are checked every step
    llm.close("test")
    ends = [r["rid"] for r in read(log) if r["event"] in ("request.finish", "request.abort")]
    assert sorted(ends) == sorted([reqs[0].rid, reqs[2].rid])
    assert llm.core.allocator.available_size() + sched.cache.total_size() == 2048
