"""`engine checkpoint`: a serving engine's conversation checkpoints (``/v1/checkpoints``):
create one from a chat's messages or a prompt, list them with the store's numbers, delete one;
prints the JSON the server answers."""

from __future__ import annotations

import json
import sys
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Annotated

import typer

from cli.remote import SERVER, RemoteKeyOpt, ServerUrlOpt, authorize, post_json, send

ACTIONS = ("create", "list", "delete")


def checkpoint(
    action: Annotated[str, typer.Argument(help="create, list or delete.")],
    messages: Annotated[
        Path | None, typer.Option(help="create: a JSON file holding the chat's messages.")
    ] = None,
    prompt: Annotated[str | None, typer.Option(help="create: a prompt's text instead.")] = None,
    id: Annotated[  # noqa: A002 (the API's own name)
        str | None,
        typer.Option("--id", help="create: its id (default: the server's); delete: which."),
    ] = None,
    url: ServerUrlOpt = SERVER,
    api_key: RemoteKeyOpt = None,
    timeout: Annotated[float, typer.Option(help="Seconds to wait for the answer.")] = 600,
) -> None:
    """Conversation checkpoints of a serving engine (--kv-store-dir); exit 0 on success, 1 when
    the server refuses (the reason on stderr; over the pin budget: its four numbers), 64 on a
    bad command line, 66 for a messages file that cannot be read, 69 when the server cannot be
    reached."""
    base = url.rstrip("/") + "/v1/checkpoints"
    if action not in ACTIONS:
        _usage(f"the action is one of {', '.join(ACTIONS)}, not {action!r}")
    if action == "list":
        req = urllib.request.Request(base, method="GET")
    elif action == "delete":
        if id is None:
            _usage("delete needs --id")
        req = urllib.request.Request(f"{base}/{urllib.parse.quote(id, safe='')}", method="DELETE")
    else:
        if (messages is None) == (prompt is None):
            _usage("create needs exactly one of --messages FILE and --prompt TEXT")
        body: dict = {"prompt": prompt} if prompt is not None else {"messages": _read(messages)}
        if id is not None:
            body["id"] = id
        req = post_json(base, body)
    authorize(req, api_key)
    send(req, url, timeout, "checkpoint", "checkpoint")


def _usage(message: str) -> None:
    print(f"engine checkpoint: {message}", file=sys.stderr)
    raise typer.Exit(64)


def _read(path: Path | None) -> list:
    try:
        data = json.loads(Path(path or "").read_text())
    except (OSError, ValueError) as e:
        print(f"engine checkpoint: {path}: {e}", file=sys.stderr)
        raise typer.Exit(66) from None
    return data["messages"] if isinstance(data, dict) and "messages" in data else data
