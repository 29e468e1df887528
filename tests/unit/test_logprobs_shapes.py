"""Logprobs as each OpenAI API writes them: a chat's per-token objects with their bytes and the
alternatives, a completion's parallel lists whose text offsets continue across chunks (after an
echo, or from the prompt's first token when its logprobs come first); -inf (a token a grammar
forbids) written as vLLM writes it. And what a request asks for:
a chat's logprobs and top_logprobs, a completion's logprobs count."""

from __future__ import annotations

import math

import pytest

from engine.server.logprobs import FLOOR, LogprobsWriter, TokenTexts
from engine.server.protocol import ChatCompletionRequest, CompletionRequest, ProtocolError

WORDS = {1: "Hel", 2: "lo", 3: " é", 4: "\ufffd"}


class Texts(TokenTexts):
    def __init__(self) -> None:
        self.text = WORDS.__getitem__


ENTRIES = [(1, -0.5, ((1, -0.5), (2, -1.5))), (4, -math.inf, ((3, -0.1), (4, -math.inf)))]


def test_a_chats_logprobs_are_one_object_per_token_with_bytes_and_alternatives():
    obj = LogprobsWriter("chat", Texts(), 1).of(0, ENTRIES)
    first, second = obj["content"]
    assert first == {
        "token": "Hel",
        "logprob": -0.5,
        "bytes": [72, 101, 108],
        "top_logprobs": [
            {"token": "Hel", "logprob": -0.5, "bytes": [72, 101, 108]},
            {"token": "lo", "logprob": -1.5, "bytes": [108, 111]},
        ],
    }
    assert second["logprob"] == FLOOR and second["bytes"] == [0xEF, 0xBF, 0xBD]
    assert obj["refusal"] is None


def test_a_completions_offsets_continue_across_chunks_after_the_echo():
    w = LogprobsWriter("text", Texts(), 2, echo="Say: ")
    a = w.of(0, ENTRIES[:1])
    b = w.of(0, [(2, -1.0, ()), (3, -2.0, ())])
    assert a == {
        "tokens": ["Hel"],
        "token_logprobs": [-0.5],
        "text_offset": [5],
        "top_logprobs": [{"Hel": -0.5, "lo": -1.5}],
    }
    assert b["text_offset"] == [8, 10] and b["top_logprobs"] == [{}, {}]
    assert w.of(1, [(2, -1.0, ())])["text_offset"] == [5]  # each choice its own


def test_what_each_api_asks_for():
    chat = {"messages": [{"role": "user", "content": "hi"}]}
    assert ChatCompletionRequest.model_validate(chat).logprob_count() is None
    on = ChatCompletionRequest.model_validate({**chat, "logprobs": True})
    assert on.logprob_count() == 0
    assert (
        ChatCompletionRequest.model_validate(
            {**chat, "logprobs": True, "top_logprobs": 5}
        ).logprob_count()
        == 5
    )
    with pytest.raises(ProtocolError, match="needs logprobs: true"):
        ChatCompletionRequest.model_validate({**chat, "top_logprobs": 5}).logprob_count()
    assert CompletionRequest.model_validate({"prompt": "a", "logprobs": 3}).logprob_count() == 3
    echoed = CompletionRequest.model_validate({"prompt": "a", "logprobs": 0, "echo": True})
    assert (echoed.logprob_count(), echoed.prompt_logprob_count()) == (0, 0)
    plain = CompletionRequest.model_validate({"prompt": "a", "echo": True})
    assert plain.prompt_logprob_count() is None


def test_an_echoed_completion_starts_with_the_prompts_tokens_the_first_unscored():
    w = LogprobsWriter("text", Texts(), 1, echo="Hello", prompt=[1, 2])
    obj = w.of(0, [(3, -0.2, ((3, -0.2),))], [(2, -1.5, ((1, -0.7),))])
    assert obj["tokens"] == ["Hel", "lo", " é"] and obj["text_offset"] == [0, 3, 5]
    assert obj["token_logprobs"] == [None, -1.5, -0.2]
    assert obj["top_logprobs"] == [None, {"Hel": -0.7}, {" é": -0.2}]
    assert w.of(0, [(2, -1.0, ())])["text_offset"] == [7]  # the prompt only once
