"""Conversation checkpoints: a prompt's KV pinned in the durable store, so that a later request
beginning with it loads it instead of recomputing it, after an hour of other traffic or a restart.

A checkpoint is made once its prompt's KV is computed (``LLM.checkpoint`` and the server run the
prompt first, as a request of one token): its pages still in memory are written to the store, and
every whole page of the prompt is pinned under the checkpoint's id (``PageStore.create_checkpoint``:
refused over the pin budget with want, held, budget, overshoot). Branches share: a checkpoint of
a conversation that extends another pins only its new pages. ``Pending`` carries the server's
checkpoints from their prefill request to their answer, in the scheduler's process.

A checkpoint is listed ``complete`` when its manifest is written and every page it pins is in
the store (``missing`` counts those that are not: a page set aside when it failed its checksum,
until the prompt is computed and its page written again).

Errors are ``CheckpointError`` with the HTTP status a client gets: 400 (no store asked for, an id that
cannot name a file, a prompt under one page), 404 (no such checkpoint), 409 (over the pin budget,
with the four numbers), 500 (its files could not be removed: ``checkpoint.delete_failed``), 503
(a store asked for with ``--kv-store-dir`` that it could not use: the directory and why), 507
(the store could not hold the prompt's pages or its files: no room under its cap, or a full disk,
said as such, with the store's numbers and the disk's free bytes).
"""

from __future__ import annotations

import re
import uuid
from typing import Any, NamedTuple, Protocol

from engine.config import EngineConfig
from engine.memory.radix import RadixCache
from engine.request.messages import StepOutput
from engine.request.sampling_params import SamplingParams
from engine.tiers.kv_store import Checkpoint, Refused
from engine.tiers.store_tier import StoreTier

ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")


class CheckpointError(Exception):
    def __init__(self, status: int, message: str, **fields: Any) -> None:
        super().__init__(message)
        self.status, self.fields = status, fields

    def body(self) -> dict[str, Any]:
        """The answer's body for the server (which puts ``message`` in its error object and the
        numbers beside it)."""
        return {"message": str(self), **self.fields}


class Admits(Protocol):
    """What a checkpoint uses of the scheduler (a room above this one): its prefix cache, with
    the store below it, and its intake, where a checkpoint's prompt runs first."""

    @property
    def cache(self) -> RadixCache: ...
    def add_request(
        self, prompt_ids: list[int], params: SamplingParams, rid: str | None = ...
    ) -> object: ...


class CheckpointHost(Protocol):
    """What checkpoints use of an engine (``EngineCore``, a room above this one): its scheduler,
    and why a store asked for is off."""

    config: EngineConfig
    store_off: str | None

    @property
    def scheduler(self) -> Admits: ...


def _keeper(core: CheckpointHost) -> StoreTier:
    keeper = core.scheduler.cache.keeper
    if isinstance(keeper, StoreTier):  # the one keeper the engine builds (the cache's ``Keeper``)
        return keeper
    if core.store_off is not None:  # asked for, and not there: the server's state, not the ask
        d = core.config.store.kv_store_dir
        raise CheckpointError(503, f"the durable KV store at {d} is off: {core.store_off}")
    raise CheckpointError(400, "this engine has no durable KV store (start it with --kv-store-dir)")


def check_id(cid: str | None) -> str:
    """The checkpoint's id: the one asked for if it can name a file, else a new one."""
    if cid is None:
        return f"cp-{uuid.uuid4().hex[:16]}"
    if not isinstance(cid, str) or not ID.fullmatch(cid):
        raise CheckpointError(400, f"id: {cid!r} is not 1-64 letters, digits, '.', '_' or '-'")
    return cid


