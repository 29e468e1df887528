"""What a client reads when the server fails (5xx) says what happened, never where: no source
path and no address of the machines behind it. The whole text goes to the operator's stderr.

The lost rank travels the real way: the scheduler loop catches the collective's failure and
sends its death over the pipe, the driver's reader takes it and fails every waiting request,
and the bodies are the ones the routes answer with."""

from __future__ import annotations

import asyncio
import threading
import time
from concurrent.futures import Future
from types import SimpleNamespace

import orjson
from fastapi import FastAPI
from starlette.requests import Request
from starlette.testclient import TestClient

from engine.config import EngineConfig
from engine.group.comm import GroupFailure
from engine.observability.metrics import ServerMetrics
from engine.request.messages import PoolSnapshot
from engine.request.sampling_params import SamplingParams
from engine.server import admin
from engine.server.app import health
from engine.server.driver import EngineDriver
from engine.server.job import Job, JobFailed
from engine.server.limits import HttpLimits
from engine.server.loop_watch import LoopWatch
from engine.server.responses import error_response, install_error_handlers, stream
from engine.server.scheduler_proc import _serve_loop

GLOO = (
    "all_reduce failed on rank 0: [/usr/lib/python3/dist-packages/torch/gloo/transport/tcp/"
    "pair.cc:534] Connection closed by peer [10.0.0.1]:29500"
)
INTERNALS = ("/usr/lib", "pair.cc", "10.0.0.1", "29500", "gloo")


class LostRank:
    """The scheduler's engine, as far as the serve loop sees it: work to do, and a step whose
    collective fails."""

    scheduler = SimpleNamespace(
        has_work=lambda: True, grammars=SimpleNamespace(pending=lambda: False, poll=lambda: [])
    )

    def step(self) -> list:
        raise GroupFailure(GLOO)


def _plain(text: str) -> None:
    assert not [x for x in INTERNALS if x in text], text


async def _bodies(driver: EngineDriver) -> list[str]:
    """The error messages a client reads once the scheduler has lost a rank."""
    metrics = ServerMetrics(lambda: PoolSnapshot())
    params = SamplingParams(max_tokens=2)
    waiting = [Job(driver, metrics, f"cmpl-{k}", [1, 2], params, 1, time.time_ns()) for k in "ab"]
    for job in waiting:
        job.submit()
    reader = threading.Thread(target=driver._read)
    reader.start()  # it reads the death already in the pipe and fails both jobs
    messages = []
    try:
        async for _ in waiting[0].events():
            pass
    except JobFailed as e:
        messages.append(orjson.loads(error_response(str(e), e.status).body)["error"]["message"])
    events = [x async for x in stream(waiting[1], "text", {}, False)]
    messages.append(orjson.loads(events[-2][6:])["error"]["message"])
    reader.join(10)
    watch = LoopWatch(2.0, driver)
    messages.append(orjson.loads(health(driver, watch).body)["error"]["message"])
    late = Job(driver, metrics, "cmpl-c", [1, 2], params, 1, time.time_ns())
    try:
        late.submit()
    except JobFailed as e:
        messages.append(str(e))
    return messages


def test_a_lost_rank_reaches_clients_as_plain_words_and_stderr_in_full():
    said: list[str] = []
    driver = EngineDriver(EngineConfig.from_kwargs(), on_dead=said.append)
    driver._proc = SimpleNamespace(join=lambda timeout: None, exitcode=1, pid=0)  # this test
    _serve_loop(LostRank(), driver._child)  # sends the death, as the scheduler process does
    messages = asyncio.run(_bodies(driver))
    assert len(messages) == 4, messages
    for m in messages:
        _plain(m)
        assert "the scheduler lost a rank; the server cannot serve" in m, m
    assert len(said) == 1 and GLOO in said[0]  # what launch prints on stderr


def test_a_cutover_that_failed_answers_500_without_the_exception_text(capsys):
    """A failed cutover's reason is an exception's text (a path that would not load, a device's
    address); the operator reads it on stderr and in the boot log's ``cutover.end``."""
    fields = {"outcome": "failed", "status": 500, "reason": f"RuntimeError: {GLOO}", "id": 3}
    done: Future = Future()
    done.set_result(fields)
    driver = SimpleNamespace(ask=lambda message: done)
    metrics = SimpleNamespace(cutover=lambda fields: None)
    body = b'{"kind": "pool", "mode": "drain", "kv_tokens": 512}'

    async def receive() -> dict:
        return {"type": "http.request", "body": body, "more_body": False}

    request = Request(
        {
            "type": "http",
            "method": "POST",
            "path": "/admin/cutover",
            "headers": [(b"content-length", str(len(body)).encode())],
        },
        receive,
    )
    r = asyncio.run(admin.cutover(request, driver, metrics, HttpLimits()))
    assert r.status_code == 500
    _plain(r.body.decode())
    answer = orjson.loads(r.body)
    assert "the cutover failed (RuntimeError)" in answer["error"]["message"], answer
    assert answer["cutover"]["outcome"] == "failed" and answer["cutover"]["id"] == 3
    assert GLOO in capsys.readouterr().err


def test_an_unexpected_error_is_a_500_naming_its_type_not_its_text():
    app = FastAPI()
    install_error_handlers(app)

    @app.get("/boom")
    async def _boom() -> None:
        raise FileNotFoundError(f"[Errno 2] {GLOO}")

    with TestClient(app, raise_server_exceptions=False) as client:
        r = client.get("/boom")
    assert r.status_code == 500
    _plain(r.text)
    assert r.json()["error"]["message"] == "internal error: FileNotFoundError"
