"""The gate: what a request must show before any route runs, each rule a pure decision over its
headers. Most of it is what a web page in the operator's browser may make this server do:
nothing, unless the operator says so. A page can send a "simple" request (``text/plain``, a
form) to any address without asking the server first, and a page whose name is made to resolve
to 127.0.0.1 (DNS rebinding) reads the answers as its own origin's.

- **Host** (``host_refusal``): only a Host naming this server is served: localhost (and its
  subdomains, RFC 6761), the loopback addresses, the address the connection arrived at (the
  bind address; with a wildcard bind, the one the client used), the bind name, the machine's
  name, and ``--allowed-hosts``. On any port: a forwarded port (``ssh -L``) changes it, and no
  page can make these names its own. A foreign Host is 403, a malformed one 400.
- **Origin** (``origin_refusal``): a request with an Origin other than the server's own (the
  page's scheme://host:port matching the Host it was sent to) is 403 unless
  ``--allowed-origins`` lists it; a listed origin gets CORS (Starlette's ``CORSMiddleware``).
- **API key** (``authorized``): with ``--api-key``, every route but /health wants it (401).
- **Size**: a declared body past ``MAX_BODY_BYTES`` is 413 before a byte of it is read.
- **Content-Type** (``body_refusal``): a state-changing body must be declared JSON (415), so
  no cross-origin page can send one without the preflight the Origin rule refuses, even from a
  browser or plug-in that sends no Origin.

``install`` puts the first two in front of every route (``BrowserDoor``, then CORS); ``guard``,
the app's middleware behind them, checks the other three.
"""

from __future__ import annotations

import hmac
import socket
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple

from fastapi import FastAPI, Request, Response
from starlette.datastructures import Headers
from starlette.middleware.cors import CORSMiddleware
from starlette.types import ASGIApp, Receive, Scope, Send

from engine.config.netloc import (
    DEFAULT_PORTS,
    Authority,
    host_name,
    is_loopback,
    parse_host,
    parse_origin,
)
from engine.server.limits import MAX_BODY_BYTES
from engine.server.responses import error_for

ANY = "*"
# the one route an API key leaves open: a load balancer's and a supervisor's probe
OPEN = frozenset({"/health"})
CHANGING = frozenset({"POST", "PUT", "PATCH", "DELETE"})  # the methods that change state
CORS_METHODS = ("GET", "HEAD", "POST", "DELETE")  # the methods the routes take


class Refusal(NamedTuple):
    status: int
    message: str


@dataclass(frozen=True, slots=True)
class BrowserPolicy:
    """Which Hosts this server answers and which other origins' pages may call it."""

    names: frozenset[str]  # hosts served on any port, normalized (``netloc.host_name``)
    on_port: frozenset[Authority]  # hosts served on one port only (--allowed-hosts NAME:PORT)
    any_host: bool
    origins: frozenset[str]  # listed origins, as a browser writes them
    any_origin: bool

    @classmethod
    def of(
        cls,
        allowed_hosts: Iterable[str] = (),
        allowed_origins: Iterable[str] = (),
        bind_host: str | None = None,
        machine: Iterable[str] | None = None,
    ) -> BrowserPolicy:
        """From the flags (entries the config has checked), the address or name the server
        was bound to (``--host``) and the machine's own names (None: ``machine_names()``)."""
        machine = machine_names() if machine is None else machine
        hosts = [parse_host(h) for h in allowed_hosts if h != ANY]
        names = {"localhost", *(host_name(n) for n in (bind_host or "", *machine))}
        names |= {h.host for h in hosts if h is not None and h.port is None}
        listed = [parse_origin(o) for o in allowed_origins if o != ANY]
        return cls(
            names=frozenset(n for n in names if n),
            on_port=frozenset(h for h in hosts if h is not None and h.port is not None),
            any_host=ANY in allowed_hosts,
            origins=frozenset(o.serialized() for o in listed if o is not None),
            any_origin=ANY in allowed_origins,
        )

    def serves(self, where: Authority, local: str | None) -> bool:
        """Whether a Host of ``where`` names this server; ``local``: the address the
        connection arrived at."""
        host = where.host
        if host in self.names or host.endswith(".localhost") or is_loopback(host):
            return True
        return where in self.on_port or (local is not None and host == host_name(local))


def machine_names() -> tuple[str, ...]:
    """This machine's name, and its first label when it has dots (``gpu1.corp`` and ``gpu1``):
    what a wildcard-bound server is reached by on a LAN. Read from the kernel, no DNS asked."""
    name = socket.gethostname()
    return (name, name.split(".", 1)[0])


def host_refusal(policy: BrowserPolicy, host: str | None, local: str | None) -> Refusal | None:
    """None when the Host names this server (or none came: no browser sends a request without
    one); else 403 for a foreign name, naming the flag that would serve it, 400 for one that
    is no host at all."""
    if host is None or policy.any_host:
        return None
    where = parse_host(host)
    if where is None:
        shape = "a name or an address, then :PORT if any (an IPv6 address in brackets)"
        return Refusal(400, f"Host {host!r} is not a host: {shape}")
    if policy.serves(where, local):
        return None
    shown = f"[{where.host}]" if ":" in where.host else where.host
    return Refusal(
        403,
        f"Host {host!r} does not name this server: a web page whose name was made to resolve "
        "here (DNS rebinding) could read every answer. To serve it, start the server with "
        f"--allowed-hosts {shown} (comma-separated; '*' serves any Host)",
    )


