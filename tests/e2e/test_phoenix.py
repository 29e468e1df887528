"""Attest's traces in a real trace store: Arize Phoenix (``phoenix serve``, SQLite, OTLP over
HTTP at ``/v1/traces``), started here on loopback in its own virtualenv (measure/clients.py
``phoenix``, made on demand: about two minutes once; a skip that says why where it cannot be
made). A real `engine serve` (tiny model) exports to it a chat that calls a tool, a streamed
completion and a pool cutover; the spans are read back through Phoenix's REST API: each
request's tree (the server span, ``scheduler.request``, its queue, prefill and decode), the GenAI
attributes equal to the answer's usage, the trace id its ``request.finish`` receipt names, and
the cutover's span with its carry. Headless Chromium renders Phoenix's trace view of the chat
(the runbook's picture, runbooks/traces.md) and its page shows the tree."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

import httpx
import orjson
import pytest

from measure.clients import MissingClient, bin_path, ensure
from tests.e2e.server_proc import ServerProc, free_port

ROOT = Path(__file__).parents[2]
CLIENTS = ROOT / "build" / "clients"
KEY = "phoenix-test-key"
AUTH = {"authorization": f"Bearer {KEY}"}
TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",  # no arguments: the tiny model's call is short
        "parameters": {"type": "object", "properties": {}, "additionalProperties": False},
    },
}
WAIT_S = 300  # an upper bound on work that is quick on a quiet machine


def until(what, why: str):
    """``what()`` once it is truthy, asked again until WAIT_S have passed."""
    deadline = time.monotonic() + WAIT_S
    while not (got := what()):
        assert time.monotonic() < deadline, why
        time.sleep(0.5)
    return got


@pytest.fixture(scope="module")
def phoenix(tmp_path_factory):
    try:
        ensure("phoenix", CLIENTS)
    except (MissingClient, subprocess.CalledProcessError) as e:
        pytest.skip(f"Phoenix's environment cannot be made here: {e}")
    port = free_port()
    env = {
        **os.environ,
        "PHOENIX_WORKING_DIR": str(tmp_path_factory.mktemp("phoenix")),
        "PHOENIX_HOST": "127.0.0.1",
        "PHOENIX_PORT": str(port),
        "PHOENIX_GRPC_PORT": str(free_port()),
        "PHOENIX_TELEMETRY_ENABLED": "false",  # nothing leaves this machine
    }
    proc = subprocess.Popen(
        [str(bin_path("phoenix", "phoenix", CLIENTS)), "serve"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    base = f"http://127.0.0.1:{port}"

    def up() -> bool:
        assert proc.poll() is None, f"phoenix serve exited ({proc.returncode})"
        try:
            return httpx.get(base + "/v1/projects", timeout=10).status_code == 200
        except httpx.HTTPError:
            return False

    until(up, "phoenix serve did not answer")
    yield base
    proc.terminate()
    proc.wait(60)


@pytest.fixture(scope="module")
def served(phoenix, tiny_model_dir, tmp_path_factory):
    log = tmp_path_factory.mktemp("phoenix-serve") / "boot.jsonl"
    srv = ServerProc(
        log,
        "--model",
        tiny_model_dir,
        "--kv-tokens",
        "2048",
        "--served-model-name",
        "tiny",
        "--api-key",
        KEY,
        "--otlp-endpoint",
        phoenix,
        env={"OTEL_BSP_SCHEDULE_DELAY": "100"},
    )
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def work(served) -> dict[str, dict]:
    """A chat that must call the tool, a streamed completion and a pool cutover: each one's
    answer (the stream's last usage chunk), by what it was."""
    with httpx.Client(base_url=served.base, headers=AUTH, timeout=WAIT_S) as c:
        chat = c.post(
            "/v1/chat/completions",
            json={
                "model": "tiny",
                "messages": [{"role": "user", "content": "weather in Paris?"}],
                "tools": [TOOL],
                "tool_choice": "required",
                "max_tokens": 120,
            },
        )
        assert chat.status_code == 200, chat.text
        assert chat.json()["choices"][0]["message"]["tool_calls"]
        body = {"model": "tiny", "prompt": "Once upon a time", "max_tokens": 6, "stream": True}
        body["stream_options"] = {"include_usage": True}
        with c.stream("POST", "/v1/completions", json=body) as r:
            assert r.status_code == 200
            events = [x[6:] for x in r.iter_lines() if x.startswith("data: {")]
        cut = c.post("/admin/cutover", json={"kind": "pool", "mode": "carry", "kv_tokens": 1024})
        assert cut.status_code == 200, cut.text
    return {"chat": chat.json(), "text": orjson.loads(events[-1]), "cutover": cut.json()}


def spans(phoenix: str) -> list[dict]:
    """Every span Phoenix holds in its default project (the service sets no other)."""
    out: list[dict] = []
    cursor = None
    while True:
        params = {"limit": 1000, **({"cursor": cursor} if cursor else {})}
        r = httpx.get(f"{phoenix}/v1/projects/default/spans", params=params, timeout=60)
        assert r.status_code == 200, r.text
        out += r.json()["data"]
        if not (cursor := r.json().get("next_cursor")):
            return out


def finished(served) -> dict[str, dict]:
    lines = served.log_file.read_bytes().splitlines()
    ends = [orjson.loads(x) for x in lines if b'"request.finish"' in x]
    return {r["rid"]: r for r in ends}


@pytest.mark.parametrize("kind,name", [("chat", "chat tiny"), ("text", "text_completion tiny")])
def test_a_requests_tree_is_in_phoenix_with_its_genai_attributes(phoenix, served, work, kind, name):
    answer = work[kind]
    rid, usage = answer["id"], answer["usage"]

    def tree() -> list[dict] | None:
        held = spans(phoenix)
        server = [
            s for s in held if s["attributes"].get("attest.rid") == rid and not s["parent_id"]
        ]
        if not server:
            return None
        trace = server[0]["context"]["trace_id"]
        mine = [s for s in held if s["context"]["trace_id"] == trace]
        return mine if {"scheduler.decode"} <= {s["name"] for s in mine} else None

    mine = until(tree, f"the spans of {rid} never reached Phoenix")
    (root,) = [s for s in mine if not s["parent_id"]]
    assert root["name"] == name  # {gen_ai.operation.name} {gen_ai.request.model}
    a = root["attributes"]
    assert a["gen_ai.provider.name"] == "attest" and a["gen_ai.request.model"] == "tiny"
    assert a["gen_ai.usage.input_tokens"] == usage["prompt_tokens"]
    assert a["gen_ai.usage.output_tokens"] == usage["completion_tokens"]
    by_id = {s["context"]["span_id"]: s for s in mine}
    (request,) = [s for s in mine if s["name"] == "scheduler.request"]
    assert request["parent_id"] == root["context"]["span_id"]
    phases = {s["name"] for s in mine if s["parent_id"] == request["context"]["span_id"]}
    assert {"scheduler.queue", "scheduler.prefill", "scheduler.decode"} <= phases
    assert all(s["parent_id"] in by_id for s in mine if s is not root)
    assert finished(served)[rid]["trace_id"] == root["context"]["trace_id"]


def test_the_cutover_is_a_trace_of_its_own_with_its_carry(phoenix, work):
    cid = work["cutover"]["id"]

    def cutover() -> list[dict] | None:
        held = spans(phoenix)
        roots = [s for s in held if s["attributes"].get("attest.cutover.id") == cid]
        if not roots:
            return None
        kids = [s for s in held if s["parent_id"] == roots[0]["context"]["span_id"]]
        return [roots[0], *kids] if kids else None

    root, *phases = until(cutover, f"the span of cutover {cid} never reached Phoenix")
    assert root["name"] == "cutover" and not root["parent_id"]
    assert root["attributes"]["attest.cutover.kind"] == "pool"
    assert root["attributes"]["attest.cutover.outcome"] == "ok"
    assert "carry" in {s["name"] for s in phases}


@pytest.mark.slow  # a browser's render of what the tests above read through the API: test-all
def test_phoenixs_trace_view_shows_the_chats_tree(phoenix, work, tmp_path):
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    if browser is None:
        pytest.skip("no chromium here (make test installs Debian's where apt runs as root)")
    rid = work["chat"]["id"]
    held = until(
        lambda: [s for s in spans(phoenix) if s["attributes"].get("attest.rid") == rid],
        "the chat's spans never reached Phoenix",
    )
    trace = held[0]["context"]["trace_id"]
    project = httpx.get(f"{phoenix}/v1/projects", timeout=60).json()["data"][0]["id"]
    url = f"{phoenix}/projects/{project}/traces/{trace}"
    headless = [
        browser,
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1",  # loopback only
        "--window-size=1500,1000",
        "--virtual-time-budget=20000",
    ]
    shot = tmp_path / "trace.png"
    done = subprocess.run(
        [*headless, f"--screenshot={shot}", url], capture_output=True, timeout=WAIT_S
    )
    assert done.returncode == 0 and shot.stat().st_size > 10_000, done.stderr[-2000:]
    dom = subprocess.run(
        [*headless, "--dump-dom", url], capture_output=True, text=True, timeout=WAIT_S
    )
    page = dom.stdout
    for name in ("chat tiny", "scheduler.request", "scheduler.prefill", "scheduler.decode"):
        assert name in page, f"{name} is not on Phoenix's trace page"
    if path := os.environ.get("ATTEST_PHOENIX_SHOT"):  # the runbook's picture, when asked
        shutil.copy(shot, path)
