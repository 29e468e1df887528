"""The front door's bounds against a real `engine serve` (a tiny model: only the HTTP process is
under test): a request whose head, chunk size or token-id key is past what the server takes is
refused at once with the status that says so (400, 413, 414, 431), a connection whose head or
body framing is refused is closed, and the server goes on serving.

"At once" is shown by state, not by a clock: the server's read timeout is far longer than the
client waits (``READ_TIMEOUT`` against ``CLIENT_S``), so any answer at all came before it."""

from __future__ import annotations

import socket

import httpx
import orjson
import pytest

from tests.e2e.http_raw import conversation, exchange, head
from tests.e2e.server_proc import ServerProc

READ_TIMEOUT, CLIENT_S = 600, 60
COMPLETIONS = "/v1/completions"


@pytest.fixture(scope="module")
def srv(tiny_model_dir, tmp_path_factory):
    log = tmp_path_factory.mktemp("bounds") / "boot.jsonl"
    s = ServerProc(
        log, "--model", tiny_model_dir, "--kv-tokens", "1024", "--read-timeout", str(READ_TIMEOUT)
    )
    yield s
    code, out = s.stop()
    assert code == 0, out
    assert "Traceback" not in out, out  # every refusal was an answer, none a crash
    # a body the protocol refused mid-way: its request's end is not a client that went away
    assert "went away" not in out, out


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


def get(path: str = "/version", fields: str = "") -> bytes:
    return f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n{fields}\r\n".encode()


def lines(n: int, size: int = 1) -> str:
    """``n`` header field lines of ``size`` bytes each (with their CRLF)."""
    return "".join(f"X-F{i:05}: {'a' * (size - 12)}\r\n" for i in range(n))


VERSION = get()  # a request pipelined behind a refused one: never answered
HEADS = [  # (name, the request's head, status, words in the message)
    ("101 header fields", get(fields=lines(100, 16)), 431, "more than 100 header fields"),
    ("10,000 header fields", get(fields=lines(10_000, 16)), 431, "more than 100 header fields"),
    (
        "a header field line of 8,193 bytes",
        get(fields=lines(1, 8195)),
        431,
        "a header field line exceeds 8192 bytes",
    ),
    (
        "32 KB of header fields in lines under 8 KB",
        get(fields=lines(5, 7000)),
        431,
        "exceeds 32768 bytes",
    ),
    ("128 KB of header fields", get(fields=lines(20, 6600)), 431, "exceeds 32768 bytes"),
    (
        "a request line of 9,000 bytes",
        get("/version?" + "q" * 9000),
        414,
        "request line exceeds 8192 bytes",
    ),
]


@pytest.mark.parametrize(("name", "start", "status", "words"), HEADS, ids=[h[0] for h in HEADS])
def test_a_head_past_its_bounds_is_refused_and_its_connection_closed(
    srv, name, start, status, words
):
    answers = conversation(srv.port, start + VERSION, timeout=CLIENT_S)
    assert [a[0] for a in answers] == [status], answers  # closed: the GET behind it unanswered
    got, headers, body = answers[0]
    err = orjson.loads(body)["error"]
    assert words in err["message"] and err["code"] == status, err
    assert headers["connection"] == "close"
    served(srv)


def test_a_head_at_its_bounds_is_served(srv):
    """100 fields (Host and 99), one line of 8,192 bytes, 32,734 bytes in all, sent 4 KB at a
    time: a head still incomplete past h11's own bound (16 KiB) is not refused either."""
    start = get(fields=lines(1, 8194) + lines(98, 250))
    assert len(start) - 2 <= 32768  # the head without its blank line
    parts = [start[i : i + 4096] for i in range(0, len(start), 4096)]
    status, body, _ = exchange(srv.port, parts[0], parts[1:], pause=0.02, timeout=CLIENT_S)
    assert status == 200, body


def test_a_head_sent_slowly_is_refused_once_past_the_bound_not_when_it_ends(srv):
    """40 KB of header fields, 1 KB at a time, never ended: refused once 32 KB have come."""
    parts = [lines(1, 1024).encode()] * 40
    status, body, _ = exchange(srv.port, get()[:-2], parts, pause=0.02, timeout=CLIENT_S)
    assert status == 431 and "exceeds 32768 bytes" in body["error"]["message"], body
    served(srv)


def test_a_head_pipelined_behind_a_served_request_is_held_to_the_same_bounds(srv):
    answers = conversation(
        srv.port, VERSION + get(fields=lines(100, 16)) + VERSION, timeout=CLIENT_S
    )
    assert [a[0] for a in answers] == [200, 431], answers


CHUNKED = head(COMPLETIONS, None, "Transfer-Encoding: chunked\r\n")
CHUNKS = [  # (name, the chunk-size line and what follows, status, words)
    (
        "a chunk size of 20 hex digits",
        b"ffffffffffffffffffff\r\n",
        400,
        "chunk size 0xffffffffffffffffffff is more than any body can have",
    ),
    (
        "a chunk of 5 MB",
        b"500000\r\n" + b"x" * 1000,
        413,
        "request body exceeds 4194304 bytes: a chunk declares 5241880 bytes more",
    ),
]


@pytest.mark.parametrize(("name", "chunk", "status", "words"), CHUNKS, ids=[c[0] for c in CHUNKS])
def test_a_chunk_size_past_the_body_bound_is_refused_at_once(srv, name, chunk, status, words):
    """The body can never be taken: refused as the size arrives, not after the read timeout."""
    answers = conversation(srv.port, CHUNKED + chunk, timeout=CLIENT_S)
    assert [a[0] for a in answers] == [status], answers
    got, headers, body = answers[0]
    assert words in orjson.loads(body)["error"]["message"], body
    assert headers["connection"] == "close"
    served(srv)


def test_a_request_answered_before_its_body_ends_gets_no_second_answer(srv):
    """A 404 comes before its chunked body is read; the body's oversized chunk then closes the
    connection without a second, unasked answer."""
    with socket.create_connection(("127.0.0.1", srv.port), timeout=CLIENT_S) as s:
        s.sendall(head("/v1/nope", None, "Transfer-Encoding: chunked\r\n") + b"5\r\nhello\r\n")
        first = s.recv(1 << 16)
        while b'"code":404}}' not in first:  # the whole answer: its head and its JSON body
            first += s.recv(1 << 16)
        assert first.startswith(b"HTTP/1.1 404"), first
        s.sendall(b"ffffffffffffffffffff\r\n")
        rest = b""
        while chunk := s.recv(1 << 16):
            rest += chunk
    assert rest == b"", rest  # closed, nothing more said
    served(srv)


def test_nothing_refused_reached_the_scheduler_as_a_request(srv):
    recs = [orjson.loads(x) for x in srv.log_file.read_bytes().splitlines()]
    received = [r for r in recs if r["event"] == "request.received"]
    assert len(received) <= 1, received  # the zero-padded key's request only
