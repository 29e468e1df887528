"""`engine serve`'s processes: the scheduler process, then the HTTP frontend in this one.

Lifecycle, as the server promises it:
- Before anything heavy: the boot log, the pid file and the port are claimed, or the boot is
  refused at once naming the PID that holds them (``boot_guard``). The listening socket is bound
  here and handed to uvicorn, so ``boot.ready`` (written when uvicorn serves) means serving.
- SIGTERM / SIGINT: stop accepting; what is in flight may finish for up to ``drain_timeout``
  seconds (``boot.drain``), the rest is aborted (each with a receipt); ``boot.stop``; exit 0.
  A second SIGINT forces the exit. Before the server serves (the model loading, the HTTP
  server being set up) the signal is noted (``EarlyStop``) and the start stops in order at its
  next step: ``boot.stop`` with the signal's reason, exit 0, no scheduler process left behind.
- The scheduler process dies: in-flight and new requests get a 503 naming the reason, the
  frontend ends each in the boot log and writes ``boot.stop`` with the signal, and exits 1.
- The scheduler process stops turning (frozen, stopped): ``/health`` says so past
  ``stall_timeout`` seconds without a heartbeat. It never hangs unseen.
- The boot fails before it serves (the engine cannot be built, the HTTP server cannot be set up
  or does not start): the boot log ends with ``boot.stop`` ``boot_failed``, the exit code and
  the message, and the process exits with that code (2; 3 where uvicorn did not start).
"""

from __future__ import annotations

import signal
import socket
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict
from pathlib import Path
from types import FrameType
from typing import Any

import uvicorn

from engine.config import EngineConfig
from engine.observability import schema
from engine.observability.clip import clip_words
from engine.observability.death import (
    ERROR_CHARS,
    write_boot_failed,
    write_boot_stopped,
    write_death,
)
from engine.observability.tracing import Tracing, setup_tracing
from engine.request.messages import Launch
from engine.server.app import create_app
from engine.server.boot_guard import claim
from engine.server.driver import EngineDriver, StartStopped
from engine.server.limits import HttpLimits, http_options

EXIT_SCHEDULER_DIED = 1
EXIT_BOOT_FAILED = 2  # the engine could not be built (a bad option's code: a bad --tp, say)
EXIT_STARTUP_FAILED = 3  # uvicorn's own code for a server that never started
SHUTDOWN_MARGIN_S = 10.0  # past the drain: connections close, the scheduler process exits


class BootFailed(RuntimeError):
    """The boot exited before it served; its log ends with ``boot.stop`` ``boot_failed`` saying
    why, with ``code``, the status the process exits with."""

    code = EXIT_BOOT_FAILED


class EarlyStop:
    """SIGTERM / SIGINT before uvicorn takes the signals over (``caught``): the first is noted,
    and the start-up stops in order where it next looks (``EngineDriver.start``'s wait,
    ``_Server.startup``). Python's own handling would end the process there and then (143, or
    a KeyboardInterrupt), writing no ``boot.stop`` and leaving the scheduler process behind."""

    def __init__(self) -> None:
        self.signal: int | None = None

    def note(self, sig: int, frame: FrameType | None) -> None:
        if self.signal is None:
            self.signal = sig

    def reason(self) -> str | None:
        """The noted signal's name as a ``boot.stop`` reason (``sigterm``), or None."""
        return None if self.signal is None else signal.Signals(self.signal).name.lower()

    @contextmanager
    def caught(self) -> Iterator[EarlyStop]:
        """Note the signals while this lasts (from the main thread only, as Python allows)."""
        if threading.current_thread() is not threading.main_thread():
            yield self
            return
        before = {sig: signal.signal(sig, self.note) for sig in (signal.SIGTERM, signal.SIGINT)}
        try:
            yield self
        finally:
            for sig, handler in before.items():
                signal.signal(sig, handler)


