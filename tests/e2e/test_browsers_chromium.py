"""The browser attacks on `engine serve` from a real headless Chromium (Debian's, driven by
playwright), each page served by playwright itself at the URL it claims, so no other server is
involved:

- a page from another site posts a cutover with ``fetch(..., {mode: "no-cors"})``: a "simple"
  request (``text/plain``, no preflight) the browser sends without asking the server first;
- DNS rebinding: a page from attacker.example, whose name the browser resolves to 127.0.0.1
  (``--host-resolver-rules``), reads the server's answers as its own origin's;
- a page from an origin ``--allowed-origins`` lists calls the API with its key: the browser's
  own CORS check passes on the server's preflight answer and the page reads the completion.

Chromium's newer Local Network Access checks are switched off, as Firefox and Safari have none:
the server must not count on the browser. Where Chromium or playwright is missing the tests skip
and say why."""

from __future__ import annotations

import pytest

from tests.e2e.browser import ARGS, CHROMIUM, why_no_browser
from tests.e2e.server_proc import ServerProc

POOL = 1024
KEY = "browser-test-key"
APP = "http://app.example:3000"  # the listed origin
FLAGS = [
    *ARGS,
    "--host-resolver-rules=MAP attacker.example 127.0.0.1",
    "--disable-features=LocalNetworkAccessChecks,BlockInsecurePrivateNetworkRequests,"
    "PrivateNetworkAccessSendPreflights",
]
CUTOVER_JS = """async (url) => {
  await fetch(url, {method: "POST", mode: "no-cors",
                    body: JSON.stringify({kind: "pool", mode: "carry", kv_tokens: 512})});
  return "sent" }"""
READ_JS = """async () => {
  try { const r = await fetch("/v1/models"); return [r.status, await r.text()] }
  catch (e) { return [0, String(e)] } }"""
COMPLETE_JS = """async ([url, key]) => {
  try {
    const r = await fetch(url, {method: "POST", headers: {"Authorization": "Bearer " + key,
      "Content-Type": "application/json"}, body: JSON.stringify({prompt: "hi", max_tokens: 2})});
    return [r.status, await r.json()] }
  catch (e) { return [0, String(e)] } }"""


@pytest.fixture(scope="module")
def chromium():
    if why := why_no_browser():
        pytest.skip(why)
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
        yield browser
        browser.close()


def boot(model: str, folder, *flags: str) -> ServerProc:
    return ServerProc(folder / "boot.jsonl", "--model", model, "--kv-tokens", str(POOL), *flags)


@pytest.fixture(scope="module")
def srv(tiny_model_dir, tmp_path_factory):
    s = boot(tiny_model_dir, tmp_path_factory.mktemp("chromium"))
    yield s
    s.stop()


def open_page(browser, url: str):
    """A page at ``url``, its document served by playwright (the page's own server)."""
    page = browser.new_page()
    page.route(url, lambda r: r.fulfill(status=200, content_type="text/html", body="<p>hi</p>"))
    page.goto(url)
    return page


def kv_total(srv: ServerProc) -> int:
    import httpx

    return httpx.get(srv.base + "/health", timeout=30).json()["kv_total"]


def test_a_page_from_another_site_cannot_cut_the_pool_over(chromium, srv):
    page = open_page(chromium, "http://evil.example/")
    try:
        assert page.evaluate(CUTOVER_JS, srv.base + "/admin/cutover") == "sent"
    finally:
        page.close()
    # the answer is opaque to the page; the server's state says whether it obeyed
    assert kv_total(srv) == POOL
    assert b'"cutover.begin"' not in srv.log_file.read_bytes()


def test_a_rebound_name_cannot_read_the_servers_answers(chromium, srv):
    page = open_page(chromium, f"http://attacker.example:{srv.port}/")
    try:
        status, text = page.evaluate(READ_JS)
    finally:
        page.close()
    assert status == 403, text
    assert "attacker.example" in text and "--allowed-hosts" in text


def test_a_listed_origin_calls_the_api_with_its_key(chromium, tiny_model_dir, tmp_path):
    srv = boot(tiny_model_dir, tmp_path, "--api-key", KEY, "--allowed-origins", APP)
    try:
        page = open_page(chromium, APP + "/")
        try:
            status, body = page.evaluate(COMPLETE_JS, [srv.base + "/v1/completions", KEY])
            other = open_page(chromium, "http://evil.example/")
            refused, why = other.evaluate(COMPLETE_JS, [srv.base + "/v1/completions", KEY])
            other.close()
        finally:
            page.close()
    finally:
        srv.stop()
    assert status == 200 and body["usage"]["completion_tokens"] == 2, body
    # the preflight was refused: the browser never sent the request, and says only that
    assert refused == 0 and "Failed to fetch" in why, why
