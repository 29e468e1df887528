"""A layout cutover on a group of two ranks (six-layer tiny model, gloo on loopback): the same
ranks go from two tensor shards to two pipeline stages and back while requests are in flight,
every rank at one boundary; the residents re-prefill in the new layout and no greedy token
changes; the census counts everyone once; the carry takes a resident set that holds a chunked
prefill beside max_running decoders (the running ceiling); bad asks are refused."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from audit.inputs import expand_logs
from audit.spec import resolve
from audit.verdict import evaluate
from engine import LLM, SamplingParams
from engine.request.messages import Cutover
from tests.conftest import requires_default_model
from tests.integration.test_cutover import workload
from tests.integration.test_pp_group import read

GROUP = dict(
    page_size=4,
    chunk_tokens=32,
    max_running=8,
    check_invariants=True,
    group_check_interval=1,
    group_timeout=120,
    speculative="off",
)


@pytest.fixture(scope="module")
def expected(six_layers) -> list[list[int]]:
    prompts, params = workload(10)
    llm = LLM(six_layers, kv_tokens=8192, speculative="off")
    out = [o.token_ids for o in llm.generate(prompts, params)]
    llm.close()
    return out


def serve_with(model: str, log: Path, asks: dict[int, Cutover], work=None, **config):
    """``work``'s requests on a group of two, ``asks[i]`` cut over after step ``i``."""
    llm = LLM(model, log_file=str(log), **{"tp": 2, "kv_tokens": 2048, **GROUP, **config})
    sched = llm.core.scheduler
    reqs = [sched.add_request(p, q) for p, q in zip(*(work or (lambda: workload(10)))())]
    ends, i = [], 0
    while sched.has_work():
        llm.core.step()
        i += 1
        if i in asks:
            ends.append(llm.core.cutovers.run(asks[i]))
    out = [list(r.output_ids) for r in reqs]
    llm.close()
    return out, ends


@pytest.mark.parametrize("mode", ["carry", "drain"])
def test_tp_to_pp_and_back_under_load_changes_no_token(six_layers, expected, tmp_path, mode):
    log = tmp_path / "boot.jsonl"
    asks = {
        3: Cutover(kind="layout", mode=mode, tp=1, pp=2),
        9: Cutover(kind="layout", mode=mode, tp=2, pp=1),
    }
    got, ends = serve_with(six_layers, log, asks)
    assert got == expected
    assert [(e["outcome"], e["tp"], e["pp"]) for e in ends] == [("ok", 1, 2), ("ok", 2, 1)]
    ranks = [read(log), read(tmp_path / "boot.rank1.jsonl")]
    for r, rank in enumerate(ranks):  # every rank changed, at the same iteration, twice
        layouts = [x for x in rank if x["event"] == "group.layout"]
        assert [(x["tp"], x["pp"], x["stage"]) for x in layouts] == [(1, 2, r), (2, 1, 0)]
        assert layouts[0]["layers"] == [3 * r, 3 * r + 3] and layouts[1]["layers"] == [0, 6]
    iters = [[x["iter"] for x in rank if x["event"] == "group.layout"] for rank in ranks]
    assert iters[0] == iters[1]
    carries = [x for x in ranks[0] if x["event"] == "cutover.carry"]
    begins = [x for x in ranks[0] if x["event"] == "cutover.begin"]
    for begin, carry, end in zip(begins, carries, ends):  # each resident re-homed once
        assert len(set(carry["requeued"])) == len(carry["requeued"]) and not carry["rids"]
        assert sorted(end["rids"]) == sorted(set(end["rids"]))
        assert set(begin["running"]) <= set(carry["requeued"]) | set(end["ended"])
    assert not [x for rank in ranks for x in rank if x["event"] == "invariant.violation"]
    report = evaluate([resolve("group_agreement")], expand_logs([str(tmp_path)]))
    assert {c.status.value for c in report.specs[0].claims} == {"PASS"}


def chunk_beside_decoders():
    """Two short prompts that decode long and one long prompt that prefills in chunks, with
    max_running 2: the third runs as the one chunked prefill above the ceiling's base."""
    short = SamplingParams(max_tokens=40, temperature=0, ignore_eos=True)
    return [[5, 6, 7, 8], [9, 10, 11, 12], list(range(2, 200))], [short, short, short]


def test_a_carry_takes_a_chunked_prefill_beside_max_running_decoders(six_layers, tmp_path):
    log = tmp_path / "boot.jsonl"
    ask = {4: Cutover(kind="layout", mode="carry", tp=1, pp=2)}
    got, (end,) = serve_with(
        six_layers, log, ask, work=chunk_beside_decoders, max_running=2, chunk_tokens=16
    )
    assert end["outcome"] == "ok", end.get("reason")
    (begin,) = [x for x in read(log) if x["event"] == "cutover.begin"]
    assert len(begin["running"]) == 3 and begin["ceiling"] == 3  # max_running + the chunk
    ref = LLM(six_layers, kv_tokens=8192, speculative="off")
    assert got == [o.token_ids for o in ref.generate(*chunk_beside_decoders())]
    ref.close()


