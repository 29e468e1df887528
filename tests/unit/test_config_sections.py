"""EngineConfig in sections: each section checks its own fields, the flat names route into
exactly one section, the receipt's flat dict keeps its keys, and the CLI's defaults are the
config's (declared once, in the sections' fields)."""

from __future__ import annotations

import dataclasses
import re

import pytest
import typer.main

from cli.engine_app import app
from engine.config import (
    DEFAULTS,
    SECTION_OF,
    SECTIONS,
    SERVE_STEP_TOKENS,
    EngineConfig,
    GroupSection,
    MemorySection,
    ModelSection,
    ObservabilitySection,
    SchedulerSection,
    ServerSection,
)

# the boot.start receipt's `config` keys, as the auditor and its acceptance cases read them
RECEIPT_KEYS = {
    "model",
    "dtype",
    "quant",
    "kv_tokens",
    "kv_memory_fraction",
    "page_size",
    "max_running",
    "chunk_tokens",
    "step_tokens",
    "max_model_len",
    "attention_backend",
    "enforce_eager",
    "cuda_graph_max_batch",
    "threads",
    "seed",
    "prefix_cache",
    "host_kv_tokens",
    "relief_ladder",
    "relief_throttle_iterations",
    "kv_store_dir",
    "kv_store_bytes",
    "kv_store_pin_bytes",
    "kv_store_write",
    "cutover_timeout",
    "scheduling_policy",
    "grammar_timeout",
    "grammar_workers",
    "grammar_waiting",
    "speculative",
    "spec_tokens",
    "overlap_schedule",
    "iteration_receipt_interval",
    "check_invariants",
    "receipts",
    "log_file",
    "console_receipts",
    "device",
    "otlp_endpoint",
    "read_timeout",
    "max_client_connections",
    "request_timeout",
    "loop_stall_timeout",
    "allowed_hosts",
    "allowed_origins",
    "check_timeout",
    "enable_per_request_metrics",
    "max_stored_responses",
    "tp",
    "pp",
    "dist_init",
    "group_timeout",
    "group_check_interval",
    "published_floor",
    "phase_policy",
    "phase_enter_pp",
    "phase_exit_pp",
    "phase_dwell",
    "phase_interval",
}

# one valid value per flat name, none of them the default (tp 2 lets kv_tokens be per rank)
OTHERS = {
    "model": "m.gguf",
    "dtype": "bfloat16",
    "quant": "int8",
    "kv_tokens": [64, 32, 64, 32, 64, 32],
    "kv_memory_fraction": 0.5,
    "page_size": 4,
    "max_running": 3,
    "chunk_tokens": 7,
    "step_tokens": 8,
    "max_model_len": 99,
    "attention_backend": "torch",
    "enforce_eager": True,
    "cuda_graph_max_batch": 16,
    "threads": 2,
    "seed": 5,
    "prefix_cache": False,
    "host_kv_tokens": 0,
    "relief_ladder": False,
    "kv_store_dir": "store",
    "kv_store_bytes": 1 << 30,
    "kv_store_pin_bytes": 1 << 20,
    "kv_store_write": "back",
    "relief_throttle_iterations": 2,
    "iteration_receipt_interval": 0,
    "check_invariants": True,
    "receipts": False,
    "log_file": "b.jsonl",
    "console_receipts": True,
    "device": "cpu",
    "otlp_endpoint": "http://127.0.0.1:4318",
    "read_timeout": 3.0,
    "max_client_connections": 0,
    "request_timeout": None,
    "loop_stall_timeout": 3.5,
    "tp": 2,
    "pp": 3,
    "dist_init": "env",
    "group_timeout": 4.0,
    "allowed_hosts": ("llm.example", "*"),
    "allowed_origins": ("http://localhost:3000",),
    "group_check_interval": 1,
    "published_floor": False,
    "phase_policy": "auto",
    "phase_enter_pp": 900,
    "phase_exit_pp": 90,
    "phase_dwell": 5,
    "phase_interval": 2,
    "cutover_timeout": 9.0,
    "grammar_timeout": 2.5,
    "grammar_workers": 1,
    "grammar_waiting": 0,
    "check_timeout": 4.0,
    "enable_per_request_metrics": True,
    "max_stored_responses": 7,
    "scheduling_policy": "priority",
    "speculative": "ngram",
    "spec_tokens": 3,
    # True needs one rank and --speculative off (both differ here): that rule has its own test
    "overlap_schedule": False,
}

