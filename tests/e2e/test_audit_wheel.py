"""The auditor from a built wheel, installed in a fresh venv with the base dependencies only (no
torch): it finds the shipped windows inside the installed package, and every file of the
source tree's ``audit/acceptance/`` ships.

Building, making the venv and installing take about 10 s here (13 s with pip's cache off; pip
resolves the base dependencies from the configured index), so the test is not marked slow; it
skips, saying why, if no index has them.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import orjson
import pytest

ROOT = Path(__file__).resolve().parents[2]
WINDOWS = {
    "boot_health",
    "no_request_lost",
    "admission_park",
    "eviction_honesty",
    "relief_ladder",
    "speculation",
}


def run(
    *cmd: str | Path, cwd: Path, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(c) for c in cmd], cwd=cwd, env=env, capture_output=True, text=True, timeout=300
    )


def source_copy(dest: Path) -> Path:
    """What the build reads (pyproject, README, the packages it finds), copied so that the build's
    own outputs (build/, *.egg-info) never land in the working tree."""
    meta = tomllib.loads((ROOT / "pyproject.toml").read_text())
    include = meta["tool"]["setuptools"]["packages"]["find"]["include"]
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, dest / name)
    for pkg in {p.rstrip("*").split(".")[0] for p in include}:
        shutil.copytree(ROOT / pkg, dest / pkg, ignore=shutil.ignore_patterns("__pycache__"))
    return dest


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    """A fresh venv with the wheel and its base dependencies; returns its bin/ folder."""
    tmp = tmp_path_factory.mktemp("wheel")
    src = source_copy(tmp_path_factory.mktemp("src"))
    r = run(
        sys.executable,
        "-m",
        "pip",
        "wheel",
        "-q",
        "--no-deps",
        "--no-build-isolation",
        "-w",
        tmp / "dist",
        src,
        cwd=tmp,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    (wheel,) = (tmp / "dist").glob("attest-*.whl")
    r = run(sys.executable, "-m", "venv", tmp / "venv", cwd=tmp)
    assert r.returncode == 0, r.stderr[-3000:]
    bin_ = tmp / "venv" / "bin"
    r = run(bin_ / "python", "-m", "pip", "install", "-q", wheel, cwd=tmp)
    if r.returncode and "No matching distribution" in r.stderr:
        pytest.skip(f"the base dependencies are not installable here: {r.stderr[-500:]}")
    assert r.returncode == 0, r.stderr[-3000:]
    return bin_


def env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "ATTEST_ACCEPTANCE")}


def test_the_installed_auditor_finds_and_ships_every_window(installed, tmp_path):
    code = "import importlib.util, audit.spec; print(audit.spec.acceptance_dir()); "
    code += "print(importlib.util.find_spec('torch'))"
    r = run(installed / "python", "-c", code, cwd=tmp_path, env=env())
    where, torch = r.stdout.split()
    assert torch == "None"  # the base install is the auditor's: no torch
    shipped = Path(where)
    assert shipped.is_relative_to(installed.parent)  # from the venv, not this checkout
    files = {
        str(p.relative_to(shipped))
        for p in shipped.rglob("*")
        if p.is_file() and "__pycache__" not in p.parts
    }
    source = ROOT / "audit" / "acceptance"
    assert files == {
        str(p.relative_to(source))
        for p in source.rglob("*")
        if p.is_file() and "__pycache__" not in p.parts
    }
    r = run(installed / "audit", "specs", cwd=tmp_path, env=env())
    assert r.returncode == 0, r.stderr
    assert {w for w in WINDOWS if f"{w}:" in r.stdout} == WINDOWS
    r = run(installed / "audit", "self-test", cwd=tmp_path, env=env())
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.count(": ok (") == len(list(shipped.glob("*/spec.toml")))


def test_the_installed_auditor_gives_verdicts_and_diffs(installed, tmp_path):
    case = ROOT / "audit" / "acceptance" / "eviction_honesty" / "cases"
    for name in ("pass", "fail"):
        log = tmp_path / f"{name}.log"
        log.write_text(tomllib.loads((case / f"{name}.toml").read_text())["log"])
    audit = installed / "audit"
    r = run(audit, "verdict", "pass.log", "--spec", "eviction_honesty", cwd=tmp_path, env=env())
    assert (r.returncode, "overall: PASS" in r.stdout) == (0, True), r.stdout + r.stderr
    r = run(audit, "verdict", "fail.log", "--json", cwd=tmp_path, env=env())
    d = orjson.loads(r.stdout)
    assert r.returncode == 1 and d["verdict"] == "FAIL"
    assert {s["spec"] for s in d["specs"]} == WINDOWS  # no --spec: every shipped window
    r = run(audit, "diff", "pass.log", "fail.log", "--json", cwd=tmp_path, env=env())
    rows = {x["name"]: x for x in orjson.loads(r.stdout)["rows"]}
    assert r.returncode == 0 and (rows["eviction_honesty"]["a"], rows["eviction_honesty"]["b"]) == (
        "PASS",
        "FAIL",
    )
