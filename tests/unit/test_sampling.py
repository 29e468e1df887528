"""SamplingParams validation, the filtered distribution, and the sampler's seeds."""

from __future__ import annotations

import math
import re

import pytest
import torch
from hypothesis import example, given, settings
from hypothesis import strategies as st

from engine.model.sampling import SamplingParams, filtered_probs, make_generator, sample
from engine.request.sampling_params import SEED_MAX, SEED_MIN

# A hand-made distribution; logits are its logs, in fp32 as the engine hands them over.
PROBS = [0.5, 0.3, 0.15, 0.05]


def logits_of(probs: list[float]) -> torch.Tensor:
    return torch.tensor(probs, dtype=torch.float32).log()


def kept(probs: torch.Tensor) -> list[int]:
    return sorted(torch.nonzero(probs > 0).flatten().tolist())


# -- SamplingParams validation ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "field", "rule"),
    [
        ({"max_tokens": 0}, "max_tokens", "an integer >= 1"),
        ({"max_tokens": -1}, "max_tokens", "an integer >= 1"),
        ({"max_tokens": 1.5}, "max_tokens", "an integer >= 1"),
        ({"max_tokens": True}, "max_tokens", "an integer >= 1"),
        ({"temperature": -0.1}, "temperature", "a number >= 0"),
        ({"temperature": float("nan")}, "temperature", "a number >= 0"),
        ({"top_p": 0}, "top_p", "in (0, 1]"),
        ({"top_p": 1.1}, "top_p", "in (0, 1]"),
        ({"top_k": -2}, "top_k", "-1, 0 (off) or an integer >= 1"),
        ({"min_p": -0.1}, "min_p", "in [0, 1]"),
        ({"min_p": 1.5}, "min_p", "in [0, 1]"),
        ({"seed": "x"}, "seed", "an integer or None"),
        ({"seed": True}, "seed", "an integer or None"),
        ({"seed": 2**63}, "seed", "a signed 64-bit integer, in [-2**63, 2**63 - 1]"),
        ({"seed": -(2**63) - 1}, "seed", "a signed 64-bit integer, in [-2**63, 2**63 - 1]"),
        ({"stop": ""}, "stop", "a non-empty string or a list of non-empty strings"),
        ({"stop": [""]}, "stop", "a non-empty string or a list of non-empty strings"),
        ({"stop": [1]}, "stop", "a non-empty string or a list of non-empty strings"),
        ({"max_tokens": 4, "min_tokens": 5}, "min_tokens", "an integer in [0, max_tokens=4]"),
        ({"min_tokens": -1}, "min_tokens", "an integer in [0, max_tokens=16]"),
        ({"stop_token_ids": [-1]}, "stop_token_ids", "a list of token ids"),
        ({"ignore_eos": 1}, "ignore_eos", "a boolean"),
    ],
)
def test_invalid_params_name_the_field_and_the_allowed_range(kwargs, field, rule):
    with pytest.raises(ValueError, match="^" + re.escape(f"{field} must be {rule}, got ")):
        SamplingParams(**kwargs)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"max_tokens": 1},
        {"temperature": 0},
        {"temperature": 0.0},
        {"temperature": 1e-30},
        {"top_p": 1},
        {"top_p": 1e-6},
        {"top_k": -1},
        {"top_k": 0},
        {"top_k": 1},
        {"min_p": 0},
        {"min_p": 1},
        {"seed": 0},
        {"seed": -3},
        {"seed": 2**63 - 1},
        {"seed": -(2**63)},
        {"stop": "x"},
        {"stop": ["a", "bc"]},
        {"stop": []},
        {"stop_token_ids": [0, 7]},
        {"max_tokens": 3, "min_tokens": 3},
    ],
)
def test_valid_edge_values_are_accepted(kwargs):
    p = SamplingParams(**kwargs)
    for name, value in kwargs.items():
        assert getattr(p, name) == value


def test_validate_rechecks_after_mutation():
    p = SamplingParams()
    p.top_p = 2.0
    with pytest.raises(ValueError, match="^top_p must be"):
        p.validate()


def test_stop_strings_normalizes_to_a_list():
    assert SamplingParams().stop_strings == []
    assert SamplingParams(stop="END").stop_strings == ["END"]
    assert SamplingParams(stop=["a", "b"]).stop_strings == ["a", "b"]


# -- filtered_probs ---------------------------------------------------------------------------


