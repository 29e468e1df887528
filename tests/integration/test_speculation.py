"""Speculative decoding (prompt lookup, ``speculative="ngram"``) changes nothing but timing: the
same greedy tokens as one token a step, from a roomy pool and from a tight one where pressure
retracts and drafts are cut (``spec.cut``); the ledger checked after every step (a rejected
draft's KV must go back the same step); drafts only for requests whose next token is the argmax.

The prompts repeat a short random segment, so prompt lookup finds something to propose, which the
tiny random model seldom agrees with; an oracle proposer (each request's reference output, some
drafts spoiled) makes most drafts kept."""

from __future__ import annotations

import random
from collections import Counter

import pytest

from engine import LLM, SamplingParams
from engine.request.guide import Guide
from engine.speculative.pace import MAX_BATCH
from tests.integration.test_pressure import three_at_once


def repetitive(vocab: int, n: int = 24, seed: int = 0):
    rng = random.Random(seed)
    prompts = []
    for _ in range(n):
        segment = [rng.randrange(2, vocab) for _ in range(rng.randint(3, 12))]
        prompts.append((segment * rng.randint(2, 6))[:120])
    params = [
        SamplingParams(max_tokens=rng.randint(8, 60), temperature=0, ignore_eos=True)
        for _ in prompts
    ]
    return prompts, params


@pytest.fixture(scope="module")
def plain(tiny_model_dir):
    prompts, params = repetitive(320)
    llm = LLM(model=tiny_model_dir, kv_tokens=16384, chunk_tokens=4096, check_invariants=True)
    out = [o.token_ids for o in llm.generate(prompts, params)]
    llm.close()
    return prompts, params, out


def spec_totals(llm) -> tuple[int, int]:
    fin = llm.core.receipts.of("request.finish")
    return (
        sum(r.get("spec_proposed", 0) for r in fin),
        sum(r.get("spec_accepted", 0) for r in fin),
    )


def test_drafts_change_no_token_in_a_roomy_pool(tiny_model_dir, plain):
    prompts, params, expected = plain
    llm = LLM(
        model=tiny_model_dir,
        kv_tokens=16384,
        check_invariants=True,
        speculative="ngram",
        spec_tokens=4,
    )
    llm.core.scheduler.spec.proposer = Oracle(prompts, expected, 320)
    assert [o.token_ids for o in llm.generate(prompts, params)] == expected
    proposed, accepted = spec_totals(llm)
    assert proposed > accepted > 0
    its = llm.core.receipts.of("iteration")
    assert sum(r.get("spec_accepted", 0) for r in its) <= accepted  # since each last receipt
    assert not llm.core.receipts.of("spec.cut")
    spec = llm.core.scheduler.snapshot().spec  # what /metrics reads: the receipts' sums
    assert (spec.draft_tokens, spec.accepted_tokens) == (proposed, accepted)
    assert spec.accepted_per_pos[0] >= spec.accepted_per_pos[-1] and len(spec.accepted_per_pos) == 4
    assert 0 < spec.drafts <= spec.draft_tokens <= 4 * spec.drafts
    llm.close()


@pytest.mark.parametrize("page_size", [1, 4])
def test_under_pressure_drafts_are_cut_never_funded_by_relief_and_change_nothing(
    tiny_model_dir, plain, page_size
):
    """The oracle's drafts (most kept) in a pool of 3/5 of what three requests need at once."""
    prompts, params, expected = plain
    llm = LLM(
        model=tiny_model_dir,
        kv_tokens=three_at_once(prompts, params) * 3 // 5,
        chunk_tokens=32,
        max_running=8,
        page_size=page_size,
        check_invariants=True,
        speculative="ngram",
        spec_tokens=4,
    )
    llm.core.scheduler.spec.proposer = Oracle(prompts, expected, 320)
    assert [o.token_ids for o in llm.generate(prompts, params)] == expected
    kinds = Counter(r["event"] for r in llm.core.receipts.records)
    assert kinds["retract"] > 0 and kinds["spec.cut"] > 0 and kinds["alloc.oom"] == 0, kinds
    for cut in llm.core.receipts.of("spec.cut"):
        assert 0 <= cut["got"] < cut["want"] <= 4
    assert spec_totals(llm)[1] > 0
    llm.close()


