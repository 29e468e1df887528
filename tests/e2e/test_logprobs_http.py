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
    scored = llm.generate(
        PROMPT,
        SamplingParams(max_tokens=1, temperature=0, ignore_eos=True, logprobs=1, prompt_logprobs=1),
    )[0]
    llm.close()
    return chat, text, scored


def test_chat_logprobs_are_the_engines(client, offline):
    r = client.chat.completions.create(
        model="m",
        messages=[{"role": "user", "content": PROMPT}],
        logprobs=True,
        top_logprobs=2,
        **GREEDY,
    )
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


@pytest.mark.parametrize("stream", [False, True])
def test_an_echoed_completion_scores_its_prompt_as_evaluation_harnesses_ask(
    client, offline, stream
):
    """lm-eval's log-likelihood request: echo, logprobs 1, max_tokens 1, temperature 0. The
    choice's logprobs cover the prompt's tokens (the first without one) and the new token, with
    the values the offline engine gives; offsets count from the prompt's first token."""
    scored = offline[2]
    ask = {
        "model": "m",
        "prompt": PROMPT,
        "echo": True,
        "logprobs": 1,
        "max_tokens": 1,
        "temperature": 0,
        "extra_body": {"ignore_eos": True},
    }
    if stream:
        lp = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
        text = ""
        for chunk in client.completions.create(**ask, stream=True):
            for c in chunk.choices:
                text += c.text
                for k in lp:
                    lp[k] += getattr(c.logprobs, k) if c.logprobs else []
    else:
        c = client.completions.create(**ask).choices[0]
        text, lp = c.text, c.logprobs.model_dump()
    n = len(scored.prompt_token_ids)
    assert len(lp["tokens"]) == n + 1 and lp["token_logprobs"][0] is None
    expected = [v for _, v, _ in scored.prompt_logprobs] + [v for _, v, _ in scored.logprobs]
    assert lp["token_logprobs"][1:] == pytest.approx(expected, abs=1e-5)
    assert lp["top_logprobs"][0] is None and all(len(t) == 1 for t in lp["top_logprobs"][1:])
    assert lp["text_offset"][0] == 0 and text.startswith(PROMPT)
    assert "".join(lp["tokens"]) == text
