"""vLLM's tokenizer routes on the default model: /tokenize counts what a completion's prompt
counts (text or chat, rendered by the same template), /detokenize gives the text back, and
/tokenizer_info names the special tokens a client needs (lm-eval reads them)."""

from __future__ import annotations

import httpx

from tests.conftest import requires_default_model

pytestmark = requires_default_model

CHAT = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Hi there"}]


def test_a_prompts_tokens_are_the_ones_a_completion_counts_and_come_back_as_its_text(server):
    text = "The quick brown fox jumps over the lazy dog."
    t = server.post("/tokenize", json={"prompt": text, "return_token_strs": True}).json()
    done = server.post("/v1/completions", json={"prompt": text, "max_tokens": 1}).json()
    assert t["count"] == len(t["tokens"]) == done["usage"]["prompt_tokens"]
    assert t["max_model_len"] > t["count"] and len(t["token_strs"]) == t["count"]
    assert server.post("/detokenize", json={"tokens": t["tokens"]}).json() == {"prompt": text}
    # the ids are the prompt: the same completion from them as from the text
    by_ids = server.post(
        "/v1/completions", json={"prompt": t["tokens"], "max_tokens": 4, "temperature": 0}
    ).json()
    by_text = server.post(
        "/v1/completions", json={"prompt": text, "max_tokens": 4, "temperature": 0}
    ).json()
    assert by_ids["choices"][0]["text"] == by_text["choices"][0]["text"]


def test_a_chats_tokens_are_its_rendered_prompt_with_or_without_the_generation_prompt(server):
    t = server.post("/tokenize", json={"messages": CHAT}).json()
    done = server.post("/v1/chat/completions", json={"messages": CHAT, "max_tokens": 1}).json()
    assert t["count"] == done["usage"]["prompt_tokens"]
    bare = server.post("/tokenize", json={"messages": CHAT, "add_generation_prompt": False})
    assert bare.json()["tokens"] == t["tokens"][: bare.json()["count"]]
    assert bare.json()["count"] < t["count"]


def test_tokenizer_info_names_the_special_tokens_as_the_vocabulary_has_them(server):
    info = server.get("/tokenizer_info").json()
    assert info["chat_template"] and info["model_max_length"] > 0
    eos = info["eos_token"]
    ids = server.post("/tokenize", json={"prompt": eos, "add_special_tokens": False}).json()
    assert ids["count"] == 1  # one token, the special one, not its characters
    assert server.post("/detokenize", json={"tokens": ids["tokens"]}).json()["prompt"] == eos


def test_the_api_key_guards_the_tokenizer_routes_as_it_guards_the_api(served):
    for method, path in (
        ("POST", "/tokenize"),
        ("POST", "/detokenize"),
        ("GET", "/tokenizer_info"),
    ):
        r = httpx.request(method, served.base + path, json={"prompt": "hi"}, timeout=60)
        assert r.status_code == 401, (path, r.text)


def test_a_chat_whose_history_call_holds_no_json_object_is_a_400_naming_it(server):
    """An earlier turn's tool call whose arguments are not a JSON object is the client's
    mistake on /tokenize as on the chat route (the fuzzer found a 500 here)."""
    call = {"id": "c", "type": "function", "function": {"name": "f", "arguments": "5"}}
    messages = [{"role": "assistant", "content": "x", "tool_calls": [call]}]
    r = server.post("/tokenize", json={"messages": messages})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == "messages.0.tool_calls.0.function.arguments"
