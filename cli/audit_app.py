"""`audit`: read boot logs back. (Imports nothing from torch.)

Exit codes follow sysexits, never click's own: 64 usage, 66 unreadable input, 70 internal error.
"""

from __future__ import annotations

import sys

import typer

from audit import __version__

EX_USAGE, EX_NOINPUT, EX_SOFTWARE = 64, 66, 70
# click's UsageError (unknown command or option, bad value), reached through typer's public
# BadParameter whichever click typer ships
UsageError = next(c for c in typer.BadParameter.__mro__ if c.__name__ == "UsageError")

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


def main(argv: list[str] | None = None) -> None:
    try:
        rv = app(args=argv, standalone_mode=False)
    except UsageError as e:  # unknown command or option, bad value: 64, with the reason
        e.show()
        sys.exit(EX_USAGE)
    except typer.Exit as e:
        sys.exit(e.exit_code)
    except typer.Abort:
        sys.exit(130)
    except Exception as e:  # never a traceback instead of a verdict: 70, with the reason
        print(f"audit: internal error: {type(e).__name__}: {e}", file=sys.stderr)
        sys.exit(EX_SOFTWARE)
    sys.exit(rv if isinstance(rv, int) else 0)


if __name__ == "__main__":
    main()
