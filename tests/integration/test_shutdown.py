"""An orderly stop ends every request still in flight with a receipt, then writes boot.stop."""

from __future__ import annotations

import orjson

from engine import LLM, SamplingParams


def test_shutdown_aborts_in_flight_then_writes_boot_stop(tiny_model_dir, tmp_path):
    log = tmp_path / "boot.jsonl"
    llm = LLM(model=tiny_model_dir, kv_tokens=2048, log_file=str(log), check_invariants=True)
    sched = llm.core.scheduler
    params = SamplingParams(max_tokens=50, temperature=0, ignore_eos=True)
    done = sched.add_request([5, 6, 7], SamplingParams(max_tokens=1, temperature=0))
    live = [sched.add_request([3, 4, 5, 6], params) for _ in range(3)]
    sched.step()
    sched.step()
    assert done.rid not in sched.requests  # it finished within the two steps
    llm.close("sigterm")
    assert sched.requests == {}
    assert (
        llm.core.allocator.available_size() + sched.cache.total_size()
        == llm.core.allocator.capacity
    )
    recs = [orjson.loads(line) for line in log.read_bytes().splitlines()]
    aborts = [r for r in recs if r["event"] == "request.abort"]
    assert sorted(r["rid"] for r in aborts) == sorted(r.rid for r in live)
    assert {r["reason"] for r in aborts} == {"sigterm"}
    assert recs[-1]["event"] == "boot.stop"
    assert recs[-1]["reason"] == "sigterm" and recs[-1]["in_flight"] == 3
    llm.close()  # a second close writes nothing more
    assert len(log.read_bytes().splitlines()) == len(recs)
