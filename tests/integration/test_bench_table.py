"""`engine bench` end to end on the tiny model: the table's Attest and transformers arms run one
after the other through the shared method (every Attest request asserted uncached), and the
offline mode still times its arms."""

from __future__ import annotations

import json
import shutil

import pytest

from measure import run_offline, three_way
from measure.table import TableSpec, format_report
from measure.three_way import run_table
from tests.conftest import requires_transformers


@pytest.fixture(autouse=True)
def steady_clock(monkeypatch):
    """Each arm's generates run for real, their outputs checked as ever, but are timed by a
    steady clock (a tick per token per stream): these tests are of which arms run, in what order,
    on what prompts, and a busy machine's noise must not fail them (a tiny model's 4 tokens can
    take no longer than its 1 while the other core is loaded)."""

    def steady(make):
        def made(*args, **kwargs):
            go = make(*args, **kwargs)

            def timed(ids: list[list[int]], new: int) -> float:
                go(ids, new)
                return 1e-3 * len(ids) * (len(ids[0]) / 64 + new)

            return timed

        return made

    for name in ("attest_generate", "transformers_generate"):
        monkeypatch.setattr(three_way, name, steady(getattr(three_way, name)))


@pytest.fixture
def tiny_hf_dir(tiny_model_dir, tmp_path):
    """The tiny model, its config.json naming its model_type as transformers requires."""
    folder = shutil.copytree(tiny_model_dir, tmp_path / "tiny")
    cfg = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps(cfg | {"model_type": "llama"}))
    return str(folder)


@requires_transformers
def test_the_table_measures_each_arm_on_the_same_prompts(tiny_hf_dir):
    spec = TableSpec(
        streams=[1, 3],
        prompt_len=8,
        output_len=4,
        prefill=16,
        runs=2,
        engines=["attest", "transformers"],
        attest=["exact", "bf16"],
        model=tiny_hf_dir,
    )
    said: list[str] = []
    run = run_table(spec, said.append)
    assert [(a.name, a.engine) for a in run.arms] == [
        ("attest exact", "attest"),
        ("attest bf16", "attest"),
        ("transformers", "transformers"),
    ]
    for arm in run.arms:
        assert sorted(arm.decode) == [1, 3]
        assert all(
            len(runs) == 2 and all(e2e > 0 for _, e2e in runs) for runs in arm.decode.values()
        )
        assert len(arm.prefill) == 2 and min(arm.prefill) > 0
    assert any(
        line.startswith("attest exact: loading LLM(dtype='float32', speculative='off')")
        for line in said
    )
    text = format_report(run.rounds, spec, run.notes)
    assert "| attest bf16 / transformers |" in text and "llama.cpp" not in text
    assert "load average before" in text and "flags:" in text


def test_offline_mode_times_receipts_on_and_off(tiny_model_dir):
    res = run_offline(
        tiny_model_dir, num_prompts=2, prompt_len=8, output_len=4, runs=1, baseline=False
    )
    assert [r.name for r in res] == ["attest (receipts on, boot log)", "attest (receipts off)"]
    assert all(r.output_tokens == 8 and r.tok_s > 0 for r in res)


def test_rounds_run_every_arm_again_in_a_rotated_order(tiny_model_dir):
    spec = TableSpec(
        streams=[2],
        prompt_len=8,
        output_len=3,
        prefill=0,
        runs=1,
        rounds=2,
        engines=["attest"],
        attest=["exact", "bf16"],
        model=tiny_model_dir,
    )
    said: list[str] = []
    run = run_table(spec, said.append)
    order = [s.split(":")[0] for s in said if ": loading" in s or s.startswith("round")]
    assert order == [
        "round 1 of 2",
        "attest exact",
        "attest bf16",
        "round 2 of 2",
        "attest bf16",
        "attest exact",
    ]
    assert [[a.name for a in arms] for arms in run.rounds] == [["attest exact", "attest bf16"]] * 2
    assert [len(a.decode[2]) for a in run.arms] == [2, 2]  # both rounds' runs, per arm
    assert sum("attest bf16: LLM(" in n for n in run.notes) == 1  # one note an arm
    (exact,) = [n for n in run.notes if n.startswith("attest exact: LLM(")]
    assert "products by rows measured at load, layers: mm [" in exact, exact  # what it chose
