"""The production relief ladder (law 4): evict -> spill -> throttle -> retract, then admission
parks. Each rung is fallible and each outcome a receipt; a rung that raises or pays short is an
outcome and the ladder goes on; the throttle closes the line for K iterations; retraction is
asked only where no slot of the step is taken yet (decode funding, a would-be park); and the shipped `relief_ladder` window is decided
by the engine's own receipts."""

from __future__ import annotations

import signal
from collections import Counter
from contextlib import contextmanager

import pytest

from engine import LLM, SamplingParams
from engine.scheduler.iteration import snapshot_of
from engine.scheduler.memory import Rung
from tests.integration.test_pressure import roomy_and_tight, three_at_once, workload


@contextmanager
def deadline(seconds: int):
    """Fail, instead of hanging, when the body runs past ``seconds`` (a limit for a spin that
    would never end, so roomy: a busy machine only makes the body slower)."""

    def expired(signum, frame):
        raise TimeoutError(f"still running after {seconds} s")

    old = signal.signal(signal.SIGALRM, expired)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def rungs_of(receipts) -> list[tuple[str, str, str]]:
    return [(x["site"], x["rung"], x["outcome"]) for x in receipts.of("relief.rung")]


def test_the_ladder_is_registered_in_order_and_says_so_once(tiny_model_dir):
    plain = LLM(model=tiny_model_dir, kv_tokens=256)
    names = [r.name for r in plain.core.scheduler.memory.rungs]
    assert names == ["evict", "throttle", "retract"]  # no host tier: no spill rung
    tiered = LLM(model=tiny_model_dir, kv_tokens=256, host_kv_tokens=512)
    names = [r.name for r in tiered.core.scheduler.memory.rungs]
    assert names == ["evict", "spill", "throttle", "retract"]
    texts = [x["text"] for x in tiered.core.receipts.of("notice")]
    assert texts == ["relief ladder: evict -> spill -> throttle -> retract -> park"]
    off = LLM(model=tiny_model_dir, kv_tokens=256, relief_ladder=False)
    assert off.core.scheduler.memory.rungs == [] and off.core.receipts.of("notice") == []


LADDER = ["evict", "spill", "throttle", "retract"]


def engagements(receipts) -> list[tuple[str, list[str]]]:
    """Each engagement of the ladder, in log order: its site and the rungs it asked."""
    out: list[tuple[str, list[str]]] = []
    for x in receipts.records:
        if x["event"] == "relief.engage":
            out.append((x["site"], []))
        elif x["event"] == "relief.rung":
            out[-1][1].append(x["rung"])
    return out


@pytest.mark.parametrize("host_kv_tokens", [0, 4096])
def test_every_engagement_asks_its_rungs_in_ladder_order(tiny_model_dir, host_kv_tokens):
    """Law 4: whichever site asks, the rungs are asked in the one order (evict, spill,
    throttle, retract), each at most once, and only where they serve."""
    prompts, params = workload(300, n=16, seed=3)
    llm = LLM(
        model=tiny_model_dir,
        kv_tokens=three_at_once(prompts, params),
        chunk_tokens=32,
        max_running=8,
        check_invariants=True,
        host_kv_tokens=host_kv_tokens,
    )
    llm.generate(prompts, params)
    seen = engagements(llm.core.receipts)
    assert {site for site, _ in seen} >= {"decode", "admission"}
    assert any(len(asked) > 1 for _, asked in seen)  # an order was there to keep
    for site, asked in seen:
        assert asked == sorted(asked, key=LADDER.index) and len(set(asked)) == len(asked)
        assert site in ("decode", "park") or "retract" not in asked
        assert site != "park" or not {"evict", "spill"} & set(asked)


