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

uv installs them where it is there (a dev dependency of this project): about ten times faster
than pip (the agent frameworks in 9 s against about 85 s, Phoenix in 15 s against about two
minutes, measured in BENCHMARKS.md), which is most of what a fresh clone's test run spends on
them. uv does not read pip's configuration, so the indexes, wheel folders and constraints pip is
configured with (``pip config list``) are given to it as flags (``uv_flags``); and it does not
count the bridged packages as installed, so torch, the one that must come from this
environment and never from an index, is excluded from its resolution. Where uv is absent, or
fails, pip installs as before.
"""

from __future__ import annotations

import ast
import os
import shlex
import subprocess
import sys
import sysconfig
import tempfile
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlparse

# litellm fetches a price list from the network when imported, retrying for about 10 s offline
QUIET_IMPORTS = {"LITELLM_LOCAL_MODEL_COST_MAP": "True"}
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
        [str(python), "-c", f"import {client.imports}; {probe}"],
        capture_output=True,
        text=True,
        env={**os.environ, **QUIET_IMPORTS},
    )
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["?"])[-1]
        raise MissingClient(f"{name}'s environment cannot import {client.imports} ({last}); {how}")
    found = dict(zip(wanted, ast.literal_eval(done.stdout.strip())))
    if found != wanted:
        wrong = ", ".join(f"{d} {found[d]}, not {v}" for d, v in wanted.items() if found[d] != v)
        raise MissingClient(f"{name}'s environment has {wrong}; {how}")
    return client.version


# pip's configuration keys (``pip config list``, any section) that uv takes as flags
PIP_TO_UV = {
    "index-url": "--index-url",
    "extra-index-url": "--extra-index-url",
    "find-links": "--find-links",
    "constraint": "--constraint",
}
FROM_HERE = "torch\n"  # what a client's resolution leaves out: the bridge gives this one


def uv_flags(pip_config: str) -> tuple[list[str], dict[str, str]]:
    """pip's configuration as ``pip config list`` prints it (``section.key='value'`` lines) ->
    uv's flags for the same indexes, wheel folders and constraints, and the environment it
    needs (``SSL_CERT_FILE`` for a configured ``cert``). A ``file://`` index that is not there
    is left out, as pip ignores it; values given twice (a section and the environment) once."""
    flags: list[str] = []
    env: dict[str, str] = {}
    for line in pip_config.splitlines():
        key, sep, value = line.partition("=")
        if not sep:
            continue
        option = key.rsplit(".", 1)[-1]
        values = shlex.split(value)
        values = [v for p in values for v in p.split()]  # a list, space-separated in one value
        if option == "cert" and values:
            env["SSL_CERT_FILE"] = values[0]
        for v in values if option in PIP_TO_UV else ():
            where = urlparse(v)
            if where.scheme == "file" and not Path(where.path).exists():
                continue
            pair = [PIP_TO_UV[option], v]
            if not any(flags[i : i + 2] == pair for i in range(0, len(flags), 2)):
                flags += pair
    return flags, env


def _uv() -> str | None:
    try:
        import uv
    except ImportError:
        return None
    try:
        return uv.find_uv_bin()
    except FileNotFoundError:
        return None


def _uv_install(python: Path, pins: list[str], quiet: bool) -> bool:
    """The pins installed by uv into ``python``'s environment; False where uv is absent or
    failed (the caller falls back to pip, which says why if it fails too)."""
    uv = _uv()
    if uv is None:
        return False
    config = subprocess.run(
        [sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True
    ).stdout
    flags, env = uv_flags(config)
    with tempfile.TemporaryDirectory() as tmp:
        excludes = Path(tmp) / "excludes.txt"
        excludes.write_text(FROM_HERE)
        # pip takes the best version from any index; uv's default stops at the first that has
        # the package, and a partial local mirror would then hide the pinned version
        argv = [uv, "pip", "install", "--python", str(python), "--excludes", str(excludes)]
        argv += ["--index-strategy", "unsafe-best-match"]
        argv += [*(["-q"] if quiet else []), *flags, *pins]
        done = subprocess.run(argv, env={**os.environ, **env})
    return done.returncode == 0


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
    pins = CLIENTS[name].pins
    if not _uv_install(python, pins, quiet):
        print(f"{name}: installing with pip (uv is absent or did not install it)", file=sys.stderr)
        pip = [str(python), "-m", "pip", "install", *(["-q"] if quiet else []), *pins]
        subprocess.run(pip, check=True)
    return check(name, root)


def ensure(name: str, root: str | Path = ROOT) -> str:
    """The client's version, its environment created first when it is not there."""
    try:
        return check(name, root)
    except MissingClient:
        return install(name, root)


if __name__ == "__main__":  # `python measure/clients.py uv-flags`: what `make setup` gives uv
    if sys.argv[1:] != ["uv-flags"]:
        sys.exit("usage: python measure/clients.py uv-flags")
    config = subprocess.run(
        [sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True
    ).stdout
    print(shlex.join(uv_flags(config)[0]))
