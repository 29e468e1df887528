"""The one prompt check, shared by the HTTP layer and ``Scheduler.add_request``: one message per
fault, so a client and an offline caller read the same words. Also the checks the HTTP layer
makes before it spends anything on a request: a character bound that needs no tokenizer, and
whether the prompt and the tokens asked for can ever fit."""

from __future__ import annotations

from collections.abc import Iterable


class PromptError(ValueError):
    """A prompt the engine cannot take; ``param`` names the request field at fault."""

    def __init__(self, message: str, param: str = "prompt") -> None:
        super().__init__(message)
        self.param = param


def check_prompt(ids: list[int], *, vocab_size: int, max_context: int) -> None:
    """Raise PromptError when ``ids`` is empty, leaves no room in the context for one generated
    token, or has a token outside the vocabulary (the length first: it costs nothing)."""
    if not ids:
        raise PromptError("prompt is empty: at least one token is needed")
    if len(ids) >= max_context:
        raise PromptError(f"prompt has {len(ids)} tokens; the context limit is {max_context}")
    bad = next((t for t in ids if not 0 <= t < vocab_size), None)
    if bad is not None:
        raise PromptError(f"prompt token id {bad} is outside the vocabulary (0..{vocab_size - 1})")


def longest_token_chars(vocab: Iterable[str]) -> int:
    """The most characters one token can stand for. A vocabulary entry is never shorter than the
    text it decodes to (byte-level entries spell one character per byte), so this bounds it."""
    return max((len(t) for t in vocab), default=1)


def check_chars(chars: int, *, max_context: int, token_chars: int, param: str = "prompt") -> None:
    """Refuse a text too long for the context whatever its tokens: ``chars`` characters need at
    least chars / token_chars tokens. Costs nothing, so it runs before any tokenizing."""
    if chars > max_context * token_chars:
        raise PromptError(
            f"{param} is {chars:,} characters, more than the context limit of {max_context} "
            f"tokens can hold (no token of this model is longer than {token_chars} characters)",
            param,
        )


def fit_max_tokens(
    prompt_len: int,
    asked: int | None,
    *,
    max_context: int,
    kv_tokens: int,
    default: int | None = None,
) -> int:
    """The tokens a request may generate, decided before it runs: what it asked for when the
    prompt and that many tokens fit both the context and the KV pool (a request that fits the
    whole pool alone always completes; one that does not would end mid-way), else a PromptError
    naming max_tokens and the limit it passes. Unset: ``default`` capped by the room left."""
    pool_room, context_room = kv_tokens - prompt_len, max_context - prompt_len
    if pool_room < 1:
        raise PromptError(f"prompt has {prompt_len} tokens; the KV pool holds {kv_tokens}")
    room = min(pool_room, context_room)
    if asked is None:
        return room if default is None else min(default, room)
    if asked < 1:
        raise PromptError(f"max_tokens must be at least 1, got {asked}", "max_tokens")
    if asked <= room:
        return asked
    head = f"max_tokens {asked} + prompt {prompt_len} tokens exceed the"
    if pool_room < context_room:
        raise PromptError(
            f"{head} KV pool of {kv_tokens} tokens: this request could never run to its end "
            f"here; ask for at most {room}",
            "max_tokens",
        )
    raise PromptError(
        f"{head} context limit of {max_context} tokens; ask for at most {room}", "max_tokens"
    )


def check_param_ids(
    stop_token_ids: Iterable[int] | None, logit_bias: Iterable[int] | None, *, vocab_size: int
) -> None:
    """Raise PromptError naming the field when a ``stop_token_ids`` id or a ``logit_bias`` key is
    outside the vocabulary (the sampler indexes the logits with them)."""
    for name, ids in (("stop_token_ids", stop_token_ids), ("logit_bias", logit_bias)):
        bad = next((t for t in ids or () if not 0 <= int(t) < vocab_size), None)
        if bad is not None:
            raise PromptError(
                f"{name}: token id {bad} is outside the vocabulary (0..{vocab_size - 1})", name
            )
