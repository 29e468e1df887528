"""OpenAI request parsing: errors name the field a client must fix."""

from __future__ import annotations


def test_a_validation_error_names_the_request_field_not_the_union_branch():
    from pydantic import ValidationError

    from engine.server.errors import field_path
    from engine.server.protocol import ChatCompletionRequest, CompletionRequest

    cases = [
        (CompletionRequest, {"prompt": 12}, "prompt"),
        (CompletionRequest, {"prompt": "x", "max_tokens": "many"}, "max_tokens"),
        (
            ChatCompletionRequest,
            {"messages": [{"role": "user", "content": 5}]},
            "messages.0.content",
        ),
        (ChatCompletionRequest, {"messages": [{"content": "hi"}]}, "messages.0.role"),
        (ChatCompletionRequest, {"messages": []}, "messages"),
        (
            CompletionRequest,
            {"prompt": "x", "stream_options": {"include_usage": "?"}},
            "stream_options.include_usage",
        ),
    ]
    for model, body, want in cases:
        try:
            model.model_validate(body)
        except ValidationError as e:
            assert field_path(model, e.errors()[0]["loc"]) == want, body
        else:
            raise AssertionError(f"{body} validated")
