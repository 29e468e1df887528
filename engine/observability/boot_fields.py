"""``boot.start``'s fields: the configuration a boot ran with and where it came from."""

from __future__ import annotations

import os
import platform
import socket
import sys
from typing import Any

import torch

from engine.config import EngineConfig
from engine.request.messages import Launch


def versions(device: str) -> dict[str, str]:
    """The versions a boot ran with: the engine, Python, torch, and the device's own name."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        engine = version("attest")
    except PackageNotFoundError:
        engine = "unknown"
    out = {"engine": engine, "python": platform.python_version(), "torch": torch.__version__}
    if device.startswith("cuda") and torch.cuda.is_available():
        out["device"] = torch.cuda.get_device_name(torch.device(device))
        out["cuda"] = str(torch.version.cuda)
    else:
        out["device"] = platform.processor() or platform.machine() or "cpu"
    return out


def boot_fields(config: EngineConfig, launch: Launch | None) -> dict[str, Any]:
    """``boot.start``'s fields: the configuration and where this boot came from (this process's
    pid; its parent, the HTTP frontend when served; host, command line, versions)."""
    return {
        "config": config.as_dict(),
        "pid": os.getpid(),
        "ppid": os.getppid(),
        "host": socket.gethostname(),
        "argv": list(launch.argv if launch else sys.argv),
        "versions": versions(config.model.device),
    }
