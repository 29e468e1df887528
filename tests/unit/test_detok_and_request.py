"""A hand-built byte-level BPE tokenizer, incremental detokenization, chat rendering, and the
request's stop logic (stop strings, stop tokens, length limits, streamed deltas)."""

from __future__ import annotations

import pytest

from engine.model.chat import ChatTemplateError
from engine.model.detok import IncrementalDetokenizer
from engine.model.sampling import SamplingParams
from engine.model.tokenizer import Tokenizer
from engine.scheduler.request import Request, State

# -- a tiny byte-level BPE vocabulary ---------------------------------------------------------


def byte_to_char() -> dict[int, str]:
    """GPT-2's byte-level alphabet: printable Latin-1 bytes stand for themselves, the other 68
    bytes (controls, space, 0x7F-0xA0, 0xAD) take the code points from 256 up, in byte order."""
    printable = set(range(0x21, 0x7F)) | set(range(0xA1, 0xAD)) | set(range(0xAE, 0x100))
    table, shifted = {}, 0
    for b in range(256):
        if b in printable:
            table[b] = chr(b)
        else:
            table[b] = chr(0x100 + shifted)
            shifted += 1
    return table


B2C = byte_to_char()


def bl(raw: bytes) -> str:
    return "".join(B2C[b] for b in raw)


# Merges as byte pairs; each result becomes a token. Some split a character on purpose.
MERGES = [
    (b"h", b"e"),
    (b"l", b"l"),
    (b"he", b"ll"),
    (b"hell", b"o"),  # "hello" is one token
    (b" ", b"w"),
    (b" w", b"o"),
    (b" wo", b"r"),
    (b" wor", b"l"),
    (b" worl", b"d"),  # " world" is one token
    (b"S", b"T"),
    (b"O", b"P"),
    (b"ST", b"OP"),  # "STOP" is one token
    (b"\xc3", b"\xa9"),  # "é" is one token
    (b"\xe6", b"\x97"),  # the first two of the three bytes of "日": it spans two tokens
]
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHATML = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def make_tokenizer(chat_template: str = CHATML) -> Tokenizer:
    tokens = [B2C[b] for b in range(256)]
    tokens += [bl(a + b) for a, b in MERGES]
    types = [1] * len(tokens)
    tokens += SPECIALS
    types += [3] * len(SPECIALS)
    meta = {
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.pre": "default",
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.token_type": types,
        "tokenizer.ggml.merges": [f"{bl(a)} {bl(b)}" for a, b in MERGES],
        "tokenizer.ggml.bos_token_id": tokens.index("<|endoftext|>"),
        "tokenizer.ggml.eos_token_id": tokens.index("<|im_end|>"),
        "tokenizer.chat_template": chat_template,
    }
    return Tokenizer.from_gguf_metadata(meta)


@pytest.fixture(scope="module")
def tok() -> Tokenizer:
    return make_tokenizer()


def tid(tok: Tokenizer, text: str) -> int:
    got = tok.backend.token_to_id(text)
    assert got is not None, text
    return got


MULTIBYTE = [
    "héllo wörld",
    "日本語のテキスト",
    "robot 🤖 says hi 🤖🤖",
    "mixed é日本🤖 end",
    "hello world",
    "ﬁ — “quotes” ✓ 𝔘𝔫𝔦",
]


# -- the tokenizer ----------------------------------------------------------------------------


def test_vocabulary_is_as_built(tok):
    assert tok.vocab_size == 256 + len(MERGES) + len(SPECIALS)
    assert tok.encode("hello world") == [tid(tok, "hello"), tid(tok, bl(b" world"))]
    # "日" = e6 97 a5 spans two tokens, "🤖" = f0 9f a4 96 spans four
    assert len(tok.encode("日")) == 2
    assert len(tok.encode("🤖")) == 4
    assert tok.stop_ids == {tid(tok, "<|im_end|>")}
    assert tok.bos_id == tid(tok, "<|endoftext|>") and not tok.add_bos


@pytest.mark.parametrize("text", MULTIBYTE)
def test_encode_decode_round_trip(tok, text):
    assert tok.decode(tok.encode(text)) == text


def test_special_tokens_encode_as_single_ids_and_decode_skips_them(tok):
    start, end = tid(tok, "<|im_start|>"), tid(tok, "<|im_end|>")
    assert tok.encode("<|im_start|>", add_special_tokens=False) == [start]
    text = "<|im_start|>user\nhello<|im_end|>"
    ids = tok.encode(text, add_special_tokens=False)
    assert ids[0] == start and ids[-1] == end
    assert ids.count(start) == 1 and ids.count(end) == 1
    assert tid(tok, "hello") in ids
    assert tok.decode(ids) == "user\nhello"
    assert tok.decode(ids, skip_special_tokens=False) == text


