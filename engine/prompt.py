"""The one prompt check, shared by the HTTP layer and ``Scheduler.add_request``: one message per
fault, so a client and an offline caller read the same words."""

from __future__ import annotations


class PromptError(ValueError):
    """A prompt the engine cannot take; ``param`` names the request field at fault."""

    param = "prompt"


def check_prompt(ids: list[int], *, vocab_size: int, max_context: int) -> None:
    """Raise PromptError when ``ids`` is empty, has a token outside the vocabulary, or leaves
    no room in the context for one generated token."""
    if not ids:
        raise PromptError("prompt is empty: at least one token is needed")
    bad = next((t for t in ids if not 0 <= t < vocab_size), None)
    if bad is not None:
        raise PromptError(f"prompt token id {bad} is outside the vocabulary (0..{vocab_size - 1})")
    if len(ids) >= max_context:
        raise PromptError(f"prompt has {len(ids)} tokens; the context limit is {max_context}")
