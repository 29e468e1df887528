"""Structured output against `engine serve` on the default model: `response_format` json_schema
and json_object, vLLM's `structured_outputs`, streaming and n > 1, through the official openai
client (its pydantic `parse` unmodified); the answers validate against their schemas
(`jsonschema`), and each request's grammar is in the boot log (`grammar.compile`, a hit the
second time; `request.finish` says `constrained`)."""

from __future__ import annotations

import json

import jsonschema
import orjson
import pytest

from tests.conftest import requires_default_model
from tests.e2e.conftest import API_KEY
from tests.e2e.schemas import SCHEMAS

openai = pytest.importorskip("openai")
pydantic = pytest.importorskip("pydantic")
pytestmark = requires_default_model


@pytest.fixture(scope="module")
def client(served):
    with openai.OpenAI(base_url=served.base + "/v1", api_key=API_KEY, timeout=600) as c:
        yield c


def receipts(served, kind: str) -> list[dict]:
    lines = served.log_file.read_bytes().splitlines()
    return [r for r in map(orjson.loads, lines) if r["event"] == kind]


def ask(client, prompt: str, schema: dict, **extra) -> list[str]:
    r = client.chat.completions.create(
        model="smol",
        messages=[{"role": "user", "content": prompt}],
        temperature=0,
        max_tokens=300,
        response_format={
            "type": "json_schema",
            "json_schema": {"name": "answer", "schema": schema, "strict": True},
        },
        **extra,
    )
    for choice in r.choices:
        assert choice.finish_reason == "stop", choice  # the grammar ended it
    return [c.message.content for c in r.choices]


@pytest.mark.parametrize("i", [0, 10, 14])
def test_json_schema_answers_validate(client, served, i):
    prompt, schema = SCHEMAS[i]
    for text in ask(client, prompt, schema):
        jsonschema.validate(json.loads(text), schema)


@pytest.mark.slow
def test_twenty_held_out_schemas_all_validate(client):
    valid = 0
    for prompt, schema in SCHEMAS:
        [text] = ask(client, prompt, schema)
        jsonschema.validate(json.loads(text), schema)
        valid += 1
    assert valid == 20


def test_the_openai_clients_pydantic_parse_works_unmodified(client, served):
    class City(pydantic.BaseModel):  # bounded: a small greedy model may repeat a digit forever
        name: str = pydantic.Field(max_length=30)
        country: str = pydantic.Field(max_length=30)
        population: int = pydantic.Field(ge=0, le=100_000_000)

    r = client.chat.completions.parse(
        model="smol",
        temperature=0,
        max_tokens=200,
        response_format=City,
        messages=[{"role": "user", "content": "Describe Paris as JSON."}],
    )
    city = r.choices[0].message.parsed
    assert isinstance(city, City) and city.name
    before = receipts(served, "grammar.compile")
    client.chat.completions.parse(
        model="smol",
        temperature=0,
        max_tokens=200,
        response_format=City,
        messages=[{"role": "user", "content": "Describe Rome as JSON."}],
    )
    [again] = receipts(served, "grammar.compile")[len(before) :]
    assert (again["cache"], again["outcome"], again["kind"]) == ("hit", "ok", "json_schema")
    assert again["guide"] == before[-1]["guide"]


def test_json_object_streamed_with_two_choices(client, served):
    stream = client.chat.completions.create(
        model="smol",
        messages=[{"role": "user", "content": "Give me a JSON object."}],
        response_format={"type": "json_object"},
        max_tokens=120,
        n=2,
        seed=7,
        stream=True,
    )
    texts, ends = ["", ""], [None, None]
    for chunk in stream:
        for c in chunk.choices:
            texts[c.index] += c.delta.content or ""
            ends[c.index] = c.finish_reason or ends[c.index]
    for text, end in zip(texts, ends):
        assert text.startswith("{")
        if end == "stop":  # max_tokens may cut a JSON short: then it says length
            assert isinstance(json.loads(text), dict)
    finished = [r for r in receipts(served, "request.finish") if r.get("constrained")]
    assert finished and finished[-1]["constrained"] == "json_object"


def test_vllms_structured_outputs_regex_and_choice(client):
    r = client.completions.create(
        model="smol",
        prompt="The date today is",
        max_tokens=20,
        temperature=0,
        extra_body={"structured_outputs": {"regex": r" [0-9]{4}-[0-9]{2}-[0-9]{2}"}},
    )
    text = r.choices[0].text
    assert len(text) == 11 and text[5] == "-" and text[1:5].isdigit(), text
    r = client.completions.create(
        model="smol",
        prompt="Is the sky blue? Answer:",
        max_tokens=5,
        temperature=0,
        extra_body={"structured_outputs": {"choice": [" yes", " no"]}},
    )
    assert r.choices[0].text in (" yes", " no")
