"""HTTP/1.1 spoken by hand over a socket: for bodies a client library will not send (invalid
UTF-8, a slow body, a body longer than it is allowed to be) and for reading the answer a server
gives before the client has finished sending."""

from __future__ import annotations

import select
import socket
import time

import orjson


def head(path: str, length: int | None, extra: str = "", method: str = "POST") -> bytes:
    size = "" if length is None else f"Content-Length: {length}\r\n"
    return (
        f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        f"{size}{extra}\r\n"
    ).encode()


def exchange(
    port: int, start: bytes, parts: list[bytes] = (), pause: float = 0.0, timeout: float = 30
) -> tuple[int, dict, float]:
    """Send ``start`` then each of ``parts`` (``pause`` seconds apart) until the server answers;
    (status, JSON body, seconds from the first byte sent to the answer's end)."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        t0 = time.monotonic()
        try:
            s.sendall(start)
            for part in parts:
                if select.select([s], [], [], pause)[0]:
                    break  # it answered before the body was all sent
                s.sendall(part)
        except (BrokenPipeError, ConnectionResetError):
            pass  # it answered and closed; the answer is still there to read
        return _answer(s, t0)


def _answer(s: socket.socket, t0: float) -> tuple[int, dict, float]:
    data = b""
    while True:
        top, sep, body = data.partition(b"\r\n\r\n")
        if sep:
            length = next(
                (
                    int(line.split(b":")[1])
                    for line in top.split(b"\r\n")
                    if line.lower().startswith(b"content-length:")
                ),
                None,
            )
            if length is not None and len(body) >= length:
                break
        try:
            chunk = s.recv(1 << 16)
        except ConnectionResetError:
            break
        if not chunk:
            break
        data += chunk
    top, _, body = data.partition(b"\r\n\r\n")
    status = int(top.split(b" ", 2)[1]) if top else 0
    return status, orjson.loads(body) if body else {}, time.monotonic() - t0


def hold(port: int, start: bytes) -> socket.socket:
    """A connection that has sent ``start`` and waits (the caller closes it)."""
    s = socket.create_connection(("127.0.0.1", port), timeout=30)
    s.sendall(start)
    return s


def conversation(port: int, data: bytes, timeout: float = 30) -> list[tuple[int, dict, bytes]]:
    """Send ``data`` (one request or several, pipelined) and read until the server closes the
    connection: each answer as (status, lower-cased headers, body). An answer that keeps the
    connection open is followed by keep-alive's idle close, so this ends either way."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        s.sendall(data)
        raw = b""
        while True:
            try:
                chunk = s.recv(1 << 16)
            except (ConnectionResetError, TimeoutError):
                break
            if not chunk:
                break
            raw += chunk
    answers = []
    while raw:
        top, _, rest = raw.partition(b"\r\n\r\n")
        lines = top.decode("latin-1").split("\r\n")
        headers = dict(line.lower().split(": ", 1) for line in lines[1:] if ": " in line)
        length = int(headers.get("content-length", len(rest)))
        answers.append((int(lines[0].split(" ", 2)[1]), headers, rest[:length]))
        raw = rest[length:]
    return answers
