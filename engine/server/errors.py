"""The errors a request can meet before it runs: ProtocolError (a 4xx naming the field), the
message a schema's validation error becomes, and the error objects errors answer with: OpenAI's,
and Anthropic's on the routes of its Messages API."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, get_args

import orjson
from pydantic import BaseModel, ValidationError


class ProtocolError(ValueError):
    """A request that is well-formed JSON but asks for something invalid: HTTP 400 (or
    ``status``), with ``headers`` on the answer (a 503's ``Retry-After``)."""

    def __init__(
        self,
        message: str,
        param: str | None = None,
        status: int = 400,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.param = param
        self.status = status
        self.headers = dict(headers or {})


def validation_error(model: type[BaseModel], e: ValidationError) -> ProtocolError:
    """A pydantic error as the client should read it: the field, the rule, the value sent."""
    errors = e.errors()
    # the deepest fault, and one about a value over one about another union branch's type
    first = max(errors, key=lambda x: (len(x["loc"]), not x["type"].endswith("_type")))
    loc = first["loc"]
    if first["type"] == "extra_forbidden":  # the unknown field is the location's last part
        param = ".".join(p for p in (field_path(model, loc[:-1]) if loc[:-1] else "", loc[-1]) if p)
        return ProtocolError(f"{param} is not supported by this server", param)
    param = field_path(model, loc)
    message = f"{param}: {first['msg']}"
    value = first.get("input")
    if first["type"] in _TYPE_ERRORS or (isinstance(value, (int, float, str)) and "ctx" in first):
        message += f" (got {shown(value)})"  # what came, whole or described, never cut
    return ProtocolError(message, param)


_TYPE_ERRORS = frozenset({"int_type", "bool_type", "float_type", "string_type"})


def shown(value: Any) -> str:
    """A request's value as a message shows it: JSON's words for its literals and containers."""
    if value is None or isinstance(value, bool):
        return orjson.dumps(value).decode()
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return repr(value) if len(value) <= 40 else f"a string of {len(value)} characters"
    return "an array" if isinstance(value, list) else "an object"


def field_path(model: type[BaseModel], loc: tuple) -> str:
    """The request field a validation error is about (``messages.0.content.0.type``), without
    the union-branch tags and dict keys pydantic puts in its location (``prompt.str``; a tagged
    union's tag, ``tool_use``, picks the branch the rest of the location is in)."""
    parts: list[str] = []
    models: list[type[BaseModel]] = [model]  # the models the location can be in at this point
    for x in loc:
        if isinstance(x, int):
            parts.append(str(x))
            continue
        tagged = [m for m in models if x in _tags(m)]
        if len(models) > 1 and tagged:
            models = tagged
            continue
        owner = next((m for m in models if x in m.model_fields), None)
        if owner is not None:
            parts.append(x)
            models = _inner_models(owner.model_fields[x].annotation)
    return ".".join(parts) or ".".join(str(x) for x in loc)


def _tags(model: type[BaseModel]) -> tuple[Any, ...]:
    """The values a model's ``type`` field takes (its tag in a tagged union)."""
    field = model.model_fields.get("type")
    return get_args(field.annotation) if field is not None else ()


def _inner_models(annotation: Any) -> list[type[BaseModel]]:
    """The pydantic models inside an annotation such as ``list[ChatMessage] | None``."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [m for arg in get_args(annotation) for m in _inner_models(arg)]


ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    404: "not_found_error",
    408: "timeout_error",
    413: "invalid_request_error",
    429: "rate_limit_error",
    504: "timeout_error",
}


def error_body(message: str, status: int, param: str | None = None) -> dict[str, Any]:
    """OpenAI's error object: every error this server answers, but on the Messages API's
    routes (``anthropic_error_body``)."""
    kind = ERROR_TYPES.get(status, "invalid_request_error" if status < 500 else "server_error")
    return {"error": {"message": message, "type": kind, "param": param, "code": status}}


# Anthropic's error types by status (its other 4xx are invalid_request_error too)
ANTHROPIC_TYPES = {
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
    503: "overloaded_error",
    504: "timeout_error",
}
# the routes that speak Anthropic's API, and so answer its error shape
ANTHROPIC_PATHS = ("/v1/messages",)
# the field a refusal named, as the error handler leaves it in the request's state (Starlette's
# ``request.state``, the ASGI scope's ``state``): the front door's record reads it there where
# the error body has no place for it (Anthropic's shape)
REFUSED_FIELD = "refused_field"


def anthropic_error_body(message: str, status: int) -> dict[str, Any]:
    """Anthropic's error object: the routes of its Messages API answer with it (the message
    names the field, as the shape has no place of its own for it)."""
    kind = ANTHROPIC_TYPES.get(status, "invalid_request_error" if status < 500 else "api_error")
    return {"type": "error", "error": {"type": kind, "message": message}}


def speaks_anthropic(path: str) -> bool:
    return any(path == p or path.startswith(p + "/") for p in ANTHROPIC_PATHS)
