"""Real clients of the server (lm-eval, guidellm, the agent frameworks: openai-agents,
pydantic-ai, langchain-openai, anthropic, litellm, together in ``agents``, and Arize Phoenix, the
trace store its OTLP export is read back from), each in a virtualenv
of its own, created on demand and never by `make setup`: their dependencies are heavy and pinned
their own ways.

A client's environment sees this environment's packages through a ``.pth`` bridge, placed
before anything is installed: pip then finds torch, transformers and the engine already there
and installs only what the client adds (lm-eval: about 45 s), never a multi-GB CUDA torch. What
the client pins differently lands in its own environment and wins there; pip does not uninstall
anything outside the environment it installs into, so this one is never touched.
"""

from __future__ import annotations

import ast
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
    more: tuple[tuple[str, str], ...] = ()  # (distribution with extras, version): beside it

    @property
    def pin(self) -> str:
        return f"{self.dist}{self.extras}=={self.version}"

    @property
    def pins(self) -> list[str]:
        """Everything the environment installs, each pinned."""
        return [self.pin, *(f"{dist}=={version}" for dist, version in self.more)]

    @property
    def versions(self) -> dict[str, str]:
        """Each installed distribution's version, as ``importlib.metadata`` names it."""
        more = {dist.split("[", 1)[0]: version for dist, version in self.more}
        return {self.dist: self.version, **more}


CLIENTS = {
    # api: the local-completions model's own dependencies (tenacity, aiohttp)
    "lm-eval": Client("lm-eval", "0.4.13", "[api]", "lm_eval, tenacity"),
    "guidellm": Client("guidellm", "0.8.1", "", "guidellm"),
    # a trace store with a UI and a REST API: where an operator looks at Attest's traces
    "phoenix": Client("arize-phoenix", "20.26.1", "", "phoenix"),
    # the frameworks agents are written with, in one environment (they agree on openai 3.x):
    # pydantic-ai as its slim distribution with the OpenAI provider, the one it is tried with
    "agents": Client(
        "openai-agents",
        "0.24.0",
        "",
        "agents, pydantic_ai, langchain_openai, anthropic, litellm",
        (
            ("pydantic-ai-slim[openai]", "2.78.0"),
            ("langchain-openai", "1.8.1"),
            ("anthropic", "2.17.0"),
            ("litellm", "1.110.2"),
        ),
    ),
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
    how = f"create it with `engine client-env {name}` (it installs {', '.join(client.pins)})"
    if not python.exists():
        raise MissingClient(f"{name}'s environment {env_dir(name, root)} is missing; {how}")
    wanted = client.versions
    probe = f"import importlib.metadata as m; print([m.version(d) for d in {list(wanted)!r}])"
    done = subprocess.run(
        [str(python), "-c", f"import {client.imports}; {probe}"], capture_output=True, text=True
    )
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["?"])[-1]
        raise MissingClient(f"{name}'s environment cannot import {client.imports} ({last}); {how}")
    found = dict(zip(wanted, ast.literal_eval(done.stdout.strip())))
    if found != wanted:
        wrong = ", ".join(f"{d} {found[d]}, not {v}" for d, v in wanted.items() if found[d] != v)
        raise MissingClient(f"{name}'s environment has {wrong}; {how}")
    return client.version


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
    pip = [str(python), "-m", "pip", "install", *(["-q"] if quiet else []), *CLIENTS[name].pins]
    subprocess.run(pip, check=True)
    return check(name, root)


def ensure(name: str, root: str | Path = ROOT) -> str:
    """The client's version, its environment created first when it is not there."""
    try:
        return check(name, root)
    except MissingClient:
        return install(name, root)
