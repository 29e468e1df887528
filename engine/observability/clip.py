"""Text shortened for a message keeps whole items (arguments, words) and says how many it left
out; it never cuts inside one, since a number, an address or a path cut short reads as another
one (``--kv-tokens 819`` for ``--kv-tokens 8192``)."""

from __future__ import annotations

from collections.abc import Sequence


def clip(items: Sequence[str], limit: int, unit: str = "word", sep: str = " ") -> str:
    """``items`` joined by ``sep``: as many whole ones as fit in ``limit`` characters (the first
    always, however long), then ``... (N more UNITs)`` when some were left out."""
    shown: list[str] = []
    size = -len(sep)
    for item in items:
        size += len(sep) + len(item)
        if shown and size > limit:
            break
        shown.append(item)
    left = len(items) - len(shown)
    if not left:
        return sep.join(shown)
    return f"{sep.join(shown)} ... ({left} more {unit}{'' if left == 1 else 's'})"


def clip_words(text: str, limit: int) -> str:
    """``text`` within about ``limit`` characters, cut between words (at spaces) if at all."""
    return text if len(text) <= limit else clip(text.split(" "), limit)
