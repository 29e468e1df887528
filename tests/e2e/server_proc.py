"""A real `engine serve` process on loopback, started and stopped the way an operator would."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time

import httpx


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ServerProc:
    def __init__(
        self,
        log_file,
        *args: str,
        ready_timeout: float = 300,
        env: dict[str, str] | None = None,
        new_session: bool = False,
    ) -> None:
        """``env``: variables set for the server on top of this process's environment;
        ``new_session``: the server leads a process group of its own (to signal the group).
        The limits here (``ready_timeout``, ``stop``'s ``timeout``) are upper bounds on waits for
        work that is quick when the machine is: roomy, so a busy machine is slow, never red."""
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.log_file = log_file
        # the key /metrics needs, where the server has one
        self.key = args[args.index("--api-key") + 1] if "--api-key" in args else None
        cmd = [
            sys.executable,
            "-m",
            "cli.engine_app",
            "serve",
            "--port",
            str(self.port),
            "--log-file",
            str(log_file),
            *args,
        ]
        self.proc = subprocess.Popen(
            cmd,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env={**os.environ, **env} if env else None,
            start_new_session=new_session,
        )
        deadline = time.monotonic() + ready_timeout
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited early:\n{self.proc.stdout.read()}")
            try:
                if httpx.get(self.base + "/health", timeout=10).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                self.proc.kill()
                raise RuntimeError(f"server did not become healthy in {ready_timeout:.0f} s")
            time.sleep(0.3)

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 120) -> tuple[int, str]:
        """Send ``sig`` and wait: (exit status, everything the server printed)."""
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            out, _ = self.proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            out, _ = self.proc.communicate()
            raise AssertionError(f"no exit within {timeout} s of {sig!r}:\n{out}") from None
        return self.proc.returncode, out

    def scheduler_pid(self) -> int:
        """The scheduler process (not multiprocessing's resource tracker)."""
        pid, found = self.proc.pid, []
        for task in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{task}/children") as f:
                for child in map(int, f.read().split()):
                    with open(f"/proc/{child}/cmdline", "rb") as c:
                        if b"resource_tracker" not in c.read():
                            found.append(child)
        assert len(found) == 1, found
        return found[0]

    def dump_stacks(self) -> None:
        """Every process of the server (frontend, scheduler, ranks) writes its threads' stacks
        to the server's output (``SIGUSR1``): where each one waits, for a test that found a
        hang to say so."""
        import psutil

        try:
            procs = [psutil.Process(self.proc.pid)]
            procs += procs[0].children(recursive=True)
        except psutil.NoSuchProcess:
            return
        for p in procs:  # one at a time: the dumps share one output
            try:
                if "resource_tracker" not in " ".join(p.cmdline()):
                    p.send_signal(signal.SIGUSR1)
                    time.sleep(0.5)
            except psutil.Error:
                pass

    def metrics(self) -> dict[str, float]:
        """The /metrics samples, by their full name with labels."""
        out = {}
        auth = {"authorization": f"Bearer {self.key}"} if self.key else {}
        for line in httpx.get(self.base + "/metrics", headers=auth, timeout=60).text.splitlines():
            if line and not line.startswith("#"):
                name, value = line.rsplit(" ", 1)
                out[name] = float(value)
        return out


class Plain(threading.Thread):
    """A non-streaming completion of ``body`` in the background: its status and body. The
    limit only catches a hang."""

    def __init__(self, base: str, body: dict) -> None:
        super().__init__(daemon=True)
        self.base, self.request, self.status, self.body = base, body, None, None
        self.start()

    def run(self) -> None:
        r = httpx.post(self.base + "/v1/completions", json=self.request, timeout=600)
        self.status, self.body = r.status_code, r.json()
