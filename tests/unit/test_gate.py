"""What a web page may make the server do (engine/server/gate.py): the Host rule (DNS
rebinding), the Origin rule (a page of another site) and the Content-Type rule (a "simple"
request's body), each a pure decision tested directly; then the door and CORS on a bare app."""

from __future__ import annotations

import pytest
from fastapi import FastAPI
from fastapi.responses import JSONResponse
from starlette.testclient import TestClient

from engine.server.gate import (
    BrowserPolicy,
    body_refusal,
    host_refusal,
    install,
    json_declared,
    origin_refusal,
)

DEFAULT = BrowserPolicy.of(machine=())  # no flags, bound to nothing named
BOUND = BrowserPolicy.of(bind_host="0.0.0.0", machine=("gpu1.corp", "gpu1"))
FLAGS = BrowserPolicy.of(
    allowed_hosts=("llm.example", "proxy.example:8443", "[2001:db8::7]"),
    allowed_origins=("http://localhost:3000", "HTTPS://App.Example:443"),
    machine=(),
)


@pytest.mark.parametrize(
    "host",
    [
        None,
        "localhost",
        "LOCALHOST:1",
        "localhost.:8000",
        "app.localhost:8000",
        "127.0.0.1",
        "127.0.0.2:8000",
        "127.255.255.254",
        "[::1]",
        "[::1]:8000",
        "[::ffff:127.0.0.1]:8000",
    ],
)
def test_the_loopback_names_are_served_on_any_port(host):
    assert host_refusal(DEFAULT, host, local="127.0.0.1") is None


@pytest.mark.parametrize(
    "host",
    [
        "attacker.example",
        "attacker.example:8000",
        "localhost.attacker.example",
        "127.0.0.1.nip.io",
        "10.0.0.5:8000",
        "[2001:db8::1]",
        "0.0.0.0:8000",
        "gpu1",
    ],
)
def test_any_other_host_is_403_naming_it_and_the_flag_that_would_serve_it(host):
    no = host_refusal(DEFAULT, host, local="127.0.0.1")
    assert no is not None and no.status == 403
    assert f"Host {host!r} does not name this server" in no.message
    name = host.rsplit(":", 1)[0] if not host.startswith("[") else host
    assert f"--allowed-hosts {name}" in no.message, no.message


@pytest.mark.parametrize("host", ["", "::1", "x@localhost", "localhost:99999", "[::1", "a b"])
def test_a_malformed_host_is_400(host):
    no = host_refusal(DEFAULT, host, local="127.0.0.1")
    assert no is not None and no.status == 400 and f"Host {host!r} is not a host" in no.message


@pytest.mark.parametrize(
    ("host", "local"),
    [
        ("0.0.0.0:8000", "127.0.0.1"),  # the bind address, as uvicorn's banner shows it
        ("10.0.0.5:8000", "10.0.0.5"),  # the address a client used to reach a wildcard bind
        ("10.0.0.5:8000", "::ffff:10.0.0.5"),  # the same through an IPv6 socket
        ("[2001:db8::5]:8000", "2001:db8::5"),
        ("gpu1:8000", "10.0.0.5"),
        ("GPU1.corp", "10.0.0.5"),
    ],  # the machine's names
)
def test_a_wildcard_bound_server_answers_to_its_addresses_and_the_machines_names(host, local):
    assert host_refusal(BOUND, host, local=local) is None


def test_the_address_a_connection_arrived_at_is_not_a_name_a_page_can_own():
    assert host_refusal(BOUND, "10.0.0.6:8000", local="10.0.0.5").status == 403
    assert host_refusal(BOUND, "attacker.example", local="10.0.0.5").status == 403


def test_allowed_hosts_add_names_on_any_port_or_on_one_and_star_serves_any():
    assert host_refusal(FLAGS, "LLM.example.:9", local=None) is None
    assert host_refusal(FLAGS, "proxy.example:8443", local=None) is None
    assert host_refusal(FLAGS, "proxy.example", local=None).status == 403
    assert host_refusal(FLAGS, "proxy.example:8444", local=None).status == 403
    assert host_refusal(FLAGS, "[2001:db8::7]:1", local=None) is None
    assert host_refusal(FLAGS, "llm.example.evil", local=None).status == 403
    anything = BrowserPolicy.of(allowed_hosts=("*",), machine=())
    assert host_refusal(anything, "attacker.example", local=None) is None


@pytest.mark.parametrize(
    ("origin", "host"),
    [
        (None, "localhost:8000"),  # no page, or a same-origin GET
        ("http://localhost:8000", "localhost:8000"),  # the server's own pages (/docs)
        ("http://127.0.0.1:8000", "127.0.0.1:8000"),
        ("http://[::1]:8000", "[::1]:8000"),
        ("https://llm.example", "llm.example"),  # behind a TLS proxy: the Host has no port
        ("http://llm.example", "llm.example"),
        ("http://localhost:3000", "localhost:8000"),  # listed
        ("https://app.example", "localhost:8000"),
    ],  # listed, the default port left out
)
def test_no_origin_the_servers_own_and_a_listed_one_pass(origin, host):
    assert origin_refusal(FLAGS, origin, host) is None


