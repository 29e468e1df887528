"""The admin routes: ``POST /admin/cutover`` (a live change of weights, pool size or a group's
layout) and
``DELETE /admin/cutover/{id}`` (cancel the one under way).

The body is ``{"kind": "weights" | "pool" | "layout", "mode": "drain" | "carry", "path": ...,
"kv_tokens": N, "promises": "refuse" | "cap", "tp": N, "pp": M}``; the answer comes when the cutover has ended, with its
``cutover.end`` fields: 200 when it was done, else the error body (400 bad input or not enough
memory for the new pool; 409 another cutover under way, promises a smaller pool would break
(named under ``cutover.promises``), or cancelled; 500 failed; 503 the engine stopped first; 504
past ``--cutover-timeout``) with those fields under ``cutover`` (a failure's reason, an
exception's text, goes to stderr instead). A cancel answers 200 with the
cancelled cutover's end, or 404 when no cutover of that id is under way. The API key guards
``/admin`` as it guards ``/v1``.
"""

from __future__ import annotations

import asyncio
import sys
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response

from engine.observability.metrics import ServerMetrics
from engine.request.messages import CancelCutover, Cutover
from engine.server.driver import EngineDriver
from engine.server.errors import ProtocolError, error_body
from engine.server.limits import HttpLimits, json_object, read_body
from engine.server.responses import error_response

_FIELDS = {
    "kind": str,
    "mode": str,
    "path": str,
    "kv_tokens": int,
    "promises": str,
    "tp": int,
    "pp": int,
}


def parse_cutover(body: bytes) -> dict[str, Any]:
    """The cutover asked for; a ProtocolError (400, naming the field) when malformed. What the
    values mean (a known kind, a file that exists, a pool that fits) the scheduler decides."""
    data = json_object(body)
    if extra := sorted(set(data) - set(_FIELDS)):
        raise ProtocolError(f"unknown field {extra[0]!r}", extra[0])
    for name in ("kind", "mode"):
        if name not in data:
            raise ProtocolError(f"{name!r} is required", name)
    for name, typ in _FIELDS.items():
        v = data.get(name)
        if v is not None and (not isinstance(v, typ) or isinstance(v, bool)):
            raise ProtocolError(f"{name!r} must be a {typ.__name__}", name)
    return {name: data.get(name) for name in _FIELDS}


def mount(app: FastAPI, driver: EngineDriver, metrics: ServerMetrics, limits: HttpLimits) -> None:
    """The admin routes on ``app``: an operator's, not the API's (left out of its document)."""

    @app.post("/admin/cutover", include_in_schema=False)
    async def _cutover(request: Request) -> Response:
        return await cutover(request, driver, metrics, limits)

    @app.delete("/admin/cutover/{cid}", include_in_schema=False)
    async def _cancel(cid: str) -> Response:
        return await cancel(cid, driver, metrics)


async def cutover(
    request: Request, driver: EngineDriver, metrics: ServerMetrics, limits: HttpLimits
) -> Response:
    try:
        ask = parse_cutover(await read_body(request, limits))
        ask["promises"] = ask.get("promises") or "refuse"
        fut = driver.ask(lambda ticket: Cutover(ticket=ticket, **ask))
    except ProtocolError as e:
        return error_response(str(e), e.status, e.param)
    except RuntimeError as e:
        return error_response(str(e), 503)
    return await _answer(fut, metrics)


async def cancel(cid: str, driver: EngineDriver, metrics: ServerMetrics) -> Response:
    try:
        fut = driver.ask(lambda ticket: CancelCutover(id=cid, ticket=ticket))
    except RuntimeError as e:
        return error_response(str(e), 503)
    return await _answer(fut, metrics, counted=False)


async def _answer(fut: Any, metrics: ServerMetrics, counted: bool = True) -> Response:
    """The cutover's end as the HTTP answer (``counted``: its ending goes into /metrics; a
    cancel's answer repeats an ending the cutover's own answer already counted)."""
    try:
        fields = await asyncio.wrap_future(fut)
    except RuntimeError as e:
        return error_response(str(e), 503)
    status = int(fields.get("status", 200))
    if counted and status != 404:
        metrics.cutover(fields)
    if status == 200:
        return JSONResponse(fields)
    reason = str(fields.get("reason", "cutover refused"))
    if status == 500:  # an exception's text: its paths and addresses are for stderr and the log
        print(f"attest: cutover {fields.get('id')} failed: {reason}", file=sys.stderr, flush=True)
        kind = reason.split(": ", 1)[0]
        reason = (
            f"the cutover failed ({kind if kind.isidentifier() else 'an error'}); the "
            "server's stderr and its cutover.end receipt say why"
        )
        fields = {k: v for k, v in fields.items() if k != "reason"}
    body = error_body(reason, status)
    return JSONResponse({**body, "cutover": fields}, status_code=status)
