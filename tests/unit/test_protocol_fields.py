"""What the HTTP layer accepts, refuses and translates: unbuilt OpenAI fields are refused unless
they ask for nothing, unknown fields are refused, and every refusal names the field."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from engine.server.errors import ProtocolError, error_body, validation_error
from engine.server.protocol import (
    ChatCompletionRequest,
    CompletionRequest,
    ModelLimits,
    refuse_unbuilt,
    sampling_params,
)

LIMITS = ModelLimits(max_context=100, kv_tokens=1000, vocab_size=50, token_chars=4)
CHAT = {"messages": [{"role": "user", "content": "hi"}]}


@pytest.mark.parametrize(
    ("extra", "param", "words"),
    [
        ({"functions": [{"name": "f"}]}, "functions", "function calling"),
        ({"function_call": "auto"}, "function_call", "calls no functions"),
        ({"suffix": "end"}, "suffix", "insertion"),
        ({"best_of": 3}, "best_of", "equal to n"),
        ({"best_of": 2, "n": 3}, "best_of", "equal to n"),
        ({"modalities": ["text", "audio"]}, "modalities", "text only"),
        ({"audio": {"voice": "x"}}, "audio", "not supported"),
        ({"use_beam_search": True}, "use_beam_search", "not a supported request field"),
        ({"frobnicate": True}, "frobnicate", "not a supported request field"),
    ],
)
def test_a_field_that_asks_for_what_is_not_built_is_refused_by_name(extra, param, words):
    with pytest.raises(ProtocolError) as e:
        refuse_unbuilt({**CHAT, **extra}, ChatCompletionRequest)
    assert e.value.param == param and e.value.status == 400
    assert str(e.value).startswith(param) and words in str(e.value)


@pytest.mark.parametrize(
    "extra",
    [
        {"functions": None},
        {"best_of": 1},
        {"best_of": 2, "n": 2},
        {"suffix": ""},
        {"metadata": {"k": "v"}},
        {"store": False},
        {"modalities": ["text"]},
    ],
)
def test_a_field_that_asks_for_nothing_is_accepted_and_dropped(extra):
    kept = refuse_unbuilt({**CHAT, **extra}, ChatCompletionRequest)
    assert set(kept) == set(CHAT) | ({"n"} & set(extra))
    ChatCompletionRequest.model_validate(kept)


@pytest.mark.parametrize(
    "extra",
    [
        {"tools": [{"type": "function", "function": {"name": "f"}}]},
        {"tool_choice": "auto"},
    ],
)
def test_tools_are_a_chat_field_refused_on_completions_by_name(extra):
    (param,) = extra
    with pytest.raises(ProtocolError) as e:
        refuse_unbuilt({"prompt": "hi", **extra}, CompletionRequest)
    assert e.value.param == param and "/v1/chat/completions" in str(e.value)


@pytest.mark.parametrize(
    "extra", [{"tools": []}, {"tool_choice": "none"}, {"parallel_tool_calls": True}]
)
def test_tools_asking_for_nothing_are_dropped_from_a_completion(extra):
    assert refuse_unbuilt({"prompt": "hi", **extra}, CompletionRequest) == {"prompt": "hi"}


def _error(model, body) -> ProtocolError:
    try:
        model.model_validate(body)
    except ValidationError as e:
        return validation_error(model, e)
    raise AssertionError(f"{body} validated")


@pytest.mark.parametrize(
    ("model", "body", "param", "words"),
    [
        (
            ChatCompletionRequest,
            {"messages": [{"role": "tool", "content": "x"}]},
            "messages.0",
            "has a tool_call_id",
        ),
        (
            ChatCompletionRequest,
            {
                "messages": [
                    {
                        "role": "user",
                        "content": "x",
                        "tool_calls": [
                            {
                                "id": "c",
                                "type": "function",
                                "function": {"name": "f", "arguments": "{}"},
                            }
                        ],
                    }
                ]
            },
            "messages.0",
            "belong to an assistant",
        ),
        (
            ChatCompletionRequest,
            {
                "messages": [
                    {
                        "role": "assistant",
                        "tool_calls": [{"id": "c", "type": "function", "function": {"name": "f"}}],
                    }
                ]
            },
            "messages.0.tool_calls.0.function.arguments",
            "Field required",
        ),
        (
            ChatCompletionRequest,
            {"messages": [{"role": "user", "content": "x"}], "tool_choice": "sometimes"},
            "tool_choice",
            "'auto'",
        ),
        (
            ChatCompletionRequest,
            {
                "messages": [{"role": "user", "content": "x"}],
                "tools": [{"type": "function", "function": {"name": "a b"}}],
            },
            "tools.0.function.name",
            "pattern",
        ),
        (
            ChatCompletionRequest,
            {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]},
            "messages.0.content.0.type",
            "'text'",
        ),
        (
            CompletionRequest,
            {"prompt": "x", "seed": 2**64 - 1},
            "seed",
            "less than or equal to 9223372036854775807 (got 18446744073709551615)",
        ),
        (
            CompletionRequest,
            {"prompt": "x", "stop": ["a", "b", "c", "d", "e"]},
            "stop",
            "at most 4",
        ),
        (CompletionRequest, {"prompt": "x", "stop": 5}, "stop", "valid"),
        (CompletionRequest, {"prompt": "x", "stop": [""]}, "stop.0", "at least 1"),
        (CompletionRequest, {"prompt": "x", "n": 17}, "n", "less than or equal to 16"),
        (
            CompletionRequest,
            {"prompt": "x", "presence_penalty": 2.5},
            "presence_penalty",
            "less than or equal to 2",
        ),
        (CompletionRequest, {"prompt": "x", "logit_bias": {"a": 1}}, "logit_bias", "pattern"),
        (
            CompletionRequest,
            {"prompt": "x", "logit_bias": {"5": 101}},
            "logit_bias",
            "less than or equal to 100",
        ),
        (CompletionRequest, {"prompt": "x", "max_tokens": -3}, "max_tokens", "(got -3)"),
        (
            CompletionRequest,
            {"prompt": "x", "stream_options": {"x": 1}},
            "stream_options.x",
            "not supported",
        ),
    ],
)
def test_a_schema_fault_names_the_deepest_field_and_the_value(model, body, param, words):
    e = _error(model, body)
    assert e.param == param and words in str(e), str(e)


def test_null_means_the_default_for_the_fields_clients_send_as_null():
    req = CompletionRequest.model_validate(
        {"prompt": "x", "temperature": None, "n": None, "top_p": None, "stream": None}
    )
    assert (req.temperature, req.n, req.top_p, req.stream) == (1.0, 1, 1.0, False)


def _params(body, prompt_len=10, model=CompletionRequest):
    return sampling_params(model.model_validate(body), prompt_len, LIMITS, 16)


def test_penalties_bias_and_seed_reach_the_sampler():
    p = _params(
        {
            "prompt": "x",
            "presence_penalty": 0.5,
            "frequency_penalty": -1,
            "logit_bias": {"7": -100, "3": 2.5},
            "seed": -5,
        }
    )
    assert (p.presence_penalty, p.frequency_penalty, p.seed) == (0.5, -1, -5)
    assert p.logit_bias == {7: -100, 3: 2.5}
    # leading zeros do not make a key long: it is the id it spells
    assert _params({"prompt": "x", "logit_bias": {"0" * 5000 + "7": 1}}).logit_bias == {7: 1}


def test_vllms_output_fields_reach_the_request():
    p = _params({"prompt": "x", "include_stop_str_in_output": True, "skip_special_tokens": False})
    assert (p.include_stop_str_in_output, p.skip_special_tokens) == (True, False)
    p = _params({"messages": [{"role": "user", "content": "x"}]}, model=ChatCompletionRequest)
    assert (p.include_stop_str_in_output, p.skip_special_tokens) == (False, True)
    err = _parse(CompletionRequest, {"prompt": "x", "skip_special_tokens": "no"})
    assert isinstance(err, ProtocolError) and err.param == "skip_special_tokens"
    assert p.spaces_between_special_tokens is True
    p = _params(
        {"prompt": "x", "skip_special_tokens": False, "spaces_between_special_tokens": False}
    )
    assert (p.skip_special_tokens, p.spaces_between_special_tokens) == (False, False)
    assert _params({"prompt": "x", "repetition_penalty": 1.3}).repetition_penalty == 1.3
    for bad in (0, -1.5, "2", 1e-300, 1e6):
        err = _parse(CompletionRequest, {"prompt": "x", "repetition_penalty": bad})
        assert isinstance(err, ProtocolError) and err.param == "repetition_penalty", bad


@pytest.mark.parametrize(
    ("body", "param", "words"),
    [
        ({"prompt": "x", "stop_token_ids": [50]}, "stop_token_ids", "token id 50 is outside"),
        ({"prompt": "x", "logit_bias": {"99": 1}}, "logit_bias", "token id 99 is outside"),
        # more digits than Python reads into an int (4,300): a 400, never int()'s ValueError
        (
            {"prompt": "x", "logit_bias": {"9" * 5000: 1}},
            "logit_bias",
            "a key of 5000 digits is not a token id of the vocabulary (0..49)",
        ),
        (
            {"prompt": "x", "logit_bias": {"1" + "0" * 20: 1}},
            "logit_bias",
            "a key of 21 digits is not a token id",
        ),
        ({"prompt": "x", "max_tokens": 91}, "max_tokens", "context limit of 100"),
        ({"prompt": "x", "min_tokens": 20, "max_tokens": 5}, "min_tokens", "max_tokens=5"),
    ],
)
def test_a_request_refused_before_submission_names_the_field(body, param, words):
    with pytest.raises(ProtocolError) as e:
        _params(body)
    assert e.value.param == param and words in str(e.value), str(e.value)


def test_the_pool_bounds_max_tokens_before_anything_runs():
    small = ModelLimits(max_context=8192, kv_tokens=1024, vocab_size=50, token_chars=4)
    body = CompletionRequest.model_validate({"prompt": "x", "max_tokens": 100})
    with pytest.raises(ProtocolError) as e:
        sampling_params(body, 1000, small, 16)
    assert e.value.param == "max_tokens" and "KV pool of 1024 tokens" in str(e.value)
    assert sampling_params(body, 924, small, 16).max_tokens == 100  # exactly fits


@pytest.mark.parametrize(
    ("status", "kind"),
    [
        (400, "invalid_request_error"),
        (404, "not_found_error"),
        (405, "invalid_request_error"),
        (408, "timeout_error"),
        (429, "rate_limit_error"),
        (503, "server_error"),
        (504, "timeout_error"),
    ],
)
def test_every_error_is_the_openai_error_object(status, kind):
    assert error_body("m", status, "p") == {
        "error": {"message": "m", "type": kind, "param": "p", "code": status}
    }


def _parse(model, body) -> ProtocolError | object:
    """The body as ``service.parse`` reads it: unbuilt fields, then the schema."""
    try:
        return model.model_validate(refuse_unbuilt(body, model))
    except ValidationError as e:
        return validation_error(model, e)
    except ProtocolError as e:
        return e


PROMPT = {"prompt": "x"}


@pytest.mark.parametrize(
    ("model", "extra", "param", "words"),
    [
        (CompletionRequest, {"seed": "1"}, "seed", "valid integer"),
        (CompletionRequest, {"seed": True}, "seed", "valid integer"),
        (CompletionRequest, {"seed": 1.0}, "seed", "valid integer"),
        (CompletionRequest, {"max_tokens": "3"}, "max_tokens", "valid integer"),
        (CompletionRequest, {"max_tokens": 1.0}, "max_tokens", "valid integer"),
        (CompletionRequest, {"n": True}, "n", "valid integer"),
        (CompletionRequest, {"n": "2"}, "n", "valid integer"),
        (CompletionRequest, {"top_k": 1.5}, "top_k", "valid integer"),
        (CompletionRequest, {"top_k": "4"}, "top_k", "valid integer"),
        (CompletionRequest, {"min_tokens": "2"}, "min_tokens", "valid integer"),
        (CompletionRequest, {"stream": "true"}, "stream", "valid boolean"),
        (CompletionRequest, {"stream": 1}, "stream", "valid boolean"),
        (CompletionRequest, {"echo": 1}, "echo", "valid boolean"),
        (CompletionRequest, {"ignore_eos": "no"}, "ignore_eos", "valid boolean"),
        (
            CompletionRequest,
            {"stream_options": {"include_usage": "yes"}},
            "stream_options.include_usage",
            "valid boolean",
        ),
        (
            CompletionRequest,
            {"stream_options": {"include_usage": 1}},
            "stream_options.include_usage",
            "valid boolean",
        ),
        (CompletionRequest, {"prompt": [1, True]}, "prompt.1", "valid integer"),
        (CompletionRequest, {"stop_token_ids": [2.0]}, "stop_token_ids.0", "valid integer"),
        (CompletionRequest, {"temperature": True}, "temperature", "valid number"),
        (CompletionRequest, {"logprobs": False}, "logprobs", "valid integer"),
        (CompletionRequest, {"logprobs": "0"}, "logprobs", "valid integer"),
        (CompletionRequest, {"top_logprobs": 0.0}, "top_logprobs", "valid integer"),
        (CompletionRequest, {"top_logprobs": False}, "top_logprobs", "valid integer"),
        (CompletionRequest, {"best_of": 1.0}, "best_of", "valid integer"),
        (CompletionRequest, {"best_of": True}, "best_of", "valid integer"),
        (
            ChatCompletionRequest,
            {"max_completion_tokens": "5"},
            "max_completion_tokens",
            "valid integer",
        ),
        (
            ChatCompletionRequest,
            {"max_completion_tokens": 5.0},
            "max_completion_tokens",
            "valid integer",
        ),
        (
            ChatCompletionRequest,
            {"add_generation_prompt": "yes"},
            "add_generation_prompt",
            "valid boolean",
        ),
        (ChatCompletionRequest, {"logprobs": "yes"}, "logprobs", "valid boolean"),
        (ChatCompletionRequest, {"logprobs": 0}, "logprobs", "valid boolean"),
        (
            ChatCompletionRequest,
            {"parallel_tool_calls": "yes"},
            "parallel_tool_calls",
            "valid boolean",
        ),
        (ChatCompletionRequest, {"store": "no"}, "store", "valid boolean"),
    ],
)
def test_integers_are_integers_and_booleans_booleans(model, extra, param, words):
    """As the OpenAI API types them: a string, a float or a boolean where an integer belongs is
    refused (pydantic's lax mode would read "3", 1.0 and true as 3, 1 and 1), and so is
    anything but true or false where a boolean belongs; the message and ``param`` name it."""
    base = CHAT if model is ChatCompletionRequest else PROMPT
    e = _parse(model, {**base, **extra})
    assert isinstance(e, ProtocolError), f"{extra} was accepted: {e}"
    assert (e.param, e.status) == (param, 400) and words in str(e), str(e)
    assert str(e).startswith(param), str(e)


@pytest.mark.parametrize(
    "extra",
    [
        {"temperature": 1},
        {"top_p": 1},
        {"min_p": 0},
        {"presence_penalty": -1},
        {"frequency_penalty": 2},
        {"logit_bias": {"5": 1}},
        {"seed": -(2**63)},
        {"seed": 2**63 - 1},
        {"max_tokens": 3},
        {"n": 2},
        {"stream": True},
        {"top_logprobs": 0},
        {"best_of": 1},
        {"logprobs": None},
    ],
)
def test_a_float_field_takes_an_integer_number_as_openai_does(extra):
    req = _parse(CompletionRequest, {**PROMPT, **extra})
    assert isinstance(req, CompletionRequest), req


def test_a_long_value_in_a_message_is_described_not_cut():
    e = _parse(ChatCompletionRequest, {"messages": [{"role": "w" * 60, "content": "hi"}]})
    assert isinstance(e, ProtocolError) and e.param == "messages.0.role"
    assert "'" + "w" * 40 + "'" not in str(e), str(e)  # a cut value reads as another value
    assert str(e).endswith("(got a string of 60 characters)"), str(e)


def test_priority_logprobs_and_the_prompts_logprobs_reach_the_sampling_params():
    p = _params({"prompt": "x", "priority": -4, "logprobs": 2, "echo": True})
    assert (p.priority, p.logprobs, p.prompt_logprobs) == (-4, 2, 2)
    chat = {"messages": [{"role": "user", "content": "hi"}], "logprobs": True, "top_logprobs": 3}
    p = _params(chat, model=ChatCompletionRequest)
    assert (p.priority, p.logprobs, p.prompt_logprobs) == (0, 3, None)
