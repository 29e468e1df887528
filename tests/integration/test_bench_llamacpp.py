"""llama.cpp's arm for real, where its environment exists (build/llamacpp-venv; `engine bench
--install-llamacpp` creates it): the worker generates exactly what it is asked, every stream on
its own sequence, the KV cache emptied between generates, and the method measures it."""

from __future__ import annotations

import pytest

from measure.llamacpp import LlamaCppWorker, check_env
from measure.method import Prompts
from measure.peer_worker import MissingEnv
from measure.table import TableSpec
from measure.three_way import measure
from tests.conftest import requires_default_model

ENV = "build/llamacpp-venv"

pytestmark = [pytest.mark.slow, requires_default_model]


@pytest.fixture(scope="module")
def worker():
    try:
        check_env(ENV)
    except MissingEnv as e:
        pytest.skip(str(e))
    from engine.model.loader import default_model_path

    with LlamaCppWorker(ENV, default_model_path(), threads=2) as w:
        yield w


def test_each_stream_is_its_own_sequence_and_each_generate_starts_empty(worker):
    a, b, c = Prompts(worker.info["vocab"]).take(3, 24)
    worker.generate([a], 8)
    alone = worker.tokens[0]
    worker.generate([b, a, c], 8)  # a in the middle, at sequence 1
    assert worker.tokens[1][:4] == alone[:4]
    worker.generate([b, a, c], 8)  # positions from 0 again: nothing left from the last one
    again = worker.tokens
    worker.generate([b, a, c], 8)
    assert worker.tokens == again
    assert all(0 <= t < worker.info["vocab"] for s in again for t in s)


def test_the_method_measures_the_arm(worker):
    spec = TableSpec(streams=[1, 4], prompt_len=32, output_len=8, prefill=64, runs=1)
    fig = measure("llama.cpp", "llamacpp", worker.generate, worker.info["vocab"], spec, print)
    assert sorted(fig.decode) == [1, 4] and all(e2e > 0 for ((_, e2e),) in fig.decode.values())
    assert fig.prefill and fig.prefill[0] > 0
    assert worker.threads == 2 and "kv_unified off" in worker.info["kv"]