HOSTS_RULE = "a tuple of '*' or hosts (NAME or NAME:PORT; an IPv6 address in brackets)"
ORIGINS_RULE = "a tuple of '*' or origins (scheme://host[:port], no path)"


@pytest.mark.parametrize(
    ("section", "field", "value", "rule"),
    [
        (ModelSection, "dtype", "float16", "one of ('float32', 'bfloat16')"),
        (ModelSection, "device", "gpu", "cpu, cuda or cuda:N"),
        (ModelSection, "threads", 0, "None or an integer >= 1"),
        (ModelSection, "enforce_eager", "yes", "a boolean"),
        (SchedulerSection, "overlap_schedule", "yes", "a boolean"),
        (ModelSection, "cuda_graph_max_batch", 0, "None or an integer >= 1"),
        (MemorySection, "page_size", 0, "an integer >= 1"),
        (MemorySection, "kv_memory_fraction", 0.95, "in (0, 0.9]"),
        (MemorySection, "relief_throttle_iterations", 0, "an integer >= 1"),
        (SchedulerSection, "chunk_tokens", 2.0, "an integer >= 1"),
        (SchedulerSection, "check_invariants", 1, "a boolean"),
        (ServerSection, "read_timeout", 0, "a number of seconds > 0"),
        (ServerSection, "request_timeout", 0, "None or a number of seconds > 0"),
        (ServerSection, "loop_stall_timeout", 0, "a number of seconds > 0"),
        (ServerSection, "allowed_hosts", ("x@y",), HOSTS_RULE),
        (ServerSection, "allowed_hosts", "localhost", HOSTS_RULE),
        (ServerSection, "allowed_origins", ("http://a/",), ORIGINS_RULE),
        (ServerSection, "check_timeout", 0, "a number of seconds > 0"),
        (ServerSection, "max_stored_responses", 0, "an integer >= 1"),
        (SchedulerSection, "grammar_workers", 0, "an integer >= 1"),
        (SchedulerSection, "grammar_waiting", -1, "an integer >= 0"),
        (GroupSection, "tp", 0, "an integer >= 1"),
        (GroupSection, "pp", 0, "an integer >= 1"),
        (GroupSection, "phase_policy", "always", "off or auto"),
        (GroupSection, "phase_exit_pp", 2048, "an integer >= 0 below phase_enter_pp (2048)"),
        (GroupSection, "phase_dwell", 0, "an integer >= 1"),
        (GroupSection, "dist_init", "ssh", "one of ('spawn', 'env')"),
        (ObservabilitySection, "iteration_receipt_interval", -1, "an integer >= 0"),
        (ObservabilitySection, "log_file", 3, "a path or None"),
    ],
)
def test_a_section_checks_its_own_fields_naming_the_field_and_the_rule(section, field, value, rule):
    with pytest.raises(ValueError, match="^" + re.escape(f"{field} must be {rule}, got {value!r}")):
        section(**{field: value})


def test_flat_names_are_unique_across_sections_and_each_routes_into_its_own():
    names = [f.name for s in SECTIONS.values() for f in dataclasses.fields(s)]
    assert len(names) == len(set(names)) == len(SECTION_OF)
    assert set(SECTION_OF) == set(OTHERS) == RECEIPT_KEYS
    c = EngineConfig.from_kwargs(**OTHERS)
    for name, value in OTHERS.items():
        assert getattr(getattr(c, SECTION_OF[name]), name) == value, name
        others = [s for s in SECTIONS if s != SECTION_OF[name]]
        assert not any(hasattr(getattr(c, s), name) for s in others), name


