"""`engine bench --table` refuses a bad value before it loads anything (exit 2, the value named),
and a missing llama.cpp environment before any arm runs (exit 2, how to create it)."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from cli.engine_app import app


def bench(*args: str):
    return CliRunner().invoke(app, ["bench", "--table", *args])


@pytest.mark.parametrize(
    ("args", "named"),
    [
        (["--streams", "1,x"], "--streams '1,x'"),
        (["--streams", "16,0"], "--streams '16,0'"),
        (["--engines", "attest,sglang"], "'sglang' is not one"),
        (["--vllm", "f32,fp8"], "'fp8' is not one"),
        (["--vllm-kv-gib", "0"], "--vllm-kv-gib must be an integer >= 1, got 0"),
        (["--attest", "exact,fp8"], "'fp8' is not one"),
        (["--runs", "0"], "--runs must be an integer >= 1, got 0"),
        (["--prefill", "-1"], "--prefill must be an integer >= 0, got -1"),
        (["--tp", "2"], "--tp 2 is for --offline"),
    ],
)
def test_a_bad_value_exits_2_naming_it(args, named):
    r = bench(*args)
    assert r.exit_code == 2, r.output
    assert named in r.output and "Traceback" not in r.output


def test_a_missing_llamacpp_env_exits_2_saying_how_to_create_it(tmp_path):
    env = tmp_path / "venv"
    r = bench("--engines", "attest,llamacpp", "--llamacpp-env", str(env))
    assert r.exit_code == 2, r.output
    assert f"llama.cpp's environment {env} is missing" in r.output
    assert "--install-llamacpp" in r.output


def test_an_attest_arm_whose_option_the_engine_lacks_is_refused_before_any_arm(monkeypatch):
    from measure import table, three_way

    monkeypatch.setitem(table.ATTEST_ARMS, "future", {"no_such_option": 1})
    spec = table.TableSpec(
        engines=["attest", "llamacpp"], attest=["exact", "future"], llamacpp_env="/nonexistent"
    )
    with pytest.raises(ValueError, match=r"--attest future: LLM\(no_such_option=1\): unknown"):
        three_way.run_table(spec, say=pytest.fail)


def test_a_missing_vllm_env_exits_2_saying_how_to_create_it(tmp_path):
    env = tmp_path / "venv"
    r = bench("--engines", "attest,vllm", "--vllm-env", str(env))
    assert r.exit_code == 2, r.output
    assert f"vLLM's environment {env} is missing" in r.output
    assert "--install-vllm" in r.output
