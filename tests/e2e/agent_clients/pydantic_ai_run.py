"""pydantic-ai's Agent over its OpenAI chat model: a tool round trip (the first step must call,
the next answers with the call's result) and a structured answer (``NativeOutput``: the
server's JSON schema output)."""

from __future__ import annotations

from dataclasses import dataclass

from common import ASK_STRUCTURED, ASK_TOOL, MAX_TOKENS, MODEL, Weather, get_weather, report
from common import server as where
from pydantic_ai import Agent, NativeOutput
from pydantic_ai.capabilities import AbstractCapability
from pydantic_ai.models.openai import OpenAIChatModel
from pydantic_ai.providers.openai import OpenAIProvider


@dataclass
class CallFirst(AbstractCapability):
    """The first step must call a tool; the steps after it answer (a small model would call
    again forever)."""

    def get_model_settings(self):
        return lambda ctx: {"tool_choice": "required" if ctx.run_step <= 1 else "none"}


base, key = where()
model = OpenAIChatModel(MODEL, provider=OpenAIProvider(base_url=f"{base}/v1", api_key=key))
settings = {"temperature": 0, "max_tokens": MAX_TOKENS}
agent = Agent(model, tools=[get_weather], model_settings=settings, capabilities=[CallFirst()])
answer = agent.run_sync(ASK_TOOL)
structured = Agent(model, output_type=NativeOutput(Weather), model_settings=settings)
report(answer=answer.output, structured=structured.run_sync(ASK_STRUCTURED).output.model_dump())
