"""Logprobs as OpenAI's two APIs write them: a chat choice's ``logprobs.content`` (one object per
token: its text, logprob, UTF-8 bytes and the most likely alternatives) and a completion
choice's ``logprobs`` (parallel lists: tokens, token_logprobs, top_logprobs as maps, and each
token's character offset in the choice's text).

A token's text is its own decoding (special tokens shown): a token that holds part of a UTF-8
character decodes to U+FFFD, as vLLM writes it. A logprob of -inf (a token a grammar forbids)
is written as -9999.0, as vLLM does: JSON has no infinity. With vLLM's
``return_tokens_as_token_ids`` a token is written ``token_id:N`` instead (a chat token's
``bytes`` stay its text's, and a completion's offsets count its text's characters).

vLLM's ``prompt_logprobs`` are written as vLLM writes them: a list with one entry per prompt
token, None for the first (nothing predicts it), then a map of token id to ``{"logprob",
"rank", "decoded_token"}`` holding the prompt's token (its rank its place among all tokens) and
the most likely ones (ranks 1 to k).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from functools import lru_cache
from typing import Any

from engine.model.tokenizer import Tokenizer
from engine.request.messages import TokenLogprobs

FLOOR = -9999.0  # what -inf is written as


class TokenTexts:
    """Each token id's text, decoded once."""

    def __init__(self, tokenizer: Tokenizer) -> None:
        self.text = lru_cache(maxsize=65536)(
            lambda tid: tokenizer.decode([tid], skip_special_tokens=False)
        )


def _lp(v: float) -> float:
    return v if math.isfinite(v) else FLOOR


def _name(tid: int, texts: TokenTexts, as_ids: bool) -> str:
    return f"token_id:{tid}" if as_ids else texts.text(tid)


def chat_logprobs(
    entries: Sequence[TokenLogprobs], texts: TokenTexts, as_ids: bool = False
) -> dict[str, Any]:
    def one(tid: int, lp: float) -> dict[str, Any]:
        t = texts.text(tid)
        return {"token": _name(tid, texts, as_ids), "logprob": _lp(lp), "bytes": list(t.encode())}

    content = [
        {**one(tid, lp), "top_logprobs": [one(t, v) for t, v in top]} for tid, lp, top in entries
    ]
    return {"content": content, "refusal": None}


def completion_logprobs(
    entries: Sequence[TokenLogprobs | tuple[int, None, None]],
    texts: TokenTexts,
    offset: int,
    as_ids: bool = False,
) -> dict[str, Any]:
    """``offset``: where the first token's text starts in the choice's text. An entry without a
    logprob (a prompt's first token: nothing predicts it) is written with nulls."""
    offsets = []
    for tid, _, _ in entries:
        offsets.append(offset)
        offset += len(texts.text(tid))
    return {
        "tokens": [_name(tid, texts, as_ids) for tid, _, _ in entries],
        "token_logprobs": [None if lp is None else _lp(lp) for _, lp, _ in entries],
        "top_logprobs": [
            None if top is None else {_name(t, texts, as_ids): _lp(v) for t, v in top}
            for _, _, top in entries
        ],
        "text_offset": offsets,
    }


def prompt_logprobs(
    scored: Sequence[TokenLogprobs], ranks: Sequence[int], texts: TokenTexts, k: int
) -> list[dict[str, Any] | None]:
    """vLLM's ``prompt_logprobs`` of a prompt whose tokens after the first are ``scored`` (each
    with its rank among all tokens in ``ranks``), each with its ``k`` most likely tokens'."""
    out: list[dict[str, Any] | None] = [None]
    for (tid, lp, top), rank in zip(scored, ranks, strict=True):
        entry = {str(tid): {"logprob": _lp(lp), "rank": rank, "decoded_token": texts.text(tid)}}
        for rank, (t, v) in enumerate(top[:k], start=1):
            entry[str(t)] = {"logprob": _lp(v), "rank": rank, "decoded_token": texts.text(t)}
        out.append(entry)
    return out


class LogprobsWriter:
    """One response's logprobs, choice by choice, in its API's shape; a completion's offsets
    continue from chunk to chunk. ``echo``: the characters a completion's text starts with;
    ``prompt``: its prompt's token ids, when the prompt's logprobs come first (then the offsets
    count from the prompt's first token, whose text the echo is)."""

    def __init__(
        self,
        kind: str,
        texts: TokenTexts,
        n: int,
        echo: str = "",
        prompt: list[int] | None = None,
        as_ids: bool = False,
        top: int | None = None,
    ) -> None:
        self.kind = kind
        self.texts = texts
        self.prompt = prompt
        self.as_ids = as_ids  # tokens written as token_id:N
        self.top = top  # the most likely tokens an echoed prompt's token comes with
        self.offsets = [0 if prompt else len(echo)] * n

    def of(
        self,
        i: int,
        entries: Sequence[TokenLogprobs],
        scored: Sequence[TokenLogprobs] | None = None,
    ) -> dict[str, Any]:
        """Choice ``i``'s ``entries``; ``scored``: its prompt's, ahead of them (a completion
        with echo, once)."""
        if self.kind == "chat":
            return chat_logprobs(entries, self.texts, self.as_ids)
        head: list[Any] = []
        if self.prompt and scored is not None:
            k = self.top  # the engine's may be more, where prompt_logprobs asked for more
            head = [(self.prompt[0], None, None), *((t, v, top[:k]) for t, v, top in scored)]
        obj = completion_logprobs([*head, *entries], self.texts, self.offsets[i], self.as_ids)
        self.offsets[i] += sum(map(len, obj["tokens"]))
        return obj
