"""The console scripts as a user runs them."""

from __future__ import annotations

import json
import subprocess
import sys

from tests.conftest import requires_default_model


def run(*args: str, timeout: float = 1200) -> subprocess.CompletedProcess:
    # the limit only catches a hang: loading the default model on a loaded 2-core machine
    # has taken minutes
    return subprocess.run(
        [sys.executable, "-m", *args], capture_output=True, text=True, timeout=timeout
    )


@requires_default_model
def test_engine_info_reports_the_default_model():
    r = run("cli.engine_app", "info", "--json", "--kv-tokens", "1024")
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert d["parameters"] == 134_515_008
    assert d["kv_bytes_per_token"] == 2 * 30 * 3 * 64 * 4
    assert d["kv_pool_bytes"] == d["kv_bytes_per_token"] * (1024 + 1)
    assert d["context"] == 8192 and d["dtype"] == "float32"


@requires_default_model
def test_engine_generate_streams_the_answer():
    r = run("cli.engine_app", "generate", "What is the capital of France?", "-n", "12")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "The capital of France is Paris."


def test_engine_generate_rejects_a_bad_value_clearly():
    r = run("cli.engine_app", "generate", "hi", "--temperature", "-1")
    assert r.returncode == 2
    assert "temperature must be a number >= 0" in r.stderr


def test_engine_generate_names_a_missing_model():
    r = run("cli.engine_app", "generate", "hi", "--model", "/nonexistent/model.gguf")
    assert r.returncode == 2
    assert "does not exist" in r.stderr


def test_audit_and_engine_packages_import_without_torch():
    code = (
        "import sys, audit, cli.audit_app, engine, engine.config\n"
        "assert 'torch' not in sys.modules, 'torch was imported'\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


def test_every_engine_option_is_an_engine_serve_flag_of_the_same_name():
    """LLM(...) keywords and `engine serve` flags are one vocabulary."""
    import typer.main

    from cli.engine_app import app
    from engine.config import SECTION_OF

    cmd = typer.main.get_command(app).commands["serve"]
    flags = {opt.lstrip("-").replace("-", "_") for p in cmd.params for opt in p.opts}
    missing = [name for name in SECTION_OF if name not in flags]
    assert not missing, f"EngineConfig fields without an `engine serve` flag: {missing}"
