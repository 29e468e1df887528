"""The HTTP limits a client cannot talk its way past: how long it may take to send a request (its
headers, then its body), how many connections one address may hold open, and the request's
deadline. uvicorn bounds neither header nor body time (a client that declares 100 bytes and
sends 20 holds its connection forever) and caps connections only for the whole server, so the
first two live here: the body read in ``read_body``, the rest in ``protocol_class``, uvicorn's
HTTP/1.1 protocol with a header timer and a count of connections per address. Two bodies are
refused unread: one framed both by Content-Length and by Transfer-Encoding (``_one_framing``),
and one in a Content-Encoding (``refuse_encoded``). A head past its bounds (``head_bounds``) is
refused before it is parsed, and a chunk size past the body's bound as it arrives.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Callable
from dataclasses import asdict, dataclass
from http import HTTPStatus
from typing import Any, ClassVar

import h11
import orjson
from starlette.requests import ClientDisconnect, Request
from uvicorn.protocols.http.h11_impl import H11Protocol

from engine.config import EngineConfig, ServerSection
from engine.server import head_bounds as hb
from engine.server.errors import ProtocolError, error_body

MAX_BODY_BYTES = 4 * 1024 * 1024
LINGER_S = 5.0  # the most a refused body's rest is read and dropped after the answer
# a chunk size no body can have: nginx's bound (a signed 64-bit length), malformed past it
CHUNK_SIZE_LIMIT = 2**63
REFUSED = "attest.refused"  # the scope's key that tells the app the protocol refused its request


@dataclass(frozen=True, slots=True)
class HttpLimits(ServerSection):
    """The server section's limits (declared, defaulted and checked there), the most a request
    body may hold, and a request head's bounds (``head_bounds``)."""

    max_body_bytes: int = MAX_BODY_BYTES
    max_head_bytes: int = hb.MAX_HEAD_BYTES
    max_line_bytes: int = hb.MAX_LINE_BYTES
    max_header_fields: int = hb.MAX_HEADER_FIELDS

    @classmethod
    def of(cls, cfg: EngineConfig) -> HttpLimits:
        return cls(**asdict(cfg.server))


class ClientGone(Exception):
    """The client hung up before its request was read: said in one line, never a traceback."""


def went_away(request: Request, what: str) -> None:
    """One line on stderr for a client that left: an ordinary event, not a crash. A connection
    the protocol closed on a refusal (``GuardedH11Protocol._refuse``) did not leave: no line."""
    if request.scope.get(REFUSED):
        return
    client = request.client
    who = f"{client.host}:{client.port}" if client else "a client"
    print(
        f"attest: {who} went away {what} ({request.method} {request.url.path}); nothing was queued",
        file=sys.stderr,
        flush=True,
    )


def refuse_encoded(request: Request) -> None:
    """A body in any Content-Encoding but identity is refused (415), not read as if it were
    plain. Nothing needs one (OpenAI's clients send plain JSON), and decoding would need a cap
    on the decoded size besides the one on the sent size: a few KB of gzip inflate to GBs."""
    sent = ",".join(request.headers.getlist("content-encoding")).lower().split(",")
    codings = [c.strip() for c in sent if c.strip() not in ("", "identity")]
    if codings:
        raise ProtocolError(
            f"Content-Encoding {', '.join(codings)} is not accepted: only identity (an "
            "uncompressed body) is",
            None,
            415,
        )


def json_object(body: bytes) -> dict[str, Any]:
    """A request body parsed as a JSON object; a ProtocolError (400) saying what it is not."""
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError as e:
        raise ProtocolError(f"request body is not valid JSON: {e}") from e
    if not isinstance(data, dict):
        raise ProtocolError("request body must be a JSON object")
    return data


async def read_json(request: Request, limits: HttpLimits) -> dict[str, Any]:
    """The body (``read_body``) as a JSON object; a ProtocolError (400) saying what it is not."""
    return json_object(await read_body(request, limits))


