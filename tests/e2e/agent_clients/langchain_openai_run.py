"""langchain-openai's ChatOpenAI: a tool round trip (``bind_tools``, the call run, its result sent
back, the answer) and ``with_structured_output`` (a JSON schema)."""

from __future__ import annotations

from common import ASK_STRUCTURED, ASK_TOOL, MAX_TOKENS, MODEL, Weather, get_weather, report
from common import server as where
from langchain_core.messages import HumanMessage, ToolMessage
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI

base, key = where()
llm = ChatOpenAI(
    base_url=f"{base}/v1", api_key=key, model=MODEL, temperature=0, max_tokens=MAX_TOKENS
)
weather = tool(get_weather)
messages = [HumanMessage(ASK_TOOL)]
asked = llm.bind_tools([weather], tool_choice="required").invoke(messages)
messages.append(asked)
for call in asked.tool_calls:
    messages.append(ToolMessage(weather.invoke(call["args"]), tool_call_id=call["id"]))
answer = llm.bind_tools([weather], tool_choice="none").invoke(messages)
structured = llm.with_structured_output(Weather, method="json_schema").invoke(ASK_STRUCTURED)
report(answer=answer.content, answer_calls=answer.tool_calls, structured=structured.model_dump())
