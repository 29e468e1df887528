"""``ranks_agree`` per (boot, iteration): a digest that differs is a FAIL naming the boot, the
iteration, the ranks and both digests; a rank without the receipt another rank wrote fails while
its log goes on and is UNDECIDED where its log had ended; a rank its boot declared and no log
holds is UNDECIDED, never a vacuous pass; and the group_agreement window applies to multi-rank
boots only."""

from __future__ import annotations

from pathlib import Path

from audit.checker import Bus
from audit.kinds import build_checker
from audit.parse import parse_spec
from audit.reader import scan
from audit.spec import load_spec, shipped
from audit.verdict import evaluate, receivers
from engine.observability.computed import batch_digest
from tests.unit.audit_logs import LogText

DIGESTS = (
    'kind = "ranks_agree"\nselect = { kind = "iteration", where = { digest = { exists = true } } }\n'
    'fields = ["digest"]\n'
)
PARKS = (
    'kind = "ranks_agree"\nselect = [{ kind = "admission.admit" }, { kind = "admission.park" }]\n'
    'fields = ["rid"]\n'
)
BATCHES = {1: [("r-1", 12)], 2: [("r-1", 1), ("r-2", 12)], 3: [("r-1", 1), ("r-2", 1)]}


def decide(tmp_path: Path, claim: str, *logs: LogText):
    spec = parse_spec('description = "t"\n[[claim]]\nid = "c"\n' + claim, Path("t/spec.toml"))
    paths = [log.write(tmp_path / f"rank-{i}.jsonl") for i, log in enumerate(logs)]
    return evaluate([spec], paths).specs[0].claims[0]


def rank_log(
    rank: int,
    *,
    tp: int | None = 2,
    boot: str = "b-00000001",
    skip: int | None = None,
    change: dict[int, list] | None = None,
    until: int = 3,
    pp: int | None = None,
) -> LogText:
    """One rank's log: iterations 1..until, each with the digest of its batch (``change``
    swaps a batch, ``skip`` leaves an iteration's receipt unwritten), then boot.stop."""
    log = LogText(boot)
    config = {} if tp is None else {"tp": tp}
    log.r("boot.start", rank, config=config if pp is None else {**config, "pp": pp})
    log.r("boot.ready", rank, startup_s=0.1)
    for it in range(1, until + 1):
        log.iter = it
        if it != skip:
            batch = (change or {}).get(it, BATCHES[it])
            log.r("iteration", rank, running=len(batch), waiting=0, digest=batch_digest(batch))
    log.iter = 3
    return log.stop(rank)


def test_a_digest_that_differs_at_one_iteration_names_it_the_ranks_and_both_digests(tmp_path):
    split = [("r-1", 1), ("r-2", 8)]
    v = decide(tmp_path, DIGESTS, rank_log(0), rank_log(1, change={2: split}))
    assert v.status == "FAIL" and v.numbers["differ"] == 1 and v.numbers["iterations"] == 3
    a, b = batch_digest(BATCHES[2]), batch_digest(split)
    assert (
        f"first: boot b-00000001 iter 2 (rank 0: iteration digest {a!r}, "
        f"rank 1: iteration digest {b!r})" in v.why
    )
    assert decide(tmp_path, DIGESTS, rank_log(0), rank_log(1)).status == "PASS"


def test_values_that_differ_past_forty_characters_are_shown_whole(tmp_path):
    """Cut at a width, two different long values read as one and the same."""
    a, b = "d" * 45 + "1", "d" * 45 + "2"

    def log(rank: int, digest: str) -> LogText:
        log = LogText("b-00000001")
        log.r("boot.start", rank, config={"tp": 2})
        log.iter = 1
        log.r("iteration", rank, running=1, waiting=0, digest=digest)
        return log.stop(rank)

    v = decide(tmp_path, DIGESTS, log(0, a), log(1, b))
    assert v.status == "FAIL", v.why
    assert f"rank 0: iteration digest {a!r}, rank 1: iteration digest {b!r}" in v.why, v.why


def test_a_rank_without_the_digest_another_wrote_fails_while_its_log_goes_on(tmp_path):
    v = decide(tmp_path, DIGESTS, rank_log(0), rank_log(1, skip=2))
    assert v.status == "FAIL"
    assert (
        f"iter 2 (rank 0: iteration digest {batch_digest(BATCHES[2])!r}, rank 1: no receipt)"
        in v.why
    )


def test_decisions_after_a_rank_log_ended_are_undecided(tmp_path):
    cut = LogText()
    cut.r("boot.start", 1, config={"tp": 2}).r("boot.ready", 1, startup_s=0.1)
    cut.iter = 1
    cut.r("iteration", 1, running=1, waiting=0, digest=batch_digest(BATCHES[1]))
    v = decide(tmp_path, DIGESTS, rank_log(0), cut)  # rank 1's file ends at iteration 1
    assert (v.status, v.reason) == ("UNDECIDED", "rank_log_ended")
    assert "boot b-00000001 iter 2 (the log of rank 1 at iter 1 ended before it)" in v.why
    assert v.numbers["iterations"] == 1 and v.numbers["unmatched"] == 2


