"""guidellm, a real load generator, unmodified against `engine serve`: its default request shapes
(chat completions, and text completions, both streamed with ``stream_options.include_usage`` and
vLLM's ``continuous_usage_stats``, ``ignore_eos``, ``max_completion_tokens`` / ``max_tokens``)
are all answered, and the token counts it reports are the server's own usage: so a field the
server stopped accepting can never again fail every one of its requests silently.

guidellm runs in its own virtualenv (measure/clients.py), made here on demand when it
is not there (about 30 s once). A tiny model, and its tokenizer for guidellm's synthetic
prompts, keep it short."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from measure.clients import bin_path, ensure
from measure.online import read_report
from tests.e2e.server_proc import ServerProc

ROOT = Path(__file__).parents[2]
CLIENTS = ROOT / "build" / "clients"
REQUESTS, OUTPUT = 5, 8


@pytest.fixture(scope="module")
def guidellm():
    ensure("guidellm", CLIENTS)
    return bin_path("guidellm", "guidellm", CLIENTS)


@pytest.fixture(scope="module")
def srv(tiny_model_dir, tmp_path_factory):
    log = tmp_path_factory.mktemp("guidellm") / "boot.jsonl"
    s = ServerProc(
        log, "--model", tiny_model_dir, "--kv-tokens", "2048", "--served-model-name", "tiny"
    )
    yield s
    code, out = s.stop()
    assert code == 0 and "Traceback" not in out, out[-3000:]


def received(srv) -> dict[str, int]:
    """Each request's prompt tokens as the server counted them, by request id."""
    rows = [json.loads(x) for x in srv.log_file.read_text().splitlines() if "request.received" in x]
    return {r["rid"]: r["prompt_tokens"] for r in rows if r.get("event") == "request.received"}


# the chat route in `make test-all` (the suite's 12 minutes): the same client and load, and
# chat requests of every shape are the other e2e tests' daily work
@pytest.mark.parametrize(
    "route", [pytest.param("/v1/chat/completions", marks=pytest.mark.slow), "/v1/completions"]
)
def test_guidellms_requests_are_all_answered_and_counted_by_the_servers_usage(
    guidellm, srv, tiny_model_dir, tmp_path, route
):
    out = tmp_path / "report.json"
    cmd = [
        str(guidellm),
        "run",
        "--backend",
        f"kind=openai_http,target={srv.base},request_format={route}",
        "--profile",
        "kind=synchronous",
        "--constraint",
        f"kind=max_requests,count={REQUESTS}",
        "--data",
        f"kind=synthetic_text,prompt_tokens=32,output_tokens={OUTPUT}",
        "--tokenizer",
        f"kind=huggingface_auto,model={tiny_model_dir}",
        "--output",
        f"kind=json,path={out}",
        "--disable-console-interactive",
    ]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf-home")}
    done = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True)
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    requests = json.loads(out.read_text())["benchmarks"][0]["requests"]
    assert (len(requests["errored"]), len(requests["incomplete"])) == (0, 0), requests["errored"]
    ok = requests["successful"]
    assert len(ok) == REQUESTS
    counted = received(srv)
    for r in ok:
        sent = json.loads(r["request_args"])["body"]
        assert sent["stream"] and sent["stream_options"]["continuous_usage_stats"], sent
        # the counts guidellm reports are the usage the server sent, chunk by chunk
        assert r["prompt_tokens"] == counted[r["response_id"]], r["response_id"]
        assert r["output_tokens"] == OUTPUT  # ignore_eos: exactly what it asked
    # what the online comparison (bench/serve_vs.py) reads of such a report
    level = read_report(out, "attest", 1)
    assert (level.requests, level.errors) == (REQUESTS, 0) and level.out_tok_s > 0
    assert 0 < level.ttft_ms[0] <= level.ttft_ms[1] and 0 < level.itl_ms[0] <= level.itl_ms[1]
