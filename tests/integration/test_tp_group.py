"""A tensor-parallel group of two ranks on the tiny model (gloo on loopback): uneven pools
under pressure stay in agreement, a rank that reads its own pool is caught as a split, a
rank that dies stops the group with receipts saying which, and a rank that cannot build its part
ends the boot it began in its log saying why."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from collections import Counter
from pathlib import Path

import pytest

from audit.inputs import expand_logs
from audit.spec import resolve
from audit.verdict import evaluate
from engine.config import EngineConfig
from engine.core import group_boot
from engine.group.comm import GroupFailure
from engine.llm import LLM
from engine.model.sampling import SamplingParams
from engine.scheduler.group import GroupSplit

PRESSURE = dict(page_size=4, chunk_tokens=32, relief_ladder=False, check_invariants=True)


def prompts(n: int = 16, length: int = 120) -> list[list[int]]:
    return [[(5 + i * 7 + j) % 300 + 2 for j in range(length + 13 * (i % 5))] for i in range(n)]


def read(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def verdicts(folder: Path, spec: str) -> dict[str, str]:
    """``audit verdict FOLDER --spec SPEC``: each claim's verdict, over every rank's log."""
    report = evaluate([resolve(spec)], expand_logs([str(folder)]))
    return {c.claim: c.status.value for c in report.specs[0].claims}


@pytest.fixture(scope="module")
def reference(tiny_model_dir) -> list[list[int]]:
    """tp=1, a pool that never runs short: the tokens every other run must produce."""
    llm = LLM(str(tiny_model_dir), kv_tokens=16384)
    out = [
        o.token_ids
        for o in llm.generate(
            prompts(), SamplingParams(max_tokens=60, temperature=0, ignore_eos=True)
        )
    ]
    llm.close()
    return out


def test_uneven_pools_under_pressure_agree_on_every_batch(tiny_model_dir, tmp_path, reference):
    log = tmp_path / "boot.log"
    llm = LLM(str(tiny_model_dir), tp=2, kv_tokens=[1024, 640], log_file=str(log), **PRESSURE)
    out = llm.generate(prompts(), SamplingParams(max_tokens=60, temperature=0, ignore_eos=True))
    llm.close()
    assert [o.token_ids for o in out] == reference  # pressure changed nothing but timing
    ranks = [read(log), read(tmp_path / "boot.rank1.log")]
    assert {r["boot"] for rank in ranks for r in rank} == {ranks[0][0]["boot"]}
    for rank in ranks:
        kinds = Counter(r["event"] for r in rank)
        assert kinds["admission.park"] > 0 and kinds["retract"] > 0, kinds
    digests = [[(r["iter"], r["digest"]) for r in rank if "digest" in r] for rank in ranks]
    assert digests[0] and digests[0] == digests[1]
    # the larger pool is the one the floor binds on; the smallest rank's own numbers are it
    floors = [[r for r in rank if r["event"] == "group.floor"] for rank in ranks]
    assert floors[0] and not floors[1]
    assert all(f["floor"] < f["local"] for f in floors[0])
    assert verdicts(tmp_path, "group_agreement") == dict.fromkeys(
        ["digests_agree", "parks_agree_across_ranks", "every_request_ends", "no_group_split"],
        "PASS",
    )
    health = verdicts(tmp_path, "boot_health")
    assert health.pop("no_store_set_aside") == "N/A"  # a group opens no durable store
    assert set(health.values()) == {"PASS"}


def test_ranks_draft_alike_from_agreed_numbers_and_keep_every_token(tiny_model_dir, tmp_path):
    """Prompt lookup in a group of two with uneven pools under pressure: every rank proposes
    the same drafts from the same text and funds them from the agreed numbers (the smaller
    pool's), so the batches agree on every iteration (the digest counts the drafts) and the
    tokens are those of one rank without drafts."""
    from tests.integration.test_speculation import repetitive

    texts, params = repetitive(300, n=12, seed=5)
    ref = LLM(str(tiny_model_dir), kv_tokens=16384, speculative="off")
    want = [o.token_ids for o in ref.generate(texts, params)]
    ref.close()
    log = tmp_path / "boot.log"
    llm = LLM(
        str(tiny_model_dir),
        tp=2,
        kv_tokens=[640, 400],
        log_file=str(log),
        speculative="ngram",
        group_check_interval=1,
        **PRESSURE,
    )
    out = llm.generate(texts, params)
    llm.close()
    assert [o.token_ids for o in out] == want
    ranks = [read(log), read(tmp_path / "boot.rank1.log")]
    fins = [[r for r in rank if r["event"] == "request.finish"] for rank in ranks]
    kept = [sum(f.get("spec_accepted", 0) for f in rank) for rank in fins]
    assert kept[0] > 0 and kept[0] == kept[1]
    cuts = [[(r["rid"], r["got"]) for r in rank if r["event"] == "spec.cut"] for rank in ranks]
    assert cuts[0] == cuts[1]  # any cut is alike on both ranks
    for rank in ranks:  # under pressure: the pool the floor binds on parks a prompt
        kinds = Counter(r["event"] for r in rank)
        assert kinds["admission.park"] > 0 and kinds["admission.defer"] > 0, kinds
    digests = [[(r["iter"], r["digest"]) for r in rank if "digest" in r] for rank in ranks]
    assert digests[0] and digests[0] == digests[1]
    assert set(verdicts(tmp_path, "group_agreement").values()) == {"PASS"}


def test_a_rank_reading_its_own_pool_is_caught_as_a_split(tiny_model_dir, tmp_path):
    """The test switch: decisions read each rank's own pool. The larger pool admits what the
    smaller cannot; the digests differ before the forward, and the group stops in order."""
    log = tmp_path / "boot.log"
    llm = LLM(
        str(tiny_model_dir),
        tp=2,
        kv_tokens=[1024, 640],
        log_file=str(log),
        published_floor=False,
        **PRESSURE,
    )
    # caught, never a hang: a hang would end in the group timeout's GroupFailure, not this
    with pytest.raises(GroupSplit, match="group split at iteration"):
        llm.generate(prompts(), SamplingParams(max_tokens=60, temperature=0, ignore_eos=True))
    for path in (log, tmp_path / "boot.rank1.log"):
        rank = read(path)
        split = [r for r in rank if r["event"] == "invariant.violation"]
        assert split and split[0]["what"] == "group_split" and len(set(split[0]["digests"])) == 2
        assert rank[-1]["event"] == "boot.stop" and rank[-1]["reason"] == "group_split"
    v = verdicts(tmp_path, "group_agreement")
    assert v["digests_agree"] == "FAIL" and v["no_group_split"] == "FAIL"


def test_a_killed_rank_stops_the_group_and_the_log_names_it(tiny_model_dir, tmp_path):
    log = tmp_path / "boot.log"
    # the death is seen by the dead rank's closed sockets; where gloo misses them (a pair closed
    # between two operations leaves the next one waiting), by the group timeout (30 s), which
    # bounds rank 0's sends on the intake too
    llm = LLM(str(tiny_model_dir), tp=2, kv_tokens=4096, log_file=str(log), group_timeout=30)
    victim = llm.core.member.procs[1]
    params = SamplingParams(max_tokens=400, temperature=0, ignore_eos=True)
    threading.Timer(1.0, os.kill, (victim.pid, signal.SIGKILL)).start()
    t0 = time.monotonic()
    with pytest.raises(GroupFailure):
        llm.generate(prompts(8, 20), params)
    assert time.monotonic() - t0 < 120  # at once, or at the latest at the group timeout
    stop = read(log)[-1]
    assert stop["event"] == "boot.stop" and stop["reason"] == "rank_lost"
    assert stop["lost_ranks"] == [1] and stop["in_flight"] == 8
    assert verdicts(tmp_path, "boot_health")["stopped_in_order"] == "FAIL"


def test_a_tp_that_does_not_divide_the_heads_is_refused_naming_them(tiny_model_dir):
    with pytest.raises(ValueError, match="tp 3 does not divide the model's 4 attention heads"):
        LLM(str(tiny_model_dir), tp=3)
    with pytest.raises(ValueError, match="one integer >= 1 per rank"):
        LLM(str(tiny_model_dir), tp=2, kv_tokens=[1024])


def test_an_abort_on_rank_0_reaches_every_rank_before_the_next_batch(tiny_model_dir, tmp_path):
    log = tmp_path / "boot.log"
    llm = LLM(str(tiny_model_dir), tp=2, kv_tokens=2048, log_file=str(log), check_invariants=True)
    sched, params = (
        llm.core.scheduler,
        SamplingParams(max_tokens=30, temperature=0, ignore_eos=True),
    )
    reqs = [sched.add_request(p, params) for p in prompts(3, 20)]
    for _ in range(4):
        llm.core.step()
    sched.abort(reqs[1].rid, reason="client_disconnect")
    while sched.has_work():
        llm.core.step()
    llm.close()
    for path in (log, tmp_path / "boot.rank1.log"):
        aborts = [r for r in read(path) if r["event"] == "request.abort"]
        assert [(a["rid"], a["reason"]) for a in aborts] == [(reqs[1].rid, "client_disconnect")]
    assert verdicts(tmp_path, "group_agreement")["digests_agree"] == "PASS"


def test_one_multi_rank_engine_per_process_until_it_is_closed(tiny_model_dir):
    first = LLM(str(tiny_model_dir), tp=2, kv_tokens=1024)
    with pytest.raises(ValueError, match="one multi-rank engine per process"):
        LLM(str(tiny_model_dir), tp=2, kv_tokens=1024)
    first.close()
    second = LLM(str(tiny_model_dir), tp=2, kv_tokens=1024)  # the group is free again
    params = SamplingParams(max_tokens=4, temperature=0, ignore_eos=True)
    assert len(second.generate([[5, 6, 7]], params)[0].token_ids) == 4
    second.close()


class _Unmet:
    """The comm of a rank whose group it never got to use: its rank, and whether it was closed."""

    def __init__(self, rank: int) -> None:
        self.rank, self.closed = rank, False

    def close(self) -> None:
        self.closed = True


def test_a_rank_that_cannot_build_its_part_ends_its_log_with_boot_failed(tmp_path, monkeypatch):
    # rank 0 names a model folder this rank's node does not have: rank 1 opens its log under
    # rank 0's boot id, then fails to load
    missing = tmp_path / "not-on-this-node"
    log = tmp_path / "boot.log"
    fields = EngineConfig.from_kwargs(
        model=str(missing), tp=2, kv_tokens=1024, log_file=str(log)
    ).as_dict()
    comm = _Unmet(1)
    joined = (group_boot.Member(comm, "b-0000beef"), fields)
    monkeypatch.setattr(group_boot, "_connect", lambda *args: joined)
    handlers = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        assert group_boot.follower_main(1, 2, "env://") == group_boot.EXIT_FAILED == 1
    finally:
        for s, h in handlers.items():  # a rank's process owns its signals; this one is pytest's
            signal.signal(s, h)
    assert comm.closed and not log.exists()  # rank 0's own log is rank 0's to write
    start, *_, stop = read(tmp_path / "boot.rank1.log")
    assert start["event"] == "boot.start" and start["pid"] == os.getpid()
    assert stop["event"] == "boot.stop" and stop["reason"] == "boot_failed"
    assert (stop["boot"], stop["rank"]) == ("b-0000beef", 1)
    assert stop["exit_code"] == 1 and "does not exist" in stop["error"]
    assert verdicts(tmp_path, "boot_health")["stopped_in_order"] == "FAIL"
