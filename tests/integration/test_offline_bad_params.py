"""Offline callers get the HTTP layer's checks too: a parameter the scheduler cannot honour is a
ValueError at add time naming it, never a crash of the step that would lose every request."""

from __future__ import annotations

import pytest

from engine import LLM, SamplingParams


@pytest.fixture(scope="module")
def llm(tiny_model_dir):
    llm = LLM(model=tiny_model_dir, kv_tokens=256, check_invariants=True)
    yield llm
    llm.close()


def test_a_stop_token_id_outside_the_vocabulary_is_refused_naming_it(llm):
    bad = SamplingParams(max_tokens=4, min_tokens=1, stop_token_ids=[99_999_999])
    with pytest.raises(ValueError, match="stop_token_ids"):
        llm.generate([[5, 6, 7]], bad)
    # the engine still serves, with nothing held
    out = llm.generate([[5, 6, 7]], SamplingParams(max_tokens=3, temperature=0))
    assert len(out[0].token_ids) == 3