def test_render_chat_chatml(tok):
    messages = [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "Hi there"},
    ]
    want = (
        "<|im_start|>system\nYou are terse.<|im_end|>\n"
        "<|im_start|>user\nHi there<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    assert tok.render_chat(messages) == want
    assert tok.render_chat(messages, add_generation_prompt=False) == want.removesuffix(
        "<|im_start|>assistant\n"
    )
    ids = tok.encode_chat(messages)
    assert ids.count(tid(tok, "<|im_start|>")) == 3
    assert tok.decode(ids, skip_special_tokens=False) == want


def test_content_as_text_parts_renders_the_same(tok):
    plain = [{"role": "user", "content": "hello wörld"}]
    parts = [
        {
            "role": "user",
            "content": [{"type": "text", "text": "hello "}, {"type": "text", "text": "wörld"}],
        }
    ]
    assert tok.render_chat(parts) == tok.render_chat(plain)
    assert tok.render_chat([{"role": "user", "content": None}]) == tok.render_chat(
        [{"role": "user", "content": ""}]
    )


@pytest.mark.parametrize(
    ("messages", "message"),
    [
        ([], "messages must be a non-empty list"),
        ([{"content": "no role"}], r"messages\[0\] must be an object with a string 'role'"),
        (
            [{"role": "user", "content": "ok"}, {"role": 3, "content": "x"}],
            r"messages\[1\] must be an object",
        ),
        ([{"role": "user", "content": "ok"}, "hi"], r"messages\[1\] must be an object"),
        (
            [
                {"role": "user", "content": "ok"},
                {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "image"}]},
            ],
            r"messages\[1\]\.content\[1\] must be a text part",
        ),
        (
            [{"role": "user", "content": [{"type": "text", "text": 5}]}],
            r"messages\[0\]\.content\[0\] must be a text part",
        ),
        (
            [{"role": "user", "content": ["plain string part"]}],
            r"messages\[0\]\.content\[0\] must be a text part",
        ),
        (
            [{"role": "user", "content": 42}],
            r"messages\[0\]\.content must be a string or a list of text parts",
        ),
    ],
)
def test_malformed_messages_raise_naming_the_index(tok, messages, message):
    with pytest.raises(ChatTemplateError, match=message):
        tok.render_chat(messages)


def test_template_raise_exception_becomes_chat_template_error():
    template = (
        "{% for m in messages %}{% if m['role'] not in ['user', 'assistant'] %}"
        "{{ raise_exception('Only user and assistant roles are supported!') }}"
        "{% endif %}{{ m['content'] }}{% endfor %}"
    )
    t = make_tokenizer(template)
    assert t.render_chat([{"role": "user", "content": "hi"}]) == "hi"
    with pytest.raises(ChatTemplateError, match="^Only user and assistant roles are supported!$"):
        t.render_chat([{"role": "system", "content": "x"}, {"role": "user", "content": "hi"}])


def test_a_broken_template_is_a_chat_template_error():
    t = make_tokenizer("{{ messages[0]['content'].nope() }}")
    with pytest.raises(ChatTemplateError, match="chat template failed"):
        t.render_chat([{"role": "user", "content": "hi"}])


# -- IncrementalDetokenizer -------------------------------------------------------------------


@pytest.mark.parametrize("text", MULTIBYTE)
def test_pushing_ids_one_by_one_reconstructs_the_text(tok, text):
    ids = tok.encode(text)
    d = IncrementalDetokenizer(tok)
    deltas = [d.push(i) for i in ids]
    assert "".join(deltas) == tok.decode(ids) == text
    assert not any("\ufffd" in x for x in deltas)
    assert d.flush() == ""
    assert d.text == text
    if len(text.encode()) > len(text) and any(len(c.encode()) > 2 for c in text):
        # a character split over tokens was held back at least once, then released whole
        assert "" in deltas


def test_held_back_bytes_are_released_by_the_completing_token(tok):
    ids = tok.encode("a🤖b")
    assert len(ids) == 6
    d = IncrementalDetokenizer(tok)
    assert [d.push(i) for i in ids] == ["a", "", "", "", "🤖", "b"]