def test_boots_are_judged_apart(tmp_path):
    # the same iteration numbers in two boots: each boot's ranks are compared with each other only
    a0, a1 = rank_log(0, boot="b-a"), rank_log(1, boot="b-a")
    b0, b1 = rank_log(0, boot="b-b"), rank_log(1, boot="b-b", change={3: [("r-9", 1)]})
    v = decide(tmp_path, DIGESTS, a0, a1, b0, b1)
    assert v.status == "FAIL" and v.numbers["differ"] == 1 and "boot b-b iter 3" in v.why
    assert decide(tmp_path, DIGESTS, a0, a1, b0, rank_log(1, boot="b-b")).numbers["iterations"] == 6
    # one rank in each boot, as if two ranks: nothing to compare, never across boots
    single = rank_log(0, boot="b-a", tp=None), rank_log(1, boot="b-b", tp=None)
    v = decide(tmp_path, DIGESTS, *single)
    assert (v.status, v.reason) == ("UNDECIDED", "single_rank")


def test_a_missing_rank_is_undecided_even_where_a_vacuous_pass_is_allowed(tmp_path):
    for claim in (DIGESTS, PARKS + "allow_vacuous = true\n"):
        v = decide(tmp_path, claim, rank_log(0))
        assert (v.status, v.reason) == ("UNDECIDED", "rank_missing")
        assert "boot b-00000001 says 2 ranks (boot.start config.tp), no log holds rank 1" in v.why
    # a boot that says a great many ranks is counted, never listed rank by rank
    v = decide(tmp_path, DIGESTS, rank_log(0, tp=10**12))
    assert v.reason == "rank_missing" and v.numbers["ranks_missing"] == 10**12 - 1
    assert "no log holds rank 1, 2, 3, 4, 5 and 999999999994 more" in v.why
    # a boot.start that does not say how many ranks: one rank is a one-rank boot
    v = decide(tmp_path, PARKS + "allow_vacuous = true\n", rank_log(0, tp=None))
    assert v.reason == "vacuous"
    # a difference between the ranks that came is a FAIL, whoever is missing
    v = decide(tmp_path, DIGESTS, rank_log(0, tp=3), rank_log(1, tp=3, change={1: []}))
    assert v.status == "FAIL" and v.numbers["ranks_missing"] == 1


def test_a_pipelines_ranks_are_its_stages_times_its_shards(tmp_path):
    """A boot of tp 1 x pp 2 has two ranks: the second stage's log missing is UNDECIDED, not a
    one-rank boot with nothing to agree on; tp 2 x pp 2 wants four."""
    v = decide(tmp_path, DIGESTS, rank_log(0, tp=1, pp=2))
    assert (v.status, v.reason) == ("UNDECIDED", "rank_missing")
    assert "says 2 ranks (boot.start config.tp x config.pp), no log holds rank 1" in v.why
    logs = [rank_log(r, tp=2, pp=2) for r in range(3)]
    v = decide(tmp_path, DIGESTS, *logs)
    assert v.reason == "rank_missing" and "says 4 ranks" in v.why and "rank 3" in v.why
    v = decide(tmp_path, DIGESTS, *logs, rank_log(3, tp=2, pp=2))
    assert v.status == "PASS"


def test_group_agreement_applies_to_multi_rank_boots_and_to_a_boot_that_says_it_has_ranks(
    tmp_path,
):
    spec = load_spec(next(p for p in shipped() if p.name == "group_agreement"))
    assert spec.regime.min_ranks == 2
    assert not any(c.allow_vacuous for c in spec.claims)

    def applied(*logs: LogText) -> bool:
        paths = [log.write(tmp_path / f"l{i}.jsonl") for i, log in enumerate(logs)]
        return bool(evaluate([spec], paths, only_applicable=True).specs)

    assert applied(rank_log(0), rank_log(1))
    assert applied(rank_log(0))  # tp = 2 said, one rank's log came: judged (rank_missing)
    assert not applied(rank_log(0, tp=None))
    assert not applied(rank_log(0, tp=1))


def test_a_boot_that_says_one_rank_keeps_no_digests(tmp_path):
    """A one-rank boot has nothing to agree with: its decisions are counted, not held, so the
    auditor's memory does not grow with a one-rank log's iterations."""
    spec = parse_spec('description = "t"\n[[claim]]\nid = "c"\n' + PARKS, Path("t/spec.toml"))
    log = LogText("b-00000001")
    log.r("boot.start", 0, config={"tp": 1})
    for it in range(1, 50):
        log.iter = it
        log.r("admission.admit", 0, rid=f"r-{it}", tokens=4, pages=1)
    path = log.stop(0).write(tmp_path / "one.jsonl")
    bus = Bus()
    (checker,) = [build_checker(c, bus) for c in spec.claims]
    scan([path], routes=receivers(bus))
    assert checker.digest == {} and checker.unkept == {("b-00000001", 0)}
    kept = evaluate([spec], [path], exact=True).specs[0].claims[0]
    assert evaluate([spec], [path]).specs[0].claims[0] == kept
    assert kept.reason == "single_rank"


def test_a_boot_that_says_one_rank_and_has_two_is_read_again_with_every_digest(tmp_path):
    """boot.start said tp 1, yet two ranks' logs hold the boot: the decisions left unkept are
    needed, so the logs are read again keeping them, and the difference is found."""
    split = [("r-1", 1), ("r-2", 8)]
    v = decide(tmp_path, DIGESTS, rank_log(0, tp=1), rank_log(1, tp=1, change={2: split}))
    assert v.status == "FAIL" and v.numbers["differ"] == 1 and v.numbers["iterations"] == 3
    assert decide(tmp_path, DIGESTS, rank_log(0, tp=1), rank_log(1, tp=1)).status == "PASS"
