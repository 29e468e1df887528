"""A peer's processes, in the peer's own virtualenv. Its worker, spoken to in JSON lines: one
request a line on its stdin, one answer a line on its stdout. The first request loads the model;
its answer is ``info`` (what runs). llama.cpp's and vLLM's arms (measure/llamacpp.py,
measure/vllm_cpu.py) are two of these: their environments cannot be imported here, so their
engines run there. Its HTTP server on loopback (``LoopbackServer``: llama-server's and vLLM's
for the online comparison), healthy before it is used, stopped in order after."""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO

import httpx


class MissingEnv(RuntimeError):
    """A peer's environment is absent or cannot import the peer; the message says how to
    create it."""


def env_python(env: str | Path) -> Path:
    return Path(env) / "bin" / "python"


def env_version(
    env: str | Path, module: str, code: str, message: Callable[[str | Path, str], str]
) -> str:
    """The peer's version in ``env`` (what ``code`` prints, importing ``module``); MissingEnv
    with ``message(env, why)`` when the environment is not there or cannot import it."""
    python = env_python(env)
    if not python.exists():
        raise MissingEnv(message(env, f"is missing (no {python})"))
    ok, said = probe(python, code)
    if not ok:
        raise MissingEnv(message(env, f"cannot import {module} ({said})"))
    return said


def probe(python: str | Path, code: str) -> tuple[bool, str]:
    """``code`` run by a peer environment's ``python`` (it imports the peer and prints its
    version): (True, the last line printed) or (False, the last line of the error)."""
    done = subprocess.run([str(python), "-c", code], capture_output=True, text=True)
    if done.returncode != 0:
        return False, (done.stderr.strip().splitlines() or ["?"])[-1]
    return True, (done.stdout.strip().splitlines() or [""])[-1]


class PeerWorker:
    """The worker ``script`` run by ``python``; ``name`` says whose it is in an error."""

    name = "the peer"
    close_timeout = 30.0  # seconds a worker has to quit before it is killed

    def __init__(
        self,
        python: str | Path,
        script: str | Path,
        load: dict,
        env: dict[str, str] | None = None,
        stderr: IO[str] | None = None,
    ) -> None:
        self.proc = subprocess.Popen(
            [str(python), str(script)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=stderr,
            text=True,
            env=env,
        )
        try:
            self.info: dict = self._ask(load)
        except BaseException:
            self.close()
            raise

    def _ask(self, req: dict) -> dict:
        """One request's answer; RuntimeError when the worker has ended."""
        assert self.proc.stdin is not None and self.proc.stdout is not None
        try:
            self.proc.stdin.write(json.dumps(req) + "\n")
            self.proc.stdin.flush()
            line = self.proc.stdout.readline()
        except BrokenPipeError:
            line = ""
        if not line:
            raise RuntimeError(
                f"{self.name}'s worker ended (exit {self.proc.wait()}); see its stderr"
            )
        return json.loads(line)

    def close(self) -> None:
        """Ask the worker to quit; kill it when it does not within ``close_timeout``."""
        if self.proc.poll() is None:
            try:
                self.proc.stdin.write(json.dumps({"op": "quit"}) + "\n")
                self.proc.stdin.close()
                self.proc.wait(timeout=self.close_timeout)
            except (OSError, subprocess.TimeoutExpired):
                self.proc.kill()
                self.proc.wait()

    def __enter__(self):
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class LoopbackServer:
    """A peer's HTTP server started by ``cmd`` on loopback at ``port``, its output in ``log``;
    ``base`` is its URL once /health answers (within ``ready_timeout`` s, else it is stopped and
    the error raised). ``stop``: SIGTERM, then SIGKILL after ``grace`` seconds."""

    def __init__(
        self,
        cmd: list[str],
        port: int,
        log: Path,
        ready_timeout: float,
        name: str,
        env: dict[str, str] | None = None,
        grace: float = 30,
    ) -> None:
        self.base, self.grace = f"http://127.0.0.1:{port}", grace
        self.log = open(log, "w")  # noqa: SIM115 (closed in stop)
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT, env=env)
        try:
            wait_healthy(self.proc, self.base, ready_timeout, f"{name} ({log})")
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        stop_process(self.proc, self.grace)
        self.log.close()


def wait_healthy(proc: subprocess.Popen, base: str, timeout: float, what: str) -> None:
    """Poll ``base``/health until a 200; RuntimeError naming ``what`` when the process exits
    first or ``timeout`` seconds pass."""
    deadline = time.monotonic() + timeout
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited early (exit {proc.returncode})")
        try:
            if httpx.get(base + "/health", timeout=5).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what} not healthy in {timeout:.0f} s")
        time.sleep(0.3)


def stop_process(proc: subprocess.Popen, grace: float = 30) -> None:
    """SIGTERM, then SIGKILL after ``grace`` seconds."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(grace)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
