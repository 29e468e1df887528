"""`engine bench --table` without an engine: the method's arithmetic, the table's medians, ratios
and text, the spec's validation, and the message when llama.cpp's environment is missing."""

from __future__ import annotations

import importlib.util
import sys

import pytest

from measure.llamacpp import NO_AMX, PIN, check_env
from measure.method import Prompts, decode_rate, prefill_rate
from measure.peer_worker import MissingEnv
from measure.table import (
    ArmFigures,
    TableSpec,
    format_report,
    format_table,
    parse_counts,
    ratio_rows,
)


class Clock:
    """An engine whose generate takes ``prefill`` s per prompt token of the batch plus ``step``
    s per new token; records what it was given."""

    def __init__(self, prefill: float, step: float) -> None:
        self.prefill, self.step, self.calls = prefill, step, []

    def __call__(self, prompts: list[list[int]], new: int) -> float:
        self.calls.append((prompts, new))
        return self.prefill * sum(map(len, prompts)) + self.step * new


def test_decode_rate_takes_the_prefill_and_first_token_out():
    go = Clock(prefill=0.001, step=0.05)  # 16 streams x 128 tokens: 2.048 s of prefill
    decode, e2e = decode_rate(go, Prompts(49152), n=16, length=128, new=64)
    assert decode == pytest.approx(16 * 64 / (64 * 0.05))  # t(65) - t(1) = 64 steps
    assert e2e == pytest.approx(16 * 65 / (2.048 + 65 * 0.05))
    assert [new for _, new in go.calls] == [1, 65]
    assert all(len(p) == 16 and {len(x) for x in p} == {128} for p, _ in go.calls)


def test_prefill_rate_is_one_prompt_over_its_first_token():
    go = Clock(prefill=0.002, step=0.01)
    assert prefill_rate(go, Prompts(49152), 512) == pytest.approx(512 / (512 * 0.002 + 0.01))
    assert [(len(p), len(p[0]), new) for p, new in go.calls] == [(1, 512, 1)]


def test_prompts_never_repeat_a_first_token_and_the_same_seed_gives_the_same_prompts():
    a, b = Prompts(49152, seed=3), Prompts(49152, seed=3)
    taken = a.take(64, 128) + a.take(1, 512) + a.take(16, 128)
    assert len({p[0] for p in taken}) == len(taken)
    assert all(3 <= t < 49152 for p in taken for t in p)
    assert b.take(64, 128) + b.take(1, 512) + b.take(16, 128) == taken


def test_prompts_say_when_the_fresh_first_tokens_run_out():
    p = Prompts(8)  # a test model's vocabulary: firsts 3..7
    p.take(5, 4)
    with pytest.raises(ValueError, match="no fresh first token left in a vocabulary of 8"):
        p.take(1, 4)


@pytest.mark.parametrize("text", ["1,x", "", "0,16", "16,16", "1;16", "-1"])
def test_bad_streams_are_refused_naming_the_value(text):
    with pytest.raises(ValueError) as e:
        parse_counts(text, "--streams")
    assert f"--streams {text!r}" in str(e.value)


def test_spec_from_text_checks_every_list_and_number():
    s = TableSpec.from_text("1,16,64", "attest,llamacpp", "exact,int8", prefill=0)
    assert (s.streams, s.engines, s.attest, s.prefill) == (
        [1, 16, 64],
        ["attest", "llamacpp"],
        ["exact", "int8"],
        0,
    )
    with pytest.raises(ValueError, match=r"--engines 'attest,sglang'.*'sglang' is not one"):
        TableSpec.from_text("1", "attest,sglang", "exact")
    with pytest.raises(ValueError, match=r"--attest 'fp8'.*exact, bf16, int8, int4"):
        TableSpec.from_text("1", "attest", "fp8")
    with pytest.raises(ValueError, match=r"--runs must be an integer >= 1, got 0"):
        TableSpec.from_text("1", "attest", "exact", runs=0)
    with pytest.raises(ValueError, match=r"--prompt-len must be an integer >= 2, got 1"):
        TableSpec.from_text("1", "attest", "exact", prompt_len=1)


