"""The response of a request that called tools, whole and streamed, from the same outputs: the
same calls, the finish reason ``tool_calls`` in both, and the job (whose reasons the request's
span reports) told the reason the client was told."""

from __future__ import annotations

import asyncio
import json

import orjson

from engine.guided.tools import plan_of
from engine.request.messages import StepOutput
from engine.server.responses import completion_body, stream

TOOLS = [{"type": "function", "function": {"name": "now", "parameters": {"type": "object"}}}]
TEXT = json.dumps({"tool_calls": [{"name": "now", "arguments": {"tz": "UTC"}}]})


class FakeJob:
    """What the response code reads of a job: one choice's outputs, its reasons and usage."""

    def __init__(self, pieces: list[str]) -> None:
        self.subs = [object()]
        self.prompt_tokens = 3
        self.reasons: list[str | None] = ["stop"]
        self.report_metrics = False  # the server's default: no per-request timings
        last = len(pieces) - 1
        self.outputs = [
            StepOutput(
                rid="r",
                new_token_ids=[k],
                text_delta=p,
                finished=k == last,
                finish_reason="stop" if k == last else None,
            )
            for k, p in enumerate(pieces)
        ]

    async def events(self):
        for out in self.outputs:
            yield 0, out

    def answered(self, i: int, reason: str | None) -> None:
        self.reasons[i] = reason

    def usage(self) -> dict:
        return {"prompt_tokens": 3, "completion_tokens": len(self.outputs), "total_tokens": 3}

    def close(self) -> None:
        pass

    def end_span(self, status: int, error: str | None = None) -> None:
        self.ended = (status, error, list(self.reasons))


def test_a_whole_answer_that_calls_says_tool_calls_to_the_client_and_the_span():
    plan = plan_of(TOOLS, "required", True, native=False)
    job = FakeJob([TEXT])
    body = completion_body(job, "chat", {}, [[TEXT]], None, plan)
    [choice] = body["choices"]
    assert choice["finish_reason"] == "tool_calls" and choice["message"]["content"] is None
    [call] = choice["message"]["tool_calls"]
    assert call["function"] == {"name": "now", "arguments": '{"tz":"UTC"}'}
    assert job.reasons == ["tool_calls"]


def test_a_streamed_answer_that_calls_says_tool_calls_to_the_client_and_the_span():
    plan = plan_of(TOOLS, "required", True, native=False)
    pieces = [TEXT[k : k + 5] for k in range(0, len(TEXT), 5)]
    job = FakeJob(pieces)

    async def run() -> list[bytes]:
        return [x async for x in stream(job, "chat", {}, False, tools=plan)]

    events = asyncio.run(run())
    chunks = [orjson.loads(e[6:]) for e in events if e.startswith(b"data: {")]
    reasons = [c["choices"][0]["finish_reason"] for c in chunks]
    assert [r for r in reasons if r] == ["tool_calls"]
    args = "".join(
        d["function"].get("arguments", "")
        for c in chunks
        for d in c["choices"][0]["delta"].get("tool_calls", ())
    )
    assert json.loads(args) == {"tz": "UTC"}
    assert job.ended == (200, None, ["tool_calls"])
