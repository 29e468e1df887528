"""How big the host KV tier is, and why (the ``tier.sized`` receipt).

``--host-kv-tokens N`` decides when given (0: off). Otherwise the tier is off on the CPU, where
the device pool is host memory already, and on CUDA it takes a share of the host memory that is
honestly free: MemAvailable, bounded by what the process's cgroup still allows (limit - usage)
where a limit is set, because a container's limit is reached long before the machine's memory
is; and at most ``HOST_POOL_RATIO`` times the device pool (pinned memory is the scarcest kind
the host has, and a tier far larger than the pool holds prefixes nobody returns to). Reading the
numbers and deciding from them are separate, so the decision is tested with injected numbers.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path

from engine.memory.kv_pool import mem_available_bytes

HOST_FRACTION = 0.25  # of the honestly free host memory, when the tier is sized on CUDA
HOST_POOL_RATIO = 4  # at most this many times the device pool's tokens
NO_LIMIT = 1 << 60  # cgroup v1 writes "no limit" as a number near 2**63


@dataclass(slots=True)
class HostSizing:
    path: str  # "off", "configured" (a token count was given) or "measured"
    host_kv_tokens: int
    bytes_per_token: int
    page_size: int
    reason: str | None = None  # why the tier is off
    mem_available: int | None = None
    cgroup_limit: int | None = None
    cgroup_usage: int | None = None
    fraction: float | None = None
    budget_bytes: int | None = None
    cap_tokens: int | None = None  # HOST_POOL_RATIO x the device pool

    def as_fields(self) -> dict[str, object]:
        return {k: v for k, v in asdict(self).items() if v is not None}


def _read_int(path: Path) -> int | None:
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None  # "max": no limit


def cgroup_memory(root: Path = Path("/sys/fs/cgroup"), proc: Path = Path("/proc/self/cgroup")):
    """(limit, usage) in bytes of this process's memory cgroup; limit None where none is set.
    cgroup v2 (``memory.max``, ``memory.current`` in the process's own group), else v1."""
    groups = []
    try:
        for line in proc.read_text().splitlines():
            hier, _, rest = line.partition(":")
            ctrls, _, rel = rest.partition(":")
            if hier == "0" and ctrls == "":
                groups.append(root / rel.lstrip("/"))
    except OSError:
        pass
    for g in [*groups, root]:
        if (g / "memory.max").exists() or (g / "memory.current").exists():
            return _read_int(g / "memory.max"), _read_int(g / "memory.current")
    v1 = root / "memory"
    limit = _read_int(v1 / "memory.limit_in_bytes")
    if limit is not None and limit >= NO_LIMIT:
        limit = None
    return limit, _read_int(v1 / "memory.usage_in_bytes")


def size_host_pool(
    host_kv_tokens: int | None,
    device: str,
    bytes_per_token: int,
    page_size: int,
    *,
    device_tokens: int | None = None,
    mem_available: int | None = None,
    cgroup: tuple[int | None, int | None] | None = None,
    fraction: float = HOST_FRACTION,
) -> HostSizing:
    """The host tier's size. ``device_tokens``: the device pool's (the cap's base; None: no cap);
    ``mem_available`` and ``cgroup`` (limit, usage) are read from the system when not given."""
    fixed = (bytes_per_token, page_size)
    if host_kv_tokens is not None:
        if host_kv_tokens == 0:
            return HostSizing("off", 0, *fixed, reason="host_kv_tokens=0")
        tokens = host_kv_tokens - host_kv_tokens % page_size
        if tokens < page_size:
            raise ValueError(
                f"host_kv_tokens {host_kv_tokens} is less than one page of {page_size}"
            )
        return HostSizing("configured", tokens, *fixed)
    if device == "cpu":
        return HostSizing("off", 0, *fixed, reason="cpu: the device pool is host memory already")
    avail = mem_available_bytes() if mem_available is None else mem_available
    limit, usage = cgroup_memory() if cgroup is None else cgroup
    honest = avail if limit is None else min(avail, max(0, limit - (usage or 0)))
    budget = int(honest * fraction)
    cap = None if device_tokens is None else HOST_POOL_RATIO * device_tokens
    tokens = budget // bytes_per_token if cap is None else min(cap, budget // bytes_per_token)
    tokens -= tokens % page_size
    inputs = dict(
        mem_available=avail,
        cgroup_limit=limit,
        cgroup_usage=usage,
        fraction=fraction,
        budget_bytes=budget,
        cap_tokens=cap,
    )
    if tokens < page_size:
        return HostSizing("off", 0, *fixed, reason="no host memory to spare", **inputs)
    return HostSizing("measured", tokens, *fixed, **inputs)
