"""vLLM's chat extensions against `engine serve`, each changing the prompt or the answer as vLLM's
server does: ``continue_final_message`` (the last assistant message is continued: the prompt ends
with its text, no end of turn), ``echo`` (that message's text comes first in the answer),
``return_tokens_as_token_ids`` (logprobs' tokens written ``token_id:N``, chat and completions),
``prompt_logprobs`` (each prompt token's logprob after the first, chat and completions),
``/tokenize`` with ``tools`` (the prompt a chat with those tools runs) and
``chat_template_kwargs`` (variables the template reads: a tiny model whose template prints one)."""

from __future__ import annotations

import json
import re

import httpx
import pytest

from tests.conftest import requires_default_model
from tests.e2e.server_proc import ServerProc

PARTIAL = "The capital of France is"
CONTINUED = [
    {"role": "user", "content": "What is the capital of France?"},
    {"role": "assistant", "content": PARTIAL},
]
GREEDY = {"temperature": 0, "max_tokens": 8}
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "The weather in a city",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}},
                "required": ["city"],
            },
        },
    }
]


def tokens(server, **body) -> list[int]:
    r = server.post("/tokenize", json=body)
    assert r.status_code == 200, r.text
    return r.json()["tokens"]


def text_of(server, ids: list[int]) -> str:
    return server.post("/detokenize", json={"tokens": ids}).json()["prompt"]


def chat(server, **body) -> dict:
    r = server.post("/v1/chat/completions", json=body)
    assert r.status_code == 200, r.text
    return r.json()


@requires_default_model
def test_continue_final_message_ends_the_prompt_with_the_partial_answer(server):
    cont = tokens(
        server, messages=CONTINUED, continue_final_message=True, add_generation_prompt=False
    )
    closed = tokens(server, messages=CONTINUED, add_generation_prompt=False)
    assert text_of(server, cont).endswith("<|im_start|>assistant\n" + PARTIAL)
    assert text_of(server, closed).endswith(PARTIAL + "<|im_end|>\n")
    assert cont == closed[: len(cont)] and len(closed) > len(cont)
    body = chat(
        server,
        messages=CONTINUED,
        continue_final_message=True,
        add_generation_prompt=False,
        **GREEDY,
    )
    assert body["usage"]["prompt_tokens"] == len(cont)
    # the answer goes on from the partial text: it does not start a new turn or repeat it
    assert not body["choices"][0]["message"]["content"].startswith(PARTIAL)


@requires_default_model
def test_echo_puts_the_last_assistant_message_first_whole_and_streamed(server):
    kw = {"continue_final_message": True, "add_generation_prompt": False, **GREEDY}
    plain = chat(server, messages=CONTINUED, **kw)["choices"][0]["message"]["content"]
    echoed = chat(server, messages=CONTINUED, echo=True, **kw)["choices"][0]["message"]["content"]
    assert echoed == PARTIAL + plain
    with server.stream(
        "POST",
        "/v1/chat/completions",
        json={"messages": CONTINUED, "echo": True, "stream": True, **kw},
    ) as r:
        lines = [x[6:] for x in r.iter_lines() if x.startswith("data: {")]
    deltas = [json.loads(x)["choices"][0]["delta"].get("content") or "" for x in lines]
    assert deltas[0] == PARTIAL and "".join(deltas) == echoed
    # the last message a user's: nothing to echo, as vLLM has it
    asked = [CONTINUED[0]]
    assert (
        chat(server, messages=asked, echo=True, **GREEDY)["choices"][0]["message"]["content"]
        == chat(server, messages=asked, **GREEDY)["choices"][0]["message"]["content"]
    )


