"""The OpenAI-compatible HTTP API over an EngineDriver: the routes, the middleware, and the
app's document; the completion routes are ``service.CompletionService``'s."""

from __future__ import annotations

from typing import Any

import orjson
from fastapi import FastAPI
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from fastapi.routing import APIRoute

from engine.observability import tracing as tr
from engine.observability.metrics import CONTENT_TYPE, ServerMetrics
from engine.server import admin, checkpoints, gate, messages_api, openapi, responses_api, tokenize
from engine.server.driver import EngineDriver
from engine.server.frontdoor import FrontDoor
from engine.server.limits import HttpLimits
from engine.server.loop_watch import LoopWatch
from engine.server.protocol import ChatCompletionRequest, CompletionRequest, check_model
from engine.server.response_store import ResponseStore
from engine.server.responses import error_response, install_error_handlers
from engine.server.service import CompletionService

VERSION = "0.1.0"


def health(driver: EngineDriver, watch: LoopWatch) -> Response:
    """200 with the pool's gauges, the scheduler process's pid and its heartbeat's age, this
    process's event loop (its lag and stalls) and a store given but off (why) while serving; 503 naming why not: dead, stopping,
    or silent past ``driver.stall_s`` (stalled)."""
    beat = {
        "scheduler_pid": driver.pid,
        "heartbeat_age_s": round(driver.heartbeat_age(), 3),
        **watch.health(),
    }
    if driver.dead:
        return error_response(f"scheduler is not running: {driver.dead}", 503)
    if driver.stopping:
        return error_response(f"server is shutting down ({driver.stopping})", 503)
    if (age := driver.stalled()) is not None:
        message = (
            f"scheduler stalled: no heartbeat from the scheduler process (pid "
            f"{driver.pid}) for {age:.1f} s (limit {driver.stall_s:g} s)"
        )
        body = orjson.loads(error_response(message, 503).body)
        return JSONResponse({**body, **beat}, status_code=503)
    # a --kv-store-dir given that the store does not use: why (said once, at boot)
    off = {"store_off": driver.info.store_off} if driver.info and driver.info.store_off else {}
    return JSONResponse({"status": "ok", **beat, **driver.stats().gauges(), **off})


def model_card(driver: EngineDriver, served_name: str) -> dict[str, Any]:
    """The one model this server serves, as ``GET /v1/models`` lists it."""
    return {
        "id": served_name,
        "object": "model",
        "created": 0,
        "owned_by": "attest",
        "max_model_len": driver.max_context,
    }


def model_list(driver: EngineDriver, served_name: str) -> dict[str, Any]:
    return {"object": "list", "data": [model_card(driver, served_name)]}


def serve_head(app: FastAPI) -> None:
    """HEAD wherever GET is served (RFC 9110 9.3.2): the GET's route, status and headers; the
    server sends no body for a HEAD. Left out of the document, as HEAD goes with GET."""
    for route in list(app.routes):
        if isinstance(route, APIRoute) and "GET" in route.methods:
            app.add_api_route(
                route.path,
                route.endpoint,
                methods=["HEAD"],
                response_class=route.response_class,
                include_in_schema=False,
            )


def mount_models(app: FastAPI, driver: EngineDriver, served_name: str) -> None:
    """The version and the one model served (``/version``, ``/v1/models``)."""

    @app.get("/version")
    async def _version() -> dict[str, str]:
        return {"version": VERSION}

    @app.get("/v1/models")
    async def _models() -> dict[str, Any]:
        return model_list(driver, served_name)

    @app.get("/v1/models/{model:path}")
    async def _model(model: str) -> dict[str, Any]:
        check_model(model, served_name)
        return model_card(driver, served_name)


def create_app(
    driver: EngineDriver,
    served_model_name: str,
    api_key: str | None = None,
    tracing: tr.Tracing = tr.DISABLED,
    limits: HttpLimits | None = None,
    bind_host: str | None = None,
) -> FrontDoor:
    """The HTTP app over a started driver (the scheduler process is already up), every error it
    answers on the record (``FrontDoor``). ``limits``: the body's time and size, the request
    deadline, the hosts and origins served, the loop's stall limit (defaults: ``HttpLimits()``);
    ``bind_host``: the address or name the server was bound to."""
    limits = limits or HttpLimits()
    watch = LoopWatch(limits.loop_stall_timeout, driver)
    app = FastAPI(
        title="Attest", version=VERSION, responses=openapi.ERRORS, lifespan=watch.lifespan
    )
    metrics = ServerMetrics(
        driver.stats,
        lambda: (watch.stalls, watch.lag_s),
        lambda: (not driver.dead, driver.heartbeat_age()),
        served_model_name,
    )
    service = CompletionService(driver, metrics, served_model_name, tracing, limits)

    app.middleware("http")(gate.guard(api_key))
    policy = gate.BrowserPolicy.of(limits.allowed_hosts, limits.allowed_origins, bind_host)
    gate.install(app, policy)  # in front of the guard: Host, Origin, CORS

    install_error_handlers(app)

    @app.get("/health")
    async def _health() -> Response:
        return health(driver, watch)

    @app.get("/metrics", response_class=PlainTextResponse)
    async def _metrics() -> Response:
        return Response(metrics.render(), media_type=CONTENT_TYPE)

    mount_models(app, driver, served_model_name)
    admin.mount(app, driver, metrics, limits)
    app.post("/v1/completions", **openapi.body(CompletionRequest, streams=True))(
        service.completions
    )
    app.post("/v1/chat/completions", **openapi.body(ChatCompletionRequest, streams=True))(
        service.chat
    )
    tokenize.mount(app, service)
    checkpoints.mount(app, service)
    messages_api.mount(app, service)
    # beside the durable store when it is in use (one given but off: in memory, as its KV)
    off = driver.info is not None and driver.info.store_off is not None
    store_dir = None if off else driver.config.store.kv_store_dir
    stored = ResponseStore.beside(store_dir, limits.max_stored_responses, driver)
    responses_api.mount(app, service, stored)
    serve_head(app)
    bodies = [
        CompletionRequest,
        ChatCompletionRequest,
        *tokenize.BODIES,
        *checkpoints.BODIES,
        *messages_api.BODIES,
        *responses_api.BODIES,
    ]
    openapi.publish(app, bodies, served_model_name, driver.vocab_size)
    fields = frozenset(name for body in bodies for name in body.model_fields)
    return FrontDoor(app, driver, metrics, fields)
