"""A stop signal before `engine serve` serves is noted, not obeyed on the spot, and the start-up
acts on it where it next looks: the HTTP server that starts after it stops at once, drains the
scheduler with the signal's reason and never says the boot is ready."""

from __future__ import annotations

import signal
import socket
import threading
import time

import uvicorn

from engine.server.launch import EarlyStop, _Server


def test_a_signal_while_caught_is_noted_once_and_the_handlers_come_back():
    before = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)
    with EarlyStop().caught() as early:
        assert early.reason() is None
        signal.raise_signal(signal.SIGTERM)  # Python's own handling would end this process
        signal.raise_signal(signal.SIGINT)  # and this one raise KeyboardInterrupt
        assert (early.signal, early.reason()) == (signal.SIGTERM, "sigterm")
    assert (signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)) == before


class Driver:
    """What the HTTP server tells the driver, kept."""

    def __init__(self) -> None:
        self.said: list[tuple[str, object]] = []

    def drain(self, reason: str) -> None:
        self.said.append(("drain", reason))

    def serving(self, host: str, port: int) -> None:
        self.said.append(("serving", port))


async def _app(scope, receive, send) -> None:  # never called: nothing connects
    raise AssertionError(scope)


def test_a_signal_noted_before_the_http_server_started_stops_it_without_boot_ready():
    early, driver = EarlyStop(), Driver()
    early.note(signal.SIGTERM, None)  # between the engine's Ready and uvicorn's own handlers
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    config = uvicorn.Config(_app, log_level="warning", lifespan="off")
    server = _Server(config, driver, sock, early)  # type: ignore[arg-type]
    # a server that went on serving is stopped from outside, late, and fails below (not a hang)
    watchdog = threading.Timer(60, server.stop)
    watchdog.start()
    try:
        server.run(sockets=[sock])  # returns: it stopped as it started
    finally:
        watchdog.cancel()
        sock.close()
    deadline = time.monotonic() + 60  # the drain is sent from a thread of its own
    while not driver.said and time.monotonic() < deadline:
        time.sleep(0.01)
    assert driver.said == [("drain", "sigterm")]  # and never ("serving", ...): not ready
