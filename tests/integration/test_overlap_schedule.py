"""The next step planned while this one's forward runs (``overlap_schedule``): the same tokens
as a step planned after its forward, the ledger balanced after every step (check mode), relief
never beside a forward, a planned slot given back by a request that ends without it."""

from __future__ import annotations

import random
import threading
import time

import pytest

from engine import LLM, SamplingParams
from engine.config import EngineConfig
from engine.request.guide import Guide


def greedy(n: int, **kw) -> SamplingParams:
    return SamplingParams(max_tokens=n, temperature=0, ignore_eos=True, **kw)


def engine(model: str, overlap: bool, **config) -> LLM:
    config = {"kv_tokens": 4096, "max_running": 8, "page_size": 4} | config
    return LLM(
        model=model,
        check_invariants=True,
        speculative="off",
        overlap_schedule=overlap,
        **config,
    )


def workload(seed: int = 0, n: int = 24) -> tuple[list[list[int]], list[SamplingParams]]:
    rng = random.Random(seed)
    prompts = [[rng.randrange(5, 250) for _ in range(rng.randrange(3, 40))] for _ in range(n)]
    return prompts, [greedy(rng.randrange(1, 30)) for _ in range(n)]


def both_ways(model: str, prompts, params, **config) -> tuple[list, list, LLM]:
    """The outputs of an engine planning each step after its forward and of one planning it
    beside the forward before, and the latter engine."""
    plain = engine(model, False, **config).generate(prompts, params)
    llm = engine(model, True, **config)
    return plain, llm.generate(prompts, params), llm


def summed(llm: LLM, field: str) -> int:
    return sum(r.get(field, 0) for r in llm.core.receipts.of("iteration"))


@pytest.mark.parametrize(
    ("kv_tokens", "page_size", "chunk_tokens"),
    [(4096, 4, 2048), (160, 4, 2048), (96, 1, 2048), (4096, 4, 8)],
)
def test_the_same_tokens_as_a_step_planned_after_its_forward(
    tiny_model_dir, kv_tokens, page_size, chunk_tokens
):
    """Roomy and tight pools (relief then waits for a forward, and retracts), and prompts in
    chunks of 8 (a chunk planned ahead of the chunk before it)."""
    prompts, params = workload()
    config = {"kv_tokens": kv_tokens, "page_size": page_size, "chunk_tokens": chunk_tokens}
    plain, ahead, llm = both_ways(tiny_model_dir, prompts, params, **config)
    assert summed(llm, "overlap_ahead") > 0  # steps were planned beside a forward
    if kv_tokens < 1000:  # the tight pools made relief wait for a forward, and retract
        assert summed(llm, "overlap_waited") > 0
        assert llm.core.receipts.of("retract")
    assert [o.token_ids for o in ahead] == [o.token_ids for o in plain]


KINDS = {
    "logprobs": {"logprobs": 2},
    "penalties": {"presence_penalty": 0.5, "frequency_penalty": 0.3, "repetition_penalty": 1.3},
    "bias": {"logit_bias": {7: 3.0, 11: -2.0}},
    # token 7 ends it and is every row's argmax: banned for the first 9 tokens, so the 10th ends it
    "min_tokens": {"min_tokens": 9, "stop_token_ids": [7], "logit_bias": {7: 30.0}},
    "json": {"guide": Guide("json_object")},
}


@pytest.mark.parametrize("kind", list(KINDS))
def test_requests_of_every_kind_answer_as_without_overlap(tiny_model_dir, kind):
    """What sampling reads of a request's output (penalties, banned stops, a grammar's state)
    is the output with the token before it, though its step was planned without that token."""
    prompts, _ = workload(5, n=6)
    params = SamplingParams(max_tokens=24, temperature=0, **KINDS[kind])
    plain, ahead, _ = both_ways(tiny_model_dir, prompts, [params] * len(prompts))
    runs = {
        overlap: [(o.token_ids, o.finish_reason) for o in outs]
        for overlap, outs in ((False, plain), (True, ahead))
    }
    assert runs[True] == runs[False]
    if kind == "min_tokens":  # each stopped where its stop token was first allowed
        assert [(len(t), r) for t, r in runs[True]] == [(10, "stop")] * len(prompts)


def test_no_relief_runs_beside_a_forward(tiny_model_dir):
    """A forward made slow enough that the next step's plan runs beside it: no eviction and no
    release of a request's KV happens while it runs (``Memory.make_room`` waits for it)."""
    llm = engine(tiny_model_dir, True, kv_tokens=96, page_size=1)
    sched = llm.core.scheduler
    flying = threading.Event()
    beside: list[str] = []
    forward, evict, release = sched.runner.forward, sched.cache.evict, sched.memory.holdings.release

    def slow_forward(*a, **kw):
        flying.set()
        try:
            time.sleep(0.005)
            return forward(*a, **kw)
        finally:
            flying.clear()

    def watched(name, fn):
        def call(*a, **kw):
            if flying.is_set():
                beside.append(name)
            return fn(*a, **kw)

        return call

    sched.runner.forward = slow_forward
    sched.cache.evict = watched("evict", evict)
    sched.memory.holdings.release = watched("release", release)
    prompts, params = workload(1)
    llm.generate(prompts, params)
    assert llm.core.receipts.of("retract") and summed(llm, "overlap_waited") > 0
    assert beside == []