def create(core: CheckpointHost, tokens: list[int], cid: str | None = None) -> dict[str, Any]:
    """Pin the whole pages of ``tokens`` (whose KV is computed: cached, or in the store) under
    ``cid``. Returns the checkpoint's numbers; raises CheckpointError."""
    keeper, cache = _keeper(core), core.scheduler.cache
    cid = check_id(cid)
    store = keeper.store
    if cid in store.checkpoints:
        raise CheckpointError(409, f"checkpoint {cid} exists")
    n = len(tokens) - len(tokens) % keeper.block
    if n == 0:
        raise CheckpointError(
            400,
            f"a prompt of {len(tokens)} tokens holds no whole store page ({keeper.block} tokens)",
        )
    match = cache.match_prefix(tokens[:n])
    end = match.host_node or match.node
    keeper.keep_path(cache, end)
    keys = keeper.page_keys(tokens[:n])
    missing = sum(1 for k in keys if not store.has(k))
    numbers = {**store.capacity(), "disk_free": store.disk_free()}
    if missing:  # why the last page the store was asked for is not there: the cap, the disk
        why = store.short or "their KV was not in memory to write"
        raise CheckpointError(
            507,
            f"{missing} of the prompt's {len(keys)} pages are not in the store: {why}",
            **numbers,
        )
    try:
        made = store.create_checkpoint(cid, keys, n)
    except OSError as e:
        raise CheckpointError(
            507, f"the checkpoint's files could not be written: {e}", **numbers
        ) from e
    if isinstance(made, Refused):
        raise CheckpointError(
            409,
            f"checkpoint {cid} would pin {made.want} more bytes on {made.held} pinned, over "
            f"the pin budget of {made.budget} by {made.overshoot}",
            **made._asdict(),
        )
    return describe(made)


def describe(cp: Checkpoint, missing: int = 0) -> dict[str, Any]:
    """A checkpoint for its client; ``missing``: its pages not in the store (then incomplete)."""
    return {
        "id": cp.id,
        "object": "checkpoint",
        "tokens": cp.tokens,
        "pages": len(cp.keys),
        "pinned_bytes": cp.pinned_bytes,
        "shared_bytes": cp.shared_bytes,
        "created": int(cp.created),
        "complete": cp.complete and not missing,
        "missing": missing,
    }


def listing(core: CheckpointHost) -> dict[str, Any]:
    store = _keeper(core).store
    cps = sorted(store.checkpoints.values(), key=lambda c: c.created)
    data = [describe(cp, store.missing(cp)) for cp in cps]
    return {"object": "list", "data": data, "capacity": store.capacity()}


def delete(core: CheckpointHost, cid: str) -> dict[str, Any]:
    try:
        cp = _keeper(core).store.delete_checkpoint(cid)
    except OSError as e:  # its files would not go (checkpoint.delete_failed says which)
        raise CheckpointError(500, f"the checkpoint's files could not be removed: {e}") from e
    if cp is None:
        raise CheckpointError(404, f"no checkpoint {cid}")
    return {"id": cid, "object": "checkpoint.deleted", "deleted": True}


def prefill() -> SamplingParams:
    """How a checkpoint's prompt is run first: one greedy token, its KV cached at the end."""
    return SamplingParams(max_tokens=1, temperature=0, ignore_eos=True)


class Waiting(NamedTuple):
    ticket: int
    tokens: list[int]
    cid: str


class Pending:
    """The server's checkpoints whose prompt is being computed, by their request's rid."""

    def __init__(self) -> None:
        self.waiting: dict[str, Waiting] = {}

    def begin(self, core: CheckpointHost, ticket: int, tokens: list[int], cid: str | None) -> None:
        """Run the prompt; ``finish`` answers once it has. Raises CheckpointError at once for
        what needs no prefill to refuse."""
        _keeper(core)
        cid = check_id(cid)
        rid = f"checkpoint-{cid}-{ticket}"
        core.scheduler.add_request(tokens, prefill(), rid=rid)
        self.waiting[rid] = Waiting(ticket, tokens, cid)

    def finish(
        self, core: CheckpointHost, outs: list[StepOutput]
    ) -> tuple[list[StepOutput], list[tuple]]:
        """Outputs that are the frontend's, and (ticket, status, body) for checkpoints whose
        prompt ended in ``outs``."""
        mine, answers = [], []
        for out in outs:
            if out.rid not in self.waiting:
                mine.append(out)
                continue
            if not out.finished:
                continue
            w = self.waiting.pop(out.rid)
            if out.finish_reason == "abort":
                err = CheckpointError(
                    503, f"the checkpoint's prompt did not run: {out.abort_reason}"
                )
                answers.append((w.ticket, err.status, err.body()))
                continue
            try:
                answers.append((w.ticket, 200, create(core, w.tokens, w.cid)))
            except CheckpointError as e:
                answers.append((w.ticket, e.status, e.body()))
        return mine, answers
