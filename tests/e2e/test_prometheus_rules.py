"""The alerting rules in runbooks/prometheus/ as Prometheus itself reads them: ``promtool check
rules`` accepts them, ``promtool test rules`` runs a firing and a quiet case of every alert, the
exposition of a live server passes ``promtool check metrics`` and holds every metric the rules
read, and a real ``prometheus`` scraping a tiny-model server under a small pool sees the pool
alert go pending.

promtool and prometheus are Debian's ``prometheus`` package (``make test`` installs it where
apt-get runs as root); without them these tests skip and say so.
"""

from __future__ import annotations

import re
import shutil
import signal
import subprocess
import threading
import time
from pathlib import Path

import httpx
import pytest
import yaml

from tests.e2e.server_proc import ServerProc, free_port

ROOT = Path(__file__).parents[2]
RULES_DIR = ROOT / "runbooks" / "prometheus"
RULE_FILES = sorted(RULES_DIR.glob("*.rules.yml"))
UNIT_TESTS = sorted((RULES_DIR / "tests").glob("*.yml"))
POOL_ALERT = "AttestKVPoolNearExhaustion"
# PromQL words that are not metric names
PROMQL = set(
    "and or unless by without on ignoring group_left group_right offset bool sum max min avg "
    "count rate increase irate histogram_quantile absent le".split()
)


def tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        pytest.skip(
            f"{name} is not installed: it comes with Debian's prometheus package "
            "(`apt-get install -y prometheus`, which `make test` runs as root)"
        )
    return path


def run(*cmd: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, input=stdin, capture_output=True, text=True, timeout=120)


def rules() -> list[dict]:
    return [
        r for f in RULE_FILES for g in yaml.safe_load(f.read_text())["groups"] for r in g["rules"]
    ]


def alerts() -> list[dict]:
    return [r for r in rules() if "alert" in r]


def metrics_read(expr: str) -> set[str]:
    """The metric names a PromQL expression reads (not its functions, labels or numbers)."""
    expr = re.sub(r"\{[^}]*\}|\[[^\]]*\]|\"[^\"]*\"", " ", expr)
    expr = re.sub(r"\b(by|without|on|ignoring)\s*\([^)]*\)", " ", expr)
    names = set(re.findall(r"(?<![\w:.])([A-Za-z_:][\w:]*)\b(?!\s*\()", expr))
    return names - PROMQL


@pytest.fixture(scope="module")
def promtool() -> str:
    return tool("promtool")


@pytest.fixture(scope="module")
def prometheus() -> str:
    return tool("prometheus")


@pytest.fixture(scope="module")
def srv(tiny_model_dir, tmp_path_factory):
    """A tiny-model server whose pool a few long requests fill."""
    log = tmp_path_factory.mktemp("prom") / "boot.jsonl"
    s = ServerProc(
        log, "--model", tiny_model_dir, "--kv-tokens", "256", "--served-model-name", "tiny"
    )
    yield s
    code, out = s.stop()
    assert code == 0 and "Traceback" not in out, out[-3000:]


def test_promtool_accepts_the_rule_files(promtool):
    assert RULE_FILES, "no rule files in runbooks/prometheus"
    r = run(promtool, "check", "rules", *map(str, RULE_FILES))
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.count("SUCCESS") == len(RULE_FILES), r.stdout


def test_every_alert_has_a_firing_and_a_quiet_unit_test_and_they_pass(promtool):
    firing, quiet = set(), set()
    for f in UNIT_TESTS:
        for group in yaml.safe_load(f.read_text())["tests"]:
            for case in group.get("alert_rule_test", []):
                (firing if case["exp_alerts"] else quiet).add(case["alertname"])
    names = {a["alert"] for a in alerts()}
    assert names - firing == set(), "alerts without a firing case"
    assert names - quiet == set(), "alerts without a quiet case"
    r = run(promtool, "test", "rules", *map(str, UNIT_TESTS))
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.count("SUCCESS") == len(UNIT_TESTS), r.stdout


