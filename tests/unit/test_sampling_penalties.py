"""Logit bias, presence and frequency penalties: applied by the sampler, over the tokens the
request generated, and nothing changes for a request that sets none of them."""

from __future__ import annotations

import re

import pytest
import torch

from engine.model.sampling import SamplingParams, adjust_logits, sample, sample_for

GREEDY = {"temperature": 0}


def test_logit_bias_moves_the_greedy_choice():
    logits = torch.tensor([[3.0, 2.0, 1.0, 0.0]])
    assert sample(logits, [SamplingParams(**GREEDY)], [None]) == [0]
    biased = SamplingParams(**GREEDY, logit_bias={2: 5.0})
    assert sample(logits, [biased], [None]) == [2]
    banned = SamplingParams(**GREEDY, logit_bias={0: -100.0})
    assert sample(logits, [banned], [None]) == [1]
    assert logits.tolist() == [[3.0, 2.0, 1.0, 0.0]]  # the caller's logits are left alone


def test_penalties_subtract_count_times_frequency_plus_presence():
    row = torch.zeros(5)
    p = SamplingParams(presence_penalty=0.5, frequency_penalty=0.25)
    adjust_logits(row, p, [1, 1, 1, 3])
    assert row.tolist() == [0.0, -(3 * 0.25 + 0.5), 0.0, -(0.25 + 0.5), 0.0]


def test_a_negative_penalty_favours_what_was_generated():
    row = torch.zeros(3)
    adjust_logits(row, SamplingParams(presence_penalty=-1.0), [2])
    assert row.tolist() == [0.0, 0.0, 1.0]


def test_a_repeating_greedy_request_changes_course_under_a_frequency_penalty():
    class Req:
        def __init__(self, params):
            self.params, self.generator, self.output_ids, self.prompt_ids = params, None, [], []

    logits = torch.tensor([[2.0, 1.5, 0.0]])
    plain, penalised = (
        Req(SamplingParams(**GREEDY)),
        Req(SamplingParams(**GREEDY, frequency_penalty=1.0)),
    )
    for _ in range(3):
        for r in (plain, penalised):
            r.output_ids += sample_for(logits, [r])
    assert plain.output_ids == [0, 0, 0]
    assert penalised.output_ids == [0, 1, 0]  # 2-1 < 1.5, then 1.5-1 < 2-1


def test_ids_outside_the_row_are_skipped_not_raised():
    row = torch.zeros(3)
    adjust_logits(row, SamplingParams(logit_bias={7: 1.0}, presence_penalty=1.0), [9, 1])
    assert row.tolist() == [0.0, -1.0, 0.0]


def test_rows_without_adjustments_sample_exactly_as_before():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(4, 50, generator=g)
    plain = [SamplingParams(**GREEDY), SamplingParams(temperature=0.8, seed=3)]
    history = [[1, 2, 3], [4, 4]]
    gens = [None, torch.Generator().manual_seed(3)]
    before = sample(logits[:2], plain, gens)
    gens = [None, torch.Generator().manual_seed(3)]
    assert sample(logits[:2], plain, gens, history) == before
    assert before[0] == logits[0].argmax().item()


@pytest.mark.parametrize(
    ("kwargs", "field", "rule"),
    [
        ({"presence_penalty": 2.5}, "presence_penalty", "a number in [-2, 2]"),
        ({"frequency_penalty": -2.01}, "frequency_penalty", "a number in [-2, 2]"),
        ({"frequency_penalty": float("nan")}, "frequency_penalty", "a number in [-2, 2]"),
        ({"logit_bias": {5: 101}}, "logit_bias", "a map of token ids to numbers in [-100, 100]"),
        ({"logit_bias": {-1: 1}}, "logit_bias", "a map of token ids to numbers in [-100, 100]"),
        ({"logit_bias": {"5": 1}}, "logit_bias", "a map of token ids to numbers in [-100, 100]"),
        ({"seed": 2**64 - 1}, "seed", "a signed 64-bit integer, in [-2**63, 2**63 - 1]"),
        ({"seed": -(2**63) - 1}, "seed", "a signed 64-bit integer, in [-2**63, 2**63 - 1]"),
    ],
)
def test_out_of_range_adjustments_and_seeds_name_the_field(kwargs, field, rule):
    with pytest.raises(ValueError, match="^" + re.escape(f"{field} must be {rule}, got ")):
        SamplingParams(**kwargs)


def test_edge_values_are_accepted():
    SamplingParams(presence_penalty=-2, frequency_penalty=2, logit_bias={0: -100, 9: 100})
    SamplingParams(seed=2**63 - 1)
    SamplingParams(seed=-(2**63))


def test_repetition_penalty_divides_positive_and_multiplies_negative_logits_of_seen_tokens():
    """vLLM's (and the CTRL paper's) repetition penalty: every token of the prompt or the output
    so far has its logit divided by the penalty where positive, multiplied where negative; the
    rest are left alone. 1 changes nothing."""
    row = torch.tensor([4.0, -2.0, 3.0, -1.0, 2.0])
    adjust_logits(row, SamplingParams(repetition_penalty=2.0), [1], prompt=[0, 0, 9])
    assert row.tolist() == [2.0, -4.0, 3.0, -1.0, 2.0]
    row = torch.tensor([4.0, -2.0])
    adjust_logits(row, SamplingParams(repetition_penalty=0.5), [0, 1])  # below 1: favoured
    assert row.tolist() == [8.0, -1.0]
    assert not SamplingParams(repetition_penalty=1.0).adjusts_logits


def test_repetition_penalty_counts_the_prompt_too():
    class Req:
        def __init__(self, params):
            self.params, self.generator, self.output_ids = params, None, []
            self.prompt_ids = [0]

    logits = torch.tensor([[2.0, 1.5, 0.0], [2.0, 1.5, 0.0]])
    plain, penalised = (
        Req(SamplingParams(**GREEDY)),
        Req(SamplingParams(**GREEDY, repetition_penalty=1.5)),
    )
    assert sample_for(logits, [plain, penalised]) == [0, 1]  # 2 / 1.5 < 1.5: the prompt's token


@pytest.mark.parametrize("bad", [0.0, -1.0, 1e-300, 101.0, float("inf"), float("nan"), True])
def test_repetition_penalty_is_a_number_in_a_hundredth_to_a_hundred(bad):
    """Not only > 0 (vLLM's rule): a logit divided by 1e-300 is inf in float32, its row's
    softmax NaN, and that row's draw would fail the step of the whole batch."""
    with pytest.raises(ValueError, match="repetition_penalty"):
        SamplingParams(repetition_penalty=bad)
