"""Where a process stands, on request: ``SIGUSR1`` writes every thread's Python stack to the
process's stderr (the server's output), and the process goes on. A serving process that stops
answering can say where it waits (a collective, a pipe, a lock) without a debugger attached:
``kill -USR1 PID`` for each of the frontend, the scheduler and the ranks."""

from __future__ import annotations

import faulthandler
import signal
import sys


def dump_stacks_on_signal() -> None:
    """Register the dump for this process (where the platform has ``SIGUSR1``)."""
    if hasattr(signal, "SIGUSR1"):
        faulthandler.register(signal.SIGUSR1, file=sys.stderr, all_threads=True, chain=False)