@pytest.mark.parametrize("k", [1, 2, 5, 19])
def test_top_k_keeps_exactly_the_k_largest(k):
    g = torch.Generator().manual_seed(k)
    row = torch.randn(20, generator=g)  # distinct values: no ties
    probs = filtered_probs(row, SamplingParams(top_k=k))
    assert kept(probs) == sorted(torch.topk(row, k).indices.tolist())
    # among the kept tokens the proportions are the softmax's
    want = torch.softmax(row[probs > 0], dim=-1)
    torch.testing.assert_close(probs[probs > 0], want)


@pytest.mark.parametrize("k", [-1, 0, 4, 50])
def test_top_k_off_or_at_least_vocab_keeps_everything(k):
    probs = filtered_probs(logits_of(PROBS), SamplingParams(top_k=k))
    torch.testing.assert_close(probs, torch.tensor(PROBS))


@pytest.mark.parametrize(
    ("top_p", "n_kept"),
    [(0.3, 1), (0.5, 1), (0.51, 2), (0.8, 2), (0.81, 3), (0.94, 3), (0.96, 4), (1.0, 4)]
    # a valid top_p too small for fp32 rounds to 0 there: the top token must still stay
    + [(1e-46, 1), (5e-324, 1)],
)
def test_top_p_keeps_the_smallest_prefix_reaching_top_p(top_p, n_kept):
    probs = filtered_probs(logits_of(PROBS), SamplingParams(top_p=top_p))
    assert kept(probs) == list(range(n_kept))
    head = torch.tensor(PROBS[:n_kept])
    torch.testing.assert_close(probs[:n_kept], head / head.sum())


def test_top_p_works_on_unsorted_rows():
    order = [2, 0, 3, 1]  # PROBS permuted
    probs = filtered_probs(logits_of([PROBS[i] for i in order]), SamplingParams(top_p=0.8))
    # 0.5 and 0.3 sit at positions 1 and 3 now
    assert kept(probs) == [1, 3]


@pytest.mark.parametrize(("min_p", "n_kept"), [(0.05, 4), (0.2, 3), (0.35, 2), (0.7, 1), (1.0, 1)])
def test_min_p_drops_tokens_below_min_p_times_max(min_p, n_kept):
    probs = filtered_probs(logits_of(PROBS), SamplingParams(min_p=min_p))
    assert kept(probs) == list(range(n_kept))
    assert float(probs.sum()) == pytest.approx(1.0, abs=1e-6)


def test_temperature_scales_logits():
    row = torch.tensor([0.3, -1.2, 2.0, 0.0])
    for t in (0.25, 1.0, 3.0):
        probs = filtered_probs(row, SamplingParams(temperature=t))
        torch.testing.assert_close(probs, torch.softmax(row / t, dim=-1))


@pytest.mark.parametrize("t", [1e-37, 1e-45, 1e-300])
def test_tiny_temperature_gives_the_argmax_not_nan(t):
    # 100 / 1e-37 overflows fp32 and 1e-45 rounds towards 0: neither may turn into NaN
    row = torch.tensor([100.0, 2.0, 99.0, -5.0])
    probs = filtered_probs(row, SamplingParams(temperature=t))
    assert torch.isfinite(probs).all()
    assert probs.tolist() == [1.0, 0.0, 0.0, 0.0]
    gen = make_generator(0)
    assert sample(row[None], [SamplingParams(temperature=t)], [gen]) == [0]


def test_filters_combine_and_sum_to_one():
    g = torch.Generator().manual_seed(3)
    row = torch.randn(64, generator=g) * 2
    p = SamplingParams(temperature=0.7, top_k=20, top_p=0.9, min_p=0.05)
    probs = filtered_probs(row, p)
    assert float(probs.sum()) == pytest.approx(1.0, abs=1e-6)
    support = set(kept(probs))
    assert support <= set(torch.topk(row, 20).indices.tolist())
    assert int(row.argmax()) in support