class _Server(uvicorn.Server):
    def __init__(
        self, config: uvicorn.Config, driver: EngineDriver, sock: socket.socket, early: EarlyStop
    ) -> None:
        super().__init__(config)
        self.driver = driver
        self.sock = sock
        self.early = early

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        if self.early.signal is not None:  # noted before uvicorn took the signals over
            self.handle_exit(self.early.signal, None)
        elif self.started:  # serving now: only now is the boot ready
            host, port = self.sock.getsockname()[:2]
            self.driver.serving(host, port)

    def stop(self) -> None:
        """Stop serving (uvicorn's own exit flag)."""
        self.should_exit = True

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        # uvicorn would re-raise the signal after its shutdown, turning an orderly stop into a
        # death by signal; we stop the engine ourselves and exit 0 instead.
        if self.should_exit:
            if sig == signal.SIGINT:
                self.force_exit = True
            return
        name = signal.Signals(sig).name.lower()
        # not from the handler itself: it may have interrupted this thread inside a send
        threading.Thread(target=self.driver.drain, args=(name,), daemon=True).start()
        self.should_exit = True


def serve(
    cfg: EngineConfig,
    host: str = "127.0.0.1",
    port: int = 8000,
    served_model_name: str | None = None,
    api_key: str | None = None,
    *,
    pid_file: str | None = None,
    drain_timeout: float = 0.0,
    stall_timeout: float = 10.0,
) -> int:
    """Boot the engine, serve until told to stop, and return the process exit status.
    ``pid_file`` defaults to the boot log's path + ``.pid``. Raises BootRefused when the log,
    the pid file or the port is held, RuntimeError (with the reason) when the engine cannot
    start."""
    if not drain_timeout >= 0:
        raise ValueError(f"drain_timeout must be a number of seconds >= 0, got {drain_timeout!r}")
    if not stall_timeout > 0:
        raise ValueError(f"stall_timeout must be a number of seconds > 0, got {stall_timeout!r}")
    if pid_file is None and cfg.observability.log_file:
        pid_file = cfg.observability.log_file + ".pid"
    claims = claim(cfg.observability.log_file, pid_file, host, port)  # before anything heavy
    try:
        stale = asdict(claims.stale) if claims.stale else None
        launch = Launch(argv=list(sys.argv), stale_pid=stale, stall_s=stall_timeout)
        with EarlyStop().caught() as early:
            return _serve(
                cfg,
                claims.sock,
                host,
                served_model_name,
                api_key,
                launch,
                drain_timeout,
                stall_timeout,
                early,
            )
    except StartStopped as e:
        print(f"attest: {e}; stopped in order", file=sys.stderr, flush=True)
        return 0
    finally:
        claims.release()


def _serve(
    cfg: EngineConfig,
    sock: socket.socket,
    host: str,
    served_model_name: str | None,
    api_key: str | None,
    launch: Launch,
    drain_timeout: float,
    stall_timeout: float,
    early: EarlyStop,
) -> int:
    status = {"code": 0}
    server: list[_Server] = []

    def on_dead(reason: str) -> None:
        print(f"attest: the scheduler process died: {reason}; stopping the server", file=sys.stderr)
        # its boot log ends in a crash, said as such (boot_health's stopped_in_order reads it)
        if not driver.ended_itself:  # a failed group wrote its own ending
            write_death(
                cfg.observability.log_file, "scheduler_died", driver.lost_at_death, driver.exit_code
            )
        status["code"] = EXIT_SCHEDULER_DIED
        if server:
            server[0].stop()

    driver = EngineDriver(
        cfg, on_dead=on_dead, launch=launch, drain_s=drain_timeout, stall_s=stall_timeout
    )
    _start(driver, cfg, early)  # the scheduler process builds the engine
    tracing: Tracing | None = None
    ending: dict[str, Any] = {}  # how the scheduler ends a boot that never served
    try:
        tracing = _tracing(cfg, driver)
        server.append(
            _server(
                cfg, driver, sock, host, served_model_name, api_key, tracing, drain_timeout, early
            )
        )
        if not driver.dead:  # it may have died while we were printing (the reader said so)
            server[0].run(sockets=[sock])
        if status["code"] == 0 and not server[0].started:
            ending = _failed(
                EXIT_STARTUP_FAILED, "the HTTP server did not start (uvicorn says why)"
            )
            return EXIT_STARTUP_FAILED
        return status["code"]
    except Exception as e:
        if server and server[0].started:
            raise  # it served: whatever this is, it is not a boot that failed
        ending = _failed(
            EXIT_BOOT_FAILED, f"the HTTP server could not be set up: {type(e).__name__}: {e}"
        )
        raise BootFailed(ending["cause"]["error"]) from e
    finally:
        # after uvicorn has closed its connections; a no-op when already stopped. A scheduler
        # that had to be killed here is a death (on_dead has run when stop returns).
        driver.stop(**ending)
        if tracing is not None:
            tracing.shutdown()  # bounded: a dead collector must not hold up the exit