@requires_default_model
def test_tokens_as_token_ids_name_the_ids_chat_and_completions(server):
    kw = {"messages": CONTINUED[:1], "logprobs": True, "top_logprobs": 2, **GREEDY}
    shown = chat(server, **kw)["choices"][0]["logprobs"]["content"]
    as_ids = chat(server, return_tokens_as_token_ids=True, **kw)["choices"][0]["logprobs"][
        "content"
    ]
    assert len(as_ids) == len(shown)
    for a, b in zip(as_ids, shown):
        assert re.fullmatch(r"token_id:\d+", a["token"]), a
        assert text_of(server, [int(a["token"][9:])]) == b["token"] and a["logprob"] == b["logprob"]
        assert [
            re.fullmatch(r"token_id:(\d+)", t["token"]) is not None for t in a["top_logprobs"]
        ] == [True, True]
    body = {"prompt": "The cat sat on the", "logprobs": 2, **GREEDY}
    plain = server.post("/v1/completions", json=body).json()["choices"][0]
    ids = server.post("/v1/completions", json={**body, "return_tokens_as_token_ids": True}).json()
    choice = ids["choices"][0]
    assert choice["text"] == plain["text"]
    got = [int(t[9:]) for t in choice["logprobs"]["tokens"]]
    assert all(re.fullmatch(r"token_id:\d+", t) for t in choice["logprobs"]["tokens"])
    assert text_of(server, got) == plain["text"]
    assert all(
        re.fullmatch(r"token_id:\d+", k) for top in choice["logprobs"]["top_logprobs"] for k in top
    )


@requires_default_model
def test_prompt_logprobs_score_every_prompt_token_after_the_first(server):
    prompt = "The cat sat on the mat."
    ids = tokens(server, prompt=prompt)
    body = server.post(
        "/v1/completions", json={"prompt": prompt, "prompt_logprobs": 2, **GREEDY}
    ).json()
    scored = body["choices"][0]["prompt_logprobs"]
    assert len(scored) == len(ids) == body["usage"]["prompt_tokens"] and scored[0] is None
    # the same numbers echo and logprobs give the prompt's tokens
    echoed = server.post(
        "/v1/completions", json={"prompt": prompt, "echo": True, "logprobs": 0, **GREEDY}
    ).json()["choices"][0]["logprobs"]["token_logprobs"]
    for k, (tid, entry) in enumerate(zip(ids[1:], scored[1:]), start=1):
        assert str(tid) in entry and len(entry) <= 3
        assert entry[str(tid)]["logprob"] == pytest.approx(echoed[k], abs=1e-4)
        assert entry[str(tid)]["decoded_token"] == text_of(server, [tid])
        assert {1, 2} <= {v["rank"] for v in entry.values()}  # the two most likely
        rank = entry[str(tid)]["rank"]  # the prompt token's place among all tokens
        assert isinstance(rank, int) and rank >= 1 and (rank <= 2) == (len(entry) == 2)
    c = chat(server, messages=CONTINUED[:1], prompt_logprobs=0, **GREEDY)
    assert (
        len(c["prompt_logprobs"]) == c["usage"]["prompt_tokens"] and c["prompt_logprobs"][0] is None
    )
    assert all(len(e) == 1 for e in c["prompt_logprobs"][1:])
    assert "prompt_logprobs" not in chat(server, messages=CONTINUED[:1], **GREEDY)


@requires_default_model
def test_tokenize_with_tools_is_the_prompt_of_the_chat_with_them(server):
    asked = CONTINUED[:1]
    with_tools = tokens(server, messages=asked, tools=TOOLS)
    assert len(with_tools) > len(tokens(server, messages=asked)) + 20
    assert '"get_weather"' in text_of(server, with_tools)  # the generic format's description
    body = chat(server, messages=asked, tools=TOOLS, **GREEDY)
    assert body["usage"]["prompt_tokens"] == len(with_tools)


TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if greeting is defined %}greeting={{ greeting }}\n{% endif %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from tests.tiny_model import make_tiny_model

    folder = make_tiny_model(tmp_path_factory.mktemp("tiny-template"))
    (folder / "chat_template.jinja").write_text(TEMPLATE)
    srv = ServerProc(tmp_path_factory.mktemp("tiny-log") / "boot.jsonl", "--model", str(folder))
    with httpx.Client(base_url=srv.base, timeout=60) as client:
        yield client
    srv.stop()


def test_chat_template_kwargs_reach_the_template(tiny):
    asked = [{"role": "user", "content": "hi"}]
    kw = {"greeting": "ahoy"}
    given = tokens(tiny, messages=asked, chat_template_kwargs=kw)
    assert "greeting=ahoy" in text_of(tiny, given)
    assert "greeting" not in text_of(tiny, tokens(tiny, messages=asked))
    body = chat(tiny, messages=asked, chat_template_kwargs=kw, max_tokens=2)
    assert body["usage"]["prompt_tokens"] == len(given)