GREEDY_KINDS = {
    "logprobs": dict(logprobs=2),
    "penalties": dict(presence_penalty=0.5, frequency_penalty=0.3, repetition_penalty=1.3),
    "bias": dict(logit_bias={7: 3.0, 11: -2.0}),
    # token 7 ends it, and is every row's argmax: banned at each row until the 23rd token
    "min_tokens": dict(min_tokens=23, stop_token_ids=[7], logit_bias={7: 30.0}, ignore_eos=False),
    "json": dict(guide=Guide("json_object"), ignore_eos=False),
}


class Oracle:
    """Proposes each request's own reference output (what it writes without speculation), its
    third draft wrong on every other step: most drafts are kept, some refused."""

    def __init__(self, prompts: list[list[int]], outputs: list[list[int]], vocab: int) -> None:
        self.want = {tuple(p): o for p, o in zip(prompts, outputs)}
        self.vocab = vocab

    def propose(self, req, k: int) -> list[int]:
        done = len(req.output_ids)
        drafts = list(self.want[tuple(req.prompt_ids)][done : done + k])
        if len(drafts) > 2 and done % 2:
            drafts[2] = (drafts[2] + 1) % self.vocab
        return drafts

    def finished(self, req) -> None:
        pass


@pytest.mark.parametrize("kind", list(GREEDY_KINDS))
def test_greedy_requests_of_every_kind_are_drafted_and_keep_their_tokens(
    tiny_model_dir, plain, kind
):
    """Bias and penalties counted over the drafts before each row, stop tokens banned up to
    min_tokens at each row, the grammar walked over the drafts: the same tokens and logprobs,
    with drafts that are mostly right (an oracle) and from prompt lookup."""
    prompts = plain[0][:8]
    params = [
        SamplingParams(
            **({"max_tokens": 40, "temperature": 0, "ignore_eos": True} | GREEDY_KINDS[kind])
        )
        for _ in prompts
    ]
    ref = LLM(model=tiny_model_dir, kv_tokens=16384, check_invariants=True)
    want = [(o.token_ids, o.logprobs) for o in ref.generate(prompts, params)]
    ref.close()
    for proposer in ("oracle", "ngram"):
        llm = LLM(model=tiny_model_dir, kv_tokens=16384, check_invariants=True, speculative="ngram")
        if proposer == "oracle":
            llm.core.scheduler.spec.proposer = Oracle(prompts, [w for w, _ in want], 320)
        got = [(o.token_ids, o.logprobs) for o in llm.generate(prompts, params)]
        for (tokens, logprobs), (want_tokens, want_logprobs) in zip(got, want):
            assert tokens == want_tokens, proposer
            if kind == "logprobs":
                assert [t for t, _, _ in logprobs] == [t for t, _, _ in want_logprobs]
                for (_, lp, top), (_, want_lp, want_top) in zip(logprobs, want_logprobs):
                    assert lp == pytest.approx(want_lp, abs=1e-4)
                    assert [t for t, _ in top] == [t for t, _ in want_top]
        proposed, accepted = spec_totals(llm)
        if proposer == "oracle":
            assert proposed > accepted > proposed // 2, (proposed, accepted)
        llm.close()


