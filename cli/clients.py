"""`engine client-env NAME`: a real client's own virtualenv (lm-eval, guidellm, agents, phoenix), made on demand."""

from __future__ import annotations

from typing import Annotated

import typer


def client_env(
    name: Annotated[
        str,
        typer.Argument(
            help="The client: lm-eval, guidellm, agents (the agent frameworks) or phoenix (a trace store)."
        ),
    ],
    root: Annotated[str, typer.Option(help="Where the environments live.")] = "build/clients",
) -> None:
    """Create the client's virtualenv (a no-op when it is there and imports) and print its
    bin/ folder: its commands run against `engine serve` from there."""
    from measure.clients import CLIENTS, bin_path, ensure

    if name not in CLIENTS:
        typer.echo(f"unknown client {name!r}; known: {', '.join(sorted(CLIENTS))}", err=True)
        raise typer.Exit(64)
    version = ensure(name, root)
    typer.echo(f"{name} {version}: {bin_path(name, '', root)}")