def test_a_layout_the_ranks_cannot_take_is_refused_and_serving_goes_on(six_layers, tmp_path):
    llm = LLM(six_layers, tp=2, kv_tokens=2048, **GROUP)
    cut = llm.core.cutovers
    bad = [
        (Cutover(kind="layout", mode="carry", tp=2, pp=2), 400, "keeps the group's 2 ranks"),
        (Cutover(kind="layout", mode="carry", tp=2, pp=1), 409, "serves tp 2 x pp 1 already"),
        (Cutover(kind="layout", mode="carry", tp=None, pp=2), 400, "needs tp and pp"),
        (Cutover(kind="pool", mode="carry", kv_tokens=1024), 409, "runs on one rank only"),
    ]
    for ask, status, said in bad:
        end = cut.run(ask)
        assert (end["outcome"], end["status"]) == ("rejected", status) and said in end["reason"]
    prompts, params = workload(4)
    assert all(len(o.token_ids) for o in llm.generate(prompts, params))
    llm.close()


def long_prompts():
    rng = random.Random(3)
    prompts = [[rng.randrange(2, 300) for _ in range(100)] for _ in range(12)]
    return prompts, [SamplingParams(max_tokens=24, temperature=0, ignore_eos=True)] * 12


def test_the_phase_policy_flips_to_stages_on_a_backlog_and_back_as_it_drains(six_layers, tmp_path):
    """Twelve 100-token prompts at once on shards (tp 2): the backlog (1,200 tokens) is above
    phase_enter_pp, so after the dwell the group flips to stages; once the prompts are in and
    the backlog at or below phase_exit_pp, it flips back. Two flips, each where its receipted
    numbers cross a threshold, every other decision a stay; the tokens are one rank's."""
    log = tmp_path / "boot.jsonl"
    policy = dict(
        phase_policy="auto",
        phase_enter_pp=400,
        phase_exit_pp=40,
        phase_dwell=4,
        phase_interval=2,
        max_running=4,
    )
    got, _ = serve_with(six_layers, log, {}, work=long_prompts, **policy)
    ref = LLM(six_layers, kv_tokens=8192, speculative="off")
    assert got == [o.token_ids for o in ref.generate(*long_prompts())]
    ref.close()
    rank0 = read(log)
    decisions = [x for x in rank0 if x["event"] == "phase.decide"]
    flips = [x for x in decisions if x["decision"] == "flip"]
    assert [(f["layout"], f["to"], f["reason"]) for f in flips] == [
        ("shards", "stages", "backlog_high"),
        ("stages", "shards", "backlog_low"),
    ]
    assert flips[0]["backlog"] >= 400 and flips[1]["backlog"] <= 40
    assert all(f["since"] >= 4 and f["outcome"] == "ok" for f in flips)
    assert all(d["reason"] in ("dwell", "steady") for d in decisions if d["decision"] == "stay")
    ends = {x["id"]: x for x in rank0 if x["event"] == "cutover.end"}
    assert [(ends[f["cutover"]]["tp"], ends[f["cutover"]]["pp"]) for f in flips] == [(1, 2), (2, 1)]
    rank1 = read(tmp_path / "boot.rank1.jsonl")
    assert [x["pp"] for x in rank1 if x["event"] == "group.layout"] == [2, 1]


@pytest.mark.slow
@requires_default_model
def test_the_default_model_through_a_layout_carry_gives_one_ranks_tokens(tmp_path):
    """The default model on three ranks, shards (tp 3) to stages (pp 3) mid-generation and
    back, exact mode: the greedy tokens of one rank."""
    texts = ["The capital of France is", "def fibonacci(n):", "Once upon a time, in a land"]
    params = SamplingParams(max_tokens=24, temperature=0, ignore_eos=True)
    ref = LLM(None, kv_tokens=4096, speculative="off")
    want = [o.token_ids for o in ref.generate(texts, params)]
    ref.close()
    llm = LLM(None, tp=3, kv_tokens=4096, speculative="off", group_timeout=300)
    sched = llm.core.scheduler
    tok = llm.core.tokenizer
    reqs = [sched.add_request(tok.encode(t), params) for t in texts]
    i = 0
    while sched.has_work():
        llm.core.step()
        i += 1
        if i in (4, 12):
            tp, pp = (1, 3) if i == 4 else (3, 1)
            end = llm.core.cutovers.run(Cutover(kind="layout", mode="carry", tp=tp, pp=pp))
            assert end["outcome"] == "ok", end.get("reason")
    got = [list(r.output_ids) for r in reqs]
    llm.close()
    assert got == want


def test_a_policy_whose_layouts_the_model_cannot_take_is_refused_before_any_rank_starts(
    six_layers,
):
    """Three ranks of a model with four heads: stages (pp 3) fit, shards (tp 3) do not, so
    --phase-policy auto is refused at boot, naming the layout and why."""
    with pytest.raises(ValueError, match=r"cannot take tp 3 x pp 1: .*heads"):
        LLM(six_layers, pp=3, phase_policy="auto", kv_tokens=1024)
