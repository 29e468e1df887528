"""Real clients of the server (lm-eval, guidellm), each in a virtualenv of its own, created on
demand and never by `make setup`: their dependencies are heavy and pinned their own ways.

A client's environment sees this environment's packages through a ``.pth`` bridge, placed
before anything is installed: pip then finds torch, transformers and the engine already there
and installs only what the client adds (lm-eval: about 45 s), never a multi-GB CUDA torch. What
the client pins differently lands in its own environment and wins there; pip does not uninstall
anything outside the environment it installs into, so this one is never touched.
"""

from __future__ import annotations

import subprocess
import sys
import sysconfig
from dataclasses import dataclass
from pathlib import Path

ROOT = Path("build/clients")  # where `engine client-env` puts them, relative to the project


@dataclass(frozen=True)
class Client:
    dist: str  # the distribution pip installs
    version: str
    extras: str  # e.g. "[api]": what the client needs to speak to a server
    imports: str  # what the environment must import, e.g. "lm_eval, tenacity"

    @property
    def pin(self) -> str:
        return f"{self.dist}{self.extras}=={self.version}"


CLIENTS = {
    # api: the local-completions model's own dependencies (tenacity, aiohttp)
    "lm-eval": Client("lm-eval", "0.4.13", "[api]", "lm_eval, tenacity"),
    "guidellm": Client("guidellm", "0.8.1", "", "guidellm"),
}


class MissingClient(RuntimeError):
    """A client's environment is absent or broken; the message says how to create it."""


def env_dir(name: str, root: str | Path = ROOT) -> Path:
    return Path(root) / name


def bin_path(name: str, what: str, root: str | Path = ROOT) -> Path:
    return env_dir(name, root) / "bin" / what


def check(name: str, root: str | Path = ROOT) -> str:
    """The client's version in its environment; MissingClient when it cannot be imported."""
    client = CLIENTS[name]
    python = bin_path(name, "python", root)
    how = f"create it with `engine client-env {name}` (it installs {client.pin})"
    if not python.exists():
        raise MissingClient(f"{name}'s environment {env_dir(name, root)} is missing; {how}")
    probe = f"import importlib.metadata as m; print(m.version({client.dist!r}))"
    done = subprocess.run(
        [str(python), "-c", f"import {client.imports}; {probe}"], capture_output=True, text=True
    )
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["?"])[-1]
        raise MissingClient(f"{name}'s environment cannot import {client.imports} ({last}); {how}")
    if (version := done.stdout.strip()) != client.version:
        raise MissingClient(f"{name}'s environment has {version}, not {client.version}; {how}")
    return version


def install(name: str, root: str | Path = ROOT, quiet: bool = True) -> str:
    """Create the client's environment (the bridge first, then the client); its version."""
    env = env_dir(name, root)
    subprocess.run([sys.executable, "-m", "venv", str(env)], check=True)
    python = bin_path(name, "python", root)
    site = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    ours = dict.fromkeys(sysconfig.get_path(k) for k in ("purelib", "platlib"))
    (Path(site) / "attest-bridge.pth").write_text("".join(f"{p}\n" for p in ours))
    pip = [str(python), "-m", "pip", "install", *(["-q"] if quiet else []), CLIENTS[name].pin]
    subprocess.run(pip, check=True)
    return check(name, root)


def ensure(name: str, root: str | Path = ROOT) -> str:
    """The client's version, its environment created first when it is not there."""
    try:
        return check(name, root)
    except MissingClient:
        return install(name, root)
