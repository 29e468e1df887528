"""`engine serve`'s processes: the scheduler process, then the HTTP frontend in this one.

Lifecycle, as the server promises it:
- SIGTERM / SIGINT: stop accepting, abort in-flight requests (each with a receipt), write
  ``boot.stop``, exit 0. A second SIGINT forces the exit.
- The scheduler process dies: in-flight and new requests get a 503 naming the reason, the reason
  is printed, and the frontend exits 1. It never hangs.
"""

from __future__ import annotations

import signal
import sys
import threading
from pathlib import Path
from types import FrameType

import uvicorn

from engine.config import EngineConfig
from engine.obs.death import write_death
from engine.obs.tracing import setup_tracing
from engine.server.app import create_app
from engine.server.driver import EngineDriver

EXIT_SCHEDULER_DIED = 1


class _Server(uvicorn.Server):
    def __init__(self, config: uvicorn.Config, driver: EngineDriver) -> None:
        super().__init__(config)
        self.driver = driver

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
) -> int:
    """Boot the engine, serve until told to stop, and return the process exit status.
    Raises RuntimeError (with the reason) when the engine cannot start."""
    status = {"code": 0}
    server: list[_Server] = []

    def on_dead(reason: str) -> None:
        print(f"attest: the scheduler process died: {reason}; stopping the server", file=sys.stderr)
        # its boot log ends in a crash, said as such (boot_health's stopped_in_order reads it)
        write_death(cfg.log_file, "scheduler_died", driver.in_flight_at_death)
        status["code"] = EXIT_SCHEDULER_DIED
        if server:
            server[0].should_exit = True

    driver = EngineDriver(cfg, on_dead=on_dead)
    driver.start()  # the scheduler process builds the engine
    d = driver.info
    name = served_model_name or Path(d.model).stem
    print(f"Attest serving {name} at http://{host}:{port}/v1", flush=True)
    print(
        f"  model {d.model} ({d.parameters:,} parameters, {d.dtype}), "
        f"loaded in {d.load_seconds} s\n"
        f"  KV pool {d.kv_tokens:,} tokens x {d.kv_bytes_per_token:,} B "
        f"= {d.kv_pool_bytes / 2**20:,.0f} MiB ({d.kv_sizing}); context {d.context:,}\n"
        f"  boot log {cfg.log_file}; audit it with: audit verdict {cfg.log_file}",
        flush=True,
    )
    # this process's own provider: the scheduler process has its own
    tracing = setup_tracing(
        cfg.otlp_endpoint,
        "frontend",
        on_drop=lambda text: driver.notice("spans_dropped_frontend", text, process="frontend"),
    )
    if tracing.enabled:
        print(f"  traces to {tracing.endpoint} (OTLP/HTTP)", flush=True)
    app = create_app(driver, name, api_key=api_key, tracing=tracing)
    config = uvicorn.Config(
        app, host=host, port=port, log_level="warning", timeout_graceful_shutdown=30
    )
    srv = _Server(config, driver)
    server.append(srv)
    try:
        if driver.dead:  # it died while we were printing (the reader has said so)
            return EXIT_SCHEDULER_DIED
        srv.run()
        return status["code"]
    finally:
        driver.stop()  # after uvicorn has closed its connections; a no-op when already stopped
        tracing.shutdown()  # bounded: a dead collector must not hold up the exit