def _start(driver: EngineDriver, cfg: EngineConfig, early: EarlyStop) -> None:
    """Start the scheduler process. Where its engine cannot be built, the boot it began ends
    in its log with ``boot.stop`` ``boot_failed``, the exit code and why, and BootFailed says
    why (what ``engine serve`` prints before it exits with that code). Where a stop signal
    came first, the boot ends with ``boot.stop`` naming it, and StartStopped says so."""
    try:
        driver.start(stop=early.reason)
    except StartStopped as e:
        write_boot_stopped(cfg.observability.log_file, driver.pid, e.reason)
        raise
    except RuntimeError as e:
        write_boot_failed(cfg.observability.log_file, driver.pid, EXIT_BOOT_FAILED, str(e))
        raise BootFailed(str(e)) from None


def _failed(code: int, error: str) -> dict[str, Any]:
    """``EngineDriver.stop``'s keywords for a boot that never served: the scheduler's
    ``boot.stop`` says ``boot_failed``, the exit code and why."""
    return {
        "reason": schema.BOOT_FAILED,
        "cause": {"exit_code": code, "error": clip_words(error, ERROR_CHARS)},
    }


def _tracing(cfg: EngineConfig, driver: EngineDriver) -> Tracing:
    """This process's own span provider (the scheduler process has its own)."""
    tracing = setup_tracing(
        cfg.observability.otlp_endpoint,
        "frontend",
        on_drop=lambda text: driver.notice("spans_dropped_frontend", text, process="frontend"),
    )
    if tracing.enabled:
        print(f"  traces to {tracing.endpoint} (OTLP/HTTP)", flush=True)
    return tracing


def _server(
    cfg: EngineConfig,
    driver: EngineDriver,
    sock: socket.socket,
    bind_host: str,
    served_model_name: str | None,
    api_key: str | None,
    tracing: Tracing,
    drain_timeout: float,
    early: EarlyStop,
) -> _Server:
    """The HTTP server over ``sock`` (the banner printed), not started yet; ``bind_host``: the
    --host it was bound to, a Host the server answers to (as is the address it names)."""
    host, port = sock.getsockname()[:2]
    name = served_model_name or Path(driver.info.model).stem
    shown = f"[{host}]" if ":" in host else host
    _banner(driver, cfg, name, f"http://{shown}:{port}/v1")
    limits = HttpLimits.of(cfg)
    app = create_app(
        driver, name, api_key=api_key, tracing=tracing, limits=limits, bind_host=bind_host
    )
    config = uvicorn.Config(
        app,
        host=host,
        port=port,
        log_level="warning",
        timeout_graceful_shutdown=int(drain_timeout + SHUTDOWN_MARGIN_S),
        **http_options(
            limits, app.refused
        ),  # head bounds and timeout, connections per client address
    )
    return _Server(config, driver, sock, early)


def _audit_target(cfg: EngineConfig) -> str:
    """What to hand `audit verdict`: the boot log, or with several ranks every rank's log."""
    if cfg.group.world == 1 or cfg.observability.log_file is None:
        return str(cfg.observability.log_file)
    p = Path(cfg.observability.log_file)
    return f"'{p.with_name(p.stem + '*' + p.suffix)}'"


def _banner(driver: EngineDriver, cfg: EngineConfig, name: str, url: str) -> None:
    d = driver.info
    print(f"Attest serving {name} at {url}", flush=True)
    print(
        f"  model {d.model} ({d.parameters:,} parameters, {d.dtype}), "
        f"loaded in {d.load_seconds} s; attention {d.attention_backend} on {d.device}\n"
        f"  KV pool {d.kv_tokens:,} tokens x {d.kv_bytes_per_token:,} B "
        f"= {d.kv_pool_bytes / 2**20:,.0f} MiB ({d.kv_sizing}); context {d.context:,}\n"
        f"  boot log {cfg.observability.log_file}; "
        f"audit it with: audit verdict {_audit_target(cfg)}\n"
        f"  scheduler process pid {driver.pid}; SIGTERM drains for up to {driver.drain_s:g} s",
        flush=True,
    )
