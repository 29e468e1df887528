"""`engine cutover`: ask a serving engine for a live change of weights or pool size
(``POST /admin/cutover``), or cancel the one under way (``--cancel ID``: ``DELETE
/admin/cutover/{id}``), and print the ``cutover.end`` fields it answers with."""

from __future__ import annotations

import json
import os
import sys
import urllib.error
import urllib.parse
import urllib.request
from typing import Annotated

import typer


def cutover(
    kind: Annotated[
        str | None, typer.Argument(help="weights (from --path) or pool (to --kv-tokens).")
    ] = None,
    mode: Annotated[str, typer.Option(help="drain (finish what runs first) or carry.")] = "carry",
    path: Annotated[str | None, typer.Option(help="The new weights (a weights cutover).")] = None,
    kv_tokens: Annotated[
        int | None, typer.Option(help="The new pool size (a pool cutover).")
    ] = None,
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
    url: Annotated[str, typer.Option(help="The server.")] = "http://127.0.0.1:8000",
    api_key: Annotated[
        str | None, typer.Option(help="The server's API key (default: $ATTEST_API_KEY).")
    ] = None,
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
        print("engine cutover: give a kind (weights or pool), or --cancel ID", file=sys.stderr)
        raise typer.Exit(64)
    else:
        body = {"kind": kind, "mode": mode, "path": path, "kv_tokens": kv_tokens,
                "promises": "cap" if cap_promises else "refuse"}  # fmt: skip
        req = urllib.request.Request(
            base, data=json.dumps(body).encode(), method="POST",
            headers={"content-type": "application/json"},
        )  # fmt: skip
    key = api_key or os.environ.get("ATTEST_API_KEY")
    if key:
        req.add_header("authorization", f"Bearer {key}")
    _send(req, url, timeout)


def _send(req: urllib.request.Request, url: str, timeout: float) -> None:
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            typer.echo(json.dumps(json.loads(resp.read()), indent=2))
    except urllib.error.HTTPError as e:
        answer = json.loads(e.read() or b"{}")
        reason = answer.get("error", {}).get("message", e.reason)
        print(f"engine cutover: {e.code}: {reason}", file=sys.stderr)
        if "cutover" in answer:
            typer.echo(json.dumps(answer["cutover"], indent=2))
        raise typer.Exit(1) from None
    except (urllib.error.URLError, OSError) as e:
        print(f"engine cutover: cannot reach {url}: {e}", file=sys.stderr)
        raise typer.Exit(69) from None
