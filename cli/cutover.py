"""`engine cutover`: ask a serving engine for a live change of weights, pool size or layout
(``POST /admin/cutover``), or cancel the one under way (``--cancel ID``: ``DELETE
/admin/cutover/{id}``), and print the ``cutover.end`` fields it answers with."""

from __future__ import annotations

import sys
import urllib.error
import urllib.parse
import urllib.request
from typing import Annotated

import typer

from cli.remote import SERVER, RemoteKeyOpt, ServerUrlOpt, authorize, post_json, send


def cutover(
    kind: Annotated[
        str | None,
        typer.Argument(help="weights (from --path), pool (to --kv-tokens) or layout (--tp, --pp)."),
    ] = None,
    mode: Annotated[str, typer.Option(help="drain (finish what runs first) or carry.")] = "carry",
    path: Annotated[str | None, typer.Option(help="The new weights (a weights cutover).")] = None,
    kv_tokens: Annotated[
        int | None, typer.Option(help="The new pool size (a pool cutover).")
    ] = None,
    tp: Annotated[
        int | None, typer.Option(help="A layout cutover's tensor-parallel ranks.")
    ] = None,
    pp: Annotated[int | None, typer.Option(help="A layout cutover's pipeline stages.")] = None,
    cap_promises: Annotated[
        bool,
        typer.Option(
            help="A smaller pool lowers the max_tokens of requests it would break (they end "
            "with length at the new bound) instead of being refused."
        ),
    ] = False,
    cancel: Annotated[
        str | None, typer.Option(help="Cancel the cutover of this id (e.g. c-1) under way.")
    ] = None,
    url: ServerUrlOpt = SERVER,
    api_key: RemoteKeyOpt = None,
    timeout: Annotated[float, typer.Option(help="Seconds to wait for the cutover to end.")] = 600,
) -> None:
    """Cut over a serving engine while it serves; exit 0 when done (or cancelled, with
    --cancel), 1 when refused, failed, timed out or not found (the reason on stderr), 64 on a
    bad command line, 69 when the server cannot be reached."""
    base = url.rstrip("/") + "/admin/cutover"
    if cancel is not None:
        if kind is not None:
            print("engine cutover: --cancel takes no kind", file=sys.stderr)
            raise typer.Exit(64)
        req = urllib.request.Request(
            f"{base}/{urllib.parse.quote(cancel, safe='')}", method="DELETE"
        )
    elif kind is None:
        print(
            "engine cutover: give a kind (weights, pool or layout), or --cancel ID", file=sys.stderr
        )
        raise typer.Exit(64)
    else:
        body = {
            "kind": kind,
            "mode": mode,
            "path": path,
            "kv_tokens": kv_tokens,
            "promises": "cap" if cap_promises else "refuse",
            "tp": tp,
            "pp": pp,
        }
        req = post_json(base, body)
    authorize(req, api_key)
    send(req, url, timeout, "cutover", "cutover")
