"""What every agent client's run shares: the server it talks to, the one tool, the structure
asked for, and how a run reports (one JSON object on its last line of output). These scripts
run in the agent frameworks' own environment (``engine client-env agents``), never in the
project's."""

from __future__ import annotations

import json
import sys

from pydantic import BaseModel

MODEL = "smol"  # the served name of the e2e server
ASK_TOOL = "What is the weather in Paris? Use the get_weather tool."
ASK_STRUCTURED = "Paris is sunny and 21 C today. Give the city and its temperature."
MAX_TOKENS = 64


class Weather(BaseModel):
    city: str
    temperature_c: int


def get_weather(city: str) -> str:
    """The current weather in a city."""
    CALLS.append(city)
    return f"It is sunny and 21 C in {city}."


CALLS: list[str] = []  # the cities the tool was called for, in order


def server() -> tuple[str, str]:
    """The server's base URL and API key, from the command line."""
    return sys.argv[1], sys.argv[2]


def report(**fields: object) -> None:
    fields["tool_calls"] = CALLS
    print(json.dumps(fields, default=str))
