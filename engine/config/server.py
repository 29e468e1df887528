"""The HTTP frontend's knobs (``engine/server/``): EngineConfig's ``server`` section: its limits
on what a client may send and how long it may take, whom it answers, and how long its own event
loop may stand."""

from __future__ import annotations

from dataclasses import dataclass

from engine.config.netloc import parse_host, parse_origin
from engine.config.rules import _knob, _Section, entries, is_int, need, seconds


@dataclass(frozen=True, slots=True)
class ServerSection(_Section):
    """The HTTP frontend's limits (engine/server/limits.py) and whom it answers
    (engine/server/gate.py)."""

    read_timeout: float = _knob(
        30.0, "Seconds a client may take to send a request's headers, then its body."
    )
    max_client_connections: int = _knob(
        128, "Connections one client address may hold open at once; 0: no cap."
    )
    request_timeout: float | None = _knob(
        600.0,
        "Seconds from a request's arrival to its last token, then it is aborted (504); "
        "0: no deadline.",
    )
    loop_stall_timeout: float = _knob(
        2.0,
        "Seconds the HTTP process's event loop may stand without a turn before it writes "
        "frontend.stall (boot_health FAILs such a boot); /health reports the loop's lag.",
    )
    allowed_hosts: tuple[str, ...] = _knob(
        (),
        "Host names served besides this server's own (localhost, the loopback addresses, the "
        "bind address, the machine's name), comma-separated: NAME or NAME:PORT; '*': any Host "
        "(the DNS-rebinding check off). Another Host is refused (403).",
    )
    allowed_origins: tuple[str, ...] = _knob(
        (),
        "Origins whose web pages may call the server (CORS), comma-separated, e.g. "
        "http://localhost:3000; '*': any. A request from another origin's page is refused (403).",
    )
    check_timeout: float = _knob(
        10.0,
        "Seconds a request's checks off the event loop (its schema, grammar and tools, the "
        "chat template, tokenizing) may take, in a worker thread; past them it is refused "
        "(503 with Retry-After: the server is too busy to check it).",
    )
    max_stored_responses: int = _knob(
        1000,
        "Stored responses (/v1/responses with store: true) a server without --kv-store-dir "
        "keeps in memory for previous_response_id and GET, least recently used dropped first "
        "(response.evict); a restart forgets them. With --kv-store-dir they are files beside "
        "the store, unbounded, and outlive a restart.",
    )

    enable_per_request_metrics: bool = _knob(
        False,
        "Answer each request's timings beside its usage, as vLLM's flag of this name does: a "
        "`metrics` object (queue, first token, decode, mean gap between tokens, tokens per "
        "second) from the numbers of its request.finish receipt; streamed, in the usage chunk.",
    )

    def validate(self) -> None:
        need(seconds(self.read_timeout), self, "read_timeout", "a number of seconds > 0")
        need(
            seconds(self.loop_stall_timeout), self, "loop_stall_timeout", "a number of seconds > 0"
        )
        need(
            is_int(self.max_client_connections, 0),
            self,
            "max_client_connections",
            "an integer >= 0 (0: no cap)",
        )
        need(
            self.request_timeout is None or seconds(self.request_timeout),
            self,
            "request_timeout",
            "None or a number of seconds > 0",
        )
        need(
            entries(self.allowed_hosts, parse_host),
            self,
            "allowed_hosts",
            "a tuple of '*' or hosts (NAME or NAME:PORT; an IPv6 address in brackets)",
        )
        need(
            entries(self.allowed_origins, parse_origin),
            self,
            "allowed_origins",
            "a tuple of '*' or origins (scheme://host[:port], no path)",
        )
        need(seconds(self.check_timeout), self, "check_timeout", "a number of seconds > 0")
        need(
            is_int(self.max_stored_responses, 1),
            self,
            "max_stored_responses",
            "an integer >= 1",
        )
