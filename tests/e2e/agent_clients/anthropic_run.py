"""The Anthropic SDK against the Messages API: a tool round trip, both turns streamed
(``messages.stream``: the first must use the tool, its ``tool_result`` sent back, the second
answers), and a structured answer as Anthropic's own way has it: a tool the model must use,
whose ``input_schema`` is the structure. This SDK no longer names the sampling fields (the
newest Claude models take none); the server takes ``temperature``, sent in ``extra_body``."""

from __future__ import annotations

import anthropic
from common import ASK_STRUCTURED, ASK_TOOL, MAX_TOKENS, MODEL, Weather, get_weather, report
from common import server as where

base, key = where()
client = anthropic.Anthropic(base_url=base, api_key=key)
tool = {
    "name": "get_weather",
    "description": get_weather.__doc__,
    "input_schema": {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
    },
}
greedy = {"temperature": 0}
ask = {"model": MODEL, "max_tokens": MAX_TOKENS, "extra_body": greedy, "tools": [tool]}
messages: list = [{"role": "user", "content": ASK_TOOL}]
with client.messages.stream(messages=messages, tool_choice={"type": "any"}, **ask) as stream:
    used = stream.get_final_message()
results = [
    {"type": "tool_result", "tool_use_id": b.id, "content": get_weather(**b.input)}
    for b in used.content
    if b.type == "tool_use"
]
messages += [{"role": "assistant", "content": used.content}, {"role": "user", "content": results}]
with client.messages.stream(messages=messages, tool_choice={"type": "none"}, **ask) as stream:
    answer = stream.get_final_message()
report_tool = {
    "name": "weather_report",
    "description": "Report the weather.",
    "input_schema": Weather.model_json_schema(),
}
structured = client.messages.create(
    model=MODEL,
    max_tokens=MAX_TOKENS,
    extra_body=greedy,
    tools=[report_tool],
    tool_choice={"type": "tool", "name": "weather_report"},
    messages=[{"role": "user", "content": ASK_STRUCTURED}],
)
given = next(b.input for b in structured.content if b.type == "tool_use")
report(
    used_stop=used.stop_reason,
    answer="".join(b.text for b in answer.content if b.type == "text"),
    answer_stop=answer.stop_reason,
    structured=Weather.model_validate(given).model_dump(),
)
