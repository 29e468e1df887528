"""Holdings: what each request holds of the KV pool, and the one place it is taken and given back.

A running request holds its row of the request table, the cached prefix it locks (one radix
node, ``prefix_node``: ``cached_len`` tokens whose slots it shares with the cache) and the
slots it computed itself, ``[cached_len, kv_len)`` in whole pages (its private KV):

* ``claim_prefix(req)``: what the cache holds of its fill, matched and locked before admission
  reads its budget (its own prefix must not count as evictable for itself); ``let_go`` when it
  does not start after all;
* ``load_host`` and ``load_stored``: a hit carried on below the device, from the host tier, then
  on in the durable store, at most the tokens admission says its budget funds (the lock moves
  to the loaded end);
* ``start(req, prefix)``: its row, the prefix's slots written into it, and it joins the running;
* ``release`` (everything back: computed pages to the prefix cache, the lock, the row),
  ``shrink`` (the KV of rejected drafts back) and ``unplan`` (positions planned ahead and not
  run back, overlap's: ``release`` does it first).

``Memory`` builds it and answers for it; admission and the scheduler ask, never touch the
cache, the allocator or the request table themselves.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from engine.memory.allocator import TokenAllocator
from engine.memory.pages import whole_pages
from engine.memory.radix import MatchResult, RadixCache
from engine.memory.req_table import ReqToTokenPool
from engine.scheduler.request import Request, State


class Prefix(NamedTuple):
    """A waiting request's cached prefix, locked while admission decides on it."""

    tokens: list[int]  # the fill it may reuse: all but the last token, none if it scores its prompt
    match: MatchResult  # what the cache holds of them (device slots, then a host tail)

    @property
    def length(self) -> int:
        """Tokens on the device now, locked: the request need not compute them."""
        return self.match.length

    @property
    def host_len(self) -> int:
        """Tokens past ``length`` whose KV is only in the host tier."""
        return self.match.host_len


class Holdings:
    """``running``: the scheduler's running list (a started request joins it, a released one
    leaves it)."""

    def __init__(
        self,
        allocator: TokenAllocator,
        req_table: ReqToTokenPool,
        cache: RadixCache,
        running: list[Request],
    ) -> None:
        self.allocator, self.req_table, self.cache = allocator, req_table, cache
        self.running = running
        self.page_size = allocator.page_size

    @property
    def stored(self) -> bool:
        """Whether a durable store is below the cache (a hit may go on there)."""
        return self.cache.keeper is not None

    # -- a prefix, before the request starts -------------------------------------------------

    def claim_prefix(self, req: Request) -> Prefix:
        """The cached prefix of ``req``'s fill, locked (when any matched). A reused prefix is
        offered to the durable store now, which may want to keep it."""
        fill = req.fill_ids
        # leave one token to compute; all of them when its prompt's logprobs are to come
        tokens = fill[: 0 if req.scores_prompt(0) else len(fill) - 1]
        match = self.cache.match_prefix(tokens)
        if match.length:  # lock first: its own prefix is not evictable for its budget
            self.cache.inc_lock_ref(match.node)
            if (keeper := self.cache.keeper) is not None:
                keeper.hit(self.cache, match.node)
        return Prefix(tokens, match)

    def let_go(self, prefix: Prefix) -> None:
        """The lock of a prefix whose request does not start this round."""
        if prefix.length:
            self.cache.dec_lock_ref(prefix.match.node)

    def load_host(self, prefix: Prefix, limit: int, rid: str) -> Prefix:
        """The host part of ``prefix`` loaded back into device pages, at most ``limit`` tokens
        (loaded tokens take device memory as computed ones would; eviction may pay for them)."""
        tier = self.cache.tier
        if tier is None or not prefix.host_len:
            return prefix
        return prefix._replace(match=tier.load(prefix.match, limit, rid))

    def load_stored(self, prefix: Prefix, limit: int, rid: str) -> Prefix:
        """``prefix`` carried on with the durable store's pages, at most ``limit`` new tokens
        (after its host part: nothing of it may be left on the host)."""
        keeper = self.cache.keeper
        if keeper is None or prefix.host_len:
            return prefix
        return prefix._replace(
            match=keeper.load(self.cache, prefix.tokens, prefix.match, limit, rid)
        )

    # -- a running request -------------------------------------------------------------------

    def start(self, req: Request, prefix: Prefix) -> None:
        """``req`` starts: its row, its claimed prefix's slots written into it (the lock is
        now its own, until ``release``), and it joins the running."""
        req.row = self.req_table.alloc()
        n = prefix.length
        if n:
            self.req_table.write(req.row, 0, prefix.match.slots)
            req.prefix_node = prefix.match.node
        req.cached_len = req.kv_len = n
        req.prefill_target = len(req.fill_ids)
        req.state = State.RUNNING
        self.running.append(req)

    def private_of(self, req: Request) -> int:
        """KV slots ``req`` owns privately (not the prefix cache's)."""
        return 0 if req.row is None else whole_pages(req.kv_len, self.page_size) - req.cached_len

    def private_tokens(self) -> int:
        """KV slots the running requests own privately (the ledger's ``private`` term)."""
        return sum(self.private_of(r) for r in self.running)

    def release(self, req: Request) -> None:
        """Hand a request's KV back: computed pages into the prefix cache (for reuse), the
        partial last page to the allocator, the prefix lock released, the row freed. Positions
        planned ahead and not run (overlap) go back first: their KV was never computed."""
        self.unplan(req)
        if req.row is not None:
            slots = self.req_table.slots(req.row, req.kv_len)
            self.cache.insert(req.fill_ids[: req.kv_len], slots)
            aligned = req.kv_len - req.kv_len % self.page_size
            if aligned < req.kv_len:
                self.allocator.free(slots[aligned:])
            if req.prefix_node is not None:
                self.cache.dec_lock_ref(req.prefix_node)
            self.req_table.free(req.row)
        if req in self.running:
            self.running.remove(req)
        req.row, req.prefix_node = None, None
        req.kv_len = req.cached_len = req.prefill_target = 0

    def shrink(self, req: Request, keep: int) -> None:
        """Give back the KV of positions [keep, kv_len): a request's rejected drafts. The pages
        only they occupy are freed (staged while the step's free group is open); a page that
        also holds kept positions stays, its tail rewritten by the next tokens."""
        if keep >= req.kv_len:
            return
        boundary = whole_pages(keep, self.page_size)
        if boundary < req.kv_len:
            self.allocator.free(self.req_table.slots(req.row, req.kv_len)[boundary:])
        req.kv_len = keep

    def unplan(self, req: Request) -> None:
        """Give back the positions planned ahead for ``req`` and not run (overlap): their KV
        was never computed."""
        if req.ahead and req.row is not None:
            self.shrink(req, req.kv_len - req.ahead)
        req.ahead = 0

    def write(self, req: Request, slots: torch.Tensor) -> None:
        """``slots`` for ``req``'s next positions (from ``kv_len`` on), written into its row."""
        self.req_table.write(req.row, req.kv_len, slots)

    def write_decode(self, reqs: list[Request], slots: torch.Tensor) -> None:
        """``slots[i]`` for ``reqs[i]``'s next position, written into their rows at once."""
        self.req_table.write_each([r.row for r in reqs], [r.kv_len for r in reqs], slots)

    def last_slot(self, req: Request) -> int | None:
        """The slot of ``req``'s last position where its last page has room (an extension
        continues on that page); None on a page boundary (always, with pages of one token)."""
        if not req.kv_len % self.page_size:
            return None
        return int(self.req_table.table[req.row, req.kv_len - 1])
