"""Talking to a serving engine from the command line (`engine cutover`, `engine checkpoint`):
the API key, one request, the JSON answer printed, and the exit codes of a refusal (1) and of a
server that cannot be reached (69)."""

from __future__ import annotations

import json
import os
import sys
import urllib.error
import urllib.request
from typing import Annotated

import typer

SERVER = "http://127.0.0.1:8000"
ServerUrlOpt = Annotated[str, typer.Option(help="The server.")]
RemoteKeyOpt = Annotated[
    str | None, typer.Option(help="The server's API key (default: $ATTEST_API_KEY).")
]


def post_json(url: str, body: dict) -> urllib.request.Request:
    return urllib.request.Request(
        url,
        data=json.dumps(body).encode(),
        method="POST",
        headers={"content-type": "application/json"},
    )


def authorize(req: urllib.request.Request, api_key: str | None) -> None:
    """The server's API key, given or from $ATTEST_API_KEY."""
    key = api_key or os.environ.get("ATTEST_API_KEY")
    if key:
        req.add_header("authorization", f"Bearer {key}")


def send(req: urllib.request.Request, url: str, timeout: float, command: str, detail: str) -> None:
    """Print the JSON answer; a refusal's reason goes to stderr (and its ``detail`` object, the
    numbers beside the error, to stdout) with exit 1."""
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            typer.echo(json.dumps(json.loads(resp.read()), indent=2))
    except urllib.error.HTTPError as e:
        answer = json.loads(e.read() or b"{}")
        reason = answer.get("error", {}).get("message", e.reason)
        print(f"engine {command}: {e.code}: {reason}", file=sys.stderr)
        if detail in answer:
            typer.echo(json.dumps(answer[detail], indent=2))
        raise typer.Exit(1) from None
    except (urllib.error.URLError, OSError) as e:
        print(f"engine {command}: cannot reach {url}: {e}", file=sys.stderr)
        raise typer.Exit(69) from None