def test_under_pressure_the_ladder_pays_and_each_rung_says_what_it_paid(tiny_model_dir):
    prompts, params = workload(300)
    expected, got, tight = roomy_and_tight(tiny_model_dir, prompts, params)
    assert got == expected  # the ladder changes nothing but timing
    r = tight.core.receipts
    engages = r.of("relief.engage")
    assert {e["site"] for e in engages} >= {"decode", "admission"}
    rungs = rungs_of(r)
    assert ("admission", "evict", "paid") in rungs and ("decode", "retract", "paid") in rungs
    # retraction is asked only where no slot of the step is taken yet: decode funding, and a
    # chunk about to park (which it replaced here: decoders went back in line instead)
    assert {site for site, rung, _ in rungs if rung == "retract"} == {"decode", "park"}
    assert ("park", "retract", "paid") in rungs and not r.of("admission.park")
    # at a park the budget counted evictable tokens already: evict and spill are not asked
    assert {rung for site, rung, _ in rungs if site == "park"} == {"throttle", "retract"}
    for x in r.of("retract"):  # only decode funding says the ratio predicted too little
        assert (x["ratio_new"] > x["ratio_old"]) == (x["site"] == "decode"), x
    for x in r.of("relief.rung"):  # paid means the rung met what it was asked
        assert (x["paid"] >= x["asked"]) == (x["outcome"] == "paid"), x
    retracted = [rid for x in r.of("retract") for rid in x["rids"]]
    assert sorted(retracted) == sorted(x["rid"] for x in r.of("requeue"))  # victims come back
    assert not r.of("alloc.oom") and not r.of("invariant.violation")


@pytest.mark.parametrize("fault", ["raises", "pays_short", "claims_without_paying"])
def test_a_faulty_rung_is_an_outcome_and_the_ladder_goes_on(tiny_model_dir, fault):
    """Law 4: a provider that raises or under-pays does not stop the ladder; the rungs after it
    pay, the receipts say what each paid, and nothing is lost. A provider that claims tokens it
    did not free is not believed: decode funding measures what became available."""
    prompts, params = workload(300, n=16, seed=2)
    expected = [
        o.token_ids for o in LLM(model=tiny_model_dir, kv_tokens=8192).generate(prompts, params)
    ]
    llm = LLM(
        model=tiny_model_dir,
        kv_tokens=three_at_once(prompts, params),
        chunk_tokens=32,
        max_running=8,
        check_invariants=True,
    )
    asked: list[int] = []

    def faulty(n: int) -> int:
        asked.append(n)
        if fault == "raises":
            raise RuntimeError("rung broke")
        return 0 if fault == "pays_short" else n  # it frees nothing either way

    sched = llm.core.scheduler
    sched.memory.rungs.insert(0, Rung("faulty", faulty, frozenset({"decode", "admission"})))
    with deadline(300):  # a rung believed on its word would spin decode funding forever
        got = [o.token_ids for o in llm.generate(prompts, params)]
    assert got == expected and asked  # it was asked, and it changed no token
    r = llm.core.receipts
    outcome = {"raises": "raised", "pays_short": "short", "claims_without_paying": "paid"}[fault]
    by_engagement: list[list[tuple[str, str]]] = []  # at the sites the faulty rung serves
    for x in r.records:
        if x["event"] == "relief.engage" and x["site"] in ("decode", "admission"):
            by_engagement.append([])
        elif x["event"] == "relief.rung" and x["site"] in ("decode", "admission"):
            by_engagement[-1].append((x["rung"], x["outcome"]))
    assert by_engagement and all(e[0] == ("faulty", outcome) for e in by_engagement)
    if fault != "claims_without_paying":  # the next rung was asked every time
        assert all(len(e) >= 2 and e[1][0] == "evict" for e in by_engagement)
        assert any(rung == "evict" and out == "paid" for e in by_engagement for rung, out in e)
    if fault == "raises":
        assert {x["error"] for x in r.of("relief.rung") if x["rung"] == "faulty"} == {
            "RuntimeError: rung broke"
        }
    assert Counter(x["event"] for x in r.records)["request.finish"] == len(prompts)
    assert not r.of("alloc.oom") and not r.of("invariant.violation")
    # what the ladder left unpaid the floor paid before any allocation: the net never had to
    assert not r.of("alloc.relief")
    # /metrics counts the rungs by outcome from the same receipts (attest:relief_rungs_total)
    rungs = Counter(x["outcome"] for x in r.of("relief.rung"))
    tallies = snapshot_of(sched).tallies
    assert {o: tallies.get(("relief.rung", o), 0) for o in rungs} == rungs
    assert tallies[("relief.rung", outcome)] >= len(by_engagement)


