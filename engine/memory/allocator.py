"""TokenAllocator: hands out KV slots a page at a time; never a partial allocation.

Slots are grouped in pages of ``page_size`` consecutive slots; page 0 is reserved as a harmless
padding target, so the pool behind an allocator has ``(pages + 1) * page_size`` slots.

Frees can be *staged*: between ``free_group_begin()`` and ``free_group_end()`` freed pages wait
in a group instead of returning to the free list. Staged tokens are reported by
``staged_size()`` and are never counted as available: ``alloc`` cannot hand them out until
``flush_free_group()`` (apply now, group stays open) or ``free_group_end()`` (apply and close).

Invariant (``check()``): free + staged + in use == capacity, each page in exactly one state.
"""

from __future__ import annotations

import torch

from engine.memory.pages import fresh_pages

FREE, IN_USE, STAGED = 0, 1, 2


class TokenAllocator:
    def __init__(self, capacity: int, page_size: int = 1) -> None:
        if page_size < 1:
            raise ValueError(f"page_size must be >= 1, got {page_size}")
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1, got {capacity}")
        if capacity < page_size:
            raise ValueError(f"capacity {capacity} is less than one page of {page_size} tokens")
        self.page_size = page_size
        self.num_pages = capacity // page_size
        self.capacity = self.num_pages * page_size  # whole pages only
        self.pool_slots = (self.num_pages + 1) * page_size  # including the padding page
        self._state = torch.zeros(self.num_pages + 1, dtype=torch.int8)
        self._state[0] = IN_USE  # the padding page is never handed out nor freed
        # a stack: allocation takes from the end, frees append (both O(pages moved))
        self._free: list[int] = list(range(self.num_pages, 0, -1))
        self._staged: list[torch.Tensor] = []
        self._staged_pages = 0
        self._group_open = False

    # -- sizes --------------------------------------------------------------------------------

    def available_size(self) -> int:
        """Tokens ``alloc`` can hand out right now (staged ones excluded)."""
        return len(self._free) * self.page_size

    def staged_size(self) -> int:
        return self._staged_pages * self.page_size

    def used_size(self) -> int:
        return self.capacity - self.available_size() - self.staged_size()

    @property
    def group_open(self) -> bool:
        return self._group_open

    # -- allocation ---------------------------------------------------------------------------

    def _pages_to_slots(self, pages: torch.Tensor) -> torch.Tensor:
        if self.page_size == 1:
            return pages
        offs = torch.arange(self.page_size, dtype=torch.int64)
        return (pages[:, None] * self.page_size + offs).flatten()

    def _take_pages(self, k: int) -> torch.Tensor | None:
        if k > len(self._free):
            return None
        if k == 0:
            return torch.empty(0, dtype=torch.int64)
        pages = torch.tensor(self._free[-k:], dtype=torch.int64)
        del self._free[-k:]
        self._state.index_fill_(0, pages, IN_USE)  # a third of indexed assignment's time
        return pages

    def alloc(self, n: int) -> torch.Tensor | None:
        """``n`` slots on fresh pages (``n`` a multiple of the page size), or None when they
        are not all available; nothing is taken then."""
        if n < 0 or n % self.page_size:
            raise ValueError(
                f"alloc({n}): need a non-negative multiple of page_size {self.page_size}"
            )
        pages = self._take_pages(n // self.page_size)
        return None if pages is None else self._pages_to_slots(pages)

    def pages_needed(self, held: int, extend: int) -> int:
        """Fresh pages a request holding ``held`` tokens needs to add ``extend`` more."""
        return fresh_pages(held, extend, self.page_size)

    def fresh_slots(self, held: int, extend: int) -> int:
        """The pool slots those fresh pages hold (what the allocation takes from ``available``)."""
        return self.pages_needed(held, extend) * self.page_size

    def alloc_extend(self, held: int, extend: int, last_slot: int | None) -> torch.Tensor | None:
        """Slots for ``extend`` new tokens of a request that holds ``held`` tokens whose last
        one sits at ``last_slot``: first the rest of its partial last page, then fresh pages.
        None (nothing taken) when the fresh pages are not available."""
        if extend < 0 or held < 0:
            raise ValueError(f"alloc_extend: held {held} and extend {extend} must be >= 0")
        room = (-held) % self.page_size
        if room:
            if last_slot is None:
                raise ValueError("alloc_extend: a partial last page needs its last slot")
            page = last_slot // self.page_size
            if (
                last_slot % self.page_size != (held - 1) % self.page_size
                or not 0 < page <= self.num_pages
                or int(self._state[page]) != IN_USE
            ):
                raise ValueError(
                    f"alloc_extend: last slot {last_slot} is not token {held - 1} of an "
                    "allocated page"
                )
        pages = self._take_pages(self.pages_needed(held, extend))
        if pages is None:
            return None
        head = min(room, extend)
        tail = self._pages_to_slots(pages)[: extend - head]
        if head == 0:
            return tail
        return torch.cat(
            [torch.arange(last_slot + 1, last_slot + 1 + head, dtype=torch.int64), tail]
        )

    def alloc_decode(self, held: list[int], last: list[int | None]) -> torch.Tensor | None:
        """One slot each for the next token of several requests (request ``i`` holds
        ``held[i]`` tokens, its last at ``last[i]``, as ``alloc_extend`` takes them), with one
        taking of fresh pages for them all: a decode step's slots without a call per request.
        A request with room on its last page continues there; the others take a fresh page
        each. None (nothing taken) when the fresh pages are not all available."""
        ps = self.page_size
        fresh = [i for i, h in enumerate(held) if h % ps == 0]
        out = [0] * len(held)
        if len(fresh) < len(held):  # checked before anything is taken
            for i, (h, s) in enumerate(zip(held, last)):
                if h % ps:
                    if s is None or s % ps != (h - 1) % ps:
                        raise ValueError(f"alloc_decode: last slot {s} is not token {h - 1}'s")
                    out[i] = s + 1
        pages = self._take_pages(len(fresh))
        if pages is None:
            return None
        if len(fresh) == len(held):
            return pages * ps if ps > 1 else pages
        for i, page in zip(fresh, pages.tolist()):
            out[i] = page * ps
        return torch.tensor(out, dtype=torch.int64)

    # -- freeing ------------------------------------------------------------------------------

    def _pages_of(self, slots: torch.Tensor) -> torch.Tensor:
        slots = slots.to(torch.int64).flatten()
        bad = (slots < self.page_size) | (slots >= self.pool_slots)
        if bool(bad.any()):
            raise ValueError(f"slot {int(slots[bad][0])} is not a slot of this pool")
        pages = slots // self.page_size if self.page_size > 1 else slots
        state = self._state[pages]
        if not bool((state == IN_USE).all()):
            i = int(torch.nonzero(state != IN_USE)[0])
            what = "already staged for freeing" if int(state[i]) == STAGED else "not allocated"
            where = f" (page {int(pages[i])})" if self.page_size > 1 else ""
            raise ValueError(f"slot {int(slots[i])}{where} freed while {what} (double free?)")
        if self.page_size > 1:
            return pages.unique()
        uniq, counts = pages.unique(return_counts=True)
        if bool((counts > 1).any()):
            raise ValueError(f"slot {int(uniq[counts > 1][0])} appears twice in one free")
        return uniq

    def free(self, slots: torch.Tensor) -> None:
        """Free the pages these slots lie on (staged while a free group is open)."""
        if slots.numel() == 0:
            return
        pages = self._pages_of(slots)
        if self._group_open:
            self._state[pages] = STAGED
            self._staged.append(pages)
            self._staged_pages += int(pages.numel())
        else:
            self._state[pages] = FREE
            self._free.extend(pages.tolist())

    def free_group_begin(self) -> None:
        if self._group_open:
            raise RuntimeError("free_group_begin: a free group is already open")
        self._group_open = True

    def flush_free_group(self) -> int:
        """Apply the staged frees now, leaving the group open; returns the tokens freed.

        The caller's later ``free_group_end()`` stays safe: what was flushed is no longer
        staged, so it cannot be freed twice."""
        if not self._staged:
            return 0
        pages = torch.cat(self._staged)
        self._staged.clear()
        self._staged_pages = 0
        self._state[pages] = FREE
        self._free.extend(pages.tolist())
        return int(pages.numel()) * self.page_size

    def free_group_end(self) -> int:
        """Apply the staged frees and close the group; returns the tokens freed."""
        if not self._group_open:
            raise RuntimeError("free_group_end: no free group is open")
        freed = self.flush_free_group()
        self._group_open = False
        return freed

    # -- resizing (a pool cutover) ----------------------------------------------------------------

    def page_map(self, capacity: int) -> torch.Tensor:
        """Where each page in use goes in a pool of ``capacity`` tokens: the pages in use, in
        order, onto pages 1..k (-1: not in use). Changes nothing; raises ValueError when they
        do not fit or frees are staged (the caller flushes them first)."""
        if self._group_open or self._staged_pages:
            raise ValueError("a pool resize needs no open free group and no staged frees")
        used = torch.nonzero(self._state[1:] == IN_USE).flatten() + 1
        pages = capacity // self.page_size
        if pages < 1 or int(used.numel()) > pages:
            raise ValueError(
                f"{int(used.numel()) * self.page_size} tokens in use do not fit a pool of "
                f"{capacity} tokens"
            )
        out = torch.full((self.num_pages + 1,), -1, dtype=torch.int64)
        out[used] = torch.arange(1, int(used.numel()) + 1, dtype=torch.int64)
        return out

    def slot_map(self, page_map: torch.Tensor) -> torch.Tensor:
        """``page_map`` slot by slot: old slot -> new slot (-1: not in use)."""
        offs = torch.arange(self.page_size, dtype=torch.int64)
        slots = (page_map[:, None] * self.page_size + offs).flatten()
        return torch.where(page_map.repeat_interleave(self.page_size) < 0, -1, slots)

    def resize(self, capacity: int, in_use: int) -> None:
        """Become a pool of ``capacity`` tokens whose pages 1..``in_use`` are in use (where
        ``page_map`` put the old ones) and the rest free."""
        pages = capacity // self.page_size
        self.num_pages, self.capacity = pages, pages * self.page_size
        self.pool_slots = (pages + 1) * self.page_size
        self._state = torch.zeros(pages + 1, dtype=torch.int8)
        self._state[: in_use + 1] = IN_USE  # page 0: the padding page
        self._free = list(range(pages, in_use, -1))

    # -- checking -----------------------------------------------------------------------------

    def check(self) -> None:
        """Conservation: free + staged + in use == capacity, each page in exactly one state."""
        if int(self._state[0]) != IN_USE:
            raise AssertionError("allocator: the padding page 0 is no longer reserved")
        listed = sum(int(p.numel()) for p in self._staged)
        if listed != self._staged_pages:
            raise AssertionError(
                f"allocator: staged list holds {listed} pages, counter says {self._staged_pages}"
            )
        counts = torch.bincount(self._state[1:].to(torch.int64), minlength=3).tolist()
        free, in_use, staged = counts[FREE], counts[IN_USE], counts[STAGED]
        ps = self.page_size
        if len(self._free) != free or len(set(self._free)) != free:
            raise AssertionError(
                f"allocator: free list holds {len(self._free)} pages "
                f"({len(set(self._free))} distinct) but {free} pages are marked free"
            )
        if self._staged_pages != staged:
            raise AssertionError(
                f"allocator: {self._staged_pages} pages recorded staged, {staged} marked staged"
            )
        if (free + staged + in_use) * ps != self.capacity:
            raise AssertionError(
                f"allocator ledger: free {free * ps} + staged {staged * ps} + in use "
                f"{in_use * ps} != capacity {self.capacity}"
            )
