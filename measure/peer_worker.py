"""A peer's worker process in the peer's own virtualenv, spoken to in JSON lines: one request a
line on its stdin, one answer a line on its stdout. The first request loads the model; its answer
is ``info`` (what runs). llama.cpp's and vLLM's arms (measure/llamacpp.py, measure/vllm_cpu.py)
are two of these: their environments cannot be imported here, so their engines run there."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import IO


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
