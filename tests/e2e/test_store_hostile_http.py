"""`engine serve` over a durable KV store that someone else has been in (tiny model, loopback):

* a store directory with a link to a victim directory at a fan-out folder, a FIFO named like a
  page, a page header of the wrong token count, a checkpoint whose manifest says
  ``"tokens": "abc"`` and a pins file of deeply nested JSON boots and serves (it exited 2, or
  hung on the FIFO); nothing in the victim changes, and each of those is set aside with its
  ``store.quarantine`` receipt in the boot log;
* ``DELETE /v1/checkpoints/{id}`` of a checkpoint whose manifest cannot be removed is a 500 that
  says so (the scheduler died and every client got 503), the server goes on serving, and a
  retry once the file can go deletes it;
* a pinned page that fails its checksum when a request loads it after a restart leaves its
  checkpoint listed ``complete: false`` with the page ``missing``."""

from __future__ import annotations

import json
import os
import struct

import httpx
import orjson
import pytest

from engine.tiers.store_files import MAGIC, page_key, page_path
from tests.e2e.server_proc import ServerProc
from tests.unit.test_kv_store_hostile import DEEP, good_header, snapshot, victim_tree

PROMPT = [5 + (i * 37) % 250 for i in range(80)]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    from tests.tiny_model import make_tiny_model

    return str(make_tiny_model(tmp_path_factory.mktemp("tiny-store"), max_position=2048))


def boot(tmp_path, model_dir, name: str) -> ServerProc:
    return ServerProc(
        tmp_path / name,
        "--model",
        model_dir,
        "--kv-tokens",
        "1024",
        "--page-size",
        "16",
        "--kv-store-dir",
        str(tmp_path / "store"),
    )


def log(path) -> list[dict]:
    return [orjson.loads(x) for x in path.read_bytes().splitlines()]


def _hostile(root, victim) -> set[str]:
    """A store directory as an adversary leaves it; returns the paths that must be set aside."""
    key = page_key(None, [1, 2], "whoever")
    fan = root / "pages" / "ab"
    fan.mkdir(parents=True)
    (fan / "cd").symlink_to(victim / "ab" / "cd", target_is_directory=True)
    fifo = page_path(root, key)
    fifo.parent.mkdir(parents=True, exist_ok=True)
    os.mkfifo(fifo)
    bad = page_path(root, page_key(None, [3, 4], "whoever"))
    bad.parent.mkdir(parents=True, exist_ok=True)
    head = json.dumps(
        {**good_header(page_key(None, [3, 4], "x"), b"z" * 8), "tokens": [3]}
    ).encode()
    bad.write_bytes(MAGIC + struct.pack("<I", len(head)) + head + b"z" * 8)
    (root / "pins").mkdir()
    (root / "checkpoints").mkdir()
    (root / "pins" / "abc.json").write_bytes(json.dumps({"id": "abc", "keys": []}).encode())
    (root / "checkpoints" / "abc.json").write_bytes(
        json.dumps({"tokens": "abc", "pinned_bytes": 0, "shared_bytes": 0, "created": 1.0}).encode()
    )
    (root / "pins" / "deep.json").write_bytes(DEEP)
    rel = lambda p: str(p.relative_to(root))  # noqa: E731
    return {
        "pages/ab/cd",
        rel(fifo),
        rel(bad),
        "pins/abc.json",
        "checkpoints/abc.json",
        "pins/deep.json",
    }


def test_a_hostile_store_directory_boots_serves_and_touches_nothing_outside(tmp_path, model_dir):
    victim, root = tmp_path / "victim", tmp_path / "store"
    victim_tree(victim)
    want = _hostile(root, victim)
    before = snapshot(victim)
    srv = boot(tmp_path, model_dir, "boot.jsonl")
    r = httpx.post(
        srv.base + "/v1/completions", json={"prompt": PROMPT, "max_tokens": 2}, timeout=60
    )
    assert r.status_code == 200, r.text
    code, _ = srv.stop()
    assert code == 0
    assert snapshot(victim) == before
    said = {q["path"]: q for q in log(tmp_path / "boot.jsonl") if q["event"] == "store.quarantine"}
    assert set(said) == want
    assert all(
        (root / q["moved_to"]).is_symlink() or os.path.lexists(root / q["moved_to"])
        for q in said.values()
    )


