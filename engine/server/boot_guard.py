"""What `engine serve` claims before anything heavy happens: its port, its pid file and its
boot log. Each is refused at once, naming the PID that holds it where the system shows it, so a
second instance never loads a model only to fail at bind, nor appends its boot to a live log.

Locks are ``flock`` locks, released by the kernel when their holder dies however it dies: a pid
file whose lock nobody holds is stale (its writer is gone) and is taken over, and the taker
says whose it was. Linux's ``/proc`` names the holders; elsewhere the refusal says less.
"""

from __future__ import annotations

import errno
import fcntl
import os
import re
import shlex
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from engine.observability.clip import clip

EXIT_REFUSED = 75  # sysexits EX_TEMPFAIL: what it needs is held now; retry once it is free
_LOCK_LINE = re.compile(r"\s(\d+)\s+([0-9a-f]+):([0-9a-f]+):(\d+)\s")


class BootRefused(RuntimeError):
    """A boot refused before it started; the message names what is held and by whom."""

    code = EXIT_REFUSED


@dataclass(frozen=True, slots=True)
class StalePid:
    """A pid file left by a process that died holding it."""

    path: str
    pid: int | None  # the pid written in it (None: unreadable)
    running: bool  # a process of that pid exists now (the pid was reused)


def describe(pid: int | None) -> str:
    """``pid N (its command line)``, as far as the system shows it: its arguments as a shell
    would read them, as many whole ones as fit in about 120 characters, and how many more."""
    if pid is None:
        return "another process (its PID is not visible here)"
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes().rstrip(b"\0")
    except OSError:
        return f"pid {pid}"
    if not raw:  # a kernel thread, or a process on its way out
        return f"pid {pid}"
    args = [shlex.quote(a.decode(errors="replace")) for a in raw.split(b"\0")]
    return f"pid {pid} ({clip(args, 120, 'argument')})"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's process
    return True


# -- the port ----------------------------------------------------------------------------------


def port_holder(port: int) -> int | None:
    """The PID of a process listening on TCP ``port`` (Linux, where /proc shows it)."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            cols = line.split()
            if len(cols) > 9 and cols[3] == "0A" and int(cols[1].rsplit(":", 1)[1], 16) == port:
                inodes.add(f"socket:[{cols[9]}]")
    for pid in _pids():
        try:
            for fd in os.listdir(f"/proc/{pid}/fd"):
                if os.readlink(f"/proc/{pid}/fd/{fd}") in inodes:
                    return pid
        except OSError:
            continue  # gone, or not ours to read
    return None


def _pids() -> list[int]:
    try:
        return [int(p) for p in os.listdir("/proc") if p.isdigit()]
    except OSError:
        return []


def listen(host: str, port: int, backlog: int = 2048) -> socket.socket:
    """A socket bound to (host, port) and listening: the port is held from here on, before the
    model loads (connections wait in the backlog until the HTTP server starts)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # past TIME_WAIT, never a listener
    try:
        sock.bind((host, port))
        sock.listen(backlog)
    except OSError as e:
        sock.close()
        if e.errno == errno.EADDRINUSE:
            raise BootRefused(
                f"port {port} on {host} is already in use by {describe(port_holder(port))}; "
                "stop it or choose another --port"
            ) from None
        raise BootRefused(f"cannot listen on {host}:{port}: {e.strerror}") from None
    sock.set_inheritable(False)
    return sock


# -- the boot log and the pid file -------------------------------------------------------------


def lock_holder(path: str | Path) -> int | None:
    """The PID holding a lock on the file at ``path`` (Linux /proc/locks), or None."""
    try:
        st = os.stat(path)
        text = Path("/proc/locks").read_text()
    except OSError:
        return None
    want = (os.major(st.st_dev), os.minor(st.st_dev), st.st_ino)
    for m in _LOCK_LINE.finditer(" " + text.replace("\n", " \n ")):
        if (int(m[2], 16), int(m[3], 16), int(m[4])) == want:
            return int(m[1])
    return None


def _try_lock(f: IO) -> bool:
    try:
        fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


def lock_log(path: str | Path) -> IO[bytes]:
    """Hold the boot log for this boot (until the returned file is closed, or this process
    dies). A log another live boot holds is refused: two boots never share one log."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    f = p.open("ab")  # appends nothing: only the lock is wanted
    if not _try_lock(f):
        f.close()
        raise BootRefused(
            f"boot log {p} is held by a live boot: {describe(lock_holder(p))}; "
            "give this boot its own --log-file"
        )
    return f


class PidFile:
    """A pid file held (flock) for the life of this process, removed by an orderly exit."""

    def __init__(self, path: Path, f: IO[str]) -> None:
        self.path = path
        self._f = f

    @classmethod
    def claim(cls, path: str | Path) -> tuple[PidFile, StalePid | None]:
        """Hold ``path`` and write this process's pid in it. Refused when a live process holds
        it; a stale one (nobody holds its lock) is taken over and returned as ``StalePid``."""
        p = Path(path)
        p.parent.mkdir(parents=True, exist_ok=True)
        for _ in range(3):  # the file may be removed by its holder between open and lock
            f = p.open("a+")
            if not _try_lock(f):
                f.seek(0)
                pid = _pid_in(f.read())
                f.close()
                raise BootRefused(
                    f"pid file {p} is held by {describe(pid)}: "
                    "another engine serve is running with it"
                )
            if os.path.exists(p) and os.stat(p).st_ino == os.fstat(f.fileno()).st_ino:
                break
            f.close()
        else:
            raise BootRefused(f"pid file {p} keeps being replaced; is another boot starting?")
        f.seek(0)
        text = f.read()
        stale = None
        if text.strip():
            pid = _pid_in(text)
            stale = StalePid(str(p), pid, pid is not None and _alive(pid))
        f.seek(0)
        f.truncate()
        f.write(f"{os.getpid()}\n")
        f.flush()
        return cls(p, f), stale

    def release(self) -> None:
        """Remove the file (still ours: we hold its lock) and let go. Idempotent."""
        if self._f.closed:
            return
        try:
            self.path.unlink()
        except OSError:
            pass
        self._f.close()


def _pid_in(text: str) -> int | None:
    head = text.strip().split("\n", 1)[0].strip()
    return int(head) if head.isdigit() else None


# -- all three, in order -----------------------------------------------------------------------


@dataclass(slots=True)
class Claims:
    """What a boot holds until it exits: its listening socket, its pid file and its log."""

    sock: socket.socket
    log: IO[bytes] | None = None
    pid_file: PidFile | None = None
    stale: StalePid | None = None

    def release(self) -> None:
        self.sock.close()
        if self.pid_file is not None:
            self.pid_file.release()
        if self.log is not None:
            self.log.close()


def claim(log_file: str | None, pid_file: str | None, host: str, port: int) -> Claims:
    """Hold the port, the pid file and the boot log, in that order (a refusal creates no file),
    or refuse (BootRefused) and let go of what was already held. Nothing heavy has happened."""
    sock = listen(host, port)
    pid: PidFile | None = None
    try:
        pid, stale = PidFile.claim(pid_file) if pid_file else (None, None)
        return Claims(sock, lock_log(log_file) if log_file else None, pid, stale)
    except BaseException:
        if pid is not None:
            pid.release()
        sock.close()
        raise
