"""The front door on the record: every error answer of a real FastAPI app wrapped in
``FrontDoor`` is a ``request.rejected`` receipt and a count, an unhandled exception's with its
traceback (never sent to the client); and the loop watch writes ``frontend.stall`` while the loop
still stands, naming where, then ``frontend.resume``."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from pydantic import BaseModel

from engine.observability import schema
from engine.server.errors import ProtocolError
from engine.server.frontdoor import FrontDoor, field_label, told
from engine.server.loop_watch import LoopWatch
from engine.server.responses import error_response, install_error_handlers


class _Records:
    def __init__(self) -> None:
        self.got: list[tuple[str, dict[str, Any]]] = []
        self.counted: list[tuple[str, int, str]] = []
        self.lock = threading.Lock()

    def record(self, kind: str, **fields: Any) -> None:
        with self.lock:
            self.got.append((kind, fields))

    def rejected(self, route: str, status: int, field: str) -> None:
        self.counted.append((route, status, field))

    def of(self, kind: str) -> list[dict[str, Any]]:
        with self.lock:
            return [f for k, f in self.got if k == kind]


class _Body(BaseModel):
    prompt: str
    max_tokens: int = 1


def _app(rec: _Records) -> FrontDoor:
    app = FastAPI()
    install_error_handlers(app)

    @app.post("/v1/things/{tid}")
    async def _thing(tid: str) -> dict[str, str]:
        if tid == "bad":
            raise ProtocolError("max_tokens must be at least 1", "max_tokens")
        if tid == "crash":
            raise ValueError("Exceeds the limit (4300 digits) for integer string conversion")
        if tid == "refused":
            return error_response("not today", 409)
        return {"ok": tid}

    @app.post("/v1/messages")
    async def _messages() -> dict[str, str]:
        raise ProtocolError("max_tokens: Field required", "max_tokens")

    return FrontDoor(app, rec, rec, frozenset(_Body.model_fields))


def _client(door: FrontDoor) -> httpx.AsyncClient:
    transport = httpx.ASGITransport(app=door, raise_app_exceptions=False)
    return httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1")


async def _ask(door: FrontDoor, path: str) -> httpx.Response:
    async with _client(door) as client:
        return await client.post(path, json={})


def test_each_error_answer_is_a_receipt_with_what_the_client_was_told():
    rec = _Records()
    door = _app(rec)
    ok = asyncio.run(_ask(door, "/v1/things/fine"))
    bad = asyncio.run(_ask(door, "/v1/things/bad"))
    refused = asyncio.run(_ask(door, "/v1/things/refused"))
    lost = asyncio.run(_ask(door, "/nowhere/at/all"))
    assert (ok.status_code, bad.status_code, refused.status_code, lost.status_code) == (
        200,
        400,
        409,
        404,
    )
    got = rec.of(schema.REQUEST_REJECTED)
    assert [(r["route"], r["status"], r["field"]) for r in got] == [
        ("/v1/things/{tid}", 400, "max_tokens"),
        ("/v1/things/{tid}", 409, None),
        ("unmatched", 404, None),
    ]
    assert got[0]["reason"] == "max_tokens must be at least 1"
    assert got[2]["path"] == "/nowhere/at/all" and "no such route" in got[2]["reason"]
    assert all("traceback" not in r and r["method"] == "POST" for r in got)
    assert rec.counted == [
        ("/v1/things/{tid}", 400, "max_tokens"),
        ("/v1/things/{tid}", 409, "none"),
        ("unmatched", 404, "none"),
    ]
    for r in got:  # every receipt carries what its kind requires
        assert schema.missing_fields(schema.REQUEST_REJECTED, r) == []


def test_an_unhandled_exception_is_a_500_whose_traceback_is_recorded_not_sent():
    rec = _Records()
    res = asyncio.run(_ask(_app(rec), "/v1/things/crash"))
    assert res.status_code == 500
    assert "Traceback" not in res.text and "4300" not in res.text
    (got,) = rec.of(schema.REQUEST_REJECTED)
    assert got["status"] == 500 and got["reason"] == "internal error: ValueError"
    assert "Traceback (most recent call last)" in got["traceback"]
    assert "for integer string conversion" in got["traceback"] and "_thing" in got["traceback"]


def test_a_refusal_before_routing_names_the_route_it_would_have_taken():
    rec = _Records()
    app = FastAPI()
    install_error_handlers(app)

    @app.middleware("http")
    async def _guard(request: Any, call_next: Any) -> Any:
        return error_response("invalid or missing API key", 401)

    @app.get("/v1/models")
    async def _models() -> dict[str, str]:
        return {}

    door = FrontDoor(app, rec, rec, frozenset())

    async def go() -> int:
        async with _client(door) as client:
            return (await client.get("/v1/models")).status_code

    assert asyncio.run(go()) == 401
    (got,) = rec.of(schema.REQUEST_REJECTED)
    assert (got["route"], got["method"], got["status"]) == ("/v1/models", "GET", 401)


def test_an_error_in_anthropics_shape_is_a_receipt_with_what_the_client_was_told():
    rec = _Records()
    r = asyncio.run(_ask(_app(rec), "/v1/messages"))
    said = {"type": "invalid_request_error", "message": "max_tokens: Field required"}
    assert (r.status_code, r.json()) == (400, {"type": "error", "error": said})
    (got,) = rec.of(schema.REQUEST_REJECTED)
    assert (got["route"], got["status"], got["field"]) == ("/v1/messages", 400, "max_tokens")
    assert got["reason"] == "max_tokens: Field required"  # not the status's phrase
    assert rec.counted == [("/v1/messages", 400, "max_tokens")]
    body = b'{"type": "error", "error": {"type": "not_found_error", "message": "no model m"}}'
    assert told(body, 404) == ("no model m", None)


def test_the_field_label_is_bounded_by_the_request_bodies_fields():
    known = frozenset({"messages", "logit_bias"})
    assert field_label("messages.0.content", known) == "messages"
    assert field_label("logit_bias[12]", known) == "logit_bias"
    assert field_label("a_field_the_client_invented", known) == "other"
    assert field_label(None, known) == "none"
    assert told(b"not json", 413) == ("Request Entity Too Large", None)
    assert told(b'{"error": {"message": "m", "param": "p"}}', 400) == ("m", "p")


def _hold_the_loop(rec: _Records, limit: float) -> bool:
    """Block the loop's thread (a check that grew with its input) until the watch has written
    the stall, or a minute: whether it was written while the loop still stood."""
    give_up = time.monotonic() + 60
    while time.monotonic() < give_up:
        if rec.of(schema.FRONTEND_STALL):
            return True
        time.sleep(limit / 10)
    return False


def test_a_loop_that_stands_is_on_the_record_while_it_stands_and_when_it_turns_again():
    rec = _Records()
    watch = LoopWatch(0.2, rec, interval_s=0.02)

    async def scenario() -> bool:
        task = asyncio.ensure_future(watch.run())
        await asyncio.sleep(0.1)
        written_while_blocked = _hold_the_loop(rec, 0.2)
        await asyncio.sleep(0.1)  # the loop turns again
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        return written_while_blocked

    assert asyncio.run(scenario())
    (stall,) = rec.of(schema.FRONTEND_STALL)
    assert stall["limit_s"] == 0.2 and "_hold_the_loop" in stall["stack"]
    (resume,) = rec.of(schema.FRONTEND_RESUME)
    assert resume["stalled_s"] > 0.2
    assert watch.stalls == 1 and watch.health()["loop_stalls"] == 1
    assert watch.health()["loop_worst_lag_s"] >= 0.2


def test_a_loop_that_keeps_turning_writes_nothing():
    rec = _Records()
    watch = LoopWatch(5.0, rec, interval_s=0.01)
    assert watch.check() is False
    watch.turn()
    assert rec.got == [] and watch.stalls == 0


def test_a_stall_too_short_for_the_thread_to_see_is_written_when_the_loop_turns_again():
    rec = _Records()
    watch = LoopWatch(0.05, rec, interval_s=0.01)
    watch.turn()
    time.sleep(0.3)  # the loop's thread held past the limit; no watching thread runs here
    watch.turn()
    (stall,) = rec.of(schema.FRONTEND_STALL)
    assert stall["stack"] == "" and stall["limit_s"] == 0.05
    (resume,) = rec.of(schema.FRONTEND_RESUME)
    assert resume["stalled_s"] >= 0.25 and watch.stalls == 1


def test_a_refusal_the_protocol_answered_itself_is_recorded_by_what_was_read_of_it():
    rec = _Records()
    door = _app(rec)
    door.refused("", "", 431, "request head exceeds 32768 bytes")
    door.refused("POST", "/v1/things/7", 400, "two framings")
    got = rec.of(schema.REQUEST_REJECTED)
    assert [(r["route"], r["method"], r["status"]) for r in got] == [
        ("unparsed", "", 431),
        ("/v1/things/{tid}", "POST", 400),
    ]
    assert rec.counted == [("unparsed", 431, "none"), ("/v1/things/{tid}", 400, "none")]
