"""`--attention-backend auto`: on CUDA it picks only a backend that bench/gpu_check.py has
verified on a GPU (none yet), else the torch reference, and says why; the device is injected,
so no GPU is needed to test the choice."""

from __future__ import annotations

from pathlib import Path

import pytest

from kernels import select
from kernels.select import choose_backend

ROOT = Path(__file__).resolve().parents[2]


def runs_anywhere(name: str, device: object, dtype: object) -> str | None:
    return None  # every backend installed and runnable: only verification decides


def test_auto_on_cuda_picks_the_reference_until_a_gpu_check_passed():
    choice = choose_backend("auto", "cuda", verified=(), runs=runs_anywhere)
    assert choice.name == "torch"
    assert "bench/gpu_check.py" in choice.note and "--attention-backend" in choice.note


def test_auto_on_cuda_picks_the_fastest_verified_backend_that_runs():
    both = ("triton", "flashinfer")
    assert choose_backend("auto", "cuda:1", verified=both, runs=runs_anywhere).name == "flashinfer"
    assert choose_backend("auto", "cuda", verified=("triton",), runs=runs_anywhere).name == "triton"

    def no_flashinfer(name, device, dtype):
        return "not installed" if name == "flashinfer" else None

    choice = choose_backend("auto", "cuda", verified=both, runs=no_flashinfer)
    assert choice.name == "triton" and choice.note is None


def test_auto_on_cpu_is_the_reference_without_a_note():
    assert choose_backend("auto", "cpu", verified=(), runs=runs_anywhere) == ("torch", None)


@pytest.mark.parametrize("name", ["torch", "triton", "flashinfer"])
def test_a_named_backend_is_taken_as_asked_one_flag_away(name):
    assert choose_backend(name, "cuda", verified=(), runs=runs_anywhere) == (name, None)


def test_nothing_is_verified_while_benchmarks_record_no_gpu_check():
    text = (ROOT / "BENCHMARKS.md").read_text()
    if "not yet run on a GPU" in text:
        assert select.GPU_VERIFIED == ()
