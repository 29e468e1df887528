"""Rounding tokens up to whole pages: the one place it is written."""

from __future__ import annotations


def pages_for(tokens: int, page_size: int) -> int:
    """Pages needed to hold ``tokens`` (a negative count needs none)."""
    return -(-max(0, tokens) // page_size)


def whole_pages(tokens: int, page_size: int) -> int:
    """``tokens`` rounded up to whole pages, in tokens: what they occupy in the pool."""
    return pages_for(tokens, page_size) * page_size


def fresh_pages(held: int, extend: int, page_size: int) -> int:
    """Fresh pages a request holding ``held`` tokens needs to add ``extend`` more: its partial
    last page is filled first."""
    room = (-held) % page_size
    return pages_for(extend - room, page_size)
