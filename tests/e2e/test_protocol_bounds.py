"""The front door's bounds against a real `engine serve` (a tiny model: only the HTTP process is
under test): a request whose head, chunk size or token-id key is past what the server takes is
refused at once with the status that says so (400, 413, 414, 431), a connection whose head or
body framing is refused is closed, and the server goes on serving.

"At once" is shown by state, not by a clock: the server's read timeout is far longer than the
client waits (``READ_TIMEOUT`` against ``CLIENT_S``), so any answer at all came before it."""

from __future__ import annotations

import httpx
import orjson
import pytest

from tests.e2e.server_proc import ServerProc

READ_TIMEOUT, CLIENT_S = 600, 60
COMPLETIONS = "/v1/completions"


@pytest.fixture(scope="module")
def srv(tiny_model_dir, tmp_path_factory):
    log = tmp_path_factory.mktemp("bounds") / "boot.jsonl"
    s = ServerProc(log, "--model", tiny_model_dir, "--kv-tokens", "1024",
                   "--read-timeout", str(READ_TIMEOUT))  # fmt: skip
    yield s
    code, out = s.stop()
    assert code == 0, out
    assert "Traceback" not in out, out  # every refusal was an answer, none a crash


def served(srv) -> None:
    """The server still answers after what it refused."""
    assert httpx.get(srv.base + "/health", timeout=CLIENT_S).status_code == 200


def error(r: httpx.Response) -> dict:
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["code"] == r.status_code
    return err


def test_a_logit_bias_key_of_5000_digits_is_a_400_naming_the_field(srv):
    """Python reads at most 4,300 digits into an int (a ValueError past it): the key is refused
    as what it is, not a token id of the vocabulary, never a 500."""
    body = {"prompt": "hi", "max_tokens": 1, "logit_bias": {"9" * 5000: 1}}
    r = httpx.post(srv.base + COMPLETIONS, json=body, timeout=CLIENT_S)
    assert r.status_code == 400, r.text
    err = error(r)
    assert err["param"] == "logit_bias", err
    assert "a key of 5000 digits is not a token id of the vocabulary (0..319)" in err["message"]
    # zeros in front spell the same id: served
    body = {"prompt": "hi", "max_tokens": 1, "logit_bias": {"0" * 5000 + "7": 1}}
    assert httpx.post(srv.base + COMPLETIONS, json=body, timeout=CLIENT_S).status_code == 200
    served(srv)


def test_nothing_refused_reached_the_scheduler_as_a_request(srv):
    recs = [orjson.loads(x) for x in srv.log_file.read_bytes().splitlines()]
    received = [r for r in recs if r["event"] == "request.received"]
    assert len(received) <= 1, received  # the zero-padded key's request only
