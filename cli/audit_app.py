"""`audit`: read boot logs back. (Imports nothing from torch.)"""

from __future__ import annotations

import typer

from audit import __version__

app = typer.Typer(
    help="Attest auditor: turns boot logs into verdicts.",
    no_args_is_help=True,
    add_completion=False,
)


@app.callback()
def _root() -> None:
    """Attest auditor: turns boot logs into verdicts."""


@app.command()
def version() -> None:
    """Print the auditor's version."""
    print(__version__)


def main() -> None:
    app()


if __name__ == "__main__":
    main()
