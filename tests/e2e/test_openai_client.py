"""The official `openai` client, sync and async, streaming and not, against `engine serve`:
greedy answers equal the offline API's for the same prompt."""

from __future__ import annotations

import asyncio

import pytest

from tests.conftest import requires_default_model
from tests.e2e.conftest import API_KEY

openai = pytest.importorskip("openai")
pytestmark = requires_default_model

CHAT = [{"role": "user", "content": "What is the capital of France?"}]
PROMPTS = ["The first three planets are", "def fibonacci(n):", "Once upon a time"]


@pytest.fixture(scope="module")
def offline():
    """What the offline API answers, greedy, for the same inputs (same engine, same weights)."""
    from engine import LLM, SamplingParams

    llm = LLM(kv_tokens=4096)
    p = SamplingParams(max_tokens=16, temperature=0)
    chat = llm.chat(CHAT, p)[0]
    texts = [o.text for o in llm.generate(PROMPTS, p)]
    llm.close()
    return chat.text, texts, len(chat.token_ids)


@pytest.fixture(scope="module")
def client(served):
    with openai.OpenAI(base_url=served.base + "/v1", api_key=API_KEY) as c:
        yield c


def test_sync_chat_equals_the_offline_api(client, offline):
    r = client.chat.completions.create(model="smol", messages=CHAT, max_tokens=16, temperature=0)
    assert r.choices[0].message.content == offline[0]
    assert r.usage.completion_tokens == offline[2] and r.usage.prompt_tokens > 0
    assert r.usage.prompt_tokens_details.cached_tokens >= 0


def test_sync_streaming_chat_with_content_parts_equals_the_offline_api(client, offline):
    parts = [{"role": "user", "content": [{"type": "text", "text": CHAT[0]["content"]}]}]
    stream = client.chat.completions.create(
        model="smol",
        messages=parts,
        max_completion_tokens=16,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == offline[0]
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == offline[2]


def test_async_completions_streaming_and_not_equal_the_offline_api(served, offline):
    async def main():
        async with openai.AsyncOpenAI(base_url=served.base + "/v1", api_key=API_KEY) as c:

            async def plain(p):
                r = await c.completions.create(model="smol", prompt=p, max_tokens=16, temperature=0)
                return r.choices[0].text

            async def streamed(p):
                s = await c.completions.create(
                    model="smol", prompt=p, max_tokens=16, temperature=0, stream=True
                )
                return "".join([ch.choices[0].text async for ch in s if ch.choices])

            return await asyncio.gather(
                *(plain(p) for p in PROMPTS), *(streamed(p) for p in PROMPTS)
            )

    got = asyncio.run(main())
    assert got == offline[1] + offline[1]


def test_client_errors_arrive_as_the_clients_own_exceptions(client):
    with pytest.raises(openai.NotFoundError, match="does not exist"):
        client.completions.create(model="gpt-9", prompt="hi", max_tokens=2)
    with pytest.raises(openai.BadRequestError, match="temperature"):
        client.completions.create(model="smol", prompt="hi", max_tokens=2, temperature=-1)
    bad = openai.OpenAI(base_url=str(client.base_url), api_key="wrong")
    with pytest.raises(openai.AuthenticationError):
        bad.models.list()


def test_each_request_names_its_api_in_its_received_receipt(client, served):
    import orjson

    chat = client.chat.completions.create(model="smol", messages=CHAT, max_tokens=1)
    text = client.completions.create(model="smol", prompt=PROMPTS[0], max_tokens=1)
    lines = served.log_file.read_bytes().splitlines()
    received = [orjson.loads(x) for x in lines if b'"request.received"' in x]
    api = {r["rid"]: r.get("api") for r in received}
    assert api[chat.id] == "chat.completions" and api[text.id] == "completions"
