"""`engine serve --overlap-schedule`: concurrent completions answered with the tokens an engine
planning each step after its forward gives, a client that hangs up mid-stream frees its memory,
and the boot log counts the steps planned beside a forward."""

from __future__ import annotations

import json
import time
from concurrent.futures import ThreadPoolExecutor

import httpx

from engine import LLM, SamplingParams
from tests.e2e.server_proc import ServerProc

PROMPTS = [[5 + i, 17, 29 + i, 40, 51 + 2 * i] for i in range(6)]


def complete(base: str, prompt: list[int], n: int) -> list[int]:
    body = {"prompt": prompt, "max_tokens": n, "temperature": 0, "ignore_eos": True}
    body["return_tokens_as_token_ids"] = True
    body["logprobs"] = 0
    r = httpx.post(base + "/v1/completions", json=body, timeout=300)
    assert r.status_code == 200, r.text
    return [int(t.split(":")[1]) for t in r.json()["choices"][0]["logprobs"]["tokens"]]


def test_served_with_overlap_answers_as_without_it(tiny_model_dir, tmp_path):
    lengths = [3 + 4 * i for i in range(len(PROMPTS))]
    offline = LLM(model=tiny_model_dir, kv_tokens=4096, speculative="off")
    params = [SamplingParams(max_tokens=n, temperature=0, ignore_eos=True) for n in lengths]
    want = [o.token_ids for o in offline.generate(PROMPTS, params)]
    log = tmp_path / "boot.jsonl"
    srv = ServerProc(log, "--model", tiny_model_dir, "--speculative", "off", "--overlap-schedule")
    try:
        with ThreadPoolExecutor(len(PROMPTS)) as pool:
            got = list(pool.map(lambda a: complete(srv.base, *a), zip(PROMPTS, lengths)))
        assert got == want
        # a stream left after its first chunk: its request ends and its memory comes back
        body = {"prompt": [9, 9, 9], "max_tokens": 400, "ignore_eos": True, "stream": True}
        with httpx.stream("POST", srv.base + "/v1/completions", json=body, timeout=300) as r:
            next(r.iter_lines())
        # freed within moments; a leak would be forever, so the wait's limit is roomy
        deadline, health = time.monotonic() + 120, {}
        while time.monotonic() < deadline:
            health = httpx.get(srv.base + "/health", timeout=60).json()
            if health["running"] == 0 and health["kv_used"] == 0:
                break
            time.sleep(0.2)
        assert health["running"] == 0 and health["kv_used"] == 0, health
    finally:
        code, _ = srv.stop()
    assert code == 0
    receipts = [json.loads(line) for line in log.read_text().splitlines()]
    aborts = [r for r in receipts if r["event"] == "request.abort"]
    assert [a["reason"] for a in aborts] == ["client_disconnect"]
    assert sum(r.get("overlap_ahead", 0) for r in receipts if r["event"] == "iteration") > 0