async def read_body(request: Request, limits: HttpLimits) -> bytes:
    """The whole body, within ``max_body_bytes`` (413) and ``read_timeout`` (408), in no
    Content-Encoding but identity (415, ``refuse_encoded``)."""
    refuse_encoded(request)
    body = bytearray()
    declared = request.headers.get("content-length")
    try:
        async with asyncio.timeout(limits.read_timeout):
            async for part in request.stream():  # bounded even when no length was declared
                body += part
                if len(body) > limits.max_body_bytes:
                    raise ProtocolError(
                        f"request body exceeds {limits.max_body_bytes} bytes", None, 413
                    )
    except TimeoutError:
        of = f" of the {declared} declared" if declared else ""
        raise ProtocolError(
            f"request body not received within {limits.read_timeout:g} s (got {len(body)} "
            f"bytes{of}); send the whole body at once",
            None,
            408,
        ) from None
    except ClientDisconnect:
        of = f" of {declared}" if declared else ""
        raise ClientGone(f"while sending its request body ({len(body)}{of} bytes)") from None
    return bytes(body)


def raw_error(status: int, reason: str, message: str) -> bytes:
    """A whole HTTP/1.1 error response that closes the connection, for the protocol level where
    no request (or no valid one) was read."""
    body = orjson.dumps(error_body(message, status))
    head = (
        f"HTTP/1.1 {status} {reason}\r\ncontent-type: application/json\r\n"
        f"content-length: {len(body)}\r\nconnection: close\r\n\r\n"
    )
    return head.encode() + body


class LingeringTransport:
    """A connection's transport whose ``close`` lingers while the client is still sending a body
    the server will never read (it was refused: 413, 408). Closing a socket with unread bytes
    makes the kernel answer them with a reset, and a reset destroys the refusal the client has
    not read yet. So, as web servers do: send the answer and a FIN (half-close), read and drop
    what the client still sends until it closes or ``linger_s`` passes, then close."""

    def __init__(self, transport: asyncio.Transport, sending_body: Any, linger_s: float) -> None:
        self._transport, self._sending_body, self._linger_s = transport, sending_body, linger_s
        self.lingering = False

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)

    def close(self) -> None:
        t = self._transport
        if self.lingering or t.is_closing():
            return
        if not (self._sending_body() and t.can_write_eof()):
            t.close()
            return
        self.lingering = True
        t.write_eof()  # the answer already written goes out first, then the FIN
        t.resume_reading()
        asyncio.get_running_loop().call_later(self._linger_s, t.close)

    def is_closing(self) -> bool:
        return self.lingering or self._transport.is_closing()


# The record of a refusal the protocol answers itself, before the app sees the request (method
# and path as far as they were read, "" before; the status; the message): FrontDoor.refused.
Refused = Callable[[str, str, int, str], None]


def unrecorded(method: str, path: str, status: int, message: str) -> None:
    """No record of the protocol's refusals (a protocol used without an app's front door)."""


