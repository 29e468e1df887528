"""The agent frameworks developers write agents with, unmodified, against `engine serve`: each
runs a tool round trip (a call the framework runs, its result sent back, the answer) and a
structured answer to completion. openai-agents goes through its default provider (the Responses
API) and through chat completions; the Anthropic SDK through the Messages API, streamed with a
tool; pydantic-ai, langchain-openai and litellm through chat completions.

The frameworks run in their own virtualenv (measure/clients.py ``agents``, made here on demand
when it is not there: about a minute once), each as a script of ``tests/e2e/agent_clients/``
that prints what it got as JSON. One that cannot be installed here is a skip that says why. The
server's receipts say which API each request came by."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import orjson
import pytest

from measure.clients import MissingClient, bin_path, ensure
from tests.conftest import requires_default_model
from tests.e2e.conftest import API_KEY

pytestmark = requires_default_model

ROOT = Path(__file__).parents[2]
CLIENTS = ROOT / "build" / "clients"
SCRIPTS = Path(__file__).parent / "agent_clients"


@pytest.fixture(scope="module")
def python() -> Path:
    try:
        ensure("agents", CLIENTS)
    except (MissingClient, subprocess.CalledProcessError) as e:
        pytest.skip(f"the agent frameworks' environment cannot be made here: {e}")
    return bin_path("agents", "python", CLIENTS)


def apis(served) -> list[str]:
    """The API of every request the server took in so far, in order."""
    lines = served.log_file.read_bytes().splitlines()
    return [orjson.loads(x).get("api") for x in lines if b'"request.received"' in x]


def run(python: Path, served, script: str, *args: str) -> tuple[dict, list[str]]:
    """The script's report, and the APIs of the requests it made."""
    before = len(apis(served))
    env = {**os.environ, "LITELLM_LOCAL_MODEL_COST_MAP": "True"}  # litellm: no fetch at import
    done = subprocess.run(
        [str(python), str(SCRIPTS / script), served.base, API_KEY, *args],
        capture_output=True,
        text=True,
        timeout=900,
        env=env,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    return json.loads(done.stdout.strip().splitlines()[-1]), apis(served)[before:]


def _structured(out: dict) -> None:
    assert set(out["structured"]) == {"city", "temperature_c"}
    assert isinstance(out["structured"]["temperature_c"], int)


@pytest.mark.parametrize("api", ["responses", "chat"])
def test_openai_agents_calls_a_tool_then_answers_in_a_structure(python, served, api):
    out, made = run(python, served, "openai_agents_run.py", api)
    assert len(out["tool_calls"]) == 1 and out["called"].startswith("It is sunny")
    _structured(out)
    assert made == ["responses" if api == "responses" else "chat.completions"] * 2


def test_anthropic_streams_a_tool_use_and_its_answer(python, served):
    out, made = run(python, served, "anthropic_run.py")
    assert len(out["tool_calls"]) == 1 and out["used_stop"] == "tool_use"
    assert out["answer"] and out["answer_stop"] in ("end_turn", "max_tokens")
    _structured(out)
    assert made == ["messages"] * 3


# the three speak the same API (chat completions, as openai-agents' chat arm above does), each
# its own way; in the default run one of them, the other two in `make test-all` (the suite's
# 12 minutes)
@pytest.mark.parametrize(
    "script",
    [
        "pydantic_ai_run.py",
        pytest.param("langchain_openai_run.py", marks=pytest.mark.slow),
        pytest.param("litellm_run.py", marks=pytest.mark.slow),
    ],
)
def test_a_chat_completions_framework_runs_a_tool_round_trip_and_a_structure(
    python, served, script
):
    out, made = run(python, served, script)
    assert len(out["tool_calls"]) == 1 and out["answer"]
    assert not out.get("answer_calls")
    _structured(out)
    assert made == ["chat.completions"] * 3
