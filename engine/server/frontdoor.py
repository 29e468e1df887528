"""The front door on the record: every error the HTTP app answers becomes a ``request.rejected``
receipt in the boot log and a count in ``/metrics``.

``FrontDoor`` wraps the whole app, outside Starlette's own error middleware, so it sees each
answer's status as it is sent and, for an unhandled exception, the exception itself: its
traceback goes into the receipt (and on stderr, as before), never to the client. One wrapper
sees every path that answers an error (the middleware's refusals, the error handlers, a route
returning an error, a crash), so none can be left off the record by being written elsewhere.
A client that went away (499) is not a refusal; a stream that fails after its 200 has started
is recorded as the 500 it is. What the HTTP protocol refuses before the app sees a request (a
head past its bounds, headers too slow, two framings, a client over its connection cap) is
recorded the same way through ``refused``.
"""

from __future__ import annotations

import traceback
from collections.abc import Awaitable, Callable, MutableMapping
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any, Protocol

import orjson
from starlette.routing import Match

from engine.observability import schema
from engine.observability.clip import clip_words
from engine.server.errors import REFUSED_FIELD

ERROR_BODY_BYTES = 1 << 16  # an error body is read this far for its message (ours are small)
REASON_CHARS = 500  # the message a client was told, about this long at most in a receipt
PATH_CHARS = 200  # a raw path in a receipt (an unmatched route's path is the client's text)
TRACEBACK_CHARS = 6000  # a traceback's last characters (where the error is)
UNMATCHED = "unmatched"  # the route of a request that matched none (its 404)
UNPARSED = "unparsed"  # the route of a request refused before its request line was read
GONE = 499  # a client that went away: nobody was refused

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


class Recorder(Protocol):
    """Where the frontend's receipts go (``EngineDriver.record``)."""

    def record(self, kind: str, **fields: Any) -> None: ...


class RejectionCounter(Protocol):
    """The count of refusals in ``/metrics`` (``ServerMetrics.rejected``)."""

    def rejected(self, route: str, status: int, field: str) -> None: ...


class Routed(Protocol):
    """The app whose routes name a refusal (a FastAPI app)."""

    routes: list[Any]

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None: ...


@dataclass(slots=True)
class _Answer:
    status: int = 0
    body: bytes = b""


def told(body: bytes, status: int) -> tuple[str, str | None]:
    """The message and the field an error body told its client, else the status's phrase.
    Both error shapes this server answers carry ``error.message``: OpenAI's (with
    ``error.param``, the field) and Anthropic's (on its Messages API's routes; no place for the
    field: the front door reads it from the request's state, ``errors.REFUSED_FIELD``)."""
    try:
        err = orjson.loads(body)["error"]
        message, param = err["message"], err.get("param")
        if isinstance(message, str):
            return message, param if isinstance(param, str) else None
    except (orjson.JSONDecodeError, KeyError, TypeError):
        pass
    try:
        return HTTPStatus(status).phrase, None
    except ValueError:
        return f"status {status}", None


def field_label(param: str | None, known: frozenset[str]) -> str:
    """A bounded label for ``/metrics``: the top-level request field a refusal names (``none``
    when it names none, ``other`` for a name no request body has: a client may send any)."""
    if not param:
        return "none"
    top = param.replace("[", ".").split(".", 1)[0]
    return top if top in known else "other"


class FrontDoor:
    """The HTTP app with every error answer recorded: a ``request.rejected`` receipt (through
    ``recorder``) and a count (``counter``) by route, status and field (``fields``: the top-level
    fields of the request bodies, which bound the label)."""

    def __init__(
        self, app: Routed, recorder: Recorder, counter: RejectionCounter, fields: frozenset[str]
    ) -> None:
        self.app = app
        self.recorder = recorder
        self.counter = counter
        self.fields = fields

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        seen = _Answer()

        async def watch(message: Message) -> None:
            if message["type"] == "http.response.start":
                seen.status = message["status"]
            elif message["type"] == "http.response.body" and seen.status >= 400:
                room = ERROR_BODY_BYTES - len(seen.body)
                seen.body += bytes(message.get("body", b""))[: max(0, room)]
            await send(message)

        try:
            await self.app(scope, receive, watch)
        except Exception as e:
            status = seen.status if seen.status >= 500 else 500
            text = "".join(traceback.format_exception(e))[-TRACEBACK_CHARS:]
            self._rejected(scope, status, f"internal error: {type(e).__name__}", None, text)
            raise
        if seen.status >= 400 and seen.status != GONE:
            reason, param = told(seen.body, seen.status)
            if param is None:  # Anthropic's shape has no place for it: the request's state
                param = (scope.get("state") or {}).get(REFUSED_FIELD)
            self._rejected(scope, seen.status, reason, param, None)

    def refused(self, method: str, path: str, status: int, reason: str) -> None:
        """The record of a refusal the HTTP protocol answered itself, before the app saw the
        request (``limits.GuardedH11Protocol``): ``path`` "" where its line was not read."""
        scope = {"type": "http", "method": method, "path": path, "root_path": ""}
        self._rejected(scope, status, reason, None, None)

    def _rejected(
        self, scope: Scope, status: int, reason: str, param: str | None, trace: str | None
    ) -> None:
        """Never raises: the record of an answer must not change the answer."""
        try:
            route = self._route(scope)
            fields: dict[str, Any] = {
                "method": scope.get("method", ""),
                "route": route,
                "status": status,
                "reason": clip_words(reason, REASON_CHARS),
                "path": str(scope.get("path", ""))[:PATH_CHARS],
                "field": param,
            }
            if trace is not None:
                fields["traceback"] = trace
            self.recorder.record(schema.REQUEST_REJECTED, **fields)
            self.counter.rejected(route, status, field_label(param, self.fields))
        except Exception:
            pass

    def _route(self, scope: Scope) -> str:
        """The template of the route the request matched (refused before routing: the one it
        would have), else ``unmatched``."""
        if not scope.get("path"):
            return UNPARSED
        route = scope.get("route")
        if route is None:
            for r in self.app.routes:
                if r.matches(scope)[0] != Match.NONE:
                    route = r
                    break
        return getattr(route, "path", None) or UNMATCHED