class GuardedH11Protocol(H11Protocol):
    """uvicorn's HTTP/1.1 protocol with a header timer, bounds on a request's head and on its
    chunk sizes, and a cap on the connections one client address holds open; each server has
    its own subclass (``protocol_class``). Each refusal it answers is recorded (``on_refused``)."""

    open_by_host: ClassVar[dict[str, int]]  # this server's open connections, by address
    cap: ClassVar[int]  # 0: no cap
    header_timeout: ClassVar[float]
    http_limits: ClassVar[HttpLimits]
    on_refused: ClassVar[Refused]
    _host = ""
    _timer: asyncio.TimerHandle | None = None
    _armed_at: Any = None
    _heard = False  # bytes arrived since the timer was armed
    _refused = False  # the protocol answered and closes: what the client still sends is dropped

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        linger = min(LINGER_S, self.header_timeout)
        self._meter = self._new_meter()
        super().connection_made(LingeringTransport(transport, self._still_sending, linger))  # type: ignore[arg-type]
        self._host = self.client[0] if self.client else ""
        open_by_host, cap = self.open_by_host, self.cap
        open_by_host[self._host] = open_by_host.get(self._host, 0) + 1
        if cap and open_by_host[self._host] > cap:
            self.app = _over_cap(self._host, cap, self.on_refused)  # 429, then closed
        else:
            self.app = _one_framing(self.app, self.on_refused)
        self._arm()

    def connection_lost(self, exc: Exception | None) -> None:
        left = self.open_by_host.get(self._host, 1) - 1
        if left > 0:
            self.open_by_host[self._host] = left
        else:
            self.open_by_host.pop(self._host, None)
        if self._timer is not None:
            self._timer.cancel()
        super().connection_lost(exc)

    def on_response_complete(self) -> None:
        # the next request's head is measured from its first byte, those that came pipelined
        # behind this one too (h11 holds them and parses them as the next cycle begins)
        self._meter = self._new_meter()
        if self.conn.their_state is h11.DONE:
            self._measure(self.conn.trailing_data[0])
        super().on_response_complete()
        self._arm()  # the next request's headers get the same time

    def data_received(self, data: bytes) -> None:
        if self.transport.lingering:  # the rest of a refused request: dropped
            return
        self._heard = True
        if self.conn.their_state is h11.IDLE and self._measure(data):
            return
        super().data_received(data)
        self._check_chunk()

    def _new_meter(self) -> hb.HeadMeter:
        lim = self.http_limits
        return hb.HeadMeter(lim.max_head_bytes, lim.max_line_bytes, lim.max_header_fields)

    def _measure(self, data: bytes) -> bool:
        """Refuse the head ``data`` belongs to where it is past a bound (before h11 parses it)."""
        fault = self._meter.feed(data)
        if fault is not None:
            self._refuse(fault.status, fault.message, parsed=False)
        return fault is not None

    def _check_chunk(self) -> None:
        """A chunk whose size says the body cannot be taken is refused as its size arrives; h11
        would wait for its bytes until the read timeout (408). A request answered already (its
        body is read on to keep the connection) gets no second answer: its connection closes."""
        left = _chunk_left(self.conn)
        if self.transport.is_closing() or left <= self.http_limits.max_body_bytes:
            return
        if left >= CHUNK_SIZE_LIMIT:
            status = 400
            message = (
                f"malformed HTTP request: chunk size 0x{left:x} is more than any body can "
                f"have (at most 0x{CHUNK_SIZE_LIMIT - 1:x})"
            )
        else:
            status = 413
            message = (
                f"request body exceeds {self.http_limits.max_body_bytes} bytes: a chunk "
                f"declares {left} bytes more"
            )
        self._refuse(status, message, answer=not self.cycle.response_started)

    def _refuse(self, status: int, message: str, answer: bool = True, parsed: bool = True) -> None:
        """Answer ``status`` and close; a request the app was reading is told it was refused
        (``REFUSED``), so its end is not taken for a client that left. ``parsed``: the refused
        request's line was read (its method and path go on the record)."""
        reading = self.cycle is not None and not self.cycle.response_complete
        if reading:
            self.scope[REFUSED] = status
        self._refused = True
        if answer:
            self.transport.write(raw_error(status, HTTPStatus(status).phrase, message))
        self.transport.close()
        said = self.scope if parsed and reading else {}
        self._record(said.get("method", ""), said.get("path", ""), status, message)

    def _record(self, method: str, path: str, status: int, message: str) -> None:
        try:
            self.on_refused(method, path, status, message)
        except Exception:  # the record of an answer never changes the answer
            pass

    def _still_sending(self) -> bool:
        return self._refused or self.conn.their_state is h11.SEND_BODY

    def _arm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._armed_at, self._heard = self.cycle, False
        self._timer = self.loop.call_later(self.header_timeout, self._headers_late)

    def _headers_late(self) -> None:
        # no new request began since the timer was armed: its headers never completed
        if self.cycle is self._armed_at and not self.transport.is_closing():
            if self._heard:  # an idle connection is closed without a word, as keep-alive's
                message = f"request headers not received within {self.header_timeout:g} s"
                self.transport.write(raw_error(408, "Request Timeout", message))
                self._record("", "", 408, message)
            self.transport.close()

    def send_400_response(self, msg: str) -> None:
        self._refuse(400, f"malformed HTTP request: {msg}", parsed=False)


