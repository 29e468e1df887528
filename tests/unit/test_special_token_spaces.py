"""vLLM's ``spaces_between_special_tokens`` over a decoder that spaces its tokens (WordPiece):
with special tokens shown, ``false`` writes two special tokens in a row with no space between
them, as vLLM's fast detokenizer does; ``true`` (the default) leaves the decoder's spaces. Text
between them is the decoder's either way, and with special tokens skipped it changes nothing."""

from __future__ import annotations

import pytest

from engine.model.detok import IncrementalDetokenizer
from engine.model.tokenizer import Tokenizer


@pytest.fixture(scope="module")
def tok() -> Tokenizer:
    from tokenizers import Tokenizer as Backend
    from tokenizers import decoders, models, pre_tokenizers

    vocab = {"[UNK]": 0, "hello": 1, "world": 2, "##s": 3}
    backend = Backend(models.WordPiece(vocab, unk_token="[UNK]"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    backend.decoder = decoders.WordPiece()
    backend.add_special_tokens(["[A]", "[B]"])
    return Tokenizer(
        backend, bos_id=None, eos_id=None, stop_ids=set(), add_bos=False, chat_template=None
    )


def text(tok: Tokenizer, ids: list[int], **kw: bool) -> tuple[str, str]:
    """(the deltas joined, the detokenizer's text): streamed and whole must agree."""
    d = IncrementalDetokenizer(tok, **kw)
    deltas = "".join(d.push(i) for i in ids) + d.flush()
    return deltas, d.text


def test_false_closes_the_space_between_two_special_tokens_and_only_there(tok):
    ids = tok.encode("hello [A][B] worlds [B]", add_special_tokens=False)
    assert tok.added_tokens == {4: "[A]", 5: "[B]"}
    spaced = "hello [A] [B] worlds [B]"
    assert text(tok, ids, skip_special_tokens=False) == (spaced, spaced)
    closed = "hello [A][B] worlds [B]"
    got = text(tok, ids, skip_special_tokens=False, spaces_between_special_tokens=False)
    assert got == (closed, closed)


def test_with_special_tokens_skipped_it_changes_nothing(tok):
    ids = tok.encode("hello [A][B] worlds", add_special_tokens=False)
    assert text(tok, ids) == text(tok, ids, spaces_between_special_tokens=False)