@pytest.mark.parametrize(
    ("origin", "host"),
    [
        ("http://evil.example", "localhost:8000"),
        ("http://localhost:3000", "localhost:8000"),  # another port is another origin
        ("http://localhost:8000", "localhost"),  # a Host without a port: port 80
        ("https://localhost:8000", "localhost:8001"),
        ("ftp://localhost:8000", "localhost:8000"),
        ("http://127.0.0.1:8000", "localhost:8000"),
    ],
)
def test_another_origin_is_403_naming_it_and_the_flag_that_would_allow_it(origin, host):
    no = origin_refusal(DEFAULT, origin, host)
    assert no is not None and no.status == 403
    assert repr(origin) in no.message and f"--allowed-origins {origin}" in no.message


@pytest.mark.parametrize("origin", ["null", "http://a/b", "file://"])
def test_an_opaque_origin_is_refused_and_named_as_one_no_flag_lists(origin):
    no = origin_refusal(FLAGS, origin, "localhost:8000")
    assert no is not None and no.status == 403 and "nothing can list it" in no.message
    assert (
        origin_refusal(BrowserPolicy.of(allowed_origins=("*",), machine=()), origin, "localhost")
        is None
    )


@pytest.mark.parametrize(
    ("content_type", "ok"),
    [
        ("application/json", True),
        ("Application/JSON; charset=utf-8", True),
        ("application/merge-patch+json", True),
        ("application/vnd.api+json;v=1", True),
        ("text/plain", False),
        ("text/plain;charset=UTF-8", False),
        ("text/json", False),
        ("application/x-www-form-urlencoded", False),
        ("multipart/form-data; boundary=x", False),
        ("application/jsonx", False),
        ("application/+json", False),
        ("application", False),
        ("", False),
    ],
)
def test_json_is_declared_by_application_json_or_a_plus_json_type(content_type, ok):
    assert json_declared(content_type) is ok


@pytest.mark.parametrize("method", ["POST", "PUT", "PATCH", "DELETE", "post"])
@pytest.mark.parametrize(
    "headers",
    [
        {"content-length": "5", "content-type": "text/plain;charset=UTF-8"},
        {"content-length": "5"},  # a fetch() of a Blob sends no type
        {"transfer-encoding": "chunked", "content-type": "application/x-www-form-urlencoded"},
    ],
)
def test_a_state_changing_body_not_declared_json_is_415_naming_the_type_it_needs(method, headers):
    no = body_refusal(method, headers)
    assert no is not None and no.status == 415
    assert f"a {method.upper()} body must be JSON, sent with Content-Type: application/json" in (
        no.message
    )
    sent = headers.get("content-type")
    assert (repr(sent) if sent else "no Content-Type was sent") in no.message


@pytest.mark.parametrize(
    ("method", "headers"),
    [
        ("POST", {"content-length": "5", "content-type": "application/json"}),
        (
            "POST",
            {"transfer-encoding": "chunked", "content-type": "application/json; charset=utf-8"},
        ),
        ("DELETE", {}),  # no body: nothing to declare
        ("POST", {"content-length": "0", "content-type": "text/plain"}),
        ("GET", {"content-length": "5", "content-type": "text/plain"}),
        ("OPTIONS", {"content-length": "5"}),
    ],
)
def test_a_json_body_no_body_and_a_method_that_changes_nothing_pass(method, headers):
    assert body_refusal(method, headers) is None


def _app(policy: BrowserPolicy, base: str = "http://localhost:8000") -> TestClient:
    app = FastAPI()

    @app.post("/v1/completions")
    async def _complete() -> JSONResponse:
        return JSONResponse({"ok": True})

    install(app, policy)
    return TestClient(app, base_url=base)


def test_the_door_answers_a_refusal_in_the_error_shape_before_any_route():
    client = _app(DEFAULT)
    r = client.post("/v1/completions", json={}, headers={"origin": "http://evil.example"})
    assert r.status_code == 403 and r.json()["error"]["code"] == 403
    r = client.post("/v1/completions", json={}, headers={"host": "attacker.example"})
    assert r.status_code == 403 and "attacker.example" in r.json()["error"]["message"]
    assert client.post("/v1/completions", json={}).json() == {"ok": True}


def test_the_door_reads_the_address_the_connection_arrived_at():
    client = _app(DEFAULT, base="http://10.0.0.5:8000")  # the ASGI scope's server
    assert client.post("/v1/completions", json={}).json() == {"ok": True}
    r = client.post("/v1/completions", json={}, headers={"host": "10.0.0.6:8000"})
    assert r.status_code == 403, r.text


def test_a_listed_origin_gets_its_preflight_answered_and_its_answers_marked():
    client = _app(FLAGS)
    ask = {
        "origin": "http://localhost:3000",
        "access-control-request-method": "POST",
        "access-control-request-headers": "Authorization, Content-Type, X-Stainless-OS",
    }
    pre = client.options("/v1/completions", headers=ask)
    assert pre.status_code == 200, pre.text
    assert pre.headers["access-control-allow-origin"] == "http://localhost:3000"
    assert pre.headers["access-control-allow-methods"] == "GET, HEAD, POST, DELETE"
    assert pre.headers["access-control-allow-headers"] == ask["access-control-request-headers"]
    assert "Origin" in pre.headers["vary"] and "access-control-allow-credentials" not in pre.headers
    r = client.post("/v1/completions", json={}, headers={"origin": "https://app.example"})
    assert r.headers["access-control-allow-origin"] == "https://app.example"
    assert r.headers["access-control-expose-headers"] == "Retry-After"
    refused = client.options("/v1/completions", headers={**ask, "origin": "http://evil.example"})
    assert refused.status_code == 403 and "access-control-allow-origin" not in refused.headers
