"""litellm's ``completion`` through its ``openai/`` provider: a tool round trip and a structured
answer (``response_format`` a pydantic model)."""

from __future__ import annotations

import json

import litellm
from common import ASK_STRUCTURED, ASK_TOOL, MAX_TOKENS, MODEL, Weather, get_weather, report
from common import server as where

base, key = where()
ask = {"model": f"openai/{MODEL}", "api_base": f"{base}/v1", "api_key": key, "temperature": 0}
ask["max_tokens"] = MAX_TOKENS
tools = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": get_weather.__doc__,
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}},
                "required": ["city"],
            },
        },
    }
]
messages = [{"role": "user", "content": ASK_TOOL}]
asked = litellm.completion(messages=messages, tools=tools, tool_choice="required", **ask)
said = asked.choices[0].message
messages.append(said.model_dump(exclude_none=True))
for call in said.tool_calls or ():
    result = get_weather(**json.loads(call.function.arguments))
    messages.append({"role": "tool", "tool_call_id": call.id, "content": result})
answer = litellm.completion(messages=messages, tools=tools, tool_choice="none", **ask)
structured = litellm.completion(
    messages=[{"role": "user", "content": ASK_STRUCTURED}], response_format=Weather, **ask
)
report(
    answer=answer.choices[0].message.content,
    answer_calls=answer.choices[0].message.tool_calls or [],
    structured=Weather.model_validate_json(structured.choices[0].message.content).model_dump(),
)
