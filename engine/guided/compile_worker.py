"""A grammar compile worker: a process of its own that compiles guides, one at a time, so that a
compile past its time limit can be ended (killed) and its CPU is free again at once. xgrammar
0.2.9 has no way to stop a compile (its issue #298 asks for one), and a thread cannot be killed.

The worker only says whether a guide compiles and how long it took: the compiled grammar stays
in the worker. Carried back, it would cost more than the compile (``serialize_json`` of a
100-property schema's grammar over a 49,152-token vocabulary: 23.7 MB of JSON, 1.6 s to write
and 0.5 s to read, against a 1.2 s compile), so the scheduler's process compiles a guide again
once a worker has compiled it within the limit: known to end, and in about the same time.

The protocol, one JSON line each way: the parent writes the vocabulary (``TokenizerInfo``'s
JSON), the worker answers ``{"ready": ms}``; then per guide ``{"kind", "spec", "strict"}``,
answered ``{"ms": ...}`` or ``{"outcome", "error"}``. The worker ends when its input does (the
scheduler's process closed it, or died).
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future

import orjson

from engine.guided.build import CompileError, compile_guide
from engine.request.guide import Guide


class WorkerDied(RuntimeError):
    """The worker process ended while it compiled (killed at its limit, or crashed)."""


class Worker:
    """One compile worker process and the thread that talks to it. ``compile`` hands it a
    guide (one at a time); the future holds the compile's milliseconds, or raises a
    ``CompileError`` (it does not compile) or ``WorkerDied``. ``vocabulary`` makes the
    ``TokenizerInfo``'s JSON it is handed first, on the talking thread (building it loads
    xgrammar here: seconds the scheduler's loop does not wait)."""

    def __init__(self, vocabulary: Callable[[], str]) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "engine.guided.compile_worker"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env={**os.environ, "OMP_NUM_THREADS": "1"},
        )
        self.pid = self.proc.pid
        self.spawned = time.monotonic()
        # set by the talking thread once xgrammar is built: a compile's time limit counts
        # from then, never the worker's start (seconds: xgrammar imports torch)
        self.ready_at: float | None = None
        self.ready_ms: float | None = None  # the worker's own start, as it measured it
        self._lock = threading.Lock()
        self._jobs: list[tuple[Guide, Future]] = []
        self._wake = threading.Condition(self._lock)
        self._vocabulary = vocabulary
        threading.Thread(target=self._talk, name=f"grammar-worker-{self.pid}", daemon=True).start()

    def compile(self, guide: Guide) -> Future:
        future: Future = Future()
        with self._wake:
            self._jobs.append((guide, future))
            self._wake.notify()
        return future

    @property
    def alive(self) -> bool:
        return self.proc.poll() is None

    def kill(self) -> None:
        """End the process now (SIGKILL: xgrammar's C++ holds no signal handler to wait for);
        the talking thread reaps it."""
        try:
            self.proc.kill()
        except OSError:
            pass

    def close(self) -> None:
        """End the worker: its input closed (it exits by itself when idle), then killed."""
        try:
            self.proc.stdin.close()
        except OSError:
            pass
        self.kill()

    def _talk(self) -> None:
        job: tuple[Guide, Future] | None = None
        try:
            self._send(self._vocabulary().encode())
            self.ready_ms = self._receive()["ready"]
            self.ready_at = time.monotonic()
            while True:
                with self._wake:
                    while not self._jobs:
                        self._wake.wait()
                    job = self._jobs.pop(0)
                guide, future = job
                self._send(
                    orjson.dumps({"kind": guide.kind, "spec": guide.spec, "strict": guide.strict})
                )
                answer = self._receive()
                job = None
                if "ms" in answer:
                    future.set_result(answer["ms"])
                else:
                    future.set_exception(CompileError(answer["error"], answer["outcome"]))
        except (OSError, ValueError, EOFError):
            code = self.proc.wait()
            if job is not None:
                job[1].set_exception(WorkerDied(f"the compile worker ended (exit code {code})"))

    def _send(self, line: bytes) -> None:
        self.proc.stdin.write(line + b"\n")
        self.proc.stdin.flush()

    def _receive(self) -> dict:
        line = self.proc.stdout.readline()
        if not line:
            raise EOFError
        return orjson.loads(line)


def main() -> None:
    """The worker process: the vocabulary, then guides, one JSON line each (module doc)."""
    out = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)  # anything else printed goes to stderr, never into the answers
    t0 = time.perf_counter()
    import xgrammar as xgr

    source = sys.stdin.buffer
    info = xgr.TokenizerInfo.deserialize_json(source.readline().decode())
    compiler = xgr.GrammarCompiler(info, max_threads=1, cache_enabled=False)

    def answer(body: dict) -> None:
        out.write(orjson.dumps(body) + b"\n")
        out.flush()

    answer({"ready": (time.perf_counter() - t0) * 1e3})
    for line in source:
        job = orjson.loads(line)
        guide = Guide(job["kind"], job["spec"], job["strict"])
        t = time.perf_counter()
        try:
            compile_guide(compiler, guide)
            answer({"ms": (time.perf_counter() - t) * 1e3})
        except CompileError as e:
            answer({"outcome": e.outcome, "error": str(e)})
        except Exception as e:  # the compiler's own fault, said as such
            answer({"outcome": "error", "error": f"the {guide.kind} could not be compiled ({e!r})"})


if __name__ == "__main__":
    main()