def test_a_request_that_stops_early_gives_its_planned_slot_back(tiny_model_dir):
    """A stop token ends a request whose next step was planned: the planned position's KV was
    never computed, so the prefix cache must not take it. A second request over the first's
    text and stop token then reads only computed KV: its tokens are a fresh engine's."""
    prompt = [7, 19, 33, 41, 52, 60]
    first = engine(tiny_model_dir, False, page_size=1).generate([prompt], [greedy(12)])[0]
    stop = first.token_ids[5]
    ended = first.token_ids[: first.token_ids.index(stop) + 1]
    follow = prompt + ended + [90, 91, 92]
    want = engine(tiny_model_dir, False, page_size=1).generate([follow], [greedy(8)])[0].token_ids
    llm = engine(tiny_model_dir, True, page_size=1)
    out = llm.generate(
        [prompt], [SamplingParams(max_tokens=12, temperature=0, stop_token_ids=[stop])]
    )
    assert out[0].token_ids == ended and out[0].finish_reason == "stop"
    assert summed(llm, "overlap_ahead") > 0
    assert llm.generate([follow], [greedy(8)])[0].token_ids == want
    assert llm.core.receipts.of("request.finish")[-1]["cached"] > 0  # the first's KV was reused


def test_a_request_whose_next_token_is_its_last_is_not_planned_for(tiny_model_dir):
    """Lengths known in advance (EOS ignored): nothing planned is ever dropped."""
    prompts, params = workload(2)
    llm = engine(tiny_model_dir, True)
    llm.generate(prompts, params)
    assert summed(llm, "overlap_ahead") > 0
    assert summed(llm, "overlap_dropped") == 0


class Stepped:
    """A workload's requests added to an overlapping engine, stepped by hand; what each got so
    far, and what an engine planning each step after its forward answers them."""

    def __init__(self, model: str, seed: int, n: int) -> None:
        prompts, params = workload(seed, n)
        self.want = [o.token_ids for o in engine(model, False).generate(prompts, params)]
        self.llm = engine(model, True)
        self.sched = self.llm.core.scheduler
        for i, (p, sp) in enumerate(zip(prompts, params)):
            self.sched.add_request(p, sp, rid=f"q{i}")
        self.tokens: dict[str, list[int]] = {f"q{i}": [] for i in range(n)}

    def step(self, times: int | None = None) -> None:
        """``times`` steps; None: until nothing is left."""
        done = 0
        while self.sched.has_work() and (times is None or done < times):
            for out in self.llm.core.step():
                self.tokens[out.rid] += out.new_token_ids
            done += 1

    def got(self, rid: str) -> list[int]:
        return self.tokens[rid]


def test_an_abort_between_steps_gives_back_what_was_planned_for_it(tiny_model_dir):
    run = Stepped(tiny_model_dir, 3, 6)
    run.step(3)
    victim = next(r for r in run.sched.running if r.ahead)
    run.sched.abort(victim.rid)
    run.step()
    run.sched.check()
    assert summed(run.llm, "overlap_dropped") >= 1
    for i, want in enumerate(run.want):
        if f"q{i}" != victim.rid:
            assert run.got(f"q{i}") == want


def test_unplan_gives_back_every_planned_position(tiny_model_dir):
    """What a cutover does before it changes the pool: the step planned ahead let go, every
    planned position given back; the engine then plans anew and answers the same."""
    run = Stepped(tiny_model_dir, 4, 8)
    run.step(4)
    sched = run.sched
    held = {r.rid: r.kv_len - r.ahead for r in sched.running}
    assert any(r.ahead for r in sched.running)
    sched.unplan()
    assert all(r.ahead == 0 for r in sched.running)
    assert {r.rid: r.kv_len for r in sched.running} == held
    sched.check()
    run.step()
    assert [run.got(f"q{i}") for i in range(len(run.want))] == run.want


@pytest.mark.parametrize(
    ("extra", "words"),
    [({"speculative": "suffix"}, "--speculative on"), ({"tp": 2}, "more than one rank")],
)
def test_overlap_is_refused_where_a_step_cannot_be_planned_ahead(extra, words):
    with pytest.raises(ValueError, match=words):
        EngineConfig.from_kwargs(overlap_schedule=True, **({"speculative": "off"} | extra))
