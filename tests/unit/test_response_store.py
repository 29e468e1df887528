"""The stored responses of /v1/responses: in memory within the bound (the least recently used
dropped first, each drop a ``response.evict`` receipt, its 404 saying why), or as files beside
the durable store that a new process reads back (written whole or not at all)."""

from __future__ import annotations

import pytest

from engine.server.errors import ProtocolError
from engine.server.response_store import ResponseStore


class Receipts:
    def __init__(self) -> None:
        self.rows: list[tuple[str, dict]] = []

    def record(self, kind: str, **fields) -> None:
        self.rows.append((kind, fields))

    def notice(self, key: str, text: str, **fields) -> None:
        self.rows.append(("notice", {"key": key, "text": text, **fields}))


def record(n: int) -> dict:
    return {"response": {"id": f"resp_{n:x}"}, "history": [], "input": [], "checkpoint": None}


def test_the_bound_drops_the_least_recently_used_with_a_receipt():
    seen = Receipts()
    store = ResponseStore(None, 2, seen)
    store.put("resp_a", record(10))
    store.put("resp_b", record(11))
    assert store.get("resp_a")["response"]["id"] == "resp_a"  # a use: b is the oldest now
    store.put("resp_c", record(12))
    assert seen.rows == [
        ("response.evict", {"id": "resp_b", "reason": "bound", "bound": 2, "stored": 2})
    ]
    for kept in ("resp_a", "resp_c"):
        store.get(kept)
    with pytest.raises(ProtocolError) as e:
        store.get("resp_b", "previous_response_id")
    assert e.value.status == 404 and e.value.param == "previous_response_id"
    assert "resp_b" in str(e.value) and "dropped" in str(e.value)
    assert "--max-stored-responses" in str(e.value)


def test_an_id_never_seen_in_memory_is_a_404_that_says_a_restart_forgets():
    store = ResponseStore(None, 5, Receipts())
    with pytest.raises(ProtocolError) as e:
        store.get("resp_0f")
    assert e.value.status == 404 and "resp_0f" in str(e.value)
    assert "in memory" in str(e.value) and "restart" in str(e.value)


def test_files_beside_the_store_are_read_back_by_a_new_process(tmp_path):
    first = ResponseStore.beside(str(tmp_path), 1, Receipts())
    for n in range(3):  # no bound on disk
        first.put(f"resp_{n:x}", record(n))
    (tmp_path / "responses" / "resp_9.tmp").write_bytes(b'{"half')  # a write a crash cut
    again = ResponseStore.beside(str(tmp_path), 1, Receipts())
    assert [again.get(f"resp_{n:x}")["response"]["id"] for n in range(3)] == [
        "resp_0",
        "resp_1",
        "resp_2",
    ]
    assert not (tmp_path / "responses" / "resp_9.tmp").exists()
    assert again.delete("resp_1")["response"]["id"] == "resp_1"
    assert not (tmp_path / "responses" / "resp_1.json").exists()
    for missing in ("resp_1", "../../etc/passwd", "resp_ZZ"):
        with pytest.raises(ProtocolError) as e:
            again.get(missing)
        assert e.value.status == 404 and missing in str(e.value)


def test_a_responses_folder_that_is_a_link_is_not_followed(tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (tmp_path / "store").mkdir()
    (tmp_path / "store" / "responses").symlink_to(elsewhere)
    seen = Receipts()
    store = ResponseStore.beside(str(tmp_path / "store"), 3, seen)
    assert not store.durable and seen.rows[0][1]["key"] == "responses_in_memory"
    store.put("resp_1", record(1))
    assert list(elsewhere.iterdir()) == []  # nothing written through the link
    (elsewhere / "resp_2.json").write_bytes(b"{}")
    (tmp_path / "other").mkdir()
    files = ResponseStore.beside(str(tmp_path / "other"), 3, seen)
    (tmp_path / "other" / "responses" / "resp_2.json").symlink_to(elsewhere / "resp_2.json")
    with pytest.raises(ProtocolError):
        files.get("resp_2")  # a link in the folder is not read either