@settings(max_examples=200, deadline=None)
@given(
    logits=st.lists(
        st.floats(min_value=-50, max_value=50, allow_nan=False, width=32), min_size=1, max_size=48
    ),
    temperature=st.floats(min_value=0, max_value=10, exclude_min=True),
    top_p=st.floats(min_value=0, max_value=1, exclude_min=True),
    top_k=st.one_of(st.sampled_from([-1, 0]), st.integers(min_value=1, max_value=60)),
    min_p=st.floats(min_value=0, max_value=1),
)
# a tie made by the shift: 1.3e-40 - 1 is -1 in float32, so logits 0 and 1.3e-40 are one value to
# the top-k filter (both stay as the k-th), though they differ as logits
@example(logits=[0.0, 1.0, 1.3307430866460625e-40], temperature=1.0, top_p=1.0, top_k=2, min_p=0.0)
def test_filtered_probs_is_a_distribution_containing_the_argmax(
    logits, temperature, top_p, top_k, min_p
):
    row = torch.tensor(logits, dtype=torch.float32)
    p = SamplingParams(temperature=temperature, top_p=top_p, top_k=top_k, min_p=min_p)
    probs = filtered_probs(row, p)
    assert probs.shape == row.shape
    assert torch.isfinite(probs).all()
    assert (probs >= 0).all()
    assert float(probs.sum()) == pytest.approx(1.0, abs=1e-5)
    # the most likely token survives every filter; among exact ties (in probability, after the
    # temperature) any one of them may be the survivor
    base = filtered_probs(row, SamplingParams(temperature=temperature))
    assert float(base[probs > 0].max()) == float(base.max())
    if int((base == base.max()).sum()) == 1:
        assert float(probs[int(row.argmax())]) > 0
    if top_k >= 1:
        # ties at the k-th value may all stay, so count the distinct kept values, as the filter
        # sees them: shifted so the largest is 0, then divided by the temperature (in float32,
        # two logits can become one value there)
        seen = (row - row.max()) / max(temperature, torch.finfo(row.dtype).tiny)
        assert len(set(seen[probs > 0].tolist())) <= top_k


# -- sample -----------------------------------------------------------------------------------


def test_temperature_zero_is_argmax_whatever_the_other_knobs():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(5, 100, generator=g)
    params = [
        SamplingParams(temperature=0),
        SamplingParams(temperature=0, top_k=3, seed=1),
        SamplingParams(temperature=0, top_p=0.1, min_p=0.5),
        SamplingParams(temperature=0, seed=7),
        SamplingParams(temperature=0.0),
    ]
    gens = [make_generator(p.seed) for p in params]
    for _ in range(3):
        assert sample(logits, params, gens) == logits.argmax(dim=-1).tolist()


def test_make_generator_is_none_without_a_seed():
    assert make_generator(None) is None
    a, b = make_generator(5), make_generator(5)
    assert torch.equal(torch.rand(8, generator=a), torch.rand(8, generator=b))


def _draws(seed: int) -> list[float]:
    return torch.rand(8, generator=make_generator(seed)).tolist()


@pytest.mark.parametrize(
    ("a", "b"),
    [(1, 1 + 2**32), (1, 1 - 2**63), (-1, 2**63 - 1), (0, 2**32), (-(2**63), 0), (2**40, 2**41)],
)
def test_distinct_seeds_in_the_range_draw_distinct_numbers(a, b):
    """torch's CPU generator (mt19937) seeds itself from a seed's low 32 bits: seeds that differ
    only above them drew the same numbers, so s and s + 2**32 (and s - 2**63) were one seed."""
    assert _draws(a) != _draws(b)


@settings(max_examples=200, deadline=None)
@given(st.integers(SEED_MIN, SEED_MAX), st.integers(SEED_MIN, SEED_MAX), st.booleans())
def test_any_two_seeds_in_the_range_draw_alike_exactly_when_equal(a, other, same_low_half):
    low = 2**32 - 1
    b = (other & ~low) | (a & low) if same_low_half else other  # still in the range
    assert (_draws(a) == _draws(b)) == (a == b)


def test_a_seed_below_2_to_the_32_draws_what_torch_seeded_with_it_draws():
    """Those seeds keep the numbers they drew before wider seeds were told apart."""
    for seed in (0, 7, 2**32 - 1):
        assert _draws(seed) == torch.rand(8, generator=torch.Generator().manual_seed(seed)).tolist()


def _draw_alone(row: torch.Tensor, p: SamplingParams, steps: int) -> list[int]:
    gen = make_generator(p.seed)
    return [sample(row[None], [p], [gen])[0] for _ in range(steps)]