def test_special_tokens_are_skipped_in_the_stream(tok):
    ids = [
        tid(tok, "<|im_start|>"),
        *tok.encode("日本 hello"),
        tid(tok, "<|im_end|>"),
        *tok.encode(" 🤖"),
    ]
    d = IncrementalDetokenizer(tok)
    assert "".join(d.push(i) for i in ids) == tok.decode(ids) == "日本 hello 🤖"


def test_flush_emits_a_truly_incomplete_tail(tok):
    ids = tok.encode("ok🤖")[:3]  # "o", "k" and the first byte of the emoji
    d = IncrementalDetokenizer(tok)
    assert "".join(d.push(i) for i in ids) == "ok"
    assert d.flush() == "\ufffd"
    assert d.text == "ok\ufffd"


# -- Request stop logic -----------------------------------------------------------------------


def make_request(
    tok: Tokenizer, prompt_len: int = 3, max_context: int = 10_000, **params
) -> Request:
    return Request.create(
        "r-0", [tid(tok, "h")] * prompt_len, SamplingParams(**params), tok, max_context
    )


def stream(req: Request, ids: list[int]) -> list[str]:
    """Feed ids until the request finishes; every delta is checked against the final text by
    the caller. Along the way, what was shown is always a prefix of the request's text."""
    deltas = []
    for t in ids:
        req.append_token(t)
        deltas.append(req.take_text_delta())
        assert req.text.startswith("".join(deltas))
        if req.finish_reason is not None:
            break
    return deltas


def test_stop_string_is_removed_and_finishes_with_stop(tok):
    ids = tok.encode("hello world STOP and more text")
    req = make_request(tok, stop="STOP", max_tokens=100)
    deltas = stream(req, ids)
    assert req.finish_reason == "stop"
    assert req.text == "hello world "
    assert "".join(deltas) == req.text
    assert len(req.output_ids) < len(ids)  # it stopped at the stop string, not at the end
    assert req.take_text_delta() == ""


def test_stop_string_split_across_tokens_is_caught(tok):
    ids = tok.encode("hello world again")
    pieces = [tok.decode([i]) for i in ids]
    assert not any("lo wo" in p for p in pieces)  # it only exists across two tokens
    req = make_request(tok, stop=["lo wo"], max_tokens=100)
    deltas = stream(req, ids)
    assert req.finish_reason == "stop"
    assert req.text == "hel"
    assert "".join(deltas) == "hel"
    assert len(req.output_ids) == 2


def test_stop_string_over_split_multibyte_characters_is_caught(tok):
    ids = tok.encode("ab 日本 cd")
    req = make_request(tok, stop="日本", max_tokens=100)
    deltas = stream(req, ids)
    assert req.finish_reason == "stop"
    assert req.text == "ab "
    assert "".join(deltas) == "ab "


def test_stop_string_inside_one_token_cuts_mid_token(tok):
    req = make_request(tok, stop="TO", max_tokens=100)
    stream(req, tok.encode("go STOP"))
    assert req.finish_reason == "stop"
    assert req.text == "go S"


def test_the_earliest_of_several_stop_strings_wins(tok):
    req = make_request(tok, stop=["world", "lo"], max_tokens=100)
    deltas = stream(req, tok.encode("hello world"))
    assert req.finish_reason == "stop"
    assert req.text == "hel" == "".join(deltas)
    # which stop string ended it travels with the final output (Anthropic's stop_sequence)
    req.state = State.FINISHED
    assert req.stop_sequence == "lo" == req.output([]).stop_sequence


@pytest.mark.parametrize(
    ("text", "stops", "final"),
    [
        ("x ST y STOP z", ["STOP"], "x ST y "),
        ("a S b ST c STO d STOP e", ["STOP"], "a S b ST c STO d "),
        ("hello hello world", ["lo wo"], "hello hel"),
        ("日本語 日本 日本人", ["本人", "語 日本 x"], "日本語 日本 日"),
        ("🤖🤖 robot 🤖!", ["🤖!", "t 🤖?"], "🤖🤖 robot "),
    ],
)
def test_streamed_deltas_never_show_a_stop_prefix_that_completes(tok, text, stops, final):
    req = make_request(tok, stop=stops, max_tokens=200)
    deltas = stream(req, tok.encode(text))
    assert req.finish_reason == "stop"
    assert req.text == final
    assert "".join(deltas) == final


