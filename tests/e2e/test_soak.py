"""The soak (bench/soak.py) against a real `engine serve` on loopback: a short run on the tiny
model in every test run, the ten-minute run on the default model with ``-m soak``."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tests.conftest import requires_default_model

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

from soak import SoakConfig, run_soak  # noqa: E402


def _assert_nothing_lost(res: dict, min_oversubscription: float) -> None:
    assert res["problems"] == []
    assert res["oversubscription"] >= min_oversubscription, res["oversubscription"]
    assert res["served"] > 0 and res["disconnected"] > 0 and res["malformed_4xx"] > 0, res
    aborted = res["abort_reasons"].get("client_disconnect", 0)
    # every hang-up's request ended: aborted client_disconnect, or (a few, whose last tokens
    # were made as the client left) finished; the judge names any other ending
    assert aborted > 0 and aborted + res["finished_despite_hangup"] >= res["disconnected"]
    assert res["audit"]["exit_code"] in (0, 2), res["audit"]


def test_short_soak_loses_nothing(tiny_model_dir, tmp_path):
    cfg = SoakConfig(
        duration_s=20,
        concurrency=24,
        kv_tokens=480,
        max_running=8,
        model=tiny_model_dir,
        prompt_words=(4, 40),
        sample_every_s=2,
    )
    _assert_nothing_lost(run_soak(cfg, tmp_path / "boot.jsonl"), min_oversubscription=5)


@pytest.mark.soak
@requires_default_model
def test_ten_minute_soak_on_the_default_model(tmp_path):
    cfg = SoakConfig(duration_s=600, concurrency=64, kv_tokens=1024, max_running=16)
    _assert_nothing_lost(run_soak(cfg, tmp_path / "boot.jsonl"), min_oversubscription=10)