def _chunk_left(conn: h11.Connection) -> int:
    """The bytes the chunk h11 is reading still declares (0 outside a chunked body). h11 reads
    a chunk size of any length and exposes neither it nor a bound on it, so this reads its
    reader's count (h11 0.14 to 0.16; tests/e2e/test_protocol_bounds.py fails if it moves)."""
    return getattr(getattr(conn, "_reader", None), "_bytes_in_chunk", 0)


def protocol_class(limits: HttpLimits, record: Refused = unrecorded) -> type[H11Protocol]:
    """uvicorn's HTTP/1.1 protocol (``uvicorn.Config(http=...)``) for one server, with its own
    count of open connections per client address and its own record of refusals."""

    class ServerH11Protocol(GuardedH11Protocol):
        open_by_host = {}
        cap, header_timeout = limits.max_client_connections, limits.read_timeout
        http_limits = limits
        on_refused = staticmethod(record)

    return ServerH11Protocol


def http_options(limits: HttpLimits, on_refused: Refused = unrecorded) -> dict[str, Any]:
    """``uvicorn.Config``'s HTTP/1.1 options for one server: its protocol (``on_refused``: the
    record of what it refuses itself), and h11's own bound on a head still incomplete set past
    the head's bound, which the protocol measures first (h11's 16 KiB would refuse a head of 16
    to 32 KiB with a 400)."""
    return {
        "http": protocol_class(limits, on_refused),
        "h11_max_incomplete_event_size": 2 * limits.max_head_bytes,
    }


_TWO_FRAMINGS = (
    "a request with both Content-Length and Transfer-Encoding is refused: they disagree on "
    "where its body ends (RFC 9112 6.1); send one of them"
)


def _one_framing(app: Any, on_refused: Refused) -> Any:
    """``app`` behind a refusal of the request-smuggling shape: a body framed both by length and
    by chunks. h11 would read it chunked, and a proxy in front may have read it by its length,
    so where one request ends and the next begins is in dispute: 400, and the connection closes
    (RFC 9112 6.1), so nothing after it on the connection is read as a request."""

    async def guarded(scope: Any, receive: Any, send: Any) -> None:
        names = {name for name, _ in scope.get("headers", ())}
        if scope["type"] == "http" and {b"content-length", b"transfer-encoding"} <= names:
            await _answer(send, 400, _TWO_FRAMINGS)
            on_refused(scope["method"], scope["path"], 400, _TWO_FRAMINGS)
            return
        await app(scope, receive, send)

    return guarded


async def _answer(send: Any, status: int, message: str) -> None:
    """An error answer that closes the connection, sent straight to the protocol."""
    body = orjson.dumps(error_body(message, status))
    headers = [
        (b"content-type", b"application/json"),
        (b"connection", b"close"),
        (b"content-length", str(len(body)).encode()),
    ]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def _over_cap(host: str, cap: int, on_refused: Refused) -> Any:
    message = (
        f"too many open connections from {host}: at most {cap} at once "
        "(--max-client-connections); close some and retry"
    )

    async def app(scope: Any, receive: Any, send: Any) -> None:
        await _answer(send, 429, message)
        if scope["type"] == "http":
            on_refused(scope["method"], scope["path"], 429, message)

    return app