def test_an_undeletable_checkpoint_is_an_answer_and_a_failed_checksum_uncompletes(
    tmp_path, model_dir
):
    srv = boot(tmp_path, model_dir, "one.jsonl")
    for cid in ("keep", "stuck"):
        made = httpx.post(
            srv.base + "/v1/checkpoints", json={"prompt": PROMPT, "id": cid}, timeout=120
        )
        assert made.status_code == 200, made.text
    manifest = tmp_path / "store" / "checkpoints" / "stuck.json"
    manifest.unlink()
    (manifest / "held").mkdir(parents=True)  # no unlink removes a folder with something in it
    r = httpx.delete(srv.base + "/v1/checkpoints/stuck", timeout=30)
    assert r.status_code == 500, r.text
    assert "checkpoints/stuck.json could not be removed" in r.json()["error"]["message"]
    assert httpx.get(srv.base + "/health", timeout=30).status_code == 200
    listed = httpx.get(srv.base + "/v1/checkpoints", timeout=30).json()["data"]
    assert {c["id"]: c["complete"] for c in listed} == {"keep": True, "stuck": True}
    (manifest / "held").rmdir()
    manifest.rmdir()
    assert httpx.delete(srv.base + "/v1/checkpoints/stuck", timeout=30).status_code == 200
    code, _ = srv.stop()
    assert code == 0
    (failed,) = [x for x in log(tmp_path / "one.jsonl") if x["event"] == "checkpoint.delete_failed"]
    assert failed["id"] == "stuck" and failed["path"] == "checkpoints/stuck.json"
    # a pinned page flipped on disk: found when a request loads it after the restart
    store = tmp_path / "store"
    pin = json.loads((store / "pins" / "keep.json").read_bytes())["keys"][1]
    page = page_path(store, pin)
    data = bytearray(page.read_bytes())
    data[-1] ^= 0xFF
    page.write_bytes(bytes(data))
    srv = boot(tmp_path, model_dir, "two.jsonl")
    r = httpx.post(
        srv.base + "/v1/completions", json={"prompt": PROMPT, "max_tokens": 2}, timeout=60
    )
    assert r.status_code == 200, r.text
    (keep,) = httpx.get(srv.base + "/v1/checkpoints", timeout=30).json()["data"]
    assert keep["id"] == "keep" and keep["complete"] is False and keep["missing"] == 1
    srv.stop()
    (q,) = [x for x in log(tmp_path / "two.jsonl") if x["event"] == "store.quarantine"]
    assert q["reason"] == "checksum" and q["checkpoints"] == ["keep"]


def test_a_store_directory_it_cannot_use_is_said_by_health_and_by_checkpoints(tmp_path, model_dir):
    """--kv-store-dir names a directory the engine cannot make (a file is in the way): the
    server serves without a store, and says why at boot (store.sized unusable), in /health
    (store_off) and on /v1/checkpoints (503 naming the directory and the reason), never "start
    it with --kv-store-dir"."""
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    where = str(blocker / "store")
    srv = ServerProc(
        tmp_path / "boot.jsonl",
        "--model",
        model_dir,
        "--kv-tokens",
        "1024",
        "--kv-store-dir",
        where,
    )
    health = httpx.get(srv.base + "/health", timeout=30).json()
    assert "cannot use" in health["store_off"] and where in health["store_off"]
    r = httpx.get(srv.base + "/v1/checkpoints", timeout=30)
    assert r.status_code == 503, r.text
    message = r.json()["error"]["message"]
    assert where in message and "cannot use" in message and "start it with" not in message
    srv.stop()
    (sized,) = [x for x in log(tmp_path / "boot.jsonl") if x["event"] == "store.sized"]
    assert sized["path"] == "unusable" and sized["dir"] == where and "cannot use" in sized["reason"]