def test_the_throttle_closes_the_line_for_k_iterations(tiny_model_dir):
    prompts, params = workload(300)
    llm = LLM(
        model=tiny_model_dir,
        kv_tokens=three_at_once(prompts, params),
        chunk_tokens=32,
        max_running=8,
        check_invariants=True,
        relief_throttle_iterations=5,
    )
    llm.generate(prompts, params)
    r = llm.core.receipts
    throttles = r.of("relief.throttle")
    assert throttles and all(
        t["until"] == t["iter"] + 5 and t["iterations"] == 5 for t in throttles
    )
    # armed in iteration t (at decode funding, before admission; or later in the step), it
    # holds the line through `until`: no newcomer is admitted after t while it holds
    after = {i for t in throttles for i in range(t["iter"] + 1, t["until"] + 1)}
    newcomers = [a for a in r.of("admission.admit") if a["held"] == a["prefix_hit"]]
    assert not [a for a in newcomers if a["iter"] in after]
    held = {i for t in throttles for i in range(t["iter"], t["until"] + 1)}
    defers = [d for d in r.of("admission.defer") if d["reason"] == "throttle"]
    assert defers and all(d["iter"] in held and d["running"] > 0 for d in defers)


def test_admission_spends_whole_pages_so_an_allocation_never_runs_short(tiny_model_dir):
    """Law 3: a 68-token prompt on 16-token pages takes 80 slots, and the round's budget must
    count 80, or the last admission of a full round finds no page at its allocation."""
    llm = LLM(
        model=tiny_model_dir,
        kv_tokens=256,
        page_size=16,
        max_running=6,
        check_invariants=True,
        relief_ladder=False,
    )
    prompts = [[5 + i] * n for i, n in enumerate([68, 36, 68, 36, 36, 36])]
    outs = llm.generate(prompts, SamplingParams(max_tokens=4, temperature=0, ignore_eos=True))
    assert [len(o.token_ids) for o in outs] == [4] * 6
    r = llm.core.receipts
    assert not r.of("alloc.oom") and not r.of("alloc.relief")  # admission funded every page
    for a in r.of("admission.admit"):
        assert a["remaining"] >= a["pages"] * 16 - (a["held"] % 16 and 16 - a["held"] % 16)


def window_log(model: str, log, **kw) -> None:
    prompts, params = workload(300)
    llm = LLM(
        model=model,
        kv_tokens=three_at_once(prompts, params),
        chunk_tokens=32,
        max_running=8,
        check_invariants=True,
        log_file=str(log),
        **kw,
    )
    llm.generate(prompts, params)
    llm.close("test")


def test_the_relief_ladder_window_passes_on_the_engines_own_receipts(tiny_model_dir, tmp_path):
    from audit.spec import resolve
    from audit.verdict import evaluate

    on, off = tmp_path / "on.jsonl", tmp_path / "off.jsonl"
    window_log(tiny_model_dir, on)
    window_log(tiny_model_dir, off, relief_ladder=False)
    report = evaluate([resolve("relief_ladder")], [on], control=off)
    got = {c.claim: (c.status.value, c.reason, c.why) for c in report.specs[0].claims}
    assert {k: v[0] for k, v in got.items()} == {
        "ladder_engaged": "PASS",
        "rungs_paid": "PASS",
        "paid_rungs_met_the_ask": "PASS",
        "rung_paid_what_it_freed": "PASS",
        "fewer_parks_than_control": "PASS",
        "host_loads_were_spilled": "N/A",
        "host_drops_were_held": "N/A",  # no host tier here
    }, got
    # the control, ladder off, never engaged: alone it is UNDECIDED, never PASS
    alone = evaluate([resolve("relief_ladder")], [off])
    verdicts = {c.claim: (c.status.value, c.reason) for c in alone.specs[0].claims}
    assert verdicts["ladder_engaged"] == ("UNDECIDED", "no_engagement")


