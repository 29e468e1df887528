"""`engine window NAME`: boot the engine with the window's recipe, drive its load over loopback,
stop it in order, and judge the boot log with the window's spec — one command.

With ``--control`` a second boot runs the recipe with the mechanism under test off (the spec's
``[regime.control]`` flags) and its log is the control log of ``control`` claims. The server's
own output is kept beside each boot log and read by the auditor too (a traceback is a crash).
Exits like `audit verdict` (0 PASS, 1 FAIL, 2 UNDECIDED); 64 for a window without a recipe,
69 when the engine does not come up.
"""

from __future__ import annotations

import asyncio
import datetime
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from audit.recipe import Recipe
from audit.render import print_report
from audit.spec import resolve
from audit.verdict import evaluate
from engine.group.spawn import dies_with_parent, free_port
from measure.lanes import drive_lanes
from measure.loadgen import LoadResult, LoadShape, drive

EX_USAGE, EX_UNAVAILABLE = 64, 69
BOOT_TIMEOUT_S = 300.0
STOP_TIMEOUT_S = 60.0


class WindowError(Exception):
    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code


@dataclass(slots=True)
class Boot:
    log: Path
    out: Path  # the server's stdout and stderr
    load: LoadResult
    exit_code: int


def _wait_healthy(proc: subprocess.Popen, base: str, out: Path) -> None:
    deadline = time.monotonic() + BOOT_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            tail = out.read_text(errors="replace")[-2000:]
            raise WindowError(EX_UNAVAILABLE, f"the engine exited {proc.returncode}:\n{tail}")
        try:
            if httpx.get(base + "/health", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.3)
    proc.kill()
    raise WindowError(EX_UNAVAILABLE, f"the engine was not healthy in {BOOT_TIMEOUT_S:.0f} s")


def _term_as_interrupt() -> None:
    """SIGTERM (a timeout, a supervisor) ends `engine window` like Ctrl-C: through the finally
    that stops the engine, instead of exiting past it."""

    def interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, interrupt)


def boot_and_load(
    args: list[str], shape: LoadShape, log: Path, progress: Progress, label: str, boot: int = 0
) -> Boot:
    """One boot: `engine serve` on a free loopback port with ``args``, the load, SIGTERM.
    ``boot``: its place in a sequence of boots (agent lanes do one thing in the first, another
    after)."""
    port, out = free_port(), log.with_suffix(".out")
    cmd = [
        sys.executable,
        "-m",
        "cli.engine_app",
        "serve",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--log-file",
        str(log),
        *args,
    ]
    task = progress.add_task(f"{label}: booting", total=None)
    with out.open("wb") as sink:
        proc = subprocess.Popen(
            cmd, stdout=sink, stderr=subprocess.STDOUT, preexec_fn=dies_with_parent()
        )
    try:
        base = f"http://127.0.0.1:{port}"
        _wait_healthy(proc, base, out)
        total = None if shape.duration_s else shape.requests * shape.passes
        progress.update(task, description=f"{label}: load", total=total)
        done = lambda: progress.advance(task)  # noqa: E731
        load = drive_lanes(base, shape, boot, done) if shape.lanes else drive(base, shape, done)
        result = asyncio.run(load)
        progress.update(task, description=f"{label}: stopping")
        proc.send_signal(signal.SIGTERM)
        try:
            code = proc.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            code = proc.wait()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        progress.remove_task(task)
    return Boot(log, out, result, code)


def _ranks(log: Path) -> list[Path]:
    return sorted(log.parent.glob(f"{log.stem}.rank*{log.suffix}"))


def load_shape(recipe: Recipe) -> LoadShape:
    d = dict(recipe.load)
    for k in ("prompt_tokens", "output_tokens"):
        d[k] = tuple(d[k])
    return LoadShape(**d)


def run_window(name: str, control: bool, extra: list[str], out_dir: Path, console: Console) -> int:
    spec = resolve(name)
    recipe = spec.regime.recipe
    if recipe is None:
        raise WindowError(EX_USAGE, f"window {spec.name!r} has no [regime.load] recipe to drive")
    if control and not recipe.control:
        raise WindowError(EX_USAGE, f"window {spec.name!r} has no [regime.control] flags")
    out_dir.mkdir(parents=True, exist_ok=True)
    _term_as_interrupt()
    stamp = datetime.datetime.now(datetime.UTC).strftime("%Y%m%dT%H%M%SZ")
    shape = load_shape(recipe)
    boots: list[Boot] = []
    columns = (
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
    )
    arms = [
        (f"boot {i + 1}" if recipe.boots > 1 else "window", False, i) for i in range(recipe.boots)
    ]
    arms += [("control", True, 0)] if control else []
    store = ["--kv-store-dir", str(out_dir / f"{spec.name}-{stamp}-store")] if recipe.store else []
    with Progress(*columns, console=Console(stderr=True), transient=True) as progress:
        for label, is_control, i in arms:
            log = out_dir / f"{spec.name}-{stamp}-{label.replace(' ', '')}.jsonl"
            args = recipe.serve_args(control=is_control) + store + extra
            boots.append(boot_and_load(args, shape, log, progress, label, i))
    window = boots[: recipe.boots]
    # with several ranks each writes its own log beside rank 0's (NAME.rankR.EXT): judged as one
    logs = [p for b in window for p in (b.log, *_ranks(b.log), b.out)]
    report = evaluate([spec], logs, boots[-1].log if control else None)
    print_report(report, console)
    labels = [label for label, _, _ in arms]
    for label, b in zip(labels, boots, strict=True):
        r = b.load
        console.print(
            f"{label}: {b.log} (server output {b.out}; exit {b.exit_code}); "
            f"{r.sent} requests in {r.seconds:.1f} s, answers {dict(r.status)}, "
            f"{r.tokens} tokens",
            markup=False,
            highlight=False,
        )
        for f in r.failures:
            console.print(f"  not served: {f}", markup=False, highlight=False)
    return report.status.exit_code
