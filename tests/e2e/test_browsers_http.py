"""A web page in the operator's browser cannot drive `engine serve`, through a real server
process on loopback (the tiny model): a cross-origin "simple" request (``text/plain``, no
preflight) is refused before it reaches anything, a ``Host`` that does not name this server (DNS
rebinding) is refused, the same requests from the OpenAI client and httpx's ``json=`` are
served, and with a key every route but /health needs it. The same attacks from a real headless
Chromium are in test_browsers_chromium.py."""

from __future__ import annotations

import json

import httpx
import orjson
import pytest

from tests.e2e.server_proc import ServerProc

openai = pytest.importorskip("openai")

POOL = 1024
PAGE = "http://evil.example"  # the origin of a page the operator happens to have open
SIMPLE = {"origin": PAGE, "content-type": "text/plain;charset=UTF-8"}  # what fetch() sends
PROMPT = {"model": "tiny", "prompt": "hello there", "max_tokens": 2}
KEY = "browser-test-key"
LISTED = "http://app.example:3000"  # the origin the keyed server lists


@pytest.fixture(scope="module")
def srv(tiny_model_dir, tmp_path_factory):
    """The default server: no key, no flags beyond the model."""
    log = tmp_path_factory.mktemp("browsers") / "boot.jsonl"
    s = ServerProc(
        log, "--model", tiny_model_dir, "--kv-tokens", str(POOL), "--served-model-name", "tiny"
    )
    yield s
    s.stop()


@pytest.fixture(scope="module")
def keyed(tiny_model_dir, tmp_path_factory):
    """A server with a key, one listed origin and one more Host name."""
    log = tmp_path_factory.mktemp("browsers-keyed") / "boot.jsonl"
    s = ServerProc(
        log,
        "--model",
        tiny_model_dir,
        "--kv-tokens",
        str(POOL),
        "--served-model-name",
        "tiny",
        "--api-key",
        KEY,
        "--allowed-origins",
        LISTED,
        "--allowed-hosts",
        "llm.example",
    )
    yield s
    s.stop()


def count(srv: ServerProc, kind: str) -> int:
    return sum(1 for x in srv.log_file.read_bytes().splitlines() if f'"{kind}"'.encode() in x)


def error(r: httpx.Response) -> str:
    body = r.json()
    assert body["error"]["code"] == r.status_code, body
    return body["error"]["message"]