def test_with_a_host_tier_evict_sheds_what_the_host_holds_and_spill_copies_the_rest(
    tiny_model_dir,
):
    """The first rung costs nothing: it drops only device copies whose KV is also on the host;
    the spill rung copies device-only prefixes to the host instead of dropping them."""
    from tests.integration.test_host_tier import chats

    llm = LLM(model=tiny_model_dir, kv_tokens=256, host_kv_tokens=4096, check_invariants=True)
    chats(llm, 300)
    r = llm.core.receipts
    rungs = r.of("relief.rung")
    assert {x["rung"] for x in rungs if x["outcome"] == "paid"} >= {"evict", "spill"}
    evictions = r.of("eviction")  # each says what of it was spilled
    sheds = [e for e in evictions if e.get("scope") == "host_backed" and e["evicted"]]
    assert sheds and all(e["spilled"] == 0 for e in sheds)  # the evict rung copies nothing
    assert any(e["spilled"] > 0 for e in evictions if e.get("scope") is None)


def test_the_host_tier_claims_pass_on_the_engines_own_receipts(tiny_model_dir, tmp_path):
    """A host tier small enough to make room: every load and every drop the engine writes is
    within what was spilled to the host less what it dropped (relief_ladder's host claims)."""
    from audit.spec import resolve
    from audit.verdict import evaluate
    from tests.integration.test_host_tier import chats

    log = tmp_path / "tier.jsonl"
    llm = LLM(
        model=tiny_model_dir,
        kv_tokens=256,
        host_kv_tokens=64,
        check_invariants=True,
        log_file=str(log),
    )
    chats(llm, 300)
    llm.close("test")
    report = evaluate([resolve("relief_ladder")], [log])
    got = {c.claim: (c.status.value, c.reason, c.why) for c in report.specs[0].claims}
    for claim in ("host_loads_were_spilled", "host_drops_were_held"):
        assert got[claim][:2] == ("PASS", None), got[claim]  # engaged: not vacuous


def test_retraction_is_never_asked_once_the_batch_is_being_built(tiny_model_dir):
    """Where admission pays for the evictable tokens it counted, and at the allocation-site net,
    the step's batch already holds this step's decodes: taking one back there would run it in a
    forward after it left. With the evict rung broken at those sites the ladder ends without
    retraction and the cache's own eviction pays (the floor)."""
    prompts, params = workload(300, n=16, seed=4)
    expected = [
        o.token_ids for o in LLM(model=tiny_model_dir, kv_tokens=8192).generate(prompts, params)
    ]
    llm = LLM(
        model=tiny_model_dir,
        kv_tokens=three_at_once(prompts, params),
        chunk_tokens=32,
        max_running=8,
        check_invariants=True,
    )
    memory = llm.core.scheduler.memory
    name, evict, sites = memory.rungs[0]
    asked_at: list[str] = []

    def evict_except_at_decode(n: int) -> int:
        if asked_at[-1] != "decode":
            raise RuntimeError("evict rung broke")
        return evict(n)

    def engaged(kind: str, fields: dict) -> None:
        if kind == "relief.engage":
            asked_at.append(fields["site"])

    llm.core.receipts.listen(engaged)
    memory.rungs[0] = Rung(name, evict_except_at_decode, sites)
    assert [o.token_ids for o in llm.generate(prompts, params)] == expected
    rungs = rungs_of(llm.core.receipts)
    assert ("admission", "evict", "raised") in rungs  # the broken rung was reached there
    assert {site for site, rung, _ in rungs if rung == "retract"} <= {"decode", "park"}
    assert not llm.core.receipts.of("alloc.oom")


def test_the_throttle_never_idles_an_engine_with_nothing_running(tiny_model_dir):
    """With nothing running there is nothing to protect: a held line would only idle the
    engine. While one request runs, the next waits for the throttle; alone, each is admitted."""
    llm = LLM(model=tiny_model_dir, kv_tokens=256, check_invariants=True)
    sched = llm.core.scheduler
    sched.memory.throttle.until = 10**9  # held for good
    params = SamplingParams(max_tokens=3, temperature=0, ignore_eos=True)
    with deadline(300):
        a, b = [sched.add_request([3, 4, 5 + i], params) for i in range(2)]
        sched.step()
        assert a.row is not None and b.row is None  # a runs; b waits behind the throttle
        while sched.has_work():
            sched.step()
    assert a.finish_reason == b.finish_reason == "length"
    reasons = {d["reason"] for d in llm.core.receipts.of("admission.defer")}
    assert reasons == {"throttle"}