def test_running_request_holds_back_a_possible_stop_prefix(tok):
    req = make_request(tok, stop="STOP", max_tokens=100)
    req.append_token(tid(tok, "hello"))
    assert req.take_text_delta() == "he"  # "llo" (3 = len("STOP") - 1 chars) held back
    req.append_token(tid(tok, bl(b" world")))
    assert req.take_text_delta() == "llo wo"
    assert req.finish_reason is None


def test_max_tokens_finishes_with_length(tok):
    ids = tok.encode("hello world and more")
    req = make_request(tok, max_tokens=3, stop="zzz")
    deltas = stream(req, ids)
    assert req.finish_reason == "length"
    assert req.output_ids == ids[:3]
    assert req.text == tok.decode(ids[:3]) == "".join(deltas)


def test_max_tokens_releases_held_back_bytes_at_the_end(tok):
    ids = tok.encode("a🤖")
    req = make_request(tok, max_tokens=3)  # "a" and two of the emoji's four bytes
    deltas = stream(req, ids)
    assert req.finish_reason == "length"
    assert req.text == "a\ufffd" == "".join(deltas)


def test_stop_token_finishes_with_stop(tok):
    end = tid(tok, "<|im_end|>")
    ids = [*tok.encode("hello"), end, *tok.encode(" world")]
    req = make_request(tok, max_tokens=100)
    deltas = stream(req, ids)
    assert req.finish_reason == "stop"
    assert req.output_ids[-1] == end
    assert req.text == "hello" == "".join(deltas)
    assert req.stop_sequence is None  # a stop token is no stop string


def test_stop_token_is_ignored_with_ignore_eos(tok):
    end = tid(tok, "<|im_end|>")
    ids = [*tok.encode("hello"), end, *tok.encode(" world")]
    req = make_request(tok, max_tokens=len(ids), ignore_eos=True)
    deltas = stream(req, ids)
    assert req.finish_reason == "length"
    assert req.output_ids == ids
    assert req.text == "hello world" == "".join(deltas)


def test_request_stop_token_ids_finish_with_stop(tok):
    stop_tok = tid(tok, "STOP")
    ids = tok.encode("hello STOP world")
    assert stop_tok in ids
    req = make_request(tok, max_tokens=100, stop_token_ids=[stop_tok])
    stream(req, ids)
    assert req.finish_reason == "stop"
    assert req.output_ids[-1] == stop_tok
    assert req.text == "hello "  # the stop token's own text is not shown


def test_max_context_finishes_with_length(tok):
    ids = tok.encode("hello world and more")
    req = make_request(tok, prompt_len=5, max_context=8, max_tokens=100)
    stream(req, ids)
    assert req.finish_reason == "length"
    assert len(req.output_ids) == 3
    assert req.text == tok.decode(ids[:3])


def test_stop_string_cannot_end_a_request_before_min_tokens(tok):
    ids = tok.encode("ab ab ab")
    early = make_request(tok, stop="ab", max_tokens=50)
    stream(early, ids)
    assert early.finish_reason == "stop" and early.text == ""
    assert len(early.output_ids) == len(tok.encode("ab"))
    # the first "ab" falls before min_tokens and is kept; the one completed at min_tokens stops
    n = len(tok.encode("ab ab"))
    late = make_request(tok, stop="ab", max_tokens=50, min_tokens=n)
    stream(late, ids)
    assert late.finish_reason == "stop" and late.text == "ab "
    assert len(late.output_ids) == n


def test_include_stop_str_in_output_keeps_the_stop_string_and_what_came_before(tok):
    """vLLM's ``include_stop_str_in_output``: the text ends with the stop string that ended it
    (the earliest one), nothing after it; streamed, the deltas add up to the same."""
    req = make_request(tok, stop=["world", "lo"], max_tokens=100, include_stop_str_in_output=True)
    deltas = stream(req, tok.encode("hello world and more"))
    assert req.finish_reason == "stop"
    assert req.text == "hello" == "".join(deltas)
    req = make_request(tok, stop="TO", max_tokens=100, include_stop_str_in_output=True)
    stream(req, tok.encode("go STOP"))
    assert req.text == "go STO"


def test_skip_special_tokens_false_keeps_special_tokens_in_the_text(tok):
    ids = [*tok.encode("hi"), tid(tok, "<|im_end|>"), *tok.encode(" there")]
    kept = make_request(tok, max_tokens=len(ids), skip_special_tokens=False, ignore_eos=True)
    assert "".join(stream(kept, ids)) == kept.text == "hi<|im_end|> there"
    skipped = make_request(tok, max_tokens=len(ids), ignore_eos=True)
    assert "".join(stream(skipped, ids)) == skipped.text == "hi there"
