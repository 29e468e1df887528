"""The scheduler process's entry: the function the frontend hands ``multiprocessing`` to start
that process. Torch-free, as everything the HTTP process imports: the engine's side
(``scheduler_proc``, which names the engine's types) is imported once the new process runs
(import-linter's frontend contract ignores exactly that import)."""

from __future__ import annotations

from multiprocessing.connection import Connection

from engine.config import EngineConfig
from engine.request.messages import Launch


def run_scheduler(config: EngineConfig, conn: Connection, launch: Launch | None = None) -> None:
    """The scheduler process: ``scheduler_proc.scheduler_main`` builds the engine and serves
    ``conn`` until told to stop."""
    from engine.server.scheduler_proc import scheduler_main  # in the new process only

    scheduler_main(config, conn, launch)
