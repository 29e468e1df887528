"""The step budget, wired: with streams decoding and a long prompt arriving, no forward holds
more than ``step_tokens`` tokens, every decoder gets its token in every step, the long prompt
still completes, and the tokens are those of an engine without the budget. Invariants are
checked after every step (check mode)."""

from __future__ import annotations

import random
from typing import NamedTuple

import pytest

from engine import LLM, SamplingParams

STREAMS = 8


def greedy(n: int) -> SamplingParams:
    return SamplingParams(max_tokens=n, temperature=0, ignore_eos=True)


class Run(NamedTuple):
    llm: LLM
    batches: list[list[tuple[str, int]]]  # each forward's (rid, tokens) entries, in batch order
    decodes: list[int]  # each forward's decode entries
    tokens: dict[str, list[int]]  # every request's output, by rid


def mixed_load(model, *, long_len: int = 300, stream_tokens: int = 60, **config) -> Run:
    """Eight short streams decoding; after three steps a long prompt arrives (rid ``L``), and a
    short one behind it (``late``)."""
    rng = random.Random(0)
    llm = LLM(model=model, kv_tokens=8192, check_invariants=True, **config)
    sched = llm.core.scheduler
    batches: list[list[tuple[str, int]]] = []
    decodes: list[int] = []  # the decode entries of each forward
    forward = sched.runner.forward

    def recording(batch, *a, **kw):
        rid = {r.row: r.rid for r in sched.running}
        batches.append([(rid[e.row], len(e.token_ids)) for e in batch])
        decodes.append(sum(1 for r in sched.running if r.output_ids))  # no retraction: decoding
        return forward(batch, *a, **kw)

    sched.runner.forward = recording
    reqs = [
        sched.add_request([rng.randrange(2, 300) for _ in range(6)], greedy(stream_tokens), f"s{i}")
        for i in range(STREAMS)
    ]
    for _ in range(3):
        sched.step()
    reqs.append(sched.add_request([rng.randrange(2, 300) for _ in range(long_len)], greedy(4), "L"))
    reqs.append(sched.add_request([rng.randrange(2, 300) for _ in range(5)], greedy(4), "late"))
    while sched.has_work():
        sched.step()
    assert not llm.core.receipts.of("retract")  # roomy: every output-holding entry is a decode
    return Run(llm, batches, decodes, {r.rid: list(r.output_ids) for r in reqs})


def size(batch: list[tuple[str, int]]) -> int:
    return sum(n for _, n in batch)


@pytest.mark.parametrize("page_size", [1, 4])
def test_no_forward_exceeds_the_step_budget_while_decodes_go_on(tiny_model_dir, page_size):
    step = 32
    llm, batches, _, got = mixed_load(tiny_model_dir, step_tokens=step, page_size=page_size)
    expected = mixed_load(tiny_model_dir, step_tokens=None, page_size=page_size).tokens
    assert got == expected  # the budget changes timing, never tokens
    assert all(size(b) <= step for b in batches), max(map(size, batches))
    receipts = llm.core.receipts
    long_admits = [r for r in receipts.of("admission.admit") if r["rid"] == "L"]
    assert sum(r["tokens"] for r in long_admits) == 300  # the long prompt was prefilled whole
    assert len(long_admits) >= 300 // (step - STREAMS)  # in chunks the budget cut
    assert all(r["step_cut"] for r in long_admits[:-1])
    assert all(r["tokens"] <= r["step_budget"] for r in long_admits)
    assert {r["decodes"] for r in long_admits} == {STREAMS}  # every stream decoding meanwhile
    # every step that ran a chunk of the long prompt also ran a decode token for each stream
    chunk_steps = [dict(b) for b in batches if "L" in dict(b)][: len(long_admits)]
    assert sum(b["L"] for b in chunk_steps) == 300
    assert all(b[f"s{i}"] == 1 for b in chunk_steps for i in range(STREAMS))
    finished = {r["rid"] for r in receipts.of("request.finish")}
    assert finished == set(got) and not receipts.of("request.abort")
    assert not receipts.of("invariant.violation")


def test_a_request_behind_a_spent_step_budget_is_deferred_and_says_why(tiny_model_dir):
    llm = mixed_load(tiny_model_dir, step_tokens=32, page_size=4).llm
    defers = [r for r in llm.core.receipts.of("admission.defer") if r["reason"] == "step_budget"]
    assert defers, "the short request behind the long prompt was never held by the step budget"
    assert all(r["step_budget"] < 4 for r in defers)  # not the page its chunk must reach
    late = [r for r in llm.core.receipts.of("admission.admit") if r["rid"] == "late"]
    assert len(late) == 1 and not late[0]["chunked"]  # admitted whole, once there was room


@pytest.mark.parametrize("page", [1, 4])
def test_a_prompt_still_completes_when_decodes_alone_fill_the_budget(tiny_model_dir, page):
    """The starvation rule: eight decoders fill a budget of eight; the long prompt's chunks get
    the floor each step (as many tokens as the decodes: the forward then holds twice its decode
    tokens, never more) and it completes while every stream still decodes."""
    floor = STREAMS
    step, kw = 8, dict(long_len=100, stream_tokens=90, page_size=page)
    llm, batches, decodes, got = mixed_load(tiny_model_dir, step_tokens=step, **kw)
    expected = mixed_load(tiny_model_dir, step_tokens=None, **kw).tokens
    assert got == expected
    prefilled = next(
        i
        for i, r in enumerate(llm.core.receipts.records)
        if r["event"] == "admission.admit" and r["rid"] == "L" and r["held"] + r["tokens"] == 100
    )
    ended = [
        i
        for i, r in enumerate(llm.core.receipts.records)
        if r["event"] == "request.finish" and r["rid"].startswith("s")
    ]
    assert prefilled < min(ended), "the long prompt waited for the streams to end"
    bound = [max(step, 2 * d, d + page) for d in decodes]
    assert all(size(b) <= n for b, n in zip(batches, bound, strict=True))
    assert any(size(b) > step for b in batches)  # the floor did engage
    long_admits = [r for r in llm.core.receipts.of("admission.admit") if r["rid"] == "L"]
    assert sum(r["tokens"] for r in long_admits) == 100
    assert all(r["step_budget"] == floor and r["decodes"] == STREAMS for r in long_admits)
