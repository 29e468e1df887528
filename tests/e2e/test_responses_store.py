"""Stored responses and where they live. With a durable KV store a stored response is a file
beside it and its conversation a checkpoint in it: the server is killed (SIGKILL: nothing is
written at a stop), boots again on the same store, answers GET with the same response and a
``previous_response_id`` turn with the prefix loaded from the store (``store.load``, the
``cached`` tokens); deleting the response unpins its checkpoint. Without one they live in memory
under ``--max-stored-responses``: the least recently used is dropped first, with a
``response.evict`` receipt, and after a restart a ``previous_response_id`` is a 404 that says why.
Served on the tiny random model: what is under test is where the conversation is kept, not
what the model says."""

from __future__ import annotations

import signal
import time

import httpx
import orjson
import psutil
import pytest

from tests.e2e.server_proc import ServerProc

SYSTEM = "You are a careful assistant who answers in lists. " * 8
TURN = {"temperature": 0, "max_output_tokens": 8, "instructions": SYSTEM}


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    from tests.tiny_model import make_tiny_model

    return str(make_tiny_model(tmp_path_factory.mktemp("tiny-resp"), max_position=2048))


@pytest.fixture
def boot(model_dir):
    """Boots a tiny-model server; every one still running when the test ends (a failed
    assertion) is stopped then, so none outlives its test."""
    started: list[ServerProc] = []

    def start(log, *extra: str) -> ServerProc:
        srv = ServerProc(
            log, "--model", model_dir, "--kv-tokens", "2048", "--page-size", "16", *extra
        )
        started.append(srv)
        return srv

    yield start
    for srv in started:
        if srv.proc.poll() is None:
            srv.stop()


def rows(path) -> list[dict]:
    return [orjson.loads(x) for x in path.read_bytes().splitlines()]


def ask(base: str, **body) -> dict:
    r = httpx.post(base + "/v1/responses", json=body, timeout=120)
    assert r.status_code == 200, r.text
    return r.json()


def wait_for(path, what, test) -> list[dict]:
    """The log's receipts once ``test`` holds of them (the scheduler process writes them)."""
    deadline = time.monotonic() + 60
    while not test(found := rows(path)):
        assert time.monotonic() < deadline, f"the log never showed {what}"
        time.sleep(0.2)
    return found


def crash(srv: ServerProc) -> None:
    """SIGKILL to every process of the server at once (the scheduler too, which would write
    what it cached at an orderly stop when the frontend goes): nothing is written after."""
    procs = [psutil.Process(srv.proc.pid)]
    procs += procs[0].children(recursive=True)
    for p in procs:
        p.send_signal(signal.SIGKILL)
    psutil.wait_procs(procs, timeout=60)
    srv.proc.communicate(timeout=60)


def test_a_stored_conversation_outlives_a_crash_and_its_prefix_loads_from_the_store(tmp_path, boot):
    store = ["--kv-store-dir", str(tmp_path / "store"), "--kv-store-pin-bytes", "10000000"]
    srv = boot(tmp_path / "one.jsonl", *store)
    first = ask(srv.base, input="List three colours.", **TURN)
    listed = httpx.get(srv.base + "/v1/checkpoints", timeout=30).json()["data"]
    pinned = {c["id"]: c for c in listed}
    assert first["id"] in pinned and pinned[first["id"]]["complete"], listed
    tokens = pinned[first["id"]]["tokens"]
    assert tokens > first["usage"]["input_tokens"]  # the prompt, then the answer
    assert (tmp_path / "store" / "responses" / f"{first['id']}.json").is_file()
    crash(srv)

    two = tmp_path / "two.jsonl"
    srv = boot(two, *store)
    got = httpx.get(srv.base + f"/v1/responses/{first['id']}", timeout=30)
    assert got.status_code == 200 and got.json() == first
    second = ask(srv.base, input="And three more?", previous_response_id=first["id"], **TURN)
    assert second["usage"]["input_tokens_details"]["cached_tokens"] >= tokens - 16
    rid = "resp-" + second["id"].removeprefix("resp_")
    log = wait_for(two, "the second turn's finish", lambda r: any(x.get("rid") == rid for x in r))
    loads = [x for x in log if x["event"] == "store.load" and x["pages"]]
    assert loads and loads[0]["tokens"] >= tokens - 16  # the conversation's whole pages
    log = wait_for(
        two,
        "request.finish",
        lambda r: any(x["event"] == "request.finish" and x["rid"] == rid for x in r),
    )
    finish = next(x for x in log if x["event"] == "request.finish" and x["rid"] == rid)
    assert finish["cached"] >= tokens - 16 and finish["prompt_tokens"] > tokens
    gone = httpx.delete(srv.base + f"/v1/responses/{first['id']}", timeout=30)
    assert gone.status_code == 200 and gone.json()["deleted"] is True
    left = {c["id"] for c in httpx.get(srv.base + "/v1/checkpoints", timeout=30).json()["data"]}
    assert first["id"] not in left and second["id"] in left  # its pins went with it
    again = httpx.get(srv.base + f"/v1/responses/{first['id']}", timeout=30)
    assert again.status_code == 404 and first["id"] in again.json()["error"]["message"]
    code, _ = srv.stop()
    assert code == 0


def test_in_memory_the_least_recently_used_is_dropped_and_a_restart_forgets(tmp_path, boot):
    log = tmp_path / "mem.jsonl"
    srv = boot(log, "--max-stored-responses", "2")
    a, b = (ask(srv.base, input=f"Turn {k}.", **TURN)["id"] for k in "ab")
    assert httpx.get(srv.base + f"/v1/responses/{a}", timeout=30).status_code == 200  # a used
    c = ask(srv.base, input="Turn c.", **TURN)["id"]
    dropped = httpx.get(srv.base + f"/v1/responses/{b}", timeout=30)
    assert dropped.status_code == 404
    message = dropped.json()["error"]["message"]
    assert b in message and "--max-stored-responses" in message and "dropped" in message
    for kept in (a, c):
        assert httpx.get(srv.base + f"/v1/responses/{kept}", timeout=30).status_code == 200
    found = wait_for(
        log, "response.evict", lambda r: any(x["event"] == "response.evict" for x in r)
    )
    evicts = [x for x in found if x["event"] == "response.evict"]
    assert [(x["id"], x["bound"], x["stored"]) for x in evicts] == [(b, 2, 2)]
    srv.stop()
    srv = boot(tmp_path / "mem2.jsonl", "--max-stored-responses", "2")
    r = httpx.post(
        srv.base + "/v1/responses",
        json={"input": "Go on.", "previous_response_id": a, **TURN},
        timeout=60,
    )
    assert r.status_code == 404
    err = r.json()["error"]
    assert err["param"] == "previous_response_id" and a in err["message"]
    assert "in memory" in err["message"] and "restarted" in err["message"]
    srv.stop()
