"""Processes started on this machine: a free loopback port, and a child that dies with us."""

from __future__ import annotations

import ctypes
import signal
import socket
from collections.abc import Callable

PR_SET_PDEATHSIG = 1  # linux/prctl.h


def free_port() -> int:
    """A TCP port on 127.0.0.1 nobody holds right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def dies_with_parent(sig: int = signal.SIGTERM) -> Callable[[], None] | None:
    """A ``preexec_fn`` that asks Linux to send the child ``sig`` when this process dies, even
    by SIGKILL, when no cleanup of ours can run: the child then stops instead of living on as
    an orphan that holds a port and the CPU. Resolved here, in the parent: the child only makes
    the one call between fork and exec. None where there is no prctl (not Linux)."""
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
    n = int(sig)
    return lambda: prctl(PR_SET_PDEATHSIG, n, 0, 0, 0) and None
