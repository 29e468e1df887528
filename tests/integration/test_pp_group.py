"""Pipeline stages on a six-layer tiny model (gloo on loopback): each stage holds a run of the
layers and their KV, a batch crosses the stages in micro-batches, and the last stage's logits
come back to every rank. Greedy tokens at pp 2, pp 3 and tp 2 x pp 2, under pressure (parks,
retractions, chunked prompts, drafts), are those of one rank with a pool that never runs
short; the ranks agree on every batch."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from audit.inputs import expand_logs
from audit.spec import resolve
from audit.verdict import evaluate
from engine.llm import LLM
from engine.model.sampling import SamplingParams
from tests.conftest import requires_default_model

PRESSURE = dict(page_size=4, chunk_tokens=32, relief_ladder=False, check_invariants=True)
GREEDY = SamplingParams(max_tokens=40, temperature=0, ignore_eos=True)


def prompts(n: int = 12, length: int = 100) -> list[list[int]]:
    return [[(5 + i * 7 + j) % 300 + 2 for j in range(length + 13 * (i % 5))] for i in range(n)]


def read(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.fixture(scope="module")
def reference(six_layers) -> list[list[int]]:
    """One rank, a pool that never runs short: the tokens every layout must produce."""
    llm = LLM(six_layers, kv_tokens=16384)
    out = [o.token_ids for o in llm.generate(prompts(), GREEDY)]
    llm.close()
    return out


@pytest.mark.parametrize(("tp", "pp"), [(1, 2), (1, 3), (2, 2)])
def test_stages_under_pressure_give_one_ranks_tokens(six_layers, tmp_path, reference, tp, pp):
    """Uneven pools (rank 0 the larger): the floor binds, as law 2 says across stages too."""
    log = tmp_path / "boot.log"
    world = tp * pp
    # a group timeout far above any step here: a stage that waits on one that never sends
    # fails the group within it instead of hanging the test
    llm = LLM(
        six_layers,
        tp=tp,
        pp=pp,
        kv_tokens=[900] + [700] * (world - 1),
        log_file=str(log),
        group_check_interval=1,
        group_timeout=120,
        **PRESSURE,
    )
    out = llm.generate(prompts(), GREEDY)
    llm.close()
    assert [o.token_ids for o in out] == reference
    ranks = [read(log)] + [read(tmp_path / f"boot.rank{r}.log") for r in range(1, world)]
    spans = {}
    for r, rank in enumerate(ranks):
        (weights,) = [x for x in rank if x["event"] == "boot.weights"]
        assert weights["stage"] == r // tp
        spans[weights["stage"]] = tuple(weights["layers"])
        kinds = Counter(x["event"] for x in rank)
        assert kinds["admission.park"] > 0 and kinds["retract"] > 0, kinds
    # the stages hold every layer once, in order; each its share
    assert [spans[s] for s in range(pp)] == [(s * 6 // pp, (s + 1) * 6 // pp) for s in range(pp)]
    # rank 0's larger pool is bound by the others' through the published floor
    assert [x for x in ranks[0] if x["event"] == "group.floor"]
    digests = [[(x["iter"], x["digest"]) for x in rank if "digest" in x] for rank in ranks]
    assert digests[0] and all(d == digests[0] for d in digests)
    report = evaluate([resolve("group_agreement")], expand_logs([str(tmp_path)]))
    assert {c.status.value for c in report.specs[0].claims} == {"PASS"}


def test_more_stages_than_layers_is_refused_before_any_rank_starts(tiny_model_dir):
    with pytest.raises(ValueError, match=r"pp 3 must be between 1 and the model's 2 layers"):
        LLM(str(tiny_model_dir), pp=3, kv_tokens=1024)


@pytest.mark.slow
@requires_default_model
def test_the_default_model_in_stages_gives_one_ranks_tokens():
    """The default model (30 layers) at pp 2 and pp 3, exact mode, against pp 1: the same
    greedy tokens on prompts of different lengths in one batch."""
    texts = ["The capital of France is", "def fibonacci(n):", "Once upon a time, in a land"]
    params = SamplingParams(max_tokens=16, temperature=0, ignore_eos=True)
    want = None
    for pp in (1, 2, 3):
        llm = LLM(None, pp=pp, kv_tokens=4096, speculative="off", group_timeout=300)
        got = [o.token_ids for o in llm.generate(texts, params)]
        llm.close()
        want = want or got
        assert got == want, f"pp {pp}"