def test_a_seeded_request_draws_the_same_tokens_in_any_batch():
    g = torch.Generator().manual_seed(1)
    logits = torch.randn(5, 40, generator=g)
    params = [
        SamplingParams(temperature=1.0, seed=11),
        SamplingParams(temperature=0.8),  # unseeded: shares the global generator
        SamplingParams(temperature=1.2, top_k=10, seed=22),
        SamplingParams(temperature=0),  # greedy: draws nothing
        SamplingParams(temperature=1.0, top_p=0.9, seed=11),  # same seed, other filter
    ]
    steps = 60
    alone = {i: _draw_alone(logits[i], params[i], steps) for i in (0, 2, 4)}

    # full batch, then a batch in another order with some rows left out
    for order in ([0, 1, 2, 3, 4], [4, 3, 1, 0, 2], [2, 1, 0]):
        gens = {i: make_generator(params[i].seed) for i in order}
        drawn: dict[int, list[int]] = {i: [] for i in order}
        for _ in range(steps):
            toks = sample(logits[order], [params[i] for i in order], [gens[i] for i in order])
            for i, t in zip(order, toks):
                drawn[i].append(t)
        for i in order:
            if i in alone:
                assert drawn[i] == alone[i], f"row {i} in batch {order}"
    assert alone[0] != alone[2]


def test_different_seeds_draw_different_sequences():
    row = torch.zeros(50)  # uniform over 50 tokens
    a = _draw_alone(row, SamplingParams(seed=1), 200)
    b = _draw_alone(row, SamplingParams(seed=2), 200)
    again = _draw_alone(row, SamplingParams(seed=1), 200)
    assert a == again
    assert a != b
    assert sum(x == y for x, y in zip(a, b)) < 30  # about 200/50 = 4 coincidences expected
    assert len(set(a)) > 30  # it is not stuck on a few tokens


@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(temperature=1.0, seed=123),
        SamplingParams(temperature=0.7, top_k=4, seed=5),
        SamplingParams(temperature=1.3, top_p=0.8, seed=9),
        SamplingParams(temperature=1.0, min_p=0.1, seed=77),
    ],
)
def test_draw_frequencies_match_filtered_probs(params):
    row = torch.tensor([2.0, 1.5, 1.0, 0.5, 0.0, -0.5, -1.0, -3.0])
    want = filtered_probs(row, params)
    n = 4000
    draws = _draw_alone(row, params, n)
    counts = torch.bincount(torch.tensor(draws), minlength=row.numel()).double()
    support = want > 0
    assert counts[~support].sum() == 0, "a filtered-out token was drawn"
    expected = want[support].double() * n
    chi2 = float(((counts[support] - expected) ** 2 / expected).sum())
    dof = int(support.sum()) - 1
    # mean dof, sd sqrt(2 dof): 5 sd above covers every honest seed; a wrong filter is far off
    assert chi2 < dof + 5 * math.sqrt(2 * max(dof, 1)), (chi2, counts.tolist(), want.tolist())


def test_the_rows_sampled_are_the_logits_themselves_when_they_are_all_of_them_in_order():
    """A step's rows to sample (``rows_of``): every row in order is the logits tensor itself, no
    copy, where it is contiguous; any other choice is those rows, in that order, as indexing by
    the list gives them; and what is sampled is contiguous (the masks are written in place)."""
    from engine.model.sampling import rows_of

    logits = torch.randn(6, 50)
    assert rows_of(logits, list(range(6))) is logits
    for rows in ([0, 1, 2], [5, 0, 3], [2], [0, 1, 2, 3, 4, 5, 5], []):
        got = rows_of(logits, rows)
        assert torch.equal(got, logits[rows]) and got.shape == (len(rows), 50), rows
    strided = torch.randn(50, 6).t()  # the LM head's (W @ x.T).T, or a padded vocabulary cut
    for rows in (list(range(6)), [1, 4]):
        got = rows_of(strided, rows)
        assert got.is_contiguous() and torch.equal(got, strided[rows]), rows


def test_greedy_takes_the_first_of_equal_maxima_in_any_layout():
    """Greedy rows pick what ``argmax`` picks (transformers' greedy): the first of equal maxima,
    a row of -inf its first token, a NaN where one is, in a contiguous or a strided batch."""
    g = torch.Generator().manual_seed(3)
    for layout in ("rows", "columns"):
        x = torch.randint(-3, 3, (9, 300), generator=g).float()  # many ties
        x[x == -3] = float("-inf")
        x[2] = float("-inf")
        x[4, 7] = float("nan")
        if layout == "columns":
            x = x.t().contiguous().t()
        params = [SamplingParams(temperature=0.0)] * 9
        assert sample(x, params, [None] * 9) == x.argmax(dim=-1).tolist(), layout