def test_the_rules_find_their_metrics_in_a_live_exposition_that_promtool_accepts(promtool, srv):
    """Every metric a rule reads is one the server exposes (a family, or a histogram's series;
    ``up`` is Prometheus's own), and ``promtool check metrics`` finds nothing to say but that
    the ``attest:`` names hold a colon: that prefix is kept on purpose, as vLLM keeps ``vllm:``
    (runbooks/serve.md), while the GenAI histograms are lint clean."""
    for api in ("chat/completions", "completions"):
        body = {"max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]}
        if api == "completions":
            body = {"max_tokens": 4, "prompt": "hi"}
        assert httpx.post(f"{srv.base}/v1/{api}", json=body, timeout=120).status_code == 200
    text = httpx.get(f"{srv.base}/metrics", timeout=60).text
    families = dict(re.findall(r"^# TYPE (\S+) (\S+)$", text, re.M))
    exposed = {"up"} | set(families)
    for name, kind in families.items():
        if kind == "histogram":
            exposed |= {f"{name}_bucket", f"{name}_sum", f"{name}_count"}
    recorded = {r["record"] for r in rules() if "record" in r}
    read = {m for r in rules() for m in metrics_read(r["expr"])} - recorded
    assert read and read - exposed == set(), "rules read metrics the server does not expose"
    assert "attest:scheduler_up 1.0" in text.splitlines()
    r = run(promtool, "check", "metrics", stdin=text)
    problems = [x for x in (r.stdout + r.stderr).splitlines() if x.strip()]
    colon = [
        x for x in problems if re.fullmatch(r"attest:\S+ metric names should not contain ':'", x)
    ]
    assert problems == colon, problems
    assert r.returncode in (0, 3), r.stderr  # 3: lint problems only, the exposition parsed
    assert not [x for x in problems if x.startswith("gen_ai_")]


def prometheus_config(path: Path, target: str) -> Path:
    config = {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(f) for f in RULE_FILES],
        "scrape_configs": [{"job_name": "attest", "static_configs": [{"targets": [target]}]}],
    }
    path.write_text(yaml.safe_dump(config))
    return path


def load(base: str, stop: threading.Event) -> None:
    """Long requests, one after another, until ``stop``: three of these fill a 256-token pool."""
    body = {"prompt": "hello world " * 5, "max_tokens": 200, "ignore_eos": True}
    with httpx.Client(timeout=300) as c:
        while not stop.is_set():
            c.post(f"{base}/v1/completions", json=body)


def test_prometheus_sees_the_pool_alert_go_pending_under_a_small_pool(prometheus, srv, tmp_path):
    """The real rule files, their ``for:`` unchanged (pending is the state before ``for:`` has
    passed; the unit tests cover the ``for:`` itself): Prometheus scrapes the server every
    second while six clients fill its pool, and its alerts API shows the pool alert pending
    (or firing) for this server; every rule evaluates without an error."""
    port = free_port()
    api = f"http://127.0.0.1:{port}/api/v1"
    prom = subprocess.Popen(
        [
            prometheus,
            f"--config.file={prometheus_config(tmp_path / 'prometheus.yml', srv.base[7:])}",
            f"--storage.tsdb.path={tmp_path / 'tsdb'}",
            f"--web.listen-address=127.0.0.1:{port}",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    stop = threading.Event()
    clients = [threading.Thread(target=load, args=(srv.base, stop)) for _ in range(6)]
    try:
        for c in clients:
            c.start()
        seen = poll_alert(api, srv.base[7:], prom)
        assert seen["state"] in ("pending", "firing"), seen
        groups = httpx.get(f"{api}/rules", timeout=10).json()["data"]["groups"]
        health = {r["name"]: (r["health"], r.get("lastError")) for g in groups for r in g["rules"]}
        assert len(health) == len(rules())
        assert {n: h for n, h in health.items() if h[0] == "err"} == {}
    finally:
        stop.set()
        prom.send_signal(signal.SIGTERM)
        try:
            prom.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            prom.kill()
            prom.communicate()
        for c in clients:
            c.join(timeout=300)


def poll_alert(api: str, instance: str, prom: subprocess.Popen) -> dict:
    """The pool alert for ``instance`` as /api/v1/alerts shows it, once it does (a roomy bound:
    Prometheus's start, the scrapes and the pool filling on a busy machine)."""
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline:
        if prom.poll() is not None:
            raise AssertionError(f"prometheus exited: {prom.stdout.read()[-3000:]}")
        try:
            r = httpx.get(f"{api}/alerts", timeout=10)
        except httpx.HTTPError:
            r = None  # not listening yet
        found = r.json()["data"]["alerts"] if r is not None and r.status_code == 200 else []
        for a in found:
            if a["labels"]["alertname"] == POOL_ALERT and a["labels"]["instance"] == instance:
                return a
        time.sleep(0.2)
    raise AssertionError(f"{POOL_ALERT} never showed in {api}/alerts")