def test_kv_pool_holds_the_largest_batch_or_the_prefill():
    assert TableSpec(streams=[1, 64]).kv_tokens() == 64 * (128 + 64 + 8) + 64
    assert TableSpec(streams=[1], prefill=4096).kv_tokens() == 4096 + 8 + 64


def _arms() -> list[ArmFigures]:
    attest = ArmFigures(
        "attest exact",
        "attest",
        {1: [(50, 40), (60, 42), (55, 41)], 16: [(400, 200), (300, 190), (350, 210)]},
        [900, 1000, 1100],
    )
    hf = ArmFigures(
        "transformers", "transformers", {1: [(20, 10)] * 3, 16: [(100, 50)] * 3}, [500, 500, 500]
    )
    ll = ArmFigures(
        "llama.cpp", "llamacpp", {1: [(110, 55)] * 3, 16: [(350, 105)] * 3}, [250, 250, 250]
    )
    return [attest, hf, ll]


def test_medians_per_column_and_ratios_of_each_attest_arm_over_each_baseline():
    arms = _arms()
    assert arms[0].medians([1, 16]) == [55, 41, 350, 200, 1000]
    rows = dict(ratio_rows([arms], [1, 16]))
    assert list(rows) == ["attest exact / transformers", "attest exact / llama.cpp"]
    assert rows["attest exact / transformers"] == pytest.approx([2.75, 4.1, 3.5, 4.0, 2.0])
    assert rows["attest exact / llama.cpp"] == pytest.approx([0.5, 41 / 55, 1.0, 200 / 105, 4.0])


def test_the_table_text():
    spec = TableSpec(streams=[1, 16], prefill=512)
    assert format_table([_arms()], spec).splitlines() == [
        "| arm | decode 1 | e2e 1 | decode 16 | e2e 16 | prefill 512 |",
        "|---|---:|---:|---:|---:|---:|",
        "| attest exact | 55.0 | 41.0 | 350.0 | 200.0 | 1000.0 |",
        "| transformers | 20.0 | 10.0 | 100.0 | 50.0 | 500.0 |",
        "| llama.cpp | 110.0 | 55.0 | 350.0 | 105.0 | 250.0 |",
        "| attest exact / transformers | 2.75x | 4.10x | 3.50x | 4.00x | 2.00x |",
        "| attest exact / llama.cpp | 0.50x | 0.75x | 1.00x | 1.90x | 4.00x |",
    ]


def test_a_column_an_arm_did_not_measure_is_a_dash_and_has_no_ratio():
    spec = TableSpec(streams=[1], prefill=0)
    arms = [
        ArmFigures("attest int4", "attest", {1: [(80, 60)]}),
        ArmFigures("transformers", "transformers", {}),
    ]
    assert format_table([arms], spec).splitlines()[2:] == [
        "| attest int4 | 80.0 | 60.0 | - |",
        "| transformers | - | - | - |",
        "| attest int4 / transformers | - | - | - |",
    ]


def test_the_report_states_the_method_the_conditions_and_every_run():
    spec = TableSpec(streams=[1, 16], runs=3)
    text = format_report([_arms()], spec, ["cpu: AMD EPYC, 2 cores; flags: avx2", "threads 2"])
    assert "decode N = N x 64 / (t(65 tokens) - t(1 token))" in text
    assert "cached_tokens == 0" in text and "median of 3 runs" in text
    assert "cpu: AMD EPYC, 2 cores; flags: avx2\nthreads 2" in text
    assert "  attest exact, 16 streams: decode [400, 300, 350], e2e [200, 190, 210]" in text
    assert "  llama.cpp, prefill: [250, 250, 250]" in text