def test_a_request_that_stops_inside_its_drafts_ends_where_it_would_have(tiny_model_dir, plain):
    prompts, params, expected = plain
    # each request stops at a token from the middle of its plain output
    stops = [
        SamplingParams(max_tokens=p.max_tokens, temperature=0, stop_token_ids=[out[len(out) // 2]])
        for p, out in zip(params, expected)
    ]
    ref = LLM(model=tiny_model_dir, kv_tokens=16384, check_invariants=True)
    want = [(o.token_ids, o.text) for o in ref.generate(prompts, stops)]
    ref.close()
    llm = LLM(model=tiny_model_dir, kv_tokens=16384, check_invariants=True, speculative="ngram")
    assert [(o.token_ids, o.text) for o in llm.generate(prompts, stops)] == want
    llm.close()


class Wrong(Oracle):
    """Proposes a token after the reference's at every position: every draft is refused."""

    def propose(self, req, k: int) -> list[int]:
        done = len(req.output_ids)
        return [(t + 1) % self.vocab for t in self.want[tuple(req.prompt_ids)][done : done + k]]


def test_a_request_whose_drafts_do_not_pay_steps_aside_and_tries_again(tiny_model_dir, plain):
    prompts, _, expected = plain
    params = SamplingParams(max_tokens=60, temperature=0, ignore_eos=True)
    ref = LLM(model=tiny_model_dir, kv_tokens=16384)
    [want] = [o.token_ids for o in ref.generate(prompts[:1], params)]
    ref.close()
    llm = LLM(model=tiny_model_dir, kv_tokens=16384, check_invariants=True, speculative="ngram")
    llm.core.scheduler.spec.proposer = Wrong(prompts[:1], [want], 320)
    [out] = llm.generate(prompts[:1], params)
    assert out.token_ids == want
    seen = [
        (r["event"], r["scope"])
        for r in llm.core.receipts.records
        if r["event"] in ("spec.off", "spec.on")
    ]
    assert seen[:3] == [("spec.off", "request"), ("spec.on", "request"), ("spec.off", "request")]
    offs = llm.core.receipts.of("spec.off")
    assert offs[1]["steps"] == 2 * offs[0]["steps"]  # off again: a longer pause
    proposed, accepted = spec_totals(llm)
    assert accepted == 0 and proposed < 4 * 60 // 3  # most of its steps drafted nothing
    llm.close()


def test_a_batch_too_wide_drafts_for_none_until_it_narrows(tiny_model_dir, plain):
    prompts, params, expected = plain
    llm = LLM(
        model=tiny_model_dir,
        kv_tokens=16384,
        max_running=24,
        check_invariants=True,
        speculative="ngram",
    )
    assert [o.token_ids for o in llm.generate(prompts, params)] == expected
    seen = [
        (r["event"], r.get("decoding"))
        for r in llm.core.receipts.records
        if r["event"] in ("spec.off", "spec.on")
    ]
    assert seen[0][0] == "spec.off" and seen[0][1] > MAX_BATCH
    assert any(kind == "spec.on" and n <= MAX_BATCH for kind, n in seen[1:])
    assert spec_totals(llm)[0] > 0
    llm.close()


def test_suffix_proposes_what_an_earlier_request_wrote(tiny_model_dir):
    """A prompt with nothing repeated: prompt lookup has little to offer; asked again, the
    suffix proposer finds the first answer among recent outputs and most of it is kept."""
    prompt = random.Random(7).sample(range(2, 320), 40)
    params = SamplingParams(max_tokens=40, temperature=0, ignore_eos=True)
    llm = LLM(
        model=tiny_model_dir,
        kv_tokens=16384,
        check_invariants=True,
        speculative="suffix",
        iteration_receipt_interval=1,
    )
    [first] = llm.generate([prompt], params)
    [again] = llm.generate([prompt], params)
    assert again.token_ids == first.token_ids
    fin = llm.core.receipts.of("request.finish")
    assert fin[1]["spec_accepted"] >= 25 > fin[0].get("spec_accepted", 0) + 10
    held = [r["spec_recent_tokens"] for r in llm.core.receipts.of("iteration")]
    assert held[-1] == 80 and max(held) == 80  # both outputs, in tokens
    llm.close()


def drafted_forwards(llm) -> list[int]:
    """The tokens of each forward that verifies drafts (logits asked at every position), as
    the engine runs them from now on."""
    sizes: list[int] = []
    forward = llm.core.runner.forward

    def counted(batch, **kw):
        if kw.get("every"):  # None unless some entry wants every position's logits
            sizes.append(sum(len(e.token_ids) for e in batch))
        return forward(batch, **kw)

    llm.core.runner.forward = counted
    return sizes


def test_fast_mode_drafts_stay_within_the_packed_kernels_rows_and_change_no_token(
    tiny_model_dir,
):
    """Fast mode computes a product of up to ``small_rows`` rows with the packed kernel and a
    wider one dequantised, which rounds differently: a step with drafts carries at most
    ``small_rows`` rows (cut with ``spec.cut`` rows), so each drafted position is computed as
    the one-token step it saves and greedy tokens are fast mode's own, one request at a time
    and two at once."""
    prompts, params = repetitive(320, n=6, seed=3)
    kw = dict(model=tiny_model_dir, kv_tokens=16384, quant="int8", check_invariants=True)
    ref = LLM(**kw)
    small = ref.core.runner.model.quant.small_rows
    want = [ref.generate([p], [s])[0].token_ids for p, s in zip(prompts, params)]
    pair = [o.token_ids for o in ref.generate(prompts[:2], params[:2])]
    ref.close()
    llm = LLM(**kw, speculative="ngram", spec_tokens=6)
    llm.core.scheduler.spec.proposer = Oracle(prompts, want, 320)
    widest = drafted_forwards(llm)
    got = [llm.generate([p], [s])[0].token_ids for p, s in zip(prompts, params)]
    assert got == want
    assert [o.token_ids for o in llm.generate(prompts[:2], params[:2])] == pair
    assert spec_totals(llm)[1] > 0
    if small:  # a CPU with bfloat16 units: the packed kernel runs, and bounds the steps
        assert max(widest) == small, widest
        cuts = llm.core.receipts.of("spec.cut")
        assert cuts and all(c["got"] <= c["rows"] < c["want"] for c in cuts)
    llm.close()


def test_a_seeded_sampled_request_is_never_drafted_so_its_answer_holds_under_pressure(
    tiny_model_dir, plain
):
    """A seed promises the same answer under any load; drafts change which draws a request
    takes, and the pool funds fewer under pressure. So a request that samples with its own seed
    is not drafted for (an unseeded sampled one is), and its answer is the same from a roomy
    pool and from a tight one, with speculation on in both."""
    prompts = plain[0][:12]
    seeded = [
        SamplingParams(max_tokens=40, temperature=1.0, seed=i, ignore_eos=True)
        for i in range(len(prompts))
    ]
    kw = dict(speculative="ngram", spec_tokens=4)
    roomy = LLM(model=tiny_model_dir, kv_tokens=16384, check_invariants=True, **kw)
    roomy.core.scheduler.spec.proposer = Oracle(prompts, plain[2][:12], 320)
    want = [o.token_ids for o in roomy.generate(prompts, seeded)]
    assert spec_totals(roomy) == (0, 0)
    offs = [r for r in roomy.core.receipts.of("spec.off") if r.get("reason") == "seed"]
    assert len(offs) == len({r["rid"] for r in offs}) == len(prompts)  # once each, receipted
    unseeded = [SamplingParams(max_tokens=40, temperature=1.0, ignore_eos=True)] * len(prompts)
    roomy.generate(prompts, unseeded)
    assert spec_totals(roomy)[0] > 0  # the same requests without a seed are drafted for
    roomy.close()
    tight = LLM(
        model=tiny_model_dir,
        kv_tokens=three_at_once(prompts, seeded),
        chunk_tokens=32,
        max_running=8,
        check_invariants=True,
        **kw,
    )
    tight.core.scheduler.spec.proposer = Oracle(prompts, plain[2][:12], 320)
    assert [o.token_ids for o in tight.generate(prompts, seeded)] == want
    assert tight.core.receipts.of("retract")
    tight.close()


def test_drafts_stay_within_the_step_budget(tiny_model_dir, plain):
    """The step budget bounds a forward's tokens; drafts come out of what the decodes and the
    chunks leave of it (cut with ``spec.cut`` rows), never on top."""
    prompts, params, expected = plain
    llm = LLM(
        model=tiny_model_dir,
        kv_tokens=16384,
        step_tokens=12,
        max_running=6,
        check_invariants=True,
        speculative="ngram",
        spec_tokens=4,
    )
    llm.core.scheduler.spec.proposer = Oracle(prompts, expected, 320)
    drafted = drafted_forwards(llm)
    assert [o.token_ids for o in llm.generate(prompts, params)] == expected
    assert drafted and max(drafted) <= 12, drafted
    assert any(c.get("rows") is not None for c in llm.core.receipts.of("spec.cut"))
    llm.close()