def test_from_kwargs_refuses_an_unknown_name_listing_the_known_ones():
    with pytest.raises(TypeError) as e:
        EngineConfig.from_kwargs(memory=MemorySection())
    msg = str(e.value)
    assert msg.startswith("unknown engine option(s) ['memory']; known: [")
    assert all(repr(name) in msg for name in RECEIPT_KEYS)


def test_as_dict_is_flat_with_the_receipts_keys_and_values():
    assert set(EngineConfig().as_dict()) == RECEIPT_KEYS
    assert EngineConfig().as_dict() == DEFAULTS
    assert EngineConfig.from_kwargs(**OTHERS).as_dict() == OTHERS


def test_sections_and_the_config_are_frozen_and_a_changed_copy_is_checked_again():
    c = EngineConfig()
    with pytest.raises(dataclasses.FrozenInstanceError):
        c.scheduler.chunk_tokens = 0  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        c.memory = MemorySection()  # type: ignore[misc]
    with pytest.raises(ValueError, match="^chunk_tokens must be an integer >= 1, got 0"):
        dataclasses.replace(c.scheduler, chunk_tokens=0)


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        (
            {"tp": 2, "kv_tokens": [8]},
            "kv_tokens must be None or an integer >= 1, or one integer >= 1 per rank (2), got [8]",
        ),
        ({"kv_tokens": [8, 8]}, "kv_tokens must be None or an integer >= 1, got [8, 8]"),
        (
            {"tp": 2, "pp": 2, "kv_tokens": [8, 8]},
            "kv_tokens must be None or an integer >= 1, "
            "or one integer >= 1 per rank (4), got [8, 8]",
        ),
        (
            {"pp": 2, "host_kv_tokens": 64},
            "host_kv_tokens must be 0 or None with more than one rank",
        ),
        ({"phase_policy": "auto"}, "phase_policy must be off with one rank"),
        (
            {"step_tokens": 8, "page_size": 16},
            "step_tokens must be None or an integer >= page_size (16), got 8",
        ),
        ({"device": "cuda"}, "kv_tokens must be given off the CPU"),
        (
            {"tp": 2, "host_kv_tokens": 64},
            "host_kv_tokens must be 0 or None with more than one rank",
        ),
    ],
)
def test_a_rule_across_sections_names_the_field(kw, message):
    with pytest.raises(ValueError, match="^" + re.escape(message)):
        EngineConfig.from_kwargs(**kw)


def _defaults(command: str) -> dict[str, object]:
    cmd = typer.main.get_command(app).commands[command]
    return {p.name: p.default for p in cmd.params if p.name in SECTION_OF}


def test_engine_serves_defaults_are_the_configs_but_the_step_budget():
    from cli.options import config_of

    got = config_of(_defaults("serve")).as_dict()
    assert got == {**DEFAULTS, "step_tokens": SERVE_STEP_TOKENS}
    assert SERVE_STEP_TOKENS != DEFAULTS["step_tokens"]  # serve's own, declared as such


@pytest.mark.parametrize("command", ["generate", "info", "worker"])
def test_the_other_commands_share_the_configs_defaults(command):
    # generate and info size a pool rather than measure memory; generate's --seed is the request's
    own = {"kv_tokens": "8192", "seed": None}
    got = _defaults(command)
    assert got and got == {k: own.get(k, DEFAULTS[k]) for k in got}


def test_serve_reads_the_allowed_hosts_and_origins_comma_separated():
    from cli.options import config_of

    got = config_of({"allowed_hosts": " llm.example, [::1]:8000,", "allowed_origins": "*"})
    assert got.server.allowed_hosts == ("llm.example", "[::1]:8000")
    assert got.server.allowed_origins == ("*",)
    with pytest.raises(ValueError, match=r"^allowed_origins must be .*, got \('null',\)"):
        config_of({"allowed_origins": "null"})


def test_a_flat_value_where_a_section_belongs_says_to_use_from_kwargs():
    with pytest.raises(
        TypeError, match=r"^EngineConfig\.model must be a ModelSection, got 'm.gguf'"
    ):
        EngineConfig(model="m.gguf")  # type: ignore[arg-type]
