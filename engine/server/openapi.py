"""The server's OpenAPI document, kept to what the server accepts and answers.

FastAPI derives the routes. The completion routes read their bodies themselves (bounded in size
and time, errors naming the field), so FastAPI cannot see those bodies: they are declared here
from the same pydantic models that validate them, and every route lists the error object its
errors carry. A fuzzer that reads this document (tests/e2e/test_fuzz_api.py) tests what runs.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from pydantic import BaseModel


class ErrorObject(BaseModel):
    message: str
    type: str
    param: str | None
    code: int


class ErrorResponse(BaseModel):
    """OpenAI's error shape: every error of every route but the Messages API's."""

    error: ErrorObject


ERRORS: dict[int | str, dict[str, Any]] = {
    status: {"model": ErrorResponse, "description": what}
    for status, what in (
        (400, "the request asks for something invalid (error.param names it), or its Host"),
        (401, "a missing or wrong API key (every route but /health needs it, if one is set)"),
        (403, "a Host not naming this server, or a web page of an origin not allowed"),
        (404, "no such route, or no such model"),
        (405, "the route does not take this method"),
        (408, "the request's headers or body did not arrive in time"),
        (413, "the body is over the limit"),
        (415, "the body is not declared JSON, or is in a Content-Encoding but identity"),
        (429, "too many open connections from this address"),
        (503, "the scheduler is not running or the server is stopping"),
        (504, "the request ran past its deadline and was aborted"),
    )
}


class AnthropicErrorObject(BaseModel):
    type: str
    message: str


class AnthropicError(BaseModel):
    """Anthropic's error shape: every error of its Messages API's routes."""

    type: str
    error: AnthropicErrorObject


ANTHROPIC_ERRORS: dict[int | str, dict[str, Any]] = {
    status: {**entry, "model": AnthropicError} for status, entry in ERRORS.items()
}


def body(
    *models: type[BaseModel],
    streams: bool = False,
    errors: dict[int | str, dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """A POST route's keywords declaring its JSON body (one of ``models``) and its answer: one
    JSON body, or (``streams``) that or a stream of server-sent events; ``errors``: its error
    answers, where they are not the app's (``ERRORS``)."""
    refs = [{"$ref": f"#/components/schemas/{m.__name__}"} for m in models]
    schema = refs[0] if len(refs) == 1 else {"oneOf": refs}
    request_body = {"required": True, "content": {"application/json": {"schema": schema}}}
    content = {"application/json": {}} | ({"text/event-stream": {}} if streams else {})
    ok = {"description": "the completion" if streams else "the answer", "content": content}
    return {
        "openapi_extra": {"requestBody": request_body},
        "responses": {**(errors or {}), 200: ok},
    }


def publish(app: FastAPI, models: list[type[BaseModel]], served_name: str, vocab_size: int) -> None:
    """Make ``app``'s document carry ``models`` (and what they refer to) as components, with
    what only the running server knows: the one model name it serves, the vocabulary's size."""

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            doc = get_openapi(
                title=app.title, version=app.version, routes=app.routes, description=app.description
            )
            schemas = doc.setdefault("components", {}).setdefault("schemas", {})
            for model in models:
                schema = model.model_json_schema(ref_template="#/components/schemas/{model}")
                schemas.update(schema.pop("$defs", {}))
                schemas[model.__name__] = schema
                schema["properties"]["model"] = {
                    "anyOf": [{"const": served_name}, {"type": "null"}],
                    "default": None,
                }
            _pin_token_ids(schemas, vocab_size)
            app.openapi_schema = doc
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]


def _pin_token_ids(node: Any, vocab_size: int) -> None:
    """Give every token id (``x-token-id``) its upper bound, the last id of the vocabulary."""
    if isinstance(node, dict):
        if node.pop("x-token-id", False):
            node["maximum"] = vocab_size - 1
        for value in node.values():
            _pin_token_ids(value, vocab_size)
    elif isinstance(node, list):
        for value in node:
            _pin_token_ids(value, vocab_size)
