"""The openai-agents SDK, through its default provider (``responses``: the Responses API) or
through chat completions (``chat``), as the third argument says. A tool round trip: a run that
must call ``get_weather`` (the SDK runs it), then a run over that run's items (the call and its
output sent back) that answers in a structure (``output_type``, with the tool still offered)."""

from __future__ import annotations

import sys

from agents import (
    Agent,
    ModelSettings,
    Runner,
    function_tool,
    set_default_openai_api,
    set_default_openai_client,
    set_tracing_disabled,
)
from common import ASK_TOOL, MAX_TOKENS, MODEL, Weather, get_weather, report
from common import server as where
from openai import AsyncOpenAI

base, key = where()
api = sys.argv[3]
set_tracing_disabled(True)  # no trace export: nothing leaves this machine
set_default_openai_client(AsyncOpenAI(base_url=f"{base}/v1", api_key=key), use_for_tracing=False)
if api == "chat":
    set_default_openai_api("chat_completions")
weather = function_tool(get_weather)
settings = {"temperature": 0, "max_tokens": MAX_TOKENS}
caller = Agent(
    name="caller",
    model=MODEL,
    tools=[weather],
    model_settings=ModelSettings(tool_choice="required", **settings),
    tool_use_behavior="stop_on_first_tool",
)
called = Runner.run_sync(caller, ASK_TOOL)
answerer = Agent(
    name="answerer",
    model=MODEL,
    tools=[weather],
    output_type=Weather,
    model_settings=ModelSettings(tool_choice="none", **settings),
)
answer = Runner.run_sync(answerer, called.to_input_list())
report(called=called.final_output, structured=answer.final_output.model_dump())