def test_a_cross_origin_text_plain_cutover_is_refused_and_the_pool_is_untouched(srv):
    cutover = json.dumps({"kind": "pool", "mode": "carry", "kv_tokens": POOL // 2})
    r = httpx.post(srv.base + "/admin/cutover", content=cutover, headers=SIMPLE, timeout=120)
    assert r.status_code == 403, r.text
    message = error(r)
    assert PAGE in message and "--allowed-origins" in message, message
    assert httpx.get(srv.base + "/health", timeout=30).json()["kv_total"] == POOL
    assert count(srv, "cutover.begin") == 0


def test_a_cross_origin_text_plain_completion_is_refused_and_nothing_is_queued(srv):
    before = count(srv, "request.received")
    r = httpx.post(
        srv.base + "/v1/completions", content=json.dumps(PROMPT), headers=SIMPLE, timeout=120
    )
    assert r.status_code == 403, r.text
    assert PAGE in error(r)
    assert count(srv, "request.received") == before


@pytest.mark.parametrize("content_type", ["text/plain", None, "application/x-www-form-urlencoded"])
def test_a_body_that_is_not_declared_json_is_415_naming_the_type_it_needs(srv, content_type):
    headers = {"content-type": content_type} if content_type else {}
    before = count(srv, "request.received")
    r = httpx.post(
        srv.base + "/v1/completions", content=orjson.dumps(PROMPT), headers=headers, timeout=120
    )
    assert r.status_code == 415, r.text
    assert "application/json" in error(r)
    assert count(srv, "request.received") == before


@pytest.mark.parametrize("path", ["/v1/models", "/v1/completions"])
def test_a_host_that_does_not_name_this_server_is_refused(srv, path):
    """DNS rebinding: a page from attacker.example, whose name now resolves to 127.0.0.1,
    reaches the server same-origin and could read every answer."""
    host = f"attacker.example:{srv.port}"
    method = "GET" if path == "/v1/models" else "POST"
    body = None if method == "GET" else PROMPT
    r = httpx.request(method, srv.base + path, json=body, headers={"host": host}, timeout=120)
    assert r.status_code == 403, r.text
    message = error(r)
    assert f"'{host}'" in message and "--allowed-hosts" in message, message


@pytest.mark.parametrize("host", ["localhost", "LocalHost.", "127.0.0.1", "127.0.0.2", "[::1]"])
def test_the_loopback_names_are_served_with_any_port(srv, host):
    for authority in (host, f"{host}:{srv.port}", f"{host}:9"):
        r = httpx.get(srv.base + "/v1/models", headers={"host": authority}, timeout=30)
        assert r.status_code == 200, (authority, r.text)


def test_the_same_requests_from_the_openai_client_and_httpx_json_are_served(srv):
    with openai.OpenAI(base_url=srv.base + "/v1", api_key="unused") as client:
        done = client.completions.create(**PROMPT)
    assert done.usage.completion_tokens == 2
    r = httpx.post(srv.base + "/v1/completions", json=PROMPT, timeout=120)
    assert r.status_code == 200, r.text
    # a same-origin page (the server's own /docs) sends its Origin too
    own = {"origin": f"http://127.0.0.1:{srv.port}"}
    r = httpx.post(srv.base + "/tokenize", json={"prompt": "hi"}, headers=own, timeout=30)
    assert r.status_code == 200, r.text
    r = httpx.delete(srv.base + "/admin/cutover/none", timeout=30)  # a DELETE has no body
    assert r.status_code == 404, r.text


def test_with_a_key_every_route_but_health_needs_it(keyed):
    for path in (
        "/docs",
        "/redoc",
        "/openapi.json",
        "/version",
        "/v1/models",
        "/metrics",
        "/no/such/route",
    ):
        r = httpx.get(keyed.base + path, timeout=30)
        assert r.status_code == 401, (path, r.text)
        ok = httpx.get(keyed.base + path, headers={"authorization": f"Bearer {KEY}"}, timeout=30)
        assert ok.status_code == (404 if path == "/no/such/route" else 200), (path, ok.text)
    assert httpx.get(keyed.base + "/health", timeout=30).status_code == 200


def test_a_listed_origin_gets_cors_and_an_unlisted_one_is_refused(keyed):
    ask = {
        "origin": LISTED,
        "access-control-request-method": "POST",
        "access-control-request-headers": "authorization, content-type",
    }
    pre = httpx.options(keyed.base + "/v1/completions", headers=ask, timeout=30)
    assert pre.status_code == 200, pre.text
    assert pre.headers["access-control-allow-origin"] == LISTED
    assert "POST" in pre.headers["access-control-allow-methods"]
    allowed = pre.headers["access-control-allow-headers"].lower()
    assert "authorization" in allowed and "content-type" in allowed
    assert "Origin" in pre.headers["vary"]
    auth = {"authorization": f"Bearer {KEY}", "origin": LISTED}
    r = httpx.post(keyed.base + "/v1/completions", json=PROMPT, headers=auth, timeout=120)
    assert r.status_code == 200 and r.headers["access-control-allow-origin"] == LISTED, r.text
    # a refusal the page may read: why it was refused
    r = httpx.post(keyed.base + "/v1/completions", json=PROMPT, headers={"origin": LISTED})
    assert r.status_code == 401 and r.headers["access-control-allow-origin"] == LISTED
    other = {**ask, "origin": PAGE}
    r = httpx.options(keyed.base + "/v1/completions", headers=other, timeout=30)
    assert r.status_code == 403 and "access-control-allow-origin" not in r.headers
    assert PAGE in error(r)


def test_an_allowed_host_is_served_and_another_still_refused(keyed):
    auth = {"authorization": f"Bearer {KEY}"}
    ok = httpx.get(keyed.base + "/v1/models", headers={**auth, "host": "llm.example"})
    assert ok.status_code == 200, ok.text
    r = httpx.get(keyed.base + "/v1/models", headers={**auth, "host": "llm.example.evil"})
    assert r.status_code == 403, r.text