def origin_refusal(policy: BrowserPolicy, origin: str | None, host: str | None) -> Refusal | None:
    """None for a request with no Origin (not a page's, or a same-origin GET), from the
    server's own origin (the Host it was sent to, on the scheme's port when the Host has
    none) or from a listed one; else 403 naming the flag that would allow it."""
    if origin is None or policy.any_origin:
        return None
    seen, where = parse_origin(origin), parse_host(host or "")
    if seen is not None and where is not None:
        if seen.serialized() in policy.origins:
            return None
        # a Host without a port was sent to the default port of the page's scheme
        port = where.port if where.port is not None else DEFAULT_PORTS.get(seen.scheme)
        if (seen.host, seen.port) == (where.host, port) and seen.scheme in ("http", "https"):
            return None
    fix = "nothing can list it (an opaque origin: a sandboxed page or a file)"
    if seen is not None:
        fix = f"start the server with --allowed-origins {seen.serialized()}"
    return Refusal(
        403,
        f"a request from a page of another origin ({origin!r}) is refused: a web page may "
        f"not drive this server unless the operator allows its origin. To allow it, {fix}",
    )


def json_declared(content_type: str) -> bool:
    """``application/json`` or a ``+json`` type (``application/merge-patch+json``), with any
    parameters (``; charset=utf-8``)."""
    media = content_type.split(";", 1)[0].strip().lower()
    kind, _, sub = media.partition("/")
    return kind == "application" and (sub == "json" or (sub.endswith("+json") and sub != "+json"))


def body_refusal(method: str, headers: Mapping[str, str]) -> Refusal | None:
    """None unless a state-changing request carries a body that is not declared JSON: 415,
    naming the type it needs. A DELETE or POST without a body needs no type."""
    if method.upper() not in CHANGING:
        return None
    length = headers.get("content-length")
    sized = length is not None and length.strip().isdigit() and int(length) > 0
    has_body = sized or "transfer-encoding" in headers
    declared = headers.get("content-type")
    if not has_body or (declared is not None and json_declared(declared)):
        return None
    sent = f"Content-Type {declared!r} is" if declared is not None else "no Content-Type was"
    return Refusal(
        415,
        f"a {method.upper()} body must be JSON, sent with Content-Type: application/json; "
        f"{sent} sent",
    )


def refusal(policy: BrowserPolicy, headers: Mapping[str, str], local: str | None) -> Refusal | None:
    """The Host rule, then the Origin rule: the first that refuses, or None."""
    host = headers.get("host")
    return host_refusal(policy, host, local) or origin_refusal(policy, headers.get("origin"), host)


class BrowserDoor:
    """ASGI middleware: a request the Host or Origin rule refuses is answered here (the
    server's error shape) and reaches nothing behind it."""

    def __init__(self, app: ASGIApp, policy: BrowserPolicy) -> None:
        self.app, self.policy = app, policy

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            local = (scope.get("server") or (None,))[0]
            if (no := refusal(self.policy, Headers(scope=scope), local)) is not None:
                await error_for(scope.get("path", ""), no.message, no.status)(scope, receive, send)
                return
        await self.app(scope, receive, send)


def install(app: FastAPI, policy: BrowserPolicy) -> None:
    """In front of every route (and of the middleware already added): the door, then CORS for
    the listed origins. Their preflights are answered by CORS (no key: a browser sends none
    with one), for any header the page asks (the OpenAI JS client sends its own ``x-stainless``
    ones; the origin list is what guards), and for a public site's page asking a private
    address (Private Network Access): the operator named that origin."""
    if policy.origins or policy.any_origin:
        origins = [ANY] if policy.any_origin else sorted(policy.origins)
        app.add_middleware(
            CORSMiddleware,
            allow_origins=origins,
            allow_methods=CORS_METHODS,
            allow_headers=[ANY],
            allow_private_network=True,
            expose_headers=["Retry-After"],
        )
    app.add_middleware(BrowserDoor, policy=policy)


def authorized(header: str, api_key: str, x_api_key: str | None = None) -> bool:
    """An ``Authorization: Bearer KEY`` header with this key, or an ``x-api-key: KEY`` header
    (as Anthropic's clients send it). The scheme is read in any case (RFC 9110 11.1: schemes
    are case-insensitive); the key is compared in constant time."""
    if x_api_key is not None and hmac.compare_digest(x_api_key.encode(), api_key.encode()):
        return True
    scheme, _, key = header.partition(" ")
    right_key = hmac.compare_digest(key.lstrip(" ").encode(), api_key.encode())
    return right_key and scheme.lower() == "bearer"


def guard(api_key: str | None) -> Callable[[Request, Any], Awaitable[Response]]:
    """The middleware that checks what every route needs: the API key (on every route but
    /health; ``Authorization: Bearer`` or ``x-api-key``), a declared size within the limit
    (413), a state-changing body declared JSON (415, ``body_refusal``); each refusal in
    its route's error shape."""

    async def _guard(request: Request, call_next: Any) -> Response:
        headers, path = request.headers, request.url.path
        if api_key and path not in OPEN:
            if not authorized(headers.get("authorization", ""), api_key, headers.get("x-api-key")):
                return error_for(path, "invalid or missing API key", 401)
        declared = headers.get("content-length")
        if declared and declared.isdigit() and int(declared) > MAX_BODY_BYTES:
            return error_for(path, f"request body exceeds {MAX_BODY_BYTES} bytes", 413)
        if (no := body_refusal(request.method, headers)) is not None:
            return error_for(path, no.message, no.status)
        return await call_next(request)

    return _guard
