"""The options of a multi-rank engine (`--tp`, `--pp`, per-rank `--kv-tokens`, `--dist-init`) and
`engine worker`, a rank above 0 started on its own node."""

from __future__ import annotations

from typing import Annotated

import typer

from engine.config import DEFAULTS, HELP

KvOpt = Annotated[str | None, typer.Option("--kv-tokens", help=HELP["kv_tokens"])]
TpOpt = Annotated[int, typer.Option("--tp", help=HELP["tp"])]
PpOpt = Annotated[int, typer.Option("--pp", help=HELP["pp"])]
DistInitOpt = Annotated[str, typer.Option("--dist-init", help=HELP["dist_init"])]
GroupCheckOpt = Annotated[int, typer.Option(help=HELP["group_check_interval"])]
FloorOpt = Annotated[
    bool,
    typer.Option("--published-floor/--own-pool", hidden=True, help=HELP["published_floor"]),
]
GroupTimeoutOpt = Annotated[float, typer.Option(help=HELP["group_timeout"])]
PhasePolicyOpt = Annotated[str, typer.Option(help=HELP["phase_policy"])]
PhaseEnterOpt = Annotated[int, typer.Option(help=HELP["phase_enter_pp"])]
PhaseExitOpt = Annotated[int, typer.Option(help=HELP["phase_exit_pp"])]
PhaseDwellOpt = Annotated[int, typer.Option(help=HELP["phase_dwell"])]
PhaseIntervalOpt = Annotated[int, typer.Option(help=HELP["phase_interval"])]


def kv_tokens(text: str | None) -> int | list[int] | None:
    """``--kv-tokens``: one size, or one per rank separated by commas; ValueError naming the
    part that is not a positive integer."""
    if text is None:
        return None
    parts = [p.strip() for p in text.split(",")]
    sizes = []
    for p in parts:
        if not p.isdigit() or int(p) < 1:
            raise ValueError(f"--kv-tokens takes integers >= 1 separated by commas, not {p!r}")
        sizes.append(int(p))
    return sizes[0] if len(sizes) == 1 else sizes


def worker(
    device: Annotated[str, typer.Option(help="cpu, or this rank's cuda:N.")] = DEFAULTS["device"],
    group_timeout: GroupTimeoutOpt = DEFAULTS["group_timeout"],
) -> None:
    """Run one rank above 0 of a group whose rank 0 is `engine serve --tp N [--pp M] --dist-init env`
    (on another node, or under torchrun). MASTER_ADDR, MASTER_PORT, WORLD_SIZE and RANK say
    where rank 0 is and who this is; the rest of the configuration comes from rank 0."""
    from engine.core.group_boot import worker_from_env

    try:
        code = worker_from_env(group_timeout, device)
    except ValueError as e:
        typer.secho(f"error: {e}", fg="red", err=True)
        raise typer.Exit(2) from None
    raise typer.Exit(code)
