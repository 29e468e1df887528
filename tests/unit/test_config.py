"""EngineConfig: every bad field is named; unknown options are listed."""

from __future__ import annotations

import dataclasses
import re

import pytest
import torch

from engine.config import EngineConfig
from engine.core.engine_core import DTYPES


@pytest.mark.parametrize(
    ("field", "value", "rule"),
    [
        ("model", 5, "a path or None"),
        ("dtype", "float16", "one of ('float32', 'bfloat16')"),
        ("dtype", torch.float32, "one of ('float32', 'bfloat16')"),
        ("kv_tokens", 0, "None or an integer >= 1"),
        ("kv_tokens", -8, "None or an integer >= 1"),
        ("kv_tokens", 1.5, "None or an integer >= 1"),
        ("kv_tokens", True, "None or an integer >= 1"),
        ("kv_tokens", "64", "None or an integer >= 1"),
        ("kv_memory_fraction", 0, "in (0, 0.9]"),
        ("kv_memory_fraction", 0.95, "in (0, 0.9]"),
        ("page_size", 0, "an integer >= 1"),
        ("log_file", 3, "a path or None"),
        ("max_running", 0, "an integer >= 1"),
        ("max_running", None, "an integer >= 1"),
        ("chunk_tokens", 0, "an integer >= 1"),
        ("chunk_tokens", 2.0, "an integer >= 1"),
        ("max_model_len", 0, "None or an integer >= 1"),
        ("max_model_len", "4k", "None or an integer >= 1"),
        ("attention_backend", 3, "a backend name"),
        ("threads", 0, "None or an integer >= 1"),
        ("threads", False, "None or an integer >= 1"),
        ("seed", "x", "an integer"),
        ("seed", 1.5, "an integer"),
        ("seed", None, "an integer"),
        ("host_kv_tokens", -1, "None or an integer >= 0"),
        ("host_kv_tokens", False, "None or an integer >= 0"),
        ("host_kv_tokens", 8.0, "None or an integer >= 0"),
        ("kv_store_dir", "", "a path or None"),
        ("kv_store_bytes", 0, "None or an integer >= 1"),
        ("kv_store_pin_bytes", -1, "None or an integer >= 0"),
        ("kv_store_write", "through", "back or second_hit"),
        ("relief_ladder", "on", "a boolean"),
        ("relief_throttle_iterations", 0, "an integer >= 1"),
        ("read_timeout", 0, "a number of seconds > 0"),
        ("read_timeout", float("inf"), "a number of seconds > 0"),
        ("max_client_connections", -1, "an integer >= 0 (0: no cap)"),
        ("request_timeout", 0, "None or a number of seconds > 0"),
        ("cutover_timeout", 0, "a number of seconds > 0"),
        ("cutover_timeout", True, "a number of seconds > 0"),
        ("grammar_timeout", 0, "a number of seconds > 0"),
        ("scheduling_policy", "lifo", "fcfs or priority"),
        ("speculative", "eagle", "off or ngram or suffix"),
        ("spec_tokens", 0, "an integer in [1, 16]"),
        ("spec_tokens", 17, "an integer in [1, 16]"),
        ("spec_tokens", True, "an integer in [1, 16]"),
        ("device", "gpu", "cpu, cuda or cuda:N"),
        ("device", None, "cpu, cuda or cuda:N"),
    ],
)
def test_bad_field_is_rejected_naming_it(field, value, rule):
    with pytest.raises(ValueError, match="^" + re.escape(f"{field} must be {rule}, got {value!r}")):
        EngineConfig.from_kwargs(**{field: value})


def test_defaults_and_good_values_are_accepted():
    c = EngineConfig()
    assert c.model.dtype == "float32" and DTYPES[c.model.dtype] is torch.float32
    c = EngineConfig.from_kwargs(
        model="m.gguf",
        dtype="bfloat16",
        kv_tokens=1,
        max_running=1,
        chunk_tokens=1,
        max_model_len=1,
        threads=1,
        seed=-7,
    )
    assert DTYPES[c.model.dtype] is torch.bfloat16
    assert c.as_dict() == {
        "model": "m.gguf",
        "dtype": "bfloat16",
        "quant": None,
        "kv_tokens": 1,
        "kv_memory_fraction": 0.2,
        "page_size": 1,
        "max_running": 1,
        "chunk_tokens": 1,
        "step_tokens": None,
        "max_model_len": 1,
        "attention_backend": "auto",
        "threads": 1,
        "enforce_eager": False,
        "cuda_graph_max_batch": None,
        "seed": -7,
        "prefix_cache": True,
        "host_kv_tokens": None,
        "kv_store_dir": None,
        "kv_store_bytes": None,
        "kv_store_pin_bytes": None,
        "kv_store_write": "second_hit",
        "relief_ladder": True,
        "relief_throttle_iterations": 8,
        "iteration_receipt_interval": 50,
        "check_invariants": False,
        "cutover_timeout": 600.0,
        "scheduling_policy": "fcfs",
        "speculative": "suffix",
        "spec_tokens": 4,
        "overlap_schedule": False,
        "grammar_timeout": 10.0,
        "grammar_workers": 2,
        "grammar_waiting": 8,
        "receipts": True,
        "log_file": None,
        "console_receipts": False,
        "device": "cpu",
        "otlp_endpoint": None,
        "read_timeout": 30.0,
        "max_client_connections": 128,
        "request_timeout": 600.0,
        "check_timeout": 10.0,
        "enable_per_request_metrics": False,
        "max_stored_responses": 1000,
        "loop_stall_timeout": 2.0,
        "allowed_hosts": (),
        "allowed_origins": (),
        "tp": 1,
        "pp": 1,
        "dist_init": "spawn",
        "group_timeout": 30.0,
        "group_check_interval": 16,
        "published_floor": True,
        "phase_policy": "off",
        "phase_enter_pp": 2048,
        "phase_exit_pp": 256,
        "phase_dwell": 32,
        "phase_interval": 8,
    }


def test_a_changed_copy_is_checked_again():
    c = EngineConfig()
    with pytest.raises(ValueError, match="^chunk_tokens must be"):
        dataclasses.replace(c.scheduler, chunk_tokens=0)
    with pytest.raises(ValueError, match="^kv_tokens must be given off the CPU"):
        dataclasses.replace(c, model=dataclasses.replace(c.model, device="cuda"))


def test_from_kwargs_lists_unknown_options():
    with pytest.raises(TypeError) as e:
        EngineConfig.from_kwargs(kv_tokens=16, kv_tokns=16, batch=4)
    msg = str(e.value)
    assert msg.startswith("unknown engine option(s) ['batch', 'kv_tokns']")
    assert "known:" in msg and "'kv_tokens'" in msg