def test_a_missing_llamacpp_env_says_how_to_create_it(tmp_path):
    env = tmp_path / "llamacpp-venv"
    with pytest.raises(MissingEnv) as e:
        check_env(env)
    msg = str(e.value)
    assert f"{env} is missing (no {env}/bin/python)" in msg
    assert f"engine bench --table --install-llamacpp --llamacpp-env {env}" in msg
    # by hand as `install` does it: llama.cpp compiled without its AMX kernels
    flags = f"-DCMAKE_C_FLAGS='{NO_AMX}' -DCMAKE_CXX_FLAGS='{NO_AMX}'"
    assert f'python3 -m venv {env} && CMAKE_ARGS="{flags}" {env}/bin/pip install {PIN}' in msg
    assert "--engines attest,transformers" in msg


@pytest.mark.skipif(importlib.util.find_spec("llama_cpp") is not None, reason="llama_cpp is here")
def test_an_env_without_llama_cpp_is_missing_too(tmp_path):
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "python").symlink_to(sys.executable)  # this interpreter has no llama_cpp
    with pytest.raises(MissingEnv, match=r"cannot import llama_cpp \(.*No module named"):
        check_env(tmp_path)


class Jittery:
    """A clock whose first ``bad`` pairs time the longer generate shorter (a machine busier
    during the one-token run than during the full one), then keeps ``Clock``'s times."""

    def __init__(self, bad: int) -> None:
        self.bad, self.clock, self.calls = bad, Clock(prefill=0.001, step=0.01), 0

    def __call__(self, prompts: list[list[int]], new: int) -> float:
        self.calls += 1
        t = self.clock(prompts, new)
        if new == 1 and self.bad > 0:
            self.bad -= 1
            return t + 10.0  # the one-token run stalled
        return t


def test_a_decode_time_the_noise_swallowed_is_timed_again_never_a_negative_rate():
    go = Jittery(bad=1)
    decode, _ = decode_rate(go, Prompts(49152), n=4, length=16, new=8)
    assert decode == pytest.approx(4 * 8 / (8 * 0.01)) and go.calls == 4  # the pair again
    with pytest.raises(ValueError, match=r"took no longer than .* 3 times"):
        decode_rate(Jittery(bad=3), Prompts(49152), n=4, length=16, new=8)


def test_with_rounds_a_ratio_is_the_median_of_each_rounds_ratio_not_of_the_pooled_medians():
    # the machine twice as fast in round 2 for both arms: the rounds say 2x, 2x and 3x, the
    # pooled medians (ours 200, 400, 400, 300: 350; theirs 100, 200, 200, 100: 150) 2.33x
    def arm(name: str, engine: str, rates: list[float]) -> ArmFigures:
        return ArmFigures(name, engine, {16: [(x, x / 2) for x in rates]}, [x * 10 for x in rates])

    rounds = [
        [arm("attest bf16", "attest", [200]), arm("vLLM bf16", "vllm", [100])],
        [arm("attest bf16", "attest", [400, 400]), arm("vLLM bf16", "vllm", [200, 200])],
        [arm("attest bf16", "attest", [300]), arm("vLLM bf16", "vllm", [100])],
    ]
    spec = TableSpec(streams=[16], rounds=3, runs=1)
    assert dict(ratio_rows(rounds, [16]))["attest bf16 / vLLM bf16"] == pytest.approx(
        [2.0, 2.0, 2.0]
    )
    table = format_table(rounds, spec).splitlines()
    assert table[2] == "| attest bf16 | 350.0 | 175.0 | 3500.0 |"  # every round's runs pooled
    assert table[3] == "| vLLM bf16 | 150.0 | 75.0 | 1500.0 |"
    assert table[4] == "| attest bf16 / vLLM bf16 | 2.00x | 2.00x | 2.00x |"
    text = format_report(rounds, spec, [])
    assert "median of 3 runs (1 in each of 3 rounds)" in text
    assert "  round 2:\n  attest bf16, 16 streams: decode [400, 400], e2e [200.0, 200.0]" in text
    assert "  attest bf16 / vLLM bf16, decode 16: 2.00, 2.00, 3.00" in text


def test_rounds_below_one_are_refused():
    with pytest.raises(ValueError, match=r"--rounds must be an integer >= 1, got 0"):
        TableSpec.from_text("1", "attest", "exact", rounds=0)
