"""A named attention backend that cannot run here stops `engine` with the reason, exit 2."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest


def run(*args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    return subprocess.run(
        [sys.executable, "-m", "cli.engine_app", *args],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )


@pytest.mark.parametrize(
    ("backend", "reason"),
    [
        ("flashinfer", "attention backend 'flashinfer' needs a CUDA device"),
        ("triton", "set TRITON_INTERPRET=1"),
        ("cudnn", "attention backend 'cudnn' is not available; choose one of"),
    ],
)
def test_generate_names_why_a_backend_cannot_run(tiny_model_dir, backend, reason):
    r = run("generate", "hi", "--model", tiny_model_dir, "--attention-backend", backend)
    assert r.returncode == 2, r.stderr
    assert reason in r.stderr and "Traceback" not in r.stderr


def test_serve_names_why_a_backend_cannot_run(tiny_model_dir, tmp_path):
    r = run(
        "serve",
        "--model",
        tiny_model_dir,
        "--attention-backend",
        "flashinfer",
        "--kv-tokens",
        "256",
        "--port",
        "0",
        "--log-file",
        str(tmp_path / "boot.jsonl"),
    )
    assert r.returncode == 2, r.stderr
    assert "attention backend 'flashinfer' needs a CUDA device" in r.stderr
