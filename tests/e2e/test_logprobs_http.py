"""Logprobs over HTTP with the official openai client, on a tiny model: a chat's
``logprobs.content`` and a completion's ``logprobs``, streamed and not, carry the values the
offline engine computes for the same greedy run; the tokens' texts make the answer's text."""

from __future__ import annotations

import pytest

from engine import LLM, SamplingParams
from tests.e2e.server_proc import ServerProc

openai = pytest.importorskip("openai")
PROMPT = "The quick brown fox"
GREEDY = {"max_tokens": 6, "temperature": 0, "extra_body": {"ignore_eos": True}}


@pytest.fixture(scope="module")
def client(tiny_model_dir, tmp_path_factory):
    log = tmp_path_factory.mktemp("logprobs") / "boot.jsonl"
    srv = ServerProc(
        log, "--model", tiny_model_dir, "--kv-tokens", "512", "--served-model-name", "m"
    )
    with openai.OpenAI(base_url=srv.base + "/v1", api_key="unused", timeout=300) as c:
        yield c
    srv.stop()


@pytest.fixture(scope="module")
def offline(tiny_model_dir):
    llm = LLM(model=tiny_model_dir, kv_tokens=512)
    p = SamplingParams(max_tokens=6, temperature=0, ignore_eos=True, logprobs=2)
    chat = llm.chat([{"role": "user", "content": PROMPT}], p)[0]
    text = llm.generate(PROMPT, p)[0]
    llm.close()
    return chat, text


def test_chat_logprobs_are_the_engines(client, offline):
    r = client.chat.completions.create(
        model="m", messages=[{"role": "user", "content": PROMPT}], logprobs=True,
        top_logprobs=2, **GREEDY,
    )  # fmt: skip
    content = r.choices[0].logprobs.content
    assert len(content) == 6
    for got, (_, lp, top) in zip(content, offline[0].logprobs):
        assert got.logprob == pytest.approx(lp, abs=1e-5)
        assert [t.logprob for t in got.top_logprobs] == pytest.approx([v for _, v in top], abs=1e-5)
        assert got.top_logprobs[0].token == got.token  # greedy: the most likely
        assert bytes(got.bytes).decode() == got.token


def test_completion_logprobs_streamed_and_not(client, offline):
    whole = client.completions.create(model="m", prompt=PROMPT, logprobs=2, **GREEDY)
    lp = whole.choices[0].logprobs
    assert lp.token_logprobs == pytest.approx([v for _, v, _ in offline[1].logprobs], abs=1e-5)
    assert lp.text_offset[0] == 0 and len(lp.tokens) == 6
    assert all(len(m) <= 2 for m in lp.top_logprobs)
    stream = client.completions.create(model="m", prompt=PROMPT, logprobs=2, stream=True, **GREEDY)
    tokens, offsets = [], []
    for chunk in stream:
        if chunk.choices and chunk.choices[0].logprobs:
            tokens += chunk.choices[0].logprobs.tokens
            offsets += chunk.choices[0].logprobs.text_offset
    assert tokens == lp.tokens and offsets == lp.text_offset
