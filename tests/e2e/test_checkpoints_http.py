"""Conversation checkpoints over HTTP, across a restart: ``POST /v1/checkpoints`` runs a chat's
prompt and pins its pages in the durable store, a branch shares them, one over the pin budget is
a 409 with its four numbers, bad input is a 400 naming the field, an unknown id a 404; the server
stops, boots again on the same store, lists the checkpoints and continues the conversation from
the store, with the same answer as a server without one."""

from __future__ import annotations

import subprocess
import sys
import time

import httpx
import orjson
import pytest

from tests.e2e.server_proc import ServerProc

CHAT = [
    {"role": "system", "content": "You are a careful assistant. " * 12},
    {"role": "user", "content": "List three colours."},
    {"role": "assistant", "content": "red, green, blue"},
]
NEXT = CHAT + [{"role": "user", "content": "And three more?"}]


def boot(tmp_path, model_dir, name: str, *extra: str) -> ServerProc:
    return ServerProc(
        tmp_path / name,
        "--model",
        model_dir,
        "--kv-tokens",
        "2048",
        "--page-size",
        "16",
        "--kv-store-dir",
        str(tmp_path / "store"),
        "--kv-store-pin-bytes",
        "1000000",
        *extra,
    )


def log(path) -> list[dict]:
    return [orjson.loads(x) for x in path.read_bytes().splitlines()]


def answer(base: str) -> list[int]:
    body = {
        "messages": NEXT,
        "max_tokens": 6,
        "temperature": 0,
        "ignore_eos": True,
        "logprobs": True,
    }
    r = httpx.post(base + "/v1/chat/completions", json=body, timeout=120)
    assert r.status_code == 200, r.text
    return [t["token"] for t in r.json()["choices"][0]["logprobs"]["content"]]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    from tests.tiny_model import make_tiny_model

    return str(make_tiny_model(tmp_path_factory.mktemp("tiny-cp"), max_position=2048))


def test_checkpoints_over_http_outlive_a_restart(tmp_path, model_dir):
    plain = ServerProc(
        tmp_path / "plain.jsonl",
        "--model",
        model_dir,
        "--kv-tokens",
        "2048",
        "--page-size",
        "16",
        "--no-prefix-cache",
    )
    want = answer(plain.base)
    plain.stop()
    srv = boot(tmp_path, model_dir, "one.jsonl")
    cp = httpx.post(
        srv.base + "/v1/checkpoints", json={"messages": CHAT, "id": "chat"}, timeout=120
    )
    assert cp.status_code == 200, cp.text
    made = cp.json()
    assert made["id"] == "chat" and made["tokens"] > 0 and made["pinned_bytes"] > 0
    branch = httpx.post(srv.base + "/v1/checkpoints", json={"messages": NEXT}, timeout=120)
    assert branch.status_code == 200 and branch.json()["shared_bytes"] > 0
    again = httpx.post(
        srv.base + "/v1/checkpoints", json={"messages": CHAT, "id": "chat"}, timeout=120
    )
    assert again.status_code == 409 and "exists" in again.json()["error"]["message"]
    big = httpx.post(
        srv.base + "/v1/checkpoints",
        json={"prompt": [5 + i % 300 for i in range(1200)]},
        timeout=120,
    )
    assert big.status_code == 409, big.text
    n = big.json()["checkpoint"]
    assert n["overshoot"] == n["held"] + n["want"] - n["budget"] > 0
    for body, param in (({"id": "chat"}, "messages"), ({"prompt": "x", "id": "../x"}, "id")):
        bad = httpx.post(srv.base + "/v1/checkpoints", json=body, timeout=30)
        assert bad.status_code == 400 and param in bad.text, bad.text
    gone = httpx.delete(srv.base + "/v1/checkpoints/nope", timeout=30)
    assert gone.status_code == 404 and "nope" in gone.json()["error"]["message"]
    listed = httpx.get(srv.base + "/v1/checkpoints", timeout=30).json()
    assert {c["id"] for c in listed["data"]} >= {"chat"} and len(listed["data"]) == 2
    assert (
        listed["capacity"]["pinned"] + listed["capacity"]["reclaimable"]
        == listed["capacity"]["used"]
    )
    # the same from the command line
    cli = [sys.executable, "-m", "cli.engine_app", "checkpoint"]
    chat = tmp_path / "chat.json"
    chat.write_text(orjson.dumps({"messages": CHAT}).decode())
    made_cli = subprocess.run(
        [*cli, "create", "--messages", str(chat), "--id", "cli", "--url", srv.base],
        capture_output=True,
        text=True,
    )
    assert made_cli.returncode == 0 and orjson.loads(made_cli.stdout)["shared_bytes"] > 0
    nope = subprocess.run(
        [*cli, "delete", "--id", "nope", "--url", srv.base], capture_output=True, text=True
    )
    assert nope.returncode == 1 and "404" in nope.stderr
    deleted = subprocess.run(
        [*cli, "delete", "--id", "cli", "--url", srv.base], capture_output=True, text=True
    )
    assert deleted.returncode == 0, deleted.stderr
    listed = httpx.get(srv.base + "/v1/checkpoints", timeout=30).json()
    pinned = listed["capacity"]["pinned"]
    assert pinned > 0
    deadline = time.monotonic() + 60  # the next heartbeat's snapshot carries the store's numbers
    while (
        httpx.get(srv.base + "/health", timeout=30).json().get("store", {}).get("pinned") != pinned
    ):
        assert time.monotonic() < deadline, "/health never showed the store's pinned bytes"
        time.sleep(0.2)
    metrics = httpx.get(srv.base + "/metrics", timeout=30).text
    assert f'attest:kv_store_bytes{{state="pinned"}} {float(pinned)}' in metrics
    code, _ = srv.stop()
    assert code == 0
    srv = boot(tmp_path, model_dir, "two.jsonl")
    listed = httpx.get(srv.base + "/v1/checkpoints", timeout=30).json()
    assert {c["id"] for c in listed["data"]} >= {"chat"}
    assert answer(srv.base) == want
    srv.stop()
    loads = [r for r in log(tmp_path / "two.jsonl") if r["event"] == "store.load" and r["pages"]]
    assert loads and loads[0]["tokens"] >= made["tokens"] - 16  # the history's whole pages
    # the auditor judges both boots as one window: every checkpoint found again, whole
    boots = [str(tmp_path / "two.jsonl"), str(tmp_path / "one.jsonl")]  # any order
    got = subprocess.run(
        [
            sys.executable,
            "-m",
            "cli.audit_app",
            "verdict",
            *boots,
            "--spec",
            "checkpoint_durability",
            "--json",
        ],
        capture_output=True,
        text=True,
    )
    report = orjson.loads(got.stdout)
    claims = {c["claim"]: c["verdict"] for w in report["specs"] for c in w["claims"]}
    assert claims == dict.fromkeys(claims, "PASS") and len(claims) == 5, got.stdout
    assert got.returncode == 0
    alone = subprocess.run(
        [
            sys.executable,
            "-m",
            "cli.audit_app",
            "verdict",
            boots[1],
            "--spec",
            "checkpoint_durability",
        ],
        capture_output=True,
        text=True,
    )
    assert alone.returncode == 2, alone.stdout  # one boot: no boot after it to find them
