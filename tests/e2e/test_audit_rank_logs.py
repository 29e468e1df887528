"""Rank logs as an operator passes them: one file per rank of a boot, named one by one, by a
quoted glob the auditor expands, or by their directory. A pattern or a directory that names no
log is a usage error (64) naming it; an unreadable file stays 66."""

from __future__ import annotations

import tomllib
from pathlib import Path

import orjson
import pytest

from tests.e2e.audit_cli import CASES, audit


def rank_files(d: Path, case: str, window: str = "group_agreement") -> list[Path]:
    """``case``'s log split into one file per rank, as a multi-rank boot writes them."""
    log = tomllib.loads((CASES / window / "cases" / f"{case}.toml").read_text())["log"]
    parts: dict[int, list[str]] = {}
    for line in log.splitlines():
        parts.setdefault(orjson.loads(line)["rank"], []).append(line)
    d.mkdir(parents=True, exist_ok=True)
    out = []
    for rank, lines in sorted(parts.items()):
        out.append(d / f"boot-rank{rank}.jsonl")
        out[-1].write_text("\n".join(lines) + "\n")
    return out


def verdict_json(*args: str) -> tuple[int, dict]:
    r = audit("verdict", *args, "--json")
    assert r.returncode in (0, 1, 2), r.stderr
    return r.returncode, orjson.loads(r.stdout)


def claims(d: dict, spec: str) -> dict[str, dict]:
    return {c["claim"]: c for s in d["specs"] if s["spec"] == spec for c in s["claims"]}


def test_a_directory_a_glob_and_the_files_by_name_give_the_same_pass(tmp_path):
    files = rank_files(tmp_path / "logs", "pass")
    (tmp_path / "logs" / "notes.txt").write_text("not a log\n")
    (tmp_path / "logs" / ".hidden.jsonl").write_text("not read\n")
    want = [str(f) for f in files]
    for args in (
        [str(tmp_path / "logs")],
        [str(tmp_path / "logs" / "boot-rank*.jsonl")],
        [str(files[1]), str(files[0])],
    ):
        code, d = verdict_json(*args, "--spec", "group_agreement")
        assert (code, d["verdict"]) == (0, "PASS"), args
        assert sorted(d["logs"]) == want and d["read"]["ranks"] == [0, 1]
    code, d = verdict_json(str(tmp_path / "logs"), "--spec", "group_agreement")
    assert d["logs"] == want  # a directory's logs in sorted order, the others left out


def test_a_file_named_twice_is_read_once(tmp_path):
    files = rank_files(tmp_path / "logs", "pass")
    code, d = verdict_json(str(tmp_path / "logs"), str(files[0]), "--spec", "group_agreement")
    assert (code, d["complete"], d["logs"]) == (0, True, [str(f) for f in files])


def test_rank_logs_in_a_directory_get_the_window_without_naming_it(tmp_path):
    rank_files(tmp_path / "logs", "digest_split")
    code, d = verdict_json(str(tmp_path / "logs"))
    agree = claims(d, "group_agreement")["digests_agree"]
    assert code == 1 and agree["verdict"] == "FAIL"
    assert "boot b-0000002a iter 3 (rank 0: iteration digest '" in agree["why"]
    assert "rank 1: iteration digest '" in agree["why"]


def test_one_rank_log_of_a_two_rank_boot_is_undecided_not_skipped(tmp_path):
    rank0 = rank_files(tmp_path / "logs", "pass")[0]
    code, d = verdict_json(str(rank0))
    got = claims(d, "group_agreement")
    assert code == 2
    assert (got["digests_agree"]["verdict"], got["digests_agree"]["reason"]) == (
        "UNDECIDED",
        "rank_missing",
    )
    assert "no log holds rank 1" in got["digests_agree"]["why"]


def test_a_one_rank_boot_leaves_the_window_out_by_default(tmp_path):
    log = rank_files(tmp_path / "logs", "single_rank")[0]
    code, d = verdict_json(str(log))
    assert "group_agreement" not in {s["spec"] for s in d["specs"]}
    assert {"spec": "group_agreement", "why": "needs 2 ranks, the logs have 1"} in d[
        "not_applicable"
    ]
    code, d = verdict_json(str(log), "--spec", "group_agreement")
    assert (code, d["verdict"]) == (2, "UNDECIDED")


@pytest.mark.parametrize("command", ["verdict", "summary", "report", "explain"])
def test_a_pattern_or_directory_that_names_no_log_is_a_usage_error_naming_it(tmp_path, command):
    extra = ["--rid", "r-1"] if command == "explain" else []
    extra += ["-o", str(tmp_path / "r.html")] if command == "report" else []
    pattern = str(tmp_path / "boot-*.jsonl")
    r = audit(command, pattern, *extra)
    assert r.returncode == 64, (r.returncode, r.stderr)
    assert f"pattern {pattern!r} matches no file" in r.stderr
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "notes.txt").write_text("x\n")
    r = audit(command, str(empty), *extra)
    assert r.returncode == 64 and f"directory {str(empty)!r} holds no log" in r.stderr


def test_a_missing_file_stays_66(tmp_path):
    files = rank_files(tmp_path / "logs", "pass")
    r = audit("verdict", str(files[0]), str(tmp_path / "rank1-missing.jsonl"))
    assert r.returncode == 66 and "rank1-missing.jsonl" in r.stderr


def test_summary_and_explain_read_a_directory_and_a_glob(tmp_path):
    rank_files(tmp_path / "logs", "pass")
    r = audit("summary", str(tmp_path / "logs"))
    assert r.returncode == 0 and "rank 0" in r.stdout and "rank 1" in r.stdout
    r = audit("explain", str(tmp_path / "logs" / "*.jsonl"), "--rid", "r-1")
    assert r.returncode == 0 and "admission.park" in r.stdout
    assert "r-1: 8 receipts" in r.stdout  # both ranks' receipts of r-1


def test_report_reads_a_directory(tmp_path):
    rank_files(tmp_path / "logs", "pass")
    out = tmp_path / "r.html"
    r = audit("report", str(tmp_path / "logs"), "-o", str(out))
    assert r.returncode == 0, r.stderr
    assert "group_agreement" in out.read_text(encoding="utf-8")
